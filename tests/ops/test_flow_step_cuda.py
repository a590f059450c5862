"""The ``cuda`` backend: CUB row argsorts with 32-bit indices feeding the scattered transport, and the shared-memory
histogram passes (``csrc/cuda/flow.cu`` through :mod:`fastdpot._cuda_prims`).

Two halves:

* any machine (CPU under ``TRITON_INTERPRET=1``, or CUDA): the step's ``cuda`` code path run with the torch primitive
  set :data:`fastdpot._cuda_prims.TORCH` gives the ``triton`` backend's results, and the torch primitives keep their
  contracts -- so the orchestration (sort in place with int32 indices, transport into a separate buffer; projections stored
  once, counted, transported in place) is tested where CI runs;
* CUDA with ``fastdpot._C_cuda_flow`` built (``scripts/gpu_check.sh``): the CUB primitives equal the torch ones, and
  ``backend="cuda"`` matches the float64 replay and the ``triton`` backend.
"""
import os

import pytest
import torch

from fastdpot._cuda_prims import CUB, TORCH, cuda_status
from fastdpot._ext import BackendUnavailableError

triton = pytest.importorskip("triton")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
needs_kernels = pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(),
                                   reason="Triton kernels need CUDA or TRITON_INTERPRET=1")
needs_cub = pytest.mark.skipif(INTERPRET or not cuda_status()[0],
                               reason=f"needs CUDA and the built fastdpot._C_cuda_flow ({cuda_status()[1]})")
DEV = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"


def _inputs(n, m, d, k, dtype=torch.float32, seed=0, device=DEV):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(m, d, generator=g, dtype=torch.float64) * 0.6 + 0.3
    th = torch.randn(k, d, generator=g, dtype=torch.float64)
    th /= th.norm(dim=1, keepdim=True)
    return x.to(device, dtype), y.to(device, dtype), th.to(device, dtype)


# ---------------------------------------------------------------------------------------------------------------
# the torch primitive set: contracts
# ---------------------------------------------------------------------------------------------------------------
def test_torch_argsort_rows_is_a_stable_argsort():
    g = torch.Generator().manual_seed(1)
    keys = torch.randint(0, 5, (3, 50), generator=g).float()  # many ties: stability matters
    orig = keys.clone()
    idx = torch.empty(3, 50, dtype=torch.int32)
    TORCH.argsort_rows_(keys, idx)
    ref = torch.sort(orig, dim=1, stable=True)
    assert torch.equal(keys, ref.values) and torch.equal(idx.long(), ref.indices)


def test_torch_hist_passes_match_the_histogram_reference():
    from fastdpot.reference.flow import histogram_levels

    g = torch.Generator().manual_seed(2)
    s = torch.randn(4, 500, generator=g, dtype=torch.float64)
    lo, hi = s.amin(1), s.amax(1)
    width = (hi - lo) / 32
    hist = TORCH.hist_count(s, lo, width, 32)
    assert hist.dtype == torch.int32 and torch.equal(hist.sum(1), torch.full((4,), 500, dtype=torch.int32))
    cum = torch.cumsum(hist, 1, dtype=torch.int64) - hist
    q = torch.sort(torch.randn(4, 30, generator=g, dtype=torch.float64), dim=1).values
    out = TORCH.hist_coef_(s.clone(), lo, width, hist, cum, q)
    u = histogram_levels(s.t().contiguous(), 32).t()  # the reference's levels, (N, k) layout
    pos = u * 29
    j = pos.long().clamp(0, 29)
    f = pos - j
    t = q.gather(1, j) + f * (q.gather(1, (j + 1).clamp(max=29)) - q.gather(1, j))
    torch.testing.assert_close(out, s - t, rtol=1e-12, atol=1e-12)


def test_primitives_reject_bad_arguments():
    s = torch.randn(3, 40, dtype=torch.float64)
    lo, width = s.amin(1), (s.amax(1) - s.amin(1)) / 8
    hist = TORCH.hist_count(s, lo, width, 8)
    cum = torch.cumsum(hist, 1, dtype=torch.int64) - hist
    q = torch.randn(3, 5, dtype=torch.float64).sort(1).values
    with pytest.raises(ValueError, match="cum"):
        TORCH.hist_coef_(s.clone(), lo, width, hist, cum.int(), q)  # int32 cumulative counts
    with pytest.raises(ValueError, match="q must"):
        TORCH.hist_coef_(s.clone(), lo, width, hist, cum, q.float())
    with pytest.raises(ValueError, match="lo"):
        TORCH.hist_count(s, lo.float(), width, 8)
    with pytest.raises(ValueError, match="keys"):
        TORCH.argsort_rows_(s, torch.empty(3, 40, dtype=torch.int32))  # float64 keys: not a radix-sort key type


