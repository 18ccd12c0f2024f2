// verify_goldens: the C++ twin of `ncnnport verify`'s manifest and golden-vector checks.
//
// Why: a deployer runs the C++ runtime, not the Python loop, so the package's golden vectors
// (golden/<graph>.npz: the inputs each graph was traced at and what PyTorch computed) must be
// checked through the same ncnn::Net calls the executables make, and judged by the same numbers
// as ncnnport/drivers/verify.py: on the CPU in fp32 each output's gate is its spec's
// `tolerances[output]` (else `tolerances["*"]`, else the fp32 default 0.999999 / 1e-4 / 1e-6),
// which convert writes from the packaged policy.json's fp32 gates; the metrics are
// ncnnport.metrics.compare/judge (cosine and worst-row cosine along the output's feature axis,
// max_abs against max(max_abs_rel x max|ref|, max_abs_floor), NaN/Inf always fail). A reduced CPU
// precision (--precision fp16-storage: precision.h), a derived package (model.json `precision`
// fp16-weights / int8-weights) and any Vulkan run are judged by the packaged policy's budget of
// that mode instead (policy.h), as the Python verify judges them (drivers/verify.judging_mode: a
// derived package's mode wins over the run's flags, which Python allows on top and so does this).
#pragma once

#include <filesystem>

#include "ncnnport/gemv_choice.h"
#include <stdexcept>
#include <string>
#include <vector>

namespace ncnnport {

// A package that cannot be judged (unreadable npz, a spec or golden file that does not fit,
// a graph ncnn cannot load): one line naming the file / module / blob. `ncnnport-cpp verify`
// exits 2 on it; a judged failure is a failed row (exit 1) instead.
class BadPackage : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct VerifyOptions {
    int threads = 1;
    bool vulkan = false;  // needs a Vulkan build; refused (BadPackage-free usage error) otherwise
    GemvChoice gemv = GemvChoice::Auto;  // GraphOptions::gemv: which one-row InnerProduct runs
    std::string precision = "fp32";  // GraphOptions::precision (precision.h); refused if not run here
};

struct VerifyRow {
    std::string kind;    // manifest | versions | golden
    std::string name;    // manifest.json, ncnn, or "<graph>[axis=n,...]"
    bool passed = false;
    std::string detail;
};

struct VerifyResult {
    std::vector<VerifyRow> rows;
    // The policy mode the golden rows were judged in: the package's weight precision (model.json
    // `precision`, absent = fp32), else the run's --precision, on the chosen backend, as
    // drivers/verify.judging_mode and runtime/precision.judging_mode map them.
    std::string mode;
    bool passed() const;
};

// Manifest (sizes + sha256; a mismatch stops there: nothing of a tampered package runs), the
// ncnn version the package was built with (a warning row), then every graph of specs/ on its
// golden cases. Throws BadPackage (see above) and std::invalid_argument for unusable options.
VerifyResult verify_goldens(const std::filesystem::path& package, const VerifyOptions& options);

// The Markdown pass/fail table `ncnnport verify` prints, with its "N passed, M failed" line.
std::string verify_table(const VerifyResult& result);

// "fp32/t1", "fp16_storage/t1" (+ "/vulkan"): the options label ncnnport's RuntimeOptions prints.
std::string options_label(const VerifyOptions& options);

// The whole `verify` command, shared by `ncnnport-cpp verify` and every per-model executable's
// `--verify` so they print and exit alike: the heading and table on stdout; exit 0 all rows pass,
// 1 a row failed, 2 a package that cannot be judged or unusable options (one line on stderr,
// `error_prefix` first).
int run_verify(const std::filesystem::path& package, const VerifyOptions& options, const std::string& error_prefix);

}  // namespace ncnnport
