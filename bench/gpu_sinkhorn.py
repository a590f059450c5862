"""GPU benchmark of fastdpot's Sinkhorn (op ``"sinkhorn"``) against GeomLoss' KeOps solver, on the same GPU.

The problem, the implementations, their shared ε schedule and the inputs are :mod:`bench.gpu_sinkhorn_cases`'s;
this module times them and records the rows.

Timing: CUDA events around each call. KeOps compiles each formula on first use, so every (implementation, d,
mode) first runs once on the first 2 000 rows of its first case (same D, s): that call's wall time (compile
included) is printed and stored as ``warmup_s``. Then, at full size, a first call (``first_call_ms``) that is
discarded when under 0.5 s, followed by repeats (at least 3, until 1 s, at most 10); calls of 0.5-3 s are run
twice and both kept, longer ones once. Peak memory: ``torch.cuda.max_memory_allocated`` increase above the inputs.
TF32 is off (the dense engine's ‖x‖² + ‖y‖² − 2x·y matmul stays float32). On CPU (``--smoke``): host clock and
the process' max-RSS increase.

Published reference (not measured here): FlashSinkhorn's figures, A100, d = 64, 100 iterations: 61 ms at
n = 1e4 and 1450 ms at n = 5e4 (printed under the table for context only; another GPU and another code).

``--budget-s S``: no new case starts after S seconds (counted from the start of ``main``), and a measurement
whose predicted time (from the same implementation at the smaller n, scaled by (n/n₀)²) would end after S is
skipped; rows are appended as they are measured, so an interrupted run keeps them.

Usage (CUDA machine): ``python -m bench.gpu_sinkhorn [--budget-s 90] [--results PATH] [--table PATH]``, or
``bash scripts/gpu_sinkhorn.sh`` (installs the KeOps/GeomLoss wheels from .whl/ first). Without CUDA it prints a
message and exits 0. ``--smoke``: tiny sizes on CPU (KeOps CPU and the dense engine; the times mean nothing),
rows to a temporary file; exits 1 when a measurement fails, the soft-min counts differ or the values disagree.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch

from . import harness, store

# KeOps reads its cache folder at import: set it before anything imports pykeops
os.environ.setdefault("KEOPS_CACHE_FOLDER", os.path.join(harness.ROOT, ".cache", "keops"))

# the suite's problem and implementations (imported after KEOPS_CACHE_FOLDER is set; they import KeOps lazily); the
# names the suite's tests read stay reachable from here
from .gpu_sinkhorn_cases import (ANCHORS, BLUR, CASE, IMPLS, ITERATIONS, anchor_of, count_softmins,  # noqa: E402,F401
                                 diameter_of, geomloss_schedule_len, impls_for, inputs, make_impl, plan, schedule_for)

SUITE = "gpu_sinkhorn"
WARM_N = 2000
#: FlashSinkhorn's published figures (A100, d = 64, 100 iterations), in ms: context only, never measured here
PUBLISHED_FLASHSINKHORN_MS = {10_000: 61.0, 50_000: 1450.0}


def _call(f, x, y, mode):
    if mode == "full":
        x.grad = None
        y.grad = None
        out = f(x, y)
        out.backward()
        return out
    return f(x, y)


def _sync(cuda):
    if cuda:
        torch.cuda.synchronize()


def time_calls(f, x, y, mode, cuda):
    """Warm-up/repeat policy of the module doc; returns timing statistics (seconds), peak MB and the value."""

    def once():
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = _call(f, x, y, mode)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3, out
        t0 = time.perf_counter()
        out = _call(f, x, y, mode)
        return time.perf_counter() - t0, out

    _sync(cuda)
    if cuda:
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = harness._maxrss_mb()
    first, out = once()
    value = float(out.detach())
    del out
    if first < 0.5:
        times, t_start = [], time.perf_counter()
        while len(times) < 10 and (len(times) < 3 or time.perf_counter() - t_start < 1.0):
            times.append(once()[0])
    elif first < 3.0:
        times = [first, once()[0]]
    else:
        times = [first]
    if cuda:
        peak = round((torch.cuda.max_memory_allocated() - base) / 2 ** 20, 1)
    else:
        peak = round(max(0.0, harness._maxrss_mb() - base), 1)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "iqr_s": q[2] - q[0],
            "repeats": len(times), "first_call_ms": round(first * 1e3, 3), "peak_mem_mb": peak, "value": value,
            "times_s": times}


def predicted_s(done, impl, n, d, mode):
    """Predicted wall time of one measurement from a smaller-n row of the same (impl, d, mode) -- else a row of the
    other mode, n₀ ≤ n --: the median scaled by (n/n₀)², times the number of calls the repeat policy makes at that
    duration (None: no estimate)."""
    prev = [r for r in done if r["impl"] == impl and r["d"] == d and r["mode"] == mode and "median_s" in r
            and r["n"] < n]
    if not prev:  # the other mode (forward vs forward + backward: about the same number of reductions)
        prev = [r for r in done if r["impl"] == impl and r["d"] == d and "median_s" in r and r["n"] <= n]
    if not prev:
        return None
    r = max(prev, key=lambda r: r["n"])
    t = r["median_s"] * (n / r["n"]) ** 2
    return t * (1 if t >= 3.0 else 2) if t >= 0.5 else max(4 * t, 1.0 + t)


def keops_status():
    """(gpu_available, message) of pykeops, importing it once (the first CUDA import builds KeOps' nvrtc binder)."""
    try:
        from fastdpot._ext import import_pykeops

        import_pykeops()
        import pykeops
        import pykeops.torch  # noqa: F401
        from keopscore.config import cuda_config

        return bool(pykeops.config.gpu_available), getattr(cuda_config, "cuda_message", "") or ""
    except Exception as exc:  # reported, then every KeOps row records its own error
        return None, f"{type(exc).__name__}: {exc}"


def _run_fields(note, timing, iterations):
    return harness.run_fields(SUITE, torch.get_num_threads(), note, timing=timing, case=CASE, dtype="float32",
                              blur=BLUR, epsilon=BLUR ** 2, cost="0.5*|x-y|^2", debias=False, iterations=iterations)


def run(cases, results_path, device, note="", budget_s=None, t_begin=None, iterations=ITERATIONS, rows=None,
        impls=None):
    """Measure ``cases`` [(n, d, mode)] on ``device``; append one row per measurement to ``results_path`` and to
    ``rows`` (a fresh list when None, so that a caller keeps the rows of an interrupted run); return the rows.
    ``impls``: a subset of ``IMPLS`` (None: all that apply, see :func:`impls_for`)."""
    t_begin = time.perf_counter() if t_begin is None else t_begin
    cuda = device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    common = _run_fields(note, "cuda_events" if cuda else "perf_counter (CPU smoke run)", iterations)
    rows = [] if rows is None else rows
    warmed, broken = set(), {}

    def elapsed():
        return time.perf_counter() - t_begin

    for n, d, mode in cases:
        m = n
        if budget_s is not None and elapsed() > budget_s:
            print(f"[{SUITE}] time budget of {budget_s:.0f} s spent after {elapsed():.0f} s; not starting "
                  f"n={n} d={d} {mode} and the cases after it", flush=True)
            break
        x0, y0 = inputs(n, m, d, device)
        diam = diameter_of(x0, y0)
        scaling, eps_list = schedule_for(diam, BLUR, iterations)
        g_len = geomloss_schedule_len(diam, scaling)
        if g_len is not None and g_len != len(eps_list):
            print(f"[{SUITE}] WARNING: GeomLoss' ε list has {g_len} values, fastdpot's {len(eps_list)}", flush=True)
        x = x0.clone().requires_grad_(mode == "full")
        y = y0.clone().requires_grad_(mode == "full")
        anchors = {}
        for impl, backend in impls_for(n, m, d, device, impls):
            key = (impl, d, mode)
            tag = f"[{SUITE}] n={n:<6d} d={d:<3d} {mode:7s} {impl:20s}"
            if key in broken:
                print(f"{tag} skipped (failed before: {broken[key][:120]})", flush=True)
                continue
            pred = predicted_s(rows, impl, n, d, mode)
            if budget_s is not None and pred is not None and elapsed() + pred > budget_s:
                print(f"{tag} skipped: predicted {pred:.1f} s, {max(budget_s - elapsed(), 0):.0f} s of the budget "
                      "left", flush=True)
                continue
            if budget_s is not None and key not in warmed and budget_s - elapsed() < 10:
                print(f"{tag} skipped: under 10 s of the budget left for its first (compiling) call", flush=True)
                continue
            row = dict(common, impl=impl, backend=backend, params=dict(n=n, m=m, d=d), n=n, m=m, d=d, mode=mode,
                       device=device, anchor=anchor_of(impl), diameter=diam, scaling=scaling, eps_steps=len(eps_list),
                       timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
            if g_len is not None:
                row["geomloss_eps_steps"] = g_len
            try:
                f = make_impl(impl, diam, scaling)
                if key not in warmed:
                    w = min(WARM_N, n)
                    xw = x0[:w].clone().requires_grad_(mode == "full")
                    yw = y0[:w].clone().requires_grad_(mode == "full")
                    _sync(cuda)
                    t0 = time.perf_counter()
                    with count_softmins() as counter:
                        _call(f, xw, yw, mode)
                    _sync(cuda)
                    row["warmup_s"] = round(time.perf_counter() - t0, 3)
                    row["warmup_n"] = w
                    row["softmin_calls"] = counter[0]
                    warmed.add(key)
                    print(f"{tag} first call ({w} points, compilation included): {row['warmup_s']:.2f} s; "
                          f"{counter[0]} soft-min reductions (expected {2 * iterations})", flush=True)
                    del xw, yw
                row.update(time_calls(f, x, y, mode, cuda))
                row["ms"] = round(row["median_s"] * 1e3, 4)
            except Exception as err:  # e.g. KeOps unusable, out of memory: record, go on
                msg = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}"
                row["error"] = msg
                broken[key] = msg
                traceback.print_exc(limit=3)
            finally:
                if cuda:
                    torch.cuda.empty_cache()
            anchor = anchors.get(row["anchor"])
            if impl in ANCHORS:
                anchors[impl] = row if "median_s" in row else None
            elif anchor is not None and "median_s" in row:
                row["ratio_to_geomloss"] = round(anchor["median_s"] / row["median_s"], 3)
                row["rel_diff_to_geomloss"] = abs(row["value"] - anchor["value"]) / max(abs(anchor["value"]), 1e-30)
            if n in PUBLISHED_FLASHSINKHORN_MS and d == 64 and iterations == 100:
                row["published_flashsinkhorn_a100_ms"] = PUBLISHED_FLASHSINKHORN_MS[n]
            rows.append(row)
            store.append_row(results_path, row)
            if "error" in row:
                status = "ERROR " + row["error"]
            else:
                peak = "" if row["peak_mem_mb"] is None else f"  peak {row['peak_mem_mb']:.0f} MB"
                ratio = row.get("ratio_to_geomloss")
                status = (f"{row['ms']:10.2f} ms  (x{row['repeats']}, first {row['first_call_ms']:.1f} ms){peak}"
                          f"  value {row['value']:.6g}" + ("" if ratio is None else f"  {ratio:.2f}x GeomLoss"))
            print(f"{tag} [{backend}] {status}", flush=True)
        del x, y, x0, y0
    return rows


def _fmt_n(n):
    return f"1e{len(str(n)) - 1}" if str(n).strip("0") == "1" else (f"{n / 10 ** 4:g}e4" if n % 10 ** 4 == 0 else str(n))


def markdown_table(rows):
    """The run's table: impl, backend, n, d, mode, ms, peak MB, GeomLoss ms / impl ms."""
    if not rows:
        return "(no rows measured)"
    r0 = rows[0]
    m, v = r0["machine"], r0["versions"]
    head = (f"Device: {m.get('gpu') or m.get('cpu')}; torch {v.get('torch')}, pykeops {v.get('pykeops')}, "
            f"geomloss {v.get('geomloss')}; git {r0['git_rev']}; {r0['timing']}. OT_ε (debias=False), float32, "
            f"cost ½‖x−y‖², blur {BLUR}, {r0['iterations']} soft-min pairs (same ε list in every impl).\n\n"
            "| impl | backend | n | d | mode | ms | peak MB | × GeomLoss (its ms / this ms) |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['impl']} | {r['backend']} | {_fmt_n(r['n'])} | {r['d']} | {r['mode']} | "
                         f"error: {r['error'][:60]} | | |")
            continue
        ratio = r.get("ratio_to_geomloss")
        peak = "" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.0f}"
        lines.append(f"| {r['impl']} | {r['backend']} | {_fmt_n(r['n'])} | {r['d']} | {r['mode']} | {r['ms']:.2f} | "
                     f"{peak} | {'1 (anchor)' if r['impl'] in ANCHORS else '' if ratio is None else f'{ratio:.2f}'} |")
    lines.append("")
    lines.append("Published, not measured here: FlashSinkhorn's figures, A100, d = 64, 100 iterations: "
                 + ", ".join(f"n = {_fmt_n(n)}: {ms:g} ms" for n, ms in PUBLISHED_FLASHSINKHORN_MS.items())
                 + " (another GPU and another code: context, not a ratio).")
    return "\n".join(lines)


