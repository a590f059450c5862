// Sort-free (histogram) CPU step of the (DP) sliced-Wasserstein particle flow -- Sebag et al., TMLR; the semantics are
// fastdpot/reference/flow.py's quantiles="histogram" (a table target included), the GPU twin kernels/histogram.py.
// The quantities keep their Python names: noise_std σ, step_size h, diffusion λ, histogram_bins B.
//
// The particle CDF of direction j is the piecewise-linear CDF of a B-bin histogram of the noisy projections
// s_ij = <x_i, θ_j> + σ·ξ_ij on [lo_j, hi_j] = [min_i s_ij, max_i s_ij]:
//   t = (s − lo_j)/w_j clamped to [0, B], b = min(⌊t⌋, B − 1), u = (C_jb + (t − b)·n_jb)/N,
// with n_jb the particles in bin b and C_jb those below; the target is the private quantile at level u (linear
// interpolation at position u(M−1) of the sorted noisy private projections) or, in sketch mode, Q_j(u) of a (k, L)
// quantile table (piecewise linear through (levels[l], table[j, l]), end segments extended, u clamped to [0, 1]).
//
// Nothing of size N·k is stored: every pass recomputes the projections of a block of 64 particles for a chunk of
// directions into a per-thread (chunk x 64) buffer (direction-major, one SIMD row of particles per direction), then
//   pass 1 (hist_minmax, flow_histogram_extremes.h):    min / max of every direction;
//   pass 2 (hist_counts, flow_histogram_counts.h):       counts of the B bins of [lo_j, hi_j] (per-thread tables,
//                                                         summed);
//   pass 3 (hist_transport, flow_histogram_transport.h): level u through the given global counts, target, residual
//                                                         s − T in place, drift accumulated over the chunks (a
//                                                         (d x 64) register-tiled product), then drift /= k and the
//                                                         Euler--Maruyama update x − h·drift + sqrt(2λh)·ξ of the block;
// what they share (geometry, scratch, projections, bins) is flow_histogram_common.h; this file holds the bindings.
// The fused hist_flow_step runs 1, 2, the private targets (hist_private_targets) and 3. The passes are exposed so a
// caller whose particles are sharded over processes can all-reduce min/max (after 1) and the counts (after 2); see
// the module docstring at the bottom for the contract.
//
// Noise: exactly the conventions of csrc/flow.cpp, keyed by GLOBAL particle index g = index_offset + i:
//   particle smoothing noise of direction j: stream 2j, element g (flow_normal.h's four-per-block normals);
//   private noise of direction j: stream 2j + 1, element m (privacy-grade two-per-block normals, 64-bit radius);
//   Brownian term: stream 2k, element g·d + c.
// A shard of rows [off, off + n) therefore draws exactly what those rows draw inside the whole array, and blocks are
// aligned to global multiples of 64 so that every 64-particle draw is one aligned Philox batch. Results do not depend
// on the number of threads; the chunking of directions only changes the summation order of the drift.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common.h"
#include "flow_histogram_common.h"
#include "flow_histogram_counts.h"
#include "flow_histogram_extremes.h"
#include "flow_histogram_transport.h"
#include "flow_normal.h"

namespace py = pybind11;
using namespace fastdpot;
using namespace fastdpot::hist;

