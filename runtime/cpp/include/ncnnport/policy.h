// The packaged tolerance policy (policy.json): per-module gates of a precision mode, read the way
// ncnnport.parity.policy.Policy.module reads them.
//
// Why: `ncnnport verify --backend vulkan` judges each graph by the policy's `vulkan_fp32` budgets
// (ncnn's Vulkan fp32 sums in another order and its GELU shader is the tanh form), derived from the
// model's roundoff rule (parity/budgets.py), not by the spec's CPU fp32 gates. The C++ verify on
// --vulkan must read the same rows and derive the same numbers, or the two verifies disagree on
// the same package. The derivation is repeated here operation for operation (doubles, same order),
// so a gate is the same double as Python's; tests/cpp/test_cpp_vulkan.py compares them.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>

namespace ncnnport {

// One output's gate (ncnnport.contract.Tolerance; the defaults are its defaults).
struct Gate {
    double min_cosine = 0.999999;
    double max_abs_rel = 1e-4;
    double max_abs_floor = 1e-6;
};

// A module's gates: "*" for every output plus per-output overrides (Policy.module's dict).
struct ModuleGates {
    Gate star;
    std::map<std::string, Gate> outputs;
    // gates.get(output, gates["*"])
    const Gate& of(const std::string& output) const;
};

// policy.json parsed and checked as Policy.load checks it ('version' and 'precisions' present; a
// roundoff_rule well formed; with a rule, reduced modes state only absolute stage gates). Errors
// are PackageError (model_json.h): one line naming the file and field.
class TolerancePolicy {
public:
    static TolerancePolicy load(const std::filesystem::path& path);
    // Parsed from a JSON document; `where` names it in errors.
    static TolerancePolicy from_json(nlohmann::json doc, const std::string& where);

    // Policy.module(name, mode): mode is a UNIT_ROUNDOFF name ("fp32", "vulkan_fp32", ...).
    ModuleGates module(const std::string& name, const std::string& mode) const;

private:
    TolerancePolicy(nlohmann::json doc, std::string where) : doc_(std::move(doc)), where_(std::move(where)) {}
    const nlohmann::json& mode_body(const std::string& mode) const;
    Gate fp32_default() const;
    Gate mode_default(const std::string& mode) const;
    bool derived(const std::string& mode, const std::string& module, Gate& out) const;
    void check() const;

    nlohmann::json doc_;
    std::string where_;
};

}  // namespace ncnnport