def smoke_problems(rows, iterations):
    """What makes a --smoke run fail: errors, soft-min counts other than 2·iterations, values that disagree."""
    bad = []
    for r in rows:
        if "error" in r:
            bad.append(f"{r['impl']} n={r['n']} d={r['d']} {r['mode']}: {r['error']}")
        if "softmin_calls" in r and r["softmin_calls"] != 2 * iterations:
            bad.append(f"{r['impl']} d={r['d']} {r['mode']}: {r['softmin_calls']} soft-min reductions, "
                       f"expected {2 * iterations}")
        if r.get("rel_diff_to_geomloss") is not None and not r["rel_diff_to_geomloss"] < 1e-3:
            bad.append(f"{r['impl']} n={r['n']} d={r['d']} {r['mode']}: value {r['value']} differs from GeomLoss' "
                       f"by {r['rel_diff_to_geomloss']:.2e} (relative)")
        if r.get("geomloss_eps_steps") is not None and r["geomloss_eps_steps"] != r["eps_steps"]:
            bad.append(f"n={r['n']} d={r['d']}: ε lists of {r['eps_steps']} and {r['geomloss_eps_steps']} values")
    return bad


def main(argv=None):
    t_begin = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (KeOps CPU / dense engine)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="no new case after this many seconds; skip measurements predicted to end past it")
    ap.add_argument("--results", default=None,
                    help="results document (pytest-benchmark JSON, bench.store; entries added; default "
                         "bench/results/gpu_sinkhorn-<date>.json, a temporary file for --smoke)")
    ap.add_argument("--table", default=None, help="also write the markdown table of this run to this file")
    ap.add_argument("--note", default="")
    ap.add_argument("--iterations", type=int, default=ITERATIONS,
                    help="soft-min pairs per solve (ε list of iterations - 2 values; default 100)")
    ap.add_argument("--modes", default="forward,full", help="comma-separated subset of forward,full")
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help="comma-separated subset of the implementations (default: every one that applies)")
    ap.add_argument("--only", action="append", default=None, metavar="n,d",
                    help="measure only these sizes (repeatable) instead of n in {1e4, 5e4} x d in {64, 2}")
    args = ap.parse_args(argv)
    modes = tuple(s.strip() for s in args.modes.split(",") if s.strip())
    if not modes or any(mo not in ("forward", "full") for mo in modes):
        ap.error(f"--modes takes forward and/or full, got {args.modes!r}")
    impls = tuple(s.strip() for s in args.impls.split(",") if s.strip())
    if not impls or any(i not in IMPLS for i in impls):
        ap.error(f"--impls takes a subset of {','.join(IMPLS)}, got {args.impls!r}")
    only = None
    if args.only:
        try:
            only = [tuple(int(float(v)) for v in o.split(",")) for o in args.only]
            assert all(len(p) == 2 for p in only)
        except (ValueError, AssertionError):
            ap.error(f"--only takes n,d, got {args.only!r}")

    if args.smoke:
        device = "cpu"
        # torch's and KeOps' OpenMP runtimes spin against each other on a small CPU: one torch thread keeps the
        # smoke run short (its times mean nothing anyway)
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        print("bench.gpu_sinkhorn: no CUDA device here; nothing measured (run it on a GPU machine, e.g. "
              "`bash scripts/gpu_sinkhorn.sh`; `--smoke` checks the script on CPU).")
        return 0
    else:
        device = "cuda"
    if args.results is None:
        args.results = (os.path.join(tempfile.gettempdir(), "fastdpot_gpu_sinkhorn_smoke.json") if args.smoke
                        else store.new_results_path(SUITE))

    t0 = time.perf_counter()
    gpu_ok, msg = keops_status()
    print(f"[{SUITE}] pykeops import {time.perf_counter() - t0:.1f} s; KeOps GPU: {gpu_ok}"
          + (f" ({msg})" if msg else "") + f"; KEOPS_CACHE_FOLDER={os.environ.get('KEOPS_CACHE_FOLDER')}",
          flush=True)
    if device == "cuda":
        print(f"[{SUITE}] {torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda})",
              flush=True)
    rows = []
    try:
        run(plan(args.smoke, only, modes), args.results, device, note=args.note, budget_s=args.budget_s,
            t_begin=t_begin, iterations=args.iterations, rows=rows, impls=impls)
    except KeyboardInterrupt:  # e.g. the caller's `timeout -s INT`: keep what was measured
        print(f"\n[{SUITE}] interrupted; the {len(rows)} rows measured so far are in {args.results}", flush=True)
    table = markdown_table(rows)
    print(table)
    if args.table:
        with open(args.table, "w") as fh:
            fh.write(table + "\n")
    print(f"[{SUITE}] {len(rows)} rows in {args.results}; {time.perf_counter() - t_begin:.1f} s in all", flush=True)
    if args.smoke:
        bad = smoke_problems(rows, args.iterations)
        for b in bad:
            print(f"[{SUITE}] SMOKE FAILURE: {b}")
        return 1 if bad or not rows else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
