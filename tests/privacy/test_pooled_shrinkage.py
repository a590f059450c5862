"""The pooled empirical-Bayes shrinkage of released quantile tables (fastdpot.privacy.sketch_tables.pooled_shrinkage)
and its use by ClassSketchRelease.quantile_tables."""
import pytest
import torch

from fastdpot.flows.directions import hadamard_blocks, patch_dct_blocks
from fastdpot.privacy.class_sketch import class_quantile_sketch
from fastdpot.privacy.sketch_tables import (_quantile_basis, frequency_groups, pooled_shrinkage, shrink_quantiles)


def _levels(L):
    return (torch.arange(L, dtype=torch.float64) + 0.5) / L


@pytest.mark.parametrize("L", [2, 3, 8, 16])
def test_the_basis_is_orthonormal_with_the_constant_first(L):
    U = _quantile_basis(_levels(L))
    torch.testing.assert_close(U.t() @ U, torch.eye(L, dtype=torch.float64), rtol=0, atol=1e-10)
    torch.testing.assert_close(U[:, 0], torch.full((L,), L ** -0.5, dtype=torch.float64), rtol=0, atol=1e-12)


def test_without_noise_the_rows_are_returned_as_they_are():
    g = torch.Generator().manual_seed(0)
    m = torch.sort(torch.randn(40, 8, generator=g, dtype=torch.float64), 1).values
    out = pooled_shrinkage(m, torch.zeros(40, dtype=torch.float64), _levels(8), torch.arange(40) % 3)
    torch.testing.assert_close(out, m, rtol=0, atol=1e-12)


def test_a_band_below_its_noise_keeps_its_locations_and_a_strong_band_keeps_its_shape():
    g = torch.Generator().manual_seed(1)
    L, k = 16, 400
    z = torch.distributions.Normal(0.0, 1.0).icdf(_levels(L))
    loc = torch.randn(k, 1, generator=g, dtype=torch.float64)
    scale = torch.where(torch.arange(k)[:, None] < k // 2, 0.001, 2.0).to(torch.float64)  # group 0 weak, 1 strong
    truth = loc + scale * z[None, :]
    s = torch.full((k,), 0.2, dtype=torch.float64)
    noisy = truth + 0.2 * torch.randn(k, L, generator=g, dtype=torch.float64)
    groups = (torch.arange(k) >= k // 2).long()
    out = pooled_shrinkage(noisy, s, _levels(L), groups)
    weak, strong = slice(0, k // 2), slice(k // 2, k)
    # the weak band: (nearly) flat rows at the noisy location, far closer to the truth than the raw rows
    spread = (out[weak] - out[weak].mean(1, keepdim=True)).pow(2).mean()
    assert float(spread) < 0.05 * 0.2 ** 2, float(spread)
    torch.testing.assert_close(out.mean(1), noisy.mean(1), rtol=0, atol=1e-12)  # the location is kept
    err = lambda a, b: float((a - b).pow(2).mean())
    assert err(out[weak], truth[weak]) < 0.15 * err(noisy[weak], truth[weak])
    # the strong band: its scale survives (within 1 %), and the error is below the raw rows' error
    ratio = ((out[strong] - out[strong].mean(1, keepdim=True)).norm(dim=1) /
             (truth[strong] - truth[strong].mean(1, keepdim=True)).norm(dim=1))
    assert abs(float(ratio.mean()) - 1.0) < 0.01, float(ratio.mean())
    assert err(out[strong], truth[strong]) < err(noisy[strong], truth[strong])
    # pooled over the band, the weak directions come out closer than James–Stein on each direction alone
    assert err(out[weak], truth[weak]) < 0.5 * err(shrink_quantiles(noisy[weak], s[weak], _levels(L), 3),
                                                    truth[weak])


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="pooled_shrinkage needs"):
        pooled_shrinkage(torch.zeros(3, 4), torch.zeros(2), _levels(4), torch.zeros(3, dtype=torch.long))


def test_groups_are_a_blocks_frequency_bands_and_a_rotation_is_one_group():
    blocks = patch_dct_blocks(8, 8, 1, ((8, 0, 0), (4, 0, 0))) + hadamard_blocks(64, 1, seed=3)
    gid = frequency_groups(blocks)
    assert gid.shape == (192,)
    for b, block in enumerate(blocks):  # no group spans two blocks
        assert set(gid[64 * b:64 * (b + 1)].tolist()).isdisjoint(
            set(gid[:64 * b].tolist()) | set(gid[64 * (b + 1):].tolist()))
    band = torch.floor(blocks[0].frequency + 0.5)
    same = gid[:64, None] == gid[None, :64]
    assert torch.equal(same, band[:, None] == band[None, :])
    assert gid[128:].unique().numel() == 1


def test_tables_take_the_shrinkage_by_name():
    g = torch.Generator().manual_seed(2)
    blocks = patch_dct_blocks(4, 4, 1, ((4, 0, 0),))
    x = torch.rand(400, 16, generator=g, dtype=torch.float64)
    y = torch.arange(400) % 2
    rel = class_quantile_sketch(x, y, blocks, num_classes=2, sketch_bins=8, noise_multiplier=1.0, clip_radius=2.0,
                                generator=g, secure_mode=False)
    pooled, stein, none = (rel.quantile_tables(shrink=v) for v in ("pooled", "stein", False))
    for c in range(2):
        torch.testing.assert_close(rel.quantile_tables(shrink=True)[c][0], pooled[c][0], rtol=0, atol=0)
        assert not torch.equal(pooled[c][0], stein[c][0]) and not torch.equal(pooled[c][0], none[c][0])
    for bad in ("no", "James-Stein", 1, None):
        with pytest.raises(ValueError, match="^shrink must be a bool or one of"):
            rel.quantile_tables(shrink=bad)


def test_pooled_locations_are_the_dense_least_squares_fit_and_closer_to_the_truth():
    from fastdpot.privacy.sketch_tables import pooled_locations

    blocks = patch_dct_blocks(8, 8, 1, ((8, 0, 0), (4, 0, 0), (4, 2, 2))) + hadamard_blocks(64, 2, seed=1)
    th = torch.cat([b.matrix() for b in blocks]).double()
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(3, 64, generator=g, dtype=torch.float64) @ th.t()
    var = torch.rand(3, th.shape[0], generator=g, dtype=torch.float64) + 0.1
    loc = truth + var.sqrt() * torch.randn(3, th.shape[0], generator=g, dtype=torch.float64)
    out = pooled_locations(blocks, loc, var)
    for c in range(3):  # the normal equations solved densely
        x = torch.linalg.solve(th.t() @ (th / var[c][:, None]), th.t() @ (loc[c] / var[c]))
        torch.testing.assert_close(out[c], th @ x, rtol=0, atol=1e-9)
    # five blocks that each span R^64: about a fifth of the noise variance
    assert float((out - truth).pow(2).mean()) < 0.3 * float((loc - truth).pow(2).mean())
    # directions that do not span R^D (a block of 16 of the 64): their own least-squares fit, nothing added
    part = patch_dct_blocks(8, 8, 1, ((8, 0, 0),), per_block=16)
    y = torch.randn(2, 16, generator=g, dtype=torch.float64)
    torch.testing.assert_close(pooled_locations(part, y, torch.ones(2, 16, dtype=torch.float64)), y, rtol=0,
                               atol=1e-10)
    with pytest.raises(ValueError, match="shape"):
        pooled_locations(blocks, loc[:, :10], var[:, :10])
    with pytest.raises(ValueError, match="variances > 0"):
        pooled_locations(blocks, loc, var * 0)
