// Fast orthonormal direction blocks (fastdpot/_blocks.py): Θx and Θᵀy without forming Θ.
//
// A block is an orthonormal basis of R^D (D = C·H·W for images) applied as an operator on a tile of T particles held
// coordinate-major (X[c·T + t], T = 64 bytes / sizeof(S): 16 float or 8 double lanes, so that every inner loop is one
// SIMD vector wide and the output rows are the direction-major rows a per-direction sort reads):
//
//  * PatchDCT: an orthonormal colour transform across the C channels, then on every p × p patch of a grid shifted by
//    (s_y, s_x) (edge patches partial, h × w) the separable orthonormal 2-D DCT-II: two small matrix products, h²w + hw²
//    multiply-adds per patch, about 2·p·D per particle. Direction order: channel (after the colour transform) major,
//    then patches row-major over the grid, then (u, v) -> u·w + v inside the patch; the patch at rows [a, a + h) and
//    columns [c, c + w) starts at a·W + h·c. This is fastdpot.flows.directions.patch_block's order.
//  * Hadamard: R rounds of (a public permutation with random signs, then a block-diagonal Walsh–Hadamard transform
//    on power-of-two pieces of D, each scaled by 1/√size): O(D log D) per particle (Ailon & Chazelle, "The fast
//    Johnson–Lindenstrauss transform", SIAM J. Comput. 2009: randomised Hadamard rotations). Each factor is
//    orthogonal, so the product is.
//
// forward(X, Y): Y = Θ X (D coefficients per particle); transpose(Y, X): X = Θᵀ Y. The scratch holds 2·D·T + the
// largest patch's p²·T values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX__)
#define FASTDPOT_STREAM_STORES 1  // stream_lanes / stream_fence have non-temporal instructions to use
#include <immintrin.h>
#endif

