// Sketch-target transport of op flow_step (fastdpot/ops/flow.py): the residual s - Q_j(r/(N-1)) of every particle's
// projection s on direction j, r its rank, Q_j the released quantile table's piecewise-linear function. Used by the
// fused step (flow.cpp, pass b) and by the GEMM path of large d (flow.cpp's sketch_residuals: the projections and the
// drift are torch.matmul calls around it).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common.h"
#include "radix_f32.h"

namespace fastdpot {
namespace flowsketch {

// tr[r] = Q(r / (N - 1)) for r < N: the table row tb (L values at the strictly increasing levels lv), linear between
// levels and extended with its end segments (a constant for L = 1). Segment by segment: each segment's last rank is
// found first (the comparison u >= lv[sg + 1] on u = r / (N - 1), as a per-rank test would make it; r -> u is
// monotone), so the per-rank loop has no branch and vectorises (about 0.25 ns a rank against 0.8 with the test
// inside the loop, on a 2-core Xeon: a tenth of a direction's rank pass at N = 6 000).
inline void rank_targets(const double* tb, const double* lv, int64_t L, int64_t N, double* tr) {
    if (L == 1) {
        for (int64_t r = 0; r < N; ++r) tr[r] = tb[0];
        return;
    }
    const double inv_n1 = 1.0 / (double)(N - 1);
    int64_t r = 0;
    for (int64_t sg = 0; sg <= L - 2 && r < N; ++sg) {
        int64_t end = N;
        if (sg < L - 2) {  // the first rank at or past the next level; a guess from the product, then corrected
            const double next = lv[sg + 1];
            const double guess = std::ceil(next * (double)(N - 1)) - 1.0;
            int64_t e = guess < (double)r ? r : (guess > (double)N ? N : (int64_t)guess);
            while (e > r && (double)(e - 1) * inv_n1 >= next) --e;
            while (e < N && (double)e * inv_n1 < next) ++e;
            end = e;
        }
        const double t0 = tb[sg], l0 = lv[sg], slope = (tb[sg + 1] - tb[sg]) / (lv[sg + 1] - lv[sg]);
        for (int64_t q = r; q < end; ++q) tr[q] = t0 + ((double)q * inv_n1 - l0) * slope;
        r = end;
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
