"""Triton flow-step kernels vs the torch references (CPU under TRITON_INTERPRET=1; tiny shapes, the interpreter is
slow). Covers the in-kernel Philox noise (distribution, replay, chunk invariance), the fused projection, the exact /
grid / histogram transports, the drift and the Euler--Maruyama update, and the histogram error bound."""
import math
import os

import pytest
import torch

triton = pytest.importorskip("triton")

from fastdpot._dispatch import dispatch  # noqa: E402
from fastdpot._ext import BackendUnavailableError  # noqa: E402
from fastdpot.reference.flow import flow_step as ref_flow_step  # noqa: E402
from fastdpot.reference.flow import histogram_levels  # noqa: E402

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1" and not torch.cuda.is_available(),
                       reason="Triton kernels need CUDA or TRITON_INTERPRET=1"),
]

import triton.language as tl  # noqa: E402

from fastdpot.kernels._common import direction_chunk, normal_from_uints, stream_seed  # noqa: E402
from fastdpot.kernels.flow_step import flow_step_triton  # noqa: E402
from fastdpot.kernels.projection_noise import project_noise  # noqa: E402


@triton.jit
def _normals_kernel(a_ptr, b_ptr, c_ptr, o_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    z = normal_from_uints(tl.load(a_ptr + offs), tl.load(b_ptr + offs), tl.load(c_ptr + offs))
    tl.store(o_ptr + offs, z)


DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1" else "cpu"


def _inputs(n, m, d, k, dtype, seed=0, shift=0.3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, dtype=torch.float64, generator=g)
    y = torch.randn(m, d, dtype=torch.float64, generator=g) * 0.7 + shift
    th = torch.randn(k, d, dtype=torch.float64, generator=g)
    th = th / th.norm(dim=1, keepdim=True)
    return tuple(t.to(dtype=dtype, device=DEV) for t in (x, y, th))


def _sizes(quantiles, size):
    """The grid's Q or the histogram's bins (one positional ``size`` in these tests)."""
    if quantiles == "histogram":
        return dict(num_quantiles=None, histogram_bins=size)
    return dict(num_quantiles=size, histogram_bins=None)


def _run(x, y, th, quantiles="exact", size=None, noise_std=0.3, step_size=0.7, diffusion=0.05, seed=123):
    return flow_step_triton(x, y, th, noise_std=noise_std, step_size=step_size, diffusion=diffusion, seed=seed,
                            quantiles=quantiles, return_noise=True, **_sizes(quantiles, size))


def _replay(x, y, th, noise, quantiles, size, step_size=0.7, diffusion=0.05):
    return ref_flow_step(x, y, th, noise["particles"], noise["private"], step_size, diffusion=diffusion,
                         brownian=noise["brownian"], quantiles=quantiles, **_sizes(quantiles, size))


# ---------------------------------------------------------------------------------------------------- noise
def test_noise_distribution_and_replay():
    n, k = 256, 16
    x = torch.zeros(n, 4, device=DEV)
    th = torch.randn(k, 4, device=DEV)
    noise = torch.zeros(n, k, device=DEV)
    out = project_noise(x, th, 0, k, 2024, 1.0, noise_out=noise)
    torch.testing.assert_close(out.T, noise, rtol=0, atol=0)  # x = 0: the output is the noise alone
    z = noise.double().flatten().cpu()
    assert abs(float(z.mean())) < 4.0 / math.sqrt(z.numel())
    assert abs(float(z.var()) - 1.0) < 6.0 * math.sqrt(2.0 / z.numel())
    from scipy import stats

    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-3
    again = project_noise(x, th, 0, k, 2024, 1.0)
    assert torch.equal(again, out)  # same seed, same draws
    other = project_noise(x, th, 0, k, 2025, 1.0)
    assert not torch.equal(other, out)
    # the counter is (row, global direction): a chunk j0.. reproduces the same entries
    part = project_noise(x, th, 5, 7, 2024, 1.0)
    assert torch.equal(part, out[5:12])


@pytest.mark.parametrize("k", [16, 13])
def test_fast_noise_distribution_and_chunk_independence(k):
    """The particles' cheap normals (randn_fast, four per Philox call): N(0, 1), replayable, the same whatever the
    chunk (aligned tiles and the per-entry path of an unaligned j0 give identical values), and not the wide
    stream's values."""
    n = 300
    x = torch.zeros(n, 4, device=DEV)
    th = torch.randn(k, 4, device=DEV)
    noise = torch.zeros(n, k, device=DEV)
    out = project_noise(x, th, 0, k, 77, 1.0, noise_out=noise, fast_noise=True)
    torch.testing.assert_close(out.T, noise, rtol=0, atol=0)
    z = noise.double().flatten().cpu()
    assert abs(float(z.mean())) < 4.0 / math.sqrt(z.numel())
    assert abs(float(z.var()) - 1.0) < 6.0 * math.sqrt(2.0 / z.numel())
    from scipy import stats

    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-3
    # lanes are not copies of each other (each of the four Box--Muller outputs is used once)
    cols = noise[:, : k - k % 4].reshape(n, -1, 4)
    for a in range(4):
        for b in range(a):
            assert not bool((cols[..., a] == cols[..., b]).any())
    for j0, kc in ((4, 8), (5, 7), (1, 3)):  # aligned and unaligned chunk starts
        part = project_noise(x, th, j0, kc, 77, 1.0, fast_noise=True)
        assert torch.equal(part, out[j0:j0 + kc])
    assert not torch.equal(project_noise(x, th, 0, k, 77, 1.0), out)


def test_normal_sampler_tail_support():
    """randn_wide's Box--Muller radius uses a 64-bit uniform: the extreme draw is sqrt(130 ln 2) = 9.49 sigma (not
    tl.randn's 5.68 clamp, which truncates the Gaussian mechanism's noise), and no extreme input gives NaN/inf."""
    a = torch.tensor([0, 0, -1, 1 << 20], dtype=torch.int32, device=DEV)  # uint32 bit patterns
    b = torch.tensor([0, -1, -1, 0], dtype=torch.int32, device=DEV)
    c = torch.tensor([0, -(1 << 31), 0, 0], dtype=torch.int32, device=DEV)  # angle 0 / pi
    out = torch.empty(4, dtype=torch.float32, device=DEV)
    _normals_kernel[(1,)](a, b, c, out, BLOCK=4)
    r_max = math.sqrt(130 * math.log(2))
    assert torch.isfinite(out).all()
    assert abs(out[0].item() - r_max) < 1e-4 * r_max
    assert abs(out[1].item() + math.sqrt(-2 * math.log((0.5 + (2 ** 32 - 1)) * 2.0 ** -64))) < 1e-3
    assert out[2].item() == 0.0
    assert abs(out[3].item() - math.sqrt(-2 * math.log(2.0 ** -12))) < 1e-4


def test_stream_seeds_distinct():
    seeds = {stream_seed(s, t) for s in (0, 1, 2 ** 62 - 1) for t in range(3)}
    assert len(seeds) == 9 and all(0 <= s < 2 ** 62 for s in seeds)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_projection_matches_matmul(dtype):
    x, _, th = _inputs(77, 3, 7, 13, dtype)
    out = project_noise(x, th, 2, 9, 1, 0.0)
    ref = (x.double() @ th[2:11].double().T).T
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------- flow step
def test_histogram_unfused_path_matches(monkeypatch):
    """d > FUSED_MAX_D takes the chunked histogram path (coefficient buffer + drift kernel): same results."""
    from fastdpot.kernels import histogram

    x, y, th = _inputs(90, 30, 6, 13, torch.float64, seed=21)
    fused = _run(x, y, th, "histogram", 24)
    monkeypatch.setattr(histogram, "FUSED_MAX_D", 0)
    monkeypatch.setenv("FASTDPOT_TRITON_CHUNK_ELEMS", str(90 * 5))  # chunks of 5 directions
    chunked = _run(x, y, th, "histogram", 24)
    for a, b in zip(fused[:2], chunked[:2]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    for key in ("particles", "private", "brownian"):
        assert torch.equal(fused[2][key], chunked[2][key])


def test_chunking_over_directions_is_invisible(monkeypatch):
    x, y, th = _inputs(64, 21, 5, 11, torch.float64, seed=5)
    full = _run(x, y, th)
    monkeypatch.setenv("FASTDPOT_TRITON_CHUNK_ELEMS", str(64 * 4))  # kc = 4: chunks 4, 4, 3
    assert direction_chunk(64, 11) == 4
    chunked = _run(x, y, th)
    for a, b in zip(full[:2], chunked[:2]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    assert torch.equal(full[2]["particles"], chunked[2]["particles"])


def test_non_contiguous_inputs():
    x, y, th = _inputs(45, 17, 6, 9, torch.float64, seed=15)
    xt, yt, tht = (t.t().contiguous().t() for t in (x, y, th))  # column-major views
    assert not xt.is_contiguous()
    a = _run(x, y, th, "exact")
    b = _run(xt, yt, tht[::1], "exact")
    for u, v in zip(a[:2], b[:2]):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-13)


def test_no_noise_no_brownian_and_seed_replay():
    x, y, th = _inputs(50, 20, 4, 8, torch.float64, seed=7)
    new, drift, noise = _run(x, y, th, noise_std=0.0, diffusion=0.0)
    assert noise["brownian"] is None
    assert torch.count_nonzero(noise["particles"]) == 0 and torch.count_nonzero(noise["private"]) == 0
    rnew, rdrift = ref_flow_step(x, y, th, None, None, 0.7)
    torch.testing.assert_close(new, rnew, rtol=1e-10, atol=1e-12)
    a = _run(x, y, th, seed=9)
    b = _run(x, y, th, seed=9)
    c = _run(x, y, th, seed=10)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_dispatch_and_public_flow_step():
    x, y, th = _inputs(40, 16, 3, 5, torch.float64, seed=11)
    name, fn = dispatch("flow_step", "triton", DEV)
    assert name == "triton"
    a = fn(x, y, th, noise_std=0.2, step_size=0.5, diffusion=0.0, seed=4, quantiles="exact", num_quantiles=None,
           histogram_bins=None, return_noise=False)
    b = flow_step_triton(x, y, th, noise_std=0.2, step_size=0.5, diffusion=0.0, seed=4, quantiles="exact",
                         num_quantiles=None, histogram_bins=None, return_noise=False)
    assert torch.equal(a[0], b[0])  # the lazily imported launcher is kernels/flow_step.py's
    from fastdpot.ops import flow_step

    new, drift, noise = flow_step(x, y, th, noise_std=0.2, step_size=0.5, seed=4, return_noise=True,
                                  backend="triton")
    rnew, _ = ref_flow_step(x, y, th, noise["particles"], noise["private"], 0.5)
    torch.testing.assert_close(new, rnew, rtol=1e-10, atol=1e-12)


def test_bad_input(monkeypatch):
    x, y, th = _inputs(20, 8, 3, 4, torch.float64)
    with pytest.raises(ValueError, match="quantiles"):
        _run(x, y, th, quantiles="median")
    with pytest.raises(ValueError, match="dtype"):
        _run(x.half(), y.half(), th.half())
    with pytest.raises(ValueError, match="N >= 2"):
        _run(x[:1], y, th)
    if DEV == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET"):
            _run(x, y, th)


# ------------------------------------------------------------------------------------------ histogram mode
def test_histogram_levels_bounded_by_bin_count():
    """|u_hist - r/(N-1)| <= (n_b + 1)/N for every entry (documented bound), and u spans [0, 1]."""
    g = torch.Generator().manual_seed(1)
    xp = torch.randn(300, 6, dtype=torch.float64, generator=g)
    for bins in (1, 7, 64):
        u = histogram_levels(xp, bins)
        ranks = torch.argsort(torch.argsort(xp, dim=0), dim=0).double()
        exact = ranks / (xp.shape[0] - 1)
        lo, hi = xp.amin(0), xp.amax(0)
        b = ((xp - lo) / ((hi - lo) / bins)).clamp(0, bins).long().clamp(max=bins - 1)
        counts = torch.stack([torch.bincount(b[:, j], minlength=bins) for j in range(6)], 1)
        nb = counts.gather(0, b).double()
        assert bool(((u - exact).abs() <= (nb + 1) / 300 + 1e-12).all())
        torch.testing.assert_close(u.amin(0), torch.zeros(6, dtype=torch.float64))
        torch.testing.assert_close(u.amax(0), torch.ones(6, dtype=torch.float64))


def test_histogram_mode_error_against_exact():
    """Triton histogram drift vs exact drift on the same draws: within the bin-count bound, and shrinking
    with more bins."""
    x, y, th = _inputs(256, 64, 6, 8, torch.float64, seed=13)
    errs = {}
    for bins in (4, 64):
        _, drift_h, noise = _run(x, y, th, "histogram", bins, diffusion=0.0)
        _, drift_e = ref_flow_step(x, y, th, noise["particles"], noise["private"], 0.7)
        # bound: per direction the target moves at most over the private quantiles of levels u_exact +- e
        xp = x @ th.T + noise["particles"]
        yp = torch.sort(y @ th.T + noise["private"], dim=0).values
        n = xp.shape[0]
        lo, hi = xp.amin(0), xp.amax(0)
        b = ((xp - lo) / ((hi - lo) / bins)).clamp(0, bins).long().clamp(max=bins - 1)
        counts = torch.stack([torch.bincount(b[:, j], minlength=bins) for j in range(th.shape[0])], 1)
        e = (counts.gather(0, b).double() + 1) / n
        ranks = torch.argsort(torch.argsort(xp, dim=0), dim=0).double() / (n - 1)
        from fastdpot.reference.flow import target_at

        spread = target_at(yp, (ranks + e).clamp(max=1)) - target_at(yp, (ranks - e).clamp(min=0))
        bound = (spread.abs() @ th.abs()) / th.shape[0]
        assert bool(((drift_h - drift_e).abs() <= bound + 1e-12).all())
        errs[bins] = (drift_h - drift_e).pow(2).mean().sqrt().item()
    assert errs[64] < errs[4]


def test_import_without_triton_registers_actionable_stubs():
    """`import fastdpot` works when triton cannot be imported; asking for the backend names the fix."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['triton'] = None\n"  # makes `import triton` raise ImportError
        "import fastdpot\n"
        "from fastdpot._dispatch import available_backends, dispatch\n"
        "from fastdpot._ext import BackendUnavailableError\n"
        "for op in ('flow_step', 'sliced_wasserstein'):\n"
        "    ok, reason = available_backends(op)['triton']\n"
        "    assert not ok and 'pip install triton' in reason, reason\n"
        "    try:\n"
        "        dispatch(op, 'triton')\n"
        "    except BackendUnavailableError as err:\n"
        "        assert 'pip install triton' in str(err)\n"
        "    else:\n"
        "        raise AssertionError('no error')\n"
        "    assert dispatch(op, 'auto', 'cuda')[0] != 'triton'\n"
        "print('OK')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]
