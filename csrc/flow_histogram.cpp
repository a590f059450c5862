// Sort-free (histogram) CPU step of the (DP) sliced-Wasserstein particle flow -- Sebag et al., TMLR; the semantics are
// fastdpot/reference/flow.py's quantiles="histogram" (a table target included), the GPU twin kernels/histogram.py.
// The quantities keep their Python names: noise_std σ, step_size h, diffusion λ, histogram_bins B.
//
// The particle CDF of direction j is the piecewise-linear CDF of a B-bin histogram of the noisy projections
// s_ij = <x_i, θ_j> + σ·ξ_ij on [lo_j, hi_j] = [min_i s_ij, max_i s_ij]:
//   t = (s − lo_j)/w_j clamped to [0, B], b = min(⌊t⌋, B − 1), u = (C_jb + (t − b)·n_jb)/N,
// with n_jb the particles in bin b and C_jb those below; the target is the private quantile at level u (linear
// interpolation at position u(M−1) of the sorted noisy private projections) or, in sketch mode, Q_j(u) of a (k, L)
// quantile table (piecewise linear through (levels[l], table[j, l]), end segments extended, u clamped to [0, 1]).
//
// Nothing of size N·k is stored: every pass recomputes the projections of a block of 64 particles for a chunk of
// directions into a per-thread (chunk x 64) buffer (direction-major, one SIMD row of particles per direction), then
//   pass 1 (hist_minmax):    min / max of every direction;
//   pass 2 (hist_counts):    counts of the B bins of [lo_j, hi_j] (per-thread tables, summed);
//   pass 3 (hist_transport): level u through the given global counts, target, residual s − T in place, drift
//                            accumulated over the chunks (a (d x 64) register-tiled product), then drift /= k and
//                            the Euler--Maruyama update x − h·drift + sqrt(2λh)·ξ of the block.
// The fused hist_flow_step runs 1, 2, the private targets (hist_private_targets) and 3. The passes are exposed so a
// caller whose particles are sharded over processes can all-reduce min/max (after 1) and the counts (after 2); see
// the module docstring at the bottom for the contract.
//
// Noise: exactly the conventions of csrc/flow.cpp, keyed by GLOBAL particle index g = index_offset + i:
//   particle smoothing noise of direction j: stream 2j, element g (flow_normal.h's four-per-block normals);
//   private noise of direction j: stream 2j + 1, element m (privacy-grade two-per-block normals, 64-bit radius);
//   Brownian term: stream 2k, element g·d + c.
// A shard of rows [off, off + n) therefore draws exactly what those rows draw inside the whole array, and blocks are
// aligned to global multiples of 64 so that every 64-particle draw is one aligned Philox batch. Results do not depend
// on the number of threads; the chunking of directions only changes the summation order of the drift.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common.h"
#include "flow_normal.h"

namespace py = pybind11;
using namespace fastdpot;

