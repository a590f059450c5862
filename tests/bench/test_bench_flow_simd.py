"""Issue 45.4: the flow suite's ``histogram_vs_exact`` case (the C++ histogram step against the exact step it
approximates, one group) records the CPU's SIMD level and the histogram kernel's in its rows, and the rendered table
shows them; ``fastdpot.env.cpu_simd`` reads the level from ``/proc/cpuinfo``. The ``pixel_step`` rows record the rank
pass's layout the same way."""
import json

import pytest

from bench import flow as F
from bench import harness, render, store
from bench import test_flow as T
from fastdpot import env
from fastdpot._ext import cpp_status


class _Benchmark:
    """What run_benchmark uses of pytest-benchmark's fixture: group, extra_info, pedantic (one call here)."""

    def __init__(self):
        self.group, self.extra_info, self.calls = None, {}, 0

    def pedantic(self, fn, setup, rounds, iterations, warmup_rounds):
        setup()
        fn()
        self.calls += 1


def test_the_case_pairs_the_two_cpp_steps_at_the_issues_size():
    assert F.SIZES["2e5"] == dict(n=200_000, m=250, d=48, k=64)
    assert F.IMPLS["histogram_vs_exact"] == ("histogram", "exact") and "exact" in F.ANCHORS
    params = {p for p in T.PARAMS if p[1] == "histogram_vs_exact"}
    assert params == {(s, "histogram_vs_exact", i) for s in ("2e5", "quick") for i in ("histogram", "exact")}
    assert not any(p[0] == "2e5" and p[1] != "histogram_vs_exact" for p in T.PARAMS)  # the other cases keep their sizes
    with pytest.raises(ValueError, match="histogram and exact"):
        F.histogram_vs_exact_case("fastdpot", **F.SIZES["quick"])


@pytest.mark.skipif(not cpp_status("flow")[0] or not cpp_status("flow_histogram")[0],
                    reason="the C++ extensions are not built")
def test_rows_record_the_simd_levels_and_share_one_group():
    groups = set()
    for impl in ("histogram", "exact"):
        params = dict(F.SIZES["quick"], **F.EXTRA["histogram_vs_exact"])
        bm = _Benchmark()
        harness.run_benchmark(bm, F.CASES["histogram_vs_exact"](impl, **params), suite=F.SUITE,
                              name="histogram_vs_exact", impl=impl, params=params, mode="forward",
                              anchors=F.ANCHORS)
        assert bm.calls == 1 and bm.extra_info["impl"] == impl and bm.extra_info["anchor"] == (impl == "exact")
        assert bm.extra_info["simd"] == env.cpu_simd() and bm.extra_info["simd"] in env.SIMD_LEVELS
        assert bm.extra_info["kernel_simd"] == env.kernel_simd("flow_histogram")
        groups.add(bm.group)
    assert len(groups) == 1  # side by side


def test_the_table_shows_the_simd_level(tmp_path):
    def row(impl, median, **kw):
        return dict(run_id="r", suite="flow", case="histogram_vs_exact", impl=impl,
                    params=dict(n=200000, m=250, d=48, k=64, bins=1024), mode="forward", device="cpu",
                    git_rev="abc1234", threads=2, timestamp="2026-01-01T00:00:00", peak_mem_mb=10.0,
                    machine=dict(cpu="Test CPU", cores=2, platform="linux", python="3.11"),
                    versions=dict(torch="2.x"), times_s=[median] * 3, median_s=median, **kw)

    path = str(tmp_path / "run.json")
    store.write_rows(path, [row("histogram", 0.3, simd="avx2", kernel_simd="avx2"),
                            row("exact", 0.36, simd="avx2", kernel_simd="avx2")])
    lines = [ln for ln in render.table(store.load_rows([path])).splitlines() if ln.startswith("| flow")]
    hist = next(ln for ln in lines if "| histogram |" in ln)
    assert "1.20× exact" in hist and hist.endswith("| Test CPU (avx2), abc1234 |")
    # an AVX-512 machine running kernels built for AVX2 (FASTDPOT_MARCH=x86-64-v3) says so
    store.write_rows(path, [row("histogram", 0.3, simd="avx512", kernel_simd="avx2")])
    (ln,) = [ln for ln in render.table(store.load_rows([path])).splitlines() if ln.startswith("| flow")]
    assert ln.endswith("| Test CPU (avx512, kernel built for avx2), abc1234 |")
    with open(path) as f:
        assert json.load(f)["benchmarks"][0]["extra_info"]["simd"] == "avx512"  # stored in the row's extra_info
    # the pixel step's rows name the rank pass's layout (csrc/radix_f32.h), chosen by timing on the machine
    store.write_rows(path, [row("histogram", 0.3, simd="avx512", rank_layout="packed")])
    (ln,) = [ln for ln in render.table(store.load_rows([path])).splitlines() if ln.startswith("| flow")]
    assert ln.endswith("| Test CPU (avx512, rank layout packed), abc1234 |")


@pytest.mark.skipif(not cpp_status("flow_block")[0], reason="the C++ extension _C_flow_block is not built")
def test_the_pixel_step_rows_record_the_rank_layout():
    # 2 classes of 600 particles: the rank pass sorts 600 keys a direction, past the one-sort size (512), so the
    # untimed first call times both layouts (784 directions) and the row records the one kept
    params = dict(F.SIZES["pixel_quick"], n=1200, classes=2)
    bm = _Benchmark()
    harness.run_benchmark(bm, F.CASES["pixel_step"]("fastdpot", **params), suite=F.SUITE, name="pixel_step",
                          impl="fastdpot", params=params, mode="forward", anchors=F.ANCHORS)
    assert bm.extra_info["rank_layout"] in ("index", "packed")


@pytest.mark.parametrize("flags,level", [
    ("fpu sse sse2 sse4_1 sse4_2 avx avx2 fma avx512f avx512bw", "avx512"),
    ("fpu sse sse2 sse4_1 sse4_2 avx avx2 fma bmi2", "avx2"),   # the AMD EPYC of issue 45
    ("fpu sse sse2 sse4_1 sse4_2 avx", "avx"),
    ("fpu sse sse2", "sse2"),
    ("fpu", "none")])
def test_cpu_simd_reads_the_widest_level_from_the_flags(tmp_path, flags, level):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert env.cpu_simd(str(info)) == level
    assert env.cpu_simd(str(tmp_path / "missing")) == "none"
