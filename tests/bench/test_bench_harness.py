"""The benchmark machinery: the measured commit, peak memory, the stored format (pytest-benchmark JSON documents for
the CPU suites, the GPU scripts and the converted rows of before), the renderer, and the pytest-benchmark suites
themselves (collected by ``pytest bench/``, never by the default run)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bench import harness, render, store


def test_git_rev_prefers_the_commit_the_caller_names(monkeypatch):
    monkeypatch.setenv("FASTDPOT_TREE_COMMIT", "abc1234")
    assert harness.git_rev() == "abc1234"
    monkeypatch.setenv("FASTDPOT_TREE_COMMIT", "  ")                 # blank: ignored, git answers
    rev = harness.git_rev()
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=harness.ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "unknown"
    assert rev.split("+")[0] == head


def test_peak_rss_sees_one_calls_allocation_after_a_bigger_one():
    import torch

    junk = [torch.randn(2 ** 20) for _ in range(100)]  # 400 MB freed into the allocator: reuse must still count
    del junk
    big = harness.peak_rss_mb(lambda: np.ones(300 * 2 ** 17).sum())  # 300 MB touched, then freed
    small = harness.peak_rss_mb(lambda: np.ones(60 * 2 ** 17).sum())  # 60 MB: not hidden by the earlier peak
    if big is None:
        pytest.skip("/proc/self/clear_refs is not writable here")
    assert 250 <= big <= 400 and 40 <= small <= 120


def _row(impl, median, run="r1", when="2026-01-01T00:00:00", suite="sliced", case="dp", rev="abc1234", **kw):
    times = [median * f for f in (0.9, 1.0, 1.2)]
    return dict(dict(run_id=run, suite=suite, case=case, impl=impl, params=dict(n=100000, m=100000, d=48, k=500),
                     mode="full", device="cpu", git_rev=rev, threads=2, timestamp=when, peak_mem_mb=12.0,
                     machine=dict(cpu="Test CPU", cores=2, platform="linux", python="3.11"),
                     versions=dict(torch="2.x"), times_s=times, median_s=median), **kw)


def test_rows_round_trip_through_a_pytest_benchmark_document(tmp_path):
    path = str(tmp_path / "run.json")
    store.append_row(path, _row("fastdpot", 1.0, ms=1000.0))
    store.append_row(path, _row("reference", 6.0))
    store.append_row(path, {k: v for k, v in _row("api", 0.0, case="api_run").items()
                            if k not in ("times_s", "median_s")})
    doc = json.load(open(path))
    assert set(doc) >= {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert doc["commit_info"]["id"] == "abc1234" and doc["machine_info"]["cpu_model"] == "Test CPU"
    b = doc["benchmarks"][0]
    assert b["group"] == "sliced/dp n=1e+05, m=1e+05, d=48, k=500" == doc["benchmarks"][1]["group"]
    assert b["stats"]["median"] == 1.0 and b["stats"]["rounds"] == 3 and b["stats"]["data"] == [0.9, 1.0, 1.2]
    assert b["extra_info"]["peak_mem_mb"] == 12.0 and b["extra_info"]["ms"] == 1000.0
    assert len(doc["records"]) == 1  # a row without timings is a record, not a benchmark entry
    rows = store.load_rows([path])
    timed = [r for r in rows if "median_s" in r]
    assert [r["impl"] for r in timed] == ["fastdpot", "reference"] and timed[1]["median_s"] == 6.0
    assert timed[0]["machine"] == "Test CPU" and timed[0]["git_rev"] == "abc1234" and timed[0]["threads"] == 2


def test_legacy_rows_convert_with_their_machine_and_commit(tmp_path):
    legacy = tmp_path / "results.jsonl"
    old = [dict(_row("fastdpot", 2.0, run="old", rev="1234567+dirty"), min_s=1.9, max_s=2.2, iqr_s=0.1, repeats=3,
                median_s=2.0)]
    old[0].pop("times_s")
    legacy.write_text("".join(json.dumps(r) + "\n" for r in old))
    (path,) = store.convert_jsonl(str(legacy), str(tmp_path / "out"))
    (row,) = store.load_rows([path])
    assert row["median_s"] == 2.0 and row["iqr_s"] == 0.1 and row["git_rev"] == "1234567+dirty"
    assert row["machine"] == "Test CPU" and os.path.basename(path).startswith("legacy-sliced-old")


def test_render_takes_the_newest_run_and_ratios_within_it(tmp_path):
    old, new = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    store.write_rows(old, [_row("fastdpot", 1.0, run="a"), _row("reference", 50.0, run="a")])
    store.write_rows(new, [_row("fastdpot", 2.0, run="b", when="2026-02-01T00:00:00", rev="def5678"),
                           _row("reference", 6.0, run="b", when="2026-02-01T00:00:00", rev="def5678")])
    text = render.table(store.load_rows([old, new]))
    lines = [ln for ln in text.splitlines() if ln.startswith("| sliced")]
    assert len(lines) == 2 and "| 2 |" in lines[0] and "3.00× reference" in lines[0]  # newest, ratio in-run
    assert lines[0].endswith("| Test CPU, def5678 |") and "| 12 |" in lines[0]  # machine, commit, peak MB
    assert "Test CPU at def5678: 2 threads (torch 2.x)" in text
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- BENCH:START -->\nstale\n<!-- BENCH:END -->\nend\n")
    render.update_between_markers(str(readme), render.table(store.load_rows([new]), headline_only=True))
    body = readme.read_text()
    assert "stale" not in body and "3.00× reference" in body and body.endswith("<!-- BENCH:END -->\nend\n")


def test_rows_measured_under_load_are_marked_with_their_load(tmp_path):
    """Issue 40.8: every row's machine note carries the load average at the start of its run, and a run started at
    a load average of 1 or more is marked "measured under load" (the README's headline rows were measured near 6)."""
    paths = []
    for load, run in ((5.9, "busy"), (0.4, "quiet"), (None, "unknown")):
        info = {"cpu_model": "Test CPU", "threads": 2, "versions": {"torch": "2.x"}}
        if load is not None:
            info["load_average_1min"] = load
        path = str(tmp_path / f"{run}.json")
        doc = store.document([_row("fastdpot", 1.0, run=run, case=run), _row("reference", 3.0, run=run, case=run)],
                             machine_info=info)
        with open(path, "w") as f:
            json.dump(doc, f)
        paths.append(path)
    lines = {ln.split(" | ")[1]: ln for ln in render.table(store.load_rows(paths)).splitlines()
             if ln.startswith("| sliced") and "| fastdpot |" in ln}
    assert lines["busy"].endswith("| Test CPU, abc1234, load 5.9 at the start: measured under load |")
    assert lines["quiet"].endswith("| Test CPU, abc1234, load 0.4 at the start |")
    assert lines["unknown"].endswith("| Test CPU, abc1234 |")  # not recorded: nothing claimed


def test_the_benchmarks_page_holds_the_rendered_table():
    """docs/benchmarks.md shows what ``python -m bench.render`` makes of the stored results (re-render after adding
    results or changing the renderer), and says how the torch anchors draw their noise as bench.harness does."""
    with open(os.path.join(store.ROOT, "docs", "benchmarks.md")) as f:
        page = f.read()
    shown = page.split(render.START, 1)[1].split(render.END, 1)[0].strip("\n")
    assert shown == render.table(store.load_rows())
    assert "torch.randn" in page and "Philox normals in numpy" not in page


def test_the_stored_results_render():
    rows = store.load_rows()
    assert rows, "bench/results/ holds the stored measurements"
    text = render.table(rows, headline_only=True)
    for suite in ("flow", "sliced", "sinkhorn", "gpu_flow"):
        assert f"| {suite} |" in text


def test_pytest_bench_collects_the_suites_and_writes_the_stored_format(tmp_path):
    env = dict(os.environ, FASTDPOT_TREE_COMMIT="feedbee")
    out = tmp_path / "run.json"
    # python -m bench.<suite>: that suite's pytest-benchmark tests, by size index and impl (here: T = 20 000, refuse)
    cmd = [sys.executable, "-m", "bench.accounting", "--sizes", "0", "--impls", "refuse", "--json", str(out), "-q"]
    proc = subprocess.run(cmd, cwd=harness.ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["commit_info"]["id"] == "feedbee"
    assert doc["machine_info"]["threads"] == 2 and "torch" in doc["machine_info"]["versions"]
    (row,) = store.load_rows([str(out)])
    assert (row["suite"], row["case"], row["impl"], row["params"]) == ("accounting", "refuse", "fastdpot", {"T": 20000})
    assert row["repeats"] == 3 and "peak_mem_mb" in row and row["load_average"] is not None
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "bench/", "-k", "quick"],
                            cwd=harness.ROOT, capture_output=True, text=True, timeout=300).stdout
    for suite in ("test_sliced", "test_flow", "test_sinkhorn", "test_accounting"):
        assert f"bench/{suite}.py::" in listed
    import tomllib

    with open(os.path.join(harness.ROOT, "pyproject.toml"), "rb") as f:
        ini = tomllib.load(f)["tool"]["pytest"]["ini_options"]
    assert ini["testpaths"] == ["tests"]  # the default run never benchmarks: the suites live in bench/


def test_the_compiled_training_step_is_a_row_beside_the_eager_one(tmp_path):
    """Issue 40.7: suite ``sliced`` case ``step`` times a generator's training step with both losses eagerly and
    under torch.compile(fullgraph=True) (inductor); the renderer shows the compiled row with its ratio to the eager
    anchor, in one group."""
    out = tmp_path / "step.json"
    cmd = [sys.executable, "-m", "pytest", "bench/test_sliced.py", "--benchmark-only", "-q", "-p", "no:cacheprovider",
           "-k", "quick-step", f"--benchmark-json={out}"]
    env = dict(os.environ, FASTDPOT_TREE_COMMIT="feedbee", FASTDPOT_BENCH_THREADS="1")
    proc = subprocess.run(cmd, cwd=harness.ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = store.load_rows([str(out)])
    assert sorted((r["case"], r["impl"]) for r in rows) == [("step", "compiled"), ("step", "eager")]
    lines = [ln for ln in render.table(rows).splitlines() if ln.startswith("| sliced | step |")]
    compiled = [ln for ln in lines if "| compiled |" in ln]
    assert len(lines) == 2 and len(compiled) == 1 and "× eager" in compiled[0]
