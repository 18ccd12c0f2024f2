#include "ncnnport/matmul_layer.h"

#include "ncnnport/builtin_overwrite.h"

#include <layer.h>
#include <layer_type.h>
#include <mat.h>
#include <paramdict.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <vector>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define NCNNPORT_MATMUL_X86 1
#else
#define NCNNPORT_MATMUL_X86 0
#endif

namespace ncnnport {

namespace {

std::atomic<uint64_t> g_matmul_calls{0};

#if NCNNPORT_MATMUL_X86
#define MATMUL_TARGET __attribute__((target("avx2,fma")))

// Sum of the 8 lanes of v.
MATMUL_TARGET inline float sum8(__m256 v) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h2 = _mm_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_hadd_ps(h2, h2));
}

// The scalar rest of a dot product of q with a cache row: k in [k0, K), the K % 8 the lanes left.
MATMUL_TARGET inline float dot_tail(const float* q, const float* row, int k0, int K) {
    float s = 0.f;
    for (int k = k0; k < K; ++k) s = std::fma(q[k], row[k], s);
    return s;
}

// out[r][n] = sum_k q[r][k] c[n][k] for R (1-4) query rows against every cache row of c (rows K
// apart). Each cache row is read whole before the next, so the cache slice is one sequential
// stream; the query rows stay in L1. Per query row two 8-lane partial sums (even and odd 8-blocks
// of k), added and their lanes summed at the end of the cache row. Why row by row: the first
// version read four cache rows side by side, k by k, and ran at ~7 GB/s on one EPYC thread over a
// cold 4 MB slice; this order reads it at ~14 GB/s, 2.0-2.4x faster (runtime/cpp/README.md,
// "Decode attention").
template <int R>
MATMUL_TARGET void scores_rows(const float* q, int K, const float* c, int N, float* out, int out_stride) {
    const int K16 = K - K % 16, K8 = K - K % 8;
    for (int n = 0; n < N; ++n) {
        const float* row = c + static_cast<size_t>(n) * K;
        __m256 even[R], odd[R];
        for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
        int k = 0;
        for (; k < K16; k += 16) {
            const __m256 x = _mm256_loadu_ps(row + k), y = _mm256_loadu_ps(row + k + 8);
            for (int r = 0; r < R; ++r) {
                even[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * K + k), x, even[r]);
                odd[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * K + k + 8), y, odd[r]);
            }
        }
        for (; k < K8; k += 8) {
            const __m256 x = _mm256_loadu_ps(row + k);
            for (int r = 0; r < R; ++r) even[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * K + k), x, even[r]);
        }
        for (int r = 0; r < R; ++r)
            out[static_cast<size_t>(r) * out_stride + n] = sum8(_mm256_add_ps(even[r], odd[r])) + dot_tail(q + r * K, row, K8, K);
    }
}

// One head's scores: query rows four at a time (one pass over the cache slice each), then the rest.
void scores_any(int M, const float* q, int K, const float* c, int N, float* out) {
    int m = 0;
    for (; m + 4 <= M; m += 4) scores_rows<4>(q + static_cast<size_t>(m) * K, K, c, N, out + static_cast<size_t>(m) * N, N);
    const float* qm = q + static_cast<size_t>(m) * K;
    float* om = out + static_cast<size_t>(m) * N;
    switch (M - m) {
    case 3: scores_rows<3>(qm, K, c, N, om, N); break;
    case 2: scores_rows<2>(qm, K, c, N, om, N); break;
    case 1: scores_rows<1>(qm, K, c, N, om, N); break;
    default: break;
    }
}

// out[m][j] = sum_k w[m][k] v[k][j] for M rows of weights over the cache rows of v (J wide): each
// cache row is read whole, in order (one sequential stream), and added into the M output rows,
// which stay in L1 (M * J floats); k ascending from zero, one fused multiply-add per term.
MATMUL_TARGET void weighted_any(int M, const float* w, int K, const float* v, int J, float* out) {
    const int J8 = J - J % 8;
    for (int i = 0; i < M * J; ++i) out[i] = 0.f;
    for (int k = 0; k < K; ++k) {
        const float* row = v + static_cast<size_t>(k) * J;
        for (int m = 0; m < M; ++m) {
            const float wk = w[static_cast<size_t>(m) * K + k];
            const __m256 b = _mm256_set1_ps(wk);
            float* o = out + static_cast<size_t>(m) * J;
            for (int j = 0; j < J8; j += 8) _mm256_storeu_ps(o + j, _mm256_fmadd_ps(b, _mm256_loadu_ps(row + j), _mm256_loadu_ps(o + j)));
            for (int j = J8; j < J; ++j) o[j] = std::fma(wk, row[j], o[j]);
        }
    }
}

