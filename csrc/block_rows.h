// Tiles of particles for the fast direction blocks (csrc/flow_block.cpp): the rows of an (N, W) particle matrix
// moved to and from a coordinate-major tile buffer of T particles (whole, a range of rows, or a block's row band),
// with the prefetch of each row's next line, and the finiteness of a tile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "block_transforms.h"

namespace fastdpot {
namespace blocks {

// Prefetch the next tile's line of a coordinate-major row (rw: 0 read, 1 write) while the tile at i0 is worked on:
// a tile touches every one of the D rows, too many streams for the hardware prefetchers.
template <int RW, typename S>
inline void prefetch_next(const S* row, int64_t i0, int64_t N) {
    constexpr int T = Transform<S>::T;
    if (i0 + T < N) __builtin_prefetch(row + T, RW, 3);
}

// An (N, W) matrix of particle rows, stored particle-major (m[i·W + c], a C-contiguous (N, W) tensor) or
// coordinate-major (m[c·N + i]: the transpose of a C-contiguous (W, N) tensor, which a flow may keep so that no
// tile is ever transposed); tiles of T particles move between it and a coordinate-major tile buffer (c·T + t).
template <typename S>
struct Rows {
    S* m;
    int64_t N, W;
    bool cm;
    bool stream = false;  // store(): whole tiles of a coordinate-major matrix past the caches (stream_lanes)
    static constexpr int T = Transform<S>::T;
    // rows [c0, c0 + len) only (len < 0: all W) into a[(c - c0)·T + t]; with an index, all W rows into
    // a[index[c]·T + t]
    void load(int64_t i0, int64_t cnt, S* a, const int64_t* index = nullptr, int64_t c0 = 0, int64_t len = -1) const {
        const int64_t c1 = len < 0 ? W : c0 + len;
        if (cnt < T) std::fill(a, a + (index ? 0 : (c1 - c0) * T), (S)0);
        for (int64_t c = c0; c < c1; ++c) {
            S* dst = a + (index ? index[c] : c - c0) * T;
            if (cm) {
                const S* row = m + c * N + i0;
                prefetch_next<0>(row, i0, N);
                if (cnt == T) std::memcpy(dst, row, sizeof(S) * T);  // a fixed size: inlined
                else std::memcpy(dst, row, sizeof(S) * cnt);
            } else {
                for (int64_t t = 0; t < cnt; ++t) dst[t] = m[(i0 + t) * W + c];
            }
            if (index && cnt < T) std::fill(dst + cnt, dst + T, (S)0);
        }
    }
    void store(int64_t i0, int64_t cnt, const S* a, const int64_t* index = nullptr, int64_t c0 = 0,
               int64_t len = -1) const {  // the reverse
        const int64_t c1 = len < 0 ? W : c0 + len;
        for (int64_t c = c0; c < c1; ++c) {
            const S* src = a + (index ? index[c] : c - c0) * T;
            if (cm) {
                S* row = m + c * N + i0;
                if (stream && cnt == T) { stream_lanes<S, T>(row, load_lanes<S, T>(src)); continue; }
                prefetch_next<1>(row, i0, N);
                if (cnt == T) std::memcpy(row, src, sizeof(S) * T);
                else std::memcpy(row, src, sizeof(S) * cnt);
            } else
                for (int64_t t = 0; t < cnt; ++t) m[(i0 + t) * W + c] = src[t];
        }
    }
    // band k of a block with row bands (Transform::band): its rows of every channel, channel after channel
    template <class Tr>
    void load_band(int64_t i0, int64_t cnt, S* a, const Tr& tr, int64_t k) const {
        const Band b = tr.band(k);
        for (int64_t ch = 0; ch < tr.channels(); ++ch)
            load(i0, cnt, a + ch * b.size * T, nullptr, ch * tr.plane() + b.start, b.size);
    }
    template <class Tr>
    void store_band(int64_t i0, int64_t cnt, const S* a, const Tr& tr, int64_t k) const {
        const Band b = tr.band(k);
        for (int64_t ch = 0; ch < tr.channels(); ++ch)
            store(i0, cnt, a + ch * b.size * T, nullptr, ch * tr.plane() + b.start, b.size);
    }
};

// Whether a tile of W vectors of T lanes holds only finite values: v − v is +0 for a finite v and NaN for ±Inf or
// NaN, so the lane sums stay 0 exactly when every value is finite (IEEE arithmetic: the build never assumes finite
// math, setup.py).
template <typename S>
inline bool tile_finite(const S* a, int64_t W) {
    constexpr int T = Transform<S>::T;
    using V = typename Lanes<S, T>::type;
    V acc{};
    for (int64_t c = 0; c < W; ++c) {
        const V v = load_lanes<S, T>(a + c * T);
        acc += v - v;
    }
    bool ok = true;
    for (int t = 0; t < T; ++t) ok &= (acc[t] == (S)0);
    return ok;
}

}  // namespace blocks
}  // namespace fastdpot
