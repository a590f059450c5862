// The rank pass's layout (csrc/radix_f32.h, Layout) as seen from Python: set_rank_layout / rank_layout on each
// extension module that ranks with sort_emit_f32 (_C_flow, _C_flow_block). For the tests (each layout against the
// other) and the benchmarks (which layout a row ran); the outputs do not depend on it.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "radix_f32.h"

namespace fastdpot {

inline void def_rank_layout(pybind11::module_& m) {
    m.def(
        "set_rank_layout",
        [](const std::string& name) {
            radix::LayoutTuner& tu = radix::layout_tuner();
            if (name == "index") tu.forced = radix::kIndex;
            else if (name == "packed") tu.forced = radix::kPacked;
            else if (name == "auto") { tu.forced = radix::kAuto; tu.forget(); }
            else throw std::invalid_argument("rank layout must be 'auto', 'index' or 'packed', got '" + name + "'");
        },
        "set_rank_layout(name): the rank pass's layout for every later call of this module: 'index' (indices only), "
        "'packed' ((key, index) words) or 'auto' (the default: timed on the first calls of each size class, the "
        "faster kept; setting it forgets earlier choices). The ranks and outputs are the same for every layout.",
        pybind11::arg("name"));
    m.def(
        "rank_layout",
        [](int64_t n) -> std::string {
            if (n < 0 || n > (int64_t)UINT32_MAX) throw std::invalid_argument("n must be in [0, 2^32)");
            if ((uint32_t)n < radix::kSmall) return "small";
            const int l = radix::layout_tuner().layout((uint32_t)n);
            return l == radix::kIndex ? "index" : l == radix::kPacked ? "packed" : "auto";
        },
        "rank_layout(n): the layout a rank pass of n keys runs with now: 'index', 'packed', 'auto' (still being "
        "timed) or 'small' (n < 512: one std::sort).",
        pybind11::arg("n"));
}

}  // namespace fastdpot