namespace {

constexpr int64_t BN = 64;                   // particles per block (one aligned batch of 64 smoothing normals)
constexpr double kChunkBytes = 256.0 * 1024;  // per-thread projection buffer (chunk of directions x 64 particles)
constexpr double kMaterializeBytes = 0.0;     // auto: never (recomputing measured as fast or faster; see docs/flows.md)

template <typename T>
constexpr int kRows() { return sizeof(T) == 4 ? 4 : 2; }  // output rows of the register tile (16 zmm accumulators)

// 64-byte vectors (GCC vector extensions): one AVX-512 register, or two / four narrower ones
template <typename T> struct Vec;
template <> struct Vec<float> { typedef float type __attribute__((vector_size(64))); };
template <> struct Vec<double> { typedef double type __attribute__((vector_size(64))); };

// out[r][i] (+)= Σ_p a[p·lda + r] · b[p·BN + i], r < R, i < BN: the register-tiled product used for the projections
// (a = Θᵀ of the chunk, b = the block's particles transposed) and for the drift (a = Θ, b = the residuals). The
// R x BN accumulators are R·BN·sizeof(T)/64 = 16 vector registers (explicit vectors: GCC keeps them in registers).
template <typename T, int R>
static inline void gemm_rows(const T* __restrict a, int64_t lda, const T* __restrict b, int64_t P, T* __restrict out,
                             bool accumulate) {
    using V = typename Vec<T>::type;
    constexpr int NV = (int)(BN * sizeof(T) / 64);
    V acc[R][NV];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) {
            if (accumulate) std::memcpy(&acc[r][v], out + r * BN + v * (64 / sizeof(T)), 64);
            else acc[r][v] = V{} ;
        }
    for (int64_t p = 0; p < P; ++p) {
        V bv[NV];
        for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + p * BN + v * (64 / sizeof(T)), 64);
        for (int r = 0; r < R; ++r) {
            const V av = V{} + a[p * lda + r];
            for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) std::memcpy(out + r * BN + v * (64 / sizeof(T)), &acc[r][v], 64);
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

template <typename T>
static inline void load_block(const Geometry<T>& g, int64_t i0, int64_t i1, Scratch<T>& s) {
    const int64_t nb = i1 - i0, d = g.d;
    if ((int64_t)s.xT.size() < d * BN) s.xT.resize((size_t)(d * BN));
    if ((int64_t)s.S.size() < g.cpad * BN) s.S.resize((size_t)(g.cpad * BN));
    T* xT = s.xT.data();
    for (int64_t i = 0; i < nb; ++i)
        for (int64_t c = 0; c < d; ++c) xT[c * BN + i] = g.X[(i0 + i) * d + c];
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

// ------------------------------------------------------------------------------------------------------------
// pass 1: min / max of every noisy projected direction
// ------------------------------------------------------------------------------------------------------------
template <typename T>
void minmax_impl(const Geometry<T>& g, T* out_min, T* out_max, T* nx_out) {
    const int64_t K = g.K;
    std::vector<T> mn((size_t)(g.nthreads * K), std::numeric_limits<T>::infinity());
    std::vector<T> mx((size_t)(g.nthreads * K), -std::numeric_limits<T>::infinity());
#pragma omp parallel num_threads(g.nthreads)
    {
        Scratch<T> s;
        T* tmn = mn.data() + (size_t)omp_get_thread_num() * K;
        T* tmx = mx.data() + (size_t)omp_get_thread_num() * K;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < g.nblocks; ++b) {
            int64_t i0, i1;
            g.block(b, i0, i1);
            const int64_t nb = i1 - i0;
            load_block(g, i0, i1, s);
            for (int64_t j0 = 0; j0 < K; j0 += g.C) {
                const int64_t cj = std::min(g.C, K - j0);
                project_chunk(g, i0, i1, j0, cj, s, nx_out);
                for (int64_t jj = 0; jj < cj; ++jj) {
                    const T* row = s.S.data() + jj * BN;
                    T a = tmn[j0 + jj], z = tmx[j0 + jj];
                    for (int64_t i = 0; i < nb; ++i) { a = std::min(a, row[i]); z = std::max(z, row[i]); }
                    tmn[j0 + jj] = a;
                    tmx[j0 + jj] = z;
                }
            }
        }
    }
    for (int64_t j = 0; j < K; ++j) {
        T a = std::numeric_limits<T>::infinity(), z = -std::numeric_limits<T>::infinity();
        for (int t = 0; t < g.nthreads; ++t) { a = std::min(a, mn[t * K + j]); z = std::max(z, mx[t * K + j]); }
        out_min[j] = a;
        out_max[j] = z;
    }
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

// ------------------------------------------------------------------------------------------------------------
// pass 2: counts of the B bins of every direction
// ------------------------------------------------------------------------------------------------------------
template <typename T>
void counts_impl(const Geometry<T>& g, const Bins<T>& bins, int64_t* out_counts) {
    const int64_t K = g.K, B = bins.B;
    std::vector<uint32_t> cnt((size_t)(g.nthreads * K * B), 0u);
#pragma omp parallel num_threads(g.nthreads)
    {
        Scratch<T> s;
        uint32_t* tc = cnt.data() + (size_t)omp_get_thread_num() * K * B;
        std::vector<int32_t> bb(BN);
        std::vector<T> fr(BN);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < g.nblocks; ++b) {
            int64_t i0, i1;
            g.block(b, i0, i1);
            const int64_t nb = i1 - i0;
            load_block(g, i0, i1, s);
            for (int64_t j0 = 0; j0 < K; j0 += g.C) {
                const int64_t cj = std::min(g.C, K - j0);
                project_chunk<T>(g, i0, i1, j0, cj, s, (T*)nullptr);
                for (int64_t jj = 0; jj < cj; ++jj) {
                    const int64_t j = j0 + jj;
                    const T* row = s.S.data() + jj * BN;
                    const T lo = bins.lo[j], iw = bins.inv_w[j];
#pragma omp simd
                    for (int i = 0; i < BN; ++i) bin_of(row[i], lo, iw, B, bb[i], fr[i]);
                    uint32_t* cj_ = tc + j * B;
                    for (int64_t i = 0; i < nb; ++i) ++cj_[bb[i]];
                }
            }
        }
    }
    for (int64_t e = 0; e < K * B; ++e) {
        int64_t v = 0;
        for (int t = 0; t < g.nthreads; ++t) v += cnt[(size_t)t * K * B + e];
        out_counts[e] = v;
    }
}

// ------------------------------------------------------------------------------------------------------------
// the target: sorted noisy private projections of every direction (privacy-grade noise, stream 2j + 1)
// ------------------------------------------------------------------------------------------------------------
template <typename T>
void private_targets_impl(const T* Y, int64_t M, int64_t d, const T* TH, int64_t K, double noise_std, uint64_t seed,
                          T* out_sorted, T* ny_out) {
    const int nthreads = ((double)M * (double)K * (double)d < 1.0e6) ? 1 : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t j = 0; j < K; ++j) {
        flowrng::sorted_noisy_private_projections(Y, M, d, TH + j * d, K, j, noise_std, seed, out_sorted + j * M, ny_out);
    }
}

