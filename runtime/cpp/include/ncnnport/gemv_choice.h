// Which InnerProduct computes one-row (decode) products on CPU nets (GraphOptions::gemv).
// No ncnn include: the verify options and the executables' argument parsers use it too.
#pragma once

#include <string>

namespace ncnnport {

// Auto = ncnnport's multi-stream kernel (gemv_layer.h) where the CPU runs it and ncnn has no
// AVX-512 copy to run (gemv_builtin_avx512: there ncnn's own was faster), Kernel = the kernel
// wherever the CPU runs it (--gemv-kernel), Ncnn = ncnn's built-in (--ncnn-gemv). The executables
// take both flags, for comparisons; their JSON says which ran (gemv_json).
enum class GemvChoice { Auto, Kernel, Ncnn };

// "--gemv-kernel" / "--ncnn-gemv" set `choice` and return true; any other flag returns false.
inline bool parse_gemv_flag(const std::string& flag, GemvChoice& choice) {
    if (flag == "--gemv-kernel") choice = GemvChoice::Kernel;
    else if (flag == "--ncnn-gemv") choice = GemvChoice::Ncnn;
    else return false;
    return true;
}

}  // namespace ncnnport
