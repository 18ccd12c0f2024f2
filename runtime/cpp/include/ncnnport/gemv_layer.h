// A stand-in for ncnn's built-in InnerProduct that computes the one-row (matrix-vector) case with
// its own kernel and hands every other case to the built-in layer.
//
// Why: a decoded token runs every InnerProduct on one row, and that is bound by the bytes of
// weights read. ncnnport keeps the weights as one sequential stream of 64-output blocks and reads
// them with 16-lane registers where the CPU has AVX-512F (8-lane AVX2 otherwise); each output is
// ncnn's own order (bias, then one fused multiply-add per k, k ascending), so both copies give the
// same bits. Measured against ncnn 1.0.20261020's own InnerProduct (its AVX-512 copy) on
// qwen3-asr real widths, 4 layers, 1 thread (runtime/cpp/README.md, "One-row InnerProduct"): on an
// AMD EPYC the medians were 7-8 % faster (fp32, fp16 storage); on an Intel Xeon fp32 was 8-28 %
// faster in 4 of 4 pairs, fp16 storage 2-12 % faster in 3 of 4 and 11 % slower in one. So it is
// the default on every CPU that runs it. Prefill (several rows), int8, bf16 and any activation the
// kernel does not apply itself stay on ncnn's own InnerProduct, created from the same parameters
// and weights, so their numbers do not change. The overwrite is registered per Net (ncnn::Net::register_custom_layer with the
// built-in type name) before load_param, only on CPU nets and only where the CPU has AVX2, FMA and
// F16C.
#pragma once

#include <net.h>  // ncnn

#include <cstdint>

namespace ncnnport {

// True on an x86 build running on a CPU with AVX2, FMA and F16C (the kernel's instructions);
// false everywhere else (aarch64 builds compile the layer but never register it).
bool gemv_layer_supported();

// True where ncnn's own InnerProduct runs its AVX-512 copy: this ncnn was built with it
// (build_ncnn.py --isa avx512, the default) and the CPU has AVX-512F (reported: it is what
// --ncnn-gemv runs). The first layout of this kernel (16-output blocks, four read side by side, 8
// lanes) lost to that copy on the Xeon 1.3-1.45x, which is why the default once left AVX-512 CPUs
// to ncnn.
bool gemv_builtin_avx512();

// Registers the overwrite of "InnerProduct" on `net`; call before net.load_param. Returns false,
// registering nothing, where gemv_layer_supported() is false.
bool register_gemv_layer(ncnn::Net& net);

// Matrix-vector products the overwrite computed itself in this process (every thread): lets a
// run prove that the kernel ran, instead of a registration that silently delegated everything.
uint64_t gemv_layer_calls();

// The name a run reports for the InnerProduct that ran its one-row products: "ncnn" when the
// overwrite is not registered, else "ncnnport-avx512" or "ncnnport-avx2" (the registers it uses).
const char* gemv_layer_label(bool registered);

// Limits the kernel to its 8-lane AVX2 copy on an AVX-512 CPU (ncnnport-gemv-check --avx2, so
// the tests run both copies on one machine); false lifts the limit.
void gemv_layer_limit_to_avx2(bool limit);

// Forces the narrow layout (packed where the CPU lacks AVX-512F, or under the limit above) to read
// one block at a time (1) or 4 side by side (4), instead of gemv_streams_choice (0, the default):
// for ncnnport-gemv-check --streams, so the tests run both variants.
void gemv_layer_force_streams(int streams);

}  // namespace ncnnport
