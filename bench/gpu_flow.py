"""GPU benchmark of the Triton kernels: one DP sliced-Wasserstein flow step and the DP-SWD loss (forward + backward)
against the torch reference on the same GPU.

The cases, sizes, implementations and anchors are :mod:`bench.gpu_flow_cases`'s (``--compiled all`` /
``--dpswd-only``: the ``reference_compiled`` anchor at other sizes than N = 1e6, d = 48, k = 128). Compilation of
that anchor happens in the first, untimed warm-up call (its wall time is the row's ``compile_s``; ``graph_breaks``
counts Dynamo's graph breaks); a failure to compile (no compiler, Inductor error) is recorded as a row with
``error``. Targets: ``triton`` >= 3x ``reference`` and >= 1.5x ``reference_compiled`` at N = 1e6, d = 48, k = 128.

Timing: CUDA events around each call after warm-up runs, median (and IQR) of repeated runs (as many as fit in
about two seconds, at least 5 -- 3 for calls over a second, i.e. the reference at N = 1e7 -- and at most 50), TF32
disabled for the reference's matmuls. Peak memory: the
``torch.cuda.max_memory_allocated`` increase above the inputs during the timed calls. A measurement that runs out
of memory is recorded with ``error``.

Achieved GB/s is a *modelled lower bound*: bytes that any implementation must move (each input row read once, the
new particles and drift -- or the gradient -- written once, and the N k projected values written and read once)
divided by the median time. The real traffic of a sort is several times larger, so the figure understates the
bandwidth used; it is comparable across implementations of the same case.

Rows go to a pytest-benchmark document (:mod:`bench.store`: the format of the CPU suites; default
``bench/results/gpu_flow-<date>.json``, machine with GPU name, torch/Triton versions, git revision; the timed
rounds in ``stats``) with extra fields ``ms``, ``gbps``, ``ratio_to_reference``, ``ratio_to_compiled`` (the
``reference_compiled`` median over this row's, where that anchor was measured for the same size) and
``timing="cuda_events"``; ``python -m bench.render`` puts them in the README table. ``--isolated`` instead runs every case through
``bench.harness.run_suite`` (one subprocess per measurement, wall-clock timing with synchronisation).

Usage (on a CUDA machine): ``python -m bench.gpu_flow [--quick] [--results PATH]``. Without CUDA it prints a
message and exits with status 0. ``--smoke`` runs tiny sizes on CPU under ``TRITON_INTERPRET=1`` (checks that the
script works; the times mean nothing; ``--compiled none`` skips the torch.compile row, whose CPU compilation takes
10-20 s). ``--dpswd-only N,d,k`` (repeatable) times only the DP-SWD loss, for ``triton``, ``reference`` and
``reference_compiled``, at those sizes: ``python -m bench.gpu_flow --dpswd-only 1e6,48,128``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from . import harness, store
# the suite's cases; CASES is what bench.harness.run_suite runs in its subprocesses (--isolated), and ANCHORS,
# TARGET_DPSWD, _dpswd_case stay reachable from here for the suite's tests
from .gpu_flow_cases import (ANCHORS, CASES, COMPILED, HISTOGRAM_BINS, M_PRIVATE, MAX_REFERENCE_N,  # noqa: F401
                             TARGET_DPSWD, _dpswd_case, _impls, _sizes, _wants_compiled, modelled_bytes)
from .harness import Case

SUITE = "gpu_flow"


def _time_case(case: Case, full: bool, use_events: bool, budget_s=2.0, min_rep=5, max_rep=50, compiled=False):
    """Warm-up, then timed repeats (module doc). ``compiled``: the first call compiles; it is timed as
    ``compile_s``, and the second warm-up call (not the first) decides whether the call is slow."""
    state = case.setup()
    cuda = use_events

    def once():
        out = case.forward(state)
        if full and case.backward is not None:
            case.backward(state, out)
        return out

    extra = {}
    if compiled:
        from torch._dynamo.utils import counters

        breaks0 = sum(counters["graph_break"].values())
        t0 = time.perf_counter()
        once()  # torch.compile: Dynamo tracing, Inductor code generation, forward and backward
        if cuda:
            torch.cuda.synchronize()
        extra = {"compile_s": round(time.perf_counter() - t0, 2),
                 "graph_breaks": sum(counters["graph_break"].values()) - breaks0}
    t0 = time.perf_counter()
    once()  # warm-up (includes Triton JIT compilation)
    if cuda:
        torch.cuda.synchronize()
    if time.perf_counter() - t0 < 1.0:  # a second warm-up and the usual repeats; slow calls: 3 repeats
        once()
    else:
        min_rep = 3
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    times = []
    t_start = time.perf_counter()
    while len(times) < max_rep and (len(times) < min_rep or time.perf_counter() - t_start < budget_s):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            once()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
    peak = round((torch.cuda.max_memory_allocated() - base) / 2 ** 20, 1) if cuda else None
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    del state
    return dict({"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                 "iqr_s": q[2] - q[0], "repeats": len(times), "peak_mem_mb": peak, "times_s": times}, **extra)


def _run_fields(note, timing):
    """Fields shared by every row of one run (:func:`bench.harness.run_fields`) and its ``timing``."""
    return harness.run_fields(SUITE, torch.get_num_threads(), note, timing=timing)


def run_events(sizes, results_path, device, note="", budget_s=None, cases=None, compiled="target"):
    """In-process measurement with CUDA events (CPU: perf_counter, smoke only); appends rows, returns them.

    ``budget_s``: stop starting new sizes once this many seconds have passed (the rows so far are kept).
    ``cases``: the case names to measure (default: all of ``CASES``). ``compiled``: at which DP-SWD sizes to add the
    ``reference_compiled`` anchor: ``"target"`` (N = 1e6, d = 48, k = 128 only; each new shape compiles again),
    ``"all"`` or ``"none"``."""
    t_begin = time.time()
    common = _run_fields(note, "cuda_events" if device == "cuda" else "perf_counter (TRITON_INTERPRET smoke run)")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    rows = []
    for params in sizes:
        if budget_s is not None and time.time() - t_begin > budget_s:
            print(f"[{SUITE}] time budget of {budget_s:.0f} s spent; skipping {params} and the sizes after it",
                  flush=True)
            break
        for case_name, factory in CASES.items():
            if cases is not None and case_name not in cases:
                continue
            by_impl = {}
            impls = _impls(case_name, params["N"], case_name == "dpswd" and _wants_compiled(params, compiled))
            full = case_name != "flow_step"
            for impl in impls:
                row = dict(common, case=case_name, impl=impl, params=params,
                           mode="full" if full else "forward", device=device,
                           anchor="reference_hist" if impl.endswith("_hist") else "reference",
                           timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
                try:
                    res = _time_case(factory(impl, device=device, **params), full, device == "cuda",
                                     compiled=impl == COMPILED)
                    row.update(res)
                    row["ms"] = round(res["median_s"] * 1e3, 4)
                    row["gbps"] = round(modelled_bytes(case_name, **params) / res["median_s"] / 1e9, 2)
                    by_impl[impl] = row
                except torch.cuda.OutOfMemoryError as err:
                    row["error"] = f"out of memory: {str(err).splitlines()[0][:300]}"
                except RuntimeError as err:  # e.g. a CUB allocation failure inside torch.sort: record, go on
                    row["error"] = f"{type(err).__name__}: {_first_line(err)}"
                except Exception as err:  # torch.compile failures come in many types: record, go on
                    if impl != COMPILED:
                        raise
                    row["error"] = f"{type(err).__name__}: {_first_line(err)}"
                if impl == COMPILED and "error" in row:
                    torch._dynamo.reset()  # forget a half-built compilation
                if device == "cuda":
                    torch.cuda.empty_cache()
                rows.append(row)
            compiled_row = by_impl.get(COMPILED)
            for impl, row in by_impl.items():
                anchor = by_impl.get(row["anchor"])
                if anchor is not None and impl != row["anchor"] and (impl == COMPILED
                                                                     or not impl.startswith("reference")):
                    row["ratio_to_reference"] = round(anchor["median_s"] / row["median_s"], 2)
                if compiled_row is not None and not impl.startswith("reference"):
                    row["ratio_to_compiled"] = round(compiled_row["median_s"] / row["median_s"], 2)
            for row in rows[-len(impls):]:
                store.append_row(results_path, row)
                status = row.get("error") or (f"{row['ms']:.3f} ms  {row['gbps']:.1f} GB/s  "
                                              f"peak {row['peak_mem_mb']} MB  "
                                              f"x{row.get('ratio_to_reference', float('nan')):.1f} vs ref"
                                              + (f"  x{row['ratio_to_compiled']:.2f} vs compiled"
                                                 if "ratio_to_compiled" in row else "")
                                              + (f"  (compile {row['compile_s']} s, {row['graph_breaks']} graph "
                                                 "breaks)" if "compile_s" in row else ""))
                print(f"[{SUITE}] {case_name:9s} {params} {row['impl']:18s} {status}", flush=True)
    return rows


def _first_line(err):
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else repr(err))[:300]


def api_run(N, d, k, steps, results_path, device, note="", quantiles="exact", histogram_bins=None):
    """A private DPSWflow-r run through the public API (``DPSlicedWassersteinFlow.run``) on ``device``: N particles
    in d dimensions (CelebA latent shape: d = 48), k directions, ``steps`` steps at (ε, δ) = (10, 1e-5) on a
    synthetic private set of unit-sphere rows (B = 250 per step). Records the wall time per step (host clock with
    synchronisation; sampling, accounting and the kernel call included), peak device memory and ε spent."""
    from fastdpot.flows import DPSlicedWassersteinFlow

    g = torch.Generator().manual_seed(0)
    private = torch.randn(50_000, d, generator=g)
    private /= private.norm(dim=1, keepdim=True)
    flow = DPSlicedWassersteinFlow(N, d, k, step_size=1.0, diffusion=1e-4, target_epsilon=10.0, delta=1e-5,
                                   batch_size=M_PRIVATE, steps=steps, quantiles=quantiles, histogram_bins=histogram_bins,
                                   generator=torch.Generator().manual_seed(1), device=device, backend="auto")
    flow.run(private, steps=1, progress=False)  # warm-up (JIT compilation); accounted like every step
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    flow.run(private, progress=False)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    done = flow.steps_taken - 1
    row = dict(_run_fields(note, "perf_counter + synchronize"), case="api_run",
               impl=f"DPSlicedWassersteinFlow({quantiles})", device=device, params=dict(N=N, d=d, k=k, steps=done))
    row.update(ms_per_step=round(wall / max(done, 1) * 1e3, 2), wall_s=round(wall, 3),
               peak_mem_mb=round(torch.cuda.max_memory_allocated() / 2 ** 20, 1) if device == "cuda" else None,
               epsilon=flow.epsilon(), finite=bool(torch.isfinite(flow.particles).all()),
               timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
    store.append_row(results_path, row)  # a record: a whole run, not a benchmark entry
    print(f"[{SUITE}] api_run N={N} d={d} k={k} {quantiles}: {done} steps, {row['ms_per_step']} ms/step, "
          f"peak {row['peak_mem_mb']} MB, eps {row['epsilon']:.4f}, finite {row['finite']}", flush=True)
    return row


def _fmt_n(n):
    return f"1e{len(str(n)) - 1}" if str(n).strip("0") == "1" else str(n)


def markdown_table(rows):
    """The README table of one run: GPU, versions, ms, modelled GB/s, ratios to the reference and (DP-SWD rows
    where it was measured) to ``reference_compiled``."""
    if not rows:
        return ""
    m, v = rows[0]["machine"], rows[0]["versions"]
    head = (f"GPU: {m.get('gpu', 'none')}; torch {v.get('torch')}, Triton {v.get('triton')}; "
            f"git {rows[0]['git_rev']}; {rows[0]['timing']}.\n\n"
            "| case | N | d | k | impl | ms | GB/s (model) | peak MB | × reference | × compiled |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        p = r["params"]
        if "error" in r:
            lines.append(f"| {r['case']} | {_fmt_n(p['N'])} | {p['d']} | {p['k']} | {r['impl']} | {r['error'][:40]} "
                         "| | | | |")
            continue
        ratio, ratio_c = r.get("ratio_to_reference"), r.get("ratio_to_compiled")
        peak = "" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.0f}"
        lines.append(f"| {r['case']} | {_fmt_n(p['N'])} | {p['d']} | {p['k']} | {r['impl']} | {r['ms']:.2f} | "
                     f"{r['gbps']:.1f} | {peak} | {'' if ratio is None else f'{ratio:.1f}'} | "
                     f"{'' if ratio_c is None else f'{ratio_c:.2f}'} |")
    return "\n".join(lines)


def _parse_size(text):
    """``"N,d,k"`` (floats allowed: ``1e6,48,128``) -> ``{"N": .., "d": .., "k": ..}``; ValueError otherwise."""
    parts = text.split(",")
    try:
        vals = [int(float(v)) for v in parts]
    except ValueError:
        vals = []
    if len(vals) != 3 or min(vals) < 1:
        raise ValueError(f"a size is N,d,k with three positive integers (e.g. 1e6,48,128), got {text!r}")
    return dict(zip("Ndk", vals))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N in {1e5, 1e6} only (plus the d = 3072 case)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on CPU under TRITON_INTERPRET=1")
    ap.add_argument("--isolated", action="store_true", help="one subprocess per measurement via bench.harness")
    ap.add_argument("--results", default=None,
                    help="results document (pytest-benchmark JSON, bench.store; entries added; default "
                         "bench/results/gpu_flow-<date>.json, a temporary file for --smoke)")
    ap.add_argument("--table", default=None, help="also write the markdown table of this run to this file")
    ap.add_argument("--note", default="")
    ap.add_argument("--only", action="append", default=None, metavar="N,d,k",
                    help="measure only these sizes (repeatable) instead of the suite's list")
    ap.add_argument("--api-run", default=None, metavar="N,d,k,steps",
                    help="instead of the table: a private flow through the public API at these sizes")
    ap.add_argument("--api-modes", default="exact,histogram",
                    help="quantile modes of --api-run, comma-separated (exact, histogram)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting new sizes after this many seconds (keeps what was measured)")
    ap.add_argument("--dpswd-only", action="append", default=None, metavar="N,d,k",
                    help="time only the DP-SWD loss (triton, reference, reference_compiled) at these sizes "
                         "(repeatable; not with --only)")
    ap.add_argument("--compiled", choices=("target", "all", "none"), default=None,
                    help="DP-SWD sizes that get the reference_compiled anchor: target (N=1e6, d=48, k=128 only; the "
                         "default), all (the default with --dpswd-only and --smoke), none")
    ap.add_argument("--sketch-only", action="append", default=None, metavar="N,d,k",
                    help="time only the DP-SWD loss with the sketch release (GPU backends, reference) at these sizes")
    ap.add_argument("--cases", default=None,
                    help="comma-separated cases to time with --only (flow_step, dpswd, sketch)")
    ap.add_argument("--max-reference-n", type=float, default=None,
                    help="time the flow step's torch reference only up to this N (it takes ~10 s a step at 1e7)")
    args = ap.parse_args(argv)
    if args.max_reference_n is not None:
        MAX_REFERENCE_N[0] = int(args.max_reference_n)
    if sum(bool(a) for a in (args.dpswd_only, args.only, args.sketch_only)) > 1:
        ap.error("--dpswd-only, --sketch-only and --only select sizes in different ways: give one of them")
    sizes_arg = args.dpswd_only or args.sketch_only or args.only
    try:
        picked = [_parse_size(o) for o in sizes_arg] if sizes_arg else None
    except ValueError as err:
        ap.error(str(err))
    compiled = args.compiled or ("all" if args.dpswd_only or args.smoke else "target")

    if args.smoke:
        if os.environ.get("TRITON_INTERPRET", "0") != "1":
            print("--smoke needs TRITON_INTERPRET=1 (Triton's CPU interpreter)")
            return 2
        device = "cpu"
    elif not torch.cuda.is_available():
        print("bench.gpu_flow: no CUDA device here; nothing measured (run it on a GPU machine, "
              "e.g. `bash scripts/gpu_check.sh`; `--smoke` checks the script on CPU).")
        return 0
    else:
        device = "cuda"
    if args.results is None:
        args.results = os.path.join(tempfile.gettempdir(), "fastdpot_gpu_flow_smoke.json") if args.smoke \
            else store.new_results_path(SUITE)
    if args.api_run:
        n, d, k, steps = (int(float(v)) for v in args.api_run.split(","))
        for q in args.api_modes.split(","):
            if q not in ("exact", "histogram"):
                ap.error(f"--api-modes takes exact and/or histogram, got {q!r}")
            api_run(n, d, k, steps, args.results, device, note=args.note, quantiles=q,
                    histogram_bins=HISTOGRAM_BINS if q == "histogram" else None)
        return 0
    sizes = picked or _sizes(args.quick, args.smoke)
    cases = ["dpswd"] if args.dpswd_only else ["sketch"] if args.sketch_only else list(CASES)
    if args.cases:
        cases = [c.strip() for c in args.cases.split(",") if c.strip()]
        if not set(cases) <= set(CASES):
            ap.error(f"--cases takes {sorted(CASES)}, got {args.cases!r}")
    if compiled != "none" and args.smoke:
        print(f"[{SUITE}] smoke run: the {COMPILED} row compiles with Inductor on CPU (10-20 s from a cold cache; "
              "--compiled none skips it)", flush=True)
    if args.isolated:
        runs = [dict(case=c, impl=i, params=dict(p, device=device), mode="full" if c == "dpswd" else "forward",
                     anchor="reference_hist" if i.endswith("_hist") else "reference", repeats=10, warmup=2)
                for p in sizes for c in cases
                for i in _impls(c, p["N"], c == "dpswd" and _wants_compiled(p, compiled))]
        harness.run_suite("bench.gpu_flow", runs, results_path=args.results, note=args.note)
        return 0
    rows = run_events(sizes, args.results, device, note=args.note, budget_s=args.budget_s, cases=cases,
                      compiled=compiled)
    table = markdown_table(rows)
    print(table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
