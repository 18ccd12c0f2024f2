// The decoder's K/V cache kept on the GPU, for decode loops that record their graphs (Graph::record).
//
// Why: on Vulkan the host cache (kv_cache.h) is uploaded by every decode layer on every step, and
// a graph whose attention runs on the CPU (ncnn has no Vulkan MatMul) syncs with the host inside
// every layer. With a decode graph whose attention is Vulkan layers (the package's "gpu" variant:
// Concat + SDPA, convert/rewrites.py) the whole step can stay on the device: each layer's K and V
// live in device buffers of the generation's full capacity ([heads, capacity, head_dim], packed
// as ncnn packs the graph's own past input); a step's past is a header of that buffer with h = the
// committed length (ncnn reads it in place, honouring its channel step), and the step's new rows
// are appended on the device by ncnn's own SDPA kv-cache append shader. Nothing of the cache
// crosses to the host after the prompt.
#pragma once

#include <platform.h>  // ncnn: NCNN_VULKAN

#if NCNN_VULKAN

#include <command.h>  // ncnn::VkCompute
#include <gpu.h>
#include <pipeline.h>

#include <memory>
#include <vector>

#include "ncnnport/kv_cache.h"

namespace ncnnport {

class GpuKvCache {
public:
    // Records the upload of `host`'s buffers (the prompt's rows committed by prefill) into `cmd`;
    // the caller submits it. Throws GraphError when the device cannot allocate or build the shader.
    GpuKvCache(const ncnn::VulkanDevice* vkdev, const KvCache& host, ncnn::VkCompute& cmd);
    ~GpuKvCache();
    GpuKvCache(const GpuKvCache&) = delete;
    GpuKvCache& operator=(const GpuKvCache&) = delete;

    // Past of `layer` as [heads, length, head_dim] GPU headers over the cache (no copy).
    ncnn::VkMat past_k(int layer) const { return view(k_.at(layer)); }
    ncnn::VkMat past_v(int layer) const { return view(v_.at(layer)); }
    // Records the append of a layer's new rows (a graph's k/v output, [heads, rows, head_dim] in
    // any packing) at positions length .. length + rows - 1; GraphError on a shape mismatch or
    // overflow. Not visible to past_* before commit().
    void record_append(ncnn::VkCompute& cmd, int layer, const ncnn::VkMat& k, const ncnn::VkMat& v);
    // Makes `added` appended rows visible; every layer must have appended exactly them. Call after
    // the command that appended them ran (it also drops the step's temporaries).
    void commit(int added);

    int length() const { return length_; }
    int capacity() const { return capacity_; }

private:
    ncnn::VkMat view(const ncnn::VkMat& full) const;
    // Returns the number of rows appended.
    int append_one(ncnn::VkCompute& cmd, const ncnn::VkMat& rows, const ncnn::VkMat& dst, const char* what, int layer);

    const ncnn::VulkanDevice* vkdev_;
    std::unique_ptr<ncnn::VkBlobAllocator> allocator_;       // owns the cache buffers
    std::unique_ptr<ncnn::VkStagingAllocator> staging_;     // the prompt upload's staging
    std::unique_ptr<ncnn::Pipeline> append_;
    ncnn::Option opt_;
    int heads_, head_dim_, capacity_;
    int length_ = 0;
    std::vector<ncnn::VkMat> k_, v_;
    std::vector<int> pending_;            // rows appended per layer since the last commit
    std::vector<ncnn::VkMat> in_flight_;  // the step's rows (and repacked copies), alive until commit()
};

}  // namespace ncnnport

#endif  // NCNN_VULKAN
