// Fast direction blocks (csrc/block_transforms.h) and the fused CPU step of op flow_step on such a block
// (fastdpot/ops/flow.py, fastdpot/_blocks.py). The quantities keep their Python names: step_size h, diffusion λ.
//
// apply(spec, x, out, transpose): out = x Θᵀ (N, p) or, transposed, out = y Θ (N, D), tile by tile (T particles of
// 64 bytes side by side: coordinate-major in the tile, so every inner loop is one SIMD vector).
//
// sketch_step(spec, x, table, levels, h, λ, seed, lo, hi, out_new, out_drift): the exact sort-based step with a sketch
// target (fastdpot.reference.flow.flow_step with private=None, sketch=(table, levels), no smoothing noise) followed by
// the domain clamp, in three passes over the particles:
//   a. P = Θ X (p, N), direction-major: each tile's p coefficients written as p runs of T values;
//   b. per direction (OpenMP over directions): the radix sort of its N values hands every rank r to the transport,
//      P[j][i] <- P[j][i] - Q_j(r / (N - 1)) (csrc/flow_sketch.h, the same code as the dense step's);
//   c. per tile: drift = Θᵀ R / p, x <- clamp(x - h·drift + sqrt(2λh)·ξ, lo, hi) with ξ = N4(seed, stream 2p, i·D + c)
//      (the Brownian stream of csrc/flow.cpp), written with the drift; in a flow's layout without diffusion straight
//      from x's rows to the output's, one SIMD vector per coordinate.
// A block with row bands (patch DCT, every coefficient kept) runs passes a and c band by band through each tile: a
// band's rows of every channel at a time (Transform::band), so the tile's buffers hold C·h·W·T values, not D·T
// (at 64 × 64 × 3, 98 KB against 786 KB each; about 5 % of a step, measured at 20 000 particles of that shape and at
// 60 000 × 784, on a 2-core Xeon); the same values as the whole-tile path, which the other blocks and the step
// with diffusion take.
// Passes a and c read and write every one of the D (or p) rows of a tile: too many streams for the hardware
// prefetchers, so each row's next line is prefetched by hand (without it pass c waited on memory about half its
// time, measured on a 2-core Xeon: 0.22 s -> 0.12 s at 60 000 x 784, one thread).
// Memory: one (p, N) buffer besides the inputs and outputs; no Θ.
// Finiteness: pass a refuses an x holding NaN or Inf before anything is written, pass c returns whether every new
// particle is finite; both ride on passes that touch the values anyway (a flow's step then needs no separate pass
// over its (N, D) particles in Python, ~5 % of a step each).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <limits>
#include <string>
#include <vector>

#include "block_rows.h"
#include "block_transforms.h"
#include "common.h"
#include "flow_normal.h"
#include "flow_sketch.h"
#include "radix_f32.h"
#include "rank_layout_py.h"

namespace py = pybind11;
using namespace fastdpot;
using namespace fastdpot::blocks;

