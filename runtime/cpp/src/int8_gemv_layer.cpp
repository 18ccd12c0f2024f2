#include "ncnnport/int8_gemv_layer.h"

#include "ncnnport/builtin_overwrite.h"
#include "ncnnport/gemv_prefetch.h"
#include "ncnnport/kernel_call.h"
#include "ncnnport/stream_times.h"
#include "ncnnport/kernel_weight_allocator.h"
#include "ncnnport/output_store.h"
#include "ncnnport/static_run.h"

#include <layer.h>
#include <layer_type.h>
#include <mat.h>
#include <modelbin.h>
#include <paramdict.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>


#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
// GCC 12's AVX-512 headers build several intrinsics on _mm512_undefined_*(), which its
// -Wmaybe-uninitialized flags once inlined (GCC bug 105593): silenced for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define NCNNPORT_INT8_X86 1
#else
#define NCNNPORT_INT8_X86 0
#endif

namespace ncnnport {

namespace {

std::atomic<uint64_t> g_int8_calls{0};

#if NCNNPORT_INT8_X86
#define INT8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
#define INT8_TARGET_AVX2 __attribute__((target("avx2,fma")))

constexpr int kLanes = 16;  // output rows per row group: one int32 / fp32 lane each (AVX2: two registers of 8)
constexpr int kAvx2Streams = 4;  // row groups the AVX2 copy's streamed variant reads side by side
constexpr int kChains = 4;     // independent accumulators per group (alternate k-quads), added per block

std::atomic<bool> g_avx2_only{false};  // int8_gemv_layer_limit_to_avx2
std::atomic<int> g_forced_streams{0};  // int8_gemv_layer_force_streams: 0 chosen, else the streams

bool cpu_has_vnni() {
    static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                            && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")
                            && __builtin_cpu_supports("fma");
    return yes;
}

bool cpu_has_avx2() {
    static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
}

// Whether a layer packed now takes the AVX-512 VNNI copy (the CPU has it and no limit is set).
bool use_vnni() { return cpu_has_vnni() && !g_avx2_only.load(std::memory_order_relaxed); }

// The kernel's copy of the weights, one sequential stream. Row group g (rows 16g..16g+15) is
// K * 16 contiguous bytes: for each k-quad t, 64 bytes holding row j's k = 4t..4t+3 at 4j
// (dpbusd's layout: lane j sums row j; the AVX2 copy reads rows 0-7 and 8-15 as two halves);
// groups follow each other, the last padded with zero weights and zero descales. The VNNI copy
// stores each byte as w + 128 (dpbusd's unsigned operand; 128 * sum(x) is taken off per block),
// the AVX2 copy w itself (its products take |x| and w with x's sign). Read in order, the whole
// matrix is one stream: the hardware prefetcher then runs ahead of the arithmetic (on the
// Qwen3-ASR head, 160 MB, one EPYC thread: 23-25 GB/s; the same kernel reading 4 or 2 groups a
// quarter / half of the matrix apart, 16-20 GB/s).
struct Packed {
    ncnn::Mat weights;   // uint8, groups * k * 16
    ncnn::Mat descales;  // float [groups][blocks][16]: 1 / scale, as ncnn's x86 packing computes it
    ncnn::Mat bias;      // N floats, or empty
    int n = 0, k = 0, block = 0, blocks = 0, groups = 0;
    bool vnni = true;    // the VNNI copy (bytes w + 128), else the AVX2 copy (bytes w)
    size_t group_bytes() const { return static_cast<size_t>(k) * kLanes; }
    // the byte of row o, column c
    size_t offset(size_t o, int c) const {
        return (o / kLanes) * group_bytes() + static_cast<size_t>(c / 4) * 64 + (o % kLanes) * 4 + c % 4;
    }
    size_t descale_index(size_t o, int b) const { return ((o / kLanes) * blocks + b) * kLanes + o % kLanes; }
    // the stored byte of weight w, and back
    uint8_t stored(int8_t w) const { return vnni ? static_cast<uint8_t>(w) ^ 0x80u : static_cast<uint8_t>(w); }
    int8_t weight(uint8_t byte) const { return static_cast<int8_t>(vnni ? byte ^ 0x80u : byte); }
    // K-block b's length: `block`, the last one what is left of K (ncnn's max_kk0)
    int block_len(int b) const { return std::min(block, k - b * block); }
};

// The one-row input quantized per K-block as ncnn's x86 kernel does (quantize_A_tile_wq_int8 for
// one row): scale 127/absmax (0 for an all-zero block), q = trunc(v*scale +- 0.5) saturated to
// [-127, 127], descale absmax/127. Also 128 * sum(q) per block, what the unsigned weights add.
INT8_TARGET void quantize_row(const float* x, int k, int block, int8_t* q, float* descale, int32_t* shift) {
    const int blocks = (k + block - 1) / block;
    const __m512 half = _mm512_set1_ps(0.5f);
    const __m512i sign_mask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    for (int b = 0; b < blocks; ++b) {
        const float* xb = x + static_cast<size_t>(b) * block;
        const int len = std::min(block, k - b * block);  // a multiple of 16 (Int8GemvGemm::load_param)
        __m512 mx = _mm512_setzero_ps();
        for (int i = 0; i < len; i += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(xb + i)));
        const float absmax = _mm512_reduce_max_ps(mx);
        const float scale = absmax != 0.f ? 127.f / absmax : 0.f;
        descale[b] = absmax / 127.f;
        const __m512 s = _mm512_set1_ps(scale);
        int32_t sum = 0;
        for (int i = 0; i < len; i += 16) {
            const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xb + i), s);
            const __m512 signed_half = _mm512_castsi512_ps(
                _mm512_or_si512(_mm512_castps_si512(half), _mm512_and_si512(_mm512_castps_si512(v), sign_mask)));
            const __m512 rounded = _mm512_add_ps(v, signed_half);
            __m128i q8 = _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(rounded));
            q8 = _mm_max_epi8(q8, _mm_set1_epi8(-127));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(q + static_cast<size_t>(b) * block + i), q8);
            sum += _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q8));
        }
        shift[b] = 128 * sum;
    }
}

