"""The main job's outputs: ``samples.png`` (:func:`samples_grid`), ``epsilon.png`` and ``quantiles.png``
(:mod:`fastdpot.experiments.mainjob.pictures`), ``metrics.json``, ``privacy.md``
(:mod:`fastdpot.experiments.mainjob.privacy_report`) and ``config.json`` (:func:`write_outputs`), the ε of
everything a run publishes over its seeds (:func:`released_epsilon`), the per-seed summary (:func:`seed_summary`)
and the table of the private-only protocol's runs (:func:`summarize`, ``python -m
fastdpot.experiments.mainjob.report FOLDER``)."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional

import torch

__all__ = ["write_outputs", "samples_grid", "seed_summary", "released_epsilon", "summarize", "finite_json"]


def samples_grid(images: torch.Tensor, labels: Optional[torch.Tensor], per_class: int = 10,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A (C, rows·H, cols·W) grid: one row per class (``per_class`` random samples each), or a square grid of
    unlabelled samples. Images (N, C, H, W) in [0, 1]."""
    g = generator or torch.Generator().manual_seed(0)
    if labels is not None:
        rows = []
        for c in range(int(labels.max()) + 1):
            idx = torch.nonzero(labels == c).flatten()
            idx = idx[torch.randperm(idx.numel(), generator=g)[:per_class]]
            row = images[idx]
            if row.shape[0] < per_class:
                row = torch.cat([row, images.new_zeros((per_class - row.shape[0],) + tuple(images.shape[1:]))])
            rows.append(row)
        tiles = torch.stack(rows)  # (R, cols, C, H, W)
    else:
        side = max(1, int(math.isqrt(min(images.shape[0], per_class * per_class))))
        idx = torch.randperm(images.shape[0], generator=g)[:side * side]
        tiles = images[idx].view(side, side, *images.shape[1:])
    R, K, C, H, W = tiles.shape
    return tiles.permute(2, 0, 3, 1, 4).reshape(C, R * H, K * W)


