"""Op ``flow_step``: every backend against the reference, in one parametrised test (noise replayed), the sharded step
against the one-process step, and the keyed draws against the C++ kernels' Philox streams.

Tolerances follow the arithmetic: float64 backends agree with the float64 reference to rounding (1e-10); float32
backends to a few float32 ulps of the projected values, scaled by the inputs (the sort of nearly equal float32
projections may swap two neighbours, which moves their targets by one quantile spacing: atol covers that at these
sizes). The grid mode interpolates its levels in float64 in the kernels and in the tensor's dtype in the reference.
"""
import os
import threading

import numpy as np
import pytest
import torch

import fastdpot.ops.flow as F
from fastdpot._ext import BackendUnavailableError, cpp_status, load_cpp
from fastdpot.reference import flow as R
from fastdpot.reference.philox import keyed_normals

HAVE_CPU = cpp_status("flow")[0] and cpp_status("flow_histogram")[0]
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
HAVE_TRITON = pytest.importorskip("triton") is not None and (INTERPRET or torch.cuda.is_available())

# (n, m, d, k, quantiles, size, diffusion, sketch): small shapes (the Triton interpreter is slow), odd sizes
CASES = [
    (50, 13, 3, 7, "exact", None, 0.0, False),
    (61, 250, 5, 4, "exact", None, 0.1, False),
    (57, 31, 5, 9, "grid", 37, 0.0, False),
    (40, 20, 5, 9, "grid", None, 0.3, False),   # Q defaults to N
    (70, 23, 3, 4, "histogram", 6, 0.05, False),
    (90, 40, 20, 9, "histogram", 33, 0.0, False),
    (2, 1, 1, 1, "exact", None, 0.0, False),
    (48, 0, 4, 5, "exact", None, 0.1, True),     # a quantile table as the target (sketch mode)
    (48, 0, 4, 5, "grid", 16, 0.0, True),
    (70, 0, 3, 4, "histogram", 8, 0.05, True),
]
BACKENDS = ["reference", "cpu", "triton", "cuda-torch-prims"]


def _inputs(case, dtype, seed=3):
    n, m, d, k, quantiles, size, diffusion, sketch = case
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(m, d, generator=g, dtype=torch.float64) * 0.7 + 0.5
    th = torch.randn(k, d, generator=g, dtype=torch.float64)
    th = th / th.norm(dim=1, keepdim=True)
    kw = dict(quantiles=quantiles, diffusion=diffusion, step_size=0.5)
    kw.update(num_quantiles=size) if quantiles == "grid" else kw.update(histogram_bins=size)
    target = dict(private=y.to(dtype))
    if sketch:
        table = torch.sort(torch.randn(k, 5, generator=g, dtype=torch.float64), dim=1).values
        levels = torch.tensor([0.05, 0.3, 0.5, 0.71, 0.9], dtype=torch.float64)
        target = dict(private=None, sketch=(table, levels))
    return x.to(dtype), th.to(dtype), target, kw


def _launcher(backend):
    if backend in ("reference", "cpu"):
        return lambda *a, **kw: F.flow_step(*a, backend=backend, **kw)
    from fastdpot.kernels.flow_step import flow_step_cuda, flow_step_triton

    if backend == "triton":
        return lambda x, private, th, **kw: flow_step_triton(x, private, th, **_op_kw(kw))
    from fastdpot._cuda_prims import TORCH

    return lambda x, private, th, **kw: flow_step_cuda(x, private, th, prims=TORCH, **_op_kw(kw))


def _op_kw(kw):
    out = dict(num_quantiles=None, histogram_bins=None, diffusion=0.0, sketch=None)
    out.update(kw)
    return out


def _skip_unsupported(backend, case):
    quantiles, sketch = case[4], case[7]
    if backend == "cpu" and not HAVE_CPU:
        pytest.skip("the C++ extension is not built")
    if backend in ("triton", "cuda-torch-prims"):
        if not HAVE_TRITON or not INTERPRET:
            pytest.skip("Triton kernels are checked here under TRITON_INTERPRET=1 (GPU: tests/ops/test_gpu.py)")
        if sketch and quantiles != "exact":
            pytest.skip("the GPU rows take a sketch in exact mode only")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_equals_reference_with_replayed_noise(backend, case, dtype):
    _skip_unsupported(backend, case)
    x, th, target, kw = _inputs(case, dtype)
    new, drift, noise = _launcher(backend)(x, target.pop("private"), th, noise_std=0.3, seed=123, return_noise=True,
                                           **target, **kw)
    assert new.dtype == dtype and drift.dtype == dtype and new.shape == x.shape
    y = None if "sketch" in target else _inputs(case, dtype)[2]["private"]
    rn, rd = R.flow_step(x, y, th, noise["particles"], noise["private"], brownian=noise["brownian"], **target, **kw)
    if dtype == torch.float64:
        tol = dict(rtol=1e-10, atol=1e-11)
    else:  # a few float32 ulps of |s| ~ 3; the grid's levels are float32 in the reference
        tol = dict(rtol=2e-3, atol=5e-5) if case[4] == "grid" else dict(rtol=2e-4, atol=3e-5)
    torch.testing.assert_close(drift, rd, **tol)
    torch.testing.assert_close(new, rn, **tol)


