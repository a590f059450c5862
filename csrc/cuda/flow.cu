// fastdpot._C_cuda_flow: CUDA primitives of the `cuda` backend (pybind11 on raw device pointers; no torch headers).
//
// * argsort_rows: per-row sort of (R, n) float32 keys in place, with each sorted position's original column as a
//   uint32 index, by CUB (cub::DeviceRadixSort -- the onesweep LSD radix sort -- one row at a time for long rows, or
//   one cub::DeviceSegmentedRadixSort call over all rows for short ones): half the index bytes of torch.sort's int64.
// * hist_count: per-row histograms of B equal-width bins, counted in shared memory (one histogram per block,
//   flushed to global memory with one atomic per non-empty bin) instead of one global atomic per value.
// * hist_coef: the histogram-CDF transport of the sort-free mode, in place: s -> s - T(s), with the row's counts,
//   cumulative counts and target quantiles staged in shared memory.
//
// Every function takes the CUDA stream (an integer handle: torch.cuda.current_stream().cuda_stream) and enqueues
// work on it; nothing synchronises the host. Device pointers come from torch's allocator (same process, same primary
// context). Errors of the CUDA runtime raise RuntimeError naming the call.
#include <pybind11/pybind11.h>

#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace {

void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) {
        throw std::runtime_error(std::string("fastdpot._C_cuda_flow: ") + what + ": " + cudaGetErrorString(err));
    }
}

template <typename P>
P* as_ptr(std::uintptr_t p) { return reinterpret_cast<P*>(p); }

cudaStream_t as_stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// ---------------------------------------------------------------------------------------------------------------
// sort
// ---------------------------------------------------------------------------------------------------------------
__global__ void iota_rows_kernel(std::uint32_t* vals, std::int64_t n, std::int64_t rows) {
    for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        std::uint32_t* row = vals + r * n;
        for (std::int64_t i = blockIdx.x * (std::int64_t)blockDim.x + threadIdx.x; i < n;
             i += (std::int64_t)gridDim.x * blockDim.x) {
            row[i] = static_cast<std::uint32_t>(i);
        }
    }
}

// Temporary storage (bytes) of one argsort_rows call: the DoubleBuffer forms of CUB need only their bin counters and
// look-back state, the ping-pong buffers are the caller's.
std::size_t argsort_temp_bytes(std::int64_t n, std::int64_t rows, bool per_row) {
    std::size_t bytes = 0;
    cub::DoubleBuffer<float> dk(nullptr, nullptr);
    cub::DoubleBuffer<std::uint32_t> dv(nullptr, nullptr);
    if (per_row) {
        check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, dk, dv, n, 0, 32),
              "DeviceRadixSort::SortPairs (size query)");
    } else {
        const std::int64_t* offs = nullptr;
        check(cub::DeviceSegmentedRadixSort::SortPairs(nullptr, bytes, dk, dv, n * rows, rows, offs, offs + 1, 0, 32),
              "DeviceSegmentedRadixSort::SortPairs (size query)");
    }
    return bytes;
}

