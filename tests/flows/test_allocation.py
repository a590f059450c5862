"""The one particle allocator (fastdpot.flows.allocation)."""
import pytest
import torch

from fastdpot.flows.allocation import allocate_particles


def test_largest_remainder_sums_and_floors():
    assert allocate_particles(10, "equal", 3) == [4, 3, 3]
    assert allocate_particles(10, [0, 1, 3], 3) == [0, 3, 7]
    assert allocate_particles(10, [0, 1, 3], 3, minimum=2) == [2, 3, 5]
    out = allocate_particles(60_000, torch.tensor([5512.3, 5490.0, 5501.7, 5480.2, 5520.0, 5493.1, 5505.5, 5498.0,
                                                   5489.9, 5509.3]), 10)
    assert sum(out) == 60_000
    shares = torch.tensor([5512.3, 5490.0, 5501.7, 5480.2, 5520.0, 5493.1, 5505.5, 5498.0, 5489.9, 5509.3])
    assert (torch.tensor(out, dtype=torch.float64) - shares / shares.sum() * 60_000).abs().max() < 1.0


def test_ties_go_to_the_lower_class_first():
    assert allocate_particles(5, "equal", 3) == [2, 2, 1]


@pytest.mark.parametrize("bad", [[1, 2], [-1, 1, 1], [0, 0, 0], [float("nan"), 1, 1]])
def test_bad_weights(bad):
    with pytest.raises(ValueError, match="weights"):
        allocate_particles(10, bad, 3)


def test_too_few_particles_and_bad_string():
    with pytest.raises(ValueError, match="num_particles"):
        allocate_particles(5, "equal", 3, minimum=2)
    with pytest.raises(ValueError, match="equal"):
        allocate_particles(10, "proportional", 3)
