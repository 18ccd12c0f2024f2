// The tied token embedding read as rows of the lm_head graph's weights (models/youtu_vl/tied_embed.py).
//
// Why: a Youtu-VL package stores the [V, H] table once, as the constant B of the lm_head Gemm;
// an embedding is a row gather, so the host reads the rows straight out of lm_head.ncnn.bin
// (memory-mapped: only the rows used are paged in). The layout is checked as strictly as the
// Python reader does: Input -> RMSNorm(affine) -> Gemm(constant B, transB, N=V, K=H) or its
// InnerProduct variant; .bin = H float32 gamma, a 4-byte storage tag (0 float32, 0x01306B47
// float16), V*H values padded to 4 bytes. A mismatch is a PackageError naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace youtu_vl {

// One memory-mapped head table (one lm_head graph or one vocab shard).
class HeadTable {
public:
    HeadTable(const std::filesystem::path& param, const std::filesystem::path& weights);
    ~HeadTable();
    HeadTable(const HeadTable&) = delete;
    HeadTable& operator=(const HeadTable&) = delete;
    HeadTable(HeadTable&& other) noexcept;

    int64_t rows() const { return rows_; }
    int64_t width() const { return width_; }
    // Row `r` as float32 into out[0 .. width).
    void row(int64_t r, float* out) const;

private:
    void* map_ = nullptr;
    size_t map_size_ = 0;
    const uint8_t* values_ = nullptr;
    bool fp16_ = false;
    int64_t rows_ = 0, width_ = 0;
};

// The embedding over the head graphs in vocab order: ids -> [n, H] float32.
class TiedEmbedding {
public:
    // `heads` = the head graph names in vocab order (lm_head, or lm_head_part0..K).
    TiedEmbedding(const std::filesystem::path& package, const std::vector<std::string>& heads);
    // Throws std::out_of_range naming the id when it is outside [0, vocab).
    std::vector<float> lookup(const std::vector<int>& ids) const;
    int64_t vocab() const { return vocab_; }
    int64_t width() const { return width_; }

private:
    std::vector<HeadTable> tables_;
    std::vector<int64_t> starts_;
    int64_t vocab_ = 0, width_ = 0;
};

}  // namespace youtu_vl
