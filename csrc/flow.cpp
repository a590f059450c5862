// Fused CPU step of the (DP) sliced-Wasserstein particle flow -- Sebag et al., TMLR, fastdpot/reference/flow.py.
// The quantities keep their Python names: noise_std σ, step_size h, diffusion λ, num_quantiles Q.
//
// For each chunk of C directions (C bounded so the chunk's projections take <= ~FASTDPOT_FLOW_CHUNK_MB = 256 MB):
//   a. projections s_ij = <x_i, θ_j> + σ·N4(seed, stream 2j, i) (Philox of common.h, four normals per block:
//      the smoothing noise of the particles protects nothing, see flow_normal.h's fill_normal_smooth), blocked
//      over particles, with an 8-particle x 64-byte register tile of directions (flow_tiles.h; AVX-512: transposed
//      in registers);
//   b. per direction (OpenMP over directions): radix argsort of the noisy particle projections (float32: packed
//      key|index sort of radix_f32.h, whose last pass hands each rank straight to the transport in exact mode;
//      float64: common.h's argsort); the noisy private projections <y_m, θ_j> + σ·N(seed, stream 2j+1, m), sorted;
//      target of rank r:
//        exact (num_quantiles == 0): private quantile at level r/(N-1), i.e. linear interpolation at position
//                        r(M-1)/(N-1);
//        grid  (num_quantiles = Q >= 2): the authors' Q-level grid (particle quantiles xq, private quantiles tq, cdf
//                        by linear interpolation through xq -- a forward walk over the sorted values, no search --
//                        then T = interp(cdf; levels -> tq));
//        table (sketch mode, TB != nullptr, M == 0): no private rows; the particle level u (exact: r/(N-1); grid:
//                        the grid CDF above) maps to Q_j(u), piecewise linear through (LV[l], TB[j*L + l]), end
//                        segments extended, u clamped to [0, 1], constant when L == 1 (table_at below;
//                        fastdpot.reference.flow.table_quantiles);
//      residual s_ij - T_ij stored in place (the private rows' noise N(seed, 2j+1, m) is the privacy-grade stream,
//      two normals per block with a 64-bit radius uniform);
//   c. drift_i += Σ_j residual_ij θ_j (blocked over particles, 4-particle x 64-, 96- or 192-byte register tile of
//      coordinates, flow_tiles.h; the first chunk writes the drift, so it needs no zero fill). In the last chunk each block of
//      particles then takes drift /= k and x_i <- x_i - h·drift_i + sqrt(2λh)·ξ_i with ξ = N4(seed, stream 2k,
//      i·d + c) while its drift rows are still in cache.
// Noise element indices depend only on (seed, stream, index): results do not depend on threads or chunking.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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
#include "flow_sketch.h"
#include "flow_tiles.h"
#include "radix_f32.h"
#include "rank_layout_py.h"

namespace py = pybind11;
using namespace fastdpot;
using namespace fastdpot::flowtile;

