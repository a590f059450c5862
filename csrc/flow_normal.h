// Vectorisable standard normals from the Philox4x32-10 stream of common.h (flow engineer's helper).
//
// fill_normal_fast(out, n, seed, stream, offset, scale) returns the same numbers as common.h's fill_normal up to
// single-precision rounding (|difference| ~ 1e-6; tested in tests/test_flow_kernel.py): the same Philox blocks
// (computed 16 counters at a time: one 512-bit vector per word with AVX-512, two 256-bit ones with AVX2, else
// plain loops the compiler vectorises), the same Box-Muller pairing
// (radius from the 64-bit uniform (r0, r1), angle from r2) -> (a cos 2πt, a sin 2πt), with float-precision log /
// sin / cos polynomials (Cephes single-precision logf, sinf, cosf) instead of double libm calls, which cannot
// vectorise. The radius uniform u = (r0 + (r1 + 0.5)·2^-32)·2^-32 keeps 56 bits where they matter (the Gaussian
// tail reaches 8.9σ here, 9.5σ in common.h's double-precision normal2; see there why the tail matters) and, for u
// within 2^-10 of 1, a series in v = 1 − u computed from the integer, so the radius is accurate near 0 too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common.h"

namespace fastdpot {
namespace flowrng {

constexpr int kLanes = 16;  // Philox blocks per batch (32 normals)

static inline float bits_to_float(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
static inline uint32_t float_to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

// natural log of u in (0, 1] (Cephes logf; |rel. error| ~ 1e-7)
static inline float log_pos(float u) {
    uint32_t b = float_to_bits(u);
    float e = (float)((int32_t)((b >> 23) & 0xffu) - 126);
    uint32_t mb = (b & 0x807fffffu) | 0x3f000000u;  // mantissa m in [0.5, 1)
    // m < sqrt(1/2): use 2m − 1, exponent − 1. m > 0, so the comparison is one of the bits, and 2m (exact) is one
    // more in the exponent field: integer operations only. (m · (1 + small) became a branch around the float
    // multiply, which may trap, so GCC's if-conversion gave up and no loop over lanes vectorised without AVX-512's
    // masked operations: the normals of an AVX2 build ran one at a time, 4x slower.)
    const uint32_t small = (uint32_t)(mb < 0x3f3504f3u);  // 0x3f3504f3: the float nearest sqrt(1/2)
    e -= (float)(int32_t)small;
    float x = bits_to_float(mb + (small << 23)) - 1.0f;
    float z = x * x;
    float y = 7.0376836292E-2f;
    y = y * x - 1.1514610310E-1f;
    y = y * x + 1.1676998740E-1f;
    y = y * x - 1.2420140846E-1f;
    y = y * x + 1.4249322787E-1f;
    y = y * x - 1.6668057665E-1f;
    y = y * x + 2.0000714765E-1f;
    y = y * x - 2.4999993993E-1f;
    y = y * x + 3.3333331174E-1f;
    y = y * x * z;
    y += -2.12194440e-4f * e;
    y += -0.5f * z;
    x = x + y;
    return x + 0.693359375f * e;
}

// uint32 -> float through signed conversions (AVX2 has no unsigned conversion; this keeps the loop vectorisable)
static inline float u32_to_float(uint32_t r) {
    return (float)(int32_t)(r >> 8) * 256.0f + (float)(int32_t)(r & 0xffu);
}

// -2 ln u for u = (r + (lo + 0.5)·2^-32)·2^-32, the 64-bit uniform of the pair (r, lo)
static inline float minus2log_u(uint32_t r, uint32_t lo) {
    // both branches are computed and one is selected by a mask, so the loop over lanes vectorises
    // u within 2^-10 of 1: ln(1 − v) = −v − v²/2 − v³/3 − v⁴/4 (error < v^5 ~ 1e-15)
    float v = ((float)(int32_t)(0xFFFFFFFFu - r) + 0.5f) * 2.3283064365386963e-10f;  // only used when < 2^22
    float near1 = 2.0f * (v + v * v * (0.5f + v * (1.0f / 3.0f + v * 0.25f)));
    // the low word only matters when r is small (then r + frac is exact in float); 2^-32 scaling is exact
    float frac = ((float)(int32_t)(lo >> 8) + 0.5f) * 5.9604644775390625e-08f;  // (lo + 0.5)·2^-32 to 24 bits
    float gen = -2.0f * log_pos((u32_to_float(r) + frac) * 2.3283064365386963e-10f);
    const uint32_t m = 0u - (uint32_t)(r >= 0xFFC00000u);
    return bits_to_float((float_to_bits(near1) & m) | (float_to_bits(gen) & ~m));
}

// (cos 2πt, sin 2πt) for t = (r + 0.5)·2^-32 (angle from the top 24 bits; Cephes sinf / cosf on [−π/4, π/4])
static inline void cossin_turn(uint32_t r, float& c, float& s) {
    float t4 = ((float)(int32_t)(r >> 8) + 0.5f) * (4.0f / 16777216.0f);  // quarter turns in (0, 4)
    int q = (int)(t4 + 0.5f);
    float x = (t4 - (float)q) * 1.57079632679489662f;  // in [−π/4, π/4]
    float z = x * x;
    float sn = ((-1.9515295891E-4f * z + 8.3321608736E-3f) * z - 1.6666654611E-1f) * z * x + x;
    float cs = ((2.443315711809948E-5f * z - 1.388731625493765E-3f) * z + 4.166664568298827E-2f) * z * z -
               0.5f * z + 1.0f;
    // rotate by q quarter turns: odd q swaps (cos, sin) -> (−sin, cos); q & 2 negates both (sign bit via xor)
    const uint32_t odd = (uint32_t)(q & 1), neg = ((uint32_t)(q & 2)) << 30;
    const uint32_t mo = 0u - odd;  // all ones when odd
    uint32_t cb = (float_to_bits(cs) & ~mo) | ((float_to_bits(sn) ^ 0x80000000u) & mo);
    uint32_t sb = (float_to_bits(sn) & ~mo) | (float_to_bits(cs) & mo);
    c = bits_to_float(cb ^ neg);
    s = bits_to_float(sb ^ neg);
}

// Philox4x32-10 blocks blk0 .. blk0 + kLanes - 1 of (seed, stream), lane-parallel: word w of block l in cw[l]
static inline void philox_lanes(uint64_t seed, uint64_t stream, uint64_t blk0, uint32_t* c0, uint32_t* c1,
                                uint32_t* c2, uint32_t* c3) {
#if defined(__AVX512F__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own _mm512_undefined_epi32 (__m512i __Y = __Y)
    // One 512-bit vector per word: 32 x 32 -> 64-bit products of the even lanes and of the odd lanes (shifted down),
    // their low and high halves interleaved back into lane order; the same numbers as the plain loop below, which
    // the compiler vectorises with 256-bit products and shuffles at about a third of this speed (0.35 vs 0.93 ns
    // per normal, one core of the 2-core Xeon of the benchmarks).
    static_assert(kLanes == 16, "one 512-bit vector of counters");
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i base_lo = _mm512_set1_epi32((int)(uint32_t)blk0);
    const __m512i base_hi = _mm512_set1_epi32((int)(uint32_t)(blk0 >> 32));
    __m512i x0 = _mm512_add_epi32(base_lo, lane);
    const __mmask16 carry = _mm512_cmplt_epu32_mask(x0, base_lo);  // the low counter word wrapped in this lane
    __m512i x1 = _mm512_mask_add_epi32(base_hi, carry, base_hi, _mm512_set1_epi32(1));
    __m512i x2 = _mm512_set1_epi32((int)(uint32_t)stream), x3 = _mm512_set1_epi32((int)(uint32_t)(stream >> 32));
    const __m512i m0 = _mm512_set1_epi32((int)Philox::M0), m1 = _mm512_set1_epi32((int)Philox::M1);
    const __m512i lo_idx = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i hi_idx = _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; ++r) {
        const __m512i e0 = _mm512_mul_epu32(x0, m0), o0 = _mm512_mul_epu32(_mm512_srli_epi64(x0, 32), m0);
        const __m512i e1 = _mm512_mul_epu32(x2, m1), o1 = _mm512_mul_epu32(_mm512_srli_epi64(x2, 32), m1);
        const __m512i lo0 = _mm512_permutex2var_epi32(e0, lo_idx, o0), hi0 = _mm512_permutex2var_epi32(e0, hi_idx, o0);
        const __m512i lo1 = _mm512_permutex2var_epi32(e1, lo_idx, o1), hi1 = _mm512_permutex2var_epi32(e1, hi_idx, o1);
        x0 = _mm512_ternarylogic_epi32(hi1, x1, _mm512_set1_epi32((int)k0), 0x96);  // 0x96: three-way xor
        x2 = _mm512_ternarylogic_epi32(hi0, x3, _mm512_set1_epi32((int)k1), 0x96);
        x1 = lo1; x3 = lo0;
        k0 += Philox::W0; k1 += Philox::W1;
    }
    _mm512_storeu_si512(c0, x0); _mm512_storeu_si512(c1, x1); _mm512_storeu_si512(c2, x2); _mm512_storeu_si512(c3, x3);
#pragma GCC diagnostic pop
#elif defined(__AVX2__)
    // The same with two 256-bit vectors per word (lanes 0-7, 8-15), the even / odd products' halves put back in lane
    // order by blends. The plain loop below, as GCC vectorises it, goes through memory every round and costs about
    // 5x this (one core of the Xeon of the benchmarks, built with FASTDPOT_MARCH=x86-64-v3): AVX2 machines drew
    // their smoothing noise at a fifth of the speed they can.
    static_assert(kLanes == 16, "two 256-bit vectors of counters");
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    const __m256i base_lo = _mm256_set1_epi32((int)(uint32_t)blk0);
    const __m256i base_hi = _mm256_set1_epi32((int)(uint32_t)(blk0 >> 32));
    const __m256i m0 = _mm256_set1_epi32((int)Philox::M0), m1 = _mm256_set1_epi32((int)Philox::M1);
    __m256i x0[2], x1[2], x2[2], x3[2];
    for (int h = 0; h < 2; ++h) {
        x0[h] = _mm256_add_epi32(base_lo, _mm256_setr_epi32(8 * h, 8 * h + 1, 8 * h + 2, 8 * h + 3, 8 * h + 4,
                                                             8 * h + 5, 8 * h + 6, 8 * h + 7));
        // the low counter word wrapped in this lane (x0 < base_lo unsigned): all ones, and base_hi − (−1)
        const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(base_lo, sign), _mm256_xor_si256(x0[h], sign));
        x1[h] = _mm256_sub_epi32(base_hi, carry);
        x2[h] = _mm256_set1_epi32((int)(uint32_t)stream);
        x3[h] = _mm256_set1_epi32((int)(uint32_t)(stream >> 32));
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; ++r) {
        const __m256i vk0 = _mm256_set1_epi32((int)k0), vk1 = _mm256_set1_epi32((int)k1);
        for (int h = 0; h < 2; ++h) {
            const __m256i e0 = _mm256_mul_epu32(x0[h], m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(x0[h], 32), m0);
            const __m256i e1 = _mm256_mul_epu32(x2[h], m1), o1 = _mm256_mul_epu32(_mm256_srli_epi64(x2[h], 32), m1);
            const __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
            const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA);
            const __m256i lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
            const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA);
            x0[h] = _mm256_xor_si256(_mm256_xor_si256(hi1, x1[h]), vk0);
            x2[h] = _mm256_xor_si256(_mm256_xor_si256(hi0, x3[h]), vk1);
            x1[h] = lo1;
            x3[h] = lo0;
        }
        k0 += Philox::W0; k1 += Philox::W1;
    }
    for (int h = 0; h < 2; ++h) {
        _mm256_storeu_si256((__m256i*)(c0 + 8 * h), x0[h]);
        _mm256_storeu_si256((__m256i*)(c1 + 8 * h), x1[h]);
        _mm256_storeu_si256((__m256i*)(c2 + 8 * h), x2[h]);
        _mm256_storeu_si256((__m256i*)(c3 + 8 * h), x3[h]);
    }
