"""pytest-benchmark suite ``sinkhorn``: the Sinkhorn divergence, forward + backward (cases: bench/sinkhorn.py).

One group per size: ``fastdpot`` (and its dense engine) beside the anchors GeomLoss (online, tensorized) and POT;
the dense impls only where their (N, M) matrices fit. ``-k quick``: tiny sizes.
"""
import pytest

from bench import sinkhorn as K
from bench.harness import run_benchmark

PARAMS = [(size, impl) for size, params in K.SIZES.items() for impl in K.impls(params)]
#: calls of a minute or more at the full sizes: fewer rounds
ROUNDS = {("2e4", "fastdpot"): 2, ("2e4", "geomloss_online"): 2, ("5e3", "pot"): 2, ("d784", "geomloss_online"): 2}


@pytest.mark.parametrize("size,impl", PARAMS, ids=["-".join(p) for p in PARAMS])
def test_sinkhorn(benchmark, size, impl):
    params = K.SIZES[size]
    run_benchmark(benchmark, K.divergence_case(impl, **params), suite=K.SUITE, name="divergence", impl=impl,
                  params=params, mode="full", anchors=K.ANCHORS, rounds=ROUNDS.get((size, impl), 3))