namespace {

constexpr int64_t kBlock = 64;                          // particles per block (multiple of 4: aligned Philox)
#ifndef FASTDPOT_FLOW_CHUNK_MB
#define FASTDPOT_FLOW_CHUNK_MB 256
#endif
constexpr double kChunkBytes = FASTDPOT_FLOW_CHUNK_MB * 1024.0 * 1024;  // projections buffer per chunk of directions

// linear-interpolation quantile of sorted v[0..n) at level u in [0, 1] (numpy "linear": position u(n-1))
template <typename T>
static inline double quantile_sorted(const T* v, int64_t n, double u) {
    double pos = u * (double)(n - 1);
    int64_t lo = (int64_t)std::floor(pos);
    if (lo < 0) lo = 0;
    if (lo >= n - 1) return (double)v[n - 1];
    double f = pos - (double)lo;
    return (double)v[lo] + f * ((double)v[lo + 1] - (double)v[lo]);
}

// sorted v[0..n) linearly interpolated at position pos >= 0 (the exact mode's target: pos = r(M-1)/(N-1))
template <typename T>
static inline double value_at_position(const T* v, int64_t n, double pos) {
    const int64_t lo = (int64_t)pos;
    if (lo >= n - 1) return (double)v[n - 1];
    return (double)v[lo] + (pos - (double)lo) * ((double)v[lo + 1] - (double)v[lo]);
}

// Q_j(u) of a quantile table row tb[0..L) at strictly increasing levels lv[0..L) (sketch mode): piecewise linear,
// the first / last segment extended over [0, lv[0]] / [lv[L-1], 1], u clamped to [0, 1], tb[0] when L == 1.
// Segment s: lv[s] <= u < lv[s+1] (binary search), clamped to [0, L-2], as torch.searchsorted(right=True) - 1.
static inline double table_at(const double* lv, const double* tb, int64_t L, double u) {
    if (L == 1) return tb[0];
    u = u < 0.0 ? 0.0 : (u > 1.0 ? 1.0 : u);
    int64_t s = (int64_t)(std::upper_bound(lv, lv + L, u) - lv) - 1;
    s = s < 0 ? 0 : (s > L - 2 ? L - 2 : s);
    return tb[s] + (u - lv[s]) * ((tb[s + 1] - tb[s]) / (lv[s + 1] - lv[s]));
}

template <typename T>
struct DirScratch {
    std::vector<uint32_t> perm;
    std::vector<T> sx, ys;
    std::vector<double> xq, tq, tr;  // tr: sketch mode, the target of every rank
    SortWorkspace<T> ws;
    radix::Workspace pws;
};

template <typename T>
void flow_step_impl(const T* X, int64_t N, int64_t d, const T* Y, int64_t M, const T* TH, int64_t K, double noise_std,
                    double step_size, double diffusion, uint64_t seed, int64_t num_quantiles, T* out_new,
                    T* out_drift, T* nx_out, T* ny_out, T* br_out, int64_t max_chunk, const double* TB = nullptr,
                    const double* LV = nullptr, int64_t L = 0) {
    int64_t C = (int64_t)(kChunkBytes / ((double)N * sizeof(T)));
    if (max_chunk > 0) C = std::min(C, max_chunk);  // tests force several chunks at small sizes
    C = std::max<int64_t>(1, std::min<int64_t>(C, K));
    std::unique_ptr<T[]> P(new T[(size_t)C * (size_t)N]);  // uninitialised: pass a writes every element first
    constexpr int JT = 64 / sizeof(T);  // directions (projection) / coordinates (drift) per register tile
    // The drift tile spans 3, 1.5 or 1 times JT coordinates (48 / 24 / 16 float): the widest that pads d least.
    // Four particles x 48 float coordinates is twelve 64-byte accumulators, one column tile at d = 48: each
    // residual is read once instead of two or three times.
    constexpr int JW3 = 3 * JT, JW2 = JT + JT / 2;
    auto padded = [d](int64_t w) { return ((d + w - 1) / w) * w; };
    const int64_t cpad = ((C + JT - 1) / JT) * JT;
    const int width = padded(JW3) <= padded(JW2) && padded(JW3) <= padded(JT) ? JW3
                      : padded(JW2) <= padded(JT)                            ? JW2
                                                                             : JT;
    const int64_t dpad = padded(width);
    std::vector<T> thT((size_t)d * (size_t)cpad);   // chunk of Θ transposed, zero-padded: thT[c*cpad + jj]
    std::vector<T> thP((size_t)C * (size_t)dpad);   // chunk of Θ, zero-padded: thP[jj*dpad + c]
    // small problems run on one thread: OpenMP barriers cost more than the work (and much more on a busy machine)
    const int nthreads = ((double)N * (double)K * (double)(d + 8) < 4.0e6) ? 1 : omp_get_max_threads();
    // The outputs are first-touched here, one write per 4 KiB page, in parallel: callers hand in freshly allocated
    // arrays, and a page first written late in the step can cost far more than one written now (a VM that returns
    // freed memory to its host makes the drift rows first written in pass c take host faults).
    {
        constexpr int64_t kPage = 4096 / sizeof(T);
        const int64_t nd = N * d;
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t e = 0; e < nd; e += kPage) { out_new[e] = (T)0; out_drift[e] = (T)0; }
    }
    std::vector<DirScratch<T>> scratch(nthreads);
    std::vector<double> levels;
    if (num_quantiles >= 2) {
        levels.resize(num_quantiles);
        for (int64_t q = 0; q < num_quantiles; ++q) levels[q] = (double)q / (double)(num_quantiles - 1);
        levels[num_quantiles - 1] = 1.0;
    }
    const int64_t nblocks = (N + kBlock - 1) / kBlock;

