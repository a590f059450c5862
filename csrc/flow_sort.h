// Packed-key radix argsort of float32 keys (flow engineer's helper; the float64 path uses common.h's argsort).
//
// Each element is one uint64 (encoded key << 32 | index): an LSD radix sort on the top 32 bits (11-bit digits,
// passes whose digit is constant skipped) moves one 8-byte stream instead of two 4-byte streams, and the sorted
// float values are decoded from the keys sequentially instead of gathered. The index in the low bits makes the
// order stable (ties keep their input order), exactly as common.h's argsort.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

namespace fastdpot {
namespace flowsort {

struct PackedWorkspace {
    std::vector<uint64_t> a, b;
    std::vector<uint32_t> hist;
};

static inline float decode_key(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k ^ 0x80000000u) : ~k;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Sorts (encoded key << 32 | index) of keys[0..n) and returns the sorted packed array (inside ws): element r holds
// the index of the r-th smallest key (stable) in its low 32 bits and decode_key(v >> 32) is its value.
static inline const uint64_t* sort_packed_f32(const float* keys, uint32_t n, PackedWorkspace& ws) {
    if (ws.a.size() < n) { ws.a.resize(n); ws.b.resize(n); }
    uint64_t* src = ws.a.data();
    uint64_t* dst = ws.b.data();
    constexpr int BITS = 11, RADIX = 1 << BITS, PASSES = 3;
    for (uint32_t i = 0; i < n; ++i) src[i] = ((uint64_t)KeyTraits<float>::encode(keys[i]) << 32) | i;
    if (n < 512) {
        std::sort(src, src + n);  // distinct packed values: the same order as a stable sort of the keys
        return src;
    }
    ws.hist.assign((size_t)PASSES * RADIX, 0);
    uint32_t* hist = ws.hist.data();
    for (uint32_t i = 0; i < n; ++i) {
        const uint32_t k = (uint32_t)(src[i] >> 32);
        hist[k & (RADIX - 1)]++;
        hist[RADIX + ((k >> BITS) & (RADIX - 1))]++;
        hist[2 * RADIX + (k >> (2 * BITS))]++;
    }
    for (int p = 0; p < PASSES; ++p) {
        uint32_t* h = hist + (size_t)p * RADIX;
        bool trivial = false;
        for (int b = 0; b < RADIX; ++b) if (h[b]) { trivial = (h[b] == n); break; }
        if (trivial) continue;
        uint32_t sum = 0;
        for (int b = 0; b < RADIX; ++b) { uint32_t c = h[b]; h[b] = sum; sum += c; }
        const int shift = 32 + p * BITS;
        for (uint32_t i = 0; i < n; ++i) {
            const uint64_t v = src[i];
            dst[h[(v >> shift) & (RADIX - 1)]++] = v;
        }
        std::swap(src, dst);
    }
    return src;
}

// perm[r] = index of the r-th smallest key (stable); sorted[r] = keys[perm[r]] (either may be nullptr)
static inline void argsort_f32(const float* keys, uint32_t n, uint32_t* perm, float* sorted, PackedWorkspace& ws) {
    if (n == 0) return;
    const uint64_t* v = sort_packed_f32(keys, n, ws);
    for (uint32_t r = 0; r < n; ++r) {
        if (perm) perm[r] = (uint32_t)v[r];
        if (sorted) sorted[r] = decode_key((uint32_t)(v[r] >> 32));
    }
}

}  // namespace flowsort
}  // namespace fastdpot