# ---------------------------------------------------------------------------------------------------------------
# the step's cuda code path with the torch primitives == the triton backend
# ---------------------------------------------------------------------------------------------------------------
@needs_kernels
@pytest.mark.parametrize("n,m", [(60, 60), (70, 23)])
def test_dpswd_cuda_path_with_torch_prims_equals_triton(n, m):
    from fastdpot.kernels.dpswd import sliced_wasserstein_cuda, sliced_wasserstein_triton

    x, y, th = _inputs(n, m, 4, 6)
    out = []
    for fn, extra in ((sliced_wasserstein_triton, {}), (sliced_wasserstein_cuda, dict(prims=TORCH))):
        xx, yy = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
        loss = fn(xx, yy, th, 2, 0.1, 7, False, **extra)
        out.append((loss.detach(), *torch.autograd.grad(loss, (xx, yy))))
    for a, b in zip(*out):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_seed_arguments_do_not_recompile_the_kernels():
    """A flow draws a fresh 62-bit seed per step: a kernel that specialised on it (Triton specialises integer
    arguments on divisibility by 16) would compile again whenever a seed falls in the other residue class -- seconds
    of JIT compilation in the middle of a run."""
    from fastdpot.kernels import dpswd, drift, histogram, projection_noise, quantile

    def launchable(obj):  # a compiled kernel (JITFunction), or its TRITON_INTERPRET=1 stand-in
        if hasattr(obj, "params"):
            return [p.name for p in obj.params], [p.name for p in obj.params if p.do_not_specialize]
        if hasattr(obj, "arg_names") and hasattr(obj, "kwargs"):
            return list(obj.arg_names), list(obj.kwargs.get("do_not_specialize") or [])
        return None

    seen = 0
    for mod in (dpswd, drift, histogram, projection_noise, quantile):
        for name, obj in vars(mod).items():
            info = launchable(obj) if name.startswith("_") and name.endswith("_kernel") else None
            if info is None:
                continue
            seeds = [a for a in info[0] if "seed" in a]
            seen += bool(seeds)
            assert set(seeds) <= set(info[1]), name
    assert seen >= 5


def test_cuda_backend_unavailable_is_a_clear_error():
    from fastdpot._dispatch import available_backends
    from fastdpot.ops import flow_step

    ok, reason = available_backends("flow_step")["cuda"]
    if ok:
        pytest.skip("the cuda backend is available here")
    assert reason
    x, y, th = _inputs(10, 5, 3, 4, device="cpu")
    with pytest.raises(BackendUnavailableError, match="cuda"):
        flow_step(x, y, th, noise_std=0.1, step_size=0.1, backend="cuda")


# ---------------------------------------------------------------------------------------------------------------
# CUDA: the CUB primitives and the backend
# ---------------------------------------------------------------------------------------------------------------
@needs_cub
@pytest.mark.cuda
@pytest.mark.parametrize("rows,n,per_row", [(5, 3001, True), (5, 3001, False), (3, 200_000, True), (64, 777, False),
                                            (1, 1, True), (2, 2 ** 20 + 3, None)])
def test_cub_argsort_rows_equals_torch(rows, n, per_row):
    g = torch.Generator(device="cuda").manual_seed(rows * n)
    keys = torch.randn(rows, n, device="cuda", generator=g)
    if n > 7:
        keys[:, ::7] = keys[:, 3:4]  # ties (stable order must be kept)
    a_k, a_v = keys.clone(), torch.empty(rows, n, dtype=torch.int32, device="cuda")
    b_k, b_v = keys.clone(), torch.empty_like(a_v)
    CUB.argsort_rows_(a_k, a_v, per_row=per_row)
    TORCH.argsort_rows_(b_k, b_v)
    assert torch.equal(a_k, b_k) and torch.equal(a_v, b_v)


