"""The sketch release of the DP-SWD loss on every backend (issue 31): the fused C++ kernel and the Triton one (under
TRITON_INTERPRET=1, small shapes) against the torch reference with the replayed noise, float64 to rounding and
float32 within a multiple of torch's own float32 error; the bin-sum noise is the keyed privacy-grade normals of the
release's key (replayed exactly, independent of chunking); the gradient reaches the generated side only."""
import os

import pytest
import torch
from scipy import stats

from fastdpot import sliced as S
from fastdpot._ext import cpp_status
from fastdpot.ops import sliced_wasserstein as op
from fastdpot.reference.philox import keyed_normals
from fastdpot.reference.sliced import sketch_sliced_wasserstein as ref_sketch

HAS_CPP = cpp_status("sliced")[0]
needs_cpp = pytest.mark.skipif(not HAS_CPP, reason="C++ extension fastdpot._C_sliced not built")
TRITON = os.environ.get("TRITON_INTERPRET", "0") == "1" or torch.cuda.is_available()
needs_triton = [pytest.mark.triton, pytest.mark.skipif(not TRITON, reason="Triton needs CUDA or TRITON_INTERPRET=1")]
BACKENDS = [pytest.param("cpu", marks=needs_cpp), pytest.param("triton", marks=needs_triton)]
#: a clipping bound above every row's norm in these tests: the rows are not changed by it
NO_CLIP = 1e6
# compiled Triton takes CUDA tensors; under the interpreter (CI) CPU ones
TRITON_DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET", "0") == "1" or not torch.cuda.is_available() else "cuda"
# (M private rows, N generated rows, d, k, L): N != M, L = 1, L = min(M, N), odd sizes
SHAPES = [(30, 25, 4, 5, 4), (40, 40, 3, 7, 1), (17, 33, 5, 6, 17), (50, 20, 2, 3, 20), (64, 81, 6, 9, 7)]


def _data(m, n, d, k, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=g, dtype=torch.float64)
    y = torch.randn(n, d, generator=g, dtype=torch.float64) * 1.2 + 0.3
    th = S.random_projections(k, d, g, dtype=torch.float64)
    return x.to(dtype), y.to(dtype), th.to(dtype)


def _backend(name):
    return op._dispatch.dispatch(op.OP, name)[1]


def _on(backend, *tensors):
    """``tensors`` on the device the backend takes (leaves, gradients required where the input's were)."""
    dev = TRITON_DEVICE if backend == "triton" else "cpu"
    return [t.detach().to(dev).requires_grad_(t.requires_grad) for t in tensors]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("m,n,d,k,L", SHAPES)
