// Fused CPU kernels of the (DP) sliced Wasserstein distance SW_p^p (Rakotomamonjy & Ralaivola, ICML 2021), one chunk
// of directions at a time. The caller computes the projected values of both clouds with torch's BLAS (Θ_c Xᵀ), laid
// out direction-major (kc, N) and (kc, M); per direction j, in parallel over directions (OpenMP), with the GIL
// released for the whole call:
//
// sw_chunk (the points release):
//   1. add σ·Philox normals (element (i, j_global) of the x noise is normal number j_global·N + i of stream 0,
//      the y noise stream 1: independent of chunking and thread count, so replayable);
//   2. radix argsort both rows (csrc/common.h, 32-bit indices);
//   3. W_p^p by quantile matching: N == M pairs ranks; N != M walks the merged quantile levels {i/N} ∪ {j/M}
//      with two pointers (integer arithmetic on the 1/(N·M) grid, exact);
//   4. optionally, the gradient of (1/k)·W_p^p w.r.t. every projected value, scattered back through the
//      permutations into (kc, N) / (kc, M) buffers (the caller contracts them with Θ_c to get (N, d) / (M, d)).
//
// sketch_chunk (the sketch release; reference: fastdpot.reference.sliced.sketch_sliced_wasserstein):
//   1. sort the private row (keys only) and sum it over the L rank bins of fastdpot.privacy.sketch.bin_sizes
//      (double accumulation); add σ·z_{j,l} to bin sum l, z_{j,l} = normal number j_global·L + l of stream 0
//      (privacy grade, normal2: the layout of fastdpot.reference.philox.keyed_normals(per_block=2));
//   2. bin means, weighted isotonic fit (pool adjacent violators, weights the bin sizes: scipy's
//      isotonic_regression) -> the table Q_j at the private bins' centre levels;
//   3. argsort the generated row, its bin means ȳ_l at its own bins' levels u'_l, Q_j(u'_l) by linear
//      interpolation (end segments extended), loss Σ_l (m'_l/N)|ȳ_l − Q_j(u'_l)|^p and, optionally, its gradient
//      (1/N)·slope_l for every rank of bin l, scattered through the permutation.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "common.h"
#include "radix_f32.h"

namespace py = pybind11;
using namespace fastdpot;