// ------------------------------------------------------------------------------------------------------------
// pass 3: level through the global counts, target, drift, Euler--Maruyama update
// ------------------------------------------------------------------------------------------------------------
template <typename T>
struct Target {
    const T* q = nullptr;       // sorted private projections (k, M), or
    int64_t M = 0;
    const double* tb = nullptr;  // a (k, L) table at levels lv (sketch mode)
    const double* lv = nullptr;
    int64_t L = 0;
};

#if defined(__AVX512F__)
// Pass 3's map of one row of 64 float32 projections (AVX-512): the operations of the generic loop in transport_impl,
// but each lookup of a (value, next value) pair is ONE 64-bit gather: bc[b] = (C_b, n_b) and qp[l] = (q[l], q[l+1])
// (half the gathered elements of four 32-bit gathers; gathers dominate this pass).
static inline void transport_row_avx512(float* row, float lo, float iw, int32_t B, const uint64_t* bc, float inv_total,
                                        const uint64_t* qp, int32_t M) {
    const __m512 vlo = _mm512_set1_ps(lo), viw = _mm512_set1_ps(iw), vB = _mm512_set1_ps((float)B);
    const __m512 vinv = _mm512_set1_ps(inv_total), vm1 = _mm512_set1_ps((float)(M - 1)), zero = _mm512_setzero_ps();
    const __m512i vbmax = _mm512_set1_epi32(B - 1), vmmax = _mm512_set1_epi32(M - 1), izero = _mm512_setzero_si512();
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int i = 0; i < BN; i += 16) {
        const __m512 sv = _mm512_loadu_ps(row + i);
        const __m512 t = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_sub_ps(sv, vlo), viw), zero), vB);
        const __m512i b = _mm512_min_epi32(_mm512_cvttps_epi32(t), vbmax);
        const __m512 frac = _mm512_sub_ps(t, _mm512_cvtepi32_ps(b));
        const __m512i g0 = _mm512_i32gather_epi64(_mm512_castsi512_si256(b), (const void*)bc, 8);
        const __m512i g1 = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(b, 1), (const void*)bc, 8);
        const __m512 below = _mm512_castsi512_ps(_mm512_permutex2var_epi32(g0, even, g1));
        const __m512 inbin = _mm512_castsi512_ps(_mm512_permutex2var_epi32(g0, odd, g1));
        const __m512 u = _mm512_mul_ps(_mm512_add_ps(below, _mm512_mul_ps(frac, inbin)), vinv);
        const __m512 pos = _mm512_mul_ps(u, vm1);
        const __m512i l = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvttps_epi32(pos), izero), vmmax);
        const __m512 f = _mm512_sub_ps(pos, _mm512_cvtepi32_ps(l));
        const __m512i h0 = _mm512_i32gather_epi64(_mm512_castsi512_si256(l), (const void*)qp, 8);
        const __m512i h1 = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(l, 1), (const void*)qp, 8);
        const __m512 a = _mm512_castsi512_ps(_mm512_permutex2var_epi32(h0, even, h1));
        const __m512 c = _mm512_castsi512_ps(_mm512_permutex2var_epi32(h0, odd, h1));
        _mm512_storeu_ps(row + i, _mm512_sub_ps(sv, _mm512_add_ps(a, _mm512_mul_ps(f, _mm512_sub_ps(c, a)))));
    }
}
#endif

