"""Render the stored benchmark results (``bench/results/*.json``, pytest-benchmark's format: :mod:`bench.store`) into
the benchmarks page (every group), the README's headline table (a few groups) and per-suite plots.

For every group (suite, case, size, mode, device) the newest document that measured it is shown; ratios compare
entries of that same document only (side by side: same machine, same versions, same commit). ``ratio`` = anchor
median / impl median (higher is faster than the anchor); the anchors of a suite are its bench module's ``ANCHORS``.
Every row names the machine and commit it was measured on and, where recorded, the 1-minute load average when its run
started; a row whose run started at a load average of :data:`LOAD_LIMIT` or more is marked "measured under load" (a
busy machine slows every row of its run, and a 2-thread C++ kernel and a torch anchor suffer differently, so even
its ratios are not a quiet machine's). The footer gives each machine's threads, versions and load average.

Usage: ``python -m bench.render [--results-dir bench/results] [--page docs/benchmarks.md] [--readme README.md]
[--plots bench/plots] [--print]`` (an empty ``--page``, ``--readme`` or ``--plots`` leaves that output alone)
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
from collections import OrderedDict, defaultdict

from .store import RESULTS_DIR, ROOT, load_rows, result_files, size_label

START, END = "<!-- BENCH:START -->", "<!-- BENCH:END -->"
# the README's headline groups: (suite, case, params, device) of the sizes the project is judged on
HEADLINE = [
    ("flow", "step", {"n": 1000000, "m": 250, "d": 48, "k": 300}, "cpu"),
    ("sliced", "dp", {"n": 100000, "m": 100000, "d": 48, "k": 500}, "cpu"),
    ("sliced", "sketch", {"n": 100000, "m": 100000, "d": 48, "k": 500}, "cpu"),
    ("sinkhorn", "divergence", {"n": 20000, "m": 20000, "d": 2}, "cpu"),
    ("accounting", "spend", {"T": 20000}, "cpu"),
    ("accounting", "spend_edge", {"T": 20000}, "cpu"),
    ("flow", "pixel_step", {"n": 60000, "m": 0, "d": 784, "k": 784}, "cpu"),
    ("gpu_flow", "flow_step", {"N": 10000000, "d": 48, "k": 128}, "cuda"),
]
_MODULE_SKIP = ("harness.py", "render.py", "store.py", "conftest.py", "__init__.py")
#: a run that started at this 1-minute load average or above is "measured under load" (the 2-core reference machine
#: is busy from one runnable process on)
LOAD_LIMIT = 1.0
UNDER_LOAD = "measured under load"


def _anchors(suite):
    """The ``ANCHORS`` of the bench module whose ``SUITE`` is ``suite`` (empty when none)."""
    for name in sorted(os.listdir(os.path.join(ROOT, "bench"))):
        if name.endswith(".py") and name not in _MODULE_SKIP and not name.startswith("test_"):
            try:
                mod = importlib.import_module("bench." + name[:-3])
            except ImportError:
                continue
            if getattr(mod, "SUITE", None) == suite:
                return list(getattr(mod, "ANCHORS", []))
    return []


def latest_groups(rows):
    """{(suite, case, params_json, mode, device): [rows of the newest document that measured the group]}."""
    groups = defaultdict(list)
    for r in rows:
        if "median_s" not in r:  # records (bench.gpu_flow --api-run) and failed measurements
            continue
        key = (r["suite"], r["case"], json.dumps(r["params"], sort_keys=True), r.get("mode", "full"),
               r.get("device", "cpu"))
        groups[key].append(r)
    out = OrderedDict()
    for key in sorted(groups):
        rs = groups[key]
        newest = max((r.get("datetime") or "", r["run_id"]) for r in rs)
        out[key] = [r for r in rs if (r.get("datetime") or "", r["run_id"]) == newest]
    return out


def _headline_key(key):
    suite, case, params, _mode, device = key
    return any(suite == s and case == c and json.loads(params) == p and device == dv for s, c, p, dv in HEADLINE)


def _measured(r):
    """The row's machine note: machine (with its SIMD level, the kernel's where it differs and the rank pass's layout,
    where the row records them), commit and, where recorded, the load average at the start of its run (marked
    :data:`UNDER_LOAD` at :data:`LOAD_LIMIT` or above)."""
    simd, kernel, layout = r.get("simd"), r.get("kernel_simd"), r.get("rank_layout")
    facts = ([simd] if simd else []) + ([f"kernel built for {kernel}"] if kernel and kernel != simd else []) + (
        [f"rank layout {layout}"] if layout else [])
    note = r["machine"] + (f" ({', '.join(facts)})" if facts else "")
    note += f", {r['git_rev']}"
    load = r.get("load_average")
    if load is not None:
        note += f", load {load:g} at the start" + (f": {UNDER_LOAD}" if load >= LOAD_LIMIT else "")
    return note


def table(rows, headline_only=False):
    """The markdown table of the newest measurement of every group (``headline_only``: the README's groups)."""
    groups = latest_groups(rows)
    if headline_only:
        groups = OrderedDict((k, v) for k, v in groups.items() if _headline_key(k))
    lines = ["| suite | case | size | mode | device | impl | median s | IQR s | peak MB | ratio (anchor / impl) | "
             "measured on |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    machines = OrderedDict()
    anchors_cache = {}
    for (suite, case, params, mode, device), rs in groups.items():
        anchors = anchors_cache.setdefault(suite, _anchors(suite))
        by_impl = {r["impl"]: r for r in rs}
        for r in rs:
            ratios = []
            if r["impl"] not in anchors:
                for a in anchors:
                    if a in by_impl:
                        ratio = by_impl[a]["median_s"] / r["median_s"]
                        ratios.append(f"{ratio:.2f}× {a}" if ratio < 10 else f"{ratio:.0f}× {a}")
            ver = ", ".join(f"{k} {v}" for k, v in (r.get("versions") or {}).items() if v)
            if r.get("load_average") is not None:
                ver += f"; load average {r['load_average']:g} at the start"
            machines[(r["machine"], r.get("threads"), r["git_rev"], ver)] = None
            peak = r.get("peak_mem_mb")
            lines.append(f"| {suite} | {case} | {size_label(r['params'])} | {mode} | {device} | {r['impl']} | "
                         f"{r['median_s']:.4g} | {r['iqr_s']:.2g} | {'' if peak is None else f'{peak:.0f}'} | "
                         f"{'; '.join(ratios)} | {_measured(r)} |")
    foot = ["", "Machines: " + "; ".join(f"{hw} at {rev}: {th} threads ({ver})" for hw, th, rev, ver in machines)]
    return "\n".join(lines + foot)


def plots(rows, outdir):
    """One bar chart per suite (median seconds, log scale) of the newest measurement of every group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_suite = defaultdict(list)
    for key, rs in latest_groups(rows).items():
        by_suite[key[0]].append((key, rs))
    os.makedirs(outdir, exist_ok=True)
    paths = []
    for suite, items in by_suite.items():
        labels, impls = [], sorted({r["impl"] for _, rs in items for r in rs})
        data = {i: [] for i in impls}
        for (_s, case, params, mode, device), rs in items:
            labels.append(f"{case}\n{size_label(json.loads(params))}\n{mode}/{device}")
            by_impl = {r["impl"]: r["median_s"] for r in rs}
            for i in impls:
                data[i].append(by_impl.get(i, float("nan")))
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels)), 4))
        width = 0.8 / max(1, len(impls))
        for j, i in enumerate(impls):
            ax.bar([x + j * width for x in range(len(labels))], data[i], width, label=i)
        ax.set_yscale("log")
        ax.set_ylabel("median seconds (log)")
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))])
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_title(f"fastdpot bench: {suite}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(outdir, f"{suite}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def update_between_markers(path, text):
    """Replace what lies between the BENCH:START / BENCH:END markers of ``path`` by ``text``."""
    with open(path) as f:
        s = f.read()
    if START not in s or END not in s:
        raise SystemExit(f"{path} has no {START} ... {END} markers")
    pre, rest = s.split(START, 1)
    _, post = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(pre + START + "\n" + text + "\n" + END + post)


def main(argv=None):
    p = argparse.ArgumentParser(description="render bench/results/*.json into the docs page, the README and plots")
    p.add_argument("--results-dir", default=RESULTS_DIR, help="folder of the stored pytest-benchmark documents")
    p.add_argument("--page", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                   help="the docs page that gets the full table")
    p.add_argument("--readme", default=os.path.join(ROOT, "README.md"), help="the front door: headline rows only")
    p.add_argument("--plots", default=os.path.join(ROOT, "bench", "plots"))
    p.add_argument("--print", action="store_true", help="print the full table instead of writing the files")
    a = p.parse_args(argv)
    rows = load_rows(result_files(a.results_dir))
    if a.print:
        print(table(rows))
        return
    if a.page:
        update_between_markers(a.page, table(rows))
        print(f"updated {a.page}")
    if a.readme:
        update_between_markers(a.readme, table(rows, headline_only=True))
        print(f"updated {a.readme}")
    if a.plots:
        for path in plots(rows, a.plots):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
