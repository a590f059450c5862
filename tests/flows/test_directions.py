"""Public image direction sets (fastdpot.flows.directions): orthonormal blocks, the DCT against scipy, patch
locality, colour, frequencies and the bins they give."""
import math

import pytest
import torch

from fastdpot.flows.directions import bins_by_frequency, dct_matrix, image_blocks, patch_block


def test_dct_matrix_is_scipys_orthonormal_dct():
    from scipy.fft import dct

    x = torch.rand(7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(dct_matrix(7) @ x, torch.from_numpy(dct(x.numpy(), type=2, norm="ortho")))


@pytest.mark.parametrize("patch,shift,channels", [(28, (0, 0), 1), (7, (3, 3), 1), (4, (2, 2), 1), (5, (1, 2), 3),
                                                  (1, (0, 0), 1)])
def test_every_block_is_an_orthonormal_basis_of_local_directions(patch, shift, channels):
    H = W = 12 if channels == 3 else 28
    P, f = patch_block(H, W, min(patch, H), shift, channels)
    D = channels * H * W
    assert P.shape == (D, D) and f.shape == (D,)
    torch.testing.assert_close(P @ P.t(), torch.eye(D, dtype=torch.float64), atol=1e-10, rtol=0)
    support = (P.view(D, channels, H, W).abs() > 1e-12).any(1)  # spatial support of each direction
    rows = support.any(2).sum(1)
    cols = support.any(1).sum(1)
    assert int(rows.max()) <= min(patch, H) and int(cols.max()) <= min(patch, W)  # one patch at most
    assert float(f.min()) == 0.0 and int((f == 0).sum()) >= channels  # every patch's mean


def test_frequencies_and_bins():
    P, f = patch_block(28, 28, 28)
    assert float(f[1]) == pytest.approx(0.5) and float(f.max()) == pytest.approx(math.hypot(13.5, 13.5))
    L = bins_by_frequency(f, [(2, 16), (6, 8), (float("inf"), 2)])
    assert int(L[0]) == 16 and int((L == 2).sum()) > 600 and set(L.tolist()) == {16, 8, 2}
    with pytest.raises(ValueError, match="increase"):
        bins_by_frequency(f, [(5, 4), (2, 8)])
    with pytest.raises(ValueError, match="largest frequency"):
        bins_by_frequency(f, [(3, 4)])
    B, fb = image_blocks(28, 28, patches=((28, 0, 0), (7, 0, 0)))
    assert B.shape == (2 * 784, 784) and fb.shape == (2 * 784,)


# ---------------------------------------------------------------------------- issue 46: one set of conventions
@pytest.mark.parametrize("patches", [[(2, 0)], [2], 2, "2/0/0", [(2.5, 0, 0)], [(2, 0.5, 0)], [(2, True, 0)],
                                     [(0, 0, 0)], [(2, -1, 0)], [(2, 0, 2)], [(4, 0, 0), (2, 0)]])
def test_malformed_patches_are_refused_before_any_block(patches):
    with pytest.raises(ValueError, match="^patches"):
        image_blocks(4, 4, 1, patches=patches)


@pytest.mark.parametrize("shift", [(0,), 1, (1.5, 0), (-1, 0), (2, 0), (0, 0, 0), None])
def test_a_malformed_shift_is_refused_naming_it(shift):
    with pytest.raises(ValueError, match=r"^shift must be a pair \(shift_y, shift_x\) of integers in \[0, patch = 2\)"):
        patch_block(4, 4, 2, shift)


def test_non_finite_frequencies_and_malformed_plans_are_refused():
    plan = [(1.0, 4), (math.inf, 2)]
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="^frequency contains non-finite"):
            bins_by_frequency(torch.tensor([0.0, bad]), plan)
    with pytest.raises(TypeError, match="^frequency must be a torch.Tensor"):
        bins_by_frequency([0.0, 1.0], plan)
    for bad_plan in ([(math.nan, 4)], [(1.0,)], [4], [("1", 4)]):
        with pytest.raises(ValueError, match="^plan entries must be"):
            bins_by_frequency(torch.tensor([0.0, 1.0]), bad_plan)


def test_an_image_too_large_for_memory_is_refused_naming_its_size():
    for build in (lambda: image_blocks(4096, 4096), lambda: image_blocks(4096, 4096, per_block=2048),
                  lambda: patch_block(4096, 4096, 4096)):
        with pytest.raises(ValueError, match=r"^\(height, width, channels\)=\(4096, 4096, 1\) needs about .* GiB"):
            build()
