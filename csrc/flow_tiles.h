// Register tiles of the fused exact / grid flow step (csrc/flow.cpp): the projection of a block of particles on a
// chunk of directions (pass a) and the drift accumulated from the residuals (pass c). Included by flow.cpp only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace fastdpot {
namespace flowtile {

constexpr int kIT = 4;  // particles per register tile of the drift
constexpr int kPT = 8;  // particles per register tile of the projection (8 x one 64-byte vector: eight accumulators)

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// rows[j * ld + p] += acc[p][j] for 8 particles p and 16 directions j: the projection tile (particles x directions,
// one 16-float vector per particle) transposed in registers (unpack, shuffle, lane permute: 24 shuffles) instead of
// 128 scalar read-modify-writes.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own _mm512_undefined_* (__m512 __Y = __Y)
static inline void add_transposed_8x16(const float (*acc)[16], float* rows, int64_t ld) {
    __m512 r[8];
    for (int p = 0; p < 8; ++p) r[p] = _mm512_loadu_ps(acc[p]);
    __m512 t[8], u[8];
    for (int q = 0; q < 4; ++q) {  // t[2q], t[2q+1]: particles 2q, 2q+1 interleaved, per 128-bit lane
        t[2 * q] = _mm512_unpacklo_ps(r[2 * q], r[2 * q + 1]);
        t[2 * q + 1] = _mm512_unpackhi_ps(r[2 * q], r[2 * q + 1]);
    }
    for (int h = 0; h < 2; ++h) {  // u[4h + m], lane L: particles 4h .. 4h + 3 of direction 4L + m
        u[4 * h + 0] = _mm512_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm512_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    const __m512i lanes01 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i lanes23 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int m = 0; m < 4; ++m) {
        const __m512 a = _mm512_permutex2var_ps(u[m], lanes01, u[4 + m]);  // directions m | 4 + m
        const __m512 b = _mm512_permutex2var_ps(u[m], lanes23, u[4 + m]);  // directions 8 + m | 12 + m
        const __m256 row[4] = {_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1), _mm512_castps512_ps256(b),
                               _mm512_extractf32x8_ps(b, 1)};
        for (int q = 0; q < 4; ++q) {
            float* dst = rows + (size_t)(4 * q + m) * ld;
            _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), row[q]));
        }
    }
}
#pragma GCC diagnostic pop
#endif

// P[jt + jj][i] += <x_i, θ_{jt + jj}> for i in [i0, i1), jj < jn, with a kPT x JT register tile; thT is the chunk of
// Θ transposed and padded with zeros to a multiple of JT columns (thT[c * cpad + jj]).
template <typename T, int JT>
static inline void project_tile(const T* X, int64_t d, int64_t i0, int64_t i1, const T* thT, int64_t cpad,
                                int64_t jt, int64_t jn, T* P, int64_t N) {
    for (int64_t i = i0; i < i1; i += kPT) {
        const T* xr[kPT];
        for (int ii = 0; ii < kPT; ++ii) xr[ii] = X + std::min(i + ii, i1 - 1) * d;  // tail rows: read, discard
        T acc[kPT][JT] = {};
        for (int64_t c = 0; c < d; ++c) {
            const T* tc = thT + c * cpad + jt;
            for (int ii = 0; ii < kPT; ++ii) {
                const T xv = xr[ii][c];
#pragma omp simd simdlen(JT)
                for (int jj = 0; jj < JT; ++jj) acc[ii][jj] += xv * tc[jj];
            }
        }
        const int64_t ni = std::min<int64_t>(kPT, i1 - i);
#if defined(__AVX512F__) && defined(__AVX512DQ__)
        if constexpr (std::is_same_v<T, float> && kPT == 8 && JT == 16) {
            if (ni == kPT && jn == JT) {  // full tile: transposed in registers, 16 row updates of 8 particles
                add_transposed_8x16(acc, P + (size_t)jt * N + i, N);
                continue;
            }
        }
#endif
        for (int64_t jj = 0; jj < jn; ++jj)
            for (int64_t ii = 0; ii < ni; ++ii) P[(size_t)(jt + jj) * N + i + ii] += acc[ii][jj];
    }
}

// drift_i[c0 + c] (+)= Σ_jj P[jj][i] θ_jj[c0 + c] for i in [i0, i1), c < cn (First: = instead of +=, so the
// drift needs no zero fill); thP is the chunk of Θ padded with zeros to dpad columns (thP[jj * dpad + c]).
template <typename T, int CT, bool First>
static inline void drift_tile(const T* P, int64_t N, int64_t cj, const T* thP, int64_t dpad, int64_t c0, int64_t cn,
                              int64_t i0, int64_t i1, T* D, int64_t d) {
    for (int64_t i = i0; i < i1; i += kIT) {
        const int64_t ni = std::min<int64_t>(kIT, i1 - i);
        T acc[kIT][CT] = {};
        for (int64_t jj = 0; jj < cj; ++jj) {
            const T* tv = thP + jj * dpad + c0;
            const T* pr = P + (size_t)jj * N + i;
            for (int ii = 0; ii < kIT; ++ii) {
                const T r = pr[ii < ni ? ii : 0];
#pragma omp simd simdlen(64 / sizeof(T))
                for (int c = 0; c < CT; ++c) acc[ii][c] += r * tv[c];
            }
        }
        for (int64_t ii = 0; ii < ni; ++ii)
            for (int64_t c = 0; c < cn; ++c) {
                if constexpr (First) D[(i + ii) * d + c0 + c] = acc[ii][c];
                else D[(i + ii) * d + c0 + c] += acc[ii][c];
            }
    }
}

}  // namespace flowtile
}  // namespace fastdpot