namespace fastdpot {
namespace blocks {

struct Band {
    int64_t start, size;
};

template <typename S>
struct Transform {
    static constexpr int T = 64 / (int)sizeof(S);
    int64_t D = 0;
    virtual ~Transform() = default;
    virtual void forward(const S* X, S* Y, S* scratch) const = 0;
    virtual void transpose(const S* Y, S* X, S* scratch) const = 0;
    virtual size_t scratch_size() const { return (size_t)2 * D * T; }
    // Row bands (a block that acts on a few image rows at a time; 0: none, the block mixes all D coordinates). Band
    // k holds, in each of `channels()` channels, the coordinates [ch·plane() + start, ch·plane() + start + size) of
    // both x and Θx; forward_band / transpose_band map them, held channel after channel (x_band[(ch·size + q)·T]),
    // as forward / transpose do on the whole tile, value for value. A tile then passes through the block one band
    // at a time in a buffer of C·size·T values (98 KB for 8 rows of a 64 × 64 × 3 float image) instead of D·T
    // (786 KB), which stays in a core's L2 cache.
    virtual int64_t band_count() const { return 0; }
    virtual Band band(int64_t) const { return Band{0, D}; }
    virtual int64_t channels() const { return 1; }
    virtual int64_t plane() const { return D; }
    // a block with band_count() > 0 overrides both; the others are never asked (a loud failure, not a silent no-op)
    virtual void forward_band(int64_t, const S*, S*, S*) const { throw std::logic_error("block has no row bands"); }
    virtual void transpose_band(int64_t, const S*, S*, S*) const { throw std::logic_error("block has no row bands"); }
};

// C (m × n vectors of T lanes, row stride ldc) = A (m × k, row stride lda) · B (k × n vectors, row stride ldb): the
// separable DCT's small products on a tile, four rows of A at a time (four independent accumulator vectors per B
// load, so the FMA chains overlap).
// One tile row of T lanes as a GCC vector (64 bytes: one zmm with AVX-512, two ymm with AVX2), so that the small
// products' accumulators stay in registers whatever the compiler's cost model decides for plain loops.
template <typename S, int T>
struct Lanes {
    typedef S type __attribute__((vector_size(T * sizeof(S))));
};

template <typename S, int T>
static inline typename Lanes<S, T>::type load_lanes(const S* p) {
    typename Lanes<S, T>::type v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

template <typename S, int T>
static inline void store_lanes(S* p, const typename Lanes<S, T>::type& v) {
    std::memcpy(p, &v, sizeof(v));
}

// stream_lanes: store_lanes past the caches (a non-temporal store: the line is not read before it is written, nor
// kept), where p is 64-byte aligned and the build has AVX-512 F or AVX; elsewhere a plain store. For outputs too large
// to be read again from the caches (the step's new particles beyond a few MB: 3 to 5 % of a pixel step at
// 60 000 x 784 and 5 to 12 % at 10^6 x 784, on a 2-core AMD EPYC). stream_fence() after the last one of a thread:
// non-temporal stores are not ordered with the stores that follow.
template <typename S, int T>
static inline void stream_lanes(S* p, const typename Lanes<S, T>::type& v) {
    static_assert(sizeof(v) == 64, "a tile row is one 64-byte line");
#ifdef FASTDPOT_STREAM_STORES
    if (((uintptr_t)p & 63) == 0) {
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<S, float>) _mm512_stream_ps(p, (__m512)v);
        else _mm512_stream_pd(p, (__m512d)v);
#else
        char* q = reinterpret_cast<char*>(p);
        __m256 lo, hi;
        std::memcpy(&lo, &v, 32);
        std::memcpy(&hi, reinterpret_cast<const char*>(&v) + 32, 32);
        _mm256_stream_ps(reinterpret_cast<float*>(q), lo);
        _mm256_stream_ps(reinterpret_cast<float*>(q + 32), hi);
#endif
        return;
    }
#endif
    store_lanes<S, T>(p, v);
}

static inline void stream_fence() {
#ifdef FASTDPOT_STREAM_STORES
    _mm_sfence();
#endif
}

// C (m × n vectors of T lanes, row stride ldc) = A (m × k, row stride lda) · B (k × n vectors, row stride ldb): the
// separable DCT's small products on a tile, four rows of A at a time (four independent accumulator vectors per B
// load, so the FMA chains overlap).
template <typename S, int T>
inline void small_gemm(const S* A, int64_t lda, const S* B, int64_t ldb, S* C, int64_t ldc, int64_t m, int64_t k,
                       int64_t n) {
    using V = typename Lanes<S, T>::type;
    int64_t i = 0;
    for (; i + 4 <= m; i += 4)
        for (int64_t j = 0; j < n; ++j) {
            V c0 = {}, c1 = {}, c2 = {}, c3 = {};
            const S* a = A + i * lda;
            for (int64_t l = 0; l < k; ++l) {
                const V b = load_lanes<S, T>(B + l * ldb + j * T);
                c0 += a[l] * b;
                c1 += a[lda + l] * b;
                c2 += a[2 * lda + l] * b;
                c3 += a[3 * lda + l] * b;
            }
            S* c = C + i * ldc + j * T;
            store_lanes<S, T>(c, c0);
            store_lanes<S, T>(c + ldc, c1);
            store_lanes<S, T>(c + 2 * ldc, c2);
            store_lanes<S, T>(c + 3 * ldc, c3);
        }
    for (; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            V c0 = {};
            for (int64_t l = 0; l < k; ++l) c0 += A[i * lda + l] * load_lanes<S, T>(B + l * ldb + j * T);
            store_lanes<S, T>(C + i * ldc + j * T, c0);
        }
}

// The same product for a square A of a compile-time size K <= 8 (every patch size of the default plans, and their
// partial edges): the K input vectors of a column held in registers, K accumulator chains interleaved, the loops
// unrolled. The sums run in the same order as small_gemm's (l = 0, 1, ...), so both give the same numbers.
template <typename S, int T, int K>
inline void square_gemm_fixed(const S* A, int64_t lda, const S* B, int64_t ldb, S* C, int64_t ldc, int64_t n) {
    using V = typename Lanes<S, T>::type;
    for (int64_t j = 0; j < n; ++j) {
        V b[K];
        for (int l = 0; l < K; ++l) b[l] = load_lanes<S, T>(B + l * ldb + j * T);
        V c[K];
        for (int i = 0; i < K; ++i) c[i] = A[i * lda] * b[0];
        for (int l = 1; l < K; ++l)
            for (int i = 0; i < K; ++i) c[i] += A[i * lda + l] * b[l];
        for (int i = 0; i < K; ++i) store_lanes<S, T>(C + i * ldc + j * T, c[i]);
    }
}

// C = A · B for a square A (k × k): the fixed-size kernel where one exists, small_gemm otherwise.
template <typename S, int T>
inline void square_gemm(const S* A, int64_t lda, const S* B, int64_t ldb, S* C, int64_t ldc, int64_t k, int64_t n) {
    switch (k) {
        case 1: square_gemm_fixed<S, T, 1>(A, lda, B, ldb, C, ldc, n); return;
        case 2: square_gemm_fixed<S, T, 2>(A, lda, B, ldb, C, ldc, n); return;
        case 3: square_gemm_fixed<S, T, 3>(A, lda, B, ldb, C, ldc, n); return;
        case 4: square_gemm_fixed<S, T, 4>(A, lda, B, ldb, C, ldc, n); return;
        case 5: square_gemm_fixed<S, T, 5>(A, lda, B, ldb, C, ldc, n); return;
        case 6: square_gemm_fixed<S, T, 6>(A, lda, B, ldb, C, ldc, n); return;
        case 7: square_gemm_fixed<S, T, 7>(A, lda, B, ldb, C, ldc, n); return;
        case 8: square_gemm_fixed<S, T, 8>(A, lda, B, ldb, C, ldc, n); return;
        default: small_gemm<S, T>(A, lda, B, ldb, C, ldc, k, k, n);
    }
}

template <typename S>
struct PatchDCT final : Transform<S> {
    using Transform<S>::D;
    static constexpr int T = Transform<S>::T;
    int64_t C = 1, H = 0, W = 0, maxp = 1;
    std::vector<S> colour;        // C × C, row = output channel
    bool identity_colour = true;
    std::vector<Band> rows, cols; // the grid's row and column bands
    std::vector<S> dct;           // the orthonormal DCT-II matrices of every band size, concatenated
    std::vector<S> dct_t;         // the same, each transposed
    std::vector<int64_t> off;     // off[size]: where that size's matrix starts in dct (-1: unused)

