#include "ncnnport/kv_cache.h"

#include "ncnnport/fp16.h"
#include "ncnnport/huge_page_allocator.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ncnnport {

const char* kv_rows_label(KvRows rows) { return rows == KvRows::Fp32 ? "fp32" : "fp16"; }

KvCache::KvCache(int layers, int heads, int head_dim, int capacity, KvRows rows)
    : heads_(heads), head_dim_(head_dim), capacity_(capacity), rows_(rows), pending_(layers, 0) {
    if (layers <= 0 || heads <= 0 || head_dim <= 0 || capacity <= 0)
        throw GraphError("kv cache: layers, heads, head_dim and capacity must be positive");
    for (int i = 0; i < layers; ++i) {
        // on huge pages (huge_page_allocator.h): each step streams the past once
        k_.emplace_back(head_dim, capacity, heads, value_bytes(), huge_page_allocator());
        v_.emplace_back(head_dim, capacity, heads, value_bytes(), huge_page_allocator());
        if (k_.back().empty() || v_.back().empty())
            throw GraphError("kv cache: ncnn could not allocate [" + std::to_string(heads) + ", "
                             + std::to_string(capacity) + ", " + std::to_string(head_dim) + "] "
                             + (rows == KvRows::Fp16 ? "fp16" : "float32"));
    }
}

ncnn::Mat KvCache::view(const ncnn::Mat& full) const {
    if (length_ == 0) throw GraphError("kv cache: past read before anything was committed");
    ncnn::Mat header = full;  // shares data and reference count
    header.h = length_;
    return header;
}

void KvCache::write_one(ncnn::Mat& dst, const Tensor& t, const char* what, int layer) const {
    const std::string where = "kv cache layer " + std::to_string(layer) + " " + what;
    if (t.shape.size() != 4 || t.shape[0] != 1 || t.shape[1] != heads_ || t.shape[3] != head_dim_)
        throw GraphError(where + ": got a tensor that is not [1, " + std::to_string(heads_) + ", rows, "
                         + std::to_string(head_dim_) + "]");
    const int rows = static_cast<int>(t.shape[2]);
    if (length_ + rows > capacity_)
        throw GraphError(where + ": " + std::to_string(length_ + rows) + " positions exceed the capacity "
                         + std::to_string(capacity_));
    for (float x : t.data)
        if (!std::isfinite(x)) throw GraphError(where + ": non-finite value from the graph");
    const size_t n = static_cast<size_t>(rows) * head_dim_;
    if (rows_ == KvRows::Fp32) {
        for (int h = 0; h < heads_; ++h)
            std::memcpy(dst.channel(h).row(length_), t.data.data() + h * n, n * sizeof(float));
        return;
    }
    // round to nearest even (fp16.h: numpy's astype(float16)), checked for overflow before
    // anything is written
    std::vector<uint16_t> half(t.data.size());
    for (size_t i = 0; i < half.size(); ++i) {
        half[i] = fp16_bits(t.data[i]);
        if ((half[i] & 0x7c00u) == 0x7c00u)
            throw GraphError(where + ": a value rounds past fp16's largest (65504): run with an fp32 cache (--precision fp32)");
    }
    for (int h = 0; h < heads_; ++h) {
        const uint16_t* src = half.data() + h * n;
        if (rows_ == KvRows::Fp16) {
            std::memcpy(dst.channel(h).row<unsigned short>(length_), src, n * sizeof(uint16_t));
        } else {
            float* out = dst.channel(h).row(length_);
            for (size_t i = 0; i < n; ++i) out[i] = fp16_value(src[i]);
        }
    }
}

void KvCache::write(int layer, const Tensor& k, const Tensor& v) {
    write_one(k_.at(layer), k, "k", layer);
    write_one(v_.at(layer), v, "v", layer);
    pending_.at(layer) = static_cast<int>(k.shape[2]);
    if (v.shape[2] != k.shape[2]) throw GraphError("kv cache layer " + std::to_string(layer) + ": k and v rows differ");
}

void commit_pending(std::vector<int>& pending, int added, const std::string& what) {
    for (size_t i = 0; i < pending.size(); ++i)
        if (pending[i] != added)
            throw GraphError(what + ": layer " + std::to_string(i) + " wrote " + std::to_string(pending[i])
                             + " rows, commit of " + std::to_string(added));
    for (auto& p : pending) p = 0;
}

void KvCache::commit(int added) {
    commit_pending(pending_, added, "kv cache");
    length_ += added;
}

}  // namespace ncnnport