namespace {

constexpr double kMaterializeBytes = 0.0;     // auto: never (recomputing measured as fast or faster; see docs/flows.md)

// ------------------------------------------------------------------------------------------------------------
// Python bindings (raw C-contiguous numpy buffers; fastdpot/ops/cpu_histogram.py wraps them for torch tensors)
// ------------------------------------------------------------------------------------------------------------
template <typename T>
using Arr = py::array_t<T, py::array::c_style>;
using DArr = py::array_t<double, py::array::c_style>;
using IArr = py::array_t<int64_t, py::array::c_style>;

[[noreturn]] static void bad(const std::string& msg) { throw std::invalid_argument(msg); }

static std::string shape_str(std::initializer_list<int64_t> s) {
    std::string out = "(";
    bool first = true;
    for (int64_t v : s) { out += (first ? "" : ", ") + std::to_string(v); first = false; }
    return out + ")";
}

template <typename A>
static void need_shape(const A& a, std::initializer_list<int64_t> shape, const char* name) {
    bool ok = a.ndim() == (py::ssize_t)shape.size();
    int q = 0;
    for (int64_t v : shape) ok = ok && a.shape(q++) == v;
    if (!ok) bad(std::string(name) + " must have shape " + shape_str(shape));
}

// an optional output array: None, or exactly a C-contiguous array of T of the given shape (never a converted copy)
template <typename T>
static T* opt_out(const py::object& o, std::initializer_list<int64_t> shape, const char* name) {
    if (o.is_none()) return nullptr;
    if (!py::isinstance<Arr<T>>(o)) bad(std::string(name) + " must be a C-contiguous array of the particles' dtype");
    auto a = o.cast<Arr<T>>();
    need_shape(a, shape, name);
    return a.mutable_data();
}

struct Span { const void* p; int64_t bytes; };

static void check_disjoint(std::initializer_list<Span> ins, std::initializer_list<Span> outs) {
    auto overlap = [](const Span& a, const Span& b) {
        const char *pa = (const char*)a.p, *pb = (const char*)b.p;
        return a.p && b.p && a.bytes > 0 && b.bytes > 0 && pa < pb + b.bytes && pb < pa + a.bytes;
    };
    int o = 0;
    for (const Span& x : outs) {
        for (const Span& in : ins)
            if (overlap(x, in)) bad("outputs must not share memory with inputs");
        int o2 = 0;
        for (const Span& y : outs)
            if (o2++ > o && overlap(x, y)) bad("outputs must not share memory with each other");
        ++o;
    }
}

template <typename T>
static void check_particles(const Arr<T>& x, const Arr<T>& th, int64_t& n, int64_t& d, int64_t& K, int64_t index_offset) {
    if (x.ndim() != 2 || th.ndim() != 2) bad("particles and theta must be 2-D");
    n = x.shape(0); d = x.shape(1); K = th.shape(0);
    if (th.shape(1) != d) bad("particles (n, d) and theta (k, d) must share d");
    if (n < 1 || d < 1 || K < 1) bad("need n >= 1 particles, d >= 1 and k >= 1 directions");
    if (index_offset < 0) bad("index_offset must be >= 0");
    if (n >= (int64_t)UINT32_MAX) bad("a shard must hold fewer than 2^32 particles");
    if (index_offset > (int64_t)(UINT64_MAX / 2 / (uint64_t)std::max<int64_t>(d, 1)) - n)
        bad("index_offset too large: global Brownian indices (index_offset + n)·d would overflow");
}

template <typename T>
static void check_geometry(const Arr<T>& mn, const Arr<T>& mx, int64_t K) {
    need_shape(mn, {K}, "col_min");
    need_shape(mx, {K}, "col_max");
    for (int64_t j = 0; j < K; ++j)
        if (!std::isfinite((double)mn.data()[j]) || !std::isfinite((double)mx.data()[j]) || mx.data()[j] < mn.data()[j])
            bad("col_min / col_max must be finite with col_min <= col_max (direction " + std::to_string(j) + ")");
}

template <typename T>
void minmax_py(Arr<T> x, Arr<T> th, double noise_std, int64_t seed, int64_t index_offset, Arr<T> out_min,
               Arr<T> out_max, py::object nx, int64_t max_chunk) {
    int64_t n, d, K;
    check_particles(x, th, n, d, K, index_offset);
    need_shape(out_min, {K}, "out_min");
    need_shape(out_max, {K}, "out_max");
    T* pn = opt_out<T>(nx, {n, K}, "noise_particles");
    check_disjoint({{x.data(), n * d * (int64_t)sizeof(T)}, {th.data(), K * d * (int64_t)sizeof(T)}},
                   {{out_min.data(), K * (int64_t)sizeof(T)}, {out_max.data(), K * (int64_t)sizeof(T)},
                    {pn, n * K * (int64_t)sizeof(T)}});
    py::gil_scoped_release nogil;
    Geometry<T> g(x.data(), n, d, th.data(), K, (uint64_t)index_offset, (uint64_t)seed, noise_std, max_chunk);
    minmax_impl(g, out_min.mutable_data(), out_max.mutable_data(), pn);
}

template <typename T>
void counts_py(Arr<T> x, Arr<T> th, double noise_std, int64_t seed, int64_t index_offset, Arr<T> mn, Arr<T> mx,
               IArr out_counts, int64_t max_chunk) {
    int64_t n, d, K;
    check_particles(x, th, n, d, K, index_offset);
    check_geometry(mn, mx, K);
    if (out_counts.ndim() != 2 || out_counts.shape(0) != K || out_counts.shape(1) < 1)
        bad("out_counts must have shape (k, histogram_bins), histogram_bins >= 1");
    const int64_t B = out_counts.shape(1);
    if (B > (int64_t)INT32_MAX) bad("histogram_bins too large");
    py::gil_scoped_release nogil;
    Geometry<T> g(x.data(), n, d, th.data(), K, (uint64_t)index_offset, (uint64_t)seed, noise_std, max_chunk);
    Bins<T> bins(mn.data(), mx.data(), K, B);
    counts_impl(g, bins, out_counts.mutable_data());
}

template <typename T>
void private_targets_py(Arr<T> y, Arr<T> th, double noise_std, int64_t seed, Arr<T> out_sorted, py::object ny) {
    if (y.ndim() != 2 || th.ndim() != 2) bad("private and theta must be 2-D");
    const int64_t M = y.shape(0), d = y.shape(1), K = th.shape(0);
    if (th.shape(1) != d) bad("private (M, d) and theta (k, d) must share d");
    if (M < 1 || K < 1) bad("need M >= 1 private rows and k >= 1 directions");
    need_shape(out_sorted, {K, M}, "out_sorted");
    T* pm = opt_out<T>(ny, {M, K}, "noise_private");
    check_disjoint({{y.data(), M * d * (int64_t)sizeof(T)}, {th.data(), K * d * (int64_t)sizeof(T)}},
                   {{out_sorted.data(), K * M * (int64_t)sizeof(T)}, {pm, M * K * (int64_t)sizeof(T)}});
    py::gil_scoped_release nogil;
    private_targets_impl(y.data(), M, d, th.data(), K, noise_std, (uint64_t)seed, out_sorted.mutable_data(), pm);
}

// target: either sorted (k, M) of T, or table (k, L) + levels (L,) float64
template <typename T>
static Target<T> make_target(const py::object& sorted, const py::object& table, const py::object& levels, int64_t K,
                             Arr<T>& keep_q, DArr& keep_t, DArr& keep_l) {
    Target<T> tg;
    if (sorted.is_none() == table.is_none()) bad("give exactly one target: sorted (k, M), or table and levels");
    if (table.is_none() != levels.is_none()) bad("give both table and levels, or neither");
    if (!sorted.is_none()) {
        if (!py::isinstance<Arr<T>>(sorted)) bad("sorted must be a C-contiguous array of the particles' dtype");
        keep_q = sorted.cast<Arr<T>>();
        if (keep_q.ndim() != 2 || keep_q.shape(0) != K || keep_q.shape(1) < 1)
            bad("sorted must have shape (k, M), M >= 1");
        tg.q = keep_q.data();
        tg.M = keep_q.shape(1);
        if (tg.M >= (int64_t)INT32_MAX) bad("M must be < 2^31");
        for (int64_t e = 0; e < K * tg.M; ++e)
            if (!std::isfinite((double)tg.q[e])) bad("sorted must be finite");
        return tg;
    }
    if (!py::isinstance<DArr>(table) || !py::isinstance<DArr>(levels))
        bad("table and levels must be C-contiguous float64 arrays");
    keep_t = table.cast<DArr>();
    keep_l = levels.cast<DArr>();
    if (keep_l.ndim() != 1 || keep_l.shape(0) < 1) bad("levels must have shape (L,), L >= 1");
    tg.L = keep_l.shape(0);
    need_shape(keep_t, {K, tg.L}, "table");
    tg.tb = keep_t.data();
    tg.lv = keep_l.data();
    for (int64_t l = 0; l < tg.L; ++l)
        if (!(tg.lv[l] >= 0.0 && tg.lv[l] <= 1.0) || (l > 0 && !(tg.lv[l] > tg.lv[l - 1])))
            bad("levels must be strictly increasing in [0, 1]");
    for (int64_t e = 0; e < K * tg.L; ++e)
        if (!std::isfinite(tg.tb[e])) bad("table must be finite");
    return tg;
}

template <typename T>
void transport_py(Arr<T> x, Arr<T> th, double noise_std, int64_t seed, int64_t index_offset, Arr<T> mn, Arr<T> mx,
                  IArr counts, double step_size, double diffusion, Arr<T> out_new, Arr<T> out_drift, py::object sorted,
                  py::object table, py::object levels, py::object br, int64_t max_chunk) {
    int64_t n, d, K;
    check_particles(x, th, n, d, K, index_offset);
    check_geometry(mn, mx, K);
    if (counts.ndim() != 2 || counts.shape(0) != K || counts.shape(1) < 1)
        bad("counts must have shape (k, histogram_bins), histogram_bins >= 1");
    const int64_t B = counts.shape(1);
    if (B > (int64_t)INT32_MAX) bad("histogram_bins too large");
    const int64_t* pc = counts.data();
    int64_t total = -1;
    for (int64_t j = 0; j < K; ++j) {
        int64_t s = 0;
        for (int64_t b = 0; b < B; ++b) {
            if (pc[j * B + b] < 0) bad("counts must be >= 0");
            s += pc[j * B + b];
        }
        if (total < 0) total = s;
        else if (s != total) bad("every direction's counts must sum to the same global number of particles");
    }
    if (total < 2 || total < n) bad("the counts must sum to the global N >= 2, at least this shard's n");
    if (!(step_size > 0) || !(diffusion >= 0) || !std::isfinite(step_size) || !std::isfinite(diffusion)) bad("need step_size > 0, diffusion >= 0");
    need_shape(out_new, {n, d}, "out_new");
    need_shape(out_drift, {n, d}, "out_drift");
    T* pb = opt_out<T>(br, {n, d}, "brownian");
    Arr<T> kq;
    DArr kt, kl;
    Target<T> tg = make_target<T>(sorted, table, levels, K, kq, kt, kl);
    const int64_t nd = n * d * (int64_t)sizeof(T);
    check_disjoint({{x.data(), nd}, {th.data(), K * d * (int64_t)sizeof(T)}, {pc, K * B * 8},
                    {tg.q, K * tg.M * (int64_t)sizeof(T)}, {tg.tb, K * tg.L * 8}, {tg.lv, tg.L * 8}},
                   {{out_new.data(), nd}, {out_drift.data(), nd}, {pb, nd}});
    py::gil_scoped_release nogil;
    Geometry<T> g(x.data(), n, d, th.data(), K, (uint64_t)index_offset, (uint64_t)seed, noise_std, max_chunk);
    Bins<T> bins(mn.data(), mx.data(), K, B);
    transport_impl(g, bins, pc, tg, step_size, diffusion, out_new.mutable_data(), out_drift.mutable_data(), pb);
}

template <typename T>
void step_py(Arr<T> x, py::object y, Arr<T> th, double noise_std, double step_size, double diffusion, int64_t seed, int64_t histogram_bins,
             Arr<T> out_new, Arr<T> out_drift, py::object nx, py::object ny, py::object br, int64_t index_offset,
             py::object table, py::object levels, int64_t max_chunk, int64_t materialize) {
    int64_t n, d, K;
    check_particles(x, th, n, d, K, index_offset);
    if (n < 2) bad("need N >= 2 particles");
    if (histogram_bins < 1 || histogram_bins > (int64_t)INT32_MAX) bad("histogram_bins must be >= 1");
    if (!(step_size > 0) || !(diffusion >= 0) || !std::isfinite(step_size) || !std::isfinite(diffusion)) bad("need step_size > 0, diffusion >= 0");
    need_shape(out_new, {n, d}, "out_new");
    need_shape(out_drift, {n, d}, "out_drift");
    T* pn = opt_out<T>(nx, {n, K}, "noise_particles");
    T* pb = opt_out<T>(br, {n, d}, "brownian");
    const bool sketch = !table.is_none();
    if (sketch == !y.is_none()) bad("give exactly one target: private rows y, or table and levels (y=None)");
    Arr<T> ya;
    int64_t M = 0;
    if (!sketch) {
        if (!py::isinstance<Arr<T>>(y)) bad("private must be a C-contiguous array of the particles' dtype");
        ya = y.cast<Arr<T>>();
        if (ya.ndim() != 2 || ya.shape(1) != d || ya.shape(0) < 1) bad("private must have shape (M, d), M >= 1");
        M = ya.shape(0);
    } else if (!ny.is_none()) {
        bad("noise_private must be None in sketch mode (no private rows)");
    }
    T* pm = sketch ? nullptr : opt_out<T>(ny, {M, K}, "noise_private");
    Arr<T> sorted_keep, kq;
    DArr kt, kl;
    Target<T> tg;
    if (sketch) {
        tg = make_target<T>(py::none(), table, levels, K, kq, kt, kl);
    } else {  // filled by hist_private_targets below
        sorted_keep = Arr<T>({K, M});
        tg.q = sorted_keep.data();
        tg.M = M;
    }
    const int64_t nd = n * d * (int64_t)sizeof(T);
    check_disjoint({{x.data(), nd}, {sketch ? nullptr : ya.data(), M * d * (int64_t)sizeof(T)},
                    {th.data(), K * d * (int64_t)sizeof(T)}},
                   {{out_new.data(), nd}, {out_drift.data(), nd}, {pn, n * K * (int64_t)sizeof(T)},
                    {pm, M * K * (int64_t)sizeof(T)}, {pb, nd}});
    py::gil_scoped_release nogil;
    Geometry<T> g(x.data(), n, d, th.data(), K, (uint64_t)index_offset, (uint64_t)seed, noise_std, max_chunk);
    // materialize: 1 stores the n·k noisy projections once (pass 1) instead of recomputing them in passes 2 and 3,
    // 0 recomputes, < 0 (auto) stores them when they take at most kMaterializeBytes
    std::unique_ptr<T, void (*)(void*)> Pbuf(nullptr, std::free);
    if (materialize > 0 || (materialize < 0 && (double)n * (double)K * sizeof(T) <= kMaterializeBytes)) {
        constexpr size_t kHuge = (size_t)2 << 20;  // 2 MiB pages: 512x fewer first-touch faults
        const size_t bytes = ((size_t)n * (size_t)K * sizeof(T) + kHuge - 1) / kHuge * kHuge;
        Pbuf.reset((T*)std::aligned_alloc(kHuge, bytes));
        if (!Pbuf) throw std::bad_alloc();
        madvise(Pbuf.get(), bytes, MADV_HUGEPAGE);
        g.P = Pbuf.get();
    }
    std::vector<T> mn((size_t)K), mx((size_t)K);
    minmax_impl(g, mn.data(), mx.data(), pn);
    g.stored = true;
    Bins<T> bins(mn.data(), mx.data(), K, histogram_bins);
    std::vector<int64_t> counts((size_t)(K * histogram_bins));
    counts_impl(g, bins, counts.data());
    if (!sketch) private_targets_impl(ya.data(), M, d, th.data(), K, noise_std, (uint64_t)seed, sorted_keep.mutable_data(), pm);
    transport_impl(g, bins, counts.data(), tg, step_size, diffusion, out_new.mutable_data(), out_drift.mutable_data(), pb);
}

template <typename T>
void def_all(py::module_& m) {
    m.def("hist_minmax", &minmax_py<T>, py::arg("x").noconvert(), py::arg("theta").noconvert(), py::arg("noise_std"), py::arg("seed"),
          py::arg("index_offset"), py::arg("out_min").noconvert(), py::arg("out_max").noconvert(),
          py::arg("noise_particles") = py::none(), py::arg("max_chunk") = 0);
    m.def("hist_counts", &counts_py<T>, py::arg("x").noconvert(), py::arg("theta").noconvert(), py::arg("noise_std"), py::arg("seed"),
          py::arg("index_offset"), py::arg("col_min").noconvert(), py::arg("col_max").noconvert(),
          py::arg("out_counts").noconvert(), py::arg("max_chunk") = 0);
    m.def("hist_private_targets", &private_targets_py<T>, py::arg("y").noconvert(), py::arg("theta").noconvert(), py::arg("noise_std"),
          py::arg("seed"), py::arg("out_sorted").noconvert(), py::arg("noise_private") = py::none());
    m.def("hist_transport", &transport_py<T>, py::arg("x").noconvert(), py::arg("theta").noconvert(), py::arg("noise_std"), py::arg("seed"),
          py::arg("index_offset"), py::arg("col_min").noconvert(), py::arg("col_max").noconvert(),
          py::arg("counts").noconvert(), py::arg("step_size"), py::arg("diffusion"), py::arg("out_new").noconvert(),
          py::arg("out_drift").noconvert(), py::arg("sorted") = py::none(), py::arg("table") = py::none(),
          py::arg("levels") = py::none(), py::arg("brownian") = py::none(), py::arg("max_chunk") = 0);
    m.def("hist_flow_step", &step_py<T>, py::arg("x").noconvert(), py::arg("y"), py::arg("theta").noconvert(), py::arg("noise_std"),
          py::arg("step_size"), py::arg("diffusion"), py::arg("seed"), py::arg("histogram_bins"), py::arg("out_new").noconvert(),
          py::arg("out_drift").noconvert(), py::arg("noise_particles") = py::none(),
          py::arg("noise_private") = py::none(), py::arg("brownian") = py::none(), py::arg("index_offset") = 0,
          py::arg("table") = py::none(), py::arg("levels") = py::none(), py::arg("max_chunk") = 0,
          py::arg("materialize") = -1);
}

}  // namespace