template <typename T>
void transport_impl(const Geometry<T>& g, const Bins<T>& bins, const int64_t* counts, const Target<T>& tg, double step_size,
                    double diffusion, T* out_new, T* out_drift, T* br_out) {
    constexpr int R = kRows<T>();
    const int64_t K = g.K, B = bins.B, d = g.d;
    int64_t total = 0;
    for (int64_t b = 0; b < B; ++b) total += counts[b];
    // per (direction, bin): particles below (C) and in the bin (n), in T as the reference converts them
    std::vector<T> below((size_t)(K * B)), inbin((size_t)(K * B));
    std::vector<int64_t> seg(tg.tb ? (size_t)(K * B) : 0);
    const T inv_total = (T)1 / (T)total;
    for (int64_t j = 0; j < K; ++j) {
        int64_t c = 0;
        for (int64_t b = 0; b < B; ++b) {
            below[j * B + b] = (T)c;
            inbin[j * B + b] = (T)counts[j * B + b];
            if (tg.tb) seg[j * B + b] = table_segment(tg.lv, tg.L, (double)((T)c * inv_total));
            c += counts[j * B + b];
        }
    }
    const T inv_k = (T)(1.0 / (double)K);
    const double brownian_std = std::sqrt(2.0 * diffusion * step_size);
    const int64_t M = tg.M;
    // float32 with AVX-512: (C_b, n_b) and (q[l], q[l+1]) packed in pairs for 64-bit gathers
    std::vector<uint64_t> bcp, qpp;
#if defined(__AVX512F__)
    const bool pairs = std::is_same_v<T, float> && !tg.tb && B < (int64_t)INT32_MAX && M < (int64_t)INT32_MAX;
    if (pairs) {
        auto pack = [](T lo_, T hi_) {
            uint32_t a, b;
            std::memcpy(&a, &lo_, 4);
            std::memcpy(&b, &hi_, 4);
            return (uint64_t)a | ((uint64_t)b << 32);
        };
        bcp.resize((size_t)(K * B));
        qpp.resize((size_t)(K * M));
        for (int64_t e = 0; e < K * B; ++e) bcp[e] = pack(below[e], inbin[e]);
        for (int64_t j = 0; j < K; ++j)
            for (int64_t l = 0; l < M; ++l)
                qpp[j * M + l] = pack(tg.q[j * M + l], tg.q[j * M + std::min(l + 1, M - 1)]);
    }
#endif
    const T m1 = (T)(M - 1);
#pragma omp parallel num_threads(g.nthreads)
    {
        Scratch<T> s;
        s.dT.resize((size_t)(g.dpad * BN));
        if (diffusion > 0) s.xi.resize((size_t)(BN * d));
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < g.nblocks; ++blk) {
            int64_t i0, i1;
            g.block(blk, i0, i1);
            const int64_t nb = i1 - i0;
            load_block(g, i0, i1, s);
            T* dT = s.dT.data();
            for (int64_t j0 = 0; j0 < K; j0 += g.C) {
                const int64_t cj = std::min(g.C, K - j0);
                project_chunk<T>(g, i0, i1, j0, cj, s, (T*)nullptr);
                for (int64_t jj = 0; jj < cj; ++jj) {
                    const int64_t j = j0 + jj;
                    T* row = s.S.data() + jj * BN;
                    const T lo = bins.lo[j], iw = bins.inv_w[j];
                    const T* bl = below.data() + j * B;
                    const T* ib = inbin.data() + j * B;
                    if (tg.tb) {
                        const double* tb = tg.tb + j * tg.L;
                        const int64_t* sg = seg.data() + j * B;
                        for (int64_t i = 0; i < nb; ++i) {
                            int32_t b;
                            T frac;
                            bin_of(row[i], lo, iw, B, b, frac);
                            const T u = (bl[b] + frac * ib[b]) * inv_total;
                            row[i] = row[i] - (T)table_from(tg.lv, tb, tg.L, (double)u, sg[b]);
                        }
                    } else {
#if defined(__AVX512F__)
                        if constexpr (std::is_same_v<T, float>) {
                            if (pairs) {
                                transport_row_avx512(row, lo, iw, (int32_t)B, bcp.data() + j * B, inv_total,
                                                     qpp.data() + j * M, (int32_t)M);
                                std::fill(row + nb, row + BN, (T)0);
                                continue;
                            }
                        }
#endif
                        const T* q = tg.q + j * M;
                        const T tB = (T)B;
                        const int32_t bmax = (int32_t)(B - 1), mmax = (int32_t)(M - 1);
#pragma omp simd
                        for (int i = 0; i < BN; ++i) {  // the whole row (the tail past nb is discarded below)
                            const T sv = row[i];
                            const T t = std::min(std::max((sv - lo) * iw, (T)0), tB);
                            const int32_t b = std::min((int32_t)t, bmax);
                            const T frac = t - (T)b;
                            const T u = (bl[b] + frac * ib[b]) * inv_total;
                            const T pos = u * m1;
                            const int32_t l = std::min(std::max((int32_t)pos, 0), mmax);
                            const int32_t hi = std::min(l + 1, mmax);
                            const T f = pos - (T)l;
                            const T a = q[l];
                            row[i] = sv - (a + f * (q[hi] - a));
                        }
                    }
                    std::fill(row + nb, row + BN, (T)0);
                }
                const T* thP = g.thP.data() + (size_t)((j0 / g.C) * g.cpad * g.dpad);
                for (int64_t c0 = 0; c0 < d; c0 += R)
                    gemm_rows<T, R>(thP + c0, g.dpad, s.S.data(), cj, dT + c0 * BN, j0 > 0);
            }
            // drift /= k and the update of the block's rows, with the Brownian term of global rows off + i0 ..
            T* xi = s.xi.data();
            if (diffusion > 0) {
                flowrng::fill_normal_smooth(xi, nb * d, g.seed, (uint64_t)(2 * K), (g.off + (uint64_t)i0) * (uint64_t)d,
                                            1.0);
                if (br_out) std::copy(xi, xi + nb * d, br_out + i0 * d);
            }
            for (int64_t i = 0; i < nb; ++i)
                for (int64_t c = 0; c < d; ++c) {
                    const int64_t e = (i0 + i) * d + c;
                    const T dr = dT[c * BN + i] * inv_k;
                    out_drift[e] = dr;
                    double v = (double)g.X[e] - step_size * (double)dr;
                    if (diffusion > 0) v += brownian_std * (double)xi[i * d + c];
                    out_new[e] = (T)v;
                }
        }
    }
}

// ------------------------------------------------------------------------------------------------------------
// Python bindings (raw C-contiguous numpy buffers; fastdpot/ops/cpu_histogram.py wraps them for torch tensors)
// ------------------------------------------------------------------------------------------------------------
template <typename T>
using Arr = py::array_t<T, py::array::c_style>;
using DArr = py::array_t<double, py::array::c_style>;
using IArr = py::array_t<int64_t, py::array::c_style>;

[[noreturn]] static void bad(const std::string& msg) { throw std::invalid_argument(msg); }

