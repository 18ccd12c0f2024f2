#pragma once
// Command-line helpers shared by the model executables: one error type for a bad command line
// (each main prints it with its usage text and exits 2) and one integer parser, so every
// executable refuses a malformed number with the same one line.

#include <stdexcept>
#include <string>

namespace ncnnport {

class UsageError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// `value` of `flag` as an int in [lo, 2^30]; the whole string must be the number.
inline int int_arg(const std::string& flag, const std::string& value, int lo) {
    try {
        size_t used = 0;
        const long v = std::stol(value, &used);
        if (used == value.size() && v >= lo && v <= 1 << 30) return static_cast<int>(v);
    } catch (const std::exception&) {
    }
    throw UsageError(flag + " '" + value + "': expected an integer >= " + std::to_string(lo));
}

}  // namespace ncnnport