INT8_TARGET inline __m512i broadcast_quad(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

// Row group g: 16 output rows. Per block, each row's exact integer dot product in its lane
// (kChains accumulators over alternate k-quads, added), then fsum = fma(float(isum),
// descale_x * descale_w, fsum) in k order (ncnn's vector path). With Prefetch, each 64-byte load
// is preceded by a prefetch `dist` ahead in the stream (past the group's end that is
// the next group, past the matrix's end the next copy in the weight arena, or nothing: a
// prefetch never faults); whether, and how far, is chosen on the machine (int8_gemv_prefetch_choice,
// int8_gemv_prefetch_distance_choice).
template <bool Prefetch>
INT8_TARGET void run_group(const Packed& pk, int g, const int8_t* q, const float* xdescale, const int32_t* shift,
                           float* out, PrefetchDistance dist) {
    const uint8_t* p = static_cast<const uint8_t*>(pk.weights.data) + static_cast<size_t>(g) * pk.group_bytes();
    const float* d = static_cast<const float*>(pk.descales.data) + static_cast<size_t>(g) * pk.blocks * kLanes;
    __m512 f = _mm512_setzero_ps();
    for (int b = 0; b < pk.blocks; ++b) {
        const int len = pk.block_len(b), quads = len / 4;
        __m512i acc[kChains];
        for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_si512();
        const int8_t* qb = q + static_cast<size_t>(b) * pk.block;
        for (int t = 0; t < quads; t += kChains) {
#pragma GCC unroll 4
            for (int c = 0; c < kChains; ++c) {
                if (Prefetch) prefetch_stream_step(p + 64 * (t + c), 64, dist.far, dist.near);
                acc[c] = _mm512_dpbusd_epi32(acc[c], _mm512_loadu_si512(p + 64 * (t + c)), broadcast_quad(qb + 4 * (t + c)));
            }
        }
        const __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3])),
                                              _mm512_set1_epi32(shift[b]));
        const __m512 dsc = _mm512_mul_ps(_mm512_set1_ps(xdescale[b]), _mm512_loadu_ps(d + b * kLanes));
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dsc, f);
        p += static_cast<size_t>(len) * kLanes;
    }
    _mm512_storeu_ps(out, f);
}

