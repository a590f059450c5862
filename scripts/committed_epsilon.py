"""The ε of everything committed under results/ for one sensitive set, composed with dp-accounting.

The committed runs are a BENCHMARK: Fashion-MNIST is a public data set standing in for a sensitive one, and the runs
are many independent runs of the algorithms on the same images. A user publishes ONE run, at the ε it states. Were the
images sensitive, publishing all these runs together would cost the composition printed here.

Every run folder's ``metrics.json`` is read; runs on the same sensitive images are grouped (the private-only
protocol's sensitive set is one fixed split; every public-half run of a data set draws its private half from the same
seeded permutation, so their private halves overlap and are composed together). Events:

* private-only runs: their recorded stages (Gaussian mechanisms, full-batch or sampled without replacement);
* public-half label-private flows: T steps × flow seeds of the Gaussian sampled without replacement (B of n, z);
* public-half DP Gaussians: one Gaussian release of noise multiplier σ/Δ per seed;
* public-half per-class flows: their per-class z depend on private class sizes that are not committed: their stated
  (ε, δ) per seed, added by basic composition (Dwork & Roth, Thm. 3.16) to the RDP composition of the rest;
* non-private runs and analyses (ε = ∞) are listed apart: with them no guarantee holds at all.

``python scripts/committed_epsilon.py [results]`` prints the tables (docs/mainjob-private.md and results/README.md
quote them).
"""
from __future__ import annotations

import json
import math
import os
import sys
from collections import defaultdict
from typing import Dict, List, Tuple

__all__ = ["run_events", "compose", "committed_table", "main"]


def _finite(v) -> bool:
    return v is not None and v != "inf" and not (isinstance(v, float) and math.isinf(v))


def run_events(m: Dict) -> Tuple[List[Tuple[float, float, int, int]], List[Tuple[float, float]], bool]:
    """``(gaussian_events, basic_parts, private)`` of one run's metrics: events ``(z, sample_rate, n, count)`` for the
    accountant (sample_rate 1: the whole data set), basic-composition parts ``(ε, δ)``, and whether the run is private
    at all (False: ε = ∞, or the decoded analysis)."""
    if not _finite(m.get("epsilon_target", m.get("epsilon"))) or m.get("method") == "decoded":
        return [], [], m.get("method") == "public"
    if m.get("method") == "public":
        return [], [], True
    if "stages" in m:
        out = []
        for s in m["stages"]:
            e = s["event"]
            out.append((float(s["noise_multiplier"]), e["batch_size"] / e["dataset_size"], int(e["dataset_size"]),
                        int(s["releases"])))
        return out, [], True
    seeds = len(m.get("seeds") or [1])
    if m.get("method") == "gaussian":
        return [(float(m["noise_std"]) / float(m["sensitivity"]), 1.0, int(m["n_private"]), seeds)], [], True
    if m.get("labels") == "public" or m.get("noise_multiplier") is None:
        per = float(m.get("epsilon_per_seed", m["epsilon_target"]))
        return [], [(per, float(m.get("delta_target", m["delta"])))] * seeds, True
    T = int(m["steps"])
    return [(float(m["noise_multiplier"]), m["batch_size"] / m["n_private"], int(m["n_private"]), T * seeds)], [], True


def compose(events, basic, delta: float) -> Tuple[float, float]:
    """``(ε, δ)``: RDP (dp-accounting, replace-one, Gaussian events full or sampled without replacement) of
    ``events`` at ``delta``, plus the basic composition of ``basic``."""
    import dp_accounting as dpa

    from fastdpot.privacy import DEFAULT_ORDERS

    eps, dl = 0.0, 0.0
    if events:
        acc = dpa.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS), neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
        for z, q, n, count in events:
            g = dpa.GaussianDpEvent(z)
            acc.compose(g if q >= 1.0 else dpa.SampledWithoutReplacementDpEvent(n, max(1, round(q * n)), g), count)
        eps, dl = acc.get_epsilon(delta), delta
    return eps + sum(e for e, _ in basic), dl + sum(d for _, d in basic)


def _group(m: Dict) -> str:
    if "n_sensitive" in m or m.get("protocol") == "private-only":
        return f"{m.get('dataset', 'fashion-mnist')}, private-only protocol: the sensitive set (55 000 images)"
    return f"{m.get('dataset', 'fashion-mnist')}, public-half protocol: the private halves (split seed {m.get('split_seed', 0)})"


def committed_table(folder: str = "results") -> str:
    """Markdown: per sensitive set, per (method, ε asked for) and for everything, the composed (ε, δ) of the runs."""
    groups: Dict[str, List[Tuple[str, Dict]]] = defaultdict(list)
    for root, _, files in os.walk(folder):
        if "metrics.json" in files:
            with open(os.path.join(root, "metrics.json")) as f:
                m = json.load(f)
            groups[_group(m)].append((os.path.relpath(root, folder), m))
    lines = ["| sensitive set | runs | ε asked for (each) | composed (ε, δ) |", "|---|---|---|---|"]
    for name in sorted(groups):
        runs = groups[name]
        delta = min(float(m.get("delta_target") or m["delta"]) for _, m in runs if _finite(m.get("delta")))
        by_kind: Dict[Tuple[str, str], List] = defaultdict(list)
        everything, nonprivate = [], []
        for path, m in runs:
            ev, basic, private = run_events(m)
            if not private:
                nonprivate.append(path)
                continue
            if not ev and not basic:
                continue
            eps = m.get("epsilon_target")
            by_kind[(m.get("method", "flow"), f"{float(eps):g}")].append((path, ev, basic))
            everything.append((path, ev, basic))
        for (method, eps), items in sorted(by_kind.items()):
            e, d = compose([x for _, ev, _ in items for x in ev], [b for _, _, bs in items for b in bs], delta)
            lines.append(f"| {name} | {len(items)} × {method} | {eps} | ({e:.2f}, {d:.3g}) |")
        e, d = compose([x for _, ev, _ in everything for x in ev], [b for _, _, bs in everything for b in bs], delta)
        lines.append(f"| {name} | all {len(everything)} private runs | — | **({e:.2f}, {d:.3g})** |")
        if nonprivate:
            lines.append(f"| {name} | {len(nonprivate)} non-private run(s) or analyses ({', '.join(sorted(nonprivate))}) "
                         f"| ∞ | no guarantee (they read the data without noise) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(committed_table(argv[0] if argv else "results"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
