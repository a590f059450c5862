"""Sketch mode of op ``flow_step`` (target = a quantile table): the table rule, the reference against the points
mode, the C++ and Triton steps against the reference with replayed noise, and bad input."""
import os

import pytest
import torch

import fastdpot.ops.flow as F  # the op module (flow_step, its backends, _CPU_MAX_CHUNK)
from fastdpot._ext import cpp_status
from fastdpot.reference.flow import flow_step as ref_points
from fastdpot.reference.flow import flow_step as ref_step
from fastdpot.reference.flow import table_quantiles

HAVE_CPU = cpp_status("flow")[0]
needs_cpu = pytest.mark.skipif(not HAVE_CPU, reason="C++ extension fastdpot._C_flow not built")
HAVE_TRITON = (os.environ.get("TRITON_INTERPRET", "0") == "1" or torch.cuda.is_available())
try:
    import triton  # noqa: F401
except ImportError:  # pragma: no cover
    HAVE_TRITON = False
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="Triton kernels need CUDA or TRITON_INTERPRET=1")


def _inputs(n, d, k, L, dtype=torch.float64, seed=0, levels="centres"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    th = torch.randn(k, d, generator=g, dtype=torch.float64)
    th = (th / th.norm(dim=1, keepdim=True)).to(dtype)
    tb = torch.sort(torch.randn(k, L, generator=g, dtype=torch.float64) * 0.8 + 0.3, dim=1).values
    if levels == "centres":  # bin centres of L equal bins: the first / last segments are extrapolated
        lv = (torch.arange(L, dtype=torch.float64) + 0.5) / L
    else:  # random strictly increasing levels in (0, 1)
        lv = torch.sort(torch.rand(L, generator=g, dtype=torch.float64)).values
    return x, th, tb, lv


def _grid_inputs(n, d, dtype=torch.float32, seed=0):
    """Particles whose coordinates are distinct multiples of 1/64 (exact in float32) and axis directions: every
    projection is exact and neighbours in rank are 1/64 apart, so no float32 rounding can reorder them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.stack([torch.randperm(n, generator=g) for _ in range(d)], dim=1).to(dtype) / 64 - n / 128
    th = torch.eye(d, dtype=dtype)
    tb = torch.sort(torch.randn(d, 4, generator=g, dtype=torch.float64), dim=1).values
    lv = torch.tensor([0.125, 0.375, 0.625, 0.875], dtype=torch.float64)
    return x, th, tb, lv


def test_table_rule_by_hand():
    tb = torch.tensor([[0.0, 1.0, 1.5], [2.0, 2.0, 4.0]], dtype=torch.float64)
    lv = torch.tensor([0.25, 0.75, 0.875], dtype=torch.float64)
    u = torch.tensor([[0.0, 0.0], [0.5, 0.5], [0.75, 0.8125], [1.0, 1.0], [-3.0, 7.0]], dtype=torch.float64)
    got = table_quantiles(tb, lv, u)
    want = torch.tensor([[-0.5, 2.0],     # below the first level: the first segment's slope extended
                         [0.5, 2.0],
                         [1.0, 3.0],      # at a knot / inside the last segment
                         [2.0, 6.0],      # above the last level: the last segment's slope extended
                         [-0.5, 6.0]],    # u clamped to [0, 1]
                        dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    one = table_quantiles(tb[:, :1], lv[:1], u)  # L = 1: constant
    torch.testing.assert_close(one, tb[:, 0].expand(5, 2), rtol=0, atol=0)


@pytest.mark.parametrize("n,m,mode,Q", [(40, 40, "exact", None), (97, 13, "exact", None), (33, 250, "exact", None),
                                        (33, 5, "grid", 9), (61, 7, "grid", None)])
def test_sketch_of_all_sorted_projections_is_the_points_mode(n, m, mode, Q):
    # the table of the sorted private projections at levels l/(M-1) is the private quantile function itself, so
    # (without private noise) sketch mode reproduces the points mode; in grid mode the points mode interpolates
    # the private quantiles linearly between its Q levels, which equals Q_j when every l/(M-1) is a grid level
    # ((Q-1) a multiple of (M-1))
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    y = torch.randn(m, 4, generator=g, dtype=torch.float64) * 0.5 + 1
    th = torch.randn(6, 4, generator=g, dtype=torch.float64)
    nx = 0.3 * torch.randn(n, 6, generator=g, dtype=torch.float64)
    tb = torch.sort(y @ th.t(), dim=0).values.t().contiguous()
    lv = torch.arange(m, dtype=torch.float64) / (m - 1)
    new_p, drift_p = ref_points(x, y, th, nx, None, 0.5, quantiles=mode, num_quantiles=Q)
    new_s, drift_s = ref_step(x, None, th, nx, None, 0.5, quantiles=mode, num_quantiles=Q, sketch=(tb, lv))
    torch.testing.assert_close(drift_s, drift_p, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new_s, new_p, rtol=1e-12, atol=1e-12)


def test_sketch_moves_one_dimensional_particles_onto_the_table():
    # d = 1, θ = 1, h = 1, no noise: one exact step puts the particle of rank r at Q(r/(N-1))
    x = torch.randn(50, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    tb = torch.tensor([[-1.0, 0.0, 3.0]], dtype=torch.float64)
    lv = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    new, _ = ref_step(x, None, torch.ones(1, 1, dtype=torch.float64), None, None, 1.0, sketch=(tb, lv))
    u = (torch.arange(50, dtype=torch.float64) / 49).unsqueeze(1)
    torch.testing.assert_close(torch.sort(new, dim=0).values, table_quantiles(tb, lv, u), rtol=0, atol=1e-14)


def _check_replay(new, drift, noise, x, th, tb, lv, mode, Q, reg, tol):
    assert noise["private"] is None
    rn, rd = ref_step(x.double(), None, th.double(), noise["particles"].double(), None, 0.5, diffusion=reg, brownian=None if noise["brownian"] is None else noise["brownian"].double(), quantiles=mode, num_quantiles=Q, sketch=(tb, lv))
    torch.testing.assert_close(drift.double(), rd, **tol)
    torch.testing.assert_close(new.double(), rn, **tol)


@needs_cpu
def test_cpu_chunking_does_not_change_the_sketch_step(monkeypatch):
    x, th, tb, lv = _inputs(300, 6, 11, 5, seed=5)
    kw = dict(noise_std=0.2, step_size=0.5, diffusion=0.1, seed=9, backend="cpu", sketch=(tb, lv))
    full = F.flow_step(x, None, th, **kw)
    monkeypatch.setattr(F, "_CPU_MAX_CHUNK", 3)  # 11 directions in chunks of 3, 3, 3, 2
    chunked = F.flow_step(x, None, th, **kw)
    torch.testing.assert_close(full[0], chunked[0], rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(full[1], chunked[1], rtol=1e-13, atol=1e-13)


@needs_cpu
def test_cpu_sketch_uses_the_particle_noise_stream_of_the_points_mode():
    # the particles' smoothing noise is the same draw in both modes (stream 2j); sketch mode draws no private noise
    x, th, tb, lv = _inputs(64, 4, 5, 3, seed=6)
    y = torch.randn(10, 4, dtype=torch.float64)
    _, _, n_pts = F.flow_step(x, y, th, noise_std=0.4, step_size=0.5, seed=77, return_noise=True, backend="cpu")
    _, _, n_sk = F.flow_step(x, None, th, noise_std=0.4, step_size=0.5, seed=77, return_noise=True, backend="cpu",
                             sketch=(tb, lv))
    torch.testing.assert_close(n_sk["particles"], n_pts["particles"], rtol=0, atol=0)
    assert n_sk["private"] is None


@pytest.mark.parametrize("bad,match", [
    (dict(private="rows"), "exactly one target"),
    (dict(sketch=None), "exactly one target"),
    (dict(sketch="table"), "sketch must be a pair"),
    (dict(levels=torch.tensor([0.5, 0.25, 0.75], dtype=torch.float64)), "strictly increasing"),
    (dict(levels=torch.tensor([0.0, 0.5, 1.5], dtype=torch.float64)), r"in \[0, 1\]"),
    (dict(levels=torch.tensor([0.0, float("nan"), 1.0], dtype=torch.float64)), "finite|NaN"),
    (dict(levels=torch.tensor([0.0, 1.0], dtype=torch.float64)), "disagree on L"),
    (dict(table=torch.zeros(4, 3, dtype=torch.float64)), "one row per direction"),
    (dict(table=torch.full((5, 3), float("inf"), dtype=torch.float64)), "finite|Inf"),
    (dict(table=torch.zeros(5, 0, dtype=torch.float64), levels=torch.zeros(0, dtype=torch.float64)), "must not be empty"),
])
def test_bad_sketch_input(bad, match):
    x, th, tb, lv = _inputs(20, 3, 5, 3)
    table, levels = bad.get("table", tb), bad.get("levels", lv)
    sketch = bad.get("sketch", (table, levels))
    private = torch.zeros(4, 3, dtype=torch.float64) if "private" in bad else None
    before = (x.clone(), table.clone(), levels.clone())
    with pytest.raises((ValueError, TypeError), match=match):
        F.flow_step(x, private, th, noise_std=0.1, step_size=0.5, sketch=sketch, backend="reference")
    torch.testing.assert_close((x, table, levels), before, equal_nan=True)


@needs_cpu
@pytest.mark.parametrize("n", [2, 3, 5, 17, 64])
@pytest.mark.parametrize("path", ["fused", "gemm", "block"])
def test_cpu_sketch_levels_on_the_rank_grid(n, path):
    # the C++ rank targets find each segment's end before the per-rank loop (csrc/flow_sketch.h): with levels
    # exactly on ranks' u = r / (N - 1) (0 and 1 included), between them, and several between two ranks, every rank
    # gets the reference's target on each C++ path that uses them (a segment's end one rank late or early is caught
    # wherever that rank is not a knot, where both segments agree)
    from fastdpot.flows.directions import PatchDCTBlock, patch_block

    g = torch.Generator().manual_seed(n)
    if path == "block":
        proj = PatchDCTBlock(4, 4, 2)
        th = proj.matrix(torch.float64)
    else:
        th = torch.eye(3, dtype=torch.float64) if path == "fused" else patch_block(16, 18, 4)[0]
        proj = th
    k, d = th.shape
    x = torch.rand(n, d, generator=g, dtype=torch.float64)
    grid = [r / (n - 1) for r in range(n)]
    lv = torch.tensor(sorted({0.0, *grid[1::2], 0.5 / (n - 1), 1.0 - 0.25 / (n - 1), 1.0 - 0.125 / (n - 1), 1.0}),
                      dtype=torch.float64)
    tb = torch.sort(torch.randn(k, len(lv), generator=g, dtype=torch.float64), dim=1).values
    kw = dict(noise_std=0.0, step_size=0.5 * k, sketch=(tb, lv))
    want, want_drift, _ = F.flow_step(x, None, th, backend="reference", **kw)
    got, drift, _ = F.flow_step(x, None, proj, backend="cpu", **kw)
    torch.testing.assert_close(drift, want_drift, rtol=0, atol=1e-10)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@needs_cpu
@pytest.mark.parametrize("n", [600, 5000, 70_000])  # 2-byte indices up to 65 536 keys, then 4-byte
@pytest.mark.parametrize("path", ["fused", "gemm", "block"])
def test_cpu_rank_layouts_give_the_same_step(n, path):
    # csrc/radix_f32.h ranks with one of two layouts (indices only, or packed (key, index) words), chosen per CPU by
    # timing ("auto"): each must give every key the same rank, ties in input order, so the step is bit for bit the
    # same with either. Half the particles sit on a 1/8 grid, so many projections tie exactly.
    from fastdpot._ext import load_cpp
    from fastdpot.flows.directions import PatchDCTBlock, patch_block

    g = torch.Generator().manual_seed(n)
    if path == "block":
        proj = PatchDCTBlock(4, 4, 2)
        mod = load_cpp("flow_block")
    else:
        proj = torch.eye(3) if path == "fused" else patch_block(16, 18, 4)[0].float()
        mod = load_cpp("flow")
    k, d = proj.shape
    x = torch.rand(n, d, generator=g)
    x[: n // 2] = torch.round(x[: n // 2] * 8) / 8
    lv = (torch.arange(8, dtype=torch.float64) + 0.5) / 8
    tb = torch.sort(torch.randn(k, 8, generator=g, dtype=torch.float64), dim=1).values
    kw = dict(noise_std=0.0, step_size=0.5 * k, sketch=(tb, lv), backend="cpu")
    got = {}
    try:
        for layout in ("index", "packed", "auto"):
            mod.set_rank_layout(layout)
            assert mod.rank_layout(n) == ("auto" if layout == "auto" else layout)
            got[layout] = F.flow_step(x, None, proj, **kw)[:2]
            if layout == "auto" and path == "block":  # 16 directions: the 2 x 4 timed trials are done in one call
                assert mod.rank_layout(n) in ("index", "packed")
    finally:
        mod.set_rank_layout("auto")
    for layout in ("packed", "auto"):
        for a, b in zip(got["index"], got[layout]):
            assert torch.equal(a, b), layout
    with pytest.raises(ValueError, match="rank layout"):
        mod.set_rank_layout("radix")
    assert mod.rank_layout(100) == "small"
