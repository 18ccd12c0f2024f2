#include "ncnnport/greedy.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace ncnnport {

size_t greedy(const float* logits, size_t n) {
    if (n == 0) throw std::invalid_argument("greedy: empty logit row");
    size_t best = 0;
    for (size_t i = 0; i < n; ++i) {
        if (std::isnan(logits[i])) return i;  // numpy.argmax: the first NaN
        if (logits[i] > logits[best]) best = i;
    }
    return best;
}

std::vector<float> suppress(std::vector<float> logits, const std::vector<int>& ids) {
    for (int id : ids)
        if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[id] = -std::numeric_limits<float>::infinity();
    return logits;
}

}  // namespace ncnnport
