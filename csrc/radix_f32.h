// LSD radix sorts of float32 keys, shared by the sliced (csrc/sliced.cpp) and flow (csrc/flow.cpp) kernels.
//
// Keys are encoded to order-preserving uint32 (common.h's KeyTraits<float>), 11-bit digits in 3 passes; a pass whose
// digit is the same for every key is skipped. Argsorts pack (encoded key << 32 | index) into one uint64 so each pass
// moves one 8-byte stream; the index in the low bits makes the order stable (ties keep their input order), exactly
// as common.h's argsort.
//
//  * sort_emit_f32(keys, n, ws, emit): calls emit(rank, index, value) once per key; the last pass calls emit instead
//    of writing, so a caller that only needs each key's rank (the flow's quantile transport) writes no sorted
//    array. emit is called in no particular order of rank, once per index, after the last read of keys[index]: it
//    may overwrite it (the flow's residuals are written in place). Its passes move one of two layouts, the same
//    ranks either way (see Layout): indices only (2 bytes for n <= 65 536, else 4), each key's digit read from
//    keys[index], or the packed (key, index) words.
//  * argsort_f32(keys, n, perm, sorted, ws): perm[r] = index of the r-th smallest key, sorted[r] its value.
//  * sort_keys_f32(keys, n, sorted, ws): sorted values only (no indices; 4-byte elements).
// Outputs (perm, sorted) must not alias keys.
// Keys must not be NaN (callers validate their inputs).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
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
    std::vector<uint32_t> ka, kb; // keys only, or (sort_emit_f32, n > 65 536) indices
    std::vector<uint16_t> i16a, i16b;  // sort_emit_f32's indices, n <= 65 536
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

// The LSD passes of the packed argsort. EmitLast: the last pass calls emit(rank, index, value) instead of writing
// (returns nullptr); otherwise returns the sorted packed array (inside ws).
template <bool EmitLast, class Emit>
static inline const uint64_t* packed_passes(const float* keys, uint32_t n, Workspace& ws, Emit&& emit) {
    if (n == 0) return nullptr;
    if (ws.a.size() < n) { ws.a.resize(n); ws.b.resize(n); }
    uint64_t* src = ws.a.data();
    uint64_t* dst = ws.b.data();
    int todo[kPasses];
    const int np = n < kSmall ? -1 : plan_passes(keys, n, ws, todo);
    if (np <= 0) {  // small (std::sort of the distinct packed words) or every key encodes alike (input order)
        for (uint32_t i = 0; i < n; ++i) src[i] = ((uint64_t)encode(keys[i]) << 32) | i;
        if (np < 0) std::sort(src, src + n);
        if (!EmitLast) return src;
        for (uint32_t r = 0; r < n; ++r) emit(r, (uint32_t)src[r], decode((uint32_t)(src[r] >> 32)));
        return nullptr;
    }
    for (int t = 0; t < np; ++t) {
        uint32_t* h = ws.hist.data() + (size_t)todo[t] * kRadix;
        const int shift = todo[t] * kBits;
        const bool last = (t == np - 1);
        if (EmitLast && last && t == 0) {  // one pass: keys -> ranks
            for (uint32_t i = 0; i < n; ++i) {
                const float v = keys[i];
                emit(h[(encode(v) >> shift) & (kRadix - 1)]++, i, v);
            }
            return nullptr;
        }
        if (t == 0) {  // the first pass packs on the fly
            for (uint32_t i = 0; i < n; ++i) {
                const uint32_t k = encode(keys[i]);
                dst[h[(k >> shift) & (kRadix - 1)]++] = ((uint64_t)k << 32) | i;
            }
        } else if (EmitLast && last) {  // the last pass hands out ranks instead of writing a sorted array
            for (uint32_t i = 0; i < n; ++i) {
                const uint64_t v = src[i];
                const uint32_t k = (uint32_t)(v >> 32);
                emit(h[(k >> shift) & (kRadix - 1)]++, (uint32_t)v, decode(k));
            }
            return nullptr;
        } else {
            for (uint32_t i = 0; i < n; ++i) {
                const uint64_t v = src[i];
                dst[h[(v >> (32 + shift)) & (kRadix - 1)]++] = v;
            }
        }
        std::swap(src, dst);
    }
    return src;
}

