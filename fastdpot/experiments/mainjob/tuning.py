"""Hyper-parameters of the main job, chosen on a STAND-IN, never on the private data or the test set:
``python -m fastdpot.experiments.mainjob.tuning``. One harness for both protocols.

* public-half (docs/mainjob/tuning.md): the real run's PUBLIC part P is split with ``split_seed`` into a held-out
  part H (plays the test set), a stand-in public part P′ (trains the auto-encoder) and a stand-in private part S′
  (plays the private data at the run's (ε, δ)); :func:`tuning_split`.
* private-only (docs/mainjob-private.md): the VALIDATION split (disjoint from the sensitive set) is split with
  ``split_seed`` into a stand-in sensitive part (``stand_in_size`` images) and a held-out part, whose two halves play
  the validation split (selects the downstream CNN's checkpoint and trains the label-fidelity judge) and the test set
  (scores), disjoint as in a real run; every stage is calibrated for the REAL run's size (``calibration_size`` = the
  number of sensitive images), so each adds the real run's noise relative to its signal: a setting that survives the
  stand-in's noise at ε is one that survives the real run's (:func:`stand_in_split`). With ``folds`` = K
  (cross-fitting, :func:`fold_split`), the validation split is cut into K parts and each point runs K times: run k
  holds out part k (its first half selects the classifier's epochs and trains the judge, its second half scores) and
  uses the other K − 1 parts as the stand-in, so every validation image is scored in exactly one run; with
  ``seeds`` several seeds run per fold, and the table gives the mean and spread over all of them.

Each grid point is one :func:`fastdpot.experiments.mainjob.pipeline.run_pipeline` on the stand-in; the table ranks
the points by a metric measured on the held-out part. Neither the real private data nor the real test set is read:
the choice costs no privacy and does not overfit the reported numbers.

Example::

    python -m fastdpot.experiments.mainjob.tuning --out runs/tune --set public_size=0 --set epsilon=10 \\
        --grid share=0.3,0.5 --select accuracy_cnn
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from typing import Any, Dict, List, Optional

import torch

from ..._validate import check_int
from .config import MainJobConfig, flat_settings, parse_settings

__all__ = ["tuning_split", "stand_in_split", "fold_split", "stand_in_data", "run_tuning", "main"]

_LOWER_IS_BETTER = ("fid",)


def tuning_split(public, seed: int = 0, holdout_size: Optional[int] = None,
                 standin_public_size: Optional[int] = None) -> Dict[str, Any]:
    """public-half: split the public part P into held-out H, stand-in public P′ and stand-in private S′ (disjoint,
    seeded); returns the ``data`` of :func:`~fastdpot.experiments.mainjob.pipeline.run_pipeline` (``public`` = P′,
    ``private`` = S′, ``test`` = H) with the three index tensors into P.

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
    return dict(public=public.subset(pi), private=public.subset(si), test=public.subset(hi), validation=None,
                dataset=f"{public.name}:tuning", holdout_index=hi, standin_public_index=pi, standin_private_index=si)


def stand_in_split(validation_size: int, stand_in_size: int, seed: int):
    """private-only: ``(stand_in_index, held_out_index)`` into the validation split (a seeded permutation)."""
    if not 0 < stand_in_size < validation_size:
        raise ValueError(f"stand_in_size must be in (0, {validation_size}), got {stand_in_size}")
    perm = torch.randperm(validation_size, generator=torch.Generator().manual_seed(seed + 101))
    return perm[:stand_in_size], perm[stand_in_size:]