    const T inv_k = (T)(1.0 / (double)K);
    // sqrt(2·diffusion·step_size): the standard deviation of the Brownian term, a quantity derived from λ and h
    const double brownian_std = std::sqrt(2.0 * diffusion * step_size);
    // drift /= k and the Euler--Maruyama update of particles [i0, i1), while their drift rows are hot in cache
    auto update_block = [&](int64_t i0, int64_t i1, T* xi) {
        const int64_t cnt = (i1 - i0) * d;
        if (diffusion > 0) {
            flowrng::fill_normal_smooth(xi, cnt, seed, (uint64_t)(2 * K), (uint64_t)(i0 * d), 1.0);
            if (br_out) std::copy(xi, xi + cnt, br_out + i0 * d);
        }
        for (int64_t t = 0; t < cnt; ++t) {
            const int64_t e = i0 * d + t;
            const T dr = out_drift[e] * inv_k;
            out_drift[e] = dr;
            double v = (double)X[e] - step_size * (double)dr;
            if (diffusion > 0) v += brownian_std * (double)xi[t];
            out_new[e] = (T)v;
        }
    };

    for (int64_t j0 = 0; j0 < K; j0 += C) {
        const int64_t cj = std::min(C, K - j0);
        std::fill(thT.begin(), thT.end(), (T)0);
        std::fill(thP.begin(), thP.end(), (T)0);
        for (int64_t jj = 0; jj < cj; ++jj)
            for (int64_t c = 0; c < d; ++c) {
                thT[c * cpad + jj] = TH[(j0 + jj) * d + c];
                thP[jj * dpad + c] = TH[(j0 + jj) * d + c];
            }

        // a. noisy projections of the particles, P[jj][i]
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t b = 0; b < nblocks; ++b) {
            const int64_t i0 = b * kBlock, i1 = std::min(N, i0 + kBlock);
            for (int64_t jj = 0; jj < cj; ++jj) {
                T* pj = P.get() + (size_t)jj * N;
                if (noise_std > 0) {
                    flowrng::fill_normal_smooth(pj + i0, i1 - i0, seed, (uint64_t)(2 * (j0 + jj)), (uint64_t)i0,
                                              noise_std);
                    if (nx_out)
                        for (int64_t i = i0; i < i1; ++i) nx_out[i * K + j0 + jj] = pj[i];
                } else {
                    for (int64_t i = i0; i < i1; ++i) pj[i] = (T)0;
                    if (nx_out)
                        for (int64_t i = i0; i < i1; ++i) nx_out[i * K + j0 + jj] = (T)0;
                }
            }
            for (int64_t jt = 0; jt < cj; jt += JT)
                project_tile<T, JT>(X, d, i0, i1, thT.data(), cpad, jt, std::min<int64_t>(JT, cj - jt), P.get(),
                                    N);
        }

