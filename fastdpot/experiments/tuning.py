"""Hyper-parameter tuning of the main job on PUBLIC data only: ``python -m fastdpot.experiments.tuning``.

Protocol (docs/mainjob/tuning.md): the real run's public part P is split, with a recorded seed, into three disjoint
parts —

* a held-out part H that plays the real test set (FID reference and classifier test set),
* a stand-in public part P′ that trains the auto-encoder (and gives the public class centres),
* a stand-in private part S′ that plays the private data: the full private pipeline (flow or baseline) runs on it at
  the target (ε, δ), exactly as it would on the real private part.

Each grid point is one :func:`fastdpot.experiments.pipeline.run_pipeline` call on (P′, S′, H); the table ranks the
points by a score measured on H. Neither the real private part nor the real test set is read, so the choice costs no
privacy and does not overfit the reported numbers; the real test set is then used once, by the final
``fastdpot flow`` run with the chosen settings.

Example::

    python -m fastdpot.experiments.tuning --out runs/tune --epsilon 10 \\
        --grid step_size=0.1,0.3,1 --grid epochs=5,10 --select accuracy_cnn
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from dataclasses import asdict, fields, replace
from typing import Any, Dict, List, Optional, Sequence

import torch

from .._validate import check_int
from .pipeline import PipelineConfig, run_pipeline, stage_data

__all__ = ["tuning_split", "parse_grid", "parse_settings", "run_tuning", "main"]

_LOWER_IS_BETTER = ("fid",)


def tuning_split(public, seed: int = 0, holdout_size: Optional[int] = None,
                 standin_public_size: Optional[int] = None) -> Dict[str, Any]:
    """Split the public part P into held-out H, stand-in public P′ and stand-in private S′ (disjoint, seeded).

    Args:
        public: :class:`fastdpot.experiments.data.ImageData`, the real run's public part (never its private part).
        seed: seed of the split (recorded in the table).
        holdout_size: |H| (default: a third of P). standin_public_size: |P′| (default: half of the rest).

    Returns:
        the ``data`` dict of :func:`fastdpot.experiments.pipeline.run_pipeline`: ``public`` = P′, ``private`` = S′,
        ``test`` = H, ``dataset`` (name + ":tuning"), and the three index tensors into P.

    Raises:
        ValueError: sizes that leave a part with fewer than 2 images.
    """
    n = len(public)
    h = n // 3 if holdout_size is None else check_int(holdout_size, "holdout_size", 2)
    rest = n - h
    p = rest // 2 if standin_public_size is None else check_int(standin_public_size, "standin_public_size", 2)
    if h < 2 or p < 2 or rest - p < 2:
        raise ValueError(f"the public part of {n} images cannot give a held-out part of {h} and a stand-in public "
                         f"part of {p} with >= 2 stand-in private images")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    hi, pi, si = (torch.sort(perm[:h]).values, torch.sort(perm[h:h + p]).values, torch.sort(perm[h + p:]).values)
    return dict(public=public.subset(pi), private=public.subset(si), test=public.subset(hi),
                dataset=f"{public.name}:tuning", holdout_index=hi, standin_public_index=pi, standin_private_index=si)


def _value(text: str):
    t = text.strip()
    low = t.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    if low in ("inf", "+inf"):
        return math.inf
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def parse_grid(specs: Sequence[str]) -> Dict[str, List[Any]]:
    """``["step_size=0.1,0.3", "release=points,sketch"]`` -> ``{"step_size": [0.1, 0.3], ...}``.

    Keys must be :class:`fastdpot.experiments.config.PipelineConfig` fields; values are parsed as None / bool / inf / int /
    float / string.

    Raises:
        ValueError: a spec without ``=``, an unknown key, an empty value list or a key given twice.
    """
    names = {f.name for f in fields(PipelineConfig)}
    grid: Dict[str, List[Any]] = {}
    for spec in specs:
        if "=" not in spec:
            raise ValueError(f"grid entries are KEY=V1,V2,..., got {spec!r}")
        key, vals = spec.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in names:
            raise ValueError(f"grid key {key!r} is not a PipelineConfig field ({sorted(names)})")
        if key in grid:
            raise ValueError(f"grid key {key!r} given twice")
        values = [_value(v) for v in vals.split(",") if v.strip()]
        if not values:
            raise ValueError(f"grid key {key!r} has no values")
        grid[key] = values
    return grid


def parse_settings(specs: Sequence[str]) -> Dict[str, Any]:
    """``["epsilon=10", "classifiers=logreg,mlp"]`` -> ``{"epsilon": 10, "classifiers": "logreg,mlp"}``: the fixed
    settings of ``--set``; unlike a grid value, the value is NOT split at commas (one value per key).

    Raises:
        ValueError: a spec without ``=``, an unknown key or a key given twice.
    """
    names = {f.name for f in fields(PipelineConfig)}
    out: Dict[str, Any] = {}
    for spec in specs:
        if "=" not in spec:
            raise ValueError(f"settings are KEY=VALUE, got {spec!r}")
        key, val = spec.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in names:
            raise ValueError(f"setting {key!r} is not a PipelineConfig field ({sorted(names)})")
        if key in out:
            raise ValueError(f"setting {key!r} given twice")
        out[key] = _value(val)
    return out


def _fmt(v):
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.4g}"
    return "—" if v is None else str(v)


def run_tuning(base: PipelineConfig, grid: Dict[str, List[Any]], out_dir: str, select: str = "accuracy_cnn",
               split_seed: int = 0, holdout_size: Optional[int] = None, standin_public_size: Optional[int] = None,
               progress: bool = False, cache_dir: Optional[str] = None) -> List[Dict[str, Any]]:
    """Run every grid point on the public part's stand-in split; write ``results.jsonl`` and ``table.md``.

    Args:
        base: settings shared by all points (the real run's; its ``seed`` picks the real public part).
        grid: {PipelineConfig field: values}; the points are the Cartesian product, less the combinations that
            are not valid settings (``PipelineConfig.resolved`` raises ValueError, e.g. ``release="points"`` with
            a ``sketch_bins``), which are listed in ``table.md`` as skipped and not run; so
            ``release=points,sketch`` × ``sketch_bins=none,5,10`` gives the points (points, None), (sketch, None: the
            default L), (sketch, 5), (sketch, 10).
        out_dir: one run folder per point (``p000``, ``p001``, …) plus the two result files.
        select: the metric ranking the points (``fid`` lower is better; accuracies higher is better). With
            ``flow_seeds`` > 1 the seed mean ranks.
        split_seed, holdout_size, standin_public_size: :func:`tuning_split`.

    Returns:
        the rows, ranked best first: {"point", "run", the point's settings, metrics ...}.

    Raises:
        ValueError: bad grid (or one without a valid point), bad sizes, or a ``select`` metric the runs do not
            report.
    """
    cfg = base.resolved()
    known = ["fid"] + [f"accuracy_{c}" for c in cfg.classifiers.split(",")]
    if select not in known:
        raise ValueError(f"select must be one of {known} (the metrics these runs report), got {select!r}")
    data = stage_data(cfg)
    split = tuning_split(data["public"], split_seed, holdout_size, standin_public_size)
    del data  # the real private part and test set go no further
    os.makedirs(out_dir, exist_ok=True)
    keys = list(grid)
    points, skipped = [], []
    for combo in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, combo))
        try:  # e.g. release=points with num_bins=5: not a setting, so not a point of the sweep
            points.append((point, replace(replace(base, **point).resolved(), quick=False)))
        except ValueError as err:
            skipped.append((point, str(err)))
    if not points:
        raise ValueError("no point of the grid is a valid setting: "
                         + "; ".join(f"{p}: {e}" for p, e in skipped))
    rows = []
    with open(os.path.join(out_dir, "results.jsonl"), "w") as res:
        for i, (point, point_cfg) in enumerate(points):  # the point applied to the UNresolved base, so that a
            run_dir = os.path.join(out_dir, f"p{i:03d}")   # data-dependent default (num_bins) follows the point
            m = run_pipeline(point_cfg, run_dir, progress=progress, cache_dir=cache_dir, data=split)
            summary = m.get("seed_summary") or {}
            row = dict(point=i, run=run_dir, settings=point, epsilon_spent=m["epsilon_spent"],
                       n_standin_public=m["n_public"], n_standin_private=m["n_private"], n_holdout=m["n_test"],
                       **{k: m[k] for k in m if k == "fid" or k.startswith("accuracy_")},
                       seed_means={k: v["mean"] for k, v in summary.items()},
                       seed_stds={k: v["std"] for k, v in summary.items()},
                       wall_time_s=m["wall_time_s"]["total"])
            res.write(json.dumps(row) + "\n")
            res.flush()
            rows.append(row)
    if not rows or select not in rows[0]["seed_means"]:
        raise ValueError(f"select={select!r} is not a metric of these runs "
                         f"({sorted(rows[0]['seed_means']) if rows else []})")
    sign = 1.0 if select in _LOWER_IS_BETTER else -1.0
    rows.sort(key=lambda r: sign * r["seed_means"][select])
    metrics = list(rows[0]["seed_means"])
    lines = [f"# Tuning on the public part only (select: {select}, "
             f"{'lower' if sign > 0 else 'higher'} is better)", "",
             f"Base config: {json.dumps({k: v for k, v in asdict(cfg).items() if k not in grid}, default=str)}", "",
             f"Split of the real run's public part (seed {cfg.seed}) with split seed {split_seed}: stand-in public "
             f"{rows[0]['n_standin_public']}, stand-in private {rows[0]['n_standin_private']}, held-out "
             f"{rows[0]['n_holdout']} images. Metrics on the held-out part; mean ± sd over {cfg.flow_seeds} "
             f"flow seed(s).", "",
             "| rank | " + " | ".join(keys) + " | ε spent | " + " | ".join(metrics) + " | wall (s) |",
             "|" + "---|" * (len(keys) + len(metrics) + 3)]
    for r, row in enumerate(rows):
        cells = [_fmt(row["settings"][k]) for k in keys]
        mets = [f"{row['seed_means'][k]:.4g} ± {row['seed_stds'][k]:.2g}" for k in metrics]
        lines.append(f"| {r + 1} | " + " | ".join(cells) + f" | {_fmt(row['epsilon_spent'])} | "
                     + " | ".join(mets) + f" | {row['wall_time_s']:.0f} |")
    if skipped:
        lines += ["", "Grid combinations that are not valid settings (skipped, not run):", ""]
        lines += [f"* {json.dumps(p, default=str)}: {e}" for p, e in skipped]
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fastdpot.experiments.tuning",
                                description="Choose the main job's hyper-parameters on the public part only: "
                                            "grid search on a stand-in private / held-out split of it.")
    p.add_argument("--out", required=True, help="output folder (one run folder per point, results.jsonl, table.md)")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a PipelineConfig field and its values (repeatable; the points are the product)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=V",
                   help="a PipelineConfig field fixed for every point (repeatable; the value is not split at commas), "
                        "e.g. epsilon=10, classifiers=logreg,mlp")
    p.add_argument("--select", default="accuracy_cnn", help="ranking metric: fid, accuracy_logreg, accuracy_mlp, "
                                                           "accuracy_cnn")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the public part's three-way split")
    p.add_argument("--holdout-size", type=int, default=None, help="held-out images (default: a third of the part)")
    p.add_argument("--standin-public-size", type=int, default=None,
                   help="stand-in public images training the auto-encoder (default: half of the rest)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--progress", action="store_true")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Command-line entry point of the tuning grid (``argv`` as for :func:`build_parser`); returns the exit
    status (0 on success, 2 on a bad argument).
    """
    args = build_parser().parse_args(argv)
    try:
        fixed = parse_settings(args.set)
        grid = parse_grid(args.grid) or {"seed": [fixed.get("seed", 0)]}
        rows = run_tuning(PipelineConfig(**fixed), grid, args.out, select=args.select, split_seed=args.split_seed,
                          holdout_size=args.holdout_size, standin_public_size=args.standin_public_size,
                          progress=args.progress, cache_dir=args.cache_dir)
    except (ValueError, FileNotFoundError) as err:
        print(f"fastdpot.tuning: error: {err}", file=sys.stderr)
        return 2
    print(open(os.path.join(args.out, "table.md")).read())
    print(f"best: {rows[0]['settings']} (run folder {rows[0]['run']})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