    size_t scratch_size() const override { return (size_t)D * T + (size_t)maxp * maxp * T; }

    int64_t band_count() const override { return (int64_t)rows.size(); }
    Band band(int64_t k) const override { return Band{rows[k].start * W, rows[k].size * W}; }
    int64_t channels() const override { return C; }
    int64_t plane() const override { return H * W; }

    // The rows of band k (ch_stride: the distance between two channels' first rows in X and Y, in values): the colour
    // transform, then every patch of the band. Patch (a, c) of the whole image starts at a·W + h·c in its channel,
    // so the band's coefficients fill the same range [a·W, (a + h)·W) as its pixels.
    void forward_rows(int64_t k, const S* X, S* Y, int64_t ch_stride, S* scr) const {
        const int64_t h = rows[k].size, n = h * W;
        const S* src = X;
        int64_t stride = ch_stride;
        if (!identity_colour) {  // colour first: it acts on the channel index only, so it commutes with the DCT
            S* mixed = scr;
            for (int64_t cc = 0; cc < C; ++cc)
                for (int64_t q = 0; q < n; ++q) {
                    S acc[T] = {};
                    for (int64_t ch = 0; ch < C; ++ch) {
                        const S a = colour[cc * C + ch];
                        const S* x = X + ch * ch_stride + q * T;
                        for (int t = 0; t < T; ++t) acc[t] += a * x[t];
                    }
                    std::memcpy(mixed + (cc * n + q) * T, acc, sizeof(acc));
                }
            src = mixed;
            stride = n * T;
        }
        S* tmp = scr + (size_t)C * n * T;
        for (int64_t ch = 0; ch < C; ++ch) {
            const S* band = src + ch * stride;
            S* out = Y + ch * ch_stride;
            for (const Band& cb : cols) {
                const int64_t c = cb.start, w = cb.size;
                // tmp (h × w) = Dh · patch (the band's rows, columns c..)
                square_gemm<S, T>(dct.data() + off[h], h, band + c * T, W * T, tmp, w * T, h, w);
                // out[u·w + v] = Σ_x Dw[v][x] · tmp[u][x]: per row u, Dw · tmp_u
                S* o = out + h * c * T;
                for (int64_t u = 0; u < h; ++u)
                    square_gemm<S, T>(dct.data() + off[w], w, tmp + u * w * T, T, o + u * w * T, T, w, 1);
            }
        }
    }

