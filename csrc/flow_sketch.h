// Sketch-target transport of op flow_step (fastdpot/ops/flow.py): the residual s - Q_j(r/(N-1)) of every particle's
// projection s on direction j, r its rank, Q_j the released quantile table's piecewise-linear function. Used by the
// fused step (flow.cpp, pass b) and by the GEMM path of large d (flow.cpp's sketch_residuals: the projections and the
// drift are torch.matmul calls around it).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "common.h"
#include "radix_f32.h"

namespace fastdpot {
namespace flowsketch {

// tr[r] = Q(r / (N - 1)) for r < N: the table row tb (L values at the strictly increasing levels lv), linear between
// levels and extended with its end segments (a constant for L = 1); segment by segment, no per-rank search.
inline void rank_targets(const double* tb, const double* lv, int64_t L, int64_t N, double* tr) {
    if (L == 1) {
        for (int64_t r = 0; r < N; ++r) tr[r] = tb[0];
        return;
    }
    const double inv_n1 = 1.0 / (double)(N - 1);
    int64_t r = 0;
    for (int64_t sg = 0; sg <= L - 2 && r < N; ++sg) {
        const double slope = (tb[sg + 1] - tb[sg]) / (lv[sg + 1] - lv[sg]);
        for (; r < N; ++r) {
            const double u = (double)r * inv_n1;
            if (sg < L - 2 && u >= lv[sg + 1]) break;  // next segment
            tr[r] = tb[sg] + (u - lv[sg]) * slope;
        }
    }
}

// p[i] <- p[i] - tr[rank of p[i]] for the N projections of one direction, in place (float32: written as the radix
// sort's last pass finds each rank; float64: through the argsort)
template <typename T>
inline void residuals_in_place(T* p, int64_t N, const double* tr, std::vector<uint32_t>& perm, std::vector<T>& sx,
                               SortWorkspace<T>& ws, radix::Workspace& pws) {
    if constexpr (std::is_same_v<T, float>) {
        radix::sort_emit_f32(p, (uint32_t)N, pws, [&](uint32_t r, uint32_t i, float v) { p[i] = (T)((double)v - tr[r]); });
    } else {
        if ((int64_t)perm.size() < N) { perm.resize(N); sx.resize(N); }
        argsort(p, (uint32_t)N, perm.data(), sx.data(), ws);
        for (int64_t r = 0; r < N; ++r) p[perm[r]] = (T)((double)sx[r] - tr[r]);
    }
}

}  // namespace flowsketch
}  // namespace fastdpot