#else
    const uint32_t s0 = (uint32_t)stream, s1 = (uint32_t)(stream >> 32);
    for (int l = 0; l < kLanes; ++l) {
        uint64_t ctr = blk0 + (uint64_t)l;
        c0[l] = (uint32_t)ctr; c1[l] = (uint32_t)(ctr >> 32); c2[l] = s0; c3[l] = s1;
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; ++r) {
#pragma omp simd
        for (int l = 0; l < kLanes; ++l) {
            uint64_t p0 = (uint64_t)Philox::M0 * c0[l];
            uint64_t p1 = (uint64_t)Philox::M1 * c2[l];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t)p1; c3[l] = (uint32_t)p0; c0[l] = n0; c2[l] = n2;
        }
        k0 += Philox::W0; k1 += Philox::W1;
    }
#endif
}

// 2·kLanes normals: out[2·l + i] = normal i of Philox block (blk0 + l), scaled (common.h's normal2)
template <typename T>
static inline void normal_batch(uint64_t seed, uint64_t stream, uint64_t blk0, double scale, T* out) {
    uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
    philox_lanes(seed, stream, blk0, c0, c1, c2, c3);
    const float sc = (float)scale;
    float z[2 * kLanes];
#pragma omp simd simdlen(kLanes)  // 512-bit where available: the counters above are stored at that width
    for (int l = 0; l < kLanes; ++l) {
        float a = __builtin_sqrtf(minus2log_u(c0[l], c1[l]));
        float ca, sa;
        cossin_turn(c2[l], ca, sa);
        z[2 * l] = a * ca; z[2 * l + 1] = a * sa;
    }
    for (int i = 0; i < 2 * kLanes; ++i) out[i] = (T)(sc * z[i]);
}

