// Pass 2 of the sort-free (histogram) CPU flow step (csrc/flow_histogram.cpp): the bin counts of every direction.
#pragma once

#include <cstdint>
#include <vector>

#include "flow_histogram_common.h"

namespace fastdpot {
namespace hist {

// ------------------------------------------------------------------------------------------------------------
// pass 2: counts of the B bins of every direction
// ------------------------------------------------------------------------------------------------------------
template <typename T>
void counts_impl(const Geometry<T>& g, const Bins<T>& bins, int64_t* out_counts) {
    const int64_t K = g.K, B = bins.B;
    std::vector<uint32_t> cnt((size_t)(g.nthreads * K * B), 0u);
#pragma omp parallel num_threads(g.nthreads)
    {
        Scratch<T> s;
        uint32_t* tc = cnt.data() + (size_t)omp_get_thread_num() * K * B;
        std::vector<int32_t> bb(BN);
        std::vector<T> fr(BN);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < g.nblocks; ++b) {
            int64_t i0, i1;
            g.block(b, i0, i1);
            const int64_t nb = i1 - i0;
            load_block(g, i0, i1, s);
            for (int64_t j0 = 0; j0 < K; j0 += g.C) {
                const int64_t cj = std::min(g.C, K - j0);
                project_chunk<T>(g, i0, i1, j0, cj, s, (T*)nullptr);
                for (int64_t jj = 0; jj < cj; ++jj) {
                    const int64_t j = j0 + jj;
                    const T* row = s.S.data() + jj * BN;
                    const T lo = bins.lo[j], iw = bins.inv_w[j];
#pragma omp simd
                    for (int i = 0; i < BN; ++i) bin_of(row[i], lo, iw, B, bb[i], fr[i]);
                    uint32_t* cj_ = tc + j * B;
                    for (int64_t i = 0; i < nb; ++i) ++cj_[bb[i]];
                }
            }
        }
    }
    for (int64_t e = 0; e < K * B; ++e) {
        int64_t v = 0;
        for (int t = 0; t < g.nthreads; ++t) v += cnt[(size_t)t * K * B + e];
        out_counts[e] = v;
    }
}

}  // namespace hist
}  // namespace fastdpot
