"""Triton DP-SW_p^p (op "sliced_wasserstein", backend "triton") vs the torch reference and POT, on CPU under
TRITON_INTERPRET=1 at tiny shapes: values, fused gradients (gradcheck in float64), noise replay, N != M."""
import os

import pytest
import torch

triton = pytest.importorskip("triton")

from fastdpot.reference.sliced import sliced_wasserstein as ref_sw  # noqa: E402

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1" and not torch.cuda.is_available(),
                       reason="Triton kernels need CUDA or TRITON_INTERPRET=1"),
]

from fastdpot.kernels.dpswd import sliced_wasserstein_triton  # noqa: E402

#: a clipping bound above every row's norm in these tests: the rows are not changed by it
NO_CLIP = 1e6
DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1" else "cpu"


def _inputs(n, m, d, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, dtype=torch.float64, generator=g)
    y = torch.randn(m, d, dtype=torch.float64, generator=g) * 0.8 + 0.4
    th = torch.randn(k, d, dtype=torch.float64, generator=g)
    th = th / th.norm(dim=1, keepdim=True)
    return [t.to(dtype=dtype, device=DEV) for t in (x, y, th)]


@pytest.mark.parametrize("n,m", [(40, 40), (61, 23), (17, 45)])
@pytest.mark.parametrize("p", [1, 2, 1.5])
def test_float64_value_and_gradient(n, m, p):
    x, y, th = _inputs(n, m, 5, 11, torch.float64, seed=n + m)
    x.requires_grad_(True)
    y.requires_grad_(True)
    loss, nx, ny = sliced_wasserstein_triton(x, y, th, p, 0.25, 77, True)
    up = torch.tensor(1.7, dtype=torch.float64)  # upstream gradient that is not one
    gx, gy = torch.autograd.grad(loss, (x, y), up)
    ref = ref_sw(x, y, th, p=p, noise_x=nx, noise_y=ny)
    rgx, rgy = torch.autograd.grad(ref, (x, y), up)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(gx, rgx, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(gy, rgy, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("n,m", [(96, 96), (80, 33)])
def test_float32_error_like_torch(n, m):
    x, y, th = _inputs(n, m, 8, 16, torch.float32, seed=4)
    x.requires_grad_(True)
    y.requires_grad_(True)
    loss, nx, ny = sliced_wasserstein_triton(x, y, th, 2, 0.1, 5, True)
    gx, gy = torch.autograd.grad(loss, (x, y))
    args64 = [t.detach().double().requires_grad_(True) for t in (x, y)]
    ref64 = ref_sw(*args64, th.double(), p=2, noise_x=nx.double(), noise_y=ny.double())
    rg64 = torch.autograd.grad(ref64, args64)
    args32 = [t.detach().requires_grad_(True) for t in (x, y)]
    ref32 = ref_sw(*args32, th, p=2, noise_x=nx, noise_y=ny)
    rg32 = torch.autograd.grad(ref32, args32)
    eps = torch.finfo(torch.float32).eps
    assert abs(loss.double() - ref64).item() <= 4 * abs(ref32.double() - ref64).item() + 8 * eps * ref64.item()
    for got, r64, r32 in zip((gx, gy), rg64, rg32):
        err = (got.double() - r64).abs().max().item()
        torch_err = (r32.double() - r64).abs().max().item()
        assert err <= 4 * torch_err + 8 * eps * r64.abs().max().item(), (err, torch_err)


def test_non_contiguous_inputs():
    x, y, th = _inputs(20, 14, 4, 6, torch.float64, seed=12)
    a = sliced_wasserstein_triton(x, y, th, 2, 0.2, 1, False)
    b = sliced_wasserstein_triton(*(t.t().contiguous().t() for t in (x, y, th)), 2, 0.2, 1, False)
    torch.testing.assert_close(a, b, rtol=1e-13, atol=0)


def test_gradcheck_float64():
    x, y, th = _inputs(5, 4, 2, 3, torch.float64, seed=8)
    x.requires_grad_(True)
    y.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: sliced_wasserstein_triton(a, b, th, 2, 0.1, 3, False), (x, y),
                                    eps=1e-6, atol=1e-7)


def test_matches_pot_without_noise():
    ot = pytest.importorskip("ot")
    x, y, th = _inputs(50, 50, 4, 9, torch.float64, seed=2)
    loss = sliced_wasserstein_triton(x, y, th, 2, 0.0, 0, False)
    pot = ot.sliced_wasserstein_distance(x.cpu().numpy(), y.cpu().numpy(), projections=th.cpu().numpy().T, p=2)
    assert abs(loss.item() - float(pot) ** 2) < 1e-12


def test_noise_replay_chunking_and_seed(monkeypatch):
    x, y, th = _inputs(30, 20, 3, 10, torch.float64, seed=6)
    loss, nx, ny = sliced_wasserstein_triton(x, y, th, 2, 0.5, 11, True)
    assert nx.shape == (30, 10) and ny.shape == (20, 10)
    assert abs(nx.std().item() - 0.5) < 0.15
    assert not torch.equal(nx[:20], ny)  # independent streams for the two sides
    monkeypatch.setenv("FASTDPOT_TRITON_CHUNK_ELEMS", str(30 * 3))  # 3 directions per chunk
    again, nx2, _ = sliced_wasserstein_triton(x, y, th, 2, 0.5, 11, True)
    assert torch.equal(nx, nx2)
    torch.testing.assert_close(loss, again, rtol=1e-13, atol=0)
    other = sliced_wasserstein_triton(x, y, th, 2, 0.5, 12, False)
    assert other.item() != loss.item()


def test_public_api_backend_triton():
    import fastdpot

    x, y, th = _inputs(24, 24, 3, 6, torch.float64, seed=9)
    y.requires_grad_(True)
    g = torch.Generator().manual_seed(0)
    loss, nx, ny = fastdpot.dp_sliced_wasserstein(y, private=x, noise_std=0.3, clip_radius=NO_CLIP, projections=th,
                                                  secure_mode=False, generator=g, backend="triton",
                                                  return_noise=True)
    loss.backward()
    yr = y.detach().clone().requires_grad_(True)
    ref = ref_sw(x, yr, th, p=2, noise_x=nx, noise_y=ny)
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(y.grad, yr.grad, rtol=1e-10, atol=1e-13)


def test_bad_input():
    x, y, th = _inputs(10, 10, 3, 4, torch.float64)
    with pytest.raises(ValueError, match="p must be"):
        sliced_wasserstein_triton(x, y, th, 0.5, 0.0, 0, False)
    with pytest.raises(ValueError, match="projections"):
        sliced_wasserstein_triton(x, y, th.clone().requires_grad_(True), 2, 0.0, 0, False)
    with pytest.raises(ValueError, match="dtype"):
        sliced_wasserstein_triton(x.half(), y.half(), th.half(), 2, 0.0, 0, False)
