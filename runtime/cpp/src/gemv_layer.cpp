#include "ncnnport/gemv_layer.h"

#include "ncnnport/builtin_overwrite.h"
#include "ncnnport/gemv_prefetch.h"
#include "ncnnport/kernel_call.h"
#include "ncnnport/kernel_weight_allocator.h"
#include "ncnnport/output_store.h"
#include "ncnnport/static_run.h"
#include "ncnnport/stream_times.h"

#include <cpu.h>
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


#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && defined(__unix__)
#include <immintrin.h>
#define NCNNPORT_GEMV_X86 1
#else
#define NCNNPORT_GEMV_X86 0
#endif

namespace ncnnport {

namespace {

std::atomic<uint64_t> g_gemv_calls{0};

#if NCNNPORT_GEMV_X86
#define GEMV_TARGET __attribute__((target("avx2,fma,f16c")))

constexpr int kBlock = 64;  // outputs per block: eight 8-lane accumulators
constexpr int kLanes = 8;
constexpr int kAccumulators = kBlock / kLanes;
constexpr int kNarrowBlock = 16;  // outputs per block of the narrow layout (AVX2-only CPUs): two accumulators
constexpr int kNarrowStreams = 4;  // narrow blocks the streamed variant reads side by side

// Weights of the kernel: block b holds outputs [64b, 64b + 64) as [K][64] (fp32 or fp16 bits),
// the last block zero-padded, and the blocks follow each other: the whole matrix is one
// sequential stream. Why one stream of wide blocks: the first layout (blocks of 16 outputs, four
// read side by side) read fp16 weights at ~22-23 GB/s on one EPYC thread where a plain read of
// the same buffer reached 29-31; one stream of 64-output blocks read 27-29 (README
// "One-row InnerProduct"). Eight accumulators per block keep eight independent FMA chains.
//
// The narrow layout (blocks of kNarrowBlock outputs, the same order within a block), packed where
// the CPU lacks AVX-512F: there the 8-lane copy can read kNarrowStreams blocks side by side, each
// k step of each in turn (gemv_narrow), or one at a time, as gemv_streams_choice finds faster on
// the machine. Why: on an AVX2-only EPYC one stream read slowly; a copy of this loop over the
// 311 MB fp16 head read 11.6-12.7 GB/s in 64-output blocks, one stream, and 17.7-18.8 in 16-output
// blocks four side by side (32-output blocks four side by side 17.5-18.6, with accumulators
// spilled). 64-output blocks cannot go side by side in 16 registers. Each output's chain is the
// same in either layout (bias, then one fused multiply-add per k in order), so the bits are too.
struct Packed {
    ncnn::Mat weights;  // w = K * block elements, h = number of blocks
    ncnn::Mat bias;     // blocks * block floats, zero-padded (zeros when the layer has no bias)
    bool fp16 = false;
    int num_input = 0, num_output = 0, blocks = 0;
    int block = kBlock;  // kBlock, or kNarrowBlock (the narrow layout)
    // the element of output o, input k
    size_t index(size_t o, int k) const {
        return (o / block * static_cast<size_t>(num_input) + k) * block + o % block;
    }
};

GEMV_TARGET inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
GEMV_TARGET inline __m256 load8(const unsigned short* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Prefetches the cache lines of one k step (kBlock weights) `d` ahead in the stream
// (gemv_prefetch.h: whether, and how far, is chosen on the machine). Past the end of the weights
// it names addresses no load follows; a prefetch never faults.
template <typename T>
inline void prefetch_step(const T* w, PrefetchDistance d) { prefetch_stream_step(w, kBlock * sizeof(T), d.far, d.near); }

// One block of 64 outputs; each output sums bias, then w[k] * x[k] in k order with one fused
// multiply-add per term (ncnn's own order within an output).
template <bool Prefetch, typename T>
GEMV_TARGET void gemv_block(const T* w, const float* bias, const float* x, int K, float* out, PrefetchDistance d) {
    __m256 acc[kAccumulators];
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_loadu_ps(bias + i * kLanes);
    for (int k = 0; k < K; ++k) {
        if (Prefetch) prefetch_step(w, d);
        const __m256 xk = _mm256_broadcast_ss(x + k);
        for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_fmadd_ps(load8(w + i * kLanes), xk, acc[i]);
        w += kBlock;
    }
    for (int i = 0; i < kAccumulators; ++i) _mm256_storeu_ps(out + i * kLanes, acc[i]);
}

// S blocks of the narrow layout side by side (w[s], bias[s], out[s]): each k step of each in turn,
// the same chain per output as gemv_block. One prefetch per 64 bytes of each stream.
template <bool Prefetch, int S, typename T>
GEMV_TARGET void gemv_narrow(const T* const* w, const float* const* bias, const float* x, int K, float (*out)[kNarrowBlock],
                             PrefetchDistance d) {
    constexpr int A = kNarrowBlock / kLanes;
    constexpr int kStepsPerLine = 64 / static_cast<int>(kNarrowBlock * sizeof(T));  // 1 (fp32) or 2 (fp16)
    __m256 acc[S][A];
    for (int s = 0; s < S; ++s)
        for (int a = 0; a < A; ++a) acc[s][a] = _mm256_loadu_ps(bias[s] + a * kLanes);
    for (int k = 0; k < K; ++k) {
        const __m256 xk = _mm256_broadcast_ss(x + k);
        const size_t at = static_cast<size_t>(k) * kNarrowBlock;
        for (int s = 0; s < S; ++s) {
            if (Prefetch && k % kStepsPerLine == 0) prefetch_stream_step(w[s] + at, 64, d.far, d.near);
            for (int a = 0; a < A; ++a) acc[s][a] = _mm256_fmadd_ps(load8(w[s] + at + a * kLanes), xk, acc[s][a]);
        }
    }
    for (int s = 0; s < S; ++s)
        for (int a = 0; a < A; ++a) _mm256_storeu_ps(out[s] + a * kLanes, acc[s][a]);
}

#define GEMV_TARGET_512 __attribute__((target("avx512f,avx2,fma,f16c")))
constexpr int kLanes512 = 16;

GEMV_TARGET_512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
GEMV_TARGET_512 inline __m512 load16(const unsigned short* p) {
    // the zero-masked form: the plain one's undefined pass-through trips GCC 12's
    // -Wmaybe-uninitialized (all 16 lanes are written either way)
    return _mm512_maskz_cvtph_ps(static_cast<__mmask16>(0xFFFF), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The same block and the same arithmetic per output (so the same bits) in 16-lane registers:
// one 64-byte load per cache line of fp32 weights instead of two, so the out-of-order window
// holds twice the cache lines in flight (on the device's Xeon the 8-lane copy read its weights
// slower than ncnn's AVX-512 InnerProduct).
template <bool Prefetch, typename T>
GEMV_TARGET_512 void gemv_block_avx512(const T* w, const float* bias, const float* x, int K, float* out,
                                      PrefetchDistance d) {
    constexpr int n = kBlock / kLanes512;
    __m512 acc[n];
    for (int i = 0; i < n; ++i) acc[i] = _mm512_loadu_ps(bias + i * kLanes512);
    for (int k = 0; k < K; ++k) {
        if (Prefetch) prefetch_step(w, d);
        const __m512 xk = _mm512_set1_ps(x[k]);
        for (int i = 0; i < n; ++i) acc[i] = _mm512_fmadd_ps(load16(w + i * kLanes512), xk, acc[i]);
        w += kBlock;
    }
    for (int i = 0; i < n; ++i) _mm512_storeu_ps(out + i * kLanes512, acc[i]);
}

std::atomic<bool> g_avx2_only{false};  // gemv_layer_limit_to_avx2
std::atomic<int> g_forced_streams{0};  // gemv_layer_force_streams: 0 chosen, else the streams

// Whether the blocks run in 16-lane registers: the CPU has AVX-512F and no limit was set.
bool gemv_avx512() {
    static const bool cpu = __builtin_cpu_supports("avx512f");
    return cpu && !g_avx2_only.load(std::memory_order_relaxed);
}

// ncnn's activation_ss for the types the kernel applies itself (exact comparisons, no math
// library): 0 none, 1 relu, 2 leakyrelu (slope), 3 clip (min, max).
float activate(float v, int type, const ncnn::Mat& params) {
    if (type == 1) return std::max(v, 0.f);
    if (type == 2) return v < 0.f ? v * params[0] : v;
    if (type == 3) {
        if (v < params[0]) v = params[0];
        if (v > params[1]) v = params[1];
    }
    return v;
}

// The valid outputs of a block's results `out` (block `b`, `width` outputs): activation, then
// stored to y (streamed past the caches where `stream`: output_store.h).
void finish_block(const Packed& pk, int b, float* out, float* y, int act, const ncnn::Mat& act_params, bool stream) {
    const int o0 = b * pk.block;
    const int n = std::min(pk.block, pk.num_output - o0);
    if (act != 0)
        for (int i = 0; i < n; ++i) out[i] = activate(out[i], act, act_params);
    store_block(y + o0, out, n, stream);
}

// Block `b` of the 64-output layout.
template <bool Prefetch, typename T>
void run_block(const Packed& pk, int b, const float* x, float* y, int act, const ncnn::Mat& act_params, bool stream,
               PrefetchDistance d) {
    const T* w = static_cast<const T*>(pk.weights.data) + static_cast<size_t>(b) * pk.num_input * kBlock;
    const float* bias = static_cast<const float*>(pk.bias.data) + b * kBlock;
    alignas(64) float out[kBlock];
    if (gemv_avx512()) gemv_block_avx512<Prefetch>(w, bias, x, pk.num_input, out, d);
    else gemv_block<Prefetch>(w, bias, x, pk.num_input, out, d);
    finish_block(pk, b, out, y, act, act_params, stream);
}

// S blocks of the narrow layout, `b0` and every `stride` after it.
template <bool Prefetch, int S, typename T>
void run_narrow(const Packed& pk, int b0, int stride, const float* x, float* y, int act, const ncnn::Mat& act_params,
                bool stream, PrefetchDistance d) {
    const T* w[S];
    const float* bias[S];
    for (int s = 0; s < S; ++s) {
        const int b = b0 + s * stride;
        w[s] = static_cast<const T*>(pk.weights.data) + static_cast<size_t>(b) * pk.num_input * kNarrowBlock;
        bias[s] = static_cast<const float*>(pk.bias.data) + b * kNarrowBlock;
    }
    alignas(64) float out[S][kNarrowBlock];
    gemv_narrow<Prefetch, S>(w, bias, x, pk.num_input, out, d);
    for (int s = 0; s < S; ++s) finish_block(pk, b0 + s * stride, out[s], y, act, act_params, stream);
}

// y = W x + b over every block, OpenMP over blocks (ncnn's thread count; each thread one
// contiguous run, as schedule(static) gives it); the narrow layout's run read kNarrowStreams
// blocks side by side where `streams` (its remainder one at a time).
template <bool Prefetch, typename T>
void run_blocks(const Packed& pk, const float* x, float* y, int act, const ncnn::Mat& act_params, int threads,
                PrefetchDistance d, bool streams) {
    const bool stream = stream_output(pk.num_output);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const auto [begin, end] = static_run(pk.blocks, threads);
        int b = begin;
        if (pk.block == kNarrowBlock) {
            if (streams && end - begin >= kNarrowStreams) {
                const int stride = (end - begin) / kNarrowStreams;
                for (int i = 0; i < stride; ++i)
                    run_narrow<Prefetch, kNarrowStreams, T>(pk, begin + i, stride, x, y, act, act_params, stream, d);
                b = begin + stride * kNarrowStreams;
            }
            for (; b < end; ++b) run_narrow<Prefetch, 1, T>(pk, b, 0, x, y, act, act_params, stream, d);
        } else {
            for (; b < end; ++b) run_block<Prefetch, T>(pk, b, x, y, act, act_params, stream, d);
        }
        output_store_fence(stream);
    }
}

template <typename T>
void run_gemv(const Packed& pk, const float* x, float* y, int act, const ncnn::Mat& act_params, int threads,
              bool prefetch, PrefetchDistance d, bool streams) {
    if (prefetch) run_blocks<true, T>(pk, x, y, act, act_params, threads, d, streams);
    else run_blocks<false, T>(pk, x, y, act, act_params, threads, d, streams);
}

// The bytes of weights one call streams.
size_t weight_bytes(const Packed& pk) { return pk.weights.total() * pk.weights.elemsize; }

// fp16 bits of weight (o, k) exactly as ncnn's AVX2 InnerProduct stores them (innerproduct_fp.h,
// innerproduct_transform_kernel with NCNN_IMPL_FP16S), so the kernel reads the built-in's fp16
// weights: out_elempack 8 (N % 8 == 0) / 4 (N % 4 == 0) convert with _mm256_cvtps_ph(TRUNC) over
// whole 8 / 4 column groups and float32_to_float16 (round half away, subnormals flushed) on the
// K tail; out_elempack 1 goes through ncnn's Cast (round to nearest even on whole groups of 4
// of the flat [N][K] array, float32_to_float16 on the last N*K % 4).
GEMV_TARGET unsigned short ncnn_fp16_bits(float v, int o, int k, int num_output, int num_input) {
    const int group = num_output % 8 == 0 ? 8 : (num_output % 4 == 0 ? 4 : 0);
    const __m128 x = _mm_set_ss(v);
    if (group) {
        if (k < num_input - num_input % group) return static_cast<unsigned short>(_mm_extract_epi16(_mm_cvtps_ph(x, _MM_FROUND_TRUNC), 0));
        return ncnn::float32_to_float16(v);
    }
    const size_t total = static_cast<size_t>(num_output) * num_input;
    if (static_cast<size_t>(o) * num_input + k < total - total % 4)
        return static_cast<unsigned short>(_mm_extract_epi16(_mm_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0));
    return ncnn::float32_to_float16(v);
}
GEMV_TARGET float from_fp16(unsigned short h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }

// Packs row-major [N][K] fp32 weights into the kernel's blocks; an empty Packed on allocation failure.
std::shared_ptr<Packed> pack_weights(const ncnn::Mat& weights, const ncnn::Mat& bias, int num_input, int num_output,
                                     bool fp16) {
    auto pk = std::make_shared<Packed>();
    pk->fp16 = fp16;
    pk->num_input = num_input;
    pk->num_output = num_output;
    pk->block = gemv_avx512() ? kBlock : kNarrowBlock;
    pk->blocks = (num_output + pk->block - 1) / pk->block;
    pk->weights.create(num_input * pk->block, pk->blocks, static_cast<size_t>(fp16 ? 2u : 4u), kernel_weight_allocator());
    pk->bias.create(pk->blocks * pk->block);
    if (pk->weights.empty() || pk->bias.empty()) return nullptr;
    pk->bias.fill(0.f);
    if (!bias.empty()) std::memcpy(pk->bias.data, bias.data, sizeof(float) * num_output);
    // row by row: sequential reads of the [N][K] source, writes a block apart (one block's
    // K * block elements stay in L2 while its rows are written)
    const float* src = weights;
    const int block = pk->block;
    for (int o = 0; o < num_output; ++o) {
        const float* row = src + static_cast<size_t>(o) * num_input;
        const size_t base = pk->index(o, 0);
        if (fp16) {
            auto* dst = static_cast<unsigned short*>(pk->weights.data) + base;
            for (int k = 0; k < num_input; ++k) dst[static_cast<size_t>(k) * block] = ncnn_fp16_bits(row[k], o, k, num_output, num_input);
        } else {
            float* dst = static_cast<float*>(pk->weights.data) + base;
            for (int k = 0; k < num_input; ++k) dst[static_cast<size_t>(k) * block] = row[k];
        }
    }
    // the padding outputs of the last block read zero weights
    for (int o = num_output; o < pk->blocks * block; ++o)
        for (int k = 0; k < num_input; ++k) {
            const size_t i = pk->index(o, k);
            if (fp16) static_cast<unsigned short*>(pk->weights.data)[i] = 0;
            else static_cast<float*>(pk->weights.data)[i] = 0.f;
        }
    return pk;
}

// The row-major fp32 weights back from the blocks (exact: fp16 widens losslessly), for a
// built-in InnerProduct created after the raw weights were released.
ncnn::Mat unpack_weights(const Packed& pk) {
    ncnn::Mat out(pk.num_input * pk.num_output);
    if (out.empty()) return out;
    float* dst = out;
    for (int o = 0; o < pk.num_output; ++o)
        for (int k = 0; k < pk.num_input; ++k) {
            const size_t i = pk.index(o, k);
            dst[static_cast<size_t>(o) * pk.num_input + k] =
                pk.fp16 ? from_fp16(static_cast<const unsigned short*>(pk.weights.data)[i])
                        : static_cast<const float*>(pk.weights.data)[i];
        }
    return out;
}
#endif  // NCNNPORT_GEMV_X86

#if NCNNPORT_GEMV_X86
class GemvInnerProduct : public ncnn::Layer {
public:
    GemvInnerProduct() {
        one_blob_only = true;
        support_inplace = false;
    }

    // Reads InnerProduct's parameters (ncnn's ids) and gives the same ParamDict to the built-in
    // layer that runs every case the kernel does not, whose storage flags this layer adopts so
    // ncnn feeds both the same blobs.
    int load_param(const ncnn::ParamDict& pd) override {
        num_output_ = pd.get(0, 0);
        bias_term_ = pd.get(1, 0);
        weight_data_size_ = pd.get(2, 0);
        int8_scale_term_ = pd.get(8, 0);
        activation_type_ = pd.get(9, 0);
        builtin_.reset(ncnn::create_layer_cpu(ncnn::LayerType::InnerProduct));
        if (!builtin_) return -1;
        const int ret = builtin_->load_param(pd);
        if (ret != 0) return ret;
        activation_params_ = pd.get(10, ncnn::Mat());
        if (pd.type(10) == 5 && !activation_params_.empty()) activation_params_ = int_params_as_float(activation_params_);
        adopt_builtin_flags(*this, *builtin_);
        return 0;
    }

    // The same .bin records as ncnn's InnerProduct::load_model, in its order (mb.load type 0
    // reads the fp32 / fp16 / int8 tag of the weights).
    int load_model(const ncnn::ModelBin& mb) override {
        weights_[0] = mb.load(weight_data_size_, 0);
        if (weights_[0].empty()) return -100;
        int n = 1;
        if (bias_term_) {
            weights_[n] = mb.load(num_output_, 1);
            if (weights_[n++].empty()) return -100;
        }
        if (int8_scale_term_) {
            weights_[n++] = mb.load(num_output_, 1);
            weights_[n++] = mb.load(1, 1);
        }
        return 0;
    }

    // Packs the kernel's weights when the one-row case can run here, else builds the built-in
    // now, exactly as ncnn would; either way the raw weights are released.
    int create_pipeline(const ncnn::Option& opt) override {
        pipeline_opt_ = opt;
        pipeline_opt_.blob_allocator = nullptr;
        pipeline_opt_.workspace_allocator = nullptr;
        if (kernel_applies(opt) && weights_[0].elembits() == 32) {
            const bool fp16 = opt.use_fp16_storage;  // ncnn x86: fp16 weights, fp32 blobs
            packed_ = pack_weights(weights_[0], bias_term_ ? weights_[1] : ncnn::Mat(), num_input(), num_output_, fp16);
            if (!packed_) return -100;
            release_raw_weights();
            return 0;
        }
        return build_builtin(nullptr);
    }

    int destroy_pipeline(const ncnn::Option& opt) override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (builtin_ready_) builtin_->destroy_pipeline(opt);
        builtin_ready_ = false;
        packed_.reset();
        return 0;
    }

    int forward(const ncnn::Mat& bottom, ncnn::Mat& top, const ncnn::Option& opt) const override {
        if (kernel_applies(opt) && is_one_row(bottom)) {
            std::shared_ptr<const Packed> pk;
            {
                std::lock_guard<std::mutex> lock(mutex_);
                pk = packed_;
            }
            if (pk) return forward_gemv(*pk, bottom, top, opt);
        }
        ncnn::Layer* builtin = ready_builtin();
        if (!builtin) return -100;
        return builtin->forward(bottom, top, opt);
    }

private:
    int num_input() const { return weight_data_size_ / num_output_; }

    // pd type 5 (an integer array in the .param text) as floats, as ncnn's InnerProduct does.
    static ncnn::Mat int_params_as_float(const ncnn::Mat& p) {
        ncnn::Mat out(p.w);
        for (int i = 0; i < p.w; ++i) out[i] = static_cast<float>(static_cast<const int*>(p.data)[i]);
        return out;
    }

    // The kernel's case: fp32 or fp16 float weights, no int8 or bf16, an activation it applies
    // exactly (ncnn's sigmoid / mish / hardswish go through its own math: those stay built-in).
    bool kernel_applies(const ncnn::Option& opt) const {
        const int params_needed = activation_type_ == 2 ? 1 : (activation_type_ == 3 ? 2 : 0);
        return int8_scale_term_ == 0 && !opt.use_bf16_storage && !opt.use_vulkan_compute && activation_type_ >= 0
               && activation_type_ <= 3 && activation_params_.w >= params_needed && num_output_ > 0
               && weight_data_size_ > 0 && weight_data_size_ % num_output_ == 0;
    }

    // One fp32 row of K values: 1-D (any elempack: a packed 1-D Mat is the same flat memory) or
    // 2-D with one row, as ncnn's forward takes them (2-D: its gemm path with h = 1).
    bool is_one_row(const ncnn::Mat& m) const {
        if (m.elembits() != 32 || m.n > 1 || m.empty()) return false;
        if (m.dims == 1) return m.w * m.elempack == num_input();
        return m.dims == 2 && m.h * m.elempack == 1 && m.w == num_input();
    }

    int forward_gemv(const Packed& pk, const ncnn::Mat& bottom, ncnn::Mat& top, const ncnn::Option& opt) const {
        if (bottom.dims == 1) top.create(num_output_, 4u, opt.blob_allocator);
        else top.create(num_output_, 1, 4u, opt.blob_allocator);
        if (top.empty()) return -100;
        const float* x = bottom;
        float* y = top;
        const size_t bytes = weight_bytes(pk);
        const PrefetchPlan plan(gemv_prefetch_choice(pk.fp16), gemv_prefetch_distance_choice(pk.fp16), bytes);
        GemvPrefetchChoice* streams = pk.block == kNarrowBlock ? &gemv_streams_choice(pk.fp16) : nullptr;
        run_timed_kernel(plan, streams, g_forced_streams.load(std::memory_order_relaxed), gemv_stream_times(pk.fp16),
                         [&](bool prefetch, PrefetchDistance d, bool side_by_side) {
                             if (pk.fp16)
                                 run_gemv<unsigned short>(pk, x, y, activation_type_, activation_params_,
                                                          opt.num_threads, prefetch, d, side_by_side);
                             else run_gemv<float>(pk, x, y, activation_type_, activation_params_, opt.num_threads,
                                                  prefetch, d, side_by_side);
                         });
        g_gemv_calls.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }

    // The built-in with its pipeline, created on first need from the kernel's weights (then the
    // kernel's copy is released: a graph that runs several rows keeps one copy of its weights).
    ncnn::Layer* ready_builtin() const {
        std::lock_guard<std::mutex> lock(mutex_);
        if (builtin_ready_) return builtin_.get();
        if (!packed_) return nullptr;
        ncnn::Mat unpacked = unpack_weights(*packed_);
        if (unpacked.empty()) return nullptr;
        if (const_cast<GemvInnerProduct*>(this)->build_builtin(&unpacked) != 0) return nullptr;
        packed_.reset();
        return builtin_.get();
    }

    // Loads the built-in's weights (the raw records, or `weights` in place of the first with the
    // bias of the packed copy) and creates its pipeline with the options of create_pipeline.
    int build_builtin(const ncnn::Mat* weights) {
        ncnn::Mat records[4];
        if (weights) {
            records[0] = *weights;
            if (bias_term_) {
                records[1] = packed_->bias.range(0, num_output_).clone();
            }
        } else {
            for (int i = 0; i < 4; ++i) records[i] = weights_[i];
        }
        int ret = builtin_->load_model(ncnn::ModelBinFromMatArray(records));
        if (ret == 0) ret = builtin_->create_pipeline(pipeline_opt_);
        if (ret != 0) return ret;
        builtin_ready_ = true;
        release_raw_weights();
        return 0;
    }

    void release_raw_weights() {
        for (auto& w : weights_) w.release();
    }

    int num_output_ = 0, bias_term_ = 0, weight_data_size_ = 0, int8_scale_term_ = 0, activation_type_ = 0;
    ncnn::Mat activation_params_;
    ncnn::Mat weights_[4];  // weight, bias, int8 weight scales, int8 input scale (as loaded)
    ncnn::Option pipeline_opt_;
    std::unique_ptr<ncnn::Layer> builtin_;
    mutable std::mutex mutex_;  // guards packed_ and builtin_ready_ (forward is const and may run concurrently)
    mutable std::shared_ptr<const Packed> packed_;
    mutable bool builtin_ready_ = false;
};

#endif  // NCNNPORT_GEMV_X86

}  // namespace

bool gemv_layer_supported() {
#if NCNNPORT_GEMV_X86
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

bool gemv_builtin_avx512() {
#if NCNN_AVX512
    return ncnn::cpu_support_x86_avx512() != 0;
#else
    return false;
#endif
}

bool register_gemv_layer(ncnn::Net& net) {
#if NCNNPORT_GEMV_X86
    if (!gemv_layer_supported()) return false;
    return register_overwrite_of<GemvInnerProduct>(net, "InnerProduct");
#else
    (void)net;
    return false;
#endif
}

uint64_t gemv_layer_calls() { return g_gemv_calls.load(std::memory_order_relaxed); }

void gemv_layer_limit_to_avx2(bool limit) {
#if NCNNPORT_GEMV_X86
    g_avx2_only.store(limit, std::memory_order_relaxed);
#else
    (void)limit;
#endif
}

void gemv_layer_force_streams(int streams) {
#if NCNNPORT_GEMV_X86
    g_forced_streams.store(streams == 1 || streams == kNarrowStreams ? streams : 0, std::memory_order_relaxed);
#else
    (void)streams;
#endif
}

const char* gemv_layer_label(bool registered) {
    if (!registered) return "ncnn";
#if NCNNPORT_GEMV_X86
    if (gemv_avx512()) return "ncnnport-avx512";
#endif
    return "ncnnport-avx2";
}

}  // namespace ncnnport