// quantize_row in 8-lane registers, for the AVX2 copy (whose signed weights need no shift): the
// same q and descale bit for bit (max and the products are exact, the rounding the same steps),
// and |q| beside it (the unsigned operand of the AVX2 products).
INT8_TARGET_AVX2 void quantize_row_avx2(const float* x, int k, int block, int8_t* q, uint8_t* q_abs, float* descale) {
    const int blocks = (k + block - 1) / block;
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (int b = 0; b < blocks; ++b) {
        const float* xb = x + static_cast<size_t>(b) * block;
        const int len = std::min(block, k - b * block);  // a multiple of 16 (Int8GemvGemm::load_param)
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < len; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(xb + i)));
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, mx);
        float absmax = 0.f;
        for (float v : lanes) absmax = std::max(absmax, v);
        const float scale = absmax != 0.f ? 127.f / absmax : 0.f;
        descale[b] = absmax / 127.f;
        const __m256 s = _mm256_set1_ps(scale);
        for (int i = 0; i < len; i += 16) {
            __m256i r[2];
            for (int h = 0; h < 2; ++h) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * h), s);
                const __m256 rounded = _mm256_add_ps(v, _mm256_or_ps(half, _mm256_and_ps(v, sign_mask)));
                r[h] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvttps_epi32(rounded), hi), lo);
            }
            // int32 -> int16 -> int8 (values already in [-127, 127]); packs interleaves the two
            // 128-bit halves, the permute puts them back in order
            const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(r[0], r[1]), 0xD8);
            const __m128i q8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
            const size_t at = static_cast<size_t>(b) * block + i;
            _mm_storeu_si128(reinterpret_cast<__m128i*>(q + at), q8);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(q_abs + at), _mm_abs_epi8(q8));
        }
    }
}

template <typename T>
INT8_TARGET_AVX2 inline __m256i broadcast_quad_avx2(const T* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

// run_group for the AVX2 copy, over `S` row groups at once (`g0`, g0 + stride, ...): 16 rows each,
// as two halves of 8 lanes. Without VNNI's dpbusd, each k-quad's 4 products per row are
// maddubs(|x|, w with x's sign) (pairs added in int16: at most 2 * 127 * 127, no saturation; a
// weight of -128 would flip wrong, so such layers never take this copy) then madd with ones into
// int32: the same exact integer per block as the VNNI copy, then the same fp32 chain per row, so
// the same bits whatever S. |x| and x are broadcast once per quad for every group; one prefetch
// per 64-byte line (one quad of one group).
// Why S: with S > 1 the groups are S streams read side by side, 64 bytes of each in turn. On an
// AVX2-only EPYC one stream of the head read 13-15 GB/s and four read side by side 20-22 (a sum
// over 160 MB, /tmp micro-benchmark; numpy's two-array dot 19.4), while on an AVX-512 EPYC one
// stream was the fastest (the layout comment above): so int8_gemv_streams_choice picks S = 1 or
// kAvx2Streams on the machine, from the model's calls.
template <bool Prefetch, int S>
INT8_TARGET_AVX2 void run_groups_avx2(const Packed& pk, int g0, int stride, const int8_t* q, const uint8_t* q_abs,
                                      const float* xdescale, float (*out)[kLanes], PrefetchDistance dist) {
    constexpr int kHalf = kLanes / 2;
    const int8_t* p[S];
    const float* d[S];
    for (int s = 0; s < S; ++s) {
        const int g = g0 + s * stride;
        p[s] = static_cast<const int8_t*>(pk.weights.data) + static_cast<size_t>(g) * pk.group_bytes();
        d[s] = static_cast<const float*>(pk.descales.data) + static_cast<size_t>(g) * pk.blocks * kLanes;
        _mm256_storeu_ps(out[s], _mm256_setzero_ps());
        _mm256_storeu_ps(out[s] + kHalf, _mm256_setzero_ps());
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = 0; b < pk.blocks; ++b) {
        const int len = pk.block_len(b), quads = len / 4;
        __m256i acc[S][2];
        for (int s = 0; s < S; ++s) acc[s][0] = acc[s][1] = _mm256_setzero_si256();
        const size_t x0 = static_cast<size_t>(b) * pk.block;
        for (int t = 0; t < quads; ++t) {
            const __m256i xa = broadcast_quad_avx2(q_abs + x0 + 4 * t);
            const __m256i xs = broadcast_quad_avx2(q + x0 + 4 * t);
#pragma GCC unroll 4
            for (int s = 0; s < S; ++s) {
                const int8_t* at = p[s] + 64 * t;
                if (Prefetch) prefetch_stream_step(at, 64, dist.far, dist.near);
                for (int h = 0; h < 2; ++h) {
                    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32 * h));
                    const __m256i pairs = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(w, xs));
                    acc[s][h] = _mm256_add_epi32(acc[s][h], _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        const __m256 xd = _mm256_set1_ps(xdescale[b]);
        for (int s = 0; s < S; ++s) {
            for (int h = 0; h < 2; ++h) {
                const __m256 dsc = _mm256_mul_ps(xd, _mm256_loadu_ps(d[s] + b * kLanes + kHalf * h));
                float* f = out[s] + kHalf * h;
                _mm256_storeu_ps(f, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[s][h]), dsc, _mm256_loadu_ps(f)));
            }
            p[s] += static_cast<size_t>(len) * kLanes;
        }
    }
}

