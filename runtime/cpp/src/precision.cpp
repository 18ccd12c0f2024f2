#include "ncnnport/precision.h"

#include <stdexcept>

namespace ncnnport {

std::string CpuPrecision::label() const {
    std::string s;
    for (const auto& [flag, on] : {std::pair<const char*, bool>{"fp16_storage", fp16_storage},
                                   {"fp16_packed", fp16_packed}, {"fp16_arithmetic", fp16_arithmetic},
                                   {"bf16_storage", bf16_storage}})
        if (on) s += (s.empty() ? "" : "+") + std::string(flag);
    return s.empty() ? "fp32" : s;
}

nlohmann::json CpuPrecision::flags_json() const {
    return {{"fp16_storage", fp16_storage}, {"fp16_packed", fp16_packed}, {"fp16_arithmetic", fp16_arithmetic},
            {"bf16_storage", bf16_storage}};
}

const std::vector<CpuPrecision>& cpu_precisions() {
    static const std::vector<CpuPrecision> table = [] {
        CpuPrecision fp32{"fp32", "fp32"};
        CpuPrecision fp16_storage{"fp16-storage", "fp16"};
        fp16_storage.fp16_storage = true;
        fp16_storage.fp16_kv_cache = true;
        CpuPrecision bf16{"bf16", "bf16"};
        bf16.bf16_storage = true;
        return std::vector<CpuPrecision>{fp32, fp16_storage, bf16};
    }();
    return table;
}

const std::vector<std::pair<std::string, std::string>>& refused_precisions() {
    static const std::vector<std::pair<std::string, std::string>> refused = {
        {"fp16-packed", "ncnn flags the C++ runtime is not tested with"},
        {"fp16-arithmetic", "ncnn flags the C++ runtime is not tested with"},
        {"fp16-weights", "a package's weights (model.json precision), not an ncnn option: run that package in fp32"},
        {"int8-weights", "a package's weights (model.json precision), not an ncnn option: run that package in fp32"},
    };
    return refused;
}

std::string cpu_precision_names() {
    std::string s;
    for (const auto& p : cpu_precisions()) s += (s.empty() ? "" : ", ") + p.name;
    return s;
}

const CpuPrecision& checked_precision(const std::string& name, bool vulkan) {
    const CpuPrecision* found = nullptr;
    for (const auto& p : cpu_precisions())
        if (p.name == name) found = &p;
    if (!found) {
        std::string why;
        for (const auto& [refused, reason] : refused_precisions())
            if (refused == name) why = " (" + name + ": " + reason + ")";
        throw std::invalid_argument("--precision '" + name + "': the C++ runtime accepts " + cpu_precision_names() + why);
    }
    if (vulkan && found->name != "fp32")
        throw std::invalid_argument("--precision " + name + " is a CPU setting; --vulkan runs fp32 (drop one of them)");
    return *found;
}

bool fp16_kv_rows(const CpuPrecision& precision, const std::string& package_precision, bool vulkan) {
    return !vulkan && (precision.fp16_kv_cache || package_precision == "int8-weights");
}

nlohmann::json precisions_table_json() {
    nlohmann::json accepted = nlohmann::json::array();
    for (const auto& p : cpu_precisions())
        accepted.push_back({{"name", p.name}, {"mode", p.mode}, {"flags", p.flags_json()}, {"fp16_kv_cache", p.fp16_kv_cache}});
    nlohmann::json refused = nlohmann::json::object();
    for (const auto& [name, reason] : refused_precisions()) refused[name] = reason;
    return {{"accepted", accepted}, {"refused", refused}};
}

}  // namespace ncnnport
