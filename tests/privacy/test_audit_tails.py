"""The audit as a certificate (issue 29): a tail test on the noise itself that flags truncated noise, input checks on
the bound's helpers, and a command line that shows progress and says what it cannot detect."""
import math

import pytest
import torch

from fastdpot.audit import clopper_pearson_upper, epsilon_lower_bound, run_tail_case, tail_test
from fastdpot.audit.__main__ import main as audit_main
from fastdpot.audit.tails import NOISE_SOURCES


def _normals(n, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_tail_test_passes_normals_and_flags_every_kind_of_short_tail():
    z = _normals(10 ** 6)
    ok = tail_test(z)
    assert not ok.flagged and ok.p_value > 1e-3 and ok.max_abs > 4.5
    # expected counts are n·2Φ(−t), the normal law's own tail mass
    assert ok.expected[0] == pytest.approx(1e6 * math.erfc(3 / math.sqrt(2)), rel=1e-12)
    for bad in (z.clamp(-4.0, 4.0),                      # a clamp at 4σ (an atom at ±4, nothing beyond)
                z[z.abs() <= 3.5],                       # a truncated normal
                0.9 * z):                                # under-scaled noise (σ too small by 10 %)
        r = tail_test(bad)
        assert r.flagged and r.p_value < 1e-6, r
    # what 10^6 draws cannot resolve: a cut at 5.7σ (float32 torch.randn's cap) passes
    assert not tail_test(z.clamp(-5.7, 5.7)).flagged


@pytest.mark.parametrize("source", list(NOISE_SOURCES))
def test_every_noise_source_of_fastdpot_has_normal_tails_and_the_cut_variant_is_flagged(source):
    # the secure sources: secret OS draws, not replayable; a correct source is flagged with probability < 1e-6
    good = run_tail_case(source, "correct", draws=400_000, alpha=1e-6)
    assert not good.flagged, good
    cut = run_tail_case(source, "truncated", draws=400_000, alpha=1e-6)
    assert cut.flagged and cut.observed == (0, 0, 0, 0) and cut.max_abs <= 3.0


@pytest.mark.parametrize("call,match", [
    (lambda: tail_test(torch.zeros(10)), "1000 draws"),
    (lambda: tail_test(torch.full((2000,), math.nan)), "finite"),
    (lambda: tail_test(_normals(2000), alpha=2.0), "alpha"),
    (lambda: run_tail_case("nope"), "source"),
    (lambda: run_tail_case("privacy_normal", "clamped"), "variant"),
    (lambda: epsilon_lower_bound(1.5, 0.1, 1e-3), "fpr_upper"),
    (lambda: epsilon_lower_bound(0.1, -0.1, 1e-3), "fnr_upper"),
    (lambda: epsilon_lower_bound(0.1, 0.1, -1e-3), "delta"),
    (lambda: epsilon_lower_bound(0.1, 0.1, 1.0), "delta"),
    (lambda: clopper_pearson_upper(11, 10, 0.95), "count"),
    (lambda: clopper_pearson_upper(-1, 10, 0.95), "count"),
    (lambda: clopper_pearson_upper(2.5, 10, 0.95), "integers"),
    (lambda: clopper_pearson_upper(1, 0, 0.95), "total"),
    (lambda: clopper_pearson_upper(1, 10, 2.0), "level"),
])
def test_audit_helpers_refuse_values_outside_their_domain(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_cli_prints_the_tail_table_and_what_it_cannot_detect(capsys):
    rc = audit_main(["--cases", "laplace_local", "--trials", "20000", "--tail-draws", "50000"])
    cap = capsys.readouterr()
    assert rc == 0 and "| laplace_local" in cap.out
    for source in NOISE_SOURCES:
        assert f"| {source}" in cap.out
    assert "What this audit cannot detect" in cap.out and "Secrecy of the randomness" in cap.out
    assert "5.77 sigma" in cap.out and "audit" in cap.err  # the progress bar goes to stderr
    rc = audit_main(["--cases", "laplace_local", "--variant", "truncated", "--trials", "20000",
                     "--tail-draws", "200000", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 1 and out.count("FLAGGED (") == len(NOISE_SOURCES)
