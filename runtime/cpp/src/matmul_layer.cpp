#include "ncnnport/matmul_layer.h"

#include "ncnnport/builtin_overwrite.h"
#include "ncnnport/gemv_prefetch.h"
#include "ncnnport/matmul_many_rows_avx2.h"

#include <layer.h>
#include <layer_type.h>
#include <mat.h>
#include <paramdict.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
// GCC 12's AVX-512 headers build several intrinsics on _mm512_undefined_*(), which its
// -Wmaybe-uninitialized flags once inlined (GCC bug 105593): silenced for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define NCNNPORT_MATMUL_X86 1
#else
#define NCNNPORT_MATMUL_X86 0
#endif

namespace ncnnport {

namespace {

std::atomic<uint64_t> g_matmul_calls{0};
std::atomic<bool> g_avx2_only{false};  // matmul_layer_limit_to_avx2

#if NCNNPORT_MATMUL_X86
#define MATMUL_TARGET __attribute__((target("avx2,fma")))

// Sum of the 8 lanes of v.
MATMUL_TARGET inline float sum8(__m256 v) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h2 = _mm_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_hadd_ps(h2, h2));
}

// A cache element or 8 of them as floats: fp32 rows as they are, fp16 rows (kv_cache.h KvRows::Fp16,
// 2-byte bits) widened, which is exact, so a product over fp16 rows is the same arithmetic as over
// the same rows held in float32.
#define MATMUL_TARGET_F16 __attribute__((target("avx2,fma,f16c")))
MATMUL_TARGET_F16 inline float cache_value(const float* p) { return *p; }
MATMUL_TARGET_F16 inline float cache_value(const unsigned short* p) { return _cvtsh_ss(*p); }
MATMUL_TARGET_F16 inline __m256 cache_load8(const float* p) { return _mm256_loadu_ps(p); }
MATMUL_TARGET_F16 inline __m256 cache_load8(const unsigned short* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The scalar rest of a dot product of q with a cache row: k in [k0, K), the K % 8 the lanes left.
template <typename T>
MATMUL_TARGET_F16 inline float dot_tail(const float* q, const T* row, int k0, int K) {
    float s = 0.f;
    for (int k = k0; k < K; ++k) s = std::fma(q[k], cache_value(row + k), s);
    return s;
}

// Prefetches the `bytes` of the cache row at `row` ahead in the stream (the
// rows follow each other, so that is a later row of the same head, or past its end: a prefetch
// never faults). Whether the kernels prefetch, and how far (`fetch`: 0 not, kFetchFar the
// kernels' distances, kFetchNear half of them), is chosen on the machine (attention_prefetch_choice,
// attention_prefetch_distance_choice). The kernels take it as a template argument, one copy each.
constexpr int kFetchFar = 1, kFetchNear = 2;
inline void prefetch_row(const void* row, size_t bytes, int fetch) {
    const PrefetchDistance d = fetch == kFetchNear ? kNearPrefetch : kFarPrefetch;
    prefetch_stream_step(row, (bytes + 63) / 64 * 64, d.far, d.near);
}

// out[r][n] = sum_k q[r][k] c[n][k] for R (1-4) query rows against every cache row of c (rows K
// apart), for H heads at once (qs[h], cs[h], outs[h]): row n of each head in turn. Each cache row
// is read whole before the next, so each head's cache slice is one sequential stream; the query
// rows stay in L1. Per query row two 8-lane partial sums (even and odd 8-blocks
// of k), added and their lanes summed at the end of the cache row. Why row by row: the first
// version read four cache rows side by side, k by k, and ran at ~7 GB/s on one EPYC thread over a
// cold 4 MB slice; this order reads it at ~14 GB/s, 2.0-2.4x faster (runtime/cpp/README.md,
// "Decode attention"). Why H heads side by side: one stream at a time kept too few reads in flight
// from memory. On the 2-core Xeon (8 KV heads x 2 rows x 128, fp16 rows, P = 1000, cold, one
// thread: ncnnport-matmul-check --heads 8 --m 2 --k 128 --n 1000 --trans-b 1 --fp16-cache --cold
// --rounds 81) the product took 0.32-0.33 ms one head at a time, 0.25-0.26 two, 0.205-0.209 four
// and 0.207 eight. Each output is the same chain, so the bits do not change.
template <int R, int H, int Prefetch, typename T>
MATMUL_TARGET_F16 void scores_rows_of(const float* const* qs, int K, const T* const* cs, int N, float* const* outs, int out_stride) {
    const int K16 = K - K % 16, K8 = K - K % 8;
    for (int n = 0; n < N; ++n) {
        for (int h = 0; h < H; ++h) {
            const float* q = qs[h];
            float* out = outs[h];
            const T* row = cs[h] + static_cast<size_t>(n) * K;
            if (Prefetch) prefetch_row(row, static_cast<size_t>(K) * sizeof(T), Prefetch);
            __m256 even[R], odd[R];
            for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
            int k = 0;
            for (; k < K16; k += 16) {
                const __m256 x = cache_load8(row + k), y = cache_load8(row + k + 8);
                for (int r = 0; r < R; ++r) {
                    even[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * K + k), x, even[r]);
                    odd[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * K + k + 8), y, odd[r]);
                }
            }
            for (; k < K8; k += 8) {
                const __m256 x = cache_load8(row + k);
                for (int r = 0; r < R; ++r) even[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * K + k), x, even[r]);
            }
            for (int r = 0; r < R; ++r)
                out[static_cast<size_t>(r) * out_stride + n] = sum8(_mm256_add_ps(even[r], odd[r])) + dot_tail(q + r * K, row, K8, K);
        }
    }
}