namespace {

inline double cost_and_slope(double diff, int p, double* slope) {
    // |diff|^p and its derivative w.r.t. diff (sign(0) = 0, as torch's abs)
    if (p == 1) {
        *slope = (diff > 0) - (diff < 0);
        return std::fabs(diff);
    }
    *slope = 2.0 * diff;
    return diff * diff;
}

// per-thread sorting scratch: the packed / key-only float32 sorts of radix_f32.h, common.h's argsort for double
template <typename T> struct Sorter;
template <> struct Sorter<float> {
    radix::Workspace ws;
    void sort(const float* keys, uint32_t n, uint32_t* perm, float* sorted) {
        if (perm) radix::argsort_f32(keys, n, perm, sorted, ws);
        else radix::sort_keys_f32(keys, n, sorted, ws);
    }
};
template <> struct Sorter<double> {
    SortWorkspace<double> ws;
    void sort(const double* keys, uint32_t n, uint32_t* perm, double* sorted) { argsort<double>(keys, n, perm, sorted, ws); }
};

template <typename T>
py::array_t<double> sw_chunk(py::array_t<T, py::array::c_style> px_arr, py::array_t<T, py::array::c_style> py_arr,
                             int p, double noise_std, uint64_t seed, int64_t dir_offset, double grad_scale,
                             py::object gx_obj, py::object gy_obj, py::object nx_obj, py::object ny_obj) {
    if (px_arr.ndim() != 2 || py_arr.ndim() != 2 || px_arr.shape(0) != py_arr.shape(0))
        throw std::invalid_argument("sw_chunk: px (kc, N) and py (kc, M) must be 2-D with the same kc");
    if (p != 1 && p != 2) throw std::invalid_argument("sw_chunk: p must be 1 or 2");
    const int64_t kc = px_arr.shape(0), N = px_arr.shape(1), M = py_arr.shape(1);
    if (N <= 0 || M <= 0 || N > 0xFFFFFFFFll || M > 0xFFFFFFFFll)
        throw std::invalid_argument("sw_chunk: N and M must be in [1, 2^32)");
    const bool need_gx = !gx_obj.is_none(), need_gy = !gy_obj.is_none();
    const bool need_grad = need_gx || need_gy;
    const bool keep_noise = !nx_obj.is_none();
    T* px = px_arr.mutable_data();
    T* pyv = py_arr.mutable_data();
    T *gx = nullptr, *gy = nullptr, *nx = nullptr, *ny = nullptr;
    // output buffers must be exactly (kc, cols), dtype T, C-contiguous: written in place, never converted
    std::vector<py::array> hold;  // keeps the buffers alive while the GIL is released
    auto grab = [&](py::object& o, int64_t cols) -> T* {
        py::array a = o.cast<py::array>();
        if (!a.dtype().is(py::dtype::of<T>()) || !(a.flags() & py::array::c_style) || !a.writeable())
            throw std::invalid_argument("sw_chunk: output buffers must be writeable C-contiguous arrays of the input dtype");
        if (a.ndim() != 2 || a.shape(0) != kc || a.shape(1) != cols)
            throw std::invalid_argument("sw_chunk: output buffer has the wrong shape");
        hold.push_back(a);
        return static_cast<T*>(a.mutable_data());
    };
    if (need_gx) gx = grab(gx_obj, N);
    if (need_gy) gy = grab(gy_obj, M);
    if (keep_noise) { nx = grab(nx_obj, N); ny = grab(ny_obj, M); }
    py::array_t<double> losses(kc);
    double* loss = losses.mutable_data();
    const uint64_t nn = (uint64_t)N, mm = (uint64_t)M;

    {
        py::gil_scoped_release release;
#pragma omp parallel
        {
            Sorter<T> sorter;
            std::vector<T> sx(N), sy(M);
            std::vector<uint32_t> perm_x(need_gx ? N : 0), perm_y(need_gy ? M : 0);
            std::vector<double> gsx, gsy;
            if (need_grad && N != M) { gsx.resize(N); gsy.resize(M); }
#pragma omp for schedule(dynamic, 1)
            for (int64_t j = 0; j < kc; ++j) {
                T* rx = px + j * N;
                T* ry = pyv + j * M;
                const uint64_t jg = (uint64_t)(dir_offset + j);
                if (noise_std > 0) {
                    // noise into the sorted buffers first (they are free now), then add
                    fill_normal<T>(sx.data(), N, seed, 0, jg * nn, noise_std);
                    fill_normal<T>(sy.data(), M, seed, 1, jg * mm, noise_std);
                    for (int64_t i = 0; i < N; ++i) rx[i] += sx[i];
                    for (int64_t i = 0; i < M; ++i) ry[i] += sy[i];
                    if (keep_noise) {
                        std::copy(sx.begin(), sx.end(), nx + j * N);
                        std::copy(sy.begin(), sy.end(), ny + j * M);
                    }
                } else if (keep_noise) {
                    std::fill(nx + j * N, nx + (j + 1) * N, T(0));
                    std::fill(ny + j * M, ny + (j + 1) * M, T(0));
                }
                // a side that needs no gradient needs no permutation: key-only sort
                sorter.sort(rx, (uint32_t)N, need_gx ? perm_x.data() : nullptr, sx.data());
                sorter.sort(ry, (uint32_t)M, need_gy ? perm_y.data() : nullptr, sy.data());
                double acc = 0.0, slope;
                if (N == M) {
                    const double w = 1.0 / (double)N;
                    if (need_grad) {
                        T* gxr = need_gx ? gx + j * N : nullptr;
                        T* gyr = need_gy ? gy + j * M : nullptr;
                        const double gs = grad_scale * w;
                        for (int64_t r = 0; r < N; ++r) {
                            acc += cost_and_slope((double)sx[r] - (double)sy[r], p, &slope);
                            if (gxr) gxr[perm_x[r]] = (T)(gs * slope);
                            if (gyr) gyr[perm_y[r]] = (T)(-gs * slope);
                        }
                    } else {
                        for (int64_t r = 0; r < N; ++r)
                            acc += cost_and_slope((double)sx[r] - (double)sy[r], p, &slope);
                    }
                    acc *= w;
                } else {
                    // merged levels: interval (pos, next] on the grid 1/(N·M); atom a of x covers (a·M, (a+1)·M]
                    const double inv = 1.0 / ((double)nn * (double)mm);
                    if (need_grad) {
                        std::fill(gsx.begin(), gsx.end(), 0.0);
                        std::fill(gsy.begin(), gsy.end(), 0.0);
                    }
                    uint64_t a = 0, b = 0, pos = 0;
                    while (a < nn && b < mm) {
                        const uint64_t ea = (a + 1) * mm, eb = (b + 1) * nn;
                        const uint64_t next = ea < eb ? ea : eb;
                        const double w = (double)(next - pos) * inv;
                        acc += w * cost_and_slope((double)sx[a] - (double)sy[b], p, &slope);
                        if (need_grad) { gsx[a] += w * slope; gsy[b] -= w * slope; }
                        pos = next;
                        if (ea == next) ++a;
                        if (eb == next) ++b;
                    }
                    if (need_gx) {
                        T* gxr = gx + j * N;
                        for (int64_t r = 0; r < N; ++r) gxr[perm_x[r]] = (T)(grad_scale * gsx[r]);
                    }
                    if (need_gy) {
                        T* gyr = gy + j * M;
                        for (int64_t r = 0; r < M; ++r) gyr[perm_y[r]] = (T)(grad_scale * gsy[r]);
                    }
                }
                loss[j] = acc;
            }
        }
    }
    return losses;
}

// bin sizes of fastdpot.privacy.sketch.bin_sizes: the first B mod L bins hold ceil(B/L) ranks, the others floor(B/L)
inline int64_t bin_size(int64_t b, int64_t L, int64_t l) { return b / L + (l < b % L ? 1 : 0); }

// centre rank level of a bin starting at rank `start` with `m` ranks in a batch of b (fastdpot.privacy.sketch.bin_levels)
inline double bin_level(int64_t start, int64_t m, int64_t b) {
    if (b == 1) return 0.5;
    return ((double)start + ((double)m - 1.0) / 2.0) / (double)(b - 1);
}

// weighted pool-adjacent-violators: out = the non-decreasing fit of v with weights w (scipy isotonic_regression)
struct Isotonic {
    std::vector<double> bv, bw;
    std::vector<int64_t> bn;
    void fit(const double* v, const double* w, int64_t L, double* out) {
        bv.resize(L); bw.resize(L); bn.resize(L);
        int64_t nb = 0;
        for (int64_t i = 0; i < L; ++i) {
            bv[nb] = v[i]; bw[nb] = w[i]; bn[nb] = 1; ++nb;
            while (nb > 1 && bv[nb - 2] > bv[nb - 1]) {
                const double ww = bw[nb - 2] + bw[nb - 1];
                bv[nb - 2] = (bw[nb - 2] * bv[nb - 2] + bw[nb - 1] * bv[nb - 1]) / ww;
                bw[nb - 2] = ww; bn[nb - 2] += bn[nb - 1]; --nb;
            }
        }
        int64_t pos = 0;
        for (int64_t b = 0; b < nb; ++b)
            for (int64_t r = 0; r < bn[b]; ++r) out[pos++] = bv[b];
    }
};

template <typename T>
py::array_t<double> sketch_chunk(py::array_t<T, py::array::c_style> px_arr, py::array_t<T, py::array::c_style> py_arr,
                                 int p, int64_t L, double noise_std, uint64_t seed, int64_t dir_offset,
                                 double grad_scale, py::object gy_obj, py::object noise_obj) {
    if (px_arr.ndim() != 2 || py_arr.ndim() != 2 || px_arr.shape(0) != py_arr.shape(0))
        throw std::invalid_argument("sketch_chunk: px (kc, M) and py (kc, N) must be 2-D with the same kc");
    if (p != 1 && p != 2) throw std::invalid_argument("sketch_chunk: p must be 1 or 2");
    const int64_t kc = px_arr.shape(0), M = px_arr.shape(1), N = py_arr.shape(1);
    if (M <= 0 || N <= 0 || M > 0xFFFFFFFFll || N > 0xFFFFFFFFll)
        throw std::invalid_argument("sketch_chunk: M and N must be in [1, 2^32)");
    if (L < 1 || L > M || L > N) throw std::invalid_argument("sketch_chunk: sketch_bins must be in [1, min(M, N)]");
    const bool need_gy = !gy_obj.is_none(), keep_noise = !noise_obj.is_none();
    std::vector<py::array> hold;
    T* gy = nullptr;
    double* nz = nullptr;
    if (need_gy) {
        py::array a = gy_obj.cast<py::array>();
        if (!a.dtype().is(py::dtype::of<T>()) || !(a.flags() & py::array::c_style) || !a.writeable() ||
            a.ndim() != 2 || a.shape(0) != kc || a.shape(1) != N)
            throw std::invalid_argument("sketch_chunk: gy must be a writeable C-contiguous (kc, N) array of the input dtype");
        hold.push_back(a);
        gy = static_cast<T*>(a.mutable_data());
    }
    if (keep_noise) {
        py::array a = noise_obj.cast<py::array>();
        if (!a.dtype().is(py::dtype::of<double>()) || !(a.flags() & py::array::c_style) || !a.writeable() ||
            a.ndim() != 2 || a.shape(0) != kc || a.shape(1) != L)
            throw std::invalid_argument("sketch_chunk: noise must be a writeable C-contiguous (kc, L) float64 array");
        hold.push_back(a);
        nz = static_cast<double*>(a.mutable_data());
    }
    const T* px = px_arr.data();
    T* pyv = py_arr.mutable_data();
    py::array_t<double> losses(kc);
    double* loss = losses.mutable_data();
    {
        py::gil_scoped_release release;
#pragma omp parallel
        {
            Sorter<T> sorter;
            Isotonic iso;
            std::vector<T> sx(M), sy(N);
            std::vector<uint32_t> perm(need_gy ? N : 0);
            std::vector<double> mean(L), wt(L), table(L), lv(L);
#pragma omp for schedule(dynamic, 1)
            for (int64_t j = 0; j < kc; ++j) {
                const uint64_t jg = (uint64_t)(dir_offset + j);
                sorter.sort(px + j * M, (uint32_t)M, nullptr, sx.data());
                int64_t pos = 0;
                for (int64_t l = 0; l < L; ++l) {
                    const int64_t ml = bin_size(M, L, l);
                    double s = 0.0;
                    for (int64_t r = 0; r < ml; ++r) s += (double)sx[pos + r];
                    const double z = noise_std > 0 ? noise_std * normal_at(seed, 0, jg * (uint64_t)L + (uint64_t)l) : 0.0;
                    if (nz) nz[j * L + l] = z;
                    mean[l] = (s + z) / (double)ml;
                    wt[l] = (double)ml;
                    lv[l] = bin_level(pos, ml, M);
                    pos += ml;
                }
                iso.fit(mean.data(), wt.data(), L, table.data());
                sorter.sort(pyv + j * N, (uint32_t)N, need_gy ? perm.data() : nullptr, sy.data());
                T* gyr = need_gy ? gy + j * N : nullptr;
                double acc = 0.0, slope;
                int64_t seg = -1;  // number of private levels <= u, minus one (torch.searchsorted(right=True) - 1)
                pos = 0;
                for (int64_t l = 0; l < L; ++l) {
                    const int64_t ml = bin_size(N, L, l);
                    double s = 0.0;
                    for (int64_t r = 0; r < ml; ++r) s += (double)sy[pos + r];
                    const double g = s / (double)ml;
                    double u = bin_level(pos, ml, N);
                    u = u < 0.0 ? 0.0 : (u > 1.0 ? 1.0 : u);
                    double target;
                    if (L == 1) {
                        target = table[0];
                    } else {
                        while (seg + 1 < L && lv[seg + 1] <= u) ++seg;
                        const int64_t a = seg < 0 ? 0 : (seg > L - 2 ? L - 2 : seg);
                        target = table[a] + (u - lv[a]) * ((table[a + 1] - table[a]) / (lv[a + 1] - lv[a]));
                    }
                    acc += ((double)ml / (double)N) * cost_and_slope(g - target, p, &slope);
                    if (gyr) {
                        const T gv = (T)(grad_scale * slope / (double)N);
                        for (int64_t r = 0; r < ml; ++r) gyr[perm[pos + r]] = gv;
                    }
                    pos += ml;
                }
                loss[j] = acc;
            }
        }
    }
    return losses;
}

}  // namespace

