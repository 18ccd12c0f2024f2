// The decoder's K/V cache, allocated once per generation and handed to ncnn without a copy.
//
// Why: the C++ twin of runtime/preallocated_cache.PreallocatedKVCache + runtime/zero_copy. Each
// layer's K and V are ncnn Mats [heads, capacity, head_dim] (w = head_dim, h = capacity,
// c = heads, so heads are cstep apart). A decode step's past is a header of the same Mat with
// h = the committed length: it shares memory and reference count, so ncnn reads the cache in
// place and clones before any in-place write. Prefill writes every prompt row, a decode step
// one row per layer at the committed length; commit() makes them visible to the next step.
//
// Rows (KvRows): float32; or rounded to fp16 on write (runtime/precision.py fp16_kv_cache, the
// CPU runs of the reduced precisions) and kept either as floats (for a MatMul that reads only
// floats: ncnn's built-in, --ncnn-matmul; and under bf16 storage, where ncnn would read 16-bit
// rows as bf16: ncnn_graph.h fp16_cache_inputs_active) or as 2-byte fp16 bits, which ncnnport's
// decode MatMul widens on load (matmul_layer.h): half the bytes a step streams and holds. The numbers are the
// same either way, and the same as the Python loop's (preallocated_cache.py fp16_rows).
#pragma once

#include <net.h>  // ncnn::Mat

#include <stdexcept>
#include <string>
#include <vector>

#include "ncnnport/ncnn_graph.h"

namespace ncnnport {

// The commit rule both caches share (kv_cache.h, gpu_kv_cache.h): every layer has written exactly
// `added` rows since the last commit; `pending` is reset. GraphError naming `what` otherwise.
void commit_pending(std::vector<int>& pending, int added, const std::string& what);

enum class KvRows {
    Fp32,        // float32 rows
    Fp16Values,  // rows rounded to fp16 (round to nearest even), stored as float32
    Fp16,        // rows rounded to fp16, stored as fp16 bits (elemsize 2)
};

// "fp32" / "fp16": the numbers the rows hold (the JSON's kv_cache_rows).
const char* kv_rows_label(KvRows rows);

class KvCache {
public:
    // Throws GraphError when ncnn cannot allocate the buffers.
    KvCache(int layers, int heads, int head_dim, int capacity, KvRows rows = KvRows::Fp32);

    // Past of `layer` as [heads, length, head_dim] Mat headers over the cache (no copy).
    ncnn::Mat past_k(int layer) const { return view(k_.at(layer)); }
    ncnn::Mat past_v(int layer) const { return view(v_.at(layer)); }
    // Writes k/v [1, heads, rows, head_dim] at positions length .. length + rows - 1 of `layer`
    // (not yet visible to past_*); GraphError on a shape mismatch, overflow or non-finite value
    // (with fp16 rows, also a value that rounds past fp16's largest, 65504).
    void write(int layer, const Tensor& k, const Tensor& v);
    // Makes `added` written rows visible; every layer must have written exactly them.
    void commit(int added);

    int length() const { return length_; }
    int capacity() const { return capacity_; }
    int layers() const { return static_cast<int>(k_.size()); }
    int heads() const { return heads_; }
    int head_dim() const { return head_dim_; }
    KvRows rows() const { return rows_; }
    // Bytes per stored value: 2 for KvRows::Fp16, else 4.
    size_t value_bytes() const { return rows_ == KvRows::Fp16 ? 2u : 4u; }
    // The whole buffers of `layer` ([heads, capacity, head_dim]; rows past length() unset), for
    // copying the prompt's cache to the GPU (gpu_kv_cache.h).
    const ncnn::Mat& full_k(int layer) const { return k_.at(layer); }
    const ncnn::Mat& full_v(int layer) const { return v_.at(layer); }

private:
    ncnn::Mat view(const ncnn::Mat& full) const;
    void write_one(ncnn::Mat& dst, const Tensor& t, const char* what, int layer) const;

    int heads_, head_dim_, capacity_;
    KvRows rows_;
    int length_ = 0;
    std::vector<ncnn::Mat> k_, v_;
    std::vector<int> pending_;  // rows written per layer since the last commit
};

}  // namespace ncnnport