// 4·kLanes normals: out[4·l + i] = normal i of Philox block (blk0 + l), scaled (common.h's normal4: two Box-Muller
// pairs per block, 32-bit radius uniforms)
template <typename T>
static inline void normal_batch4(uint64_t seed, uint64_t stream, uint64_t blk0, double scale, T* out) {
    uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
    philox_lanes(seed, stream, blk0, c0, c1, c2, c3);
    const float sc = (float)scale;
    float z[4 * kLanes];
#pragma omp simd simdlen(kLanes)  // 512-bit where available: the counters above are stored at that width
    for (int l = 0; l < kLanes; ++l) {
        // (r + 0.5)·2^-32 is the 64-bit uniform (r, 2^31) of minus2log_u
        float a = __builtin_sqrtf(minus2log_u(c0[l], 0x80000000u));
        float b = __builtin_sqrtf(minus2log_u(c2[l], 0x80000000u));
        float ca, sa, cb, sb;
        cossin_turn(c1[l], ca, sa);
        cossin_turn(c3[l], cb, sb);
        z[4 * l] = a * ca; z[4 * l + 1] = a * sa; z[4 * l + 2] = b * cb; z[4 * l + 3] = b * sb;
    }
    for (int i = 0; i < 4 * kLanes; ++i) out[i] = (T)(sc * z[i]);
}

