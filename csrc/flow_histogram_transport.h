// Pass 3 of the sort-free (histogram) CPU flow step (csrc/flow_histogram.cpp) and its target: the sorted noisy
// private projections (the step's release), then each particle's level through the global counts, its target, the
// drift and the Euler--Maruyama update.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "flow_histogram_common.h"

namespace fastdpot {
namespace hist {

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
#else
// The same map without AVX-512 (AVX2 and below): the same packed pairs, looked up by scalar 64-bit loads (one per
// pair) between vectorised loops over the row. Left to itself, GCC 12 turns the four 32-bit lookups of the generic
// loop into emulated gathers (an extract and an insert per element and table; it emits no hardware gather for
// -march=x86-64-v3, znver2 or znver3); two loads per element instead of four made the lookup alone 1.4-2x faster
// (AVX2 build, the Xeon of the benchmarks), with no dependence on how fast a CPU's gathers are. u and the target
// are the generic loop's operations, multiply-adds contracted as there: the results are the generic loop's.
static inline void transport_row_pairs(float* row, float lo, float iw, int32_t B, const uint64_t* bc, float inv_total,
                                       const uint64_t* qp, int32_t M) {
    const float tB = (float)B, m1 = (float)(M - 1);
    const int32_t bmax = B - 1, mmax = M - 1;
    alignas(64) int32_t idx[BN];
    alignas(64) float fr[BN];
    alignas(64) uint64_t pr[BN];
    auto lo32 = [](uint64_t v) { float f; const uint32_t w = (uint32_t)v; std::memcpy(&f, &w, 4); return f; };
    auto hi32 = [](uint64_t v) { float f; const uint32_t w = (uint32_t)(v >> 32); std::memcpy(&f, &w, 4); return f; };
#pragma omp simd
    for (int i = 0; i < BN; ++i) {
        const float t = std::min(std::max((row[i] - lo) * iw, 0.0f), tB);
        const int32_t b = std::min((int32_t)t, bmax);
        idx[i] = b;
        fr[i] = t - (float)b;
    }
    for (int i = 0; i < BN; ++i) pr[i] = bc[idx[i]];  // (C_b, n_b)
#pragma omp simd
    for (int i = 0; i < BN; ++i) {
        const float pos = (lo32(pr[i]) + fr[i] * hi32(pr[i])) * inv_total * m1;
        const int32_t l = std::min(std::max((int32_t)pos, 0), mmax);
        idx[i] = l;
        fr[i] = pos - (float)l;
    }
    for (int i = 0; i < BN; ++i) pr[i] = qp[idx[i]];  // (q[l], q[l + 1])
#pragma omp simd
    for (int i = 0; i < BN; ++i) {
        const float a = lo32(pr[i]);
        row[i] = row[i] - (a + fr[i] * (hi32(pr[i]) - a));
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
    // float32: (C_b, n_b) and (q[l], q[l+1]) packed in pairs, one 64-bit lookup each (gathers with AVX-512)
    std::vector<uint64_t> bcp, qpp;
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
                        if constexpr (std::is_same_v<T, float>) {
                            if (pairs) {
#if defined(__AVX512F__)
                                transport_row_avx512(row, lo, iw, (int32_t)B, bcp.data() + j * B, inv_total,
                                                     qpp.data() + j * M, (int32_t)M);
#else
                                transport_row_pairs(row, lo, iw, (int32_t)B, bcp.data() + j * B, inv_total,
                                                    qpp.data() + j * M, (int32_t)M);
#endif
                                std::fill(row + nb, row + BN, (T)0);
                                continue;
                            }
                        }
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
            // the drift rows, particle-major (a transpose of dT), then the update as one vectorised loop over the
            // block's nb·d contiguous values (it was one scalar loop over the transpose: a fifth of this pass's
            // profile on the AVX2 build); the same operations, so the same numbers
            T* dr = out_drift + i0 * d;
            transpose_scaled(dT, BN, dr, d, d, nb, inv_k);
            const T* xb = g.X + i0 * d;
            T* nw = out_new + i0 * d;
            if (diffusion > 0) {
#pragma omp simd
                for (int64_t e = 0; e < nb * d; ++e) {
                    double v = (double)xb[e] - step_size * (double)dr[e];
                    v += brownian_std * (double)xi[e];
                    nw[e] = (T)v;
                }
            } else {
#pragma omp simd
                for (int64_t e = 0; e < nb * d; ++e) nw[e] = (T)((double)xb[e] - step_size * (double)dr[e]);
            }
        }
    }
}

}  // namespace hist
}  // namespace fastdpot
