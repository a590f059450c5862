"""bench.gpu_sinkhorn on CPU: the shared ε list (same length as GeomLoss'), the case order, the implementations per
size, the budget prediction, the table, and a --smoke run on the dense engine (KeOps' CPU compilation is left to the
slow test)."""
import math

import pytest
import torch

from bench import gpu_sinkhorn as gs
from bench import store


@pytest.mark.parametrize("diameter", [0.3, 1.7, 12.0, 300.0])
@pytest.mark.parametrize("iterations", [5, 12, 100])
def test_schedule_has_iterations_minus_two_values(diameter, iterations):
    scaling, eps = gs.schedule_for(diameter, gs.BLUR, iterations)
    assert 0.0 < scaling < 1.0
    assert len(eps) == iterations - 2
    assert eps[0] == pytest.approx(diameter ** 2) and eps[-1] == pytest.approx(gs.BLUR ** 2)
    glen = gs.geomloss_schedule_len(diameter, scaling)
    assert glen is None or glen == len(eps)  # GeomLoss runs the same number of updates


def test_schedule_refuses_degenerate_inputs():
    with pytest.raises(ValueError, match="diameter"):
        gs.schedule_for(gs.BLUR / 2)
    with pytest.raises(ValueError, match="iterations"):
        gs.schedule_for(1.0, gs.BLUR, 4)


def test_plan_order_and_impls():
    cases = gs.plan()
    assert cases[:2] == [(10_000, 64, "forward"), (50_000, 64, "forward")]  # the published figure's d first
    assert len(cases) == 8 and [c[2] for c in cases] == ["forward"] * 4 + ["full"] * 4
    assert gs.plan(only=[(10, 3)], modes=("full",)) == [(10, 3, "full")]
    # on CUDA the default backend at these sizes is KeOps: no separate fastdpot_keops row; the dense engines (each
    # compared with GeomLoss' dense engine) where their matrices fit (planned here without a GPU: up to 1e4)
    assert gs.impls_for(10_000, 10_000, 64, "cuda") == [("geomloss_online", "keops"), ("fastdpot", "keops"),
                                                        ("geomloss_tensorized", "tensorized"),
                                                        ("fastdpot_tensorized", "reference")]
    if not torch.cuda.is_available():
        assert gs.impls_for(50_000, 50_000, 2, "cuda") == [("geomloss_online", "keops"), ("fastdpot", "keops")]
    assert gs.impls_for(200, 200, 2, "cpu") == [("geomloss_online", "keops"), ("fastdpot", "reference"),
                                                ("fastdpot_keops", "keops"), ("geomloss_tensorized", "tensorized")]
    assert [gs.anchor_of(i) for i in gs.IMPLS] == ["geomloss_online"] * 3 + ["geomloss_tensorized"] * 2
    assert gs.impls_for(200, 200, 2, "cpu", ("fastdpot",)) == [("fastdpot", "reference")]


def test_inputs_are_unit_scale_and_nonzero():
    x, y = gs.inputs(500, 400, 64, "cpu")
    assert x.dtype == torch.float32 and x.shape == (500, 64) and y.shape == (400, 64)
    assert 0.7 < float((x ** 2).sum(1).mean()) < 1.3
    assert float((y.mean(0) * math.sqrt(64)).mean()) == pytest.approx(1.0, abs=0.1)


def test_predicted_time_scales_quadratically():
    rows = [dict(impl="fastdpot", d=64, mode="forward", n=10_000, median_s=0.2)]
    assert gs.predicted_s(rows, "fastdpot", 50_000, 64, "forward") == pytest.approx(5.0)  # one call past 3 s
    assert gs.predicted_s(rows, "fastdpot", 50_000, 2, "forward") is None
    rows[0]["median_s"] = 0.05
    assert gs.predicted_s(rows, "fastdpot", 50_000, 64, "forward") == pytest.approx(2.5)  # two calls


def test_markdown_table_rows_and_published_note():
    common = dict(machine={"gpu": "X"}, versions={"torch": "t"}, git_rev="r", timing="cuda_events", iterations=100,
                  d=64, n=10_000, mode="forward", peak_mem_mb=3.0)
    rows = [dict(common, impl="geomloss_online", backend="keops", ms=100.0),
            dict(common, impl="fastdpot", backend="keops", ms=50.0, ratio_to_geomloss=2.0),
            dict(common, impl="fastdpot_tensorized", backend="reference", error="OutOfMemoryError: x")]
    lines = gs.markdown_table(rows).splitlines()
    assert lines[2].startswith("| impl | backend | n | d | mode | ms |")
    assert lines[4] == "| geomloss_online | keops | 1e4 | 64 | forward | 100.00 | 3 | 1 (anchor) |"
    assert lines[5].endswith("| 50.00 | 3 | 2.00 |")
    assert "error: OutOfMemoryError" in lines[6]
    assert all(line.count("|") == lines[2].count("|") for line in lines[2:7])
    assert "not measured here" in lines[-1] and "1450 ms" in lines[-1]


def test_smoke_dense_engine(tmp_path, capsys):
    results, table = tmp_path / "r.json", tmp_path / "t.md"
    assert gs.main(["--smoke", "--impls", "fastdpot", "--iterations", "12", "--results", str(results),
                    "--table", str(table)]) == 0
    rows = store.load_rows([str(results)])
    assert [(r["n"], r["d"], r["mode"]) for r in rows] == gs.plan(smoke=True)
    for r in rows:
        assert r["suite"] == "gpu_sinkhorn" and r["impl"] == "fastdpot" and r["backend"] == "reference"
        assert "error" not in r and r["softmin_calls"] == 24 and r["eps_steps"] == 10
        assert r["median_s"] > 0 and math.isfinite(r["value"]) and r["params"] == dict(n=r["n"], m=r["n"], d=r["d"])
    assert "| fastdpot | reference |" in table.read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_without_cuda_exits_zero(capsys):
    assert gs.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


@pytest.mark.slow
def test_full_smoke_with_keops_and_geomloss(tmp_path):
    """Every implementation on KeOps CPU / the dense engine: same soft-min counts, same values (compiles KeOps
    formulas into KEOPS_CACHE_FOLDER on first run: about a minute)."""
    pytest.importorskip("geomloss")
    pytest.importorskip("pykeops")
    results = tmp_path / "r.json"
    assert gs.main(["--smoke", "--results", str(results)]) == 0
    rows = store.load_rows([str(results)])
    assert {r["impl"] for r in rows} == {"geomloss_online", "fastdpot", "fastdpot_keops", "geomloss_tensorized"}
    assert all(r.get("rel_diff_to_geomloss", 0.0) < 1e-3 for r in rows)
