// The many-row decode products (MLA's absorbed attention: 32 query rows over one shared latent
// cache) in 8-lane AVX2 registers, for CPUs without AVX-512F, where they used to run ncnn's Gemm.
// matmul_layer.cpp dispatches to these; they are a file of their own because they share nothing
// with the 16-lane copy but the arithmetic per output.
//
// Why a second shape and not an 8-lane copy of the 16-lane kernels: with 16 registers a tile of
// that shape (query rows in the lanes, the cache broadcast) holds 2-3 outputs of 32 rows and
// re-reads the whole packed query block from L2 for each, which held it at ncnn's Gemm speed
// (runtime/cpp/README.md, "Tried on the AVX2-only EPYC and not kept"). Here the outputs are in the
// lanes and up to 6 query rows are broadcast (6 x 16 outputs, 12 accumulators), and the cold
// cache is read once per call in address order into a block that then stays in L1/L2 while every
// query row passes over it: the scores pack 16 cache rows at a time (transposed, so the lanes are
// 16 outputs), the weighted sums walk chunks of 64 cache rows whose next chunk is prefetched.
//
// Every output is one chain of fused multiply-adds over k ascending from zero, as in the 16-lane
// kernels, so both copies give the same bits, at any thread count and any split of the outputs.
// Defined on x86 only (AVX2 and FMA, checked by the caller: matmul_layer_supported()).
#pragma once

namespace ncnnport {

// out[m * N + n] = sum_k q[m * K + k] * c[n * K + k] for every m < M and n in [n0, n1): the
// scores of M query rows against cache rows n (each K floats).
void many_rows_scores_avx2(int M, const float* q, int K, const float* c, int n0, int n1, float* out, int N);

// out[m * J + j] = sum_k w[m * K + k] * v[k * J + j] for every m < M and j in [j0, j1): the
// weighted sums of M rows of K weights over K cache rows of J floats.
void many_rows_weighted_avx2(int M, const float* w, int K, const float* v, int J, int j0, int j1, float* out);

}  // namespace ncnnport