// Sort each of the `rows` rows of float32 `keys` (row-major, length n) in place and write each sorted position's
// original column into `idx` (an argsort with uint32 indices). `alt_keys` / `alt_idx` are ping-pong buffers of n
// elements (per_row) or rows * n elements (segmented, with `offsets` = rows + 1 int64 row starts). Where CUB leaves a
// result in the ping-pong buffer, it is copied back, so the result is always in keys / idx. Stable (ties keep their
// column order).
void argsort_rows(std::uintptr_t keys_p, std::uintptr_t alt_keys_p, std::uintptr_t idx_p, std::uintptr_t alt_idx_p,
                  std::int64_t n, std::int64_t rows, bool per_row, std::uintptr_t offsets_p, std::uintptr_t temp_p,
                  std::size_t temp_bytes, std::uintptr_t stream_p) {
    float* keys = as_ptr<float>(keys_p);
    float* alt_keys = as_ptr<float>(alt_keys_p);
    auto* idx = as_ptr<std::uint32_t>(idx_p);
    auto* alt_idx = as_ptr<std::uint32_t>(alt_idx_p);
    void* temp = as_ptr<void>(temp_p);
    cudaStream_t stream = as_stream(stream_p);
    if (n <= 0 || rows <= 0) return;
    dim3 grid(unsigned((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096), unsigned(rows < 65535 ? rows : 65535));
    iota_rows_kernel<<<grid, 256, 0, stream>>>(idx, n, rows);
    check(cudaGetLastError(), "iota_rows_kernel launch");
    if (per_row) {
        for (std::int64_t r = 0; r < rows; ++r) {
            float* kr = keys + r * n;
            std::uint32_t* vr = idx + r * n;
            cub::DoubleBuffer<float> dk(kr, alt_keys);
            cub::DoubleBuffer<std::uint32_t> dv(vr, alt_idx);
            std::size_t tb = temp_bytes;
            check(cub::DeviceRadixSort::SortPairs(temp, tb, dk, dv, n, 0, 32, stream), "DeviceRadixSort::SortPairs");
            if (dk.Current() != kr) {
                check(cudaMemcpyAsync(kr, dk.Current(), n * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                      "cudaMemcpyAsync (keys)");
            }
            if (dv.Current() != vr) {
                check(cudaMemcpyAsync(vr, dv.Current(), n * sizeof(std::uint32_t), cudaMemcpyDeviceToDevice, stream),
                      "cudaMemcpyAsync (indices)");
            }
        }
    } else {
        const auto* offs = as_ptr<const std::int64_t>(offsets_p);
        cub::DoubleBuffer<float> dk(keys, alt_keys);
        cub::DoubleBuffer<std::uint32_t> dv(idx, alt_idx);
        std::size_t tb = temp_bytes;
        check(cub::DeviceSegmentedRadixSort::SortPairs(temp, tb, dk, dv, n * rows, rows, offs, offs + 1, 0, 32,
                                                       stream),
              "DeviceSegmentedRadixSort::SortPairs");
        if (dk.Current() != keys) {
            check(cudaMemcpyAsync(keys, dk.Current(), n * rows * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                  "cudaMemcpyAsync (keys)");
        }
        if (dv.Current() != idx) {
            check(cudaMemcpyAsync(idx, dv.Current(), n * rows * sizeof(std::uint32_t), cudaMemcpyDeviceToDevice,
                                  stream),
                  "cudaMemcpyAsync (indices)");
        }
    }
    check(cudaGetLastError(), "argsort_rows");
}

// ---------------------------------------------------------------------------------------------------------------
// histogram mode
// ---------------------------------------------------------------------------------------------------------------
// Bin of a value on B equal bins of [lo, lo + B width] and its position inside the bin, as kernels/histogram.py's
// _bin_of: t = clamp((s - lo) / width, 0, B), b = min(floor(t), B - 1), frac = t - b.
template <typename T>
__device__ __forceinline__ int bin_of(T s, T lo, T width, int histogram_bins, T* frac) {
    T t = (s - lo) / width;
    t = t < T(0) ? T(0) : t;
    t = t > T(histogram_bins) ? T(histogram_bins) : t;
    int b = static_cast<int>(t);
    b = b < histogram_bins - 1 ? b : histogram_bins - 1;
    *frac = t - T(b);
    return b;
}

template <typename T>
__global__ void hist_count_kernel(const T* __restrict__ s, std::int64_t n, const T* __restrict__ lo,
                                  const T* __restrict__ width, int histogram_bins, std::int32_t* __restrict__ hist) {
    extern __shared__ std::int32_t sh_count[];
    const std::int64_t c = blockIdx.y;
    for (int b = threadIdx.x; b < histogram_bins; b += blockDim.x) sh_count[b] = 0;
    __syncthreads();
    const T* row = s + c * n;
    const T l = lo[c], w = width[c];
    const std::int64_t stride = (std::int64_t)gridDim.x * blockDim.x;
    std::int64_t i = blockIdx.x * (std::int64_t)blockDim.x + threadIdx.x;
    T frac;
    for (; i + 3 * stride < n; i += 4 * stride) {  // four independent loads in flight per thread
        const T v0 = row[i], v1 = row[i + stride], v2 = row[i + 2 * stride], v3 = row[i + 3 * stride];
        atomicAdd(&sh_count[bin_of(v0, l, w, histogram_bins, &frac)], 1);
        atomicAdd(&sh_count[bin_of(v1, l, w, histogram_bins, &frac)], 1);
        atomicAdd(&sh_count[bin_of(v2, l, w, histogram_bins, &frac)], 1);
        atomicAdd(&sh_count[bin_of(v3, l, w, histogram_bins, &frac)], 1);
    }
    for (; i < n; i += stride) atomicAdd(&sh_count[bin_of(row[i], l, w, histogram_bins, &frac)], 1);
    __syncthreads();
    for (int b = threadIdx.x; b < histogram_bins; b += blockDim.x) {
        const std::int32_t v = sh_count[b];
        if (v != 0) atomicAdd(&hist[c * histogram_bins + b], v);
    }
}

// s -> s - T(s) in place, T the private quantile at the histogram-CDF level u = (C_b + frac n_b) / N of s
// (kernels/histogram.py's _hist_target). Counts and cumulative counts (int32: N < 2^31) in shared memory; the row's
// sorted private values q too when q_in_smem.
template <typename T>
__global__ void hist_coef_kernel(T* __restrict__ s, std::int64_t n, const T* __restrict__ lo,
                                 const T* __restrict__ width, const std::int32_t* __restrict__ hist,
                                 const std::int64_t* __restrict__ cum, const T* __restrict__ q, std::int64_t m,
                                 int histogram_bins, bool q_in_smem) {
    extern __shared__ unsigned char smem_raw[];
    auto* sh_q = reinterpret_cast<T*>(smem_raw);  // m values when q_in_smem (T-aligned: first)
    auto* sh_count = reinterpret_cast<std::int32_t*>(smem_raw + (q_in_smem ? m * sizeof(T) : 0));
    std::int32_t* sh_below = sh_count + histogram_bins;
    const std::int64_t c = blockIdx.y;
    for (int b = threadIdx.x; b < histogram_bins; b += blockDim.x) {
        sh_count[b] = hist[c * histogram_bins + b];
        sh_below[b] = static_cast<std::int32_t>(cum[c * histogram_bins + b]);
    }
    const T* qrow = q + c * m;
    if (q_in_smem) {
        for (std::int64_t j = threadIdx.x; j < m; j += blockDim.x) sh_q[j] = qrow[j];
        qrow = sh_q;
    }
    __syncthreads();
    T* row = s + c * n;
    const T l = lo[c], w = width[c];
    const T mm1 = T(m - 1);
    const std::int64_t stride = (std::int64_t)gridDim.x * blockDim.x;
    for (std::int64_t i = blockIdx.x * (std::int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        const T v = row[i];
        T frac;
        const int b = bin_of(v, l, w, histogram_bins, &frac);
        const T u = (T(sh_below[b]) + frac * T(sh_count[b])) / T(n);
        const T pos = u * mm1;
        std::int64_t j = static_cast<std::int64_t>(pos);
        j = j < 0 ? 0 : (j > m - 1 ? m - 1 : j);
        const std::int64_t j1 = j + 1 < m ? j + 1 : m - 1;
        const T f = pos - T(j);
        const T q0 = qrow[j];
        const T t = q0 + f * (qrow[j1] - q0);
        row[i] = v - t;
    }
}

int sm_count() {
    int dev = 0, sms = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    return sms;
}

// blocks per row so that the whole grid holds about 8 blocks per multiprocessor, at least one per row
unsigned blocks_per_row(std::int64_t n, std::int64_t rows, int threads) {
    const std::int64_t want = (std::int64_t)sm_count() * 8 / (rows > 0 ? rows : 1);
    const std::int64_t most = (n + threads - 1) / threads;
    std::int64_t b = want < most ? want : most;
    return unsigned(b < 1 ? 1 : b);
}

template <typename T>
void hist_count_t(std::uintptr_t s, std::int64_t n, std::int64_t rows, std::uintptr_t lo, std::uintptr_t width,
                  int histogram_bins, std::uintptr_t hist, std::uintptr_t stream_p) {
    if (n <= 0 || rows <= 0) return;
    const int threads = 512;
    const std::size_t smem = std::size_t(histogram_bins) * sizeof(std::int32_t);
    if (smem > 48 * 1024) throw std::invalid_argument("hist_count: histogram_bins must be <= 12288");
    dim3 grid(blocks_per_row(n, rows, threads), unsigned(rows));
    hist_count_kernel<T><<<grid, threads, smem, as_stream(stream_p)>>>(as_ptr<const T>(s), n, as_ptr<const T>(lo),
                                                                       as_ptr<const T>(width), histogram_bins,
                                                                       as_ptr<std::int32_t>(hist));
    check(cudaGetLastError(), "hist_count_kernel launch");
}

template <typename T>
void hist_coef_t(std::uintptr_t s, std::int64_t n, std::int64_t rows, std::uintptr_t lo, std::uintptr_t width,
                 std::uintptr_t hist, std::uintptr_t cum, std::uintptr_t q, std::int64_t m, int histogram_bins,
                 std::uintptr_t stream_p) {
    if (n <= 0 || rows <= 0) return;
    if (m < 1) throw std::invalid_argument("hist_coef: the private side needs at least one value per row");
    const int threads = 512;
    const std::size_t tables = 2 * std::size_t(histogram_bins) * sizeof(std::int32_t);
    if (tables > 48 * 1024) throw std::invalid_argument("hist_coef: histogram_bins must be <= 6144");
    const bool q_in_smem = tables + std::size_t(m) * sizeof(T) <= 48 * 1024;
    const std::size_t smem = tables + (q_in_smem ? std::size_t(m) * sizeof(T) : 0);
    dim3 grid(blocks_per_row(n, rows, threads), unsigned(rows));
    hist_coef_kernel<T><<<grid, threads, smem, as_stream(stream_p)>>>(
        as_ptr<T>(s), n, as_ptr<const T>(lo), as_ptr<const T>(width), as_ptr<const std::int32_t>(hist),
        as_ptr<const std::int64_t>(cum), as_ptr<const T>(q), m, histogram_bins, q_in_smem);
    check(cudaGetLastError(), "hist_coef_kernel launch");
}

}  // namespace

PYBIND11_MODULE(_C_cuda_flow, mod) {
    mod.doc() = "CUDA primitives of fastdpot's cuda backend (CUB row sorts, shared-memory histogram passes)";
    mod.def("argsort_temp_bytes", &argsort_temp_bytes, py::arg("n"), py::arg("rows"), py::arg("per_row"));
    mod.def("argsort_rows", &argsort_rows);
    mod.def("hist_count",
            [](const std::string& dtype, std::uintptr_t s, std::int64_t n, std::int64_t rows, std::uintptr_t lo,
               std::uintptr_t width, int histogram_bins, std::uintptr_t hist, std::uintptr_t stream) {
                if (dtype == "float32") hist_count_t<float>(s, n, rows, lo, width, histogram_bins, hist, stream);
                else if (dtype == "float64") hist_count_t<double>(s, n, rows, lo, width, histogram_bins, hist, stream);
                else throw std::invalid_argument("dtype must be 'float32' or 'float64'");
            });
    mod.def("hist_coef",
            [](const std::string& dtype, std::uintptr_t s, std::int64_t n, std::int64_t rows, std::uintptr_t lo,
               std::uintptr_t width, std::uintptr_t hist, std::uintptr_t cum, std::uintptr_t q, std::int64_t m,
               int histogram_bins, std::uintptr_t stream) {
                if (dtype == "float32")
                    hist_coef_t<float>(s, n, rows, lo, width, hist, cum, q, m, histogram_bins, stream);
                else if (dtype == "float64")
                    hist_coef_t<double>(s, n, rows, lo, width, hist, cum, q, m, histogram_bins, stream);
                else throw std::invalid_argument("dtype must be 'float32' or 'float64'");
            });
}
