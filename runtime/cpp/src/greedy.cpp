#include "ncnnport/greedy.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#if defined(__SSE2__) && defined(__GNUC__)
#include <emmintrin.h>
#define NCNNPORT_GREEDY_SSE2 1
#else
#define NCNNPORT_GREEDY_SSE2 0
#endif

namespace ncnnport {

namespace {

// The largest of `logits` (whether any is NaN in `nan`), compared as `v > best ? v : best`, which
// never takes a NaN.
float largest(const float* logits, size_t n, bool& nan) {
    float best = logits[0];
    size_t i = 0;
    nan = false;
#if NCNNPORT_GREEDY_SSE2
    // 16 values a step in four registers; MAXPS(v, m) is exactly `v > m ? v : m` (the second
    // operand on a NaN or on equal values), and an unordered self-compare marks a NaN. The
    // compiler keeps the scalar form scalar: without -ffast-math it may not reorder a max.
    __m128 m[4], bad = _mm_setzero_ps();
    for (auto& r : m) r = _mm_set1_ps(best);
    for (; i + 16 <= n; i += 16)
        for (int r = 0; r < 4; ++r) {
            const __m128 v = _mm_loadu_ps(logits + i + 4 * r);
            bad = _mm_or_ps(bad, _mm_cmpunord_ps(v, v));
            m[r] = _mm_max_ps(v, m[r]);
        }
    nan = _mm_movemask_ps(bad) != 0;
    alignas(16) float lanes[16];
    for (int r = 0; r < 4; ++r) _mm_store_ps(lanes + 4 * r, m[r]);
    for (float v : lanes) best = v > best ? v : best;
#endif
    for (; i < n; ++i) {
        nan |= std::isnan(logits[i]);
        best = logits[i] > best ? logits[i] : best;
    }
    return best;
}

// The first index holding `value` (float equality: +0 == -0); n when none does.
size_t first_equal(const float* logits, size_t n, float value) {
    size_t i = 0;
#if NCNNPORT_GREEDY_SSE2
    const __m128 want = _mm_set1_ps(value);
    for (; i + 8 <= n; i += 8) {
        const __m128 hit = _mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(logits + i), want),
                                     _mm_cmpeq_ps(_mm_loadu_ps(logits + i + 4), want));
        if (_mm_movemask_ps(hit)) break;
    }
#endif
    for (; i < n; ++i)
        if (logits[i] == value) return i;
    return n;
}

}  // namespace

// Two passes instead of one compare-and-branch per logit: the largest value (and whether a NaN is
// there), then the first index holding it. Why: the one-pass loop compared each logit with the
// best so far, element by element: ~0.1 ms of every Qwen3-ASR decode step (151936 logits), about
// 0.7 % of an int8-weights token on the 2-core Xeon (perf). The result is the same: the first
// index of the maximum, ties under float comparison (+0 == -0), the first NaN winning.
size_t greedy(const float* logits, size_t n) {
    if (n == 0) throw std::invalid_argument("greedy: empty logit row");
    bool nan = false;
    const float best = largest(logits, n, nan);
    if (nan) {  // numpy.argmax: the first NaN
        for (size_t i = 0; i < n; ++i)
            if (std::isnan(logits[i])) return i;
    }
    const size_t i = first_equal(logits, n, best);
    return i < n ? i : 0;  // i < n always: `best` is one of the logits (logits[0] if all are -inf)
}

std::vector<float> suppress(std::vector<float> logits, const std::vector<int>& ids) {
    for (int id : ids)
        if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[id] = -std::numeric_limits<float>::infinity();
    return logits;
}

}  // namespace ncnnport
