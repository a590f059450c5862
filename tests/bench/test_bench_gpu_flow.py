"""bench.gpu_flow on CPU: the torch.compile anchor of the DP-SWD loss (same value and gradient as the reference, same
noise), the --dpswd-only / --compiled options, and the ratio_to_compiled field of the rows and the table."""
import os

import pytest
import torch

from bench import gpu_flow, gpu_flow_cases, store


def _compile_works():
    try:
        f = torch.compile(lambda a: (a * 2).sum(), dynamic=False)
        f(torch.ones(3))
        return True
    except Exception:  # no C++ compiler, Inductor unavailable
        return False


def test_parse_size_and_cli_errors(capsys):
    assert gpu_flow._parse_size("1e6,48,128") == dict(N=10 ** 6, d=48, k=128)
    for bad in ("1e6,48", "a,b,c", "0,4,4"):
        with pytest.raises(ValueError, match="N,d,k"):
            gpu_flow._parse_size(bad)
    with pytest.raises(SystemExit):
        gpu_flow.main(["--dpswd-only", "1e6,48"])
    with pytest.raises(SystemExit):
        gpu_flow.main(["--dpswd-only", "1e6,48,128", "--only", "1e6,48,128"])


def test_impls_and_compiled_sizes():
    assert gpu_flow.COMPILED in gpu_flow.ANCHORS
    assert gpu_flow._impls("dpswd", 10 ** 6, True) == ["triton", "reference", "reference_compiled"]
    assert gpu_flow._impls("dpswd", 10 ** 6) == ["triton", "reference"]
    assert gpu_flow._wants_compiled(gpu_flow.TARGET_DPSWD, "target")
    assert not gpu_flow._wants_compiled(dict(N=10 ** 5, d=48, k=128), "target")
    assert gpu_flow._wants_compiled(dict(N=10 ** 5, d=48, k=128), "all")
    assert not gpu_flow._wants_compiled(gpu_flow.TARGET_DPSWD, "none")


def test_markdown_table_has_ratio_to_compiled():
    common = dict(machine={"gpu": "X"}, versions={"torch": "t", "triton": "tr"}, git_rev="r", timing="cuda_events",
                  case="dpswd", params=dict(N=10 ** 6, d=48, k=128), peak_mem_mb=1.0, gbps=1.0)
    rows = [dict(common, impl="triton", ms=10.0, ratio_to_reference=3.0, ratio_to_compiled=1.6),
            dict(common, impl="reference", ms=30.0),
            dict(common, impl="reference_compiled", ms=16.0, ratio_to_reference=1.88),
            dict(common, impl="reference_compiled", error="BackendCompilerFailed: no compiler")]
    table = gpu_flow.markdown_table(rows).splitlines()
    assert "× compiled" in table[2]
    assert table[4].endswith("| 3.0 | 1.60 |")
    assert table[6].endswith("| 1.9 |  |")
    assert all(line.count("|") == table[2].count("|") for line in table[2:])


@pytest.mark.skipif(not _compile_works(), reason="torch.compile does not work here")
def test_compiled_anchor_matches_reference():
    """Same loss and gradient as the reference row (the noise is the reference's, drawn from the same seed)."""
    out = {}
    for impl in ("reference", gpu_flow.COMPILED):
        case = gpu_flow._dpswd_case(impl, N=96, d=5, k=7, device="cpu")
        state = case.setup()
        loss = case.forward(state)
        loss.backward()
        out[impl] = (loss.detach(), state[1].grad.clone())
    (l0, g0), (l1, g1) = out["reference"], out[gpu_flow.COMPILED]
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g1, g0, rtol=1e-4, atol=1e-6)


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="--smoke needs TRITON_INTERPRET=1")
@pytest.mark.skipif(not _compile_works(), reason="torch.compile does not work here")
def test_smoke_dpswd_only_with_compiled_anchor(tmp_path):
    results, table = tmp_path / "r.json", tmp_path / "t.md"
    assert gpu_flow.main(["--smoke", "--dpswd-only", "128,4,8", "--results", str(results),
                          "--table", str(table)]) == 0
    rows = store.load_rows([str(results)])
    assert [r["impl"] for r in rows] == ["triton", "reference", "reference_compiled"]
    assert all(r["case"] == "dpswd" and "error" not in r for r in rows)
    by = {r["impl"]: r for r in rows}
    assert by["reference_compiled"]["graph_breaks"] == 0 and by["reference_compiled"]["compile_s"] >= 0
    assert "ratio_to_compiled" in by["triton"] and "ratio_to_compiled" not in by["reference"]
    assert "ratio_to_reference" in by["reference_compiled"]
    assert "reference_compiled" in table.read_text()


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="--smoke needs TRITON_INTERPRET=1")
def test_compile_failure_is_an_error_row(tmp_path, monkeypatch):
    def broken():
        def fn(*args):
            raise AssertionError("Inductor: no working C++ compiler")  # not a RuntimeError: caught all the same
        return fn

    monkeypatch.setattr(gpu_flow_cases, "compiled_reference_loss", broken)  # the case calls it
    results = tmp_path / "r.json"
    assert gpu_flow.main(["--smoke", "--dpswd-only", "64,4,8", "--results", str(results)]) == 0
    rows = {r["impl"]: r for r in store.load_rows([str(results)])}
    assert rows["reference_compiled"]["error"].startswith("AssertionError: Inductor")
    assert "error" not in rows["triton"] and "ratio_to_compiled" not in rows["triton"]
