// Timing shared by the layer checks (tools/matmul_check.cpp, tools/int8_gemv_check.cpp): ncnn's
// built-in layer and ncnnport's overwrite timed interleaved call by call, the order swapped every
// round, so a load change moves both alike; with `cold`, a 256 MB read before every timed call,
// so the operands come from DRAM as they do in a decode step (the weights streamed between two
// steps evict the cache), not from the cache the previous call warmed.
#pragma once

#include "ncnnport/stats.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace ncnnport::check {

struct Medians {
    double reference_ms = 0.0, test_ms = 0.0;
};

using ncnnport::median;

// The sum of the last eviction read: kept so the read is not elided.
inline volatile float g_evict_sum = 0.f;

// Reads `evict` whole (one float per cache line).
inline void evict_caches(const std::vector<float>& evict) {
    float s = 0.f;
    for (size_t i = 0; i < evict.size(); i += 16) s += evict[i];
    g_evict_sum = s;
}

// Median ms of `reference` and of `test` over `rounds` interleaved rounds.
inline Medians interleaved_medians(const std::function<void()>& reference, const std::function<void()>& test,
                                   int rounds, bool cold) {
    const std::vector<float> evict(cold ? (256u << 20) / sizeof(float) : 0, 1.f);
    auto ms_of = [&](const std::function<void()>& call) {
        evict_caches(evict);
        const auto t0 = std::chrono::steady_clock::now();
        call();
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    std::vector<double> t_ref, t_test;
    for (int r = 0; r < rounds; ++r) {
        if (r % 2) { t_test.push_back(ms_of(test)); t_ref.push_back(ms_of(reference)); }
        else { t_ref.push_back(ms_of(reference)); t_test.push_back(ms_of(test)); }
    }
    return {median(t_ref), median(t_test)};
}

}  // namespace ncnnport::check