class DecodeMatMul : public ncnn::Layer {
public:
    DecodeMatMul() {
        one_blob_only = false;
        support_inplace = false;
    }

    // MatMul's one parameter (0 = transB); the same ParamDict builds the built-in, whose storage
    // flags this layer adopts so ncnn feeds both the same blobs (MatMul takes unpacked fp32).
    int load_param(const ncnn::ParamDict& pd) override {
        trans_b_ = pd.get(0, 0);
        builtin_.reset(ncnn::create_layer_cpu(ncnn::LayerType::MatMul));
        if (!builtin_) return -1;
        const int ret = builtin_->load_param(pd);
        if (ret != 0) return ret;
        adopt_builtin_flags(*this, *builtin_);
        return 0;
    }

    int load_model(const ncnn::ModelBin& mb) override { return builtin_->load_model(mb); }
    int create_pipeline(const ncnn::Option& opt) override { return builtin_->create_pipeline(opt); }
    int destroy_pipeline(const ncnn::Option& opt) override { return builtin_->destroy_pipeline(opt); }

    int forward(const std::vector<ncnn::Mat>& bottoms, std::vector<ncnn::Mat>& tops, const ncnn::Option& opt) const override {
        if (!kernel_applies(bottoms, opt)) return builtin_->forward(bottoms, tops, opt);
        const ncnn::Mat& A = bottoms[0];
        const ncnn::Mat& B = bottoms[1];
        const int heads = A.c, M = A.h, K = A.w;
        const int N = trans_b_ ? B.h : B.w;
        ncnn::Mat& top = tops[0];
        top.create(N, M, heads, 4u, opt.blob_allocator);
        if (top.empty()) return -100;
        const bool scores_case = trans_b_ != 0;
#pragma omp parallel for num_threads(opt.num_threads) schedule(static) if (opt.num_threads > 1)
        for (int p = 0; p < heads; ++p) {
            const float* a = A.channel(p);
            const float* b = B.channel(p);
            float* out = top.channel(p);
            if (scores_case) scores_any(M, a, K, b, N, out);
            else weighted_any(M, a, K, b, N, out);
        }
        g_matmul_calls.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }

private:
    // The decode-attention case: both operands 3-D with one head per channel (no broadcast),
    // unpacked fp32 rows, at most kMatmulMaxRows rows of A, and the inner sizes agreeing.
    bool kernel_applies(const std::vector<ncnn::Mat>& bottoms, const ncnn::Option& opt) const {
        if (opt.use_vulkan_compute || bottoms.size() != 2) return false;
        const ncnn::Mat& A = bottoms[0];
        const ncnn::Mat& B = bottoms[1];
        for (const ncnn::Mat* m : {&A, &B})
            if (m->dims != 3 || m->elempack != 1 || m->elemsize != 4 || m->empty()) return false;
        if (A.c != B.c || A.h < 1 || A.h > kMatmulMaxRows) return false;
        return trans_b_ ? B.w == A.w : B.h == A.w;
    }

    int trans_b_ = 0;
    std::unique_ptr<ncnn::Layer> builtin_;
};

#endif  // NCNNPORT_MATMUL_X86

}  // namespace

bool matmul_layer_supported() {
#if NCNNPORT_MATMUL_X86
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

bool register_matmul_layer(ncnn::Net& net) {
#if NCNNPORT_MATMUL_X86
    if (!matmul_layer_supported()) return false;
    return register_overwrite_of<DecodeMatMul>(net, "MatMul");
#else
    (void)net;
    return false;
#endif
}

uint64_t matmul_layer_calls() { return g_matmul_calls.load(std::memory_order_relaxed); }

}  // namespace ncnnport
