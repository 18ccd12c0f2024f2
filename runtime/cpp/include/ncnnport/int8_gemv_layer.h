// A stand-in for ncnn's built-in Gemm that computes the one-row product of an int8-weights package
// (convert/int8_weights.py: quantize_term 80y, int8 weights with a 127/absmax scale per output row
// and K-block, the input quantized per call) with an AVX-512 VNNI kernel, or on CPUs without it
// (AVX2 PCs: Zen 2/3, Intel client cores) an AVX2 one of the same bits, and hands every other case
// to the built-in Gemm.
//
// Why: a decoded token of package-int8w runs every projection and the head as such a Gemm on one
// row, which is bound by the weight bytes it reads (1 per weight). ncnn 1.0.20261020's x86 kernel
// for it (gemm_BT_x86_wq_int8) tiles and packs the one-row input like a matrix and read the
// weights at 4-7 GB/s on one EPYC thread (qwen3-asr real-L4 decode layers: 19 % of the 1-byte
// bound). This layer keeps its own copy of the weights as one sequential stream of 16-row groups
// (dpbusd's layout: one int32 lane per output row, no horizontal sums), which the hardware
// prefetcher runs ahead of: the 160 MB head at 23-25 GB/s isolated (ncnn: 5.3-6.9 GB/s).
//
// Arithmetic: ncnn's own up to the order of fp32 additions. The input is quantized per K-block as
// ncnn's x86 kernel does it (absmax, scale 127/absmax, +-0.5 then truncation, clamp to +-127,
// descale absmax/127); each block's integer dot product is exact (the weights are stored as
// w + 128 in unsigned bytes and 128 * sum(x) is subtracted per block); the blocks are added in k
// order as fsum = fma(float(isum), descale_x * descale_w, fsum), descale_w = 1 / scale. ncnn's
// own result differs from that chain in the last bits on some outputs (measured, not traced), so
// the contract is the fp32 summation bound over the blocks: ncnnport-int8-gemv-check holds every
// output within it (measured at most 0.09 of it) and reports bit equality.
// The kernel's case: 8-bit weights without input scales (quantize_term 80y), constant transposed
// B, alpha = beta = 1, C none or per column, K and the block a multiple of 16, one fp32 row in;
// every other Gemm, and more rows, run ncnn's. Registered per CPU Net (register_custom_layer with
// the built-in type name) before load_param, where the CPU has AVX-512 F, BW, VL and VNNI, or AVX2
// and FMA.
//
// The AVX2 copy (8-row groups, the weights stored as w): without dpbusd, each k-quad's products
// are maddubs(|w|, x with w's sign), pairs added in int16 (at most 2 * 128 * 127: no saturation),
// then madd with ones into int32, so every block's integer sum is the same exact integer and the
// fp32 chain over the blocks the same per row: both copies give the same bits (tested). Why it
// exists: on an AVX2-only EPYC ncnn's int8 Gemm made the int8 token 47 ms (20 % of the 1-byte
// bound, slower than the fp16 package), see runtime/cpp/README.md.
#pragma once

#include <net.h>  // ncnn

#include <cstdint>

namespace ncnnport {

// True on an x86 build running on a CPU with AVX-512 F, BW, VL and VNNI, or with AVX2 and FMA (the
// two copies' instructions); false elsewhere (never registered: ncnn's Gemm runs).
bool int8_gemv_layer_supported();

// Registers the overwrite of "Gemm" on `net`; call before net.load_param. False (nothing
// registered) where int8_gemv_layer_supported() is false.
bool register_int8_gemv_layer(ncnn::Net& net);

// One-row int8 products the overwrite computed itself in this process (a run proves it ran).
uint64_t int8_gemv_layer_calls();

// Limits the layers packed from now on to the AVX2 copy on an AVX-512 VNNI CPU
// (ncnnport-int8-gemv-check --avx2, so the tests run both copies on one machine).
void int8_gemv_layer_limit_to_avx2(bool limit);

// Forces the AVX2 copy to read one row group at a time (1) or int8_gemv_layer_side_by_side_streams()
// groups side by side, instead of int8_gemv_streams_choice (0, the default): for
// ncnnport-int8-gemv-check --streams, so the tests run both variants.
void int8_gemv_layer_force_streams(int streams);
int int8_gemv_layer_side_by_side_streams();

// What a run reports for its int8 one-row products: "ncnn" when the overwrite is not registered,
// else "ncnnport-avx512vnni" or "ncnnport-avx2" (the copy layers are packed for).
const char* int8_gemv_layer_label(bool registered);

}  // namespace ncnnport