PYBIND11_MODULE(_C_sliced, m) {
    m.doc() = "fastdpot fused CPU kernels for the (DP) sliced Wasserstein distance, points and sketch releases (one chunk of directions)";
    const char* doc =
        "sw_chunk(px (kc,N), py (kc,M), p, noise_std, seed, dir_offset, grad_scale, gx|None, gy|None, "
        "noise_x|None, noise_y|None) -> per-direction W_p^p (kc,) float64.\n"
        "px/py are modified in place (noise added). gx/gy (kc,N)/(kc,M) receive grad_scale * dW_p^p/d(projected "
        "value); noise_x/noise_y receive the noise drawn (direction-major).";
    m.def("sw_chunk_f32", &sw_chunk<float>, doc, py::arg("px").noconvert(), py::arg("py").noconvert(),
          py::arg("p"), py::arg("noise_std"), py::arg("seed"), py::arg("dir_offset"), py::arg("grad_scale"),
          py::arg("gx"), py::arg("gy"), py::arg("noise_x"), py::arg("noise_y"));
    m.def("sw_chunk_f64", &sw_chunk<double>, doc, py::arg("px").noconvert(), py::arg("py").noconvert(),
          py::arg("p"), py::arg("noise_std"), py::arg("seed"), py::arg("dir_offset"), py::arg("grad_scale"),
          py::arg("gx"), py::arg("gy"), py::arg("noise_x"), py::arg("noise_y"));
    const char* sdoc =
        "sketch_chunk(px (kc,M) private, py (kc,N) generated, p, sketch_bins, noise_std, seed, dir_offset, grad_scale, "
        "gy|None, noise|None) -> per-direction loss of the sketch release (kc,) float64.\n"
        "px and py are read only; gy (kc,N) receives grad_scale * dloss/d(generated projected value); noise (kc,L) "
        "float64 receives the noise added to the private bin sums.";
    m.def("sketch_chunk_f32", &sketch_chunk<float>, sdoc, py::arg("px").noconvert(), py::arg("py").noconvert(),
          py::arg("p"), py::arg("sketch_bins"), py::arg("noise_std"), py::arg("seed"), py::arg("dir_offset"),
          py::arg("grad_scale"), py::arg("gy"), py::arg("noise"));
    m.def("sketch_chunk_f64", &sketch_chunk<double>, sdoc, py::arg("px").noconvert(), py::arg("py").noconvert(),
          py::arg("p"), py::arg("sketch_bins"), py::arg("noise_std"), py::arg("seed"), py::arg("dir_offset"),
          py::arg("grad_scale"), py::arg("gy"), py::arg("noise"));
}