static std::string shape_str(std::initializer_list<int64_t> s) {
    std::string out = "(";
    bool first = true;
    for (int64_t v : s) { out += (first ? "" : ", ") + std::to_string(v); first = false; }
    return out + ")";
}

template <typename A>
static void need_shape(const A& a, std::initializer_list<int64_t> shape, const char* name) {
    bool ok = a.ndim() == (py::ssize_t)shape.size();
    int q = 0;
    for (int64_t v : shape) ok = ok && a.shape(q++) == v;
    if (!ok) bad(std::string(name) + " must have shape " + shape_str(shape));
}

// an optional output array: None, or exactly a C-contiguous array of T of the given shape (never a converted copy)
template <typename T>
static T* opt_out(const py::object& o, std::initializer_list<int64_t> shape, const char* name) {
    if (o.is_none()) return nullptr;
    if (!py::isinstance<Arr<T>>(o)) bad(std::string(name) + " must be a C-contiguous array of the particles' dtype");
    auto a = o.cast<Arr<T>>();
    need_shape(a, shape, name);
    return a.mutable_data();
}

struct Span { const void* p; int64_t bytes; };

static void check_disjoint(std::initializer_list<Span> ins, std::initializer_list<Span> outs) {
    auto overlap = [](const Span& a, const Span& b) {
        const char *pa = (const char*)a.p, *pb = (const char*)b.p;
        return a.p && b.p && a.bytes > 0 && b.bytes > 0 && pa < pb + b.bytes && pb < pa + a.bytes;
    };
    int o = 0;
    for (const Span& x : outs) {
        for (const Span& in : ins)
            if (overlap(x, in)) bad("outputs must not share memory with inputs");
        int o2 = 0;
        for (const Span& y : outs)
            if (o2++ > o && overlap(x, y)) bad("outputs must not share memory with each other");
        ++o;
    }
}

template <typename T>
static void check_particles(const Arr<T>& x, const Arr<T>& th, int64_t& n, int64_t& d, int64_t& K, int64_t index_offset) {
    if (x.ndim() != 2 || th.ndim() != 2) bad("particles and theta must be 2-D");
    n = x.shape(0); d = x.shape(1); K = th.shape(0);
    if (th.shape(1) != d) bad("particles (n, d) and theta (k, d) must share d");
    if (n < 1 || d < 1 || K < 1) bad("need n >= 1 particles, d >= 1 and k >= 1 directions");
    if (index_offset < 0) bad("index_offset must be >= 0");
    if (n >= (int64_t)UINT32_MAX) bad("a shard must hold fewer than 2^32 particles");
    if (index_offset > (int64_t)(UINT64_MAX / 2 / (uint64_t)std::max<int64_t>(d, 1)) - n)
        bad("index_offset too large: global Brownian indices (index_offset + n)·d would overflow");
}

template <typename T>
static void check_geometry(const Arr<T>& mn, const Arr<T>& mx, int64_t K) {
    need_shape(mn, {K}, "col_min");
    need_shape(mx, {K}, "col_max");
    for (int64_t j = 0; j < K; ++j)
        if (!std::isfinite((double)mn.data()[j]) || !std::isfinite((double)mx.data()[j]) || mx.data()[j] < mn.data()[j])
            bad("col_min / col_max must be finite with col_min <= col_max (direction " + std::to_string(j) + ")");
}

template <typename T>
void minmax_py(Arr<T> x, Arr<T> th, double noise_std, int64_t seed, int64_t index_offset, Arr<T> out_min,
               Arr<T> out_max, py::object nx, int64_t max_chunk) {
    int64_t n, d, K;
    check_particles(x, th, n, d, K, index_offset);
    need_shape(out_min, {K}, "out_min");
    need_shape(out_max, {K}, "out_max");
    T* pn = opt_out<T>(nx, {n, K}, "noise_particles");
    check_disjoint({{x.data(), n * d * (int64_t)sizeof(T)}, {th.data(), K * d * (int64_t)sizeof(T)}},
                   {{out_min.data(), K * (int64_t)sizeof(T)}, {out_max.data(), K * (int64_t)sizeof(T)},
                    {pn, n * K * (int64_t)sizeof(T)}});
    py::gil_scoped_release nogil;
    Geometry<T> g(x.data(), n, d, th.data(), K, (uint64_t)index_offset, (uint64_t)seed, noise_std, max_chunk);
    minmax_impl(g, out_min.mutable_data(), out_max.mutable_data(), pn);
}

template <typename T>
void counts_py(Arr<T> x, Arr<T> th, double noise_std, int64_t seed, int64_t index_offset, Arr<T> mn, Arr<T> mx,
               IArr out_counts, int64_t max_chunk) {
    int64_t n, d, K;
    check_particles(x, th, n, d, K, index_offset);
    check_geometry(mn, mx, K);
    if (out_counts.ndim() != 2 || out_counts.shape(0) != K || out_counts.shape(1) < 1)
        bad("out_counts must have shape (k, histogram_bins), histogram_bins >= 1");
    const int64_t B = out_counts.shape(1);
    if (B > (int64_t)INT32_MAX) bad("histogram_bins too large");
    py::gil_scoped_release nogil;
    Geometry<T> g(x.data(), n, d, th.data(), K, (uint64_t)index_offset, (uint64_t)seed, noise_std, max_chunk);
    Bins<T> bins(mn.data(), mx.data(), K, B);
    counts_impl(g, bins, out_counts.mutable_data());
}