// The LSD passes todo[0..np) of sort_emit_f32 on indices of type I (np >= 1; ws.hist holds the passes' prefix sums).
template <class I, class Emit>
static inline void index_passes(const float* keys, uint32_t n, const int* todo, int np, std::vector<I>& va,
                                std::vector<I>& vb, uint32_t* hist, Emit&& emit) {
    if (va.size() < n) { va.resize(n); vb.resize(n); }
    I* src = va.data();
    I* dst = vb.data();
    for (int t = 0; t < np; ++t) {
        uint32_t* h = hist + (size_t)todo[t] * kRadix;
        const int shift = todo[t] * kBits;
        const bool first = (t == 0), last = (t == np - 1);
        for (uint32_t i = 0; i < n; ++i) {
            const uint32_t ix = first ? i : (uint32_t)src[i];
            const float v = keys[ix];
            const uint32_t pos = h[(encode(v) >> shift) & (kRadix - 1)]++;
            if (last) emit(pos, ix, v);
            else dst[pos] = (I)ix;
        }
        std::swap(src, dst);
    }
}

// The two layouts of sort_emit_f32's passes. kIndex moves 2- or 4-byte indices and gathers each key's digit from
// the keys: a quarter to half of the packed words' traffic, but a dependent load per key and pass. kPacked moves the
// 8-byte (key << 32 | index) words, read in order. Which is faster depends on the CPU and on n: on a 2-core AMD EPYC
// (Zen 4) kPacked took 4.9 / 5.1 / 17.7 ns a key at n = 6 000 / 10^5 / 10^6 against kIndex's 5.5 / 6.7 / 18.5 (the
// flow's residual pass, one thread), where round 8 had adopted kIndex on a Xeon.
// kAuto (the default) therefore times both on the calls' own keys, per size class (n's bit length), and keeps the
// faster: the first 2 * kTrials calls of a class alternate the layouts and the minimum time per key of each decides
// (a minimum: an interrupt during a trial cannot make a layout look faster). The ranks, hence every output, do not
// depend on the layout; only the time does.
enum Layout : int { kAuto = -1, kIndex = 0, kPacked = 1 };
constexpr uint32_t kTrials = 4;

struct LayoutTuner {
    struct Class {
        std::atomic<int> choice{kAuto};
        std::atomic<uint32_t> started{0}, finished{0};
        std::atomic<uint64_t> best[2] = {~0ull, ~0ull};  // picoseconds a key
    };
    std::atomic<int> forced{kAuto};
    Class cls[33];
    static int size_class(uint32_t n) { return 32 - __builtin_clz(n | 1u); }
    // the layout calls of n take now: forced, decided, or kAuto (still timing)
    int layout(uint32_t n) {
        const int f = forced.load(std::memory_order_relaxed);
        return f != kAuto ? f : cls[size_class(n)].choice.load(std::memory_order_relaxed);
    }
    void forget() {  // every class times its layouts again (after a change of forced back to kAuto)
        for (Class& c : cls) {
            c.choice = kAuto; c.started = 0; c.finished = 0; c.best[0] = ~0ull; c.best[1] = ~0ull;
        }
    }
};

// one per extension module (each .so holds its own): set_rank_layout / rank_layout of csrc/rank_layout_py.h
inline LayoutTuner& layout_tuner() {
    static LayoutTuner t;
    return t;
}

