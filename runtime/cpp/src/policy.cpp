#include "ncnnport/policy.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "ncnnport/model_json.h"

using nlohmann::json;

namespace ncnnport {
namespace {

// budgets.py INT8_ROUNDOFF: the relative rounding with int8's rms error, bf16's 2^-8 times
// crest x 256/254 (crest 2.83: a 128-block of Gaussian values' expected absmax / rms).
constexpr double kInt8Roundoff = 2.83 * 256.0 / 254.0 / 256.0;
// budgets.py PERTURBATION_LIMIT: the largest relative error a derived budget allows.
constexpr double kPerturbationLimit = 0.5;

// parity/budgets.py UNIT_ROUNDOFF: half an ulp of 1.0 in each mode's storage format.
const std::map<std::string, double>& unit_roundoff() {
    static const std::map<std::string, double> u = {
        {"fp32", std::ldexp(1.0, -24)},          {"fp16", std::ldexp(1.0, -11)},
        {"fp16_weights", std::ldexp(1.0, -11)},  {"fp16_arithmetic", std::ldexp(1.0, -11)},
        {"int8_weights", kInt8Roundoff},         // budgets.py INT8_ROUNDOFF (package-int8w)
        {"bf16", std::ldexp(1.0, -8)},           {"vulkan_fp32", std::ldexp(1.0, -24)},
        {"vulkan_fp16", std::ldexp(1.0, -11)},
    };
    return u;
}

// budgets.py GELU_TANH_ERROR (ncnn's Vulkan GELU shader is always the tanh form).
constexpr double kGeluTanhError = 1.79e-4;

bool accumulating(const std::string& mode) {
    return mode == "fp16_arithmetic" || mode == "vulkan_fp32" || mode == "vulkan_fp16";
}

double approximation_error(const std::string& mode) {
    return mode == "vulkan_fp32" || mode == "vulkan_fp16" ? kGeluTanhError : 0.0;
}

// budgets.RoundoffRule
struct Rule {
    double kappa_abs = 0, kappa_cos = 0, margin = 2.0;
    long long accumulation_length = 1;
    std::optional<long long> vulkan_accumulation_length;