        // b. per direction: sort, target quantiles, residual in place
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
        for (int64_t jj = 0; jj < cj; ++jj) {
            DirScratch<T>& s = scratch[omp_get_thread_num()];
            if ((int64_t)s.perm.size() < N) { s.perm.resize(N); s.sx.resize(N); }
            if ((int64_t)s.ys.size() < M) s.ys.resize(M);
            const int64_t j = j0 + jj;
            const T* th = TH + j * d;
            T* pj = P.get() + (size_t)jj * N;
            uint32_t* perm = s.perm.data();
            T* sx = s.sx.data();
            T* ys = s.ys.data();
            // noisy private projections (sorted values only)
            // (sketch mode: M == 0, no private rows and no draw from stream 2j+1)
            flowrng::sorted_noisy_private_projections(Y, M, d, th, K, j, noise_std, seed, ys, ny_out);
            const double scale = (double)(M - 1) / (double)(N - 1);
            const double* tb = TB ? TB + j * L : nullptr;  // sketch mode: this direction's table row
            if (num_quantiles == 0 && tb) {  // exact onto the table: rank r -> level r/(N-1) -> Q_j(level)
                if ((int64_t)s.tr.size() < N) s.tr.resize(N);
                flowsketch::rank_targets(tb, LV, L, N, s.tr.data());
                flowsketch::residuals_in_place<T>(pj, N, s.tr.data(), s.perm, s.sx, s.ws, s.pws);
                continue;
            }
            if constexpr (std::is_same_v<T, float>) {
                if (num_quantiles == 0) {  // exact, float32: residual written as the sort's last pass finds each rank
                    radix::sort_emit_f32(pj, (uint32_t)N, s.pws, [&](uint32_t r, uint32_t i, float v) {
                        pj[i] = (T)((double)v - value_at_position(ys, M, (double)r * scale));
                    });
                    continue;
                }
                radix::argsort_f32(pj, (uint32_t)N, perm, sx, s.pws);
            } else {
                argsort(pj, (uint32_t)N, perm, sx, s.ws);
            }
            if (num_quantiles == 0) {  // exact: rank r -> level r/(N-1) -> position r(M-1)/(N-1)
                for (int64_t r = 0; r < N; ++r) {
                    const double t = value_at_position(ys, M, (double)r * scale);
                    pj[perm[r]] = (T)((double)sx[r] - t);
                }
            } else {  // grid (authors): xq, tq on num_quantiles levels; cdf through xq; T through tq
                if ((int64_t)s.xq.size() < num_quantiles) { s.xq.resize(num_quantiles); s.tq.resize(num_quantiles); }
                double* xq = s.xq.data();
                double* tq = s.tq.data();
                for (int64_t q = 0; q < num_quantiles; ++q) {
                    xq[q] = quantile_sorted(sx, N, levels[q]);
                    tq[q] = tb ? 0.0 : quantile_sorted(ys, M, levels[q]);
                }
                int64_t jq = 0;
                for (int64_t r = 0; r < N; ++r) {
                    const double v = (double)sx[r];
                    while (jq + 1 < num_quantiles && xq[jq + 1] <= v) ++jq;  // xq[jq] <= v < xq[jq+1] (numpy.interp)
                    double cdf;
                    if (jq >= num_quantiles - 1) cdf = levels[num_quantiles - 1];
                    else if (v < xq[0]) cdf = levels[0];
                    else cdf = levels[jq] + (v - xq[jq]) * (levels[jq + 1] - levels[jq]) / (xq[jq + 1] - xq[jq]);
                    if (tb) {  // sketch mode: T = Q_j(cdf) of the table
                        pj[perm[r]] = (T)(v - table_at(LV, tb, L, cdf));
                        continue;
                    }
                    // T = interp(cdf; levels -> tq) on the uniform grid
                    double pos = cdf * (double)(num_quantiles - 1);
                    int64_t lo = (int64_t)std::floor(pos);
                    double t;
                    if (lo >= num_quantiles - 1) t = tq[num_quantiles - 1];
                    else {
                        if (lo < 0) lo = 0;
                        t = tq[lo] + (pos - (double)lo) * (tq[lo + 1] - tq[lo]);
                    }
                    pj[perm[r]] = (T)(v - t);
                }
            }
        }

        // c. drift accumulation (the first chunk writes, later ones add); the last chunk also updates the particles
        const bool first = (j0 == 0), last = (j0 + cj >= K);
#pragma omp parallel num_threads(nthreads)
        {
            std::vector<T> xi(last && diffusion > 0 ? (size_t)kBlock * d : 0);
#pragma omp for schedule(static)
            for (int64_t b = 0; b < nblocks; ++b) {
                const int64_t i0 = b * kBlock, i1 = std::min(N, i0 + kBlock);
                auto columns = [&](auto width) {
                    constexpr int CT = decltype(width)::value;
                    for (int64_t c0 = 0; c0 < d; c0 += CT) {
                        const int64_t cn = std::min<int64_t>(CT, d - c0);
                        const T* tp = thP.data();
                        if (first) drift_tile<T, CT, true>(P.get(), N, cj, tp, dpad, c0, cn, i0, i1, out_drift, d);
                        else drift_tile<T, CT, false>(P.get(), N, cj, tp, dpad, c0, cn, i0, i1, out_drift, d);
                    }
                };
                if (width == JW3) columns(std::integral_constant<int, JW3>{});
                else if (width == JW2) columns(std::integral_constant<int, JW2>{});
                else columns(std::integral_constant<int, JT>{});
                if (last) update_block(i0, i1, xi.data());
            }
        }
    }
}

