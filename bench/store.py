"""The stored benchmark results: pytest-benchmark JSON documents in ``bench/results/``.

Every measurement of fastdpot -- the CPU suites run by pytest-benchmark (``bench/test_*.py``), the GPU scripts with
their CUDA-event timing (``bench.gpu_flow``, ``bench.gpu_sinkhorn``), and rows measured before the suites moved to
pytest-benchmark that the renderer still shows (``legacy-*.json``, converted from the former ``bench/results.jsonl``
with their own machine and commit) -- is one entry of a document in pytest-benchmark's ``--benchmark-json`` format:

* ``machine_info``: pytest-benchmark's fields plus ``cpu_model``, ``cores``, ``threads``, ``gpu``, ``versions``
  (torch, numpy, triton, pykeops, geomloss, POT, fastdpot) and ``load_average_1min`` at the start of the run;
* ``commit_info``: the measured commit (``id``; ``dirty`` for uncommitted changes to tracked files);
* ``benchmarks``: one entry per measurement, ``group`` = ``"<suite>/<case> <size>"`` (the anchors -- POT, GeomLoss,
  the torch reference -- are entries of the same group), ``stats`` (seconds: min, max, mean, median, iqr, ...,
  computed by pytest-benchmark's own :class:`~pytest_benchmark.stats.Stats` from the timed rounds) and
  ``extra_info``: suite, case, impl, params, mode, device, anchor, timing, ``peak_mem_mb`` and whatever else the
  script records (GPU: ms, modelled GB/s, ratios);
* ``records`` (fastdpot's addition, absent from pytest-benchmark's own files): measurements that are not timings of
  a benchmark (``bench.gpu_flow --api-run``: a whole flow run, ms per step).

So ``pytest-benchmark compare bench/results/A.json bench/results/B.json`` compares any two runs, and
``bench.render`` draws the tables from the entries (:func:`load_rows` flattens them into one dict per measurement).
"""
from __future__ import annotations

import datetime as _dt
import glob
import importlib
import json
import os
import platform
from typing import Any, Dict, Iterable, List, Optional

from fastdpot.env import cpu_model  # noqa: F401  (re-exported: harness and the GPU scripts import it here)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS_DIR = os.path.join(HERE, "results")
VERSION_MODULES = ["torch", "numpy", "triton", "pykeops", "geomloss", "ot", "fastdpot"]
#: fields of a row that live in machine_info / commit_info / stats rather than in extra_info
_RUN_FIELDS = ("machine", "versions", "threads", "git_rev", "run_id")
_STAT_FIELDS = ("median_s", "min_s", "max_s", "iqr_s", "repeats", "times_s")


# ------------------------------------------------------------------------------------------ machine and commit
def versions() -> Dict[str, Optional[str]]:
    """``{module: __version__}`` of the libraries a measurement depends on (None: not installed)."""
    out = {}
    for mod in VERSION_MODULES:
        try:
            out[mod] = getattr(importlib.import_module(mod), "__version__", "installed")
        except ImportError:
            out[mod] = None
    return out


def gpu_name() -> Optional[str]:
    """The first CUDA device's name, None without CUDA (or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine_extra(threads: int) -> Dict[str, Any]:
    """What fastdpot adds to pytest-benchmark's ``machine_info``: CPU model, cores, torch threads, GPU, versions."""
    info: Dict[str, Any] = {"cpu_model": cpu_model(), "cores": os.cpu_count(), "threads": threads,
                            "versions": versions(), "load_average_1min": START_LOAD}
    if gpu_name() is not None:
        info["gpu"] = gpu_name()
    return info


