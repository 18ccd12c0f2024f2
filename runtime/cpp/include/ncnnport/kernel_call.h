// One call of a one-row weight kernel (the fp32/fp16 InnerProduct kernel of gemv_layer.cpp, the
// int8 Gemm kernel of int8_gemv_layer.cpp), timed once for every record that learns from it.
//
// Why one function: each call's seconds feed the prefetch choices (PrefetchPlan::record), the
// streams choice where the layout reads blocks side by side, and the stream clock
// (StreamTimes::add, which timing.weight_streams and timing.decode_layers_stream_s read). The two
// kernels used to repeat this sequence line for line; a kernel that skipped one record would
// drop out of the per-stream lines or the layers' split without any error.
#pragma once

#include "ncnnport/gemv_prefetch.h"
#include "ncnnport/stream_times.h"

#include <chrono>
#include <cstddef>
#include <utility>

namespace ncnnport {

// Runs `kernel(prefetch, distance, side_by_side)` as `plan` and the streams choice pick it, then
// records its seconds. `streams` is null where the packed layout has one stream only (its calls
// then run with side_by_side false and nothing samples them); `forced_streams` is the check
// tools' override (PrefetchPlan::streams_pick). Returns the call's seconds.
template <typename Kernel>
double run_timed_kernel(const PrefetchPlan& plan, GemvPrefetchChoice* streams, int forced_streams, StreamTimes& times,
                        Kernel&& kernel) {
    GemvPrefetchChoice::Pick side_by_side{false, false};
    if (streams) side_by_side = plan.streams_pick(*streams, forced_streams);
    const auto t0 = std::chrono::steady_clock::now();
    std::forward<Kernel>(kernel)(plan.prefetch(), plan.distance(), side_by_side.prefetch);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    plan.record(seconds);
    if (side_by_side.sample) streams->record(side_by_side.prefetch, plan.bytes(), seconds);
    times.add(plan.bytes(), seconds);
    return seconds;
}

}  // namespace ncnnport
