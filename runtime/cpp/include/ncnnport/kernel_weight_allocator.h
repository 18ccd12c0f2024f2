// The allocator of the weight copies ncnnport's layer overwrites keep (int8_gemv_layer.h,
// gemv_layer.h): one arena, a 64 GiB address range reserved once (MAP_NORESERVE: pages exist
// only once written), 2 MiB-aligned and marked MADV_HUGEPAGE before anything is written, from
// which the copies are cut one after another in the order the graphs create them.
//
// Why: a decode step streams those copies once per token, in the order they were created (the
// layers of one graph, then the next graph). With 4 KiB pages the read is limited by address
// translation as much as by DRAM, and every separately allocated matrix restarts the hardware
// prefetcher. In the arena the kernel backs the copies with huge pages as the overwrite fills them
// (nothing is copied again, unlike --huge-pages, huge_pages.h, which collapses ncnn's filled
// weights: seconds of load), and a token's weights are one address-ordered stream.
// Measured (qwen3-asr real-L4 package-int8w, one EPYC thread, 3 interleaved runs, C++ ms per
// token P=100 / P=1000): ncnn's allocation 12.0-12.3 / 13.1-17.1; one huge-page mapping per copy
// of >= 4 MiB 9.0-9.7 / 11.4-12.6; the arena 8.1-8.4 / 10.5-11.3. Load time unchanged; peak RSS
// +46 MB at P=100 (the freed raw weights stay in malloc's free lists instead of holding the copies).
// A freed copy gives its whole 4 KiB pages back (MADV_DONTNEED); its addresses are not reused.
// Off Linux, or where the reservation is refused, every request takes ncnn's aligned allocation.
#pragma once

#include <allocator.h>  // ncnn

#include <cstdint>

namespace ncnnport {

// The process-wide allocator (never destroyed: Mats it allocated may outlive any static).
ncnn::Allocator* kernel_weight_allocator();

// Bytes of live copies in the arena now (what a run reports; 0 where the arena was refused).
uint64_t kernel_weight_huge_bytes();

}  // namespace ncnnport
