// Small statistics the runtime and its tools share.
#pragma once

#include <algorithm>
#include <vector>

namespace ncnnport {

// The median of v (the mean of the middle two for an even count); 0 for an empty v.
inline double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace ncnnport
