// LSD radix sorts of float32 keys, shared by the sliced (csrc/sliced.cpp) and flow (csrc/flow.cpp) kernels.
//
// Keys are encoded to order-preserving uint32 (common.h's KeyTraits<float>), 11-bit digits in 3 passes; a pass whose
// digit is the same for every key is skipped. Argsorts pack (encoded key << 32 | index) into one uint64 so each pass
// moves one 8-byte stream; the index in the low bits makes the order stable (ties keep their input order), exactly
// as common.h's argsort.
//
//  * sort_emit_f32(keys, n, ws, emit): calls emit(rank, index, value) once per key. The first pass reads the keys
//    directly (no separate packing pass) and the last pass calls emit instead of writing the sorted array, so a
//    caller that only needs each key's rank (the flow's quantile transport) saves two passes over 8n bytes. emit is
//    called in no particular order of rank.
//  * argsort_f32(keys, n, perm, sorted, ws): perm[r] = index of the r-th smallest key, sorted[r] its value.
//  * sort_keys_f32(keys, n, sorted, ws): sorted values only (no indices; 4-byte elements).
// Keys must not be NaN (callers validate their inputs).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

namespace fastdpot {
namespace radix {

constexpr int kBits = 11, kRadix = 1 << kBits, kPasses = 3;
constexpr uint32_t kSmall = 512;  // below this, std::sort of the packed words

struct Workspace {
    std::vector<uint64_t> a, b;   // packed (key << 32 | index)
    std::vector<uint32_t> ka, kb; // keys only
    std::vector<uint32_t> hist;
};

static inline uint32_t encode(float f) { return KeyTraits<float>::encode(f); }

static inline float decode(uint32_t e) {
    uint32_t u = e ^ ((e >> 31) ? 0x80000000u : 0xFFFFFFFFu);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Histograms of the three digits of the encoded keys; turns the non-trivial ones into exclusive prefix sums and
// lists their passes in todo[0..return value).
static inline int plan_passes(const float* keys, uint32_t n, Workspace& ws, int* todo) {
    ws.hist.assign((size_t)kPasses * kRadix, 0u);
    uint32_t* h = ws.hist.data();
    for (uint32_t i = 0; i < n; ++i) {
        const uint32_t k = encode(keys[i]);
        h[k & (kRadix - 1)]++;
        h[kRadix + ((k >> kBits) & (kRadix - 1))]++;
        h[2 * kRadix + (k >> (2 * kBits))]++;
    }
    int np = 0;
    for (int p = 0; p < kPasses; ++p) {
        uint32_t* hp = h + (size_t)p * kRadix;
        bool trivial = false;
        for (int b = 0; b < kRadix; ++b)
            if (hp[b]) { trivial = (hp[b] == n); break; }  // one bucket holds everything: the pass is a no-op
        if (trivial) continue;
        uint32_t sum = 0;
        for (int b = 0; b < kRadix; ++b) { const uint32_t c = hp[b]; hp[b] = sum; sum += c; }
        todo[np++] = p;
    }
    return np;
}

template <class Emit>
static inline void sort_emit_f32(const float* keys, uint32_t n, Workspace& ws, Emit&& emit) {
    if (n == 0) return;
    if (ws.a.size() < n) { ws.a.resize(n); ws.b.resize(n); }
    if (n < kSmall) {
        uint64_t* s = ws.a.data();
        for (uint32_t i = 0; i < n; ++i) s[i] = ((uint64_t)encode(keys[i]) << 32) | i;
        std::sort(s, s + n);  // packed words are distinct: the same order as a stable sort of the keys
        for (uint32_t r = 0; r < n; ++r) emit(r, (uint32_t)s[r], decode((uint32_t)(s[r] >> 32)));
        return;
    }
    int todo[kPasses];
    const int np = plan_passes(keys, n, ws, todo);
    if (np == 0) {  // every key encodes to the same word: input order is the sorted order
        for (uint32_t r = 0; r < n; ++r) emit(r, r, keys[r]);
        return;
    }
    uint64_t* src = ws.a.data();
    uint64_t* dst = ws.b.data();
    for (int t = 0; t < np; ++t) {
        uint32_t* h = ws.hist.data() + (size_t)todo[t] * kRadix;
        const int shift = todo[t] * kBits;
        const bool last = (t == np - 1);
        if (t == 0 && last) {  // one pass: keys -> ranks
            for (uint32_t i = 0; i < n; ++i) {
                const float v = keys[i];
                emit(h[(encode(v) >> shift) & (kRadix - 1)]++, i, v);
            }
        } else if (t == 0) {  // first pass packs on the fly
            for (uint32_t i = 0; i < n; ++i) {
                const uint32_t k = encode(keys[i]);
                dst[h[(k >> shift) & (kRadix - 1)]++] = ((uint64_t)k << 32) | i;
            }
        } else if (last) {  // last pass: ranks instead of a sorted array
            for (uint32_t i = 0; i < n; ++i) {
                const uint64_t v = src[i];
                const uint32_t k = (uint32_t)(v >> 32);
                emit(h[(k >> shift) & (kRadix - 1)]++, (uint32_t)v, decode(k));
            }
        } else {
            for (uint32_t i = 0; i < n; ++i) {
                const uint64_t v = src[i];
                dst[h[(v >> (32 + shift)) & (kRadix - 1)]++] = v;
            }
        }
        std::swap(src, dst);
    }
}

// perm[r] = index of the r-th smallest key (stable); sorted[r] = keys[perm[r]] (either may be nullptr)
static inline void argsort_f32(const float* keys, uint32_t n, uint32_t* perm, float* sorted, Workspace& ws) {
    sort_emit_f32(keys, n, ws, [&](uint32_t r, uint32_t i, float v) {
        if (perm) perm[r] = i;
        if (sorted) sorted[r] = v;
    });
}

// sorted[r] = r-th smallest key
static inline void sort_keys_f32(const float* keys, uint32_t n, float* sorted, Workspace& ws) {
    if (n < kSmall) { argsort_f32(keys, n, nullptr, sorted, ws); return; }
    int todo[kPasses];
    const int np = plan_passes(keys, n, ws, todo);
    if (ws.ka.size() < n) { ws.ka.resize(n); ws.kb.resize(n); }
    uint32_t* a = ws.ka.data();
    uint32_t* b = ws.kb.data();
    for (uint32_t i = 0; i < n; ++i) a[i] = encode(keys[i]);
    for (int t = 0; t < np; ++t) {
        uint32_t* h = ws.hist.data() + (size_t)todo[t] * kRadix;
        const int shift = todo[t] * kBits;
        for (uint32_t i = 0; i < n; ++i) { const uint32_t k = a[i]; b[h[(k >> shift) & (kRadix - 1)]++] = k; }
        std::swap(a, b);
    }
    for (uint32_t i = 0; i < n; ++i) sorted[i] = decode(a[i]);
}

}  // namespace radix
}  // namespace fastdpot
