// Which InnerProduct computes one-row (decode) products on CPU nets (GraphOptions::gemv).
// No ncnn include: the verify options and the executables' argument parsers use it too.
#pragma once

#include <string>

namespace ncnnport {

// Auto (the default) and Kernel (--gemv-kernel) = ncnnport's one-row kernel (gemv_layer.h)
// wherever the CPU runs it; Ncnn = ncnn's built-in (--ncnn-gemv). Auto once kept ncnn's AVX-512
// copy on AVX-512 CPUs, where the kernel's first layout lost; the one-stream layout beat it on both
// machines measured, so the two now agree, and --gemv-kernel stays accepted. The executables take
// both flags, for comparisons; their JSON says which ran (gemv_json).
enum class GemvChoice { Auto, Kernel, Ncnn };

// "--gemv-kernel" / "--ncnn-gemv" set `choice` and return true; any other flag returns false.
inline bool parse_gemv_flag(const std::string& flag, GemvChoice& choice) {
    if (flag == "--gemv-kernel") choice = GemvChoice::Kernel;
    else if (flag == "--ncnn-gemv") choice = GemvChoice::Ncnn;
    else return false;
    return true;
}

}  // namespace ncnnport