def _save_grid_png(grid: torch.Tensor, path: str, row_names=None, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img = grid.permute(1, 2, 0).numpy()
    fig_h = max(2.0, img.shape[0] / 40.0)
    fig, ax = plt.subplots(figsize=(fig_h * img.shape[1] / img.shape[0] + (1.4 if row_names else 0), fig_h))
    ax.imshow(img[..., 0] if img.shape[2] == 1 else img, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    if row_names:
        h = img.shape[0] / len(row_names)
        ax.set_yticks([h * (i + 0.5) for i in range(len(row_names))])
        ax.set_yticklabels(row_names, fontsize=8)
    else:
        ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(run_dir: str, cfg, result: Dict[str, Any], images: torch.Tensor, labels: Optional[torch.Tensor],
                  class_names=None, runs: Optional[List[Dict[str, Any]]] = None, ledger=None) -> Dict[str, str]:
    """Write ``samples.png``, ``metrics.json``, ``privacy.md`` and ``config.json`` into ``run_dir``, and given the
    generation ``runs`` (and the private-only run's ``ledger``) the pictures of
    :func:`fastdpot.experiments.mainjob.pictures.write_pictures` (``epsilon.png``; ``quantiles.png`` for the
    one-shot method); returns their paths."""
    from .config import flat_settings
    from .privacy_report import privacy_md

    os.makedirs(run_dir, exist_ok=True)
    grid = samples_grid(images, labels, generator=torch.Generator().manual_seed(cfg.seed + 3))
    names = None
    if labels is not None:
        C = int(labels.max()) + 1
        names = list(class_names) if class_names and len(class_names) == C else [str(c) for c in range(C)]
    rel = result["release"]
    method = cfg.generation.method
    eps_txt = ("inf (non-private)" if not cfg.private or method == "decoded" else
               f"≤ {rel['epsilon']:g}" if rel["is_bound"] else f"{rel['epsilon']:.2f}")
    what = {"oneshot": "one-shot sketch + pixel flow", "flow": "DPSWflow-r", "gaussian": "DP Gaussian per class",
            "public": "public-only",
            "decoded": "decoded sensitive codes (NOT private)"}[method]
    title = (f"{result['dataset']}: {what}, ε = {eps_txt}, δ = {cfg.delta:.3g}" if method != "public" else
             f"{result['dataset']}: public-only baseline (no private data)")
    if cfg.protocol == "private-only":
        title = f"private-only, {title}"
    fidelity = result["metrics"].get("label_fidelity")
    if fidelity is not None:
        title += f", label fidelity {100 * fidelity:.1f} %"
    paths = {k: os.path.join(run_dir, f) for k, f in (("samples", "samples.png"), ("metrics", "metrics.json"),
                                                      ("privacy", "privacy.md"), ("config", "config.json"))}
    _save_grid_png(grid, paths["samples"], names, title)
    if runs is not None:
        from .pictures import write_pictures

        paths.update(write_pictures(run_dir, cfg, result, runs, ledger, names))
    with open(paths["metrics"], "w") as f:
        json.dump(result["metrics"], f, indent=2, default=_json_default)
        f.write("\n")
    with open(paths["privacy"], "w") as f:
        f.write(privacy_md(cfg, result))
    with open(paths["config"], "w") as f:
        json.dump(finite_json(flat_settings(cfg)), f, indent=2)
    return paths


def _flows_of(run: Dict[str, Any]) -> list:
    flow = run.get("flow")
    return [] if flow is None else list(getattr(flow, "flows", None) or [flow])


def released_epsilon(cfg, runs: List[Dict[str, Any]], ledger=None) -> Dict[str, Any]:
    """The (ε, δ) of everything a run publishes: its representation and its S = ``len(runs)`` generation runs on the
    same private data (every seed's metrics, the first seed's samples).

    * private-only (``ledger``): the composed ledger's ε (RDP, every stage and every seed recorded in it);
    * public-half, one flow per seed: exactly, by RDP (dp-accounting) over every step of every seed's flow, each
      flow charging the tails of its planned T steps (δ = δ_acc + S·T·δ_tail; δ_tail = 0 with orthogonal
      directions);
    * per-class flows (``labels="public"``): their exact ε depends on the class sizes, which are not published; the
      data-independent bound of basic composition, S times each seed's target (Dwork & Roth, "The Algorithmic
      Foundations of Differential Privacy", Thm. 3.16);
    * the DP Gaussian: S Gaussian releases of noise σ on the same moments are one Gaussian release of noise σ/√S;
      its ε at δ by the PLD accountant (exact Gaussian composition);
    * the public-only baseline: ε = 0; a non-private run or the decoded analysis: ε = ∞.

    Returns:
        dict with ``epsilon`` and ``delta`` of the whole run, ``epsilon_per_seed`` (one seed alone), ``seeds`` S,
        ``is_bound`` (an upper bound published instead of the exact value), ``how`` (one line) and ``stages``: how
        the ε was spent, one ``{"stage": label, "epsilon": ε}`` per stage in order (the composed ledger's stages;
        else one per seed), ε the same composition's value for that stage and those before it, at ``delta`` (the
        last is ``epsilon``; empty when no ε is spent or none holds). Labels name public settings only (never a
        per-class value, which would read a class size).
    """
    from ...privacy import PrivacyAccountant

    S, p, delta, g = len(runs), runs[0]["privacy"], cfg.delta, cfg.generation
    one = runs[0]["epsilon"]
    out = dict(seeds=S, epsilon_per_seed=one, epsilon=one, delta=delta, is_bound=False, how="one seed", stages=[])
    if g.method in ("public", "decoded") or not cfg.private:
        return dict(out, epsilon=0.0 if g.method == "public" else math.inf,
                    epsilon_per_seed=0.0 if g.method == "public" else math.inf,
                    how="no private data used" if g.method == "public" else "non-private")
    seeds = [f"seed {i + 1}" if S > 1 else "" for i in range(S)]
    if ledger is not None:
        how = (f"one composed ledger ({ledger.accountant_used.upper()}, dp-accounting): the representation and {S} "
               f"generation run(s), {len(ledger.stages)} stage(s)")
        stages = [_stage(f"{s['stage']}\n{s['releases']} × z = {s['noise_multiplier']:.3g}", e)
                  for s, e in zip(ledger.stages, ledger.epsilon_by_stage())]
        return dict(out, epsilon=ledger.epsilon(), how=how, stages=stages)
    if g.method == "gaussian":
        z = p["noise_std"] / p["sensitivity"]
        acc = PrivacyAccountant("pld")
        acc.step(z, num_steps=S)
        eps = acc.get_epsilon(delta)
        label = f"Gaussian per class\nz = {z:.3g}"
        if S == 1:
            return dict(out, how="one Gaussian release per class (analytic σ)", stages=[_stage(label, one)])
        prefix = []
        for i in range(1, S):  # the first i seeds' releases: one Gaussian of noise σ/√i
            part = PrivacyAccountant("pld")
            part.step(z, num_steps=i)
            prefix.append(part.get_epsilon(delta))
        return dict(out, epsilon=eps, epsilon_per_seed=prefix[0],
                    how=f"{S} Gaussian release(s) of the per-class moments composed exactly (one Gaussian of noise "
                        f"σ/√{S}; PLD, dp-accounting)",
                    stages=[_stage(_lines(label, s), e) for s, e in zip(seeds, prefix + [eps])])
    budget = p.get("budget") or {}
    if _per_class(p):
        per = budget.get("target_epsilon", cfg.epsilon)
        per_delta = delta if g.each_seed_at_epsilon or S == 1 else delta / S
        return dict(out, epsilon=S * per, delta=S * per_delta, is_bound=True, epsilon_per_seed=per,
                    how=f"basic composition of {S} per-class run(s), each ({per:g}, {per_delta:g})-DP (a bound that "
                        f"uses no class size)",
                    stages=[_stage(_lines("per-class flows", s, f"ε ≤ {per:g} each"), (i + 1) * per)
                            for i, s in enumerate(seeds)])
    flows = [f for r in runs for f in _flows_of(r)]
    steps = p["flows"][0]["steps_taken"] if p.get("flows") else p.get("steps")
    z = p["flows"][0]["noise_multiplier"] if p.get("flows") else None
    label = "flow" + ("" if steps is None else f"\n{steps} steps") + ("" if z is None else f" × z = {z:.3g}")
    if S == 1:
        return dict(out, how="one flow: its accountant", stages=[_stage(label, one)])

    def basic(per):  # seed i: i·per by basic composition
        return [_stage(_lines(label, s), (i + 1) * per) for i, s in enumerate(seeds)]

    if any(f.ledger is None or f.ledger.accountant is None for f in flows):  # e.g. a rank without the ledger
        return dict(out, epsilon=S * one, delta=S * delta, is_bound=True, stages=basic(one),
                    how=f"basic composition of {S} runs, each ({one:.4g}, {delta:g})-DP")
    d_acc, d_tail = flows[0].delta_split  # one accountant over every seed's steps, at one flow's δ_acc
    acc, prefix = PrivacyAccountant("rdp"), []
    for r in runs:
        for f in _flows_of(r):
            for event, count in f.ledger.accountant._history:
                acc._record(event, count)
        prefix.append(acc.get_epsilon(d_acc))  # the seeds so far (their δ is within the run's)
    T = flows[0].config.steps
    total_delta = d_acc + S * T * d_tail
    eps = prefix[-1]
    how = (f"RDP composition (dp-accounting) of the {acc.steps} steps of the {S} flows (sampled without replacement, "
           f"substitution neighbours)")
    target = budget.get("target_epsilon")
    if target is not None and S * target < eps:  # basic composition of the seeds' own (ε, δ) is the smaller bound
        return dict(out, epsilon=S * target, delta=S * flows[0].config.delta, is_bound=True, stages=basic(target),
                    how=f"basic composition of {S} flows, each ({target:g}, {flows[0].config.delta:g})-DP")
    return dict(out, epsilon=eps, delta=total_delta, how=how,
                stages=[_stage(_lines(label, s), e) for s, e in zip(seeds, prefix)])


def _stage(label: str, epsilon: float) -> Dict[str, Any]:
    return dict(stage=label, epsilon=float(epsilon))


def _lines(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def _per_class(p: Dict[str, Any]) -> bool:
    return bool(p.get("class_conditional")) and p.get("labels", "public") != "private"


def _json_default(o):
    if isinstance(o, float) and math.isinf(o):
        return "inf"
    if isinstance(o, torch.Tensor):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def finite_json(v):
    """JSON has no inf: write it as the string "inf"."""
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return str(v)
    if isinstance(v, dict):
        return {k: finite_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite_json(x) for x in v]
    return v


def seed_summary(rows) -> Dict[str, Dict[str, float]]:
    """{metric: {mean, std (sample, ddof 1; 0 for one seed), min, max, n}} over the per-seed rows' fid,
    label_fidelity and accuracy_* values."""
    keys = [k for k in (rows[0] if rows else {}) if k in ("fid", "label_fidelity") or k.startswith("accuracy_")]
    out = {}
    for k in keys:
        v = torch.tensor([float(r[k]) for r in rows], dtype=torch.float64)
        out[k] = dict(mean=float(v.mean()), std=float(v.std()) if v.numel() > 1 else 0.0, min=float(v.min()),
                      max=float(v.max()), n=int(v.numel()))
    return out


def _non_finite(v) -> bool:
    """None, ∞ or its JSON spelling \"inf\"."""
    return v is None or v == "inf" or (isinstance(v, float) and not math.isfinite(v))


def _off_row(config_path: str, method: str, eps: Optional[float]) -> str:
    """`` (name=value, ...)``: the one-shot settings in which a run's ``config.json`` departs from its ε table row
    (ε = ∞: the ε = 10 row), so that runs of different settings get rows of their own; "" when none or no config."""
    if method != "oneshot" or not os.path.isfile(config_path):
        return ""
    from .settings import DataSettings, table_row

    with open(config_path) as f:
        cfg = json.load(f)
    data = DataSettings(dataset=cfg.get("data.dataset", "auto"), celeba_dir=cfg.get("data.celeba_dir"))
    row = table_row(math.inf if eps is None else eps, data)["generation"]
    off = [f"{k}={cfg[f'generation.{k}']}" for k, v in row.items()
           if f"generation.{k}" in cfg and cfg[f"generation.{k}"] is not None and cfg[f"generation.{k}"] != v]
    return f" ({', '.join(off)})" if off else ""


def summarize(folder: str) -> str:
    """A markdown table of the private-only runs under ``folder`` (one ``metrics.json`` per run folder), grouped by
    (method, ε, labels_from, latent dimension d): the mean ± sd over the runs (each an independent run with its own
    ε and its own DP representation; the spread describes the algorithm: no pooled release), how many of them
    measured FID at how many images (a run with ``fid_samples=0`` adds to the other columns only), and each run's
    wall time."""
    import statistics

    rows: Dict[tuple, list] = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, "metrics.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            m = json.load(f)
        eps = None if _non_finite(m["epsilon_target"]) else float(m["epsilon_target"])  # None: ε = ∞
        key = (m["method"] + _off_row(os.path.join(folder, name, "config.json"), m["method"], eps), eps,
               m.get("labels_from", "flow"), m["representation"]["latent_dim"])
        rows.setdefault(key, []).append(m)

    def stat(ms, k, scale=1.0, fmt="{:.1f}"):
        vals = [m[k] * scale for m in ms if m.get(k) is not None]
        if not vals:
            return "–"
        if len(vals) == 1:
            return fmt.format(vals[0])
        return f"{fmt.format(statistics.mean(vals))} ± {fmt.format(statistics.stdev(vals))}"

    def fid_counts(ms):
        counts = sorted({(m.get("fid_generated_samples"), m.get("fid_real_samples")) for m in ms
                         if m.get("fid") is not None})
        k = sum(m.get("fid") is not None for m in ms)
        return "–" if not k else f"{k} × " + ", ".join(f"{g} vs {r}" for g, r in counts)

    out = ["| method | ε (target) | ε (composed) | labels | d | runs | CNN acc. % | FID (sensitive) | FID (test) | "
           "FID runs × images | label fidelity % | wall time min |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (method, eps, lab, d), ms in sorted(rows.items(), key=lambda kv: (kv[0][0], -(kv[0][1] or 1e9), kv[0][2],
                                                                          -(kv[0][3] or 0))):
        composed = "∞ (not private)" if method == "decoded" or eps is None else stat(ms, "epsilon", fmt="{:.3f}")
        eps = "∞" if eps is None else f"{eps:g}"
        minutes = ", ".join("{:.0f}".format(m["wall_time_s"]["total"] / 60) for m in ms)
        out.append(f"| {method} | {eps} | {composed} | {lab} | {d} | {len(ms)} | {stat(ms, 'accuracy_cnn', 100)} | "
                   f"{stat(ms, 'fid')} | {stat(ms, 'fid_test')} | {fid_counts(ms)} | "
                   f"{stat(ms, 'label_fidelity', 100)} | {minutes} |")
    return "\n".join(out)


def main(argv=None) -> int:
    """``python -m fastdpot.experiments.private_only FOLDER``: print :func:`summarize` of the run folders in FOLDER
    (the runs themselves: ``fastdpot flow --public-size 0 ...``, see ``scripts/private_only.sh``)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m fastdpot.experiments.mainjob.report",
                                description="Summarise the private-only protocol's runs (one metrics.json each).")
    p.add_argument("folder", help="the folder holding one run folder per run (e.g. results/private_only)")
    a = p.parse_args(argv)
    print(summarize(a.folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