def test_float64_matches_reference_with_replayed_noise(backend, p, m, n, d, k, L):
    x, y, th = _data(m, n, d, k, seed=m + k)
    y.requires_grad_(True)
    xd, yd, thd = _on(backend, x, y, th)
    loss, noise, none = _backend(backend)(xd, yd, thd, p, 0.7, 123 + L, True, sketch_bins=L)
    assert none is None and noise.dtype == torch.float64 and noise.shape == (k, L)
    # the noise is the release key's keyed normals j·L + l of stream 0, σ-scaled
    want = keyed_normals(123 + L, 0, 0, k * L, per_block=2).reshape(k, L) * 0.7
    torch.testing.assert_close(noise.cpu(), want, rtol=1e-15, atol=1e-15)
    up = torch.tensor(-1.7, dtype=torch.float64)  # an upstream gradient that is not one
    g = torch.autograd.grad(loss, yd, up.to(yd.device))[0].cpu()
    yr = y.detach().clone().requires_grad_(True)
    ref = ref_sketch(x, yr, th, L, p, want)
    gr = torch.autograd.grad(ref, yr, up)[0]
    torch.testing.assert_close(loss.detach().cpu(), ref.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g, gr, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_error_within_torch_float32_error(backend):
    m, n, d, k, L = 300, 257, 8, 12, 9
    x64, y64, th64 = _data(m, n, d, k, seed=5)
    noise = op.sketch_noise(k, L, 0.4, 77)
    y64g = y64.clone().requires_grad_(True)
    r64 = ref_sketch(x64, y64g, th64, L, 2, noise)
    g64 = torch.autograd.grad(r64, y64g)[0]
    x32, y32, th32 = x64.float(), y64.float().requires_grad_(True), th64.float()
    r32 = ref_sketch(x32, y32, th32, L, 2, noise)
    g32 = torch.autograd.grad(r32, y32)[0]
    x32k, y32k, th32k = _on(backend, x32, y64.float().requires_grad_(True), th32)
    loss = _backend(backend)(x32k, y32k, th32k, 2, 0.4, 77, False, sketch_bins=L)
    gk = torch.autograd.grad(loss, y32k)[0]
    loss, gk = loss.cpu(), gk.cpu()
    assert loss.dtype == torch.float32 and gk.dtype == torch.float32
    eps = torch.finfo(torch.float32).eps
    ref_err = abs(float(r32.detach()) - float(r64.detach()))
    assert abs(float(loss.detach()) - float(r64.detach())) <= 4 * ref_err + 8 * eps * abs(float(r64.detach()))
    torch_gerr = float((g32.double() - g64).abs().max())
    assert float((gk.double() - g64).abs().max()) <= 4 * torch_gerr + 8 * eps * float(g64.abs().max())


@needs_cpp
def test_cpu_chunking_and_the_public_path(monkeypatch):
    x, y, th = _data(211, 150, 6, 23, seed=3)
    y.requires_grad_(True)

    def run():
        out = S.dp_sliced_wasserstein(y, private=x, noise_std=0.3, clip_radius=NO_CLIP, projections=th,
                                      secure_mode=False, generator=torch.Generator().manual_seed(5), release="sketch",
                                      sketch_bins=6, return_noise=True)
        return out[0], out[1], torch.autograd.grad(out[0], y)[0]

    full = run()
    monkeypatch.setattr(op, "_CHUNK_BYTES", (211 + 150) * 8 * 3 * 4)  # chunks of 4 directions, not dividing k
    part = run()
    assert op._chunk_size(211, 150, 23, 8, 3) == 4
    assert abs(float(full[0]) - float(part[0])) <= 1e-13
    torch.testing.assert_close(full[1], part[1], rtol=0, atol=0)
    torch.testing.assert_close(full[2], part[2], rtol=1e-12, atol=1e-15)
    # backend "auto" is the fused kernel; the reference replays the same key (the generator's first draw here)
    ref = S.dp_sliced_wasserstein(y, private=x, noise_std=0.3, clip_radius=NO_CLIP, projections=th,
                                  secure_mode=False, backend="reference", generator=torch.Generator().manual_seed(5),
                                  release="sketch", sketch_bins=6, return_noise=True)
    torch.testing.assert_close(ref[1], full[1], rtol=0, atol=0)
    torch.testing.assert_close(ref[0], full[0], rtol=1e-12, atol=1e-14)


@needs_cpp
def test_noise_of_the_bin_sums_is_standard_normal_times_sigma():
    x, y, th = _data(40, 40, 3, 50, seed=9)
    _, noise, _ = _backend("cpu")(x, y, th, 2, 2.5, 2 ** 61 + 12345, True, sketch_bins=20)  # a key above 2^32
    z = (noise / 2.5).flatten().numpy()
    assert abs(z.mean()) < 4 / 1000 ** 0.5 and abs(z.std() - 1) < 0.1
    assert stats.kstest(z, "norm").pvalue > 1e-3
    _, other, _ = _backend("cpu")(x, y, th, 2, 2.5, 12345, True, sketch_bins=20)  # the high key bits matter
    assert not torch.equal(noise, other)


@needs_cpp
def test_gradient_reaches_the_generated_side_only_and_gradcheck():
    x, y, th = _data(12, 10, 3, 4, seed=22)
    y = (2.0 * y).requires_grad_(True)
    torch.autograd.gradcheck(lambda yy: _backend("cpu")(x, yy, th, 2, 0.3, 5, False, sketch_bins=3), (y,))
    xg = x.clone().requires_grad_(True)
    _backend("cpu")(xg, y, th, 2, 0.3, 5, False, sketch_bins=3).backward()
    assert y.grad is not None and xg.grad is None


@needs_cpp
def test_kernel_refuses_bad_buffers_and_bins():
    from fastdpot._ext import load_cpp

    mod = load_cpp("sliced")
    px, py = torch.randn(3, 10), torch.randn(3, 7)
    assert mod.sketch_chunk_f32(px.numpy(), py.numpy(), 2, 4, 0.0, 1, 0, 1.0, None, None).shape == (3,)
    with pytest.raises(ValueError, match="sketch_bins"):
        mod.sketch_chunk_f32(px.numpy(), py.numpy(), 2, 8, 0.0, 1, 0, 1.0, None, None)  # L > N
    with pytest.raises(ValueError, match="gy"):
        mod.sketch_chunk_f32(px.numpy(), py.numpy(), 2, 4, 0.0, 1, 0, 1.0, torch.empty(3, 7).double().numpy(), None)
    with pytest.raises(ValueError, match="noise"):
        mod.sketch_chunk_f32(px.numpy(), py.numpy(), 2, 4, 0.0, 1, 0, 1.0, None, torch.empty(3, 4).numpy())
    with pytest.raises(ValueError, match="sketch_bins must be at most both batch sizes"):
        S.dp_sliced_wasserstein(torch.randn(7, 3), private=torch.randn(10, 3), noise_std=0.1, clip_radius=NO_CLIP,
                                num_projections=3, release="sketch", sketch_bins=8)