// Group g's results `out` (kLanes rows), bias added, its valid rows stored to y.
void store_group(const Packed& pk, int g, float* out, float* y, bool stream) {
    const float* bias = pk.bias.empty() ? nullptr : static_cast<const float*>(pk.bias.data);
    const int o0 = g * kLanes;
    const int n = std::min(kLanes, pk.n - o0);
    if (bias)
        for (int r = 0; r < n; ++r) out[r] += bias[o0 + r];
    store_block(y + o0, out, n, stream);
}

// y = B x (+ bias) for one quantized row, OpenMP over row groups (ncnn's thread count; each
// thread reads one contiguous run of groups, as schedule(static) would give it), in the copy `pk`
// was packed for; the AVX2 copy with `streams` > 1 reads its run as kAvx2Streams streams side by
// side (its remainder one group at a time).
template <bool Prefetch>
void run_gemv(const Packed& pk, const int8_t* q, const uint8_t* q_abs, const float* xdescale, const int32_t* shift,
              float* y, int threads, PrefetchDistance dist, bool streams) {
    const bool stream = stream_output(pk.n);  // a large output past the caches (output_store.h)
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const auto [begin, end] = static_run(pk.groups, threads);
        alignas(64) float out[kAvx2Streams][kLanes];
        int g = begin;
        if (!pk.vnni && streams && end - begin >= kAvx2Streams) {
            const int stride = (end - begin) / kAvx2Streams;
            for (int i = 0; i < stride; ++i) {
                run_groups_avx2<Prefetch, kAvx2Streams>(pk, begin + i, stride, q, q_abs, xdescale, out, dist);
                for (int s = 0; s < kAvx2Streams; ++s) store_group(pk, begin + i + s * stride, out[s], y, stream);
            }
            g = begin + stride * kAvx2Streams;
        }
        for (; g < end; ++g) {
            if (pk.vnni) run_group<Prefetch>(pk, g, q, xdescale, shift, out[0], dist);
            else run_groups_avx2<Prefetch, 1>(pk, g, 0, q, q_abs, xdescale, out, dist);
            store_group(pk, g, out[0], y, stream);
        }
        output_store_fence(stream);
    }
}

// The kernel's copy of int8 weights `b` ([N][K] bytes) with per-row, per-block `scales`
// ([N][blocks] of 127/absmax), in the layout of the copy that runs here (use_vnni());
// nullptr on allocation failure.
std::shared_ptr<Packed> pack_weights(const ncnn::Mat& b, const ncnn::Mat& scales, const ncnn::Mat& bias, int n, int k,
                                     int block) {
    auto pk = std::make_shared<Packed>();
    pk->vnni = use_vnni();
    pk->n = n;
    pk->k = k;
    pk->block = block;
    pk->blocks = (k + block - 1) / block;
    pk->groups = (n + kLanes - 1) / kLanes;
    pk->weights.create(static_cast<int>(pk->group_bytes()), pk->groups, static_cast<size_t>(1u), kernel_weight_allocator());
    pk->descales.create(pk->blocks * kLanes, pk->groups);
    if (pk->weights.empty() || pk->descales.empty()) return nullptr;
    if (!bias.empty()) {
        pk->bias = bias.clone();
        if (pk->bias.empty()) return nullptr;
    }
    auto* dst = static_cast<uint8_t*>(pk->weights.data);
    auto* dsc = static_cast<float*>(pk->descales.data);
    const auto* src = static_cast<const int8_t*>(b.data);
    const auto* sc = static_cast<const float*>(scales.data);
    for (size_t o = 0; o < static_cast<size_t>(pk->groups) * kLanes; ++o) {
        const bool real = o < static_cast<size_t>(n);
        for (int c = 0; c < k; ++c) dst[pk->offset(o, c)] = pk->stored(real ? src[o * k + c] : int8_t{0});
        for (int blk = 0; blk < pk->blocks; ++blk) dsc[pk->descale_index(o, blk)] = real ? 1.f / sc[o * pk->blocks + blk] : 0.f;
    }
    return pk;
}