template <typename T>
void private_targets_py(Arr<T> y, Arr<T> th, double noise_std, int64_t seed, Arr<T> out_sorted, py::object ny) {
    if (y.ndim() != 2 || th.ndim() != 2) bad("private and theta must be 2-D");
    const int64_t M = y.shape(0), d = y.shape(1), K = th.shape(0);
    if (th.shape(1) != d) bad("private (M, d) and theta (k, d) must share d");
    if (M < 1 || K < 1) bad("need M >= 1 private rows and k >= 1 directions");
    need_shape(out_sorted, {K, M}, "out_sorted");
    T* pm = opt_out<T>(ny, {M, K}, "noise_private");
    check_disjoint({{y.data(), M * d * (int64_t)sizeof(T)}, {th.data(), K * d * (int64_t)sizeof(T)}},
                   {{out_sorted.data(), K * M * (int64_t)sizeof(T)}, {pm, M * K * (int64_t)sizeof(T)}});
    py::gil_scoped_release nogil;
    private_targets_impl(y.data(), M, d, th.data(), K, noise_std, (uint64_t)seed, out_sorted.mutable_data(), pm);
}

// target: either sorted (k, M) of T, or table (k, L) + levels (L,) float64
template <typename T>
static Target<T> make_target(const py::object& sorted, const py::object& table, const py::object& levels, int64_t K,
                             Arr<T>& keep_q, DArr& keep_t, DArr& keep_l) {
    Target<T> tg;
    if (sorted.is_none() == table.is_none()) bad("give exactly one target: sorted (k, M), or table and levels");
    if (table.is_none() != levels.is_none()) bad("give both table and levels, or neither");
    if (!sorted.is_none()) {
        if (!py::isinstance<Arr<T>>(sorted)) bad("sorted must be a C-contiguous array of the particles' dtype");
        keep_q = sorted.cast<Arr<T>>();
        if (keep_q.ndim() != 2 || keep_q.shape(0) != K || keep_q.shape(1) < 1)
            bad("sorted must have shape (k, M), M >= 1");
        tg.q = keep_q.data();
        tg.M = keep_q.shape(1);
        if (tg.M >= (int64_t)INT32_MAX) bad("M must be < 2^31");
        for (int64_t e = 0; e < K * tg.M; ++e)
            if (!std::isfinite((double)tg.q[e])) bad("sorted must be finite");
        return tg;
    }
    if (!py::isinstance<DArr>(table) || !py::isinstance<DArr>(levels))
        bad("table and levels must be C-contiguous float64 arrays");
    keep_t = table.cast<DArr>();
    keep_l = levels.cast<DArr>();
    if (keep_l.ndim() != 1 || keep_l.shape(0) < 1) bad("levels must have shape (L,), L >= 1");
    tg.L = keep_l.shape(0);
    need_shape(keep_t, {K, tg.L}, "table");
    tg.tb = keep_t.data();
    tg.lv = keep_l.data();
    for (int64_t l = 0; l < tg.L; ++l)
        if (!(tg.lv[l] >= 0.0 && tg.lv[l] <= 1.0) || (l > 0 && !(tg.lv[l] > tg.lv[l - 1])))
            bad("levels must be strictly increasing in [0, 1]");
    for (int64_t e = 0; e < K * tg.L; ++e)
        if (!std::isfinite(tg.tb[e])) bad("table must be finite");
    return tg;
}

template <typename T>
void transport_py(Arr<T> x, Arr<T> th, double noise_std, int64_t seed, int64_t index_offset, Arr<T> mn, Arr<T> mx,
                  IArr counts, double step_size, double diffusion, Arr<T> out_new, Arr<T> out_drift, py::object sorted,
                  py::object table, py::object levels, py::object br, int64_t max_chunk) {
    int64_t n, d, K;
    check_particles(x, th, n, d, K, index_offset);
    check_geometry(mn, mx, K);
    if (counts.ndim() != 2 || counts.shape(0) != K || counts.shape(1) < 1)
        bad("counts must have shape (k, histogram_bins), histogram_bins >= 1");
    const int64_t B = counts.shape(1);
    if (B > (int64_t)INT32_MAX) bad("histogram_bins too large");
    const int64_t* pc = counts.data();
    int64_t total = -1;
    for (int64_t j = 0; j < K; ++j) {
        int64_t s = 0;
        for (int64_t b = 0; b < B; ++b) {
            if (pc[j * B + b] < 0) bad("counts must be >= 0");
            s += pc[j * B + b];
        }
        if (total < 0) total = s;
        else if (s != total) bad("every direction's counts must sum to the same global number of particles");
    }
    if (total < 2 || total < n) bad("the counts must sum to the global N >= 2, at least this shard's n");
    if (!(step_size > 0) || !(diffusion >= 0) || !std::isfinite(step_size) || !std::isfinite(diffusion)) bad("need step_size > 0, diffusion >= 0");
    need_shape(out_new, {n, d}, "out_new");
    need_shape(out_drift, {n, d}, "out_drift");
    T* pb = opt_out<T>(br, {n, d}, "brownian");
    Arr<T> kq;
    DArr kt, kl;
    Target<T> tg = make_target<T>(sorted, table, levels, K, kq, kt, kl);
    const int64_t nd = n * d * (int64_t)sizeof(T);
    check_disjoint({{x.data(), nd}, {th.data(), K * d * (int64_t)sizeof(T)}, {pc, K * B * 8},
                    {tg.q, K * tg.M * (int64_t)sizeof(T)}, {tg.tb, K * tg.L * 8}, {tg.lv, tg.L * 8}},
                   {{out_new.data(), nd}, {out_drift.data(), nd}, {pb, nd}});
    py::gil_scoped_release nogil;
    Geometry<T> g(x.data(), n, d, th.data(), K, (uint64_t)index_offset, (uint64_t)seed, noise_std, max_chunk);
    Bins<T> bins(mn.data(), mx.data(), K, B);
    transport_impl(g, bins, pc, tg, step_size, diffusion, out_new.mutable_data(), out_drift.mutable_data(), pb);
}

