"""What every fastdpot benchmark shares: the :class:`Case`, timing and peak memory, and the run's fields.

* The CPU suites are pytest-benchmark tests (``bench/test_*.py``): :func:`run_benchmark` times a :class:`Case` with
  ``benchmark.pedantic`` (rounds of one call, the first call untimed: warm-up and peak memory), names its group
  (:func:`bench.store.group_name`: every impl and anchor of one case at one size) and fills ``extra_info`` (suite,
  case, impl, params, mode, device, anchor, peak MB). ``pytest bench/ --benchmark-only --benchmark-json=...``
  stores the run (``bench/conftest.py`` adds the machine, threads and versions).
* The GPU scripts (``bench.gpu_flow``, ``bench.gpu_sinkhorn``) time with CUDA events in-process and write the same
  format through :mod:`bench.store`; ``bench.gpu_flow --isolated`` runs each measurement in a fresh subprocess with
  :func:`run_suite` (:func:`measure`: wall clock with synchronisation).

Peak memory on CPU: the resident set's high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``) during
one call, above the resident set before it; on CUDA, ``torch.cuda.max_memory_allocated`` above the allocation before.

Modes: ``forward`` times ``case.forward(state)`` (under ``no_grad`` for the isolated runner); ``full`` times forward
+ backward together.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional

from . import store
from .store import ROOT, cpu_model, gpu_name, versions  # noqa: F401  (re-exported: the GPU scripts import them from here)

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Case:
    """One benchmarked computation.

    setup() -> state (inputs; not timed, not counted in peak memory); forward(state) -> output;
    backward(state, output) -> None (optional: None means forward-only); round_setup(state) -> None (optional:
    untimed, before every timed call, e.g. a fresh budget); info: facts the row records beside its measurement
    (``extra_info`` of the pytest-benchmark entry, e.g. the CPU's SIMD level).
    """
    setup: Callable[[], Any]
    forward: Callable[[Any], Any]
    backward: Optional[Callable[[Any, Any], Any]] = None
    device: str = "cpu"
    round_setup: Optional[Callable[[Any], None]] = None
    info: Optional[Dict[str, Any]] = None


# ------------------------------------------------------------------------------------------------ peak memory
def _status_kb(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _malloc_trim() -> None:
    """Give the allocator's free pages back to the system (glibc ``malloc_trim(0)``), so that a call which reuses
    memory an earlier one freed is charged for it as it would be in a fresh process."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_rss_mb(fn: Callable[[], Any]) -> Optional[float]:
    """MB of resident memory ``fn()`` needs above what is resident before it: the high-water mark ``VmHWM``, reset
    to the current resident set through ``/proc/self/clear_refs`` (Linux >= 4.0), minus that resident set, after
    the allocator's free pages went back to the system (:func:`_malloc_trim`). None where the mark cannot be reset
    (the process's earlier peak would hide this call's)."""
    gc.collect()
    _malloc_trim()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        fn()
        return None
    base = _status_kb("VmRSS")
    fn()
    hwm = _status_kb("VmHWM")
    if base is None or hwm is None:
        return None
    return round(max(0.0, (hwm - base) / 1024.0), 1)


# ------------------------------------------------------------------------------------------------ one call
def _sync(device):
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def call(case: Case, state, mode: str):
    """One call of ``case`` in ``mode`` (``forward`` or ``full``)."""
    if mode == "forward":
        import torch

        with torch.no_grad():
            return case.forward(state)
    if mode != "full":
        raise ValueError(f"mode must be forward or full, got {mode!r}")
    out = case.forward(state)
    if case.backward is not None:
        case.backward(state, out)
    return None


def run_benchmark(benchmark, case: Case, *, suite: str, name: str, impl: str, params: Dict[str, Any],
                  mode: str = "full", anchors: Iterable[str] = (), rounds: int = 3) -> None:
    """Time ``case`` with pytest-benchmark: one untimed call (warm-up, peak memory), then ``rounds`` timed rounds
    of one call each; the group, ``extra_info`` and the entry's name say what was measured."""
    state = case.setup()
    peak = peak_rss_mb(lambda: (case.round_setup(state) if case.round_setup else None, call(case, state, mode)))
    benchmark.group = store.group_name(suite, name, params)
    benchmark.extra_info.update(case.info or {})
    benchmark.extra_info.update(suite=suite, case=name, impl=impl, params=dict(params), mode=mode, device=case.device,
                                anchor=impl in tuple(anchors), peak_mem_mb=peak, timing="perf_counter")

    def setup():
        if case.round_setup is not None:
            case.round_setup(state)
        return (), {}

    benchmark.pedantic(lambda: call(case, state, mode), setup=setup, rounds=rounds, iterations=1, warmup_rounds=0)


# ------------------------------------------------------------------------------------------------ GPU scripts
def measure(case: Case, mode: str, repeats: int, warmup: int) -> Dict[str, Any]:
    """Time ``case`` in ``mode`` with synchronisation (``bench.gpu_flow --isolated``); returns the statistics, the
    rounds (``times_s``) and peak memory (MB above the post-setup baseline)."""
    import torch

    state = case.setup()
    cuda = case.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_mb()
    times = []
    for it in range(warmup + repeats):
        _sync(case.device)
        t0 = time.perf_counter()
        call(case, state, mode)
        _sync(case.device)
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20 if cuda else max(0.0, _maxrss_mb() - base)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "iqr_s": q[2] - q[0], "repeats": len(times), "peak_mem_mb": round(peak, 1), "times_s": times}


