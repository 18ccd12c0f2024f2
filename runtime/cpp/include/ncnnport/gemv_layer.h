// A stand-in for ncnn's built-in InnerProduct that computes the one-row (matrix-vector) case with
// a multi-stream AVX2 kernel and hands every other case to the built-in layer.
//
// Why: a decoded token runs every InnerProduct on one row, and that is bound by the bytes of
// weights read. ncnn 1.0.20261020's x86 kernel reads one interleaved weight stream of 8 outputs
// (~14-16 GB/s on one thread here); reading 4 blocks of 16 outputs at once reaches ~21-23 GB/s.
// Prefill (several rows), int8, bf16 and any activation the kernel does not apply itself stay on
// ncnn's own InnerProduct, created from the same parameters and weights, so their numbers do not
// change. The overwrite is registered per Net (ncnn::Net::register_custom_layer with the built-in
// type name) before load_param, only on CPU nets and only where the CPU has AVX2, FMA and F16C.
#pragma once

#include <net.h>  // ncnn

#include <cstdint>

namespace ncnnport {

// True on an x86 build running on a CPU with AVX2, FMA and F16C (the kernel's instructions);
// false everywhere else (aarch64 builds compile the layer but never register it).
bool gemv_layer_supported();

// True where ncnn's own InnerProduct runs its AVX-512 copy: this ncnn was built with it
// (build_ncnn.py --isa avx512, the default) and the CPU has AVX-512F. Measured (qwen3-asr real
// widths, 4 layers, 1 thread, C++ decode ms/token): on an Intel Xeon (AVX-512, 14 GB/s) ncnn's
// AVX-512 copy beat this kernel 1.3-1.45x (60-71 vs 73-95), while the kernel beat ncnn's AVX2 copy
// 1.1-1.25x there and on an AMD EPYC (Zen 4), where ncnn's AVX-512 copy and this kernel were within
// 0-15 % of each other. So the default (GemvChoice::Auto) leaves AVX-512 CPUs to ncnn.
bool gemv_builtin_avx512();

// Registers the overwrite of "InnerProduct" on `net`; call before net.load_param. Returns false,
// registering nothing, where gemv_layer_supported() is false.
bool register_gemv_layer(ncnn::Net& net);

// Matrix-vector products the overwrite computed itself in this process (every thread): lets a
// run prove that the kernel ran, instead of a registration that silently delegated everything.
uint64_t gemv_layer_calls();

// The name a run reports for the InnerProduct that ran its one-row products.
inline const char* gemv_layer_label(bool registered) { return registered ? "ncnnport-avx2" : "ncnn"; }

}  // namespace ncnnport
