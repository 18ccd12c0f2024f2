// The memory read bandwidth a stream reaches on this machine, read by the kernels' own means: a
// vector sum over a buffer far larger than any cache, plain and with the one-row kernels'
// software prefetch (gemv_prefetch.h: 8 KB ahead into L2, 1 KB into L1). Off x86, where the
// kernels do not prefetch in software, both reads are the plain sum.
//
// Why: bench-cpp's bound is the token's weight bytes over the fastest read measured in the run.
// Its Python reductions (numpy, torch) never prefetch in software, and on the device's Intel Xeon
// the fp16 one-row kernel, prefetching, read its weights at 14.3-16.5 GB/s while the fastest of
// them read 13.8: the C++ token then read 103 % of a bound, which is what a bound must never be
// (a runtime can only exceed a bound that was measured too low). The bench now also runs this
// probe (`ncnnport-cpp read-bandwidth`) at the run's thread count and takes the fastest of all.
//
// A third read prefetches at half the kernels' distances (4 KB into L2, 512 B into L1). Why: the
// best distance is the machine's. A standalone copy of the fp16 kernel's stream (311 MB, 1 thread,
// medians of 15) read 19.0 GB/s at the half distances and 17.8 at the kernels' on this project's
// 2-core Xeon VM (plain 17.1), and this probe's sum 20.8-21.9 against 18.8-19.1; on the device's
// Xeon the kernels' distances read faster (14.2-14.8 against 13.4-14.6; 4 threads 67.7 against
// 62.3). A bound read only at the kernels' distance would be too low where the other is better.
//
// A fourth reads four quarters of the buffer side by side, one line of each in turn: the pattern
// of the int8 kernel's streamed variant. Why: on an AVX2-only EPYC four such streams read 20-22
// GB/s where one read 13-15, so a kernel reading that way must not be judged against one stream.
#pragma once

#include <cstddef>
#include <string>

namespace ncnnport {

struct ReadProbe {
    double plain_gbps = 0.0;     // median over the runs, 1e9 bytes per second
    double prefetch_gbps = 0.0;  // the same with the kernels' software prefetch
    double prefetch_near_gbps = 0.0;  // the same prefetching at half the kernels' distances
    double streams4_gbps = 0.0;  // plain, four quarters of each thread's part side by side
    std::string isa;             // "avx512", "avx2" or "scalar": the sum's registers
};

// `bytes` (rounded down to whole 64-byte lines, at least one) read `runs` times by each variant,
// alternating, on `threads` threads (OpenMP, one contiguous part each), after one untimed pass
// of each; the buffer is 2 MiB-aligned and advised for huge pages, as the kernels' weights are
// (kernel_weight_allocator.h). Throws std::bad_alloc when the buffer cannot be had.
ReadProbe measure_read_bandwidth(size_t bytes, int runs, int threads);

}  // namespace ncnnport