template <typename T>
void step_py(Arr<T> x, py::object y, Arr<T> th, double noise_std, double step_size, double diffusion, int64_t seed, int64_t histogram_bins,
             Arr<T> out_new, Arr<T> out_drift, py::object nx, py::object ny, py::object br, int64_t index_offset,
             py::object table, py::object levels, int64_t max_chunk, int64_t materialize) {
    int64_t n, d, K;
    check_particles(x, th, n, d, K, index_offset);
    if (n < 2) bad("need N >= 2 particles");
    if (histogram_bins < 1 || histogram_bins > (int64_t)INT32_MAX) bad("histogram_bins must be >= 1");
    if (!(step_size > 0) || !(diffusion >= 0) || !std::isfinite(step_size) || !std::isfinite(diffusion)) bad("need step_size > 0, diffusion >= 0");
    need_shape(out_new, {n, d}, "out_new");
    need_shape(out_drift, {n, d}, "out_drift");
    T* pn = opt_out<T>(nx, {n, K}, "noise_particles");
    T* pb = opt_out<T>(br, {n, d}, "brownian");
    const bool sketch = !table.is_none();
    if (sketch == !y.is_none()) bad("give exactly one target: private rows y, or table and levels (y=None)");
    Arr<T> ya;
    int64_t M = 0;
    if (!sketch) {
        if (!py::isinstance<Arr<T>>(y)) bad("private must be a C-contiguous array of the particles' dtype");
        ya = y.cast<Arr<T>>();
        if (ya.ndim() != 2 || ya.shape(1) != d || ya.shape(0) < 1) bad("private must have shape (M, d), M >= 1");
        M = ya.shape(0);
    } else if (!ny.is_none()) {
        bad("noise_private must be None in sketch mode (no private rows)");
    }
    T* pm = sketch ? nullptr : opt_out<T>(ny, {M, K}, "noise_private");
    Arr<T> sorted_keep, kq;
    DArr kt, kl;
    Target<T> tg;
    if (sketch) {
        tg = make_target<T>(py::none(), table, levels, K, kq, kt, kl);
    } else {  // filled by hist_private_targets below
        sorted_keep = Arr<T>({K, M});
        tg.q = sorted_keep.data();
        tg.M = M;
    }
    const int64_t nd = n * d * (int64_t)sizeof(T);
    check_disjoint({{x.data(), nd}, {sketch ? nullptr : ya.data(), M * d * (int64_t)sizeof(T)},
                    {th.data(), K * d * (int64_t)sizeof(T)}},
                   {{out_new.data(), nd}, {out_drift.data(), nd}, {pn, n * K * (int64_t)sizeof(T)},
                    {pm, M * K * (int64_t)sizeof(T)}, {pb, nd}});
    py::gil_scoped_release nogil;
    Geometry<T> g(x.data(), n, d, th.data(), K, (uint64_t)index_offset, (uint64_t)seed, noise_std, max_chunk);
    // materialize: 1 stores the n·k noisy projections once (pass 1) instead of recomputing them in passes 2 and 3,
    // 0 recomputes, < 0 (auto) stores them when they take at most kMaterializeBytes
    std::unique_ptr<T, void (*)(void*)> Pbuf(nullptr, std::free);
    if (materialize > 0 || (materialize < 0 && (double)n * (double)K * sizeof(T) <= kMaterializeBytes)) {
        constexpr size_t kHuge = (size_t)2 << 20;  // 2 MiB pages: 512x fewer first-touch faults
        const size_t bytes = ((size_t)n * (size_t)K * sizeof(T) + kHuge - 1) / kHuge * kHuge;
        Pbuf.reset((T*)std::aligned_alloc(kHuge, bytes));
        if (!Pbuf) throw std::bad_alloc();
        madvise(Pbuf.get(), bytes, MADV_HUGEPAGE);
        g.P = Pbuf.get();
    }
    std::vector<T> mn((size_t)K), mx((size_t)K);
    minmax_impl(g, mn.data(), mx.data(), pn);
    g.stored = true;
    Bins<T> bins(mn.data(), mx.data(), K, histogram_bins);
    std::vector<int64_t> counts((size_t)(K * histogram_bins));
    counts_impl(g, bins, counts.data());
    if (!sketch) private_targets_impl(ya.data(), M, d, th.data(), K, noise_std, (uint64_t)seed, sorted_keep.mutable_data(), pm);
    transport_impl(g, bins, counts.data(), tg, step_size, diffusion, out_new.mutable_data(), out_drift.mutable_data(), pb);
}

