#include "ncnnport/matmul_many_rows_avx2.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define NCNNPORT_MANY_ROWS_X86 1
#else
#define NCNNPORT_MANY_ROWS_X86 0
#endif

namespace ncnnport {

#if NCNNPORT_MANY_ROWS_X86
namespace {

#define MANY_ROWS_TARGET __attribute__((target("avx2,fma")))

// A tile is up to kTileRows rows by kTileCols outputs: 12 accumulators, the two operand vectors
// and a broadcast in the 16 registers.
constexpr int kTileRows = 6;
constexpr int kTileCols = 16;
// A weighted sum's chunk of cache rows: 64 rows (128 KB at Youtu-VL's 512-wide latent, inside L2),
// as for the 16-lane kernels.
constexpr int kChunkRows = 64;

// The 64-byte lines of a block of rows (`per_row` lines from each row start, rows `stride` bytes
// apart), handed out one at a time in address order: the next block a tile prefetches while it
// computes, a few lines per k.
struct LineWalk {
    const char* row = nullptr;
    size_t stride = 0;
    int per_row = 1;
    int col = 0;
    long left = 0;  // lines not yet handed out

    const char* next() {
        const char* p = row + 64 * static_cast<size_t>(col);
        if (++col == per_row) {
            col = 0;
            row += stride;
        }
        --left;
        return p;
    }
};

// Which of a tile's 16 outputs are real (the first `cols`), as the two vectors' lane masks.
struct ColMask {
    __m256i lo, hi;
};

MANY_ROWS_TARGET inline ColMask col_mask(int cols) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return {_mm256_cmpgt_epi32(_mm256_set1_epi32(cols), lane), _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - 8), lane)};
}

template <bool Masked>
MANY_ROWS_TARGET inline __m256 load8(const float* p, __m256i mask) {
    return Masked ? _mm256_maskload_ps(p, mask) : _mm256_loadu_ps(p);
}

template <bool Masked>
MANY_ROWS_TARGET inline void store8(float* p, __m256i mask, __m256 v) {
    if (Masked) _mm256_maskstore_ps(p, mask, v);
    else _mm256_storeu_ps(p, v);
}

// Rows [0, R) of a (rows `as` floats apart) against b's rows k in [k0, k1) (each `bs` floats
// apart, 16 outputs wide, the first `cols` of them real when Masked) into out (rows `os` apart):
// from zero when `first`, else on from the partial sums in out (a stored float reloads exactly,
// so every output stays one chain over k ascending). Prefetches `fetch` lines of `walk`, one per k.
template <int R, bool Masked>
MANY_ROWS_TARGET void tile(const float* a, size_t as, const float* b, size_t bs, int k0, int k1, float* out, size_t os,
                           bool first, ColMask mask, LineWalk& walk, int fetch) {
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) {
        acc[r][0] = first ? _mm256_setzero_ps() : load8<Masked>(out + r * os, mask.lo);
        acc[r][1] = first ? _mm256_setzero_ps() : load8<Masked>(out + r * os + 8, mask.hi);
    }
    for (int k = k0; k < k1; ++k) {
        if (fetch > 0) {
            _mm_prefetch(walk.next(), _MM_HINT_T1);
            --fetch;
        }
        const float* bk = b + static_cast<size_t>(k) * bs;
        const __m256 x0 = load8<Masked>(bk, mask.lo), x1 = load8<Masked>(bk + 8, mask.hi);
        for (int r = 0; r < R; ++r) {
            const __m256 s = _mm256_broadcast_ss(a + r * as + k);
            acc[r][0] = _mm256_fmadd_ps(s, x0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(s, x1, acc[r][1]);
        }
    }
    for (int r = 0; r < R; ++r) {
        store8<Masked>(out + r * os, mask.lo, acc[r][0]);
        store8<Masked>(out + r * os + 8, mask.hi, acc[r][1]);
    }
}

template <bool Masked>
MANY_ROWS_TARGET void tile_rows(int rows, const float* a, size_t as, const float* b, size_t bs, int k0, int k1, float* out, size_t os,
                                bool first, ColMask mask, LineWalk& walk, int fetch) {
    switch (rows) {
    case 6: tile<6, Masked>(a, as, b, bs, k0, k1, out, os, first, mask, walk, fetch); break;
    case 5: tile<5, Masked>(a, as, b, bs, k0, k1, out, os, first, mask, walk, fetch); break;
    case 4: tile<4, Masked>(a, as, b, bs, k0, k1, out, os, first, mask, walk, fetch); break;
    case 3: tile<3, Masked>(a, as, b, bs, k0, k1, out, os, first, mask, walk, fetch); break;
    case 2: tile<2, Masked>(a, as, b, bs, k0, k1, out, os, first, mask, walk, fetch); break;
    default: tile<1, Masked>(a, as, b, bs, k0, k1, out, os, first, mask, walk, fetch); break;
    }
}

