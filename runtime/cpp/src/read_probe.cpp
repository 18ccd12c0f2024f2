#include "ncnnport/read_probe.h"

#include "ncnnport/gemv_prefetch.h"
#include "ncnnport/stats.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
// GCC 12's AVX-512 headers build several intrinsics on _mm512_undefined_*(), which its
// -Wmaybe-uninitialized / -Wuninitialized flag once inlined (GCC bug 105593): silenced for this
// file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define NCNNPORT_PROBE_X86 1
#else
#define NCNNPORT_PROBE_X86 0
#endif

namespace ncnnport {

namespace {

constexpr size_t kLine = 64;
constexpr size_t kAlign = 2u << 20;

#if NCNNPORT_PROBE_X86
// Sum of the floats of [p, p + bytes), four 64-byte lines per step (bytes: whole lines): four
// independent accumulators, so the adds never wait on each other and the loads set the pace.
// The software prefetch of a read variant: 0 none, 1 the kernels' far distances, 2 the near ones
// (gemv_prefetch.h's kFarPrefetch / kNearPrefetch, the two the kernels choose between).
template <int Variant>
inline void probe_prefetch(const char* at, size_t bytes) {
    if (Variant == 1) prefetch_stream_step(at, bytes, kFarPrefetch.far, kFarPrefetch.near);
    if (Variant == 2) prefetch_stream_step(at, bytes, kNearPrefetch.far, kNearPrefetch.near);
}

template <int Variant>
__attribute__((target("avx512f"))) float sum_avx512(const char* p, size_t bytes) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * kLine <= bytes; i += 4 * kLine) {
        probe_prefetch<Variant>(p + i, 4 * kLine);
        a0 = _mm512_add_ps(a0, _mm512_load_ps(reinterpret_cast<const float*>(p + i)));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(reinterpret_cast<const float*>(p + i + kLine)));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(reinterpret_cast<const float*>(p + i + 2 * kLine)));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(reinterpret_cast<const float*>(p + i + 3 * kLine)));
    }
    for (; i < bytes; i += kLine) a0 = _mm512_add_ps(a0, _mm512_load_ps(reinterpret_cast<const float*>(p + i)));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// The sum of 8 accumulators' lanes.
__attribute__((target("avx2"))) inline float reduce_avx2(__m256 (&a)[8]) {
    alignas(32) float lanes[8];
    for (int j = 1; j < 8; ++j) a[0] = _mm256_add_ps(a[0], a[j]);
    _mm256_store_ps(lanes, a[0]);
    float s = 0.f;
    for (float v : lanes) s += v;
    return s;
}

template <int Variant>
__attribute__((target("avx2"))) float sum_avx2(const char* p, size_t bytes) {
    __m256 a[8];
    for (auto& v : a) v = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 4 * kLine <= bytes; i += 4 * kLine) {
        probe_prefetch<Variant>(p + i, 4 * kLine);
        for (int j = 0; j < 8; ++j) a[j] = _mm256_add_ps(a[j], _mm256_load_ps(reinterpret_cast<const float*>(p + i + 32 * j)));
    }
    for (; i < bytes; i += 32) a[0] = _mm256_add_ps(a[0], _mm256_load_ps(reinterpret_cast<const float*>(p + i)));
    return reduce_avx2(a);
}

// The plain sum of 4 quarters of [p, p + bytes) read side by side, one line of each in turn (bytes:
// whole lines; the lines past the last whole quarter-line plainly): the pattern of the int8
// kernel's streamed variant (int8_gemv_streams_choice), which on an AVX2-only EPYC read faster
// than one stream (four 20-22 GB/s, one 13-15).
__attribute__((target("avx512f"))) float sum4_avx512(const char* p, size_t bytes) {
    const size_t quarter = bytes / kLine / 4 * kLine;
    __m512 a[4];
    for (auto& v : a) v = _mm512_setzero_ps();
    for (size_t i = 0; i < quarter; i += kLine)
        for (int s = 0; s < 4; ++s) a[s] = _mm512_add_ps(a[s], _mm512_load_ps(reinterpret_cast<const float*>(p + s * quarter + i)));
    for (size_t i = 4 * quarter; i < bytes; i += kLine) a[0] = _mm512_add_ps(a[0], _mm512_load_ps(reinterpret_cast<const float*>(p + i)));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}