template <int R, int Prefetch, typename T>
void scores_rows(const float* q, int K, const T* c, int N, float* out, int out_stride) {
    scores_rows_of<R, 1, Prefetch>(&q, K, &c, N, &out, out_stride);
}

// The scores of H heads of at most 4 query rows each (one pass over their slices, side by side).
template <int H, int Prefetch, typename T>
void scores_heads(int M, const float* const* qs, int K, const T* const* cs, int N, float* const* outs) {
    switch (M) {
    case 4: scores_rows_of<4, H, Prefetch>(qs, K, cs, N, outs, N); break;
    case 3: scores_rows_of<3, H, Prefetch>(qs, K, cs, N, outs, N); break;
    case 2: scores_rows_of<2, H, Prefetch>(qs, K, cs, N, outs, N); break;
    default: scores_rows_of<1, H, Prefetch>(qs, K, cs, N, outs, N); break;
    }
}

// One head's scores: query rows four at a time (one pass over the cache slice each), then the rest.
template <int Prefetch, typename T>
void scores_any(int M, const float* q, int K, const T* c, int N, float* out) {
    int m = 0;
    for (; m + 4 <= M; m += 4) scores_rows<4, Prefetch>(q + static_cast<size_t>(m) * K, K, c, N, out + static_cast<size_t>(m) * N, N);
    const float* qm = q + static_cast<size_t>(m) * K;
    float* om = out + static_cast<size_t>(m) * N;
    switch (M - m) {
    case 3: scores_rows<3, Prefetch>(qm, K, c, N, om, N); break;
    case 2: scores_rows<2, Prefetch>(qm, K, c, N, om, N); break;
    case 1: scores_rows<1, Prefetch>(qm, K, c, N, om, N); break;
    default: break;
    }
}

// Weight rows [0, MR) over output columns [j0, j0 + 8 NV) in 8-lane registers: MR x NV sums stay
// in registers while every cache row passes once (prefetched, when asked, on the first column tile:
// the row whole). Each output is one fused chain over k ascending from zero, as before.
// Why tiles: the sums used to be loaded and stored for every cache row, which bound this copy by
// its instructions; on an AVX2-only EPYC (8 KV heads x 128, P = 1000, fp16 rows, one thread,
// ncnnport-matmul-check --cold) the weighted sums read 2 MB in 0.46 ms against 0.25 for the scores.
template <int MR, int NV, typename T>
MATMUL_TARGET_F16 void weighted_tile(const float* w, int K, int k0, int k1, const T* v, int J, int j0, int prefetch,
                                     float* out) {
    __m256 acc[MR][NV];
    for (int r = 0; r < MR; ++r)
        for (int t = 0; t < NV; ++t)
            acc[r][t] = k0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out + static_cast<size_t>(r) * J + j0 + 8 * t);
    for (int k = k0; k < k1; ++k) {
        const T* row = v + static_cast<size_t>(k) * J;
        if (prefetch) prefetch_row(row, static_cast<size_t>(J) * sizeof(T), prefetch);
        __m256 x[NV];
        for (int t = 0; t < NV; ++t) x[t] = cache_load8(row + j0 + 8 * t);
        for (int r = 0; r < MR; ++r) {
            const __m256 b = _mm256_set1_ps(w[static_cast<size_t>(r) * K + k]);
            for (int t = 0; t < NV; ++t) acc[r][t] = _mm256_fmadd_ps(b, x[t], acc[r][t]);
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int t = 0; t < NV; ++t) _mm256_storeu_ps(out + static_cast<size_t>(r) * J + j0 + 8 * t, acc[r][t]);
}

