"""Privacy-relevant API: private rows by keyword only, visible budget exhaustion, ε spent by the DP-SW loss,
atomic and validated checkpoint loads."""
import math

import pytest
import torch

import fastdpot
from fastdpot.privacy import BudgetExceededError, PrivacyAccountant, split_delta


def _rows(n, d=3, seed=0, dtype=torch.float64):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ------------------------------------------------------------------------------------------ private side by keyword
def test_dp_sliced_wasserstein_refuses_private_rows_by_position():
    real, fake = _rows(20, seed=1), _rows(20, seed=2).requires_grad_()
    # the former (x_private, y, noise_std) order and PyTorch's (input, target) order: both refused, naming private=
    for args in ((real, fake, 0.5), (fake, real, 0.5), (fake, real)):
        with pytest.raises(TypeError, match="private=x_private"):
            fastdpot.dp_sliced_wasserstein(*args, num_projections=4)
    with pytest.raises(TypeError, match="private="):
        fastdpot.dp_sliced_wasserstein(fake, noise_std=0.5, num_projections=4)
    with pytest.raises(TypeError, match="noise_std"):
        fastdpot.dp_sliced_wasserstein(fake, private=real, num_projections=4)
    with pytest.raises(ValueError, match="same tensor"):
        fastdpot.dp_sliced_wasserstein(real, private=real, noise_std=0.5, num_projections=4)
    # both sides validated, by their names
    with pytest.raises(ValueError, match="generated"):
        fastdpot.dp_sliced_wasserstein(fake[:, :2], private=real, noise_std=0.5, num_projections=4)
    with pytest.raises(TypeError, match="private"):
        fastdpot.dp_sliced_wasserstein(fake, private=real.numpy(), noise_std=0.5, num_projections=4)
    with pytest.raises(ValueError, match="generated"):
        fastdpot.dp_sliced_wasserstein(torch.full((5, 3), math.nan), private=real, noise_std=0.5, num_projections=4)


def test_keyword_private_side_is_the_clipped_one():
    """The ``private=`` rows are the ones clipped to ``radius``: the loss equals the one on pre-clipped rows."""
    th = fastdpot.sliced.random_projections(6, 3, torch.Generator().manual_seed(0), dtype=torch.float64)
    real, fake = 5.0 * _rows(30, seed=3), _rows(25, seed=4)
    got = fastdpot.dp_sliced_wasserstein(fake, private=real, noise_std=0.0, projections=th, radius=1.0)
    clipped = fastdpot.privacy.clip_rows(real, 1.0)
    want = fastdpot.sliced_wasserstein(clipped, fake, projections=th)
    assert float(got) == pytest.approx(float(want), rel=1e-12)
    # the generated side is never clipped: swapping the roles gives another value
    other = fastdpot.dp_sliced_wasserstein(real, private=fake, noise_std=0.0, projections=th, radius=1.0)
    assert abs(float(other) - float(want)) > 1e-3


def test_loss_module_refuses_swapped_or_positional_private_rows():
    crit = fastdpot.DPSlicedWassersteinLoss.from_privacy(10.0, 1e-5, 10, 50, 3, 4, 3, 1.0)
    real, fake = _rows(10, seed=5, dtype=torch.float32), _rows(10, seed=6, dtype=torch.float32).requires_grad_()
    with pytest.raises(TypeError, match="private="):
        crit(fake, real)  # nn.MSELoss(input, target) order
    with pytest.raises(TypeError, match="private="):
        crit(fake)
    assert crit.releases == 0  # refused before anything was released or counted
    crit(fake, private=real).backward()
    assert fake.grad is not None and crit.releases == 1


# ------------------------------------------------------------------------------------------ ε of the DP-SW loss
def test_loss_module_reports_epsilon_spent():
    eps, delta, B, n, T, k, d, r = 4.0, 1e-5, 10, 200, 3, 4, 3, 1.0
    crit = fastdpot.DPSlicedWassersteinLoss.from_privacy(eps, delta, B, n, T, k, d, r)
    assert crit.epsilon() == 0.0 and crit.get_epsilon(1e-5) == 0.0
    real, fake = _rows(n, d, seed=7, dtype=torch.float32), _rows(B, d, seed=8, dtype=torch.float32)
    spent = []
    for t in range(T):
        crit(fake, private=real[t * B:(t + 1) * B])
        spent.append(crit.epsilon())
    assert spent[0] < spent[1] < spent[2] <= eps * (1 + 1e-6)
    # the value is the RDP accountant of the releases so far, at δ − releases·δ_tail
    det = crit.privacy
    acc = PrivacyAccountant("rdp")
    acc.step(det["noise_multiplier"], B / n, num_steps=2, sampling="without_replacement", dataset_size=n,
             batch_size=B)
    _, d_tail = split_delta(delta, T)
    assert det["delta_tail"] == pytest.approx(d_tail)
    assert spent[1] == pytest.approx(acc.get_epsilon(delta - 2 * d_tail), rel=1e-12)
    assert crit.get_epsilon(1e-3) < crit.epsilon()  # larger δ, smaller ε
    with pytest.raises(BudgetExceededError):
        crit(fake, private=real[:B])
    with pytest.raises(ValueError, match="delta"):
        crit.epsilon(2.0)
    with pytest.raises(RuntimeError, match="from_privacy"):
        fastdpot.DPSlicedWassersteinLoss(0.5, 4).epsilon(1e-5)