@needs_cub
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bins,m", [(1024, 250), (37, 1), (6144, 20000)])
def test_cub_hist_passes_equal_torch(dtype, bins, m):
    g = torch.Generator(device="cuda").manual_seed(bins)
    s = torch.randn(6, 100_003, device="cuda", generator=g, dtype=dtype)
    lo, hi = s.amin(1), s.amax(1)
    width = (hi - lo) / bins
    h_cub, h_ref = CUB.hist_count(s, lo, width, bins), TORCH.hist_count(s, lo, width, bins)
    assert torch.equal(h_cub, h_ref)
    cum = torch.cumsum(h_ref, 1, dtype=torch.int64) - h_ref
    q = torch.sort(torch.randn(6, m, device="cuda", generator=g, dtype=dtype), dim=1).values
    a = CUB.hist_coef_(s.clone(), lo, width, h_ref, cum, q)
    b = TORCH.hist_coef_(s.clone(), lo, width, h_ref, cum, q)
    # rounding: the level u carries a few ulps (the kernel contracts a * b + c into one FMA, torch does not), the
    # position u (M - 1) then M - 1 times that, which moves the target by up to that times the widest gap of q
    eps = torch.finfo(dtype).eps
    gap = q.diff(dim=1).abs().max().item() if m > 1 else 0.0
    scale = s.abs().max().item() + q.abs().max().item()
    torch.testing.assert_close(a, b, rtol=0, atol=16 * eps * ((m - 1) * gap + scale))


def _sizes(quantiles, nq):
    return dict(num_quantiles=None, histogram_bins=nq) if quantiles == "histogram" else \
        dict(num_quantiles=nq, histogram_bins=None)


def _replay(x, y, th, noise, quantiles, nq, diffusion):
    from fastdpot.reference.flow import flow_step

    nz = {k: (v.double() if v is not None else None) for k, v in noise.items()}
    args = (x.double(), y.double(), th.double(), nz["particles"], nz["private"], 0.8)
    return flow_step(*args, diffusion=diffusion, brownian=nz["brownian"], quantiles=quantiles,
                     **_sizes(quantiles, nq))


@needs_cub
@pytest.mark.cuda
@pytest.mark.parametrize("quantiles,nq", [("exact", None), ("grid", 100), ("histogram", 256)])
@pytest.mark.parametrize("n,d,k", [(4096, 48, 64), (3001, 8, 37), (2 ** 20 + 5, 8, 20)])
def test_cuda_backend_matches_replay_and_triton(quantiles, nq, n, d, k):
    from fastdpot.ops import flow_step

    torch.backends.cuda.matmul.allow_tf32 = False
    x, y, th = _inputs(n, 250, d, k, device="cuda")
    kw = dict(noise_std=0.4, step_size=0.8, diffusion=0.1, seed=77, quantiles=quantiles, return_noise=True,
              **_sizes(quantiles, nq))
    new, drift, noise = flow_step(x, y, th, backend="cuda", **kw)
    t_new, t_drift, t_noise = flow_step(x, y, th, backend="triton", **kw)
    assert torch.equal(noise["particles"], t_noise["particles"])
    rnew, rdrift = _replay(x, y, th, noise, quantiles, nq, 0.1)
    scale = rdrift.abs().max().item()
    if quantiles != "histogram":
        # same sorted values and targets as the triton backend: equal up to the drift's summation
        torch.testing.assert_close(drift, t_drift, rtol=1e-5, atol=1e-6 * scale)
        bound = 4 * (t_drift.double() - rdrift).abs().max().item() + 1e-5 * scale
    else:  # a float32 bin flip moves a level by 1/N (tests/test_gpu.py's bound)
        bound = 2e-3 * scale + 5.0 / n
    assert (drift.double() - rdrift).abs().max().item() <= bound
    assert (new.double() - rnew).abs().max().item() <= 0.8 * bound + 1e-5 * rnew.abs().max().item()


@needs_cub
@pytest.mark.cuda
@pytest.mark.parametrize("n,m", [(4096, 4096), (5000, 1234)])
def test_cuda_backend_dpswd_equals_triton(n, m):
    from fastdpot.kernels.dpswd import sliced_wasserstein_cuda, sliced_wasserstein_triton

    x, y, th = _inputs(n, m, 48, 64, device="cuda")
    out = []
    for fn in (sliced_wasserstein_triton, sliced_wasserstein_cuda):
        xx, yy = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
        loss = fn(xx, yy, th, 2, 0.3, 5, False)
        out.append((loss.detach(), *torch.autograd.grad(loss, (xx, yy))))
    (la, gxa, gya), (lb, gxb, gyb) = out
    assert abs(la.item() - lb.item()) <= 1e-6 * abs(la.item())
    for a, b in ((gxa, gxb), (gya, gyb)):  # the S side's atomic adds reorder float sums
        assert (a - b).norm().item() <= 1e-5 * a.norm().item()


@needs_cub
@pytest.mark.cuda
def test_dispatch_auto_prefers_cuda_where_built():
    import fastdpot  # noqa: F401
    from fastdpot._dispatch import dispatch

    assert dispatch("flow_step", "auto", "cuda", 10 ** 6)[0] == "cuda"
    assert dispatch("sliced_wasserstein", "auto", "cuda", 10 ** 6)[0] == "cuda"
