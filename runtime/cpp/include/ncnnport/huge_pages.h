// Backs the weights a CPU net loaded with transparent huge pages (2 MiB) instead of 4 KiB pages.
//
// Why: a decoded token streams every weight once, and on one thread that read is limited by
// address translation as much as by DRAM: with 4 KiB pages the 311 MB fp16 Qwen3-ASR head read at
// ~22 GB/s on an AMD EPYC whose one-thread read (numpy, whose large arrays get huge pages through
// madvise) measured 31 GB/s; an fp16 stream of the head's size, huge vs 4 KiB pages interleaved
// 30 rounds in one process, took 12.6-12.9 vs 13.9-16.5 ms, and the C++ fp16 token at P=100 with
// --huge-pages 16.2-16.3 vs 18.3-18.6 ms (3 interleaved runs). ncnn allocates weights
// with posix_memalign, which gets huge pages only where the system's THP setting is "always";
// the common default is "madvise". So after a net loads, the 2 MiB frames of its anonymous
// mappings of at least `min_bytes` whose 4 KiB pages are all resident (/proc/self/pagemap: nothing
// sparse is filled in, so RSS does not grow) are collapsed into huge pages (madvise MADV_COLLAPSE,
// Linux 6.1+); where the kernel refuses that, they are only marked MADV_HUGEPAGE (khugepaged
// collapses them later). The same rule as the Python runtime's runtime/huge_pages.py.
//
// Collapsing copies every page, ~0.3-0.5 GB/s on the 2-core EPYC VM (2 GB in 6-7 s; qwen3-asr
// real-L4 loaded in 3.5-7 s instead of 1.8-2.3 s), and a background thread did not hide it
// (the collapse holds the address-space lock the loading graphs' allocations wait for). So it is
// opt-in (--huge-pages): it pays off where one load serves many tokens, not for one short run.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace ncnnport {

struct HugePageStep {
    uint64_t collapsed_bytes = 0;  // growth of the process's AnonHugePages over this call
    uint64_t advised_bytes = 0;    // bytes only marked MADV_HUGEPAGE (collapse refused)
    std::string error;             // the first refusal's errno text, empty when none
};

// Collapses the fully resident frames of every private anonymous mapping of >= min_bytes of this
// process (see above), now. Linux only; elsewhere a no-op whose error says so.
HugePageStep back_large_mappings_with_huge_pages(uint64_t min_bytes = 4u << 20);


// What a run's --json-out records under "huge_pages": whether graphs asked for them, the totals
// of every pass so far, the first error, and the process's AnonHugePages (from
// /proc/self/smaps_rollup) when the record is made.
nlohmann::json huge_pages_json(bool enabled);

}  // namespace ncnnport