def machine_info() -> Dict[str, Any]:
    """The machine of a GPU script's rows: CPU model, cores, platform, Python, GPU name."""
    import platform

    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}
    if gpu_name() is not None:
        info["gpu"] = gpu_name()
    return info


def git_rev() -> str:
    """The measured tree's commit: ``$FASTDPOT_TREE_COMMIT`` when set (a copy whose ``.git`` is stale, e.g. the GPU
    machine's working-tree copy: the caller passes its own ``git rev-parse --short HEAD``), else ``git`` (short hash,
    ``+dirty`` with uncommitted changes to tracked files), else ``"unknown"``."""
    given = os.environ.get("FASTDPOT_TREE_COMMIT", "").strip()
    if given:
        return given
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_fields(suite: str, threads: int, note: str = "", **extra: Any) -> Dict[str, Any]:
    """Fields shared by every row of one GPU-script run: a fresh ``run_id``, ``suite``, ``git_rev`` (:func:`git_rev`),
    ``machine``, ``threads``, ``versions``, ``note``, then ``extra`` (e.g. ``timing``)."""
    return dict({"run_id": time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6], "suite": suite,
                 "git_rev": git_rev(), "machine": machine_info(), "threads": threads, "versions": versions(),
                 "note": note}, **extra)


def _child(args):
    """Subprocess entry point: measure one case and print one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    mod = importlib.import_module(args.module)
    case = mod.CASES[args.case](args.impl, **json.loads(args.params))
    res = measure(case, args.mode, args.repeats, args.warmup)
    res["device"] = case.device
    print("@@RESULT " + json.dumps(res), flush=True)


def run_suite(module: str, runs: Iterable[Dict[str, Any]], results_path: str, threads: int = 2, repeats: int = 3,
              warmup: int = 1, timeout: float = 1800.0, note: str = "") -> List[Dict[str, Any]]:
    """Run every entry of ``runs`` (dicts with keys case, impl, params, mode) in its own subprocess (peak memory of
    that measurement alone); each row is added to the document ``results_path`` (:func:`bench.store.append_row`)
    as it finishes; a failing or timed-out measurement is recorded with an ``error`` field. Returns the rows."""
    mod = importlib.import_module(module)
    common = run_fields(mod.SUITE, threads, note, timing="perf_counter + synchronize (isolated)")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    rows = []
    for r in runs:
        cmd = [sys.executable, "-m", "bench.harness", "--module", module, "--case", r["case"], "--impl", r["impl"],
               "--params", json.dumps(r.get("params", {})), "--mode", r.get("mode", "full"),
               "--threads", str(threads), "--repeats", str(r.get("repeats", repeats)),
               "--warmup", str(r.get("warmup", warmup))]
        row = dict(common, case=r["case"], impl=r["impl"], params=r.get("params", {}), mode=r.get("mode", "full"),
                   anchor=r.get("anchor"), timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT ")]
            if proc.returncode == 0 and lines:
                row.update(json.loads(lines[-1][len("@@RESULT "):]))
            else:
                row["error"] = (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1][:500]
        except subprocess.TimeoutExpired:
            row["error"] = f"timeout after {timeout:.0f}s"
        rows.append(row)
        store.append_row(results_path, row)
        status = row.get("error") or f"median {row['median_s']:.4f}s peak {row['peak_mem_mb']:.0f} MB"
        print(f"[{mod.SUITE}] {r['case']} {r.get('params', {})} {r['impl']} {row['mode']}: {status}", flush=True)
    return rows


def suite_main(test_module: str, argv=None) -> int:
    """``python -m bench.<suite> [--quick] [--sizes 0,1] [--impls a,b] [--json PATH] [pytest options]``: run that
    suite's pytest-benchmark tests (``test_module``, e.g. ``bench.test_sliced``) selected by size and impl.

    ``--quick``: the tiny sizes (a check); otherwise the full sizes (``--sizes``: indices among them), stored as
    ``bench/results/cpu-<suite>-<rev>.json`` unless ``--json`` names another file. ``--impls``: the tests whose
    parameters include one of these names. Other options go to pytest. Returns pytest's exit status."""
    import pytest

    mod = importlib.import_module(test_module)
    ap = argparse.ArgumentParser(description=f"the pytest-benchmark suite {test_module}")
    ap.add_argument("--quick", action="store_true", help="the tiny sizes: checks that every case runs")
    ap.add_argument("--sizes", default=None, help="comma-separated indices among the full sizes (default: all)")
    ap.add_argument("--impls", default=None, help="comma-separated impls (default: all)")
    ap.add_argument("--json", default=None, help="where to store the run (pytest-benchmark JSON)")
    args, rest = ap.parse_known_args(argv)
    full = list(dict.fromkeys(p[0] for p in mod.PARAMS if not p[0].startswith("quick")))
    if args.quick:
        sizes = {p[0] for p in mod.PARAMS if p[0].startswith("quick")}
    elif args.sizes:
        try:
            sizes = {full[int(i)] for i in args.sizes.split(",")}
        except (ValueError, IndexError):
            ap.error(f"--sizes takes indices in 0..{len(full) - 1} (sizes {full}), got {args.sizes!r}")
    else:
        sizes = set(full)
    impls = set(args.impls.split(",")) if args.impls else None
    path = mod.__file__.replace(ROOT + os.sep, "")
    fn = [n for n in dir(mod) if n.startswith("test_")][0]
    ids = [f"{path}::{fn}[{'-'.join(p)}]" for p in mod.PARAMS if p[0] in sizes and (impls is None or impls & set(p))]
    if not ids:
        ap.error("no test matches these sizes and impls")
    out = args.json or (None if args.quick else os.path.join(
        store.RESULTS_DIR, f"cpu-{fn[len('test_'):]}-{git_rev().split('+')[0]}.json"))
    return pytest.main(ids + ["--benchmark-only", "-p", "no:cacheprovider"]
                       + ([f"--benchmark-json={out}"] if out else []) + rest)


def main(argv=None):
    p = argparse.ArgumentParser(description="measure one case of a bench module (the isolated runner's child)")
    p.add_argument("--module", required=True)
    p.add_argument("--case", required=True)
    p.add_argument("--impl", required=True)
    p.add_argument("--params", default="{}")
    p.add_argument("--mode", default="full", choices=["forward", "full"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    _child(p.parse_args(argv))


if __name__ == "__main__":
    main()


def torch_noise(x, y, k, noise_std, seed=1234):
    """The torch anchors' noise: ``(noise_x (N, k), noise_y (M, k))`` from ``torch.randn`` on x's device (one
    generator per call, seeded), in x's dtype. The fastdpot backends draw keyed Philox normals inside their kernels
    (the ``reference`` backend replays those streams in float64 for the tests, which a user's torch code would not
    do); the anchors pay for the same amount of noise with torch's own generator."""
    import torch

    g = torch.Generator(device=x.device).manual_seed(seed)
    nx = torch.randn(x.shape[0], k, device=x.device, dtype=x.dtype, generator=g) * noise_std
    ny = torch.randn(y.shape[0], k, device=x.device, dtype=x.dtype, generator=g) * noise_std
    return nx, ny