PYBIND11_MODULE(_C_flow_histogram, m) {
    m.doc() =
        "fastdpot sort-free (histogram) CPU step of the DP sliced-Wasserstein flow (csrc/flow_histogram.cpp).\n\n"
        "Every function takes C-contiguous float32 or float64 numpy arrays of one dtype (counts: int64; table and "
        "levels: float64), writes its outputs in place (they must not share memory with the inputs or each other) "
        "and releases the GIL. x (n, d) is a shard of the particles whose row 0 has global index index_offset; "
        "every per-particle draw is keyed by the global index, so the shards of an array compute what the whole "
        "array computes.\n\n"
        "Contract of the passes (a sharded caller all-reduces between them):\n"
        "  1. hist_minmax(x, theta, noise_std, seed, index_offset, out_min (k,), out_max (k,), noise_particles=None)\n"
        "     -> min / max over the shard of every noisy projection; reduce with MIN / MAX over the shards.\n"
        "  2. hist_counts(x, theta, noise_std, seed, index_offset, col_min, col_max, out_counts (k, B) int64)\n"
        "     -> bin counts over the shard for the GLOBAL col_min / col_max; reduce with SUM.\n"
        "  T. hist_private_targets(y (M, d), theta, noise_std, seed, out_sorted (k, M), noise_private=None)\n"
        "     -> sorted noisy private projections (privacy-grade noise): computed once, by one process.\n"
        "  3. hist_transport(x, theta, noise_std, seed, index_offset, col_min, col_max, counts, sorted=... | table=, "
        "levels=, step_size, diffusion, out_new, out_drift, brownian=None)\n"
        "     -> level through the GLOBAL counts (their row sum is the global N), target, drift, Euler--Maruyama "
        "update of the shard.\n"
        "hist_flow_step(x, y | None, theta, noise_std, step_size, diffusion, seed, histogram_bins, out_new, out_drift, "
        "noise_particles=None, noise_private=None, brownian=None, index_offset=0, table=None, levels=None) runs "
        "1, 2, T, 3 on one array.";
    m.attr("simd") = kSimdLevel;  // the SIMD level it was compiled for: avx512, avx2, avx, sse4.2, sse2, neon, none
    def_all<float>(m);
    def_all<double>(m);
}
