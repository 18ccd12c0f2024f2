// The contiguous run of items OpenMP's schedule(static) would give the calling thread. Why by
// hand: the one-row kernels that read several runs side by side (gemv_layer.cpp's narrow layout,
// int8_gemv_layer.cpp's AVX2 copy) cut each thread's own run into quarters, so the thread must
// know its run's bounds, which an `omp for` loop does not hand out.
#pragma once

#include <algorithm>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ncnnport {

struct StaticRun {
    int begin = 0, end = 0;
};

// Inside `#pragma omp parallel num_threads(threads) if (threads > 1)`: this thread's share of
// `count` items, the first `count % team` threads one item more (schedule(static)'s split); the
// whole range where `threads` <= 1 (the region then runs on one thread) or without OpenMP.
inline StaticRun static_run(int count, int threads) {
#ifdef _OPENMP
    const int team = threads > 1 ? omp_get_num_threads() : 1, me = threads > 1 ? omp_get_thread_num() : 0;
#else
    (void)threads;
    const int team = 1, me = 0;
#endif
    const int per = count / team, extra = count % team;
    const int begin = me * per + std::min(me, extra);
    return {begin, begin + per + (me < extra ? 1 : 0)};
}

}  // namespace ncnnport