// Rows [0, MR) of a weighted sum over its first J8 columns, in tiles of up to 32 (MR = 2: 8 sums
// and 4 cache vectors in the 16 registers), chunk by chunk of kWeightedChunkRowsAvx2 cache rows:
// every tile of a chunk runs before the next chunk (the sums wait in `out`, so each chain goes
// on unchanged), so the slice is read from memory once, in order, and the tiles' other passes
// find the chunk in L1.
constexpr int kWeightedChunkRowsAvx2 = 16;
template <int MR, int Prefetch, typename T>
void weighted_cols(const float* w, int K, const T* v, int J, int J8, float* out) {
    for (int k0 = 0; k0 < K; k0 += kWeightedChunkRowsAvx2) {
        const int k1 = std::min(K, k0 + kWeightedChunkRowsAvx2);
        for (int j0 = 0; j0 < J8; j0 += 32) {
            const int prefetch = j0 == 0 ? Prefetch : 0;
            switch (std::min(4, (J8 - j0) / 8)) {
            case 4: weighted_tile<MR, 4>(w, K, k0, k1, v, J, j0, prefetch, out); break;
            case 3: weighted_tile<MR, 3>(w, K, k0, k1, v, J, j0, prefetch, out); break;
            case 2: weighted_tile<MR, 2>(w, K, k0, k1, v, J, j0, prefetch, out); break;
            default: weighted_tile<MR, 1>(w, K, k0, k1, v, J, j0, prefetch, out); break;
            }
        }
    }
}

// out[m][j] = sum_k w[m][k] v[k][j] for M rows of weights over the cache rows of v (J wide): rows
// two at a time in register tiles of 32 columns (weighted_cols: one pass over the cache slice per
// tile, the rows in order), the last J % 8 columns one chain each; k ascending from zero, one
// fused multiply-add per term.
template <int Prefetch, typename T>
MATMUL_TARGET_F16 void weighted_any(int M, const float* w, int K, const T* v, int J, float* out) {
    const int J8 = J - J % 8;
    int m = 0;
    for (; m + 2 <= M; m += 2) weighted_cols<2, Prefetch>(w + static_cast<size_t>(m) * K, K, v, J, J8, out + static_cast<size_t>(m) * J);
    if (m < M) weighted_cols<1, Prefetch>(w + static_cast<size_t>(m) * K, K, v, J, J8, out + static_cast<size_t>(m) * J);
    for (m = 0; m < M; ++m) {
        for (int j = J8; j < J; ++j) {
            float o = 0.f;
            for (int k = 0; k < K; ++k) o = std::fma(w[static_cast<size_t>(m) * K + k], cache_value(v + static_cast<size_t>(k) * J + j), o);
            out[static_cast<size_t>(m) * J + j] = o;
        }
    }
}

