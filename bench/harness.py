"""The one benchmark harness every fastdpot benchmark uses.

A benchmark module defines ``SUITE`` (a name) and ``CASES``: ``{case_name: factory}`` where
``factory(impl, **params)`` returns a :class:`Case`. :func:`run_suite` runs every (case, params, impl, mode) in a
*fresh subprocess* -- so that peak memory (``ru_maxrss`` above the post-setup baseline on CPU,
``torch.cuda.max_memory_allocated`` on CUDA) belongs to that measurement alone -- with warm-up runs followed by
``repeats`` timed runs (median, min, max, interquartile range), and appends one JSON row per measurement to
``bench/results.jsonl`` with the machine, thread count, library versions and git revision. Ratios are only ever
computed between rows of the same ``run_id`` (measured side by side in one run) by ``bench/render.py``.

Modes: ``forward`` times ``case.forward(state)``; ``backward`` runs the forward untimed and times
``case.backward(state, out)``; ``full`` times forward + backward together.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results.jsonl")
VERSION_MODULES = ["torch", "numpy", "triton", "pykeops", "geomloss", "ot", "fastdpot"]


@dataclass
class Case:
    """One benchmarked computation.

    setup() -> state (inputs; not timed, not counted in peak memory); forward(state) -> output;
    backward(state, output) -> None (optional: None means forward-only).
    """
    setup: Callable[[], Any]
    forward: Callable[[Any], Any]
    backward: Optional[Callable[[Any, Any], Any]] = None
    device: str = "cpu"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _sync(device):
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def measure(case: Case, mode: str, repeats: int, warmup: int) -> Dict[str, Any]:
    """Time ``case`` in ``mode``; returns timing statistics and peak memory (MB above the post-setup baseline)."""
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
        if mode == "forward":
            _sync(case.device); t0 = time.perf_counter()
            with torch.no_grad():
                out = case.forward(state)
            _sync(case.device); dt = time.perf_counter() - t0
        elif mode == "backward":
            out = case.forward(state)
            _sync(case.device); t0 = time.perf_counter()
            case.backward(state, out)
            _sync(case.device); dt = time.perf_counter() - t0
        elif mode == "full":
            _sync(case.device); t0 = time.perf_counter()
            out = case.forward(state)
            if case.backward is not None:
                case.backward(state, out)
            _sync(case.device); dt = time.perf_counter() - t0
        else:
            raise ValueError(f"mode must be forward, backward or full, got {mode!r}")
        del out
        if it >= warmup:
            times.append(dt)
    if cuda:
        peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    else:
        peak = max(0.0, _maxrss_mb() - base)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "iqr_s": q[2] - q[0], "repeats": len(times), "peak_mem_mb": round(peak, 1)}


def machine_info() -> Dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def versions() -> Dict[str, str]:
    out = {}
    for mod in VERSION_MODULES:
        try:
            out[mod] = getattr(importlib.import_module(mod), "__version__", "installed")
        except ImportError:
            out[mod] = None
    return out


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


def _child(args):
    """Subprocess entry point: measure one case and print one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    mod = importlib.import_module(args.module)
    params = json.loads(args.params)
    case = mod.CASES[args.case](args.impl, **params)
    res = measure(case, args.mode, args.repeats, args.warmup)
    res["device"] = case.device
    print("@@RESULT " + json.dumps(res), flush=True)


def run_fields(suite: str, threads: int, note: str = "", **extra: Any) -> Dict[str, Any]:
    """Fields shared by every row of one run: a fresh ``run_id``, ``suite``, ``git_rev`` (:func:`git_rev`),
    ``machine``, ``threads``, ``versions``, ``note``, then ``extra`` (e.g. ``timing``)."""
    return dict({"run_id": time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6], "suite": suite,
                 "git_rev": git_rev(), "machine": machine_info(), "threads": threads, "versions": versions(),
                 "note": note}, **extra)


def run_suite(module: str, runs: Iterable[Dict[str, Any]], threads: int = 2, repeats: int = 3, warmup: int = 1,
              results_path: str = RESULTS, timeout: float = 1800.0, note: str = "") -> List[Dict[str, Any]]:
    """Run every entry of ``runs`` (dicts with keys case, impl, params, mode) in its own subprocess.

    Rows are appended to ``results_path`` as they finish; a failing or timed-out measurement is recorded with
    an ``error`` field instead of stopping the suite. Returns the rows.
    """
    mod = importlib.import_module(module)
    common = run_fields(mod.SUITE, threads, note)
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
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT ")]
            if proc.returncode == 0 and lines:
                row.update(json.loads(lines[-1][len("@@RESULT "):]))
            else:
                row["error"] = (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1][:500]
        except subprocess.TimeoutExpired:
            row["error"] = f"timeout after {timeout:.0f}s"
        row["wall_s"] = round(time.time() - t0, 2)
        rows.append(row)
        with open(results_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        status = row.get("error") or f"median {row['median_s']:.4f}s peak {row['peak_mem_mb']:.0f} MB"
        print(f"[{mod.SUITE}] {r['case']} {r.get('params', {})} {r['impl']} {row['mode']}: {status}", flush=True)
    return rows


def suite_main(module: str, description: str, full_sizes, quick_sizes, make_runs, default_impls, argv=None):
    """The command line every bench module shares: ``--quick`` (tiny sizes, rows to a temporary file, not to
    bench/results.jsonl), ``--impls``, ``--sizes`` (indices into the size list), ``--threads``, ``--repeats``,
    ``--note``, ``--results``.

    ``make_runs(sizes, impls, repeats)`` returns the run entries passed to :func:`run_suite`.
    """
    import tempfile

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: check that every case runs")
    ap.add_argument("--impls", default=",".join(default_impls), help="comma-separated subset")
    ap.add_argument("--sizes", default=None, help="comma-separated indices into the size list (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--note", default="")
    ap.add_argument("--results", default=None,
                    help="results file (default: bench/results.jsonl; --quick writes to a temporary file)")
    args = ap.parse_args(argv)
    sizes = quick_sizes if args.quick else full_sizes
    if args.sizes:
        try:
            sizes = [sizes[int(i)] for i in args.sizes.split(",")]
        except (ValueError, IndexError):
            ap.error(f"--sizes takes indices in 0..{len(sizes) - 1}, got {args.sizes!r}")
    impls = tuple(s.strip() for s in args.impls.split(",") if s.strip())
    results = args.results or (os.path.join(tempfile.gettempdir(), "fastdpot_bench_quick.jsonl") if args.quick
                               else RESULTS)
    return run_suite(module, make_runs(sizes, impls, args.repeats), threads=args.threads, repeats=args.repeats,
                     note=args.note or ("quick" if args.quick else ""), results_path=results)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--module", required=True)
    p.add_argument("--case", required=True)
    p.add_argument("--impl", required=True)
    p.add_argument("--params", default="{}")
    p.add_argument("--mode", default="full", choices=["forward", "backward", "full"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    _child(p.parse_args(argv))


if __name__ == "__main__":
    main()