def _load() -> Optional[float]:
    """The 1-minute load average now (a busy machine slows every row; said in the results)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


#: the load when the benchmark session starts (bench/conftest.py imports this module first): pytest-benchmark asks
#: for ``machine_info`` when it writes its JSON, at the END of the session, when the suite's own threads have raised
#: the load to about their count (the rows before 2026-11-28 recorded that, named "at the start")
START_LOAD = _load()


def machine_label(machine_info: Dict[str, Any]) -> str:
    """A short name of the measuring machine: the GPU, else the CPU model (``machine_info`` of a document)."""
    return machine_info.get("gpu") or machine_info.get("cpu_model") or str(machine_info.get("cpu", {}).get(
        "brand_raw", "unknown"))


# ------------------------------------------------------------------------------------------ groups and stats
def size_label(params: Dict[str, Any]) -> str:
    """``n=1e+05, m=1e+05, d=48, k=500``: large round integers in scientific notation."""
    return ", ".join(f"{k}={v:.0e}" if isinstance(v, int) and not isinstance(v, bool) and v >= 10 ** 5
                     and v % 10 ** 5 == 0 else f"{k}={v}" for k, v in params.items())


def group_name(suite: str, case: str, params: Dict[str, Any]) -> str:
    """The pytest-benchmark group of a measurement: every impl and anchor of one case at one size."""
    return f"{suite}/{case} {size_label(params)}"


def stats_of(times: Iterable[float]) -> Dict[str, Any]:
    """pytest-benchmark's statistics of the timed rounds (seconds), as its JSON stores them (with ``data``)."""
    from pytest_benchmark.stats import Stats

    st = Stats()
    data = [float(t) for t in times]
    for t in data:
        st.update(t)
    out = st.as_dict()
    out.update(data=data, iterations=1)
    return out


def _legacy_stats(row: Dict[str, Any]) -> Dict[str, Any]:
    """Stats of a row measured before the rounds were kept: median, min, max, IQR and rounds; the rest None."""
    keys = ("mean", "stddev", "q1", "q3", "iqr_outliers", "stddev_outliers", "outliers", "ld15iqr", "hd15iqr", "ops",
            "total")
    out = dict.fromkeys(keys)
    out.update(min=row["min_s"], max=row["max_s"], median=row["median_s"], iqr=row["iqr_s"],
               rounds=row.get("repeats"), iterations=1, data=None)
    return out


# ------------------------------------------------------------------------------------------ rows <-> documents
def row_to_benchmark(row: Dict[str, Any]) -> Dict[str, Any]:
    """A measured row (the GPU scripts' dicts: suite, case, impl, params, mode, device, median_s, ..., ``times_s``
    when the rounds were kept) as one pytest-benchmark entry."""
    extra = {k: v for k, v in row.items() if k not in _RUN_FIELDS + _STAT_FIELDS}
    params = row.get("params", {})
    name = f"{row['suite']}[{row['case']}-{row['impl']}-{size_label(params)}-{row.get('mode', 'full')}]"
    stats = stats_of(row["times_s"]) if row.get("times_s") else _legacy_stats(row)
    return {"group": group_name(row["suite"], row["case"], params), "name": name, "fullname": f"bench/{name}",
            "params": {"impl": row["impl"], **params}, "param": row["impl"], "extra_info": extra,
            "options": {"timer": row.get("timing", "perf_counter"), "rounds": stats.get("rounds")}, "stats": stats}


def _timed(row) -> bool:
    """Whether a row is a timing (a benchmark entry) rather than a record."""
    return row.get("median_s") is not None or bool(row.get("times_s"))


def document(rows: List[Dict[str, Any]], machine_info: Optional[Dict[str, Any]] = None,
             commit: Optional[str] = None, when: Optional[str] = None) -> Dict[str, Any]:
    """A pytest-benchmark document of ``rows`` measured in one run (same machine and commit: the first row's
    ``machine``, ``versions``, ``threads`` and ``git_rev`` unless given). Rows without timings go to ``records``."""
    first = rows[0] if rows else {}
    if machine_info is None:
        m = dict(first.get("machine", {}))
        machine_info = {"node": None, "processor": m.get("cpu"), "machine": platform.machine(),
                        "python_version": m.get("python"), "system": m.get("platform"),
                        "cpu_model": m.get("cpu"), "cores": m.get("cores"), "threads": first.get("threads"),
                        "versions": first.get("versions", {})}
        if m.get("gpu"):
            machine_info["gpu"] = m["gpu"]
    rev = commit if commit is not None else first.get("tree_commit") or first.get("git_rev", "unknown")
    return {"machine_info": machine_info,
            "commit_info": {"id": rev.split("+")[0], "dirty": rev.endswith("+dirty"), "project": "fastdpot"},
            "benchmarks": [row_to_benchmark(r) for r in rows if _timed(r)],
            "records": [r for r in rows if not _timed(r)],
            "datetime": when or first.get("timestamp") or _dt.datetime.now().isoformat(timespec="seconds"),
            "version": _pytest_benchmark_version(), "run_id": first.get("run_id")}


