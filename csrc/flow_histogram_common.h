// What the passes of the sort-free (histogram) CPU flow step share (csrc/flow_histogram.cpp, the pass headers
// flow_histogram_extremes.h, _counts.h, _transport.h): the register-tiled product, the call's geometry (particles
// with global indices, directions in chunks), the per-thread scratch, the noisy projections of a block of particles,
// the bin geometry of passes 2 and 3, and the table lookups of sketch mode.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common.h"
#include "flow_normal.h"

namespace fastdpot {
namespace hist {

constexpr int64_t BN = 64;                   // particles per block (one aligned batch of 64 smoothing normals)
constexpr double kChunkBytes = 256.0 * 1024;  // per-thread projection buffer (chunk of directions x 64 particles)

// The register tile of the products, sized to the SIMD level the file is compiled for (the accumulators must stay in
// registers: a tile wider than the register file spills every accumulator on every multiply-add):
//   AVX-512 (32 zmm registers): native 64-byte vectors, R x BN accumulators = 16 zmm (float R = 4, double R = 2);
//   AVX2 / AVX / SSE (16 ymm / xmm registers): native 32- / 16-byte vectors, R = 6 rows x 2 vectors of particles
//   = 12 accumulators, + 2 vectors of b and one broadcast of a: 15 registers. (The 64-byte tile of AVX-512 is 32
//   ymm accumulators there: they spilled on every FMA: pass 1 with σ = 0 took 0.35 s instead
//   of 0.04 s at N = 2·10⁵, d = 48, k = 64 on one thread.)
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif

// the SIMD level this file is compiled for (module attribute _C_flow_histogram.simd; the bench rows record it)
constexpr const char* kSimdLevel =
#if defined(__AVX512F__)
    "avx512";
#elif defined(__AVX2__)
    "avx2";
#elif defined(__AVX__)
    "avx";
#elif defined(__SSE4_2__)
    "sse4.2";
#elif defined(__SSE2__)
    "sse2";
#elif defined(__ARM_NEON)
    "neon";
#else
    "none";
#endif

template <typename T>
constexpr int kRows() { return kVecBytes == 64 ? (sizeof(T) == 4 ? 4 : 2) : 6; }  // output rows of the tile
template <typename T>
constexpr int kTileCols() { return kVecBytes == 64 ? (int)BN : 2 * kVecBytes / (int)sizeof(T); }  // particles

// native vectors (GCC vector extensions)
template <typename T> struct Vec;
template <> struct Vec<float> { typedef float type __attribute__((vector_size(kVecBytes))); };
template <> struct Vec<double> { typedef double type __attribute__((vector_size(kVecBytes))); };

// out[r][i] (+)= Σ_p a[p·lda + r] · b[p·BN + i], r < R, i < BN: the register-tiled product used for the projections
// (a = Θᵀ of the chunk, b = the block's particles transposed) and for the drift (a = Θ, b = the residuals), in
// column tiles of kTileCols particles. Every output is the same sum in the same order (p ascending, one multiply-add
// each) whatever the tile, so the AVX2 and AVX-512 builds (both with FMA) compute the same numbers.
template <typename T, int R>
static inline void gemm_rows(const T* __restrict a, int64_t lda, const T* __restrict b, int64_t P, T* __restrict out,
                             bool accumulate) {
    using V = typename Vec<T>::type;
    constexpr int VL = kVecBytes / (int)sizeof(T);  // elements per vector
    constexpr int W = kTileCols<T>();
    constexpr int NV = W / VL;
    static_assert(BN % W == 0 && W % VL == 0, "the column tiles must divide the block");
    for (int w0 = 0; w0 < BN; w0 += W) {
        V acc[R][NV];
        for (int r = 0; r < R; ++r)
            for (int v = 0; v < NV; ++v) {
                if (accumulate) std::memcpy(&acc[r][v], out + r * BN + w0 + v * VL, kVecBytes);
                else acc[r][v] = V{};
            }
        for (int64_t p = 0; p < P; ++p) {
            V bv[NV];
            for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + p * BN + w0 + v * VL, kVecBytes);
            for (int r = 0; r < R; ++r) {
                const V av = a[p * lda + r] - V{};  // a broadcast (x − 0 = x for every x; 0 + x is not, for −0)
                for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
            }
        }
        for (int r = 0; r < R; ++r)
            for (int v = 0; v < NV; ++v) std::memcpy(out + r * BN + w0 + v * VL, &acc[r][v], kVecBytes);
    }
}

// Q_j(u) of a table row (sketch mode), starting the segment search at s0 (a segment at or below u's): the segment
// s with lv[s] <= u < lv[s+1], clamped to [0, L-2], as csrc/flow.cpp's table_at (binary search) finds it.
static inline double table_from(const double* lv, const double* tb, int64_t L, double u, int64_t s) {
    if (L == 1) return tb[0];
    u = u < 0.0 ? 0.0 : (u > 1.0 ? 1.0 : u);
    while (s < L - 2 && lv[s + 1] <= u) ++s;
    return tb[s] + (u - lv[s]) * ((tb[s + 1] - tb[s]) / (lv[s + 1] - lv[s]));
}

static inline int64_t table_segment(const double* lv, int64_t L, double u) {
    if (L == 1) return 0;
    u = u < 0.0 ? 0.0 : (u > 1.0 ? 1.0 : u);
    int64_t s = (int64_t)(std::upper_bound(lv, lv + L, u) - lv) - 1;
    return s < 0 ? 0 : (s > L - 2 ? L - 2 : s);
}

// The shared geometry of a call: particles x (n, d) with global indices off .. off + n − 1, directions Θ (k, d).
template <typename T>
struct Geometry {
    const T* X;
    int64_t n, d, K;
    uint64_t off, seed;
    double noise_std;
    int64_t C;       // directions per chunk
    int64_t cpad;    // C rounded up to the tile rows
    int64_t dpad;    // d rounded up to the tile rows
    int64_t fb, nblocks;
    std::vector<T> thT;  // per chunk: Θ transposed and zero-padded, thT[(chunk)·d·cpad + c·cpad + jj]
    std::vector<T> thP;  // per chunk: Θ zero-padded to dpad columns, thP[(chunk)·cpad·dpad + jj·dpad + c]
    int nthreads;
    // fused step only: the noisy projections materialised (P[j·n + i]) by pass 1 and read back by passes 2 and 3
    // instead of recomputing them (stored == false while pass 1 fills it)
    T* P = nullptr;
    bool stored = false;

