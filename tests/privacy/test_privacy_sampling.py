"""Samplers do what the accountant assumes: Poisson inclusion at rate q; fresh uniform fixed-size batches."""
import numpy as np
import pytest
import torch
from scipy import stats

from fastdpot.privacy import FixedSizeSampler, PoissonSampler


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_poisson_batch_size_distribution():
    n, q, draws = 400, 0.1, 3000
    s = PoissonSampler(n, q, secure_mode=False, generator=_gen(0))
    sizes = np.array([len(s.sample()) for _ in range(draws)])
    # chi-square goodness of fit to Binomial(n, q) on bins with enough mass
    edges = np.arange(25, 56)
    obs = np.array([np.sum(sizes < edges[0])] + [np.sum(sizes == k) for k in edges[:-1]] + [np.sum(sizes >= edges[-1])])
    cdf = stats.binom.cdf
    probs = np.array([cdf(edges[0] - 1, n, q)] + [stats.binom.pmf(k, n, q) for k in edges[:-1]]
                     + [1 - cdf(edges[-1] - 1, n, q)])
    assert stats.chisquare(obs, probs * draws).pvalue > 1e-3
    assert abs(sizes.mean() - n * q) < 4 * np.sqrt(n * q * (1 - q) / draws)


def test_poisson_inclusion_uniform_and_rate_never_above_q():
    n, q, draws = 50, 0.3, 2000
    s = PoissonSampler(n, q, secure_mode=False, generator=_gen(1))
    counts = np.zeros(n)
    for _ in range(draws):
        b = s.sample()
        assert b.dtype == torch.int64 and torch.all(b[1:] > b[:-1])  # distinct, sorted, in range
        counts[b.numpy()] += 1
    assert stats.chisquare(counts).pvalue > 1e-3
    assert abs(counts.mean() / draws - q) < 4 * np.sqrt(q * (1 - q) / (n * draws))
    assert s._threshold / 2 ** 53 <= q < (s._threshold + 1) / 2 ** 53


def test_poisson_full_rate_and_small_rate():
    assert torch.equal(PoissonSampler(7, 1.0).sample(), torch.arange(7))
    sizes = [len(PoissonSampler(1000, 1e-4, secure_mode=False, generator=_gen(s)).sample()) for s in range(50)]
    assert max(sizes) <= 3  # mostly empty batches are allowed (and accounted)


def test_fixed_size_uniform_without_replacement():
    n, bsz, draws = 40, 7, 3000
    s = FixedSizeSampler(n, bsz, secure_mode=False, generator=_gen(2))
    assert s.sample_rate == pytest.approx(bsz / n)
    counts = np.zeros(n)
    for _ in range(draws):
        b = s.sample()
        assert len(b) == bsz and len(torch.unique(b)) == bsz and 0 <= int(b.min()) and int(b.max()) < n
        counts[b.numpy()] += 1
    assert stats.chisquare(counts).pvalue > 1e-3  # every row equally likely


def test_fixed_size_fresh_every_call_not_a_replayed_epoch():
    """Consecutive batches overlap like independent draws (hypergeometric), unlike an epoch's disjoint batches."""
    n, bsz, draws = 100, 10, 2000
    s = FixedSizeSampler(n, bsz, secure_mode=False, generator=_gen(3))
    prev = set(s.sample().tolist())
    overlaps = []
    for _ in range(draws):
        cur = set(s.sample().tolist())
        overlaps.append(len(prev & cur))
        prev = cur
    overlaps = np.array(overlaps)
    mean = bsz * bsz / n  # hypergeometric mean 1.0
    assert abs(overlaps.mean() - mean) < 4 * np.sqrt(stats.hypergeom(n, bsz, bsz).var() / draws)
    # a cycled DataLoader (the authors' bug) gives 0 overlap within an epoch: the test tells them apart
    perm = torch.randperm(n, generator=_gen(4))
    epoch = [set(perm[i:i + bsz].tolist()) for i in range(0, n, bsz)]
    assert np.mean([len(a & b) for a, b in zip(epoch, epoch[1:])]) == 0


def test_generators_make_samplers_reproducible():
    for cls, args in [(PoissonSampler, (100, 0.2)), (FixedSizeSampler, (100, 13))]:
        a, b = cls(*args, secure_mode=False, generator=_gen(5)), cls(*args, secure_mode=False, generator=_gen(5))
        c = cls(*args, secure_mode=False, generator=_gen(6))
        seq_a = [a.sample() for _ in range(5)]
        seq_b = [b.sample() for _ in range(5)]
        seq_c = [c.sample() for _ in range(5)]
        assert all(torch.equal(x, y) for x, y in zip(seq_a, seq_b))
        assert [x.tolist() for x in seq_a] != [x.tolist() for x in seq_c]
        it = iter(cls(*args, secure_mode=False, generator=_gen(5)))
        assert torch.equal(next(it), seq_a[0])


@pytest.mark.parametrize("call,match", [
    (lambda: PoissonSampler(0, 0.1), "num_samples"),
    (lambda: PoissonSampler(10, 0.0), "sample_rate"),
    (lambda: PoissonSampler(10, 1.2), "sample_rate"),
    (lambda: PoissonSampler(10, 0.1, secure_mode=False, generator="seed"), "generator"),
    (lambda: FixedSizeSampler(10, 0), "batch_size"),
    (lambda: FixedSizeSampler(10, 11), "batch_size"),
    (lambda: FixedSizeSampler(10.0, 3), "num_samples"),
])
def test_sampler_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_sizes_a_sample_cannot_draw_in_bounded_time_are_refused_at_construction():
    # issue 40: PoissonSampler(10**9, 1e-9).sample() printed nothing in 100 s (10^9 inclusion tests of 8 bytes)
    from fastdpot.privacy.sampling import MAX_FIXED_BATCH, MAX_POISSON_ROWS, MAX_REPLAYABLE_ROWS

    with pytest.raises(ValueError, match=r"num_samples=1000000000 is beyond.*must be in \[1, 16777216\]"):
        PoissonSampler(10 ** 9, 1e-9)
    with pytest.raises(ValueError, match=r"batch_size=1048577 is beyond.*\[1, 1048576\]"):
        FixedSizeSampler(10 ** 9, MAX_FIXED_BATCH + 1)
    with pytest.raises(ValueError, match=r"num_samples=16777217 is beyond.*permutation"):
        FixedSizeSampler(MAX_REPLAYABLE_ROWS + 1, 10, secure_mode=False, generator=_gen(0))
    # at the limits a draw is bounded (a second at most on one core)
    assert FixedSizeSampler(10 ** 9, 10).sample().shape == (10,)  # secure: O(B), n is free
    big = PoissonSampler(MAX_POISSON_ROWS, 1e-6, secure_mode=False, generator=_gen(1)).sample()
    assert big.numel() < 200 and (big < MAX_POISSON_ROWS).all()