template <typename T>
using Arr = py::array_t<T, py::array::c_style>;

template <typename T>
static T* opt_ptr(const py::object& o, int64_t rows, int64_t cols, const char* name) {
    if (o.is_none()) return nullptr;
    if (!py::isinstance<Arr<T>>(o))  // never write into a silent converted copy
        throw std::invalid_argument(std::string(name) + " must be a C-contiguous array of the particles' dtype");
    auto a = o.cast<Arr<T>>();
    if (a.ndim() != 2 || a.shape(0) != rows || a.shape(1) != cols)
        throw std::invalid_argument(std::string(name) + " must have shape (" + std::to_string(rows) + ", " +
                                    std::to_string(cols) + ")");
    return a.mutable_data();
}

template <typename T>
void flow_step_py(Arr<T> x, Arr<T> y, Arr<T> th, double noise_std, double step_size, double diffusion, int64_t seed,
                  int64_t num_quantiles, Arr<T> out_new, Arr<T> out_drift, py::object nx, py::object ny, py::object br,
                  int64_t max_chunk, py::object table, py::object levels) {
    if (x.ndim() != 2 || y.ndim() != 2 || th.ndim() != 2) throw std::invalid_argument("inputs must be 2-D");
    const int64_t N = x.shape(0), d = x.shape(1), M = y.shape(0), K = th.shape(0);
    if (y.shape(1) != d || th.shape(1) != d) throw std::invalid_argument("particles, private, projections: d differs");
    using DArr = py::array_t<double, py::array::c_style>;
    if (table.is_none() != levels.is_none()) throw std::invalid_argument("give both table and levels, or neither");
    const bool sketch = !table.is_none();
    if (N < 2 || K < 1 || (sketch ? M != 0 : M < 1))
        throw std::invalid_argument(sketch ? "sketch mode: need N >= 2, k >= 1 and no private rows (M == 0)"
                                           : "need N >= 2, M >= 1, k >= 1");
    const double* ptb = nullptr;
    const double* plv = nullptr;
    int64_t L = 0;
    DArr tba, lva;  // keep the arrays alive while the step runs
    if (sketch) {
        if (!py::isinstance<DArr>(table) || !py::isinstance<DArr>(levels))
            throw std::invalid_argument("table and levels must be C-contiguous float64 arrays");
        tba = table.cast<DArr>();
        lva = levels.cast<DArr>();
        if (lva.ndim() != 1 || lva.shape(0) < 1) throw std::invalid_argument("levels must have shape (L,), L >= 1");
        L = lva.shape(0);
        if (tba.ndim() != 2 || tba.shape(0) != K || tba.shape(1) != L)
            throw std::invalid_argument("table must have shape (k, L) = (" + std::to_string(K) + ", " +
                                        std::to_string(L) + ")");
        ptb = tba.data();
        plv = lva.data();
        for (int64_t l = 0; l < L; ++l)
            if (!(plv[l] >= 0.0 && plv[l] <= 1.0) || (l > 0 && !(plv[l] > plv[l - 1])))
                throw std::invalid_argument("levels must be strictly increasing in [0, 1]");
        for (int64_t e = 0; e < K * L; ++e)
            if (!std::isfinite(ptb[e])) throw std::invalid_argument("table must be finite");
    }
    if (N >= (int64_t)UINT32_MAX) throw std::invalid_argument("N must be < 2^32");
    if (num_quantiles == 1 || num_quantiles < 0)
        throw std::invalid_argument("num_quantiles must be >= 2 (or 0 for exact)");
    if (out_new.size() != N * d || out_drift.size() != N * d) throw std::invalid_argument("output shape mismatch");
    T* pn = opt_ptr<T>(nx, N, K, "noise_particles");
    T* pm = opt_ptr<T>(ny, M, K, "noise_private");
    T* pb = opt_ptr<T>(br, N, d, "brownian");
    const T* px = x.data();
    const T* py_ = y.data();
    const T* pt = th.data();
    T* po = out_new.mutable_data();
    T* pd = out_drift.mutable_data();
    // outputs are written from the first moment of the step (their pages are first-touched at once): none may share
    // memory with an input or with another output
    struct Span { const void* p; int64_t n; };
    const Span ins[] = {{px, N * d}, {py_, M * d}, {pt, K * d}};
    const Span outs[] = {{po, N * d}, {pd, N * d}, {pn, pn ? N * K : 0}, {pm, pm ? M * K : 0}, {pb, pb ? N * d : 0}};
    auto overlap = [](const Span& a, const Span& b) {
        const char *pa = (const char*)a.p, *pb_ = (const char*)b.p;
        return a.n > 0 && b.n > 0 && pa < pb_ + b.n * (int64_t)sizeof(T) && pb_ < pa + a.n * (int64_t)sizeof(T);
    };
    for (int o = 0; o < 5; ++o) {
        for (const Span& in : ins)
            if (overlap(outs[o], in)) throw std::invalid_argument("flow_step outputs must not share memory with inputs");
        for (int o2 = o + 1; o2 < 5; ++o2)
            if (overlap(outs[o], outs[o2])) throw std::invalid_argument("flow_step outputs must not share memory");
    }
    {
        py::gil_scoped_release nogil;
        flow_step_impl<T>(px, N, d, py_, M, pt, K, noise_std, step_size, diffusion, (uint64_t)seed, num_quantiles, po,
                          pd, pn, pm, pb, max_chunk, ptb, plv, L);
    }
}

