// Fused CPU kernel of the (DP) sliced Wasserstein distance SW_p^p (Rakotomamonjy & Ralaivola, ICML 2021), one chunk of directions.
//
// Input: the projected values of both clouds for kc directions, laid out direction-major (kc, N) and (kc, M)
// (the caller computes them with torch's BLAS: Θ_c Xᵀ). Per direction j, in parallel over directions (OpenMP):
//   1. add σ·Philox normals (element (i, j_global) of the x noise is normal number j_global·N + i of stream 0,
//      the y noise stream 1: independent of chunking and thread count, so replayable);
//   2. radix argsort both rows (csrc/common.h, 32-bit indices);
//   3. W_p^p by quantile matching: N == M pairs ranks; N != M walks the merged quantile levels {i/N} ∪ {j/M}
//      with two pointers (integer arithmetic on the 1/(N·M) grid, exact);
//   4. optionally, the gradient of (1/k)·W_p^p w.r.t. every projected value, scattered back through the
//      permutations into (kc, N) / (kc, M) buffers (the caller contracts them with Θ_c to get (N, d) / (M, d)).
// The GIL is released for the whole call.
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

}  // namespace

PYBIND11_MODULE(_C_sliced, m) {
    m.doc() = "fastdpot fused CPU kernel for the (DP) sliced Wasserstein distance (one chunk of directions)";
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
}
