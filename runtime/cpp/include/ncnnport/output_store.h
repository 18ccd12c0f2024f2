// How the one-row kernels (gemv_layer.h, int8_gemv_layer.h) write a large output: past the caches,
// with streaming (non-temporal) stores.
//
// Why: a kernel writes a few output lines per block of weights it streams from DRAM. An output
// larger than the caches keep across that stream (a decode step's head: Qwen3-ASR's 151936 logits,
// 608 KB) has lost its lines by the time they are written, so an ordinary store first reads each
// line from DRAM (a read for ownership) in the middle of the weight stream; a streaming store
// writes the whole line without reading it. That explains part of the cost only (outputs kept in
// L1 read in between, below), so the rule rests on the measurements, not on a model of them.
// 2-core Xeon, one thread, fp16 weights of the 311 MB head, 64 outputs per block, 14 interleaved
// rounds each, two runs, GB/s: ordinary stores 17.7 / 18.6, outputs kept in L1 18.0 / 19.1, 16-lane
// streaming stores 18.7 / 19.7 (the 4-lane ones below: 18.4), a sum over the same weights without
// outputs 19.1 / 20.3; at Youtu-VL's head width (K = 2560, 243 KB of outputs) 17.9 -> 19.0. In the
// model (qwen3-asr real-L4 fp16, 3 alternating pairs, ids equal) the head read 20.3-20.5 -> 19.1-19.4
// ms per token. On the device's Xeon (one lease; a plain stream reads only ~8.3 GB/s there,
// latency-bound) every store variant read within 3 % of the sum, and the model's head 22.1-24.5 ms
// before, 22.1-23.9 after: no gain there, no loss. The stored values are the same bits.
// Small outputs (a projection's few KB, read by the next layer right away) keep ordinary stores.
#pragma once

#include <cstddef>
#include <cstdint>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define NCNNPORT_OUTPUT_STORE_X86 1
#else
#define NCNNPORT_OUTPUT_STORE_X86 0
#endif

namespace ncnnport {

// Outputs of at least this many bytes are written with streaming stores: more than twice an L1, so
// not kept there, and in the models only the heads (Qwen3-ASR's 608 KB, Youtu-VL's 189 KB vocab
// shards), whose logits the host reads after the whole step, never a layer's projection (<= 38 KB,
// read by the next layer right away, which would then miss on it). Streaming every output of
// Qwen3-ASR's decode layers as well measured within the noise there (real-L4 fp16, 3 alternating
// rounds: layers 8.54-9.16 ms against 8.81-9.15).
constexpr size_t kStreamOutputMinBytes = size_t{128} << 10;

// Whether a call writing `num_output` floats streams them.
inline bool stream_output(int num_output) {
    return static_cast<size_t>(num_output) * sizeof(float) >= kStreamOutputMinBytes;
}

// Writes the `n` floats of `src` (16-byte aligned: a kernel's block result) to `dst`: with
// streaming stores where `stream` is set, `n` fills whole 64-byte lines and `dst` starts one (x86);
// else with ordinary stores. A thread that streamed calls output_store_fence() before another
// thread (or a later layer) reads what it wrote.
inline void store_block(float* dst, const float* src, int n, bool stream) {
#if NCNNPORT_OUTPUT_STORE_X86
    if (stream && n % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 64 == 0) {
        // SSE streaming stores: every x86-64 CPU has them, and four of them fill a line in the
        // write-combining buffer as one 64-byte store would
        for (int i = 0; i < n; i += 4) _mm_stream_ps(dst + i, _mm_load_ps(src + i));
        return;
    }
#else
    (void)stream;
#endif
    for (int i = 0; i < n; ++i) dst[i] = src[i];
}

// Orders this thread's streaming stores before its later stores (and the OpenMP barrier after it).
inline void output_store_fence(bool streamed) {
#if NCNNPORT_OUTPUT_STORE_X86
    if (streamed) _mm_sfence();
#else
    (void)streamed;
#endif
}

}  // namespace ncnnport