// Whether int8 weights `b` hold a -128 (ncnn's quantizer and convert/int8_weights.py clamp to
// +-127; another writer may not), which the AVX2 copy's sign trick would negate wrongly.
bool holds_minus_128(const ncnn::Mat& b) {
    const auto* w = static_cast<const int8_t*>(b.data);
    return std::find(w, w + b.total() * b.elemsize, int8_t{-128}) != w + b.total() * b.elemsize;
}

// The [N][K] int8 weights back from the kernel's copy (exact), for a built-in Gemm created after
// the raw weights were released.
ncnn::Mat unpack_weights(const Packed& pk) {
    ncnn::Mat out(pk.n * pk.k, static_cast<size_t>(1u));
    if (out.empty()) return out;
    auto* dst = static_cast<int8_t*>(out.data);
    const auto* src = static_cast<const uint8_t*>(pk.weights.data);
    for (size_t o = 0; o < static_cast<size_t>(pk.n); ++o)
        for (int c = 0; c < pk.k; ++c) dst[o * pk.k + c] = pk.weight(src[pk.offset(o, c)]);
    return out;
}

class Int8GemvGemm : public ncnn::Layer {
public:
    Int8GemvGemm() {
        one_blob_only = false;
        support_inplace = false;
    }

    // Gemm's parameters (ncnn's ids); the same ParamDict goes to the built-in Gemm, whose storage
    // flags this layer adopts so ncnn feeds both the same blobs.
    int load_param(const ncnn::ParamDict& pd) override {
        const float alpha = pd.get(0, 1.f), beta = pd.get(1, 1.f);
        const int trans_a = pd.get(2, 0), trans_b = pd.get(3, 0), constant_a = pd.get(4, 0), constant_b = pd.get(5, 0);
        constant_c_ = pd.get(6, 0);
        n_ = pd.get(8, 0);
        k_ = pd.get(9, 0);
        broadcast_c_ = pd.get(10, 0);
        const bool plain_output = pd.get(11, 0) == 0 && pd.get(12, 0) == 0 && pd.get(13, 0) == 0 && pd.get(14, 0) == 0;
        const int quantize_term = pd.get(18, 0);
        block_ = quantize_term % 10 == 2 ? 128 : quantize_term % 10 == 1 ? 64 : 32;
        // 8-bit weights, no input scales (80y), constant transposed B, A as input, C none or per column
        ours_ = quantize_term / 100 == 8 && quantize_term % 100 / 10 == 0 && quantize_term % 10 <= 2 && constant_a == 0
                && constant_b == 1 && trans_a == 0 && trans_b == 1 && plain_output && alpha == 1.f && beta == 1.f
                && (constant_c_ == 0 || broadcast_c_ == -1 || broadcast_c_ == 4) && n_ > 0 && k_ > 0
                && block_ % (4 * kChains) == 0 && k_ % (4 * kChains) == 0;
        builtin_.reset(ncnn::create_layer_cpu(ncnn::LayerType::Gemm));
        if (!builtin_) return -1;
        const int ret = builtin_->load_param(pd);
        if (ret != 0) return ret;
        one_blob_only = builtin_->one_blob_only;
        adopt_builtin_flags(*this, *builtin_);
        return 0;
    }