    long long length_for(const std::string& mode) const {
        if (mode.rfind("vulkan_", 0) == 0 && vulkan_accumulation_length) return *vulkan_accumulation_length;
        return accumulation_length;
    }
};

[[noreturn]] void fail(const std::string& where, const std::string& what) { throw PackageError(where + ": " + what); }

double number_field(const json& obj, const char* key, double fallback, const std::string& where) {
    if (!obj.contains(key)) return fallback;
    if (!obj[key].is_number()) fail(where, std::string("field '") + key + "' is not a number");
    return obj[key].get<double>();
}

Rule parse_rule(const json& raw, const std::string& where) {
    if (!raw.is_object()) fail(where, "roundoff_rule is not an object");
    std::string missing;
    for (const char* k : {"kappa_abs", "kappa_cos"})
        if (!raw.contains(k)) missing += std::string(missing.empty() ? "" : ", ") + k;
    if (!missing.empty()) fail(where, "roundoff_rule needs " + missing);
    const std::string at = where + ": roundoff_rule";
    Rule r;
    r.kappa_abs = number_field(raw, "kappa_abs", 0, at);
    r.kappa_cos = number_field(raw, "kappa_cos", 0, at);
    r.margin = number_field(raw, "margin", 2.0, at);
    r.accumulation_length = static_cast<long long>(number_field(raw, "accumulation_length", 1, at));
    if (raw.contains("vulkan_accumulation_length") && !raw["vulkan_accumulation_length"].is_null())
        r.vulkan_accumulation_length = static_cast<long long>(number_field(raw, "vulkan_accumulation_length", 1, at));
    if (r.kappa_abs <= 0 || r.kappa_cos <= 0 || r.margin < 1 || r.accumulation_length < 1 ||
        (r.vulkan_accumulation_length && *r.vulkan_accumulation_length < 1))
        fail(where, "roundoff_rule needs kappa_abs, kappa_cos > 0, margin >= 1, accumulation_length "
                    "(and vulkan_accumulation_length) >= 1");
    // Policy._check_rule: the propagated amplification is well formed. It derives only the
    // propagated checks of the Python parity (stages, the trace); the golden vectors this
    // runtime judges are local, so their gates come from the kappas above.
    if (raw.contains("propagated")) {
        const json& prop = raw["propagated"];
        const std::string at_prop = at + ".propagated";
        if (!prop.is_object() || prop.empty()) fail(at_prop, "state kappa_abs, kappa_cos and/or modules as an object");
        auto check_kappas = [](const json& obj, const std::string& where, bool allow_modules) {
            for (const auto& [key, value] : obj.items()) {
                if (allow_modules && key == "modules") continue;
                if ((key != "kappa_abs" && key != "kappa_cos") || !value.is_number() || value.get<double>() <= 0)
                    fail(where, key + "=" + value.dump() + "; only kappa_abs and kappa_cos, numbers > 0");
            }
        };
        check_kappas(prop, at_prop, true);
        if (prop.contains("modules")) {
            const json& modules = prop["modules"];
            if (!modules.is_object()) fail(at_prop + ".modules", "an object of module -> kappas, got " + modules.dump());
            for (const auto& [name, kappas] : modules.items()) {
                if (!kappas.is_object() || kappas.empty())
                    fail(at_prop + ".modules." + name, "state kappa_abs and/or kappa_cos as an object");
                check_kappas(kappas, at_prop + ".modules." + name, false);
            }
        }
    }
    return r;
}

// RoundoffRule.override: a module's own measured amplification, when it states one.
Rule override_rule(Rule r, const json& raw, const std::string& where) {
    if (!raw.is_object() || raw.empty()) return r;
    r.kappa_abs = number_field(raw, "kappa_abs", r.kappa_abs, where);
    r.kappa_cos = number_field(raw, "kappa_cos", r.kappa_cos, where);
    return r;
}

// budgets.effective_roundoff
double effective_roundoff(const std::string& mode, long long length, const std::string& where) {
    const auto it = unit_roundoff().find(mode);
    if (it == unit_roundoff().end()) fail(where, "precision mode '" + mode + "' is not one the policy knows");
    double u = it->second;
    if (accumulating(mode)) u *= std::sqrt(static_cast<double>(length));
    return u + approximation_error(mode);
}

// budgets.derive: the mode's budget under the rule, never tighter than the fp32 gate and never
// past the perturbation limit.
Gate derive(const Rule& rule, const std::string& mode, const Gate& fp32, const std::string& where) {
    const double u = effective_roundoff(mode, rule.length_for(mode), where);
    const double rel = std::min(rule.margin * rule.kappa_abs * u, kPerturbationLimit);
    const double e = std::min(rule.margin * rule.kappa_cos * u, kPerturbationLimit);
    const double deficit = 0.5 * (e * e);
    const double max_abs_rel = std::max(rel, fp32.max_abs_rel);
    const double scale = fp32.max_abs_rel > 0 ? max_abs_rel / fp32.max_abs_rel : 1.0;
    return Gate{std::min(1.0 - deficit, fp32.min_cosine), max_abs_rel, fp32.max_abs_floor * scale};
}

// Policy._tol: the fields `raw` states over `base`; an empty or absent entry is `base`.
Gate tol(const json* raw, const Gate& base, const std::string& where) {
    if (raw == nullptr || raw->is_null() || (raw->is_object() && raw->empty())) return base;
    if (!raw->is_object()) fail(where, "is not an object");
    return Gate{number_field(*raw, "min_cosine", base.min_cosine, where),
                number_field(*raw, "max_abs_rel", base.max_abs_rel, where),
                number_field(*raw, "max_abs_floor", base.max_abs_floor, where)};
}

const json* child(const json& obj, const std::string& key) {
    if (!obj.is_object()) return nullptr;
    const auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
}

}  // namespace

const Gate& ModuleGates::of(const std::string& output) const {
    const auto it = outputs.find(output);
    return it == outputs.end() ? star : it->second;
}

TolerancePolicy TolerancePolicy::load(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw PackageError(path.string() + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    json doc = json::parse(ss.str(), nullptr, false);
    if (doc.is_discarded()) throw PackageError(path.string() + ": not JSON");
    return from_json(std::move(doc), path.string());
}

TolerancePolicy TolerancePolicy::from_json(json doc, const std::string& where) {
    if (!doc.is_object() || !doc.contains("version") || !doc.contains("precisions") || !doc["precisions"].is_object())
        throw PackageError(where + ": a policy needs 'version' and 'precisions'");
    TolerancePolicy policy(std::move(doc), where);
    policy.check();
    return policy;
}

// Policy._check_rule: with a rule, a reduced mode states only absolute gates.
void TolerancePolicy::check() const {
    const json* raw_rule = child(doc_, "roundoff_rule");
    if (raw_rule == nullptr || raw_rule->is_null()) return;
    parse_rule(*raw_rule, where_);
    for (const auto& [mode, body] : doc_["precisions"].items()) {
        if (mode == "fp32") continue;
        if (child(body, "default") || child(body, "modules"))
            fail(where_, "precisions." + mode + ": 'default'/'modules' are derived from roundoff_rule; state a "
                         "module's amplification in roundoff_rule.modules");
        const json* stages = child(body, "stages");
        if (stages == nullptr || !stages->is_object()) continue;
        for (const auto& [stage, raw] : stages->items()) {
            const json* rel = child(raw, "max_abs_rel");
            if (rel != nullptr && (!rel->is_number() || rel->get<double>() != 0.0))
                fail(where_, "precisions." + mode + ".stages." + stage + ": only absolute gates (max_abs_rel 0) "
                             "may be stated; relative ones come from roundoff_rule");
        }
    }
}

// Policy._mode: fp16_arithmetic falls back to fp16 when the policy leaves it out.
const json& TolerancePolicy::mode_body(const std::string& mode) const {
    static const json empty = json::object();
    const json& modes = doc_["precisions"];
    if (!modes.contains(mode) && mode == "fp16_arithmetic") {
        const json* parent = child(modes, "fp16");
        return parent ? *parent : empty;
    }
    const json* body = child(modes, mode);
    return body ? *body : empty;
}

Gate TolerancePolicy::fp32_default() const {
    // Policy.FP32_DEFAULT: Tolerance(0.999999, 1e-4) with the default floor
    return tol(child(mode_body("fp32"), "default"), Gate{}, where_ + ": precisions.fp32.default");
}

// Policy._derived: the rule's budget of `mode` (with the module's own kappa when `module` names
// one in roundoff_rule.modules); false without a rule or in fp32.
bool TolerancePolicy::derived(const std::string& mode, const std::string& module, Gate& out) const {
    const json* raw_rule = child(doc_, "roundoff_rule");
    if (raw_rule == nullptr || raw_rule->is_null() || mode == "fp32") return false;
    Rule rule = parse_rule(*raw_rule, where_);
    if (!module.empty()) {
        const json* modules = child(*raw_rule, "modules");
        const json* own = modules ? child(*modules, module) : nullptr;
        if (own) rule = override_rule(rule, *own, where_ + ": roundoff_rule.modules." + module);
    }
    out = derive(rule, mode, fp32_default(), where_);
    return true;
}

Gate TolerancePolicy::mode_default(const std::string& mode) const {
    Gate g;
    if (derived(mode, "", g)) return g;
    return tol(child(mode_body(mode), "default"), Gate{}, where_ + ": precisions." + mode + ".default");
}

ModuleGates TolerancePolicy::module(const std::string& name, const std::string& mode) const {
    ModuleGates gates;
    const Gate base = mode_default(mode);
    if (derived(mode, name, gates.star)) return gates;
    const json* modules = child(mode_body(mode), "modules");
    const json* raw = modules ? child(*modules, name) : nullptr;
    const std::string at = where_ + ": precisions." + mode + ".modules." + name;
    gates.star = tol(raw ? child(*raw, "*") : nullptr, base, at + ".*");
    if (raw != nullptr && raw->is_object())
        for (const auto& [key, val] : raw->items())
            if (key != "*") gates.outputs[key] = tol(&val, gates.star, at + "." + key);
    return gates;
}

}  // namespace ncnnport