def _pytest_benchmark_version() -> str:
    try:
        import pytest_benchmark

        return pytest_benchmark.__version__
    except ImportError:
        return "unknown"


def new_results_path(suite: str) -> str:
    """``bench/results/<suite>-<date>T<time>.json``: where a GPU script's run goes by default."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    return os.path.join(RESULTS_DIR, f"{suite}-{_dt.datetime.now().strftime('%Y%m%dT%H%M%S')}.json")


def append_row(path: str, row: Dict[str, Any]) -> None:
    """Add one row of a run to the document at ``path`` (created with the row's machine and commit if absent),
    rewritten whole, so that a run cut short keeps what it measured."""
    if os.path.exists(path) and os.path.getsize(path) > 0:  # an empty file (mktemp) starts a new document
        with open(path) as f:
            doc = json.load(f)
        if _timed(row):
            doc["benchmarks"].append(row_to_benchmark(row))
        else:
            doc.setdefault("records", []).append(row)
    else:
        doc = document([row])
    _dump(path, doc)


def write_rows(path: str, rows: List[Dict[str, Any]]) -> None:
    """Write the rows of one run as a pytest-benchmark document (through a temporary file)."""
    _dump(path, document(rows))


def _dump(path, doc):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def result_files(results_dir: str = RESULTS_DIR) -> List[str]:
    """The stored documents (``*.json`` in ``results_dir``), sorted by name."""
    return sorted(glob.glob(os.path.join(results_dir, "*.json")))


def load_rows(paths: Optional[Iterable[str]] = None) -> List[Dict[str, Any]]:
    """One dict per measurement of the documents at ``paths`` (default: :func:`result_files`): its ``extra_info``
    plus ``median_s``, ``iqr_s``, ``min_s``, ``max_s``, ``repeats`` (and ``times_s`` where the rounds were kept),
    ``run_id`` (one per document), ``git_rev``, ``machine`` (a label: GPU or CPU model), ``threads``, ``versions``,
    ``load_average`` (1 minute, at the start; None where not recorded), ``source`` (the file) and ``datetime``; the
    records too (they have no ``median_s``)."""
    rows = []
    for path in (result_files() if paths is None else paths):
        if os.path.getsize(path) == 0:  # a run in progress (pytest-benchmark creates its file first)
            continue
        with open(path) as f:
            doc = json.load(f)
        mi, ci = doc.get("machine_info", {}), doc.get("commit_info", {})
        rev = str(ci.get("id") or "unknown")[:7] + ("+dirty" if ci.get("dirty") else "")
        common = dict(run_id=doc.get("run_id") or os.path.basename(path), git_rev=rev, machine=machine_label(mi),
                      threads=mi.get("threads"), versions=mi.get("versions", {}), source=os.path.basename(path),
                      datetime=doc.get("datetime", ""), load_average=mi.get("load_average_1min"))
        for b in doc.get("benchmarks", []):
            st = b["stats"]
            row = dict(b.get("extra_info", {}), **common)
            row.update(median_s=st["median"], iqr_s=st["iqr"], min_s=st["min"], max_s=st["max"],
                       repeats=st.get("rounds"))
            if st.get("data"):
                row["times_s"] = st["data"]
            rows.append(row)
        rows += [dict(r, **common) for r in doc.get("records", [])]
    return rows


def convert_jsonl(path: str, out_dir: str = RESULTS_DIR, prefix: str = "legacy") -> List[str]:
    """Convert the former ``bench/results.jsonl`` (one JSON row per measurement, the harness's fields) into one
    document per run_id, ``<out_dir>/<prefix>-<suite>-<run_id>.json``, each with its run's machine and commit."""
    runs: Dict[str, List[Dict[str, Any]]] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                runs.setdefault(row["run_id"], []).append(row)
    out = []
    for run_id, rows in runs.items():
        p = os.path.join(out_dir, f"{prefix}-{rows[0]['suite']}-{run_id}.json")
        write_rows(p, rows)
        out.append(p)
    return out
