// Faster float32 sorts for the sliced kernels (header-only, C++17; complements csrc/common.h).
//
//  * sort_keys_f32: LSD radix sort of float keys only (no indices): used for a side that needs no gradient.
//  * argsort_packed_f32: LSD radix argsort with the encoded key and the 32-bit index packed in one 64-bit word,
//    so each pass scatters one 8-byte element instead of two 4-byte streams (fewer cache lines touched).
// Both are stable, give exactly the order of fastdpot::argsort (same key encoding, ties by input order) and fall
// back to it below 256 elements.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

namespace fastdpot {

struct SortWorkspaceF32 {
    std::vector<uint64_t> pa, pb;
    std::vector<uint32_t> ka, kb;
    SortWorkspace<float> small;
    std::vector<uint32_t> hist;
    SortWorkspaceF32() : hist(3 * 2048) {}
};

static inline float decode_f32(uint32_t e) {
    uint32_t u = e ^ ((e >> 31) ? 0x80000000u : 0xFFFFFFFFu);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// bits [0, 11), [11, 22), [22, 32) of the encoded key
static inline bool prefix_sums(uint32_t* h, int radix, uint32_t n) {
    for (int b = 0; b < radix; ++b)
        if (h[b]) { if (h[b] == n) return false; break; }  // one bucket holds everything: pass is a no-op
    uint32_t sum = 0;
    for (int b = 0; b < radix; ++b) { uint32_t c = h[b]; h[b] = sum; sum += c; }
    return true;
}

// sorted[r] = r-th smallest key (stable order is irrelevant for values)
inline void sort_keys_f32(const float* keys, uint32_t n, float* sorted, SortWorkspaceF32& ws) {
    if (n < 256) { argsort<float>(keys, n, nullptr, sorted, ws.small); return; }
    if (ws.ka.size() < n) { ws.ka.resize(n); ws.kb.resize(n); }
    uint32_t* a = ws.ka.data(); uint32_t* b = ws.kb.data();
    uint32_t* h = ws.hist.data();
    std::fill(ws.hist.begin(), ws.hist.end(), 0u);
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t k = KeyTraits<float>::encode(keys[i]);
        a[i] = k;
        h[k & 2047]++; h[2048 + ((k >> 11) & 2047)]++; h[4096 + (k >> 22)]++;
    }
    for (int p = 0; p < 3; ++p) {
        uint32_t* hp = h + 2048 * p;
        if (!prefix_sums(hp, 2048, n)) continue;
        const int shift = 11 * p;
        for (uint32_t i = 0; i < n; ++i) { uint32_t k = a[i]; b[hp[(k >> shift) & 2047]++] = k; }
        std::swap(a, b);
    }
    for (uint32_t i = 0; i < n; ++i) sorted[i] = decode_f32(a[i]);
}

// perm[r] = index of the r-th smallest key (ties by input order); sorted[r] = keys[perm[r]]
inline void argsort_packed_f32(const float* keys, uint32_t n, uint32_t* perm, float* sorted, SortWorkspaceF32& ws) {
    if (n < 256) { argsort<float>(keys, n, perm, sorted, ws.small); return; }
    if (ws.pa.size() < n) { ws.pa.resize(n); ws.pb.resize(n); }
    uint64_t* a = ws.pa.data(); uint64_t* b = ws.pb.data();
    uint32_t* h = ws.hist.data();
    std::fill(ws.hist.begin(), ws.hist.end(), 0u);
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t k = KeyTraits<float>::encode(keys[i]);
        a[i] = ((uint64_t)k << 32) | i;
        h[k & 2047]++; h[2048 + ((k >> 11) & 2047)]++; h[4096 + (k >> 22)]++;
    }
    for (int p = 0; p < 3; ++p) {
        uint32_t* hp = h + 2048 * p;
        if (!prefix_sums(hp, 2048, n)) continue;
        const int shift = 32 + 11 * p;
        for (uint32_t i = 0; i < n; ++i) { uint64_t v = a[i]; b[hp[(v >> shift) & 2047]++] = v; }
        std::swap(a, b);
    }
    for (uint32_t i = 0; i < n; ++i) {
        uint64_t v = a[i];
        perm[i] = (uint32_t)v;
        sorted[i] = decode_f32((uint32_t)(v >> 32));
    }
}

}  // namespace fastdpot
