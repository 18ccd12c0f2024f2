// The allocator of the decoder's K/V cache (kv_cache.h): every block its own mapping, 2 MiB-aligned
// and marked MADV_HUGEPAGE before anything is written, unmapped when freed.
//
// Why: a decode step streams each layer's past K and V once (8 heads x P rows x 512 bytes per
// Qwen3-ASR layer: 4 MB per product at P = 1000). ncnn's posix_memalign gives such a block 4 KiB
// pages where the system's THP setting is "madvise" (the common default), and the hardware
// prefetchers stop at every 4 KiB page. Measured on a 2-core Intel Xeon VM (one thread, C++ fp16
// token of qwen3-asr real-L4 at P=1000, 2 runs of each, alternating): decode layer 3.22-3.26 ms
// with 4 KiB pages, 3.17-3.18 with huge pages, 3.02-3.04 with the attention kernels' prefetch
// alone (matmul_layer.cpp), 2.88-2.99 with both (runtime/cpp/README.md, "Decode attention").
// Unlike the weight arena (kernel_weight_allocator.h), whose addresses are never reused, a cache
// is made per generation, so its mapping goes back to the system whole when the cache is freed.
// Off Linux, or where mmap is refused, a request takes ncnn's aligned allocation.
#pragma once

#include <allocator.h>  // ncnn

#include <cstdint>

namespace ncnnport {

// The process-wide allocator (never destroyed: Mats it allocated may outlive any static).
ncnn::Allocator* huge_page_allocator();

// The most bytes of blocks on its own mappings live at once so far in this process (0 where every
// request fell back to ncnn's allocation).
uint64_t huge_page_allocator_peak_bytes();

}  // namespace ncnnport