// P (k, N) projections, direction-major, in place: each row j becomes its residuals p - Q_j(rank/(N-1)) against row
// j of the table (k, L) at the levels (L,) (float64); rows in parallel.
template <typename T>
void sketch_residuals_py(Arr<T> P, py::array_t<double, py::array::c_style> table,
                         py::array_t<double, py::array::c_style> levels) {
    if (P.ndim() != 2 || table.ndim() != 2 || levels.ndim() != 1) throw std::invalid_argument("P (k,N), table (k,L), levels (L,)");
    const int64_t K = P.shape(0), N = P.shape(1), L = levels.shape(0);
    if (table.shape(0) != K || table.shape(1) != L || L < 1 || N < 2 || N >= (int64_t)UINT32_MAX)
        throw std::invalid_argument("table must be (k, L) with L >= 1 and 2 <= N < 2^32");
    T* pp = P.mutable_data();
    const double* tb = table.data();
    const double* lv = levels.data();
    py::gil_scoped_release nogil;
    const int nthreads = ((double)N * (double)K < 2.0e5) ? 1 : omp_get_max_threads();
#pragma omp parallel num_threads(nthreads)
    {
        DirScratch<T> s;
        s.tr.resize(N);
#pragma omp for schedule(dynamic, 4)
        for (int64_t j = 0; j < K; ++j) {
            flowsketch::rank_targets(tb + j * L, lv, L, N, s.tr.data());
            flowsketch::residuals_in_place<T>(pp + j * N, N, s.tr.data(), s.perm, s.sx, s.ws, s.pws);
        }
    }
}

}  // namespace