    void transpose_rows(int64_t k, const S* Y, S* X, int64_t ch_stride, S* scr) const {
        const int64_t h = rows[k].size, n = h * W;
        S* dst = identity_colour ? X : scr;
        const int64_t stride = identity_colour ? ch_stride : n * T;
        S* tmp = scr + (size_t)C * n * T;
        for (int64_t ch = 0; ch < C; ++ch) {
            const S* in = Y + ch * ch_stride;
            S* band = dst + ch * stride;
            for (const Band& cb : cols) {
                const int64_t c = cb.start, w = cb.size;
                const S* yi = in + h * c * T;
                // tmp[u][x] = Σ_v Dw[v][x] · y[u·w + v]: per row u, Dwᵀ · y_u
                for (int64_t u = 0; u < h; ++u)
                    square_gemm<S, T>(dct_t.data() + off[w], w, yi + u * w * T, T, tmp + u * w * T, T, w, 1);
                // band[y][c + x] = Σ_u Dh[u][y] · tmp[u][x]: Dhᵀ · tmp into the patch's rows
                square_gemm<S, T>(dct_t.data() + off[h], h, tmp, w * T, band + c * T, W * T, h, w);
            }
        }
        if (!identity_colour)  // X[ch] = Σ_cc colour[cc][ch] · dst[cc]
            for (int64_t ch = 0; ch < C; ++ch)
                for (int64_t q = 0; q < n; ++q) {
                    S acc[T] = {};
                    for (int64_t cc = 0; cc < C; ++cc) {
                        const S a = colour[cc * C + ch];
                        const S* p = dst + (cc * n + q) * T;
                        for (int t = 0; t < T; ++t) acc[t] += a * p[t];
                    }
                    std::memcpy(X + ch * ch_stride + q * T, acc, sizeof(acc));
                }
    }

    void forward_band(int64_t k, const S* X, S* Y, S* scr) const override {
        forward_rows(k, X, Y, rows[k].size * W * T, scr);
    }
    void transpose_band(int64_t k, const S* Y, S* X, S* scr) const override {
        transpose_rows(k, Y, X, rows[k].size * W * T, scr);
    }
    void forward(const S* X, S* Y, S* scr) const override {
        for (int64_t k = 0; k < band_count(); ++k) {
            const int64_t at = rows[k].start * W * T;
            forward_rows(k, X + at, Y + at, H * W * T, scr);
        }
    }
    void transpose(const S* Y, S* X, S* scr) const override {
        for (int64_t k = 0; k < band_count(); ++k) {
            const int64_t at = rows[k].start * W * T;
            transpose_rows(k, Y + at, X + at, H * W * T, scr);
        }
    }
};

template <typename S>
struct Hadamard final : Transform<S> {
    using Transform<S>::D;
    static constexpr int T = Transform<S>::T;
    int64_t rounds = 0;
    std::vector<int64_t> perm;  // rounds × D: round r reads coordinate perm[r][i] into place i ...
    std::vector<S> sign;        // ... times sign[r][i] (±1)
    std::vector<Band> pieces;   // the block-diagonal Walsh–Hadamard pieces (power-of-two sizes covering [0, D))