    Geometry(const T* X_, int64_t n_, int64_t d_, const T* TH, int64_t K_, uint64_t off_, uint64_t seed_,
             double noise_std_, int64_t max_chunk)
        : X(X_), n(n_), d(d_), K(K_), off(off_), seed(seed_), noise_std(noise_std_) {
        constexpr int R = kRows<T>();
        C = std::max<int64_t>(R, (int64_t)(kChunkBytes / (BN * sizeof(T))));
        if (max_chunk > 0) C = std::min(C, max_chunk);
        C = std::min(C, K);
        cpad = (C + R - 1) / R * R;
        dpad = (d + R - 1) / R * R;
        const int64_t nch = (K + C - 1) / C;
        thT.assign((size_t)(nch * d * cpad), (T)0);
        thP.assign((size_t)(nch * cpad * dpad), (T)0);
        for (int64_t j = 0; j < K; ++j) {
            const int64_t ch = j / C, jj = j % C;
            for (int64_t c = 0; c < d; ++c) {
                thT[(size_t)(ch * d * cpad + c * cpad + jj)] = TH[j * d + c];
                thP[(size_t)(ch * cpad * dpad + jj * dpad + c)] = TH[j * d + c];
            }
        }
        fb = n > 0 ? (int64_t)(off / BN) : 0;
        nblocks = n > 0 ? (int64_t)((off + n - 1) / BN) - fb + 1 : 0;
        // small problems run on one thread: OpenMP barriers cost more than the work
        nthreads = ((double)n * (double)K * (double)(d + 8) < 4.0e6) ? 1 : omp_get_max_threads();
    }
    // local rows [i0, i1) of block b (blocks are aligned to global multiples of BN)
    void block(int64_t b, int64_t& i0, int64_t& i1) const {
        const int64_t g0 = std::max<int64_t>((int64_t)off, (fb + b) * BN);
        const int64_t g1 = std::min<int64_t>((int64_t)off + n, (fb + b + 1) * BN);
        i0 = g0 - (int64_t)off;
        i1 = g1 - (int64_t)off;
    }
};

// Per-thread scratch of a pass: the block's particles transposed (d x BN) and its projections (cpad x BN).
template <typename T>
struct Scratch {
    std::vector<T> xT, S, dT, xi;
};

// dst[c·ldd + r] = src[r·lds + c] · scale for r < rows, c < cols: the transposes between the particles' row-major
// layout and the blocks' (coordinate or direction) x particle layout. Float with AVX2: 8 x 8 tiles transposed in
// registers (8 loads, 24 shuffles, 8 stores for 64 values, where the element-wise loop costs a load and a scattered
// store each: the two transposes of pass 3 were 15 % of its profile on the AVX2 build); the edges element by
// element. Multiplying by the scale is the only arithmetic, the same in both.
template <typename T>
static inline void transpose_scaled(const T* __restrict src, int64_t lds, T* __restrict dst, int64_t ldd, int64_t rows,
                                    int64_t cols, T scale) {
    int64_t r0 = 0;
#if defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {
        const __m256 vs = _mm256_set1_ps(scale);
        int64_t c0 = 0;
        for (r0 = 0; r0 + 8 <= rows; r0 += 8)
            for (c0 = 0; c0 + 8 <= cols; c0 += 8) {
                __m256 a[8], b[8];
                for (int q = 0; q < 8; ++q) a[q] = _mm256_mul_ps(_mm256_loadu_ps(src + (r0 + q) * lds + c0), vs);
                for (int q = 0; q < 8; q += 2) {
                    b[q] = _mm256_unpacklo_ps(a[q], a[q + 1]);
                    b[q + 1] = _mm256_unpackhi_ps(a[q], a[q + 1]);
                }
                for (int q = 0; q < 8; q += 4) {
                    a[q] = _mm256_shuffle_ps(b[q], b[q + 2], 0x44);
                    a[q + 1] = _mm256_shuffle_ps(b[q], b[q + 2], 0xEE);
                    a[q + 2] = _mm256_shuffle_ps(b[q + 1], b[q + 3], 0x44);
                    a[q + 3] = _mm256_shuffle_ps(b[q + 1], b[q + 3], 0xEE);
                }
                // a[0..3]: columns 0, 1, 2, 3 of rows 0-3 | 4-7 of rows 0-3; a[4..7] the same of rows 4-7
                for (int q = 0; q < 4; ++q) {
                    _mm256_storeu_ps(dst + (c0 + q) * ldd + r0, _mm256_permute2f128_ps(a[q], a[4 + q], 0x20));
                    _mm256_storeu_ps(dst + (c0 + 4 + q) * ldd + r0, _mm256_permute2f128_ps(a[q], a[4 + q], 0x31));
                }
            }
        // the edges: columns c0.. of the full row tiles, then the rows r0..
        for (int64_t r = 0; r < r0; ++r)
            for (int64_t c = c0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c] * scale;
    }
#endif
    for (int64_t r = r0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c] * scale;
}

