// The CPU precisions the C++ runtime runs (`--precision NAME` of every executable): each one the
// entry of runtime/precision.py of the same name, with exactly its ncnn option flags and the
// policy mode that judges it.
//
// Why a table here and not a free set of flags: the Python loop, the C++ loop and their benches
// must mean the same thing by a name. `ncnnport-cpp precisions` prints this table and
// tests/cpp/test_cpp_precision.py holds it against runtime/precision.py's PRECISIONS (every Python
// name either accepted here with equal flags and mode, or refused with its reason), so the two
// cannot drift. Accepted: fp32, fp16-storage (ncnn's x86 InnerProduct converts its weights to
// fp16 at load and reads half the bytes; blobs and arithmetic stay fp32; ncnnport's gemv overwrite
// converts them the same way) and bf16 (bf16 blobs and weights in every ncnn layer that has a bf16
// path, which ncnn casts to and from at the layer boundaries and at extract; on AVX-512 BF16 CPUs
// the Gemms run bf16 dot products: the Youtu-VL vision encoder 2.5-3.3x torch fp32 on one EPYC
// thread, docs/performance.md. ncnnport's overwrites step aside for bf16 blobs: the gemv and int8 kernels
// refuse the option, the decode MatMul takes fp32 elements only). Refused: fp16-packed /
// fp16-arithmetic (flags no C++ test covers) and the derived packages' names (their weights are a
// package, not an ncnn option). Vulkan runs fp32 only (the GPU decode's blobs are float32); a
// reduced precision there is refused.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ncnnport {

struct CpuPrecision {
    std::string name;  // runtime/precision.py Precision.name
    std::string mode;  // Precision.mode: the policy mode that judges a run in this precision
    // Precision.flags (runtime/precision.py PRECISION_FIELDS); every other ncnn flag stays fp32's
    bool fp16_storage = false, fp16_packed = false, fp16_arithmetic = false, bf16_storage = false;
    // Precision.fp16_kv_cache: a decoder's K/V rows rounded to fp16 (kv_cache.h KvRows)
    bool fp16_kv_cache = false;

    // The flags part of RuntimeOptions.label: "fp32", or the set flags joined by "+".
    std::string label() const;
    // {"fp16_storage": bool, "fp16_packed": bool, "fp16_arithmetic": bool, "bf16_storage": bool}
    nlohmann::json flags_json() const;
};

// The accepted precisions, fp32 first.
const std::vector<CpuPrecision>& cpu_precisions();
// runtime/precision.py's other names with why the C++ runtime refuses each.
const std::vector<std::pair<std::string, std::string>>& refused_precisions();
// "fp32, fp16-storage, bf16": the accepted names, for messages.
std::string cpu_precision_names();

// The precision called `name` for a run on the CPU (`vulkan` false) or on Vulkan. Throws
// std::invalid_argument in one line naming the accepted precisions for a name this runtime does
// not run, and for a reduced precision with `vulkan` (the executables exit 2 on it).
const CpuPrecision& checked_precision(const std::string& name, bool vulkan);

// Whether a run of `precision` over a package whose model.json says `package_precision` keeps
// K/V rows in fp16: the precision's fp16_kv_cache, or an int8-weights package (whose runs are
// Python's int8-weights precision), and never on Vulkan (runtime/precision.py Precision.options).
bool fp16_kv_rows(const CpuPrecision& precision, const std::string& package_precision, bool vulkan);

// `ncnnport-cpp precisions`: {"accepted": [{name, mode, flags, fp16_kv_cache}], "refused": {name: why}}.
nlohmann::json precisions_table_json();

}  // namespace ncnnport
