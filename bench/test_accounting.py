"""pytest-benchmark suite ``accounting``: ``PrivacyBudget.spend`` over a whole run, at the budget's edge, and a
refused tiny noise multiplier (cases: bench/accounting.py). ``-k quick``: T = 1 000."""
import pytest

from bench import accounting as A
from bench.harness import run_benchmark

PARAMS = [(size, case) for size in A.SIZES for case in A.CASES]


@pytest.mark.parametrize("size,case", PARAMS, ids=["-".join(p) for p in PARAMS])
def test_accounting(benchmark, size, case):
    params = A.SIZES[size]
    run_benchmark(benchmark, A.CASES[case]("fastdpot", **params), suite=A.SUITE, name=case, impl="fastdpot",
                  params=params, mode="forward", anchors=A.ANCHORS, rounds=3)