namespace {

template <typename S>
using Arr = py::array_t<S, py::array::c_style>;
using DArr = py::array_t<double, py::array::c_style | py::array::forcecast>;
using LArr = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

[[noreturn]] void bad(const std::string& m) { throw std::invalid_argument("block spec: " + m); }

std::vector<Band> bands(const py::dict& spec, const char* key, int64_t extent) {
    LArr a = spec[key].cast<LArr>();
    if (a.ndim() != 2 || a.shape(1) != 2 || a.shape(0) < 1) bad(std::string(key) + " must be (n, 2) (start, size)");
    std::vector<Band> out;
    int64_t next = 0;
    for (int64_t i = 0; i < a.shape(0); ++i) {
        const Band b{a.at(i, 0), a.at(i, 1)};
        if (b.start != next || b.size < 1) bad(std::string(key) + " must tile [0, extent) in order");
        next += b.size;
        out.push_back(b);
    }
    if (next != extent) bad(std::string(key) + " must cover the image side exactly");
    return out;
}

template <typename S>
std::unique_ptr<Transform<S>> make_transform(const py::dict& spec) {
    const std::string kind = spec["kind"].cast<std::string>();
    if (kind == "patch_dct") {
        auto t = std::make_unique<PatchDCT<S>>();
        t->C = spec["channels"].cast<int64_t>();
        t->H = spec["height"].cast<int64_t>();
        t->W = spec["width"].cast<int64_t>();
        if (t->C < 1 || t->H < 1 || t->W < 1) bad("sizes must be >= 1");
        t->D = t->C * t->H * t->W;
        DArr col = spec["colour"].cast<DArr>();
        if (col.ndim() != 2 || col.shape(0) != t->C || col.shape(1) != t->C) bad("colour must be (C, C)");
        t->colour.assign(col.data(), col.data() + t->C * t->C);
        t->identity_colour = (t->C == 1 && t->colour[0] == 1.0);
        t->rows = bands(spec, "rows", t->H);
        t->cols = bands(spec, "cols", t->W);
        DArr dct = spec["dct"].cast<DArr>();
        LArr off = spec["dct_offsets"].cast<LArr>();
        if (dct.ndim() != 1 || off.ndim() != 1) bad("dct and dct_offsets must be 1-D");
        t->dct.assign(dct.data(), dct.data() + dct.shape(0));
        t->off.assign(off.data(), off.data() + off.shape(0));
        for (const auto* bs : {&t->rows, &t->cols})
            for (const Band& b : *bs) {
                if (b.size >= (int64_t)t->off.size() || t->off[b.size] < 0 ||
                    t->off[b.size] + b.size * b.size > (int64_t)t->dct.size())
                    bad("no DCT matrix for band size " + std::to_string(b.size));
                t->maxp = std::max(t->maxp, b.size);
            }
        t->dct_t = t->dct;
        for (size_t s = 1; s < t->off.size(); ++s)
            if (t->off[s] >= 0)
                for (size_t u = 0; u < s; ++u)
                    for (size_t v = 0; v < s; ++v) t->dct_t[t->off[s] + v * s + u] = t->dct[t->off[s] + u * s + v];
        return t;
    }
    if (kind == "hadamard") {
        auto t = std::make_unique<Hadamard<S>>();
        t->D = spec["dim"].cast<int64_t>();
        LArr perm = spec["perm"].cast<LArr>();
        DArr sign = spec["sign"].cast<DArr>();
        if (t->D < 1 || perm.ndim() != 2 || perm.shape(1) != t->D || sign.ndim() != 2 || sign.shape(0) != perm.shape(0) ||
            sign.shape(1) != t->D || perm.shape(0) < 1)
            bad("perm and sign must be (rounds, D), rounds >= 1");
        t->rounds = perm.shape(0);
        t->perm.assign(perm.data(), perm.data() + t->rounds * t->D);
        t->sign.assign(sign.data(), sign.data() + t->rounds * t->D);
        for (int64_t r = 0; r < t->rounds; ++r) {
            std::vector<char> seen(t->D, 0);
            for (int64_t i = 0; i < t->D; ++i) {
                const int64_t v = t->perm[r * t->D + i];
                if (v < 0 || v >= t->D || seen[v]) bad("perm rows must be permutations of [0, D)");
                seen[v] = 1;
                if (std::fabs(t->sign[r * t->D + i]) != 1.0) bad("sign entries must be +1 or -1");
            }
        }
        t->pieces = bands(spec, "pieces", t->D);
        for (const Band& b : t->pieces)
            if (b.size & (b.size - 1)) bad("Hadamard pieces must have power-of-two sizes");
        return t;
    }
    bad("kind must be 'patch_dct' or 'hadamard', got '" + kind + "'");
}

// keep[j]: the coefficient of direction j (a block of its p <= D lowest frequencies); identity when absent
std::vector<int64_t> keep_of(const py::dict& spec, int64_t D) {
    std::vector<int64_t> keep;
    if (spec.contains("keep") && !spec["keep"].is_none()) {
        LArr k = spec["keep"].cast<LArr>();
        if (k.ndim() != 1 || k.shape(0) < 1 || k.shape(0) > D) bad("keep must be (p,), 1 <= p <= D");
        std::vector<char> seen(D, 0);
        for (int64_t j = 0; j < k.shape(0); ++j) {
            const int64_t v = k.data()[j];
            if (v < 0 || v >= D || seen[v]) bad("keep must list distinct coefficients in [0, D)");
            seen[v] = 1;
            keep.push_back(v);
        }
    } else {
        keep.resize(D);
        for (int64_t j = 0; j < D; ++j) keep[j] = j;
    }
    return keep;
}

int threads_for(double work) { return work < 2.0e5 ? 1 : omp_get_max_threads(); }

// outputs of at least this many bytes are written with non-temporal stores (stream_lanes, csrc/block_transforms.h);
// the projections buffer, which pass b reads right after, only from kStreamProjectionBytes on (3-6 % of a step at
// the CelebA shape, 100 000 x 12 288; no gain at 60 000 x 784, whose 19 MB a class may stay in the L3 cache)
constexpr double kStreamBytes = 8.0 * (1 << 20), kStreamProjectionBytes = 256.0 * (1 << 20);

// Large arrays here are read and written one tile at a time in every one of their p or D rows: thousands of distinct
// 4 KiB pages per tile at pixel-space sizes (12 288 rows for a 64 x 64 x 3 image). Transparent huge pages (2 MiB)
// cut the pages 512-fold: asked for here on the not yet touched part of the projections buffer, which is kept
// between steps, where the kernel allows it (THP "madvise" mode); a no-op elsewhere. Not for the step's fresh
// outputs: with THP's "madvise" defrag each of their first touches may compact memory (a step at 10^6 x 784 took
// 14 s with them advised, 9 s without).
void advise_huge(void* p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    constexpr uintptr_t kHuge = (uintptr_t)2 << 20;
    const uintptr_t a = ((uintptr_t)p + kHuge - 1) & ~(kHuge - 1), b = ((uintptr_t)p + bytes) & ~(kHuge - 1);
    if (b > a) madvise((void*)a, b - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

// The projections buffer of sketch_step, kept between calls (a flow steps on buffers of one size thousands of times:
// a fresh buffer costs its page faults and zero-fill every step, as much as a pass of the step), on 2 MiB-aligned
// memory with huge pages asked for; release_workspace() frees it. One buffer per process, taken under a lock (two
// concurrent steps of other sizes would reallocate it between them: the second waits).
struct Workspace {
    std::mutex lock;
    void* p = nullptr;
    size_t bytes = 0;
    void* get(size_t need) {
        if (need > bytes) {
            release();
            const size_t b = (need + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
            p = std::aligned_alloc((size_t)2 << 20, b);
            if (!p) throw std::bad_alloc();
            advise_huge(p, b);
            bytes = b;
        }
        return p;
    }
    void release() {
        std::free(p);
        p = nullptr;
        bytes = 0;
    }
};

Workspace& workspace() {
    static Workspace w;
    return w;
}

template <typename S>
Rows<S> rows_of(py::array_t<S, py::array::c_style>& a, bool cm, int64_t width, const char* name) {
    if (a.ndim() != 2 || a.shape(cm ? 0 : 1) != width)
        throw std::invalid_argument(std::string(name) + " must be " + (cm ? "(" + std::to_string(width) + ", N)"
                                                                         : "(N, " + std::to_string(width) + ")"));
    return Rows<S>{a.mutable_data(), a.shape(cm ? 1 : 0), width, cm};
}

// x (N, D) -> out (N, p) = x Θᵀ; transposed: y (N, p) -> out (N, D) = y Θ. coordinate_major: both arrays are given
// transposed ((D, N) / (p, N) C-contiguous).
template <typename S>
void apply_py(const py::dict& spec, Arr<S> x, Arr<S> out, bool transpose, bool coordinate_major) {
    auto tr = make_transform<S>(spec);
    const std::vector<int64_t> keep = keep_of(spec, tr->D);
    const int64_t D = tr->D, p = (int64_t)keep.size();
    const Rows<S> in = rows_of<S>(x, coordinate_major, transpose ? p : D, "input");
    const Rows<S> res = rows_of<S>(out, coordinate_major, transpose ? D : p, "output");
    if (res.N != in.N) throw std::invalid_argument("input and output must hold the same N");
    const int64_t N = in.N;
    constexpr int T = Transform<S>::T;
    const int64_t tiles = (N + T - 1) / T;
    const bool full = (p == D), banded = full && tr->band_count() > 0;
    py::gil_scoped_release nogil;
#pragma omp parallel num_threads(threads_for((double)N * D))
    {
        std::vector<S> a((size_t)D * T, (S)0), b((size_t)D * T), scr(tr->scratch_size());
#pragma omp for schedule(static)
        for (int64_t tile = 0; tile < tiles; ++tile) {
            const int64_t i0 = tile * T, cnt = std::min<int64_t>(T, N - i0);
            if (banded) {  // band after band (Transform::band): the tile's working set stays in cache
                for (int64_t k = 0; k < tr->band_count(); ++k) {
                    in.load_band(i0, cnt, a.data(), *tr, k);
                    if (transpose) tr->transpose_band(k, a.data(), b.data(), scr.data());
                    else tr->forward_band(k, a.data(), b.data(), scr.data());
                    res.store_band(i0, cnt, b.data(), *tr, k);
                }
            } else if (transpose) {
                in.load(i0, cnt, a.data(), full ? nullptr : keep.data());
                tr->transpose(a.data(), b.data(), scr.data());
                res.store(i0, cnt, b.data());
            } else {
                in.load(i0, cnt, a.data());
                tr->forward(a.data(), b.data(), scr.data());
                res.store(i0, cnt, b.data(), full ? nullptr : keep.data());
            }
        }
    }
}

template <typename S>
const S* bound_ptr(const py::object& o, int64_t D, const char* name, Arr<S>& keep_alive) {
    if (o.is_none()) return nullptr;
    keep_alive = o.cast<Arr<S>>();
    if (keep_alive.ndim() != 1 || keep_alive.shape(0) != D)
        throw std::invalid_argument(std::string(name) + " must be (D,) = (" + std::to_string(D) + ",)");
    return keep_alive.data();
}

template <typename S>
bool sketch_step_py(const py::dict& spec, Arr<S> x, DArr table, DArr levels, double step_size, double diffusion,
                    int64_t seed, py::object lo, py::object hi, Arr<S> out_new, py::object out_drift,
                    bool coordinate_major) {
    auto tr = make_transform<S>(spec);
    const std::vector<int64_t> keep = keep_of(spec, tr->D);
    const int64_t D = tr->D, p = (int64_t)keep.size();
    const bool cm = coordinate_major, full = (p == D), banded = full && tr->band_count() > 0;
    const Rows<S> X = rows_of<S>(x, cm, D, "x");
    const int64_t N = X.N;
    if (N < 2 || N >= (int64_t)UINT32_MAX) throw std::invalid_argument("need 2 <= N < 2^32");
    if (levels.ndim() != 1 || levels.shape(0) < 1) throw std::invalid_argument("levels must be (L,), L >= 1");
    const int64_t L = levels.shape(0);
    if (table.ndim() != 2 || table.shape(0) != p || table.shape(1) != L)
        throw std::invalid_argument("table must be (p, L) = (" + std::to_string(p) + ", " + std::to_string(L) + ")");
    const double* lv = levels.data();
    const double* tb = table.data();
    for (int64_t l = 0; l < L; ++l)
        if (!(lv[l] >= 0.0 && lv[l] <= 1.0) || (l > 0 && !(lv[l] > lv[l - 1])))
            throw std::invalid_argument("levels must be strictly increasing in [0, 1]");
    for (int64_t e = 0; e < p * L; ++e)
        if (!std::isfinite(tb[e])) throw std::invalid_argument("table must be finite");
    if (!(step_size > 0) || !(diffusion >= 0)) throw std::invalid_argument("need step_size > 0, diffusion >= 0");
    Arr<S> lo_a, hi_a, dr_a;
    const S* plo = bound_ptr<S>(lo, D, "lo", lo_a);
    const S* phi = bound_ptr<S>(hi, D, "hi", hi_a);
    const Rows<S> NEW = rows_of<S>(out_new, cm, D, "out_new");
    Rows<S> DR{nullptr, N, D, cm};
    if (!out_drift.is_none()) {
        if (!py::isinstance<Arr<S>>(out_drift)) throw std::invalid_argument("out_drift must be a C-contiguous array of x's dtype");
        dr_a = out_drift.cast<Arr<S>>();
        DR = rows_of<S>(dr_a, cm, D, "out_drift");
    }
    if (NEW.N != N || (DR.m && DR.N != N)) throw std::invalid_argument("outputs must hold N particles");
    if (NEW.m == X.m || DR.m == X.m || (DR.m && DR.m == NEW.m))
        throw std::invalid_argument("sketch_step outputs must not share memory with x or each other");
    constexpr int T = Transform<S>::T;
    const int64_t tiles = (N + T - 1) / T;
    const double bstd = std::sqrt(2.0 * diffusion * step_size);
    const S inv_p = (S)(1.0 / (double)p);
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> held(workspace().lock);
    S* const P = static_cast<S*>(workspace().get(sizeof(S) * (size_t)p * (size_t)N));
    // the projections, direction-major; streamed when far beyond any cache (pass b reads them back from memory)
    const Rows<S> PR{P, N, p, true, (double)N * p * sizeof(S) >= kStreamProjectionBytes};
    const int nt = threads_for((double)N * D);
    int x_finite = 1, new_finite = 1;
#pragma omp parallel num_threads(nt) reduction(&& : x_finite)
    {  // a. projections, and x's finiteness (read here, where x is read anyway: the caller skips its own pass)
        std::vector<S> a((size_t)D * T), b((size_t)D * T), scr(tr->scratch_size());
#pragma omp for schedule(static)
        for (int64_t tile = 0; tile < tiles; ++tile) {
            const int64_t i0 = tile * T, cnt = std::min<int64_t>(T, N - i0);
            if (banded) {
                for (int64_t k = 0; k < tr->band_count(); ++k) {
                    X.load_band(i0, cnt, a.data(), *tr, k);  // a partial tile's missing lanes are zeros
                    x_finite = x_finite && tile_finite<S>(a.data(), tr->channels() * tr->band(k).size);
                    tr->forward_band(k, a.data(), b.data(), scr.data());
                    PR.store_band(i0, cnt, b.data(), *tr, k);
                }
                continue;
            }
            X.load(i0, cnt, a.data());  // a partial tile's missing lanes are zeros
            x_finite = x_finite && tile_finite<S>(a.data(), D);
            tr->forward(a.data(), b.data(), scr.data());
            PR.store(i0, cnt, b.data(), full ? nullptr : keep.data());
        }
        if (PR.stream) stream_fence();
    }
    if (!x_finite)  // nothing written: the outputs are untouched
        throw std::invalid_argument("particles contains non-finite values (NaN or Inf); their number and places are "
                                    "not reported (the tensor may be private)");
#pragma omp parallel num_threads(nt)
    {  // b. ranks -> residuals against the table
        std::vector<double> trg((size_t)N);
        std::vector<uint32_t> perm;
        std::vector<S> sx;
        SortWorkspace<S> ws;
        radix::Workspace pws;
#pragma omp for schedule(dynamic, 4)
        for (int64_t j = 0; j < p; ++j) {
            flowsketch::rank_targets(tb + j * L, lv, L, N, trg.data());
            flowsketch::residuals_in_place<S>(P + j * N, N, trg.data(), perm, sx, ws, pws);
        }
    }
    const S hs = (S)step_size;
    // the direct path's new particles bypass the caches when they are too large to be read from them again
    const bool stream = (double)N * D * sizeof(S) >= kStreamBytes;
#pragma omp parallel num_threads(nt) reduction(&& : new_finite)
    {  // c. drift back to coordinates, the step, the clamp; the new particles' finiteness
        std::vector<S> a((size_t)D * T, (S)0), b((size_t)D * T), xt((size_t)D * T), scr(tr->scratch_size());
        std::vector<S> xi(diffusion > 0 ? (size_t)D : 0);
        // the step on coordinates [c0, c0 + len) of a tile, bp their drift rows Θᵀ R (len × T); diffusion > 0 only
        // on the whole tile (c0 = 0, len = D: one normal vector of D per particle)
        auto finish = [&](int64_t i0, int64_t cnt, int64_t c0, int64_t len, S* bp) {
            // a whole tile in a flow's layout without diffusion goes straight from x to the output, forming the
            // drift Θᵀ R / p on the fly unless it is written (the same roundings either way)
            const bool direct = cm && cnt == T && diffusion == 0, scaled = DR.m != nullptr || !direct;
            if (scaled) {
                for (int64_t e = 0; e < len * T; ++e) bp[e] *= inv_p;
                if (DR.m) DR.store(i0, cnt, bp, nullptr, c0, len);
            }
            if (direct) {
                using V = typename Lanes<S, T>::type;
                V acc{};
                for (int64_t c = c0; c < c0 + len; ++c) {
                    const S* xv = X.m + c * N + i0;
                    S* o = NEW.m + c * N + i0;
                    prefetch_next<0>(xv, i0, N);
                    if (!stream) prefetch_next<1>(o, i0, N);
                    V dr = load_lanes<S, T>(bp + (c - c0) * T);
                    if (!scaled) dr *= inv_p;
                    V v = load_lanes<S, T>(xv) - hs * dr;
                    if (plo) { const V l = plo[c] - V{}; v = v < l ? l : v; }
                    if (phi) { const V h = phi[c] - V{}; v = v > h ? h : v; }
                    if (stream) stream_lanes<S, T>(o, v);
                    else store_lanes<S, T>(o, v);
                    acc += v - v;
                }
                for (int t = 0; t < T; ++t) new_finite = new_finite && (acc[t] == (S)0);
                return;
            }
            X.load(i0, cnt, xt.data(), nullptr, c0, len);
            for (int64_t c = 0; c < len; ++c) {
                S* v = xt.data() + c * T;
                const S* dr = bp + c * T;
                for (int t = 0; t < T; ++t) v[t] = v[t] - hs * dr[t];
            }
            if (diffusion > 0)
                for (int64_t t = 0; t < cnt; ++t) {
                    flowrng::fill_normal_smooth(xi.data(), D, (uint64_t)seed, (uint64_t)(2 * p),
                                                (uint64_t)((i0 + t) * D), 1.0);
                    for (int64_t c = 0; c < D; ++c) {
                        S& v = xt[c * T + t];
                        v = (S)((double)v + bstd * (double)xi[c]);
                    }
                }
            if (plo || phi)
                for (int64_t c = 0; c < len; ++c) {
                    S* v = xt.data() + c * T;
                    const S l = plo ? plo[c0 + c] : -std::numeric_limits<S>::infinity();
                    const S h = phi ? phi[c0 + c] : std::numeric_limits<S>::infinity();
                    for (int t = 0; t < T; ++t) v[t] = std::min(std::max(v[t], l), h);
                }
            new_finite = new_finite && tile_finite<S>(xt.data(), len);  // a partial tile's missing lanes stay 0
            NEW.store(i0, cnt, xt.data(), nullptr, c0, len);
        };
#pragma omp for schedule(static)
        for (int64_t tile = 0; tile < tiles; ++tile) {
            const int64_t i0 = tile * T, cnt = std::min<int64_t>(T, N - i0);
            if (banded && diffusion == 0) {  // band after band: the tile's working set stays in cache
                for (int64_t k = 0; k < tr->band_count(); ++k) {
                    const Band bd = tr->band(k);
                    PR.load_band(i0, cnt, a.data(), *tr, k);
                    tr->transpose_band(k, a.data(), b.data(), scr.data());
                    for (int64_t ch = 0; ch < tr->channels(); ++ch)
                        finish(i0, cnt, ch * tr->plane() + bd.start, bd.size, b.data() + ch * bd.size * T);
                }
                continue;
            }
            PR.load(i0, cnt, a.data(), full ? nullptr : keep.data());
            tr->transpose(a.data(), b.data(), scr.data());
            finish(i0, cnt, 0, D, b.data());
        }
        if (stream) stream_fence();
    }
    return new_finite != 0;
}

}  // namespace

PYBIND11_MODULE(_C_flow_block, m) {
    m.doc() = "fastdpot fast orthonormal direction blocks and the fused sketch-target flow step on them (csrc/flow_block.cpp)";
    def_rank_layout(m);
    const char* adoc =
        "apply(spec, x, out, transpose): out = x Θᵀ (N, p) for x (N, D), or with transpose=True out = y Θ (N, D) for "
        "y (N, p); Θ (p, D) the block of spec (a dict: kind 'patch_dct' or 'hadamard', see fastdpot/_blocks.py); "
        "coordinate_major=True: every array is given transposed, (D, N) / (p, N). Releases the GIL.";
    m.def("apply", &apply_py<float>, adoc, py::arg("spec"), py::arg("x"), py::arg("out").noconvert(),
          py::arg("transpose"), py::arg("coordinate_major") = false);
    m.def("apply", &apply_py<double>, adoc, py::arg("spec"), py::arg("x"), py::arg("out").noconvert(),
          py::arg("transpose"), py::arg("coordinate_major") = false);
    const char* sdoc =
        "sketch_step(spec, x (N,D), table (p,L) f64, levels (L,) f64, step_size, diffusion, seed, lo (D,)|None, "
        "hi (D,)|None, out_new (N,D), out_drift (N,D)|None): op flow_step's exact step with a sketch target on the "
        "block, then x clamped to [lo, hi] coordinate-wise; coordinate_major=True: x, out_new, out_drift are given "
        "transposed, (D, N). Returns whether every new particle is finite; raises ValueError (nothing written) when "
        "x holds NaN or Inf. Releases the GIL.";
    m.def("release_workspace", []() {
        std::lock_guard<std::mutex> held(workspace().lock);
        workspace().release();
    }, "free sketch_step's projections buffer (kept between calls of a flow)");
    m.def("sketch_step", &sketch_step_py<float>, sdoc, py::arg("spec"), py::arg("x"), py::arg("table"), py::arg("levels"),
          py::arg("step_size"), py::arg("diffusion"), py::arg("seed"), py::arg("lo"), py::arg("hi"),
          py::arg("out_new").noconvert(), py::arg("out_drift"), py::arg("coordinate_major") = false);
    m.def("sketch_step", &sketch_step_py<double>, sdoc, py::arg("spec"), py::arg("x"), py::arg("table"), py::arg("levels"),
          py::arg("step_size"), py::arg("diffusion"), py::arg("seed"), py::arg("lo"), py::arg("hi"),
          py::arg("out_new").noconvert(), py::arg("out_drift"), py::arg("coordinate_major") = false);
}