    // Gemm::load_model's records for this case, in its order: B as raw int8 [N][K], C per column
    // (flagged), the scales [N][blocks]. Any other Gemm loads into the built-in directly.
    int load_model(const ncnn::ModelBin& mb) override {
        if (!ours_) return builtin_->load_model(mb);
        b_ = mb.load(k_, n_, 8);
        if (b_.empty()) return -100;
        if (has_c()) {
            c_ = mb.load(n_, 1, 0);
            if (c_.empty()) return -100;
        }
        scales_ = mb.load((k_ + block_ - 1) / block_, n_, 1);
        return scales_.empty() ? -100 : 0;
    }

    // The kernel's copy when the one-row case can run here (then the raw weights go), else the
    // built-in now, exactly as ncnn would build it.
    int create_pipeline(const ncnn::Option& opt) override {
        if (!ours_) return builtin_->create_pipeline(opt);
        pipeline_opt_ = opt;
        pipeline_opt_.blob_allocator = nullptr;
        pipeline_opt_.workspace_allocator = nullptr;
        if (options_fit(opt) && (use_vnni() || !holds_minus_128(b_))) {
            packed_ = pack_weights(b_, scales_, c_, n_, k_, block_);
            if (!packed_) return -100;
            b_.release();
            return 0;
        }
        return build_builtin(b_);
    }

    int destroy_pipeline(const ncnn::Option& opt) override {
        if (!ours_) return builtin_->destroy_pipeline(opt);
        std::lock_guard<std::mutex> lock(mutex_);
        if (builtin_ready_) builtin_->destroy_pipeline(opt);
        builtin_ready_ = false;
        packed_.reset();
        return 0;
    }

    // A Gemm with constant B and C takes one blob (Gemm::load_param sets one_blob_only), and ncnn
    // then calls this form: the same as the list form with one input and one output.
    int forward(const ncnn::Mat& bottom, ncnn::Mat& top, const ncnn::Option& opt) const override {
        std::vector<ncnn::Mat> tops(1);
        const int ret = forward(std::vector<ncnn::Mat>{bottom}, tops, opt);
        top = tops[0];
        return ret;
    }

    int forward(const std::vector<ncnn::Mat>& bottoms, std::vector<ncnn::Mat>& tops, const ncnn::Option& opt) const override {
        if (!ours_) return builtin_->forward(bottoms, tops, opt);
        if (bottoms.size() == 1 && tops.size() == 1 && options_fit(opt) && is_one_row(bottoms[0])) {
            std::shared_ptr<const Packed> pk;
            {
                std::lock_guard<std::mutex> lock(mutex_);
                pk = packed_;
            }
            if (pk) return forward_gemv(*pk, bottoms[0], tops[0], opt);
        }
        ncnn::Layer* builtin = ready_builtin();
        if (!builtin) return -100;
        return builtin->forward(bottoms, tops, opt);
    }

private:
    bool has_c() const { return constant_c_ == 1 && broadcast_c_ == 4; }
    static bool options_fit(const ncnn::Option& opt) { return !opt.use_vulkan_compute && !opt.use_bf16_storage; }

    // One unpacked fp32 row [K] as a 2-D Mat (w = K, h = 1): what convert/int8_weights.py's
    // Reshape feeds the Gemm in a decode step.
    bool is_one_row(const ncnn::Mat& m) const {
        return !m.empty() && m.dims == 2 && m.elembits() == 32 && m.elempack == 1 && m.h == 1 && m.w == k_;
    }

    int forward_gemv(const Packed& pk, const ncnn::Mat& a, ncnn::Mat& top, const ncnn::Option& opt) const {
        top.create(n_, 1, 4u, opt.blob_allocator);
        if (top.empty()) return -100;
        const int blocks = (k_ + block_ - 1) / block_;
        std::vector<int8_t> q(static_cast<size_t>(k_));
        std::vector<uint8_t> q_abs(pk.vnni ? 0 : static_cast<size_t>(k_));
        std::vector<float> descale(static_cast<size_t>(blocks));
        std::vector<int32_t> shift(static_cast<size_t>(blocks));
        if (pk.vnni) quantize_row(static_cast<const float*>(a.data), k_, block_, q.data(), descale.data(), shift.data());
        else quantize_row_avx2(static_cast<const float*>(a.data), k_, block_, q.data(), q_abs.data(), descale.data());
        const size_t bytes = pk.weights.total() * pk.weights.elemsize;
        const PrefetchPlan plan(int8_gemv_prefetch_choice(), int8_gemv_prefetch_distance_choice(), bytes);
        GemvPrefetchChoice* streams = pk.vnni ? nullptr : &int8_gemv_streams_choice();
        float* y = static_cast<float*>(top.data);
        run_timed_kernel(plan, streams, g_forced_streams.load(std::memory_order_relaxed), int8_gemv_stream_times(),
                         [&](bool prefetch, PrefetchDistance d, bool side_by_side) {
                             if (prefetch)
                                 run_gemv<true>(pk, q.data(), q_abs.data(), descale.data(), shift.data(), y,
                                                opt.num_threads, d, side_by_side);
                             else run_gemv<false>(pk, q.data(), q_abs.data(), descale.data(), shift.data(), y,
                                                  opt.num_threads, d, side_by_side);
                         });
        g_int8_calls.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }

