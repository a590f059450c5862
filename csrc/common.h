// Shared building blocks of fastdpot's CPU kernels (header-only, C++17, no torch headers).
//
//  * Philox4x32-10 counter-based generator (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as
//    1, 2, 3", SC'11) + Box-Muller with a 64-bit radius uniform (tails to 9.5σ): element i of a noise array with (seed, stream) is a pure function of
//    (seed, stream, i), so noise is replayable and independent of thread count and chunking.
//  * LSD radix argsort of float / double keys with 32-bit indices (stable), the sort used by the sort-based
//    quantile transport (per-direction sorts dominate the cost of sliced OT on CPU).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace fastdpot {

// ------------------------------------------------------------------------------------------------------------
// Philox4x32-10
// ------------------------------------------------------------------------------------------------------------
struct Philox {
    static constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    static constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;

    // out <- Philox4x32-10(key = seed, counter = (ctr, stream))
    static inline void block(uint64_t seed, uint64_t stream, uint64_t ctr, uint32_t out[4]) {
        uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32);
        uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        for (int r = 0; r < 10; ++r) {
            uint64_t p0 = (uint64_t)M0 * c0;
            uint64_t p1 = (uint64_t)M1 * c2;
            uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
            uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
            uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
            c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
            k0 += W0; k1 += W1;
        }
        out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
    }
};

// Two standard normals from one Philox block (Box-Muller). The radius uses a 64-bit uniform (r0, r1):
// u = (r + 0.5)·2^-64 reaches 2.7e-20, so the sampled Gaussian extends to 9.5σ. With a 32-bit uniform it would stop
// at 6.76σ, and a noise that cannot exceed cσ makes outputs beyond f(D) + cσ impossible under D but possible under
// a neighbour D': a privacy failure event nobody accounts for. The angle uses r2 (32 bits); r3 is unused.
static inline void normal2(uint64_t seed, uint64_t stream, uint64_t blk, double z[2]) {
    uint32_t r[4];
    Philox::block(seed, stream, blk, r);
    const uint64_t bits = ((uint64_t)r[0] << 32) | (uint64_t)r[1];
    const double u = ((double)bits + 0.5) * 5.421010862427522170037264e-20;  // 2^-64; rounds to 1 near the top: R = 0
    const double a = std::sqrt(-2.0 * std::log(u));
    const double t = 6.283185307179586476925286766559 * (((double)r[2] + 0.5) * (1.0 / 4294967296.0));
    z[0] = a * std::cos(t); z[1] = a * std::sin(t);
}

// Four standard normals from one Philox block: Box-Muller pairs (radius r0, angle r1) and (radius r2, angle r3)
// with 32-bit radius uniforms (the draws stop at 6.76σ). Only for noise that protects nothing -- the flow particles'
// smoothing noise and Brownian term; every privacy mechanism uses normal2.
static inline void normal4(uint64_t seed, uint64_t stream, uint64_t blk, double z[4]) {
    uint32_t r[4];
    Philox::block(seed, stream, blk, r);
    for (int p = 0; p < 2; ++p) {
        const double u = ((double)r[2 * p] + 0.5) * (1.0 / 4294967296.0);
        const double a = std::sqrt(-2.0 * std::log(u));
        const double t = 6.283185307179586476925286766559 * (((double)r[2 * p + 1] + 0.5) * (1.0 / 4294967296.0));
        z[2 * p] = a * std::cos(t); z[2 * p + 1] = a * std::sin(t);
    }
}

// normal number i of normal4's stream: component i & 3 of block i >> 2
static inline double normal4_at(uint64_t seed, uint64_t stream, uint64_t i) {
    double z[4];
    normal4(seed, stream, i >> 2, z);
    return z[i & 3];
}

// The standard normal number i of stream (seed, stream): component i & 1 of Philox block i >> 1.
static inline double normal_at(uint64_t seed, uint64_t stream, uint64_t i) {
    double z[2];
    normal2(seed, stream, i >> 1, z);
    return z[i & 1];
}