// --- The weighted sums' AVX-512 copy (16 lanes, 32 registers), run where the CPU has AVX-512F
// unless limited to the copy above (matmul_layer_limit_to_avx2). Each output is the same fused
// chain over k ascending from zero, so the same bits, but the outputs stay in registers across
// the cache rows instead of being loaded and stored for every cache row, which bound the AVX2 copy
// by its instructions: on the 2-core Xeon (8 KV heads x 128, P = 1000, fp16 rows, one thread) it
// read a hot 2 MB slice in 0.130 ms and this copy in 0.075; from DRAM 0.25-0.30 ms against
// 0.19-0.22 (ncnnport-matmul-check --rounds 60 [--cold]). The scores keep their AVX2 copy: a
// 16-lane copy with the same sums (rows four at a time, their horizontal adds shared) read the
// same slice in 0.096-0.108 ms hot against 0.111 and no faster from DRAM.
#define MATMUL_TARGET_512F16 __attribute__((target("avx512f,avx2,fma,f16c")))
MATMUL_TARGET_512F16 inline __m512 cache_load16(const float* p) { return _mm512_loadu_ps(p); }
MATMUL_TARGET_512F16 inline __m512 cache_load16(const unsigned short* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Weight rows [0, MR) over output columns [j0, j0 + 16 NV): MR x NV sums in registers while every
// cache row passes once (prefetched, when asked, on the first column tile: the row whole).
template <int MR, int NV, typename T>
MATMUL_TARGET_512F16 void weighted_tile512(const float* w, int K, const T* v, int J, int j0, int prefetch, float* out) {
    __m512 acc[MR][NV];
    for (int r = 0; r < MR; ++r)
        for (int t = 0; t < NV; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int k = 0; k < K; ++k) {
        const T* row = v + static_cast<size_t>(k) * J;
        if (prefetch) prefetch_row(row, static_cast<size_t>(J) * sizeof(T), prefetch);
        __m512 x[NV];
        for (int t = 0; t < NV; ++t) x[t] = cache_load16(row + j0 + 16 * t);
        for (int r = 0; r < MR; ++r) {
            const __m512 b = _mm512_set1_ps(w[static_cast<size_t>(r) * K + k]);
            for (int t = 0; t < NV; ++t) acc[r][t] = _mm512_fmadd_ps(b, x[t], acc[r][t]);
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int t = 0; t < NV; ++t) _mm512_storeu_ps(out + static_cast<size_t>(r) * J + j0 + 16 * t, acc[r][t]);
}

// Rows [0, MR) of a weighted sum over its first J16 columns, in tiles of up to 128 (MR = 2: 16
// sums and 8 cache vectors in registers).
template <int MR, int Prefetch, typename T>
void weighted_cols512(const float* w, int K, const T* v, int J, int J16, float* out) {
    for (int j0 = 0; j0 < J16; j0 += 128) {
        const int prefetch = j0 == 0 ? Prefetch : 0;
        switch (std::min(8, (J16 - j0) / 16)) {
        case 8: weighted_tile512<MR, 8>(w, K, v, J, j0, prefetch, out); break;
        case 7: weighted_tile512<MR, 7>(w, K, v, J, j0, prefetch, out); break;
        case 6: weighted_tile512<MR, 6>(w, K, v, J, j0, prefetch, out); break;
        case 5: weighted_tile512<MR, 5>(w, K, v, J, j0, prefetch, out); break;
        case 4: weighted_tile512<MR, 4>(w, K, v, J, j0, prefetch, out); break;
        case 3: weighted_tile512<MR, 3>(w, K, v, J, j0, prefetch, out); break;
        case 2: weighted_tile512<MR, 2>(w, K, v, J, j0, prefetch, out); break;
        default: weighted_tile512<MR, 1>(w, K, v, J, j0, prefetch, out); break;
        }
    }
}

// weighted_any with the sums in registers: weight rows two at a time, then the last J % 16
// columns as scalar chains (each output the same k-ascending chain of fused multiply-adds).
template <int Prefetch, typename T>
void weighted_any512(int M, const float* w, int K, const T* v, int J, float* out) {
    const int J16 = J - J % 16;
    int m = 0;
    for (; m + 2 <= M; m += 2)
        weighted_cols512<2, Prefetch>(w + static_cast<size_t>(m) * K, K, v, J, J16, out + static_cast<size_t>(m) * J);
    if (m < M) weighted_cols512<1, Prefetch>(w + static_cast<size_t>(m) * K, K, v, J, J16, out + static_cast<size_t>(m) * J);
    for (m = 0; m < M; ++m)
        for (int j = J16; j < J; ++j) {
            float o = 0.f;
            for (int k = 0; k < K; ++k) o = std::fma(w[static_cast<size_t>(m) * K + k], cache_value(v + static_cast<size_t>(k) * J + j), o);
            out[static_cast<size_t>(m) * J + j] = o;
        }
}

// --- Many query rows (kStreamMaxRows < M <= kMatmulMaxRows): MLA's absorbed decode, where every
// query head (32 on Youtu-VL) reads the one shared latent cache. There the product is
// compute-bound (2 M flops per cache float), so the stream kernels above, which hold a few rows
// and re-read the cache once per 4 of them, are not the shape; ncnn's Gemm packs the whole cache
// on every call. These kernels hold every query row of a tile in registers, so each cache row is
// read from memory once per call and meets all M rows there. These are the 16-lane copy (AVX-512F,
// 32 registers); AVX2-only CPUs run matmul_many_rows_avx2.cpp's 8-lane one (another tile shape,
// the same bits).
#define MATMUL_TARGET_512 __attribute__((target("avx512f,avx2,fma")))

// A weighted sum's k chunk: 64 cache rows (128 KB at Youtu-VL's 512-wide latent, in L2). And how
// far ahead (in cache rows) its tiles prefetch the row they read a few floats of next into L1.
// Both chosen on the 2-core Xeon over kc 32-256 and 4-16 rows (ncnnport-matmul-check --heads 1
// --m 32 --k 1000 --n 512 --trans-b 0 --rounds 61 [--cold], 3 runs each): 64 / 8 read the cold
// P=1000 product in 0.383-0.387 ms, 256 / none (the kernel before) in 0.51-0.54.
constexpr int kWeightedChunkRows = 64;
constexpr int kWeightedRowAhead = 8;

// Both products as one transposed kernel: out[m][n] = sum_k q[m][k] c(n, k), where c(n, k) is
// c[n * cn + k * ck]: the cache rows for the scores (cn = K, ck = 1), the cache columns for the
// weighted sums (cn = 1, ck = J). acc[t][v] holds out[16 v + lane][n + t]: the M query (or
// weight) rows, packed k-major (qt[k][16 V]), are the vector operand, and each element of c is
// broadcast once per tile. V vectors of rows (V = ceil(M / 16)) by T outputs: V * T
// accumulators, V + T loads per V * T multiply-adds, no horizontal sums. Each output is one fused
// chain over k ascending from zero, so the weighted sums are exactly weighted_any's chain.
//
// One k of a tile: V query vectors against T broadcast elements of c (c_k = c(0, k)).
template <int V, int T>
MATMUL_TARGET_512 inline void many_rows_step(__m512 (&acc)[T][V], const float* qt_k, const float* c_k, size_t cn) {
    __m512 q[V];
    for (int v = 0; v < V; ++v) q[v] = _mm512_loadu_ps(qt_k + 16 * v);
    for (int t = 0; t < T; ++t) {
        const __m512 x = _mm512_set1_ps(c_k[t * cn]);
        for (int v = 0; v < V; ++v) acc[t][v] = _mm512_fmadd_ps(x, q[v], acc[t][v]);
    }
}

// A tile over k in [k0, k1) into `part` (from zero when `first`, else on from the partial sums
// there). Its prefetches keep the next reads in flight while it computes, since a decode step
// finds the cache cold (the weights streamed since evicted it):
// - `Rows` (the scores: cache rows, cn = K, ck = 1): the next tile's rows, `next`, one line of
//   each per 16 k, a tile's compute ahead. The hardware prefetchers follow T interleaved rows
//   poorly; this took the cold P=1000 latent scores from 0.42-0.45 to 0.32-0.33 ms (warm 0.24-0.25
//   either way; same command as kWeightedChunkRows with --k 512 --n 1000 --trans-b 1).
// - else (the weighted sums: cache columns, cn = 1, ck = J): the row kWeightedRowAhead ahead of
//   the one read (a new line each k, at the cache's row stride, which they do not follow) into
//   L1, and the first `pf_lines` lines at `pf` of the next chunk into L2, one per k (spread over
//   the chunk's tiles in address order: one sequential read, smoothly overlapped).
template <int V, int T, bool Rows>
MATMUL_TARGET_512 void many_rows_tile(const float* qt, int k0, int k1, const float* c, size_t cn, size_t ck, float* part, bool first,
                                      const float* next, const char* pf, int pf_lines) {
    __m512 acc[T][V];
    for (int t = 0; t < T; ++t)
        for (int v = 0; v < V; ++v) acc[t][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(part + (t * V + v) * 16);
    if (Rows) {
        for (int kb = k0; kb < k1; kb += 16) {
            for (int t = 0; t < T; ++t) _mm_prefetch(reinterpret_cast<const char*>(next + t * cn + kb), _MM_HINT_T1);
            const int ke = std::min(k1, kb + 16);
            for (int k = kb; k < ke; ++k) many_rows_step<V, T>(acc, qt + static_cast<size_t>(k) * 16 * V, c + k, cn);
        }
    } else {
        int k = k0;
        for (const int kp = std::min(k1, k0 + pf_lines); k < kp; ++k) {
            _mm_prefetch(reinterpret_cast<const char*>(c + static_cast<size_t>(k + kWeightedRowAhead) * ck), _MM_HINT_T0);
            _mm_prefetch(pf + 64 * (k - k0), _MM_HINT_T1);
            many_rows_step<V, T>(acc, qt + static_cast<size_t>(k) * 16 * V, c + static_cast<size_t>(k) * ck, cn);
        }
        for (; k < k1; ++k) {
            _mm_prefetch(reinterpret_cast<const char*>(c + static_cast<size_t>(k + kWeightedRowAhead) * ck), _MM_HINT_T0);
            many_rows_step<V, T>(acc, qt + static_cast<size_t>(k) * 16 * V, c + static_cast<size_t>(k) * ck, cn);
        }
    }
    for (int t = 0; t < T; ++t)
        for (int v = 0; v < V; ++v) _mm512_store_ps(part + (t * V + v) * 16, acc[t][v]);
}

// Outputs [n0, n1) of every row. k runs in chunks of kc. One chunk (every scores call): each tile
// goes straight into the M output rows. Several (a weighted sum over more than kc cache rows):
// the partial sums live transposed in `part` (16 V floats per output) between chunks, and within
// a chunk every tile takes the chunk's k, so the cache rows (cn = 1, ck = J: each tile reads a
// few floats per row) are read in one pass per chunk, whose rows the later tiles find in L2.
// Storing and reloading a partial sum is exact, so each output stays one chain over k ascending.
template <int V, int T>
void many_rows_range(const float* qt, int M, int K, int kc, const float* c, size_t cn, size_t ck, int n0, int n1,
                     float* part, float* out, int N) {
    // A weighted sum's chunk is rows [k0, k1) of c, one contiguous block. The tiles walk it down
    // its rows (a stride the hardware prefetchers do not follow from memory), so the block is
    // prefetched into L2 in address order: the first before the first tile, each next one spread
    // over the tiles of the one before (one sequential read, overlapped).
    const bool by_columns = cn == 1 && ck > 1;
    auto block = [&](int k0) { return std::make_pair(reinterpret_cast<const char*>(c + static_cast<size_t>(k0) * ck),
                                                     static_cast<size_t>(std::min(K, k0 + kc) - k0) * ck * sizeof(float)); };
    if (by_columns) {
        const auto [p, bytes] = block(0);
        for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
    }
    if (K <= kc) {
        alignas(64) float tile[T * 16 * V];
        auto put = [&](int n, int cols) {
            for (int m = 0; m < M; ++m)
                for (int t = 0; t < cols; ++t) out[static_cast<size_t>(m) * N + n + t] = tile[t * 16 * V + m];
        };
        // a scores tile prefetches the next tile's rows (the last one its own); a weighted sum of
        // one chunk (K <= kc) has its block prefetched above
        int n = n0;
        for (; n + T <= n1; n += T) {
            if (by_columns) many_rows_tile<V, T, false>(qt, 0, K, c + n * cn, cn, ck, tile, true, nullptr, nullptr, 0);
            else many_rows_tile<V, T, true>(qt, 0, K, c + n * cn, cn, ck, tile, true, c + std::min(n + T, n1 - T) * cn, nullptr, 0);
            put(n, T);
        }
        for (; n < n1; ++n) {
            if (by_columns) many_rows_tile<V, 1, false>(qt, 0, K, c + n * cn, cn, ck, tile, true, nullptr, nullptr, 0);
            else many_rows_tile<V, 1, true>(qt, 0, K, c + n * cn, cn, ck, tile, true, c + std::min(n + 1, n1 - 1) * cn, nullptr, 0);
            put(n, 1);
        }
        return;
    }
    const int tiles = (n1 - n0) / T + (n1 - n0) % T;
    for (int k0 = 0; k0 < K; k0 += kc) {
        const int k1 = std::min(K, k0 + kc);
        const auto [next, next_bytes] = by_columns && k1 < K ? block(k1) : std::make_pair(static_cast<const char*>(nullptr), size_t{0});
        const size_t per_tile = (next_bytes / 64 + tiles) / std::max(1, tiles) * 64;
        size_t ahead = 0;
        auto lines = [&]() {   // the next block's lines this tile prefetches, one per k while they last
            const size_t end = std::min(next_bytes, ahead + per_tile);
            const int count = static_cast<int>((end - ahead) / 64);
            const size_t at = ahead;
            ahead = end;
            return std::make_pair(next + at, count);
        };
        int n = n0;
        for (; n + T <= n1; n += T) {
            const auto [pf, count] = lines();
            many_rows_tile<V, T, false>(qt, k0, k1, c + n * cn, cn, ck, part + (n - n0) * 16 * V, k0 == 0, nullptr, pf, count);
        }
        for (; n < n1; ++n) {
            const auto [pf, count] = lines();
            many_rows_tile<V, 1, false>(qt, k0, k1, c + n * cn, cn, ck, part + (n - n0) * 16 * V, k0 == 0, nullptr, pf, count);
        }
    }
    for (int m = 0; m < M; ++m)
        for (int n = n0; n < n1; ++n) out[static_cast<size_t>(m) * N + n] = part[(n - n0) * 16 * V + m];
}

// Outputs [n0, n1) of one head's product with M rows of q (M x K): q packed k-major and
// zero-padded to 16 V lanes (64 KB for Youtu-VL's 32 x 512 queries, an L2-resident operand), then
// the widest tile whose V * T accumulators fit the registers.
void many_rows(int M, const float* q, int K, const float* c, size_t cn, size_t ck, int n0, int n1, float* out, int N) {
    const int V = (M + 15) / 16;
    // kc: the scores read whole cache rows (one chunk); a weighted sum's chunk is
    // kWeightedChunkRows cache rows, inside L2 on the machines measured (1-2 MB per core)
    const int kc = ck == 1 ? K : kWeightedChunkRows;
    // per-thread buffers kept across calls: a fresh block of this size (344 KB at 2685 cache rows)
    // would come from mmap past glibc's threshold and be faulted in page by page on every call
    thread_local std::vector<float> qt_buffer, part_buffer;
    qt_buffer.resize(static_cast<size_t>(K) * 16 * V);
    float* qt = qt_buffer.data();
    for (int k = 0; k < K; ++k) {
        float* row = qt + static_cast<size_t>(k) * 16 * V;
        for (int m = 0; m < M; ++m) row[m] = q[static_cast<size_t>(m) * K + k];
        for (int m = M; m < 16 * V; ++m) row[m] = 0.f;  // padding lanes: their outputs are never written
    }
    float* part = nullptr;
    if (K > kc) {
        part_buffer.resize(static_cast<size_t>(n1 - n0) * 16 * V + 16);
        part = part_buffer.data() + (16 - reinterpret_cast<uintptr_t>(part_buffer.data()) / sizeof(float) % 16) % 16;  // 64-byte aligned
    }
    switch (V) {
    case 1: many_rows_range<1, 16>(qt, M, K, kc, c, cn, ck, n0, n1, part, out, N); break;
    case 2: many_rows_range<2, 8>(qt, M, K, kc, c, cn, ck, n0, n1, part, out, N); break;
    case 3: many_rows_range<3, 6>(qt, M, K, kc, c, cn, ck, n0, n1, part, out, N); break;
    default: many_rows_range<4, 4>(qt, M, K, kc, c, cn, ck, n0, n1, part, out, N); break;
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
        if (!kernel_applies(bottoms, opt)) {
            // fp16 cache rows (kv_cache.h) outside the stream kernels' case: the built-in reads
            // floats, so it gets B widened (exact: the same numbers)
            if (bottoms.size() == 2 && is_fp16_cache(bottoms[1])) {
                std::vector<ncnn::Mat> widened = bottoms;
                ncnn::cast_float16_to_float32(bottoms[1], widened[1], opt);
                if (widened[1].empty()) return -100;
                return builtin_->forward(widened, tops, opt);
            }
            return builtin_->forward(bottoms, tops, opt);
        }
        const ncnn::Mat& A = bottoms[0];
        const ncnn::Mat& B = bottoms[1];
        const int heads = A.c, M = A.h, K = A.w;
        const int N = trans_b_ ? B.h : B.w;
        ncnn::Mat& top = tops[0];
        top.create(N, M, heads, 4u, opt.blob_allocator);
        if (top.empty()) return -100;
        const bool scores_case = trans_b_ != 0;
        if (M <= kStreamMaxRows) {
            const size_t bytes = static_cast<size_t>(heads) * N * K * B.elemsize;  // the cache rows read
            const PrefetchPlan plan(attention_prefetch_choice(scores_case), attention_prefetch_distance_choice(scores_case),
                                    bytes);
            const auto t0 = std::chrono::steady_clock::now();
            if (!plan.prefetch()) stream_heads<0>(A, B, top, scores_case, opt.num_threads);
            else if (plan.far()) stream_heads<kFetchFar>(A, B, top, scores_case, opt.num_threads);
            else stream_heads<kFetchNear>(A, B, top, scores_case, opt.num_threads);
            plan.record(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        } else {
            // each head split into parts along its outputs' columns (cache rows for the scores,
            // value columns for the weighted sums), so one head (MLA) still spreads over the
            // threads; every output is one tile's, in one order, at any thread count
            const int parts = std::max(1, std::min(opt.num_threads, N));
            const bool wide = matmul_stream_avx512();
#pragma omp parallel for collapse(2) num_threads(opt.num_threads) schedule(static) if (opt.num_threads > 1)
            for (int p = 0; p < heads; ++p)
                for (int part = 0; part < parts; ++part) {
                    const int n0 = static_cast<int>(static_cast<int64_t>(N) * part / parts);
                    const int n1 = static_cast<int>(static_cast<int64_t>(N) * (part + 1) / parts);
                    if (!wide) {  // the 8-lane copy (matmul_many_rows_avx2.h): the same bits
                        if (scores_case) many_rows_scores_avx2(M, A.channel(p), K, B.channel(p), n0, n1, top.channel(p), N);
                        else many_rows_weighted_avx2(M, A.channel(p), K, B.channel(p), N, n0, n1, top.channel(p));
                        continue;
                    }
                    const size_t cn = scores_case ? static_cast<size_t>(K) : 1, ck = scores_case ? 1 : static_cast<size_t>(N);
                    many_rows(M, A.channel(p), K, B.channel(p), cn, ck, n0, n1, top.channel(p), N);
                }
        }
        g_matmul_calls.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }

private:
    // The few-row products: each head's cache slice is one sequential stream; the scores of up to
    // 4 query rows read a group of heads' streams side by side per task (scores_rows_of), the
    // rest one head per task.
    template <int Prefetch>
    static void stream_heads(const ncnn::Mat& A, const ncnn::Mat& B, ncnn::Mat& top, bool scores_case, int threads) {
        const int heads = A.c, M = A.h, K = A.w;
        const int N = top.w;
        const bool fp16 = B.elemsize == 2, wide = matmul_stream_avx512();
        if (scores_case && M <= 4) {
            // heads side by side (scores_rows_of), in groups of 4, 2 or 1: as many as still give
            // every thread a group
            const int group = heads % 4 == 0 && heads / 4 >= threads ? 4 : heads % 2 == 0 && heads / 2 >= threads ? 2 : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
            for (int p = 0; p < heads; p += group) {
                const float* qs[4];
                float* outs[4];
                const unsigned short* halves[4];
                const float* floats[4];
                for (int h = 0; h < group; ++h) {
                    qs[h] = A.channel(p + h);
                    outs[h] = top.channel(p + h);
                    halves[h] = static_cast<const unsigned short*>(B.channel(p + h).data);
                    floats[h] = B.channel(p + h);
                }
                if (fp16) scores_group<Prefetch>(group, M, qs, K, halves, N, outs);
                else scores_group<Prefetch>(group, M, qs, K, floats, N, outs);
            }
            return;
        }
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (int p = 0; p < heads; ++p) {
            const float* a = A.channel(p);
            float* out = top.channel(p);
            if (fp16) one_head<Prefetch>(wide, scores_case, M, a, K, static_cast<const unsigned short*>(B.channel(p).data), N, out);
            else one_head<Prefetch>(wide, scores_case, M, a, K, static_cast<const float*>(B.channel(p)), N, out);
        }
    }

    template <int Prefetch, typename T>
    static void scores_group(int group, int M, const float* const* qs, int K, const T* const* cs, int N, float* const* outs) {
        if (group == 4) scores_heads<4, Prefetch>(M, qs, K, cs, N, outs);
        else if (group == 2) scores_heads<2, Prefetch>(M, qs, K, cs, N, outs);
        else scores_heads<1, Prefetch>(M, qs, K, cs, N, outs);
    }

    // One head's product by the stream kernels: the weighted sums in the register width chosen
    // (the same bits either way).
    template <int Prefetch, typename T>
    static void one_head(bool wide, bool scores_case, int M, const float* a, int K, const T* b, int N, float* out) {
        if (scores_case) {
            scores_any<Prefetch>(M, a, K, b, N, out);
        } else {
            if (wide) weighted_any512<Prefetch>(M, a, K, b, N, out);
            else weighted_any<Prefetch>(M, a, K, b, N, out);
        }
    }

    // A 3-D operand of 2-byte elements, one per pack: the fp16 rows of a K/V cache.
    static bool is_fp16_cache(const ncnn::Mat& m) { return m.dims == 3 && m.elempack == 1 && m.elemsize == 2 && !m.empty(); }

    // The decode-attention case: both operands 3-D with one head per channel (no broadcast),
    // unpacked fp32 rows (B may be fp16 cache rows up to kStreamMaxRows rows of A, where the CPU
    // has F16C), at most kMatmulMaxRows rows of A, and the inner sizes agreeing.
    bool kernel_applies(const std::vector<ncnn::Mat>& bottoms, const ncnn::Option& opt) const {
        if (opt.use_vulkan_compute || bottoms.size() != 2) return false;
        const ncnn::Mat& A = bottoms[0];
        const ncnn::Mat& B = bottoms[1];
        const bool fp16_b = is_fp16_cache(B);
        if (fp16_b && (!matmul_fp16_cache_supported() || A.h > kStreamMaxRows)) return false;
        for (const ncnn::Mat* m : {&A, &B})
            if (m->dims != 3 || m->elempack != 1 || (m->elemsize != 4 && !(m == &B && fp16_b)) || m->empty()) return false;
        if (A.c != B.c || A.h < 1 || A.h > kMatmulMaxRows) return false;
        if (A.h > kStreamMaxRows && !matmul_many_rows_supported()) return false;
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

bool matmul_many_rows_supported() {
#if NCNNPORT_MATMUL_X86
    return matmul_layer_supported();  // AVX-512F: the 16-lane copy; else the 8-lane one
#else
    return false;
#endif
}

bool matmul_stream_avx512() {
#if NCNNPORT_MATMUL_X86
    static const bool avx512f = matmul_layer_supported() && __builtin_cpu_supports("avx512f");
    return avx512f && !g_avx2_only.load(std::memory_order_relaxed);
#else
    return false;
#endif
}

void matmul_layer_limit_to_avx2(bool limit) { g_avx2_only.store(limit, std::memory_order_relaxed); }

const char* matmul_layer_label(bool registered) {
    if (!registered) return "ncnn";
    return matmul_stream_avx512() ? "ncnnport-avx512" : "ncnnport-avx2";
}

bool matmul_fp16_cache_supported() {
#if NCNNPORT_MATMUL_X86
    static const bool yes = matmul_layer_supported() && __builtin_cpu_supports("f16c");
    return yes;
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