    // The built-in with its pipeline, made on first need from the kernel's copy (which then goes:
    // a graph that runs several rows keeps one copy of its weights).
    ncnn::Layer* ready_builtin() const {
        std::lock_guard<std::mutex> lock(mutex_);
        if (builtin_ready_) return builtin_.get();
        if (!packed_) return nullptr;
        const ncnn::Mat unpacked = unpack_weights(*packed_);
        if (unpacked.empty()) return nullptr;
        if (const_cast<Int8GemvGemm*>(this)->build_builtin(unpacked) != 0) return nullptr;
        packed_.reset();
        return builtin_.get();
    }

    // Loads the built-in from `b` ([N][K] int8) and the kept C and scales, and creates its
    // pipeline with the options of create_pipeline; the raw records go.
    int build_builtin(const ncnn::Mat& b) {
        ncnn::Mat records[3];
        int n = 0;
        records[n++] = b;
        if (has_c()) records[n++] = c_;
        records[n++] = scales_;
        int ret = builtin_->load_model(ncnn::ModelBinFromMatArray(records));
        if (ret == 0) ret = builtin_->create_pipeline(pipeline_opt_);
        if (ret != 0) return ret;
        builtin_ready_ = true;
        b_.release();
        c_.release();
        scales_.release();
        return 0;
    }

    bool ours_ = false;
    int constant_c_ = 0, broadcast_c_ = 0, n_ = 0, k_ = 0, block_ = 0;
    ncnn::Mat b_, c_, scales_;  // as loaded; b_ goes once packed, c_ and scales_ stay for a late built-in
    ncnn::Option pipeline_opt_;
    std::unique_ptr<ncnn::Layer> builtin_;
    mutable std::mutex mutex_;  // guards packed_ and builtin_ready_ (forward is const and may run concurrently)
    mutable std::shared_ptr<const Packed> packed_;
    mutable bool builtin_ready_ = false;
};

#endif  // NCNNPORT_INT8_X86

}  // namespace

bool int8_gemv_layer_supported() {
#if NCNNPORT_INT8_X86
    return cpu_has_vnni() || cpu_has_avx2();
#else
    return false;
#endif
}

bool register_int8_gemv_layer(ncnn::Net& net) {
#if NCNNPORT_INT8_X86
    if (!int8_gemv_layer_supported()) return false;
    return register_overwrite_of<Int8GemvGemm>(net, "Gemm");
#else
    (void)net;
    return false;
#endif
}

uint64_t int8_gemv_layer_calls() { return g_int8_calls.load(std::memory_order_relaxed); }

void int8_gemv_layer_limit_to_avx2(bool limit) {
#if NCNNPORT_INT8_X86
    g_avx2_only.store(limit, std::memory_order_relaxed);
#else
    (void)limit;
#endif
}

void int8_gemv_layer_force_streams(int streams) {
#if NCNNPORT_INT8_X86
    g_forced_streams.store(streams == 1 || streams == kAvx2Streams ? streams : 0, std::memory_order_relaxed);
#else
    (void)streams;
#endif
}

int int8_gemv_layer_side_by_side_streams() {
#if NCNNPORT_INT8_X86
    return kAvx2Streams;
#else
    return 1;
#endif
}

const char* int8_gemv_layer_label(bool registered) {
    if (!registered) return "ncnn";
#if NCNNPORT_INT8_X86
    if (use_vnni()) return "ncnnport-avx512vnni";
#endif
    return "ncnnport-avx2";
}

}  // namespace ncnnport