// out[j] = scale · normal number (offset + j) of (seed, stream), PerBlock normals per Philox block:
// PerBlock = 2: common.h's normal_at stream (64-bit radius: the privacy-grade noise), via normal_batch;
// PerBlock = 4: common.h's normal4_at stream (32-bit radius uniforms, so the draws stop at 6.76σ; twice as fast),
// via normal_batch4 -- for noise that is not a privacy mechanism: the particles' smoothing noise and the Brownian
// term (particles are synthetic, never private data).
template <int PerBlock, typename T>
static inline void fill_normal_blocks(T* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset,
                                      double scale) {
    static_assert(PerBlock == 2 || PerBlock == 4, "two or four normals per Philox block");
    int64_t j = 0;
    T buf[PerBlock * kLanes];
    while (j < n) {
        const uint64_t idx = offset + (uint64_t)j;
        const int64_t skip = (int64_t)(idx % PerBlock);
        if constexpr (PerBlock == 2) normal_batch<T>(seed, stream, idx / PerBlock, scale, buf);
        else normal_batch4<T>(seed, stream, idx / PerBlock, scale, buf);
        const int64_t take = std::min<int64_t>(PerBlock * kLanes - skip, n - j);
        for (int64_t t = 0; t < take; ++t) out[j + t] = buf[skip + t];
        j += take;
    }
}

template <typename T>
static inline void fill_normal_fast(T* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset,
                                    double scale) {
    fill_normal_blocks<2>(out, n, seed, stream, offset, scale);
}

template <typename T>
static inline void fill_normal_smooth(T* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset,
                                      double scale) {
    fill_normal_blocks<4>(out, n, seed, stream, offset, scale);
}

// The private side of one flow step for direction j, shared by the exact (flow.cpp) and histogram
// (flow_histogram.cpp) steps so that both release exactly the same values: ys[m] = θ_j·y_m + σ·ξ_{m,j}, with ξ the
// privacy-grade normals of stream 2j + 1 (offset 0), the noise written to ny_out[m·K + j] when ny_out is given,
// then ys sorted ascending. ys holds M values; th points at θ_j (d values); Y is (M, d) row-major.
template <typename T>
inline void sorted_noisy_private_projections(const T* Y, int64_t M, int64_t d, const T* th, int64_t K, int64_t j,
                                             double noise_std, uint64_t seed, T* ys, T* ny_out) {
    if (noise_std > 0 && M > 0) fill_normal_fast(ys, M, seed, (uint64_t)(2 * j + 1), 0, noise_std);
    else std::fill(ys, ys + M, (T)0);
    for (int64_t m = 0; m < M; ++m) {
        if (ny_out) ny_out[m * K + j] = ys[m];
        const T* ym = Y + m * d;
        T acc = 0;
        for (int64_t c = 0; c < d; ++c) acc += ym[c] * th[c];
        ys[m] += acc;
    }
    std::sort(ys, ys + M);
}

}  // namespace flowrng
}  // namespace fastdpot