template <typename T>
static inline void load_block(const Geometry<T>& g, int64_t i0, int64_t i1, Scratch<T>& s) {
    const int64_t nb = i1 - i0, d = g.d;
    if ((int64_t)s.xT.size() < d * BN) s.xT.resize((size_t)(d * BN));
    if ((int64_t)s.S.size() < g.cpad * BN) s.S.resize((size_t)(g.cpad * BN));
    T* xT = s.xT.data();
    transpose_scaled(g.X + i0 * d, d, xT, BN, nb, d, (T)1);
    for (int64_t c = 0; c < d; ++c)
        for (int64_t i = nb; i < BN; ++i) xT[c * BN + i] = (T)0;
}

// S[jj][i] = <x_{i0+i}, θ_{j0+jj}> + σ·ξ(2(j0+jj), off + i0 + i) for the chunk starting at j0 (jj < cj; rows up to
// cpad are zero-padded); nx_out (n, K) receives the noise when given.
template <typename T>
static inline void project_chunk(const Geometry<T>& g, int64_t i0, int64_t i1, int64_t j0, int64_t cj, Scratch<T>& s,
                                 T* nx_out) {
    constexpr int R = kRows<T>();
    const int64_t nb = i1 - i0;
    T* S = s.S.data();
    if (g.P && g.stored) {  // read back the materialised projections of pass 1
        for (int64_t jj = 0; jj < cj; ++jj) {
            std::copy(g.P + (size_t)(j0 + jj) * g.n + i0, g.P + (size_t)(j0 + jj) * g.n + i1, S + jj * BN);
            std::fill(S + jj * BN + nb, S + (jj + 1) * BN, (T)0);
        }
        return;
    }
    for (int64_t jj = 0; jj < g.cpad; ++jj) {
        T* row = S + jj * BN;
        if (jj < cj && g.noise_std > 0) {
            flowrng::fill_normal_smooth(row, nb, g.seed, (uint64_t)(2 * (j0 + jj)), g.off + (uint64_t)i0, g.noise_std);
            if (nx_out)
                for (int64_t i = 0; i < nb; ++i) nx_out[(i0 + i) * g.K + j0 + jj] = row[i];
            std::fill(row + nb, row + BN, (T)0);
        } else {
            std::fill(row, row + BN, (T)0);
            if (nx_out && jj < cj)
                for (int64_t i = 0; i < nb; ++i) nx_out[(i0 + i) * g.K + j0 + jj] = (T)0;
        }
    }
    const T* thT = g.thT.data() + (size_t)((j0 / g.C) * g.d * g.cpad);
    for (int64_t jt = 0; jt < cj; jt += R) gemm_rows<T, R>(thT + jt, g.cpad, s.xT.data(), g.d, S + jt * BN, true);
    if (g.P)
        for (int64_t jj = 0; jj < cj; ++jj) std::copy(S + jj * BN, S + jj * BN + nb, g.P + (size_t)(j0 + jj) * g.n + i0);
}

// bin geometry of the reference: width = (hi − lo)/B, 1 for a constant direction; t = (s − lo)/width (here: times
// the reciprocal) clamped to [0, B], b = min(⌊t⌋, B − 1). Passes 2 and 3 use this one function, so every particle
// is counted in the bin that pass 3 reads.
template <typename T>
struct Bins {
    std::vector<T> lo, inv_w;
    int64_t B;
    Bins(const T* mn, const T* mx, int64_t K, int64_t histogram_bins)
        : lo(mn, mn + K), inv_w((size_t)K), B(histogram_bins) {
        for (int64_t j = 0; j < K; ++j) {
            T w = (mx[j] - mn[j]) / (T)B;
            if (!(w > 0)) w = (T)1;
            inv_w[j] = (T)1 / w;
        }
    }
};

template <typename T>
static inline void bin_of(T s, T lo, T iw, int64_t B, int32_t& b, T& frac) {
    const T t = std::min(std::max((s - lo) * iw, (T)0), (T)B);  // the same operations as pass 3's loop
    b = std::min((int32_t)t, (int32_t)(B - 1));
    frac = t - (T)b;
}

}  // namespace hist
}  // namespace fastdpot
