// Pass 1 of the sort-free (histogram) CPU flow step (csrc/flow_histogram.cpp): the extremes of every direction.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "flow_histogram_common.h"

namespace fastdpot {
namespace hist {

// ------------------------------------------------------------------------------------------------------------
// pass 1: min / max of every noisy projected direction
// ------------------------------------------------------------------------------------------------------------
template <typename T>
void minmax_impl(const Geometry<T>& g, T* out_min, T* out_max, T* nx_out) {
    const int64_t K = g.K;
    std::vector<T> mn((size_t)(g.nthreads * K), std::numeric_limits<T>::infinity());
    std::vector<T> mx((size_t)(g.nthreads * K), -std::numeric_limits<T>::infinity());
#pragma omp parallel num_threads(g.nthreads)
    {
        Scratch<T> s;
        T* tmn = mn.data() + (size_t)omp_get_thread_num() * K;
        T* tmx = mx.data() + (size_t)omp_get_thread_num() * K;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < g.nblocks; ++b) {
            int64_t i0, i1;
            g.block(b, i0, i1);
            const int64_t nb = i1 - i0;
            load_block(g, i0, i1, s);
            for (int64_t j0 = 0; j0 < K; j0 += g.C) {
                const int64_t cj = std::min(g.C, K - j0);
                project_chunk(g, i0, i1, j0, cj, s, nx_out);
                for (int64_t jj = 0; jj < cj; ++jj) {
                    const T* row = s.S.data() + jj * BN;
                    T a = tmn[j0 + jj], z = tmx[j0 + jj];
                    // min and max are exact in any order: vectorised (the projections are finite)
#pragma omp simd reduction(min : a) reduction(max : z)
                    for (int64_t i = 0; i < nb; ++i) { a = std::min(a, row[i]); z = std::max(z, row[i]); }
                    tmn[j0 + jj] = a;
                    tmx[j0 + jj] = z;
                }
            }
        }
    }
    for (int64_t j = 0; j < K; ++j) {
        T a = std::numeric_limits<T>::infinity(), z = -std::numeric_limits<T>::infinity();
        for (int t = 0; t < g.nthreads; ++t) { a = std::min(a, mn[t * K + j]); z = std::max(z, mx[t * K + j]); }
        out_min[j] = a;
        out_max[j] = z;
    }
}

}  // namespace hist
}  // namespace fastdpot