// Test hook: n normals of (seed, stream) from offset, by the fast transform used here and by common.h in double
// precision; smoothing=false: the privacy-grade stream (fill_normal_fast vs fill_normal), true: the smoothing stream
// (fill_normal_smooth vs normal4_at).
static py::tuple normals_py(int64_t seed, int64_t stream, int64_t offset, int64_t n, bool smoothing,
                            bool reference) {
    py::array_t<double> fast(n), ref(reference ? n : 0);
    double* pf = fast.mutable_data();
    double* pr = ref.mutable_data();
    {
        py::gil_scoped_release nogil;
        if (smoothing) {
            flowrng::fill_normal_smooth(pf, n, (uint64_t)seed, (uint64_t)stream, (uint64_t)offset, 1.0);
            if (reference)
                for (int64_t i = 0; i < n; ++i) pr[i] = normal4_at((uint64_t)seed, (uint64_t)stream, (uint64_t)(offset + i));
        } else {
            flowrng::fill_normal_fast(pf, n, (uint64_t)seed, (uint64_t)stream, (uint64_t)offset, 1.0);
            if (reference) fill_normal(pr, n, (uint64_t)seed, (uint64_t)stream, (uint64_t)offset, 1.0);
        }
    }
    return py::make_tuple(fast, ref);
}

PYBIND11_MODULE(_C_flow, m) {
    m.doc() = "fastdpot fused CPU step of the DP sliced-Wasserstein particle flow (see csrc/flow.cpp)";
    def_rank_layout(m);
    const char* doc =
        "flow_step(x (N,d), y (M,d), theta (k,d), noise_std, step_size, diffusion, seed, num_quantiles, out_new (N,d), "
        "out_drift (N,d), noise_particles (N,k)|None, noise_private (M,k)|None, brownian (N,d)|None, max_chunk=0). "
        "noise_std: σ of the noise on every projected value; diffusion: λ of the Brownian term sqrt(2λh)·ξ, h = "
        "step_size. num_quantiles = 0: exact sort-based transport; num_quantiles = Q >= 2: the authors' Q-level grid. "
        "Writes the outputs in place (they must not share memory with the inputs or with each other: ValueError); "
        "releases the GIL. Sketch mode: table (k,L) and levels (L,) float64 "
        "arrays with y of shape (0,d): the target of level u is the table's piecewise-linear Q_j(u) (end segments "
        "extended, u clamped to [0,1]); no private noise is drawn.";
    m.def("flow_step", &flow_step_py<float>, doc, py::arg("x"), py::arg("y"), py::arg("theta"), py::arg("noise_std"),
          py::arg("step_size"), py::arg("diffusion"), py::arg("seed"), py::arg("num_quantiles"),
          py::arg("out_new").noconvert(), py::arg("out_drift").noconvert(), py::arg("noise_particles"),
          py::arg("noise_private"),
          py::arg("brownian"), py::arg("max_chunk") = 0, py::arg("table") = py::none(),
          py::arg("levels") = py::none());
    m.def("flow_step", &flow_step_py<double>, doc, py::arg("x"), py::arg("y"), py::arg("theta"), py::arg("noise_std"),
          py::arg("step_size"), py::arg("diffusion"), py::arg("seed"), py::arg("num_quantiles"),
          py::arg("out_new").noconvert(), py::arg("out_drift").noconvert(), py::arg("noise_particles"),
          py::arg("noise_private"),
          py::arg("brownian"), py::arg("max_chunk") = 0, py::arg("table") = py::none(),
          py::arg("levels") = py::none());
    const char* sdoc =
        "sketch_residuals(P (k,N), table (k,L), levels (L,)): in place, every row j of the direction-major projections "
        "becomes p - Q_j(rank/(N-1)), Q_j the table row's piecewise-linear function (end segments extended); the "
        "sort-based transport of op flow_step's sketch target alone, for a caller that projects and accumulates the "
        "drift itself (large d). Releases the GIL.";
    m.def("sketch_residuals", &sketch_residuals_py<float>, sdoc, py::arg("P").noconvert(), py::arg("table"),
          py::arg("levels"));
    m.def("sketch_residuals", &sketch_residuals_py<double>, sdoc, py::arg("P").noconvert(), py::arg("table"),
          py::arg("levels"));
    m.def("_normals", &normals_py,
          "(fast, common.h) standard normals of (seed, stream) from offset (test hook; reference=False leaves the "
          "second array empty: fastdpot.distributed's keyed draws)",
          py::arg("seed"), py::arg("stream"), py::arg("offset"), py::arg("n"), py::arg("smoothing") = false,
          py::arg("reference") = true);
}