template <typename T>
void def_all(py::module_& m) {
    m.def("hist_minmax", &minmax_py<T>, py::arg("x").noconvert(), py::arg("theta").noconvert(), py::arg("noise_std"), py::arg("seed"),
          py::arg("index_offset"), py::arg("out_min").noconvert(), py::arg("out_max").noconvert(),
          py::arg("noise_particles") = py::none(), py::arg("max_chunk") = 0);
    m.def("hist_counts", &counts_py<T>, py::arg("x").noconvert(), py::arg("theta").noconvert(), py::arg("noise_std"), py::arg("seed"),
          py::arg("index_offset"), py::arg("col_min").noconvert(), py::arg("col_max").noconvert(),
          py::arg("out_counts").noconvert(), py::arg("max_chunk") = 0);
    m.def("hist_private_targets", &private_targets_py<T>, py::arg("y").noconvert(), py::arg("theta").noconvert(), py::arg("noise_std"),
          py::arg("seed"), py::arg("out_sorted").noconvert(), py::arg("noise_private") = py::none());
    m.def("hist_transport", &transport_py<T>, py::arg("x").noconvert(), py::arg("theta").noconvert(), py::arg("noise_std"), py::arg("seed"),
          py::arg("index_offset"), py::arg("col_min").noconvert(), py::arg("col_max").noconvert(),
          py::arg("counts").noconvert(), py::arg("step_size"), py::arg("diffusion"), py::arg("out_new").noconvert(),
          py::arg("out_drift").noconvert(), py::arg("sorted") = py::none(), py::arg("table") = py::none(),
          py::arg("levels") = py::none(), py::arg("brownian") = py::none(), py::arg("max_chunk") = 0);
    m.def("hist_flow_step", &step_py<T>, py::arg("x").noconvert(), py::arg("y"), py::arg("theta").noconvert(), py::arg("noise_std"),
          py::arg("step_size"), py::arg("diffusion"), py::arg("seed"), py::arg("histogram_bins"), py::arg("out_new").noconvert(),
          py::arg("out_drift").noconvert(), py::arg("noise_particles") = py::none(),
          py::arg("noise_private") = py::none(), py::arg("brownian") = py::none(), py::arg("index_offset") = 0,
          py::arg("table") = py::none(), py::arg("levels") = py::none(), py::arg("max_chunk") = 0,
          py::arg("materialize") = -1);
}

}  // namespace

PYBIND11_MODULE(_C_flow_histogram, m) {
    m.doc() =
        "fastdpot sort-free (histogram) CPU step of the DP sliced-Wasserstein flow (csrc/flow_histogram.cpp).\n\n"
        "Every function takes C-contiguous float32 or float64 numpy arrays of one dtype (counts: int64; table and "
        "levels: float64), writes its outputs in place (they must not share memory with the inputs or each other) "
        "and releases the GIL. x (n, d) is a shard of the particles whose row 0 has global index index_offset; "
        "every per-particle draw is keyed by the global index, so the shards of an array compute what the whole "
        "array computes.\n\n"
        "Contract of the passes (a sharded caller all-reduces between them):\n"
        "  1. hist_minmax(x, theta, noise_std, seed, index_offset, out_min (k,), out_max (k,), noise_particles=None)\n"
        "     -> min / max over the shard of every noisy projection; reduce with MIN / MAX over the shards.\n"
        "  2. hist_counts(x, theta, noise_std, seed, index_offset, col_min, col_max, out_counts (k, B) int64)\n"
        "     -> bin counts over the shard for the GLOBAL col_min / col_max; reduce with SUM.\n"
        "  T. hist_private_targets(y (M, d), theta, noise_std, seed, out_sorted (k, M), noise_private=None)\n"
        "     -> sorted noisy private projections (privacy-grade noise): computed once, by one process.\n"
        "  3. hist_transport(x, theta, noise_std, seed, index_offset, col_min, col_max, counts, sorted=... | table=, "
        "levels=, step_size, diffusion, out_new, out_drift, brownian=None)\n"
        "     -> level through the GLOBAL counts (their row sum is the global N), target, drift, Euler--Maruyama "
        "update of the shard.\n"
        "hist_flow_step(x, y | None, theta, noise_std, step_size, diffusion, seed, histogram_bins, out_new, out_drift, "
        "noise_particles=None, noise_private=None, brownian=None, index_offset=0, table=None, levels=None) runs "
        "1, 2, T, 3 on one array.";
    def_all<float>(m);
    def_all<double>(m);
}