def fold_split(validation_size: int, folds: int, fold: int, seed: int):
    """private-only cross-fitting: ``(stand_in_index, selection_index, score_index)`` into the validation split for
    run ``fold`` of ``folds``: a seeded permutation cut into ``folds`` parts; part ``fold`` is held out (its first
    half selects the classifier and trains the judge, its second half scores), the others are the stand-in.

    Raises:
        ValueError: folds < 2, fold outside [0, folds), parts of fewer than 4 images.
    """
    folds = check_int(folds, "folds", 2)
    if not 0 <= check_int(fold, "fold", 0) < folds:
        raise ValueError(f"fold must be in [0, {folds}), got {fold}")
    if validation_size // folds < 4:
        raise ValueError(f"folds = {folds} leaves parts of fewer than 4 of the {validation_size} validation images")
    perm = torch.randperm(validation_size, generator=torch.Generator().manual_seed(seed + 202))
    parts = list(torch.tensor_split(perm, folds))
    held = parts.pop(fold)
    half = held.shape[0] // 2
    return torch.cat(parts), held[:half], held[half:]


def stand_in_data(cfg: MainJobConfig, split_seed: int = 0, holdout_size: Optional[int] = None,
                  standin_public_size: Optional[int] = None, stand_in_size: int = 4000,
                  folds: Optional[int] = None, fold: int = 0):
    """``(data, calibration_size)`` of the protocol's stand-in (module docstring; ``folds``: run ``fold`` of the
    private-only cross-fitting, :func:`fold_split`); the real private data and the real test set go no further than
    this function."""
    from .protocols import load_data

    data = load_data(cfg.resolved())
    if cfg.protocol == "public-half":
        return tuning_split(data["public"], split_seed, holdout_size, standin_public_size), None
    val = data["validation"]
    if folds is not None:
        s, sel, score = fold_split(len(val), folds, fold, split_seed)
        return dict(private=val.subset(s), validation=val.subset(sel), test=val.subset(score), public=None,
                    dataset=f"{val.name}:validation:fold{fold}of{folds}"), len(data["private"])
    s, h = stand_in_split(len(val), stand_in_size, split_seed)
    if len(h) < 4:
        raise ValueError(f"stand_in_size={stand_in_size} leaves {len(h)} of the {len(val)} validation images held "
                         f"out; the held-out part needs >= 4 (half selects the classifier, half scores)")
    half = len(h) // 2  # the stand-in's validation split and test set: disjoint, as in a real run
    return dict(private=val.subset(s), validation=val.subset(h[:half]), test=val.subset(h[half:]), public=None,
                dataset=f"{val.name}:validation"), len(data["private"])


def _point_row(i: int, point: Dict[str, Any], done) -> Dict[str, Any]:
    """One grid point's row: its runs' metrics, and their mean and spread (one run: the pipeline's own seed summary;
    several: the mean and sample standard deviation over the (fold, seed) runs, each run its seeds' mean)."""
    keys = ("fid", "label_fidelity")
    runs = []
    for run_dir, fold, seed, m in done:
        summary = m.get("seed_summary") or {}
        metrics = {k: summary[k]["mean"] if k in summary else m[k] for k in m
                   if k in keys or k.startswith("accuracy_")}
        runs.append(dict(run=run_dir, fold=fold, seed=seed, metrics=metrics, epsilon_spent=m["epsilon_spent"],
                         n_standin_private=m["n_private"], n_holdout=m["n_test"],
                         wall_time_s=m["wall_time_s"]["total"], summary=summary))
    first = runs[0]
    if len(runs) == 1:
        means = {k: v["mean"] for k, v in first["summary"].items()}
        stds = {k: v["std"] for k, v in first["summary"].items()}
    else:
        means = {k: sum(r["metrics"][k] for r in runs) / len(runs) for k in first["metrics"]}
        stds = {k: math.sqrt(sum((r["metrics"][k] - means[k]) ** 2 for r in runs) / (len(runs) - 1))
                for k in first["metrics"]}
    return dict(point=i, run=first["run"], settings=point, epsilon_spent=first["epsilon_spent"],
                n_standin_private=first["n_standin_private"], n_holdout=sum(r["n_holdout"] for r in runs
                                                                            if r["seed"] == first["seed"]),
                **first["metrics"], seed_means=means, seed_stds=stds, runs=[
                    {k: v for k, v in r.items() if k != "summary"} for r in runs],
                wall_time_s=sum(r["wall_time_s"] for r in runs))