// out[j] = scale * N_{offset + j}(seed, stream), j in [0, n). Serial; call from inside a parallel region.
template <typename T>
static inline void fill_normal(T* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset, double scale) {
    int64_t j = 0;
    double z[2];
    if (n > 0 && ((offset + j) & 1)) { out[j] = (T)(scale * normal_at(seed, stream, offset + j)); ++j; }
    for (; j + 2 <= n; j += 2) {
        normal2(seed, stream, (offset + j) >> 1, z);
        out[j] = (T)(scale * z[0]); out[j + 1] = (T)(scale * z[1]);
    }
    for (; j < n; ++j) out[j] = (T)(scale * normal_at(seed, stream, offset + j));
}

// ------------------------------------------------------------------------------------------------------------
// Radix argsort (stable LSD, 11-bit digits) of float / double keys with uint32 indices
// ------------------------------------------------------------------------------------------------------------
template <typename T> struct KeyTraits;
template <> struct KeyTraits<float> {
    using U = uint32_t;
    static inline U encode(float f) { U u; std::memcpy(&u, &f, 4); return u ^ ((u >> 31) ? 0xFFFFFFFFu : 0x80000000u); }
};
template <> struct KeyTraits<double> {
    using U = uint64_t;
    static inline U encode(double f) {
        U u; std::memcpy(&u, &f, 8);
        return u ^ ((u >> 63) ? 0xFFFFFFFFFFFFFFFFull : 0x8000000000000000ull);
    }
};

// Per-thread scratch space, reused across calls to avoid reallocation.
template <typename T>
struct SortWorkspace {
    using U = typename KeyTraits<T>::U;
    std::vector<U> ka, kb;
    std::vector<uint32_t> ia, ib;
    void reserve(size_t n) {
        if (ka.size() < n) { ka.resize(n); kb.resize(n); ia.resize(n); ib.resize(n); }
    }
};

// perm[r] = index of the r-th smallest key; sorted[r] = keys[perm[r]] (either output may be nullptr).
// Ties keep their input order (stable). Keys must be finite (callers validate).
template <typename T>
void argsort(const T* keys, uint32_t n, uint32_t* perm, T* sorted, SortWorkspace<T>& ws) {
    using U = typename KeyTraits<T>::U;
    if (n == 0) return;
    if (n < 256) {  // small: comparison sort is cheaper than 3-6 histogram passes
        ws.reserve(n);
        uint32_t* idx = ws.ia.data();
        for (uint32_t i = 0; i < n; ++i) idx[i] = i;
        std::stable_sort(idx, idx + n, [keys](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
        for (uint32_t i = 0; i < n; ++i) {
            if (perm) perm[i] = idx[i];
            if (sorted) sorted[i] = keys[idx[i]];
        }
        return;
    }
    ws.reserve(n);
    U* ka = ws.ka.data(); U* kb = ws.kb.data();
    uint32_t* ia = ws.ia.data(); uint32_t* ib = ws.ib.data();
    constexpr int BITS = 11, RADIX = 1 << BITS;
    constexpr int PASSES = (int)((sizeof(U) * 8 + BITS - 1) / BITS);
    // one read of the keys builds every pass's histogram
    std::vector<uint32_t> hist((size_t)PASSES * RADIX, 0);
    for (uint32_t i = 0; i < n; ++i) {
        U k = KeyTraits<T>::encode(keys[i]);
        ka[i] = k; ia[i] = i;
        for (int p = 0; p < PASSES; ++p) hist[(size_t)p * RADIX + ((k >> (p * BITS)) & (RADIX - 1))]++;
    }
    for (int p = 0; p < PASSES; ++p) {
        uint32_t* h = &hist[(size_t)p * RADIX];
        // skip a pass whose digit is the same for every key (common for the top digits)
        bool trivial = false;
        for (int b = 0; b < RADIX; ++b) if (h[b]) { trivial = (h[b] == n); break; }
        if (trivial) continue;
        uint32_t sum = 0;
        for (int b = 0; b < RADIX; ++b) { uint32_t c = h[b]; h[b] = sum; sum += c; }
        const int shift = p * BITS;
        for (uint32_t i = 0; i < n; ++i) {
            U k = ka[i];
            uint32_t dst = h[(k >> shift) & (RADIX - 1)]++;
            kb[dst] = k; ib[dst] = ia[i];
        }
        std::swap(ka, kb); std::swap(ia, ib);
    }
    for (uint32_t i = 0; i < n; ++i) {
        if (perm) perm[i] = ia[i];
        if (sorted) sorted[i] = keys[ia[i]];
    }
}

}  // namespace fastdpot