    // every piece: the Walsh–Hadamard butterflies, then 1/√size (orthonormal, symmetric). Two stages (len, 2·len) run
    // as one radix-4 pass over the piece, which halves the passes through the tile (a 512-piece of 16 float lanes
    // is 32 KB: the stages ran from L2); the arithmetic is the radix-2 stages' exactly ((x0 ± x1) ± (x2 ± x3), the
    // same sums in the same order), and the scale is applied to the last stage's outputs as they are written (the
    // other stages' by 1, which is exact), as a separate pass would: the same values bit for bit.
    void wht(S* v) const {
        using V = typename Lanes<S, T>::type;
        for (const Band& pc : pieces) {
            S* b = v + pc.start * T;
            const int64_t n = pc.size;
            const S s = (S)(1.0 / std::sqrt((double)n));
            if (n == 1) {
                for (int t = 0; t < T; ++t) b[t] *= s;
                continue;
            }
            int64_t len = 1;
            while (len < n) {
                const bool four = 4 * len <= n, last = (four ? 4 * len : 2 * len) == n;
                const S sc = last ? s : (S)1;
                if (four) {
                    for (int64_t i = 0; i < n; i += 4 * len)
                        for (int64_t j = i; j < i + len; ++j) {
                            S* p0 = b + j * T;
                            S* p1 = p0 + len * T;
                            S* p2 = p1 + len * T;
                            S* p3 = p2 + len * T;
                            const V x0 = load_lanes<S, T>(p0), x1 = load_lanes<S, T>(p1);
                            const V x2 = load_lanes<S, T>(p2), x3 = load_lanes<S, T>(p3);
                            const V a = x0 + x1, bb = x0 - x1, c = x2 + x3, d = x2 - x3;
                            store_lanes<S, T>(p0, (a + c) * sc);
                            store_lanes<S, T>(p1, (bb + d) * sc);
                            store_lanes<S, T>(p2, (a - c) * sc);
                            store_lanes<S, T>(p3, (bb - d) * sc);
                        }
                    len *= 4;
                } else {
                    for (int64_t i = 0; i < n; i += 2 * len)
                        for (int64_t j = i; j < i + len; ++j) {
                            S* p = b + j * T;
                            S* q = p + len * T;
                            const V x = load_lanes<S, T>(p), y = load_lanes<S, T>(q);
                            store_lanes<S, T>(p, (x + y) * sc);
                            store_lanes<S, T>(q, (x - y) * sc);
                        }
                    len *= 2;
                }
            }
        }
    }

    void forward(const S* X, S* Y, S* scr) const override {
        const S* cur = X;
        for (int64_t r = 0; r < rounds; ++r) {
            S* nxt = (r == rounds - 1) ? Y : scr + (size_t)(r % 2) * D * T;
            const int64_t* pr = perm.data() + r * D;
            const S* sr = sign.data() + r * D;
            for (int64_t i = 0; i < D; ++i) {
                const S* p = cur + pr[i] * T;
                S* o = nxt + i * T;
                for (int t = 0; t < T; ++t) o[t] = sr[i] * p[t];
            }
            wht(nxt);
            cur = nxt;
        }
    }

    void transpose(const S* Y, S* X, S* scr) const override {
        S* a = scr;  // the rounds undone in reverse on a copy, so that Y is never written
        S* b = scr + (size_t)D * T;
        std::memcpy(a, Y, sizeof(S) * (size_t)D * T);
        for (int64_t r = rounds - 1; r >= 0; --r) {
            wht(a);
            S* nxt = (r == 0) ? X : b;
            const int64_t* pr = perm.data() + r * D;
            const S* sr = sign.data() + r * D;
            for (int64_t i = 0; i < D; ++i) {
                const S* p = a + i * T;
                S* o = nxt + pr[i] * T;
                for (int t = 0; t < T; ++t) o[t] = sr[i] * p[t];
            }
            std::swap(a, b);
        }
    }
};

}  // namespace blocks
}  // namespace fastdpot