def _fmt(v):
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.4g}"
    return "—" if v is None else str(v)


def run_tuning(base: MainJobConfig, grid: Dict[str, List[Any]], out_dir: str, select: str = "accuracy_cnn",
               split_seed: int = 0, holdout_size: Optional[int] = None, standin_public_size: Optional[int] = None,
               stand_in_size: int = 4000, progress: bool = False, cache_dir: Optional[str] = None,
               folds: Optional[int] = None, seeds: Optional[List[int]] = None) -> List[Dict[str, Any]]:
    """Run every grid point on the protocol's stand-in; write ``results.jsonl`` and ``table.md`` in ``out_dir``.

    Args:
        base: the settings shared by all points (the real run's).
        grid: {dotted setting: values} (:func:`fastdpot.experiments.mainjob.config.parse_settings` with
            ``grid=True``); the points are the Cartesian product, less the combinations that are not valid settings
            (:meth:`MainJobConfig.resolved` raises ValueError), listed in ``table.md`` as skipped.
        select: the ranking metric (``fid`` lower is better; ``accuracy_*``, ``label_fidelity`` higher). With
            ``generation.flow_seeds`` > 1 the seed mean ranks.
        folds: private-only cross-fitting (module docstring): every point runs once per fold (and per seed), and
            ranks by the mean over those runs. seeds: the run seeds of every point (default: the base's seed).

    Returns:
        the rows, ranked best first.

    Raises:
        ValueError: a bad grid (or one without a valid point), bad sizes, a ``select`` metric the runs do not report.
    """
    from . import pipeline

    resolved = base.resolved()
    known = (["fid"] if resolved.evaluation.fid_samples else []) + \
        (["label_fidelity"] if resolved.protocol == "private-only" else []) + \
        [f"accuracy_{c}" for c in resolved.evaluation.classifiers.split(",") if c]
    if select not in known:  # before anything runs
        raise ValueError(f"select must be one of {known} (the metrics these runs report), got {select!r}")
    runs = [(f, sd) for f in ([None] if folds is None else range(check_int(folds, "folds", 2)))
            for sd in ([base.seed] if seeds is None else seeds)]
    if folds is not None and base.protocol != "private-only":
        raise ValueError("folds (cross-fitting over the validation split) is the private-only protocol's")
    fold_data = {f: stand_in_data(base, split_seed, holdout_size, standin_public_size, stand_in_size,
                                  **({} if f is None else dict(folds=folds, fold=f))) for f in {f for f, _ in runs}}
    os.makedirs(out_dir, exist_ok=True)
    keys = list(grid)
    points, skipped = [], []
    for combo in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, combo))
        try:
            cfg = base.with_settings(**point)
            cfg.resolved()
            points.append((point, cfg))
        except ValueError as err:
            skipped.append((point, str(err)))
    if not points:
        raise ValueError("no point of the grid is a valid setting: " + "; ".join(f"{p}: {e}" for p, e in skipped))
    rows = []
    with open(os.path.join(out_dir, "results.jsonl"), "w") as res:
        for i, (point, cfg) in enumerate(points):
            done = []
            for fold, seed in runs:
                run_dir = os.path.join(out_dir, f"p{i:03d}" + ("" if len(runs) == 1 else
                                                               f"-f{fold if fold is not None else 0}-s{seed}"))
                data, calibration = fold_data[fold]
                m = pipeline.run_pipeline(cfg if seed == cfg.seed else cfg.with_settings(seed=seed), run_dir,
                                          progress=progress, cache_dir=cache_dir, data=data,
                                          calibration_size=calibration)
                done.append((run_dir, fold, seed, m))
            row = _point_row(i, point, done)
            res.write(json.dumps(row, default=str) + "\n")
            res.flush()
            rows.append(row)
    if select not in rows[0]["seed_means"]:
        raise ValueError(f"select={select!r} is not a metric of these runs ({sorted(rows[0]['seed_means'])})")
    sign = 1.0 if select in _LOWER_IS_BETTER else -1.0
    rows.sort(key=lambda r: sign * r["seed_means"][select])
    metrics = list(rows[0]["seed_means"])
    fixed = {k: v for k, v in flat_settings(base).items() if k not in grid}
    lines = [f"# Tuning on the {base.protocol} protocol's stand-in (select: {select}, "
             f"{'lower' if sign > 0 else 'higher'} is better)", "",
             f"Base settings: {json.dumps(fixed, default=str)}", "",
             f"Stand-in with split seed {split_seed}: {rows[0]['n_standin_private']} stand-in private images, "
             f"{rows[0]['n_holdout']} held-out images scored"
             + (f" ({folds}-fold cross-fitting: each run holds out one part, half of it selecting the classifier, "
                "half scoring)" if folds else "")
             + (f", every stage calibrated for the real run's {calibration} images" if calibration else "")
             + ". Metrics on the held-out part; mean ± sd over "
             + (f"{len(runs)} runs (folds x seeds {seeds or [base.seed]})" if len(runs) > 1 else
                f"{base.generation.flow_seeds} seed(s)") + ".", "",
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
    p = argparse.ArgumentParser(prog="python -m fastdpot.experiments.mainjob.tuning",
                                description="Choose the main job's settings on a stand-in of the public part "
                                            "(public-half) or of the validation split (private-only, --set "
                                            "public_size=0), never on the private data.")
    p.add_argument("--out", required=True, help="output folder (one run folder per point, results.jsonl, table.md)")
    p.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                   help="a setting (dotted name, or a leaf name of one stage) and its values; repeatable")
    p.add_argument("--set", action="append", default=[], metavar="NAME=V",
                   help="a setting fixed for every point (the value is not split at commas); repeatable")
    p.add_argument("--select", default="accuracy_cnn", help="ranking metric: fid, label_fidelity, accuracy_*")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the stand-in split")
    p.add_argument("--holdout-size", type=int, default=None, help="public-half: held-out images (default: a third)")
    p.add_argument("--standin-public-size", type=int, default=None,
                   help="public-half: stand-in public images training the auto-encoder (default: half of the rest)")
    p.add_argument("--stand-in-size", type=int, default=4000,
                   help="private-only: validation images used as the stand-in sensitive set (the rest score)")
    p.add_argument("--folds", type=int, default=None,
                   help="private-only: K-fold cross-fitting over the validation split (each point runs K times)")
    p.add_argument("--seeds", default=None, help="comma-separated run seeds of every point (default: --set seed)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--progress", action="store_true")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """The tuning grid's command line; returns the exit status (0 on success, 2 on a bad argument)."""
    args = build_parser().parse_args(argv)
    try:
        fixed = parse_settings(args.set)
        grid = parse_settings(args.grid, grid=True) or {"seed": [fixed.get("seed", 0)]}
        rows = run_tuning(MainJobConfig().with_settings(**fixed), grid, args.out, select=args.select,
                          split_seed=args.split_seed, holdout_size=args.holdout_size,
                          standin_public_size=args.standin_public_size, stand_in_size=args.stand_in_size,
                          progress=args.progress, cache_dir=args.cache_dir, folds=args.folds,
                          seeds=None if args.seeds is None else [int(v) for v in args.seeds.split(",")])
    except (ValueError, FileNotFoundError) as err:
        print(f"fastdpot tuning: error: {err}", file=sys.stderr)
        return 2
    print(open(os.path.join(args.out, "table.md")).read())
    print(f"best: {rows[0]['settings']} (run folder {rows[0]['run']})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