# ---------------------------------------------------------------------------------------------------- shards
class _Group:
    """An in-process collective over threads: what torch.distributed does between ranks."""

    def __init__(self, world):
        self.world, self.barrier, self.slots = world, threading.Barrier(world), {}

    def _exchange(self, rank, t):
        self.slots[rank] = t.clone()
        self.barrier.wait()
        got = [self.slots[r] for r in range(self.world)]
        self.barrier.wait()
        return got

    def all_reduce(self, rank, t, op):
        got = torch.stack(self._exchange(rank, t))
        t.copy_(got.sum(0) if op == "sum" else got.amax(0))

    def all_gather(self, rank, t):
        return torch.cat(self._exchange(rank, t))


def _sharded(backend, x, bounds, **kw):
    group, out, errors = _Group(len(bounds) - 1), {}, []

    def rank(r):
        try:
            a, b = bounds[r], bounds[r + 1]
            shard = F.Shard(a, x.shape[0], lambda t, op: group.all_reduce(r, t, op),
                            lambda t: group.all_gather(r, t))
            out[r] = F.flow_step(x[a:b], shard=shard, backend=backend, **kw)[0]
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(bounds) - 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    if errors:
        raise errors[0]
    return torch.cat([out[r] for r in range(len(bounds) - 1)])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("quantiles,size", [("histogram", dict(histogram_bins=6)), ("exact", {})])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_sharded_step_equals_the_one_process_step(backend, quantiles, size, dtype):
    # the draws are keyed by global particle index and the levels are global (two all-reduces, or the all-gathered
    # projections): three ranks of 20 + 31 + 19 particles move exactly as one process moves all 70
    if backend == "cpu" and not HAVE_CPU:
        pytest.skip("the C++ extension is not built")
    x, th, target, kw = _inputs((70, 0, 3, 4, quantiles, None, 0.05, True), dtype)
    kw.update(size)
    args = dict(projections=th, noise_std=0.3, seed=2 ** 62 + 7, sketch=target["sketch"], private=None, **kw)
    one = F.flow_step(x, backend=backend, **args)[0]
    three = _sharded(backend, x, [0, 20, 51, 70], **args)
    if backend == "reference":
        tol = dict(rtol=0, atol=0) if dtype == torch.float64 else dict(rtol=1e-6, atol=1e-6)
    else:  # a sharded exact step runs the reference's code; one process, the C++ step's float32 Box-Muller (~1e-6σ)
        tol = dict(rtol=0, atol=2e-6) if quantiles == "exact" else \
            dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(three, one, **tol)


def test_a_shard_is_refused_where_it_cannot_be_honoured():
    x, th, target, kw = _inputs((20, 0, 3, 4, "grid", None, 0.0, True), torch.float64)
    solo = F.Shard(0, 20, lambda t, op: None)
    with pytest.raises(ValueError, match="all_gather"):
        F.flow_step(x, None, th, noise_std=0.1, sketch=target["sketch"], shard=solo, **kw)
    with pytest.raises(ValueError, match="exceed"):
        F.flow_step(x, None, th, noise_std=0.1, sketch=target["sketch"], shard=F.Shard(5, 20, lambda t, op: None),
                    quantiles="histogram", histogram_bins=4, step_size=0.5)
    with pytest.raises(BackendUnavailableError, match="shard"):
        F.flow_step(x, None, th, noise_std=0.1, sketch=target["sketch"], shard=solo, backend="triton",
                    quantiles="histogram", histogram_bins=4, step_size=0.5)


