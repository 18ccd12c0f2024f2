// A stand-in for ncnn's built-in MemoryData that hands its constant to the next layer without
// copying it.
//
// Why: ncnn 1.0.20261020's MemoryData::forward returns data.clone() on every call. The Youtu-VL
// decode graph holds MLA's absorbed projections (w_uk, w_uv: 32 x 128 x 512 fp32, 8.4 MB each) as
// MemoryData, so every layer of every token copied 16.8 MB before reading it: a perf profile of
// the C++ fp16-storage loop (real widths, 4 layers, the decode steps) put 5.6 % of the samples of
// an 84.8 ms token in that memmove (0.4 % after; runtime/cpp/README.md). Sharing is safe under
// ncnn's own rules: the blob shares the layer's reference count, so it is never 1, and ncnn's
// forward clones a blob whose count is not 1 before any in-place layer touches it (net.cpp, "deep
// copy for inplace forward if data is shared"); without lightmode ncnn runs no layer in place at
// all. Layers that need another layout or storage convert into a new blob as before. Registered
// on CPU nets only (Vulkan nets upload MemoryData once already).
#pragma once

#include <net.h>  // ncnn

#include <cstdint>

namespace ncnnport {

// Registers the overwrite of "MemoryData" on `net`; call before net.load_param.
bool register_memory_data_layer(ncnn::Net& net);

// MemoryData outputs handed on without a copy in this process (a run proves the overwrite ran).
uint64_t memory_data_shares();

}  // namespace ncnnport
