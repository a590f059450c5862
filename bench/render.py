"""Render bench/results.jsonl into the benchmarks page (every case), the README's headline table (a few cases)
and per-suite plots.

For every (suite, case, params, mode) the newest run_id that measured it is shown; ratios compare rows of that
same run only (side by side, same machine, same versions). ``ratio`` = anchor median / impl median (higher is
faster than the anchor). Anchors per suite come from the bench module's ``ANCHORS`` list.

Usage: ``python -m bench.render [--page docs/benchmarks.md] [--readme README.md] [--plots bench/plots]``
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
from collections import OrderedDict, defaultdict

from .harness import RESULTS, ROOT

START, END = "<!-- BENCH:START -->", "<!-- BENCH:END -->"
SUITE_MODULES = {}  # suite name -> bench module, filled from the rows' modules
# the README's headline rows: (suite, case, params, device) of the sizes the project is judged on
HEADLINE = [
    ("flow", "step", {"n": 1000000, "m": 250, "d": 48, "k": 300}, "cpu"),
    ("sliced", "dp", {"n": 100000, "m": 100000, "d": 48, "k": 500}, "cpu"),
    ("sinkhorn", "divergence", {"n": 20000, "m": 20000, "d": 2}, "cpu"),
    ("gpu_flow", "flow_step", {"N": 10000000, "d": 48, "k": 128}, "cuda"),
    ("gpu_flow", "flow_step", {"N": 1000000, "d": 48, "k": 128}, "cuda"),
]


def load_rows(path=RESULTS):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [json.loads(ln) for ln in f if ln.strip()]
    return rows


def _anchors(suite):
    for name in os.listdir(os.path.join(ROOT, "bench")):
        if name.endswith(".py") and name not in ("harness.py", "render.py", "__init__.py"):
            try:
                mod = importlib.import_module("bench." + name[:-3])
            except ImportError:
                continue
            if getattr(mod, "SUITE", None) == suite:
                return list(getattr(mod, "ANCHORS", []))
    return []


def _size(params):
    return ", ".join(f"{k}={v:.0e}" if isinstance(v, int) and v >= 10 ** 5 and v % 10 ** 5 == 0 else f"{k}={v}"
                     for k, v in params.items())


def latest_groups(rows):
    """{(suite, case, params_json, mode, device): [rows of the newest run_id]}."""
    groups = defaultdict(list)
    for r in rows:
        if "median_s" not in r:  # failed measurements and whole-run records (bench.gpu_flow --api-run)
            continue
        key = (r["suite"], r["case"], json.dumps(r["params"], sort_keys=True), r["mode"], r.get("device", "cpu"))
        groups[key].append(r)
    out = OrderedDict()
    for key in sorted(groups):
        rs = groups[key]
        newest = max(r["run_id"] for r in rs)
        out[key] = [r for r in rs if r["run_id"] == newest]
    return out


def _headline_key(key):
    suite, case, params, _mode, device = key
    return any(suite == s and case == c and json.loads(params) == p and device == dv for s, c, p, dv in HEADLINE)


def table(rows, headline_only=False):
    groups = latest_groups(rows)
    if headline_only:
        groups = OrderedDict((k, v) for k, v in groups.items() if _headline_key(k))
    lines = ["| suite | case | size | mode | device | impl | median s | IQR s | peak MB | ratio (anchor / impl) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    machines = OrderedDict()
    anchors_cache = {}
    for (suite, case, params, mode, device), rs in groups.items():
        if suite not in anchors_cache:
            anchors_cache[suite] = _anchors(suite)
        anchors = anchors_cache[suite]
        by_impl = {r["impl"]: r for r in rs}
        for r in rs:
            ratios = []
            if r["impl"] not in anchors:
                for a in anchors:
                    if a in by_impl:
                        ratio = by_impl[a]["median_s"] / r["median_s"]
                        ratios.append(f"{ratio:.2f}× {a}" if ratio < 10 else f"{ratio:.0f}× {a}")
            m = r["machine"]
            # tree_commit: the commit whose tree was measured, where the machine's own .git copy was stale
            mkey = (m.get("gpu") or m["cpu"], r["threads"], r.get("tree_commit") or r["git_rev"],
                    ", ".join(f"{k} {v}" for k, v in r["versions"].items() if v))
            machines[mkey] = None
            lines.append(f"| {suite} | {case} | {_size(r['params'])} | {mode} | {device} | {r['impl']} | "
                         f"{r['median_s']:.4g} | {r['iqr_s']:.2g} | {r['peak_mem_mb']:.0f} | {'; '.join(ratios)} |")
    foot = ["", "Measured on: " + "; ".join(f"{hw}, {th} threads, rev {rev} ({ver})" for hw, th, rev, ver in machines)]
    return "\n".join(lines + foot)


def plots(rows, outdir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = latest_groups(rows)
    by_suite = defaultdict(list)
    for key, rs in groups.items():
        by_suite[key[0]].append((key, rs))
    os.makedirs(outdir, exist_ok=True)
    paths = []
    for suite, items in by_suite.items():
        labels, impls = [], sorted({r["impl"] for _, rs in items for r in rs})
        data = {i: [] for i in impls}
        for (s, case, params, mode, device), rs in items:
            labels.append(f"{case}\n{_size(json.loads(params))}\n{mode}/{device}")
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
    p = argparse.ArgumentParser(description="render bench/results.jsonl")
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--page", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                   help="the docs page that gets the full table")
    p.add_argument("--readme", default=os.path.join(ROOT, "README.md"), help="the front door: headline rows only")
    p.add_argument("--plots", default=os.path.join(ROOT, "bench", "plots"))
    p.add_argument("--print", action="store_true", help="print the full table instead of writing the files")
    a = p.parse_args(argv)
    rows = load_rows(a.results)
    if a.print:
        print(table(rows))
    else:
        update_between_markers(a.page, table(rows))
        update_between_markers(a.readme, table(rows, headline_only=True))
        print(f"updated {a.page} and {a.readme}")
    if a.plots:
        for path in plots(rows, a.plots):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
