// A stand-in for ncnn's built-in MatMul that computes decode attention (a few query rows against
// the whole K/V cache, per head) directly, and hands every other case to the built-in layer.
//
// Why: a decode step's attention is two batched products per layer, scores = q K^T ([M x d] by
// [P x d]^T per KV head, M query heads sharing it) and out = softmax(scores) V ([M x P] by
// [P x d]), with M = 1-4 (grouped KV heads) or 32 (MLA's absorbed form: one latent shared by 32
// query heads). ncnn 1.0.20261020's MatMul runs each head through its Gemm with a
// non-constant B, which packs (copies and transposes) the whole cache slice on every call: on
// Qwen3-ASR's real widths at P = 1000 the two MatMuls took ~1.4 ms per layer on one EPYC thread
// while the 8.4 MB of K/V they read takes ~0.3 ms at the measured read bandwidth. This layer reads
// each cache row once, in place. Its sums are in another order than ncnn's Gemm, which itself has
// no one order (it matched a k-ascending fused chain bit for bit at some sizes only), so the
// contract is the fp32 summation-order bound: ncnnport-matmul-check holds every output within
// 2 gamma(K+1) sum |a_k b_k| of the built-in's. Registered per CPU Net (register_custom_layer with
// the built-in type name) before load_param, where the CPU has AVX2 and FMA.
#pragma once

#include <net.h>  // ncnn

#include <cstdint>

namespace ncnnport {

// True on an x86 build running on a CPU with AVX2 and FMA; false elsewhere (never registered).
bool matmul_layer_supported();

// True where the stream kernels read fp16 cache rows (kv_cache.h KvRows::Fp16) in place:
// matmul_layer_supported() and F16C. Elsewhere the overwrite widens such an operand for ncnn's
// built-in, so a cache is stored in 2 bytes only where this holds.
bool matmul_fp16_cache_supported();

// True where the many-row kernels run (M > kStreamMaxRows): matmul_layer_supported(); their
// 16-lane copy with AVX-512F, else the 8-lane one (matmul_many_rows_avx2.h).
bool matmul_many_rows_supported();

// True where the few-row weighted sums and the many-row kernels run their 16-lane copies:
// AVX-512F, unless limited by matmul_layer_limit_to_avx2. Both copies give the same bits.
bool matmul_stream_avx512();

// Limits the few-row weighted sums and the many-row kernels to their 8-lane AVX2 copies on an
// AVX-512 CPU (ncnnport-matmul-check --avx2, so the tests hold both copies' bits equal on one
// machine); false lifts the limit.
void matmul_layer_limit_to_avx2(bool limit);

// What a run reports for its MatMul: "ncnn" when the overwrite is not registered, else
// "ncnnport-avx512" or "ncnnport-avx2" (the few-row weighted sums' copy).
const char* matmul_layer_label(bool registered);

// Registers the overwrite of "MatMul" on `net`; call before net.load_param. False (nothing
// registered) where matmul_layer_supported() is false.
bool register_matmul_layer(ncnn::Net& net);

// Batched products the overwrite computed itself in this process (a run proves the kernel ran).
uint64_t matmul_layer_calls();

// Query rows per head up to which the stream kernels run (decode with grouped KV heads: the
// 1-8 query heads of one KV head; bandwidth-bound, each cache row read once per 4 query rows).
constexpr int kStreamMaxRows = 8;

// The most query rows per head the kernel takes. Above kStreamMaxRows the many-row kernels run
// (16 lanes with AVX-512F, else 8): MLA's absorbed decode (Youtu-VL: 32
// query heads over one shared 512-wide latent cache, 64 rows for two new tokens), which is
// compute-bound at 2 x 32 flops per cache float.
constexpr int kMatmulMaxRows = 64;

}  // namespace ncnnport
