// The read speed of each weight stream a run's one-row kernels went through: per kernel width and
// per number of weight bytes one call streams (a layer shape), the calls and their summed seconds.
//
// Why: a decode step's token time is the sum of streams of very different sizes (Qwen3-ASR real:
// 2-6 MiB projections and a 311 MB fp16 head), and the whole token's percentage of the bound
// cannot say which of them reads slowly. The prefetch choice's samples (gemv_prefetch.h) cover
// only the first calls of the sizes it samples; this covers every call. Cost: two clock reads per
// call (tens of ns against calls of 0.1-20 ms).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace ncnnport {

class StreamTimes {
public:
    // One call that streamed `bytes` of weights in `seconds`.
    void add(size_t bytes, double seconds);
    // [{bytes, calls, seconds, gbps}] by ascending bytes; gbps = bytes * calls / seconds / 1e9.
    nlohmann::json json() const;

private:
    struct Sum {
        uint64_t calls = 0;
        double seconds = 0.0;
    };
    mutable std::mutex mutex_;
    std::map<size_t, Sum> by_bytes_;
};

// Seconds every one-row kernel of the process has spent streaming weights so far, over all widths
// (each StreamTimes::add counts here too). Read before and after a graph's call, it says how much
// of the call was the weights' streams and how much everything else (attention, norms, rope):
// Graph::stream_seconds, an executable's timing.decode_layers_stream_s.
double weight_stream_seconds();

// The process's record for the fp16 (true) or fp32 one-row InnerProduct kernel (gemv_layer.h).
StreamTimes& gemv_stream_times(bool fp16);
// The process's record for the int8 one-row kernel (int8_gemv_layer.h).
StreamTimes& int8_gemv_stream_times();

}  // namespace ncnnport