def test_a_flow_asks_the_dispatch_table_what_a_row_supports():
    # the rows declare their features; require() is the call's own check, made before any call (a flow's __init__)
    from fastdpot._dispatch import MissingFeatureError, require

    needs = F.step_needs(quantiles="histogram", table=True, shard=True, histogram_bins=8, step_size=0.5)
    assert needs == ("shard", "sketch:histogram") and F.step_needs(quantiles="exact", table=True) == ()
    for backend in ("auto", "reference", "cpu", "keops"):  # keops: not a row of flow_step, refused by dispatch
        require("flow_step", backend, needs)
    with pytest.raises(MissingFeatureError, match=r"takes no shard.*quantiles='histogram'.*\['cpu', 'reference'\]") as err:
        require("flow_step", "triton", needs)
    assert isinstance(err.value, ValueError) and isinstance(err.value, BackendUnavailableError)
    x, th, target, kw = _inputs((20, 0, 3, 4, "histogram", 4, 0.0, True), torch.float64)
    with pytest.raises(MissingFeatureError) as call:
        F.flow_step(x, None, th, noise_std=0.1, sketch=target["sketch"], shard=F.Shard(0, 20, lambda t, op: None),
                    backend="triton", **kw)
    assert str(call.value) == str(err.value)  # one check, one message


def test_fastdpot_ops_flow_step_is_the_op():
    # the docs name the op ``fastdpot.ops.flow_step``: it is the function (its module is fastdpot.ops.flow)
    import fastdpot

    assert callable(fastdpot.ops.flow_step) and fastdpot.ops.flow_step is F.flow_step
    assert fastdpot.ops.Shard is F.Shard and fastdpot.ops.QUANTILE_MODES == ("exact", "grid", "histogram")
    x, th, target, kw = _inputs(CASES[0], torch.float64)
    new, drift, _ = fastdpot.ops.flow_step(x, target["private"], th, noise_std=0.2, seed=5, backend="reference", **kw)
    want, _, _ = F.flow_step(x, target["private"], th, noise_std=0.2, seed=5, backend="reference", **kw)
    assert new.shape == x.shape and torch.equal(new, want)


# ---------------------------------------------------------------------------------------------------- draws
@pytest.mark.skipif(not HAVE_CPU, reason="the C++ extension is not built")
@pytest.mark.parametrize("per_block", [2, 4])
@pytest.mark.parametrize("key,stream,offset", [(0, 0, 0), (2 ** 61 + 5, 9, 3), (123, 600, 1_000_001),
                                               (0x27CC77804893E441, 1, 7),
                                               (5, 2, 4 * (2 ** 32 - 3) + 1)])  # the counter's low word wraps
def test_keyed_normals_are_the_cpp_kernels_philox_normals(key, stream, offset, per_block):
    fast, ref = load_cpp("flow")._normals(key, stream, offset, 37, per_block == 4, True)
    got = keyed_normals(key, stream, offset, 37, per_block=per_block)
    torch.testing.assert_close(got, torch.from_numpy(ref), rtol=0, atol=1e-14)  # common.h, double precision
    torch.testing.assert_close(got, torch.from_numpy(fast), rtol=0, atol=1e-5)  # the vectorised float transform


def test_keyed_normals_use_every_bit_of_the_key():
    # a torch.Generator keeps 32 bits of a seed: these two keys, equal in their low 32 bits, drew the same noise
    a = keyed_normals(0x154274C84893E441, 1, 0, 64)
    b = keyed_normals(0x27CC77804893E441, 1, 0, 64)
    assert not torch.allclose(a, b)
    # and the reference backend's privacy noise follows the key
    x, th, target, kw = _inputs(CASES[0], torch.float64)
    draws = [F.flow_step(x, target["private"], th, noise_std=1.0, seed=s, return_noise=True, backend="reference",
                         **kw)[2]["private"] for s in (0x154274C84893E441, 0x27CC77804893E441)]
    assert not torch.allclose(*draws)


def test_privacy_noise_reaches_the_wide_tail():
    # per_block=2: the radius uniform has 64 bits, so the smallest word gives |z| = sqrt(2 ln 2^65) = 9.49 (float32
    # torch.randn stops at 5.77σ; a 32-bit uniform at 6.76σ, the reach of per_block=4, for draws that protect nothing)
    from fastdpot.reference.philox import normals_from_words

    zero = np.zeros(1, dtype=np.uint64)
    assert float(normals_from_words(zero, zero, zero, zero, 2)[0, 0]) == pytest.approx(9.4926, abs=1e-4)
    assert float(normals_from_words(zero, zero, zero, zero, 4)[0, 0]) == pytest.approx(6.7637, abs=1e-4)
    z = keyed_normals(7, 3, 0, 400_000, per_block=2)
    assert abs(float(z.mean())) < 6e-3 and abs(float(z.std()) - 1.0) < 6e-3
    from scipy.stats import kstest

    assert kstest(z[:20_000].numpy(), "norm").pvalue > 1e-3
