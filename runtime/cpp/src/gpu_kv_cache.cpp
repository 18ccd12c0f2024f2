#include "ncnnport/gpu_kv_cache.h"

#if NCNN_VULKAN

#include <layer_shader_type.h>  // ncnn::LayerShaderType::sdpa_kvcache_append

#include <string>

namespace ncnnport {

namespace {

// A blob's geometry as the append shader sees it: a pack-p element is p floats, so a packed
// blob is a pack-1 blob p times as wide with a p times larger channel step.
struct Rows {
    int heads, rows, head_dim, width, cstep, channels;
};

Rows rows_of(const ncnn::VkMat& m) {
    const int p = m.elempack;
    if (m.dims == 3) return {m.c * p, m.h, m.w, m.w * p, static_cast<int>(m.cstep) * p, m.c};
    // one row may come as [heads, head_dim] (ncnn dropped the unit axis)
    if (m.dims == 2) return {m.h * p, 1, m.w, m.w * p, m.w * p, m.h};
    return {0, 0, 0, 0, 0, 0};
}

}  // namespace

GpuKvCache::GpuKvCache(const ncnn::VulkanDevice* vkdev, const KvCache& host, ncnn::VkCompute& cmd)
    : vkdev_(vkdev),
      allocator_(std::make_unique<ncnn::VkBlobAllocator>(vkdev)),
      staging_(std::make_unique<ncnn::VkStagingAllocator>(vkdev)),
      append_(std::make_unique<ncnn::Pipeline>(vkdev)),
      opt_(fp32_options(1, true)),
      heads_(host.heads()),
      head_dim_(host.head_dim()),
      capacity_(host.capacity()),
      length_(host.length()),
      pending_(host.layers(), 0) {
    if (host.rows() != KvRows::Fp32)  // fp16_kv_rows is never true on Vulkan (precision.h)
        throw GraphError("gpu kv cache: the host cache holds fp16 rows; the GPU decode's blobs are float32");
    opt_.blob_vkallocator = allocator_.get();
    opt_.workspace_vkallocator = allocator_.get();
    opt_.staging_vkallocator = staging_.get();
    append_->set_local_size_xyz(8, 8, 1);
    if (append_->create(ncnn::LayerShaderType::sdpa_kvcache_append, opt_, {}) != 0)
        throw GraphError("gpu kv cache: ncnn could not build its kv-cache append shader");
    for (int i = 0; i < host.layers(); ++i) {
        // record_upload packs the heads by 4 where they divide, as ncnn packs the graph's own input
        k_.emplace_back();
        v_.emplace_back();
        cmd.record_upload(host.full_k(i), k_.back(), opt_);
        cmd.record_upload(host.full_v(i), v_.back(), opt_);
        if (k_.back().empty() || v_.back().empty())
            throw GraphError("gpu kv cache: the device could not allocate layer " + std::to_string(i) + " ["
                             + std::to_string(heads_) + ", " + std::to_string(capacity_) + ", "
                             + std::to_string(head_dim_) + "] float32");
    }
}

GpuKvCache::~GpuKvCache() {
    // the buffers go back to allocator_ before it is destroyed
    in_flight_.clear();
    k_.clear();
    v_.clear();
}

ncnn::VkMat GpuKvCache::view(const ncnn::VkMat& full) const {
    if (length_ == 0) throw GraphError("gpu kv cache: past read before anything was committed");
    ncnn::VkMat header = full;  // shares the buffer and its reference count
    header.h = length_;
    return header;
}

int GpuKvCache::append_one(ncnn::VkCompute& cmd, const ncnn::VkMat& rows, const ncnn::VkMat& dst, const char* what,
                           int layer) {
    const std::string where = "gpu kv cache layer " + std::to_string(layer) + " " + what;
    ncnn::VkMat src = rows;
    if (src.elempack != dst.elempack) {
        // the graph packed its output differently from the cache: repack on the device
        vkdev_->convert_packing(rows, src, dst.elempack, cmd, opt_);
        if (src.empty()) throw GraphError(where + ": repacking the new rows failed");
    }
    const Rows r = rows_of(src), c = rows_of(dst);
    if (r.heads != heads_ || r.head_dim != head_dim_ || src.elemsize != 4u * src.elempack)
        throw GraphError(where + ": got a blob that is not float32 [" + std::to_string(heads_) + ", rows, "
                         + std::to_string(head_dim_) + "]");
    if (length_ + r.rows > capacity_)
        throw GraphError(where + ": " + std::to_string(length_ + r.rows) + " positions exceed the capacity "
                         + std::to_string(capacity_));
    std::vector<ncnn::vk_constant_type> constants(6);  // the shader's push constants, in its order
    constants[0].i = r.width;  // current_w
    constants[1].i = r.rows;   // current_h
    constants[2].i = r.cstep;  // current_cstep
    constants[3].i = c.width;  // cache_w
    constants[4].i = c.cstep;  // cache_cstep
    constants[5].i = length_;  // old_seqlen: the first row written
    const ncnn::Mat dispatcher(r.width, r.rows, 1, r.channels, static_cast<void*>(nullptr));
    cmd.record_pipeline(append_.get(), {src, dst}, std::vector<ncnn::VkImageMat>(), constants, dispatcher);
    in_flight_.push_back(src);
    in_flight_.push_back(rows);
    return r.rows;
}

void GpuKvCache::record_append(ncnn::VkCompute& cmd, int layer, const ncnn::VkMat& k, const ncnn::VkMat& v) {
    const int rows = append_one(cmd, k, k_.at(layer), "k", layer);
    if (append_one(cmd, v, v_.at(layer), "v", layer) != rows)
        throw GraphError("gpu kv cache layer " + std::to_string(layer) + ": k and v rows differ");
    pending_.at(layer) = rows;
}

void GpuKvCache::commit(int added) {
    commit_pending(pending_, added, "gpu kv cache");
    length_ += added;
    in_flight_.clear();
}

}  // namespace ncnnport

#endif  // NCNN_VULKAN