// One tile of 16 outputs (`cols` of them real) for every row of a: the rows cut into as few
// slivers of at most kTileRows as there can be, as even as can be (32 rows: 5 5 6 5 5 6). Each
// sliver takes its share of the walk's lines.
MANY_ROWS_TARGET void tiles_over_rows(int M, const float* a, size_t as, const float* b, size_t bs, int k0, int k1, float* out, size_t os,
                                      bool first, int cols, LineWalk& walk, long fetch_lines) {
    const int slivers = (M + kTileRows - 1) / kTileRows;
    const ColMask mask = col_mask(cols);
    const long share = (fetch_lines + slivers - 1) / slivers;
    for (int s = 0; s < slivers; ++s) {
        const int m0 = M * s / slivers, m1 = M * (s + 1) / slivers;
        const int fetch = static_cast<int>(std::min(share, walk.left));
        const float* as_ = a + static_cast<size_t>(m0) * as;
        float* os_ = out + static_cast<size_t>(m0) * os;
        if (cols == kTileCols) tile_rows<false>(m1 - m0, as_, as, b, bs, k0, k1, os_, os, first, mask, walk, fetch);
        else tile_rows<true>(m1 - m0, as_, as, b, bs, k0, k1, os_, os, first, mask, walk, fetch);
    }
}

// 8 rows of 8 floats (v[i] = row i) to 8 columns (v[j] = element j of every row).
MANY_ROWS_TARGET inline void transpose8(__m256 (&v)[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    v[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    v[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    v[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    v[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    v[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    v[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    v[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    v[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Cache rows [0, cols) of c (K floats each) into the panel p, k-major: p[k * 16 + l] = c[l * K + k],
// zeros past cols (their outputs are never stored). Copies, so exact.
MANY_ROWS_TARGET void pack_panel(const float* c, int K, int cols, float* p) {
    if (cols < kTileCols) {
        for (int k = 0; k < K; ++k)
            for (int l = 0; l < kTileCols; ++l) p[static_cast<size_t>(k) * kTileCols + l] = l < cols ? c[static_cast<size_t>(l) * K + k] : 0.f;
        return;
    }
    const int K8 = K - K % 8;
    for (int l0 = 0; l0 < kTileCols; l0 += 8) {
        const float* rows = c + static_cast<size_t>(l0) * K;
        for (int k = 0; k < K8; k += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_ps(rows + static_cast<size_t>(i) * K + k);
            transpose8(v);
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(p + static_cast<size_t>(k + i) * kTileCols + l0, v[i]);
        }
        for (int k = K8; k < K; ++k)
            for (int i = 0; i < 8; ++i) p[static_cast<size_t>(k) * kTileCols + l0 + i] = rows[static_cast<size_t>(i) * K + k];
    }
}

}  // namespace

void many_rows_scores_avx2(int M, const float* q, int K, const float* c, int n0, int n1, float* out, int N) {
    // the panel is per thread and kept across calls (36 KB at Youtu-VL's 576-wide keys)
    thread_local std::vector<float> panel;
    panel.resize(static_cast<size_t>(K) * kTileCols);
    const size_t row_bytes = static_cast<size_t>(K) * sizeof(float);
    for (int n = n0; n < n1; n += kTileCols) {
        const int cols = std::min(kTileCols, n1 - n);
        pack_panel(c + static_cast<size_t>(n) * K, K, cols, panel.data());
        // the next panel's rows (one contiguous block) are prefetched while this one's tiles run
        const int next_rows = std::max(0, std::min(kTileCols, n1 - n - kTileCols));
        LineWalk walk;
        walk.row = reinterpret_cast<const char*>(c + static_cast<size_t>(n + kTileCols) * K);
        walk.per_row = static_cast<int>((next_rows * row_bytes + 63) / 64);
        walk.stride = 64 * static_cast<size_t>(walk.per_row);
        walk.left = next_rows > 0 ? walk.per_row : 0;
        tiles_over_rows(M, q, K, panel.data(), kTileCols, 0, K, out + n, N, true, cols, walk, walk.left);
    }
}

void many_rows_weighted_avx2(int M, const float* w, int K, const float* v, int J, int j0, int j1, float* out) {
    if (j1 <= j0) return;
    const size_t row_bytes = static_cast<size_t>(J) * sizeof(float);
    // the lines of columns [j0, j1) of cache rows [k0, k1): one more than they span, so a start
    // inside a line is covered
    auto block = [&](int k0, int k1) {
        LineWalk walk;
        walk.row = reinterpret_cast<const char*>(v + static_cast<size_t>(k0) * J + j0);
        walk.stride = row_bytes;
        walk.per_row = static_cast<int>((static_cast<size_t>(j1 - j0) * sizeof(float) + 63) / 64 + 1);
        walk.left = static_cast<long>(std::max(0, k1 - k0)) * walk.per_row;
        return walk;
    };
    {
        LineWalk first = block(0, std::min(K, kChunkRows));
        while (first.left > 0) _mm_prefetch(first.next(), _MM_HINT_T1);
    }
    const int strips = (j1 - j0 + kTileCols - 1) / kTileCols;
    for (int k0 = 0; k0 < K; k0 += kChunkRows) {
        const int k1 = std::min(K, k0 + kChunkRows);
        LineWalk walk = block(k1, std::min(K, k1 + kChunkRows));
        const long per_strip = (walk.left + strips - 1) / strips;
        for (int j = j0; j < j1; j += kTileCols)
            tiles_over_rows(M, w, K, v + j, J, k0, k1, out + j, J, k0 == 0, std::min(kTileCols, j1 - j), walk, per_strip);
    }
}

#endif  // NCNNPORT_MANY_ROWS_X86: elsewhere nothing calls these (matmul_layer.cpp's overwrite is x86 only)

}  // namespace ncnnport