__attribute__((target("avx2"))) float sum4_avx2(const char* p, size_t bytes) {
    const size_t quarter = bytes / kLine / 4 * kLine;
    __m256 a[8];
    for (auto& v : a) v = _mm256_setzero_ps();
    for (size_t i = 0; i < quarter; i += kLine)
        for (int s = 0; s < 4; ++s)
            for (int h = 0; h < 2; ++h)
                a[2 * s + h] = _mm256_add_ps(a[2 * s + h], _mm256_load_ps(reinterpret_cast<const float*>(p + s * quarter + i + 32 * h)));
    for (size_t i = 4 * quarter; i < bytes; i += 32) a[0] = _mm256_add_ps(a[0], _mm256_load_ps(reinterpret_cast<const float*>(p + i)));
    return reduce_avx2(a);
}
#endif

template <int Variant>
float sum_scalar(const char* p, size_t bytes) {
    const auto* f = reinterpret_cast<const float*>(p);
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    for (size_t i = 0; i + 4 <= bytes / sizeof(float); i += 4) {
        s0 += f[i];
        s1 += f[i + 1];
        s2 += f[i + 2];
        s3 += f[i + 3];
    }
    return (s0 + s1) + (s2 + s3);
}

enum class Isa { Avx512, Avx2, Scalar };

Isa best_isa() {
#if NCNNPORT_PROBE_X86
    if (__builtin_cpu_supports("avx512f")) return Isa::Avx512;
    if (__builtin_cpu_supports("avx2")) return Isa::Avx2;
#endif
    return Isa::Scalar;
}

// Variants 0-2: one stream (plain, far prefetch, near prefetch); 3: four streams side by side.
template <int Variant>
float sum_part(Isa isa, const char* p, size_t bytes) {
#if NCNNPORT_PROBE_X86
    if (Variant == 3 && isa == Isa::Avx512) return sum4_avx512(p, bytes);
    if (Variant == 3 && isa == Isa::Avx2) return sum4_avx2(p, bytes);
    if (isa == Isa::Avx512) return sum_avx512<Variant>(p, bytes);
    if (isa == Isa::Avx2) return sum_avx2<Variant>(p, bytes);
#endif
    (void)isa;
    return sum_scalar<Variant>(p, bytes);
}

// One pass over the buffer on `threads` threads; seconds. `sink` keeps the sums observable.
template <int Variant>
double timed_pass(Isa isa, const char* p, size_t bytes, int threads, volatile float& sink) {
    const size_t lines = bytes / kLine;
    float total = 0.f;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total) if (threads > 1)
    for (int t = 0; t < threads; ++t) {
        const size_t l0 = lines * t / threads, l1 = lines * (t + 1) / threads;
        total += sum_part<Variant>(isa, p + l0 * kLine, (l1 - l0) * kLine);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + total;
    return s;
}

struct Buffer {
    char* data = nullptr;
    ~Buffer() { std::free(data); }
};

}  // namespace

ReadProbe measure_read_bandwidth(size_t bytes, int runs, int threads) {
    bytes = std::max(kLine, bytes / kLine * kLine);
    runs = std::max(1, runs);
    threads = std::max(1, threads);
    Buffer buf;
    const size_t alloc = (bytes + kAlign - 1) / kAlign * kAlign;
    buf.data = static_cast<char*>(std::aligned_alloc(kAlign, alloc));
    if (!buf.data) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(buf.data, alloc, MADV_HUGEPAGE);  // best effort, as the weight arena asks
#endif
    // every page written: no first-touch faults in the timing
    std::fill(reinterpret_cast<float*>(buf.data), reinterpret_cast<float*>(buf.data + alloc), 1.f);
    const Isa isa = best_isa();
    volatile float sink = 0.f;
    using Pass = double (*)(Isa, const char*, size_t, int, volatile float&);
    constexpr int kVariants = 4;
    const Pass passes[kVariants] = {timed_pass<0>, timed_pass<1>, timed_pass<2>, timed_pass<3>};
    for (Pass pass : passes) pass(isa, buf.data, bytes, threads, sink);
    std::vector<double> gbps[kVariants];
    for (int r = 0; r < runs; ++r) {
        // rotate which goes first, so a drift in the machine's load hits every variant alike
        for (int i = 0; i < kVariants; ++i) {
            const int v = (r + i) % kVariants;
            gbps[v].push_back(bytes / passes[v](isa, buf.data, bytes, threads, sink) / 1e9);
        }
    }
    ReadProbe out;
    out.plain_gbps = median(gbps[0]);
    out.prefetch_gbps = median(gbps[1]);
    out.prefetch_near_gbps = median(gbps[2]);
    out.streams4_gbps = median(gbps[3]);
    out.isa = isa == Isa::Avx512 ? "avx512" : isa == Isa::Avx2 ? "avx2" : "scalar";
    return out;
}

}  // namespace ncnnport
