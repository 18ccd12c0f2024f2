// Greedy token selection, as the Python loop's runtime.sampling does it.
#pragma once

#include <cstddef>
#include <vector>

namespace ncnnport {

// Index of the largest logit, the FIRST one on exact ties (torch.argmax / numpy.argmax); a NaN
// wins as in numpy (argmax returns the first NaN). Throws std::invalid_argument on an empty row.
size_t greedy(const float* logits, size_t n);
inline size_t greedy(const std::vector<float>& logits) { return greedy(logits.data(), logits.size()); }

// `logits` with `ids` set to -inf (EOS before a minimum length); out-of-range ids are ignored.
std::vector<float> suppress(std::vector<float> logits, const std::vector<int>& ids);

}  // namespace ncnnport