template <class Emit>
static inline void index_emit_f32(const float* keys, uint32_t n, Workspace& ws, Emit&& emit) {
    int todo[kPasses];
    const int np = plan_passes(keys, n, ws, todo);
    if (np == 0) {  // every key encodes alike: input order
        for (uint32_t i = 0; i < n; ++i) emit(i, i, keys[i]);
        return;
    }
    if (n <= 65536u) index_passes<uint16_t>(keys, n, todo, np, ws.i16a, ws.i16b, ws.hist.data(), emit);
    else index_passes<uint32_t>(keys, n, todo, np, ws.ka, ws.kb, ws.hist.data(), emit);
}

template <class Emit>
static inline void sort_emit_f32(const float* keys, uint32_t n, Workspace& ws, Emit&& emit) {
    if (n < kSmall) {  // small: std::sort of the packed words
        packed_passes<true>(keys, n, ws, emit);
        return;
    }
    auto run = [&](int layout) {
        if (layout == kPacked) packed_passes<true>(keys, n, ws, emit);
        else index_emit_f32(keys, n, ws, emit);
    };
    LayoutTuner& tu = layout_tuner();
    int lay = tu.layout(n);
    if (lay != kAuto) {
        run(lay);
        return;
    }
    LayoutTuner::Class& c = tu.cls[LayoutTuner::size_class(n)];
    lay = (int)(c.started.fetch_add(1, std::memory_order_relaxed) & 1u);
    const auto t0 = std::chrono::steady_clock::now();
    run(lay);
    const double ps = std::chrono::duration<double, std::pico>(std::chrono::steady_clock::now() - t0).count() / n;
    const uint64_t t = (uint64_t)ps;
    uint64_t cur = c.best[lay].load(std::memory_order_relaxed);
    while (t < cur && !c.best[lay].compare_exchange_weak(cur, t, std::memory_order_relaxed)) {}
    if (c.finished.fetch_add(1, std::memory_order_acq_rel) + 1 == 2 * kTrials)  // the last trial decides
        c.choice.store(c.best[kPacked].load() < c.best[kIndex].load() ? kPacked : kIndex, std::memory_order_relaxed);
}

// perm[r] = index of the r-th smallest key (stable); sorted[r] = keys[perm[r]] (either may be nullptr). The sorted
// packed array is split sequentially: two scattered 4-byte streams in the last pass cost more than that.
static inline void argsort_f32(const float* keys, uint32_t n, uint32_t* perm, float* sorted, Workspace& ws) {
    const uint64_t* v = packed_passes<false>(keys, n, ws, [](uint32_t, uint32_t, float) {});
    for (uint32_t r = 0; r < n; ++r) {
        if (perm) perm[r] = (uint32_t)v[r];
        if (sorted) sorted[r] = decode((uint32_t)(v[r] >> 32));
    }
}

// sorted[r] = r-th smallest key. Like sort_emit_f32, the first pass encodes straight from the keys and the last
// pass decodes straight into sorted.
static inline void sort_keys_f32(const float* keys, uint32_t n, float* sorted, Workspace& ws) {
    if (n < kSmall) { argsort_f32(keys, n, nullptr, sorted, ws); return; }
    int todo[kPasses];
    const int np = plan_passes(keys, n, ws, todo);
    if (np == 0) { std::copy(keys, keys + n, sorted); return; }
    if (ws.ka.size() < n) { ws.ka.resize(n); ws.kb.resize(n); }
    uint32_t* src = ws.ka.data();
    uint32_t* dst = ws.kb.data();
    for (int t = 0; t < np; ++t) {
        uint32_t* h = ws.hist.data() + (size_t)todo[t] * kRadix;
        const int shift = todo[t] * kBits;
        const bool first = (t == 0), last = (t == np - 1);
        for (uint32_t i = 0; i < n; ++i) {
            const uint32_t k = first ? encode(keys[i]) : src[i];
            const uint32_t pos = h[(k >> shift) & (kRadix - 1)]++;
            if (last) sorted[pos] = decode(k);
            else dst[pos] = k;
        }
        std::swap(src, dst);
    }
}

}  // namespace radix
}  // namespace fastdpot
