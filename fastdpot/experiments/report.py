"""The main job's outputs: ``samples.png`` (:func:`samples_grid`), ``metrics.json`` and ``privacy.md``
(:func:`write_outputs`), the per-seed summary of metrics.json (:func:`seed_summary`) and the ε of everything a run
releases over its ``flow_seeds`` (:func:`released_epsilon`)."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional

import torch

from .config import PipelineConfig

__all__ = ["write_outputs", "samples_grid", "seed_summary", "released_epsilon"]


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


def _per_class(p: Dict[str, Any]) -> bool:
    """Whether the run used the per-class flows (labels and class sizes assumed public)."""
    return bool(p.get("class_conditional")) and p.get("labels", "public") != "private"


def _init_text(kind: str, s: float) -> str:
    """The start's law in words, e.g. ``N(0, 0.3²·I_d/d)``."""
    f = "" if s == 1.0 else f"{s:g}²·"
    return {"gaussian": f"N(0, {f}I_d)", "gaussian_scaled": f"N(0, {f}I_d/d)",
            "sphere": f"uniform on the sphere of radius {s:g}"}[kind]


def _privacy_md(cfg: PipelineConfig, result: Dict[str, Any]) -> str:
    p = result["privacy"]
    lines = ["# Privacy of this run", ""]
    if not p["private"]:
        lines += ["**Non-private run (`--epsilon inf`): no differential-privacy guarantee.** The flow used the "
                  "private latents without noise (σ = 0).", ""]
    f0 = p["flows"]
    cond = _per_class(p)  # per-class flows: labels and class sizes assumed public
    lp = bool(p["class_conditional"]) and not cond  # one label-private flow on [latent, c·onehot(label)]
    zs = sorted({round(f["noise_multiplier"], 6) for f in f0 if f["noise_multiplier"] is not None})
    if p.get("replayable_noise"):
        lines += ["**Replayable noise (`--replayable-noise`): the flow's batches, directions and noise were drawn from "
                  f"seed {cfg.seed}. There is NO privacy guarantee against anyone who holds that seed (or the flow "
                  "checkpoint): with it and the other rows, the noise can be recomputed and removed.** The "
                  "statements below hold only against parties who know neither.", ""]
    elif p["private"]:
        lines += ["* Randomness: the flow's batches, directions and per-step noise keys were drawn from the operating "
                  "system's CSPRNG (`fastdpot.privacy.randomness`); they were never stored. The seed "
                  f"{cfg.seed} drove only the public work (split, auto-encoder, initial particles, evaluation).", ""]
    diam = f"2r (r = {p['clip_radius']:.4g})" if p.get("center") == "public" else "2"
    if lp:
        r_txt = f"{p['clip_radius']:.4g}" if p.get("center") == "public" else "1"
        diam = f"sqrt(4r² + 2c²) (r = {r_txt}, c = {p['label_scale']:g})"
    lines += [
        "## What was released",
        "",
        f"* Data: `{result['dataset']}` training set, split with seed {cfg.seed} into a public half "
        f"({result['n_public']} images) and a disjoint private half ({result['n_private']} images).",
        f"* The private images enter ONLY through the DP sliced-Wasserstein flow (DPSWflow-r, Sebag et al., TMLR), in "
        f"the auto-encoder's latent space (d = {result['latent_dim']}); "
        + (f"each latent (on the unit sphere) is shifted by the PUBLIC half's mean latent of its class and clipped "
           f"inside the flow step to the ball of radius r = {p['clip_radius']:.4g} about 0 (‖y − y'‖ ≤ 2r"
           + ("; the shift is a public function of the record (x, y), and the clipped latents of any two records "
              "are at most 2r apart)." if lp else
              "; neighbours differ in one image with its label unchanged, so both rows get the same shift).")
           if p.get("center") == "public" else
           "each latent is scaled onto the unit sphere inside the flow step (‖y − y'‖ ≤ 2).")
        + (f" Label-private class conditioning: each private row is [latent, c·e_label] in R^(d+C) (C = "
           f"{p['num_classes']} from the public half's labels, c = {p['label_scale']:g}), the label block rebuilt "
           f"inside the step; two rows are at most sqrt(4r² + 2c²) apart, label change included. A particle's "
           f"label is the argmax of its label block, read at the end (post-processing)." if lp else ""),
        f"* Per step and per flow: k = {p['num_projections']} fresh {p['directions']} directions Θ"
        f"{' (blocks of ' + ('d + C' if lp else 'd') + ' orthonormal rows, each a Haar-random rotation)' if p['directions'] == 'orthogonal' else ''}"
        f"; a batch of B = "
        f"{p['batch_size']} private latents drawn uniformly without replacement (fresh every step, never a replayed "
        f"epoch); "
        + ("the release is Y Θᵀ + V with V i.i.d. N(0, σ²) on each of the B·k projected values."
           if p.get("release", "points") == "points" else
           f"the release is the sliced quantile sketch (`fastdpot.privacy.sliced_quantile_sketch`): per direction "
           f"the B projected latents are sorted and summed in L = {p['sketch_bins']} rank bins whose sizes depend only "
           f"on B and L, and N(0, σ²) is added to each of the k·L bin sums; the flow's target is the isotonic fit "
           f"of the noisy bin means (post-processing). Its sensitivity is that of the per-point release (sorting "
           f"is an ℓ1 contraction, binning does not increase ℓ1; proof in the mechanism's docstring), so Δ, σ and "
           f"the accountant event below are the same; the particles get no smoothing noise."),
        f"* Number of releases: T = {p['steps']} steps per flow "
        f"({'one flow per class on disjoint label partitions: ' + str(len(f0)) + ' flows' if cond else 'one flow on the labelled rows' if lp else 'one flow'}); "
        f"steps actually taken: {[f['steps_taken'] for f in f0]}.",
        (f"* Sensitivity of one release (substitution of one row, every draw of Θ): Δ = {diam}·"
         f"sqrt(⌈k/{'(d+C)' if lp else 'd'}⌉) = "
         f"{f0[0]['sensitivity']:.6g}." if p["directions"] == "orthogonal" else
         f"* Sensitivity of one release (substitution of one row, probability ≥ 1 − δ_tail over Θ, {p['bound']} "
         f"bound): Δ = {diam}·sqrt(w(k, δ_tail)) = {f0[0]['sensitivity']:.6g}.") if p["private"] else
        "* Sensitivity: not applicable (no noise).",
        ("* Noise multiplier: each class flow's z_c = σ_c/Δ is calibrated by "
         "`fastdpot.privacy.calibrate_noise_multiplier` so that T steps at its sample rate q_c = B/n_c spend the "
         "target ε. z_c, σ_c and q_c are functions of the private class sizes n_c and are not published."
         if cond else
         f"* Noise multiplier z = σ/Δ: {zs} (calibrated by `fastdpot.privacy.calibrate_noise_multiplier` so that T "
         f"steps spend the target ε); σ = {[round(f['noise_std'], 6) for f in f0]}.") if p["private"] else "",
        "",
        "## Guarantee and accountant",
        "",
    ]
    if not p["private"]:
        lines += ["* None (ε = ∞): σ = 0 and nothing is accounted; the particles are a deterministic function of the "
                  "private latents, the batches and the directions."]
    rel = result.get("release") or dict(seeds=1, epsilon=result["epsilon"], delta=cfg.delta)
    if p["private"]:
        lines += [
            (f"* Target (ε, δ) = ({cfg.epsilon}, {cfg.delta}) per flow seed; **ε spent ≤ {cfg.epsilon}** at total "
             f"δ = {cfg.delta} for one seed (every class flow's budget refuses a step that would exceed the target; "
             "the exact per-class ε depends on n_c and is not published)." if cond else
             f"* Target (ε, δ) = ({cfg.epsilon}, {cfg.delta}) per flow seed; **ε spent = "
             f"{rel.get('epsilon_per_seed', result['epsilon']):.4f}** at total δ = {cfg.delta} for one seed."),
            (f"* **This run released {rel['seeds']} flows** on the same private half (`--flow-seeds "
             f"{rel['seeds']}`) and publishes the metrics of every one: its guarantee is their composition, "
             f"**(ε, δ) = ({rel['epsilon']:.4f}, {rel['delta']:.3g}){' (an upper bound)' if rel.get('is_bound') else ''}"
             f"** ({rel.get('how', '')}); see \"Seeds\" below." if rel["seeds"] > 1 else None),
            (f"* δ: all of it ({f0[0]['delta_accountant']:.3g}) goes to the accountant; the sensitivity holds for "
             f"every Θ, so no tail is spent." if p["directions"] == "orthogonal" else
             f"* δ split: δ = δ_acc + T·δ_tail with δ_acc = {f0[0]['delta_accountant']:.3g} for the accountant and "
             f"δ_tail = {f0[0]['delta_tail_per_step']:.3g} per step for the sensitivity tail over Θ (union bound "
             f"over the T draws of Θ)."),
            "* Accountant: RDP (dp-accounting) of the Gaussian mechanism subsampled without replacement, sample rate "
            + ("q_c = B/n_c per class flow" if cond else f"q = B/n = {round(f0[0]['sample_rate'], 5)}")
            + ", composed over every step taken.",
            _provenance_md(cfg),
        ]
        if cond:
            lines += ["* Class conditioning: one flow per label on its own partition. By parallel composition the "
                      "whole release is (ε, δ)-DP with the largest per-class ε, for neighbouring data sets that "
                      "differ in ONE IMAGE WITH ITS LABEL UNCHANGED (label-preserving replace-one). The labels and "
                      "the class sizes n_c (which set each flow's q_c and z_c) are ASSUMED PUBLIC. Under the "
                      "standard relations (add/remove one labelled image, or replace one with its label free to "
                      "change) the labels and class sizes are NOT protected. What this run publishes avoids them: "
                      "B = min(batch size, ⌊n/(2C)⌋), T from n/C, particles per class proportional to the PUBLIC "
                      "half's class counts; no per-class z, σ, q or ε is written."]
        if lp:
            lines += ["* Class conditioning (label-private): ONE flow on the rows [latent, c·e_label]. The whole "
                      "release is (ε, δ)-DP for neighbouring data sets that differ by the REPLACEMENT OF ONE "
                      "LABELLED IMAGE (x, y) BY ANY (x', y'), ITS LABEL FREE TO CHANGE (replace-one; the private "
                      "set's size n is public). The labels and the class sizes are protected: B, T, q = B/n, z, σ "
                      "and Δ are functions of n only; the number of classes C and the particles that start in each "
                      "class come from the PUBLIC half's labels; the generated class proportions come out of the "
                      "flow (post-processing). Nothing computed from the private class counts is used or written."]
    lines += [
        "",
        "## Outside the guarantee (public by assumption)",
        "",
        "* The public half of the training set and everything trained on it: the auto-encoder (architecture, "
        "weights, latent space) is fitted on the public half only and is public.",
        "* The real test set, used for FID and downstream accuracy, is public.",
        ("* The centres (the public half's mean latent of each class) are public statistics, and r "
         + ("is one too (the median distance of the public latents to their class centre)" if cfg.clip_radius is None
            else "was given")
         + "; the released particles live in the shifted space and get their class's centre added back "
           "(post-processing)." if p.get("center") == "public" else None),
        f"* The particle initialisation `{cfg.init}` ({_init_text(cfg.init, cfg.init_scale)}), drawn from the "
        "flow's seeded generator independently of the data (no privacy cost), and all randomness not applied to "
        "private data.",
        "* Post-processing of the released particles (no privacy cost): "
        + ("each class's particles are rescaled about their own mean by a factor s_c chosen so that their spread "
           "on the unit sphere equals that of the PUBLIC half's latents of the class (s_c = "
           f"{[round(v, 4) for v in result['metrics']['spread_scales']]}); the spread of the samples comes from "
           "public data, their class means and shapes from the private flow; " if cfg.spread == "public" else "")
        + ("the particles are scaled onto the unit sphere and decoded by the public decoder." if cfg.decode_on_sphere
           else "the particles are decoded by the public decoder."),
        "* Not claimed: amplification by the diffusion term (paper Thm. 3; λ = 0 here anyway); floating-point "
        "attacks on Gaussian sampling (Mironov 2012).",
        "",
    ]
    return "\n".join(ln for ln in lines if ln is not None)


#: The main job's defaults that predate the public-only tuning protocol (docs/mainjob/tuning.md, "Which defaults
#: predate the protocol"): chosen by sweeps of DP runs on the private half, scored on the real test set. Each entry:
#: (how privacy.md names it, whether a run's config uses it).
PREDATING_DEFAULTS = (
    ('`init="gaussian_scaled"`', lambda c: c.init == "gaussian_scaled"),
    ("`init_scale=0.3`", lambda c: c.init_scale == 0.3),
    ('`directions="orthogonal"`', lambda c: c.directions == "orthogonal"),
    ("the k = d (+C) rule (one orthogonal block of directions per step)", lambda c: c.num_projections is None),
    ('`center="none"`', lambda c: c.center == "none"),
)


def _provenance_md(cfg: PipelineConfig) -> Optional[str]:
    """The guarantee paragraph's statement of which of this run's settings were chosen on private data."""
    used = [name for name, uses in PREDATING_DEFAULTS if uses(cfg)]
    if not used:
        return None
    return ("* **Settings chosen on private data (not covered).** The guarantee holds for this run GIVEN its "
            "settings. Of them, " + ", ".join(used) + " are defaults chosen before the public-only tuning protocol "
            "(`python -m fastdpot.experiments.tuning`, docs/mainjob/tuning.md) existed, by sweeps of DP runs on the private half "
            "scored on the real test set (results/mainjob/NOTES.md): those runs and the selection are releases of "
            "the private half that no accountant here counts. Only the release, L, the step size (0.3 against 0.1) "
            "and the auto-encoder were re-chosen by the protocol on public data.")


def _seeds_md(cfg: PipelineConfig, result: Dict[str, Any]) -> str:
    """The "Seeds" section of privacy.md: what S flow seeds on the same private half release, and what the mean
    over seeds is (and is not)."""
    rel = result.get("release")
    if rel is None or rel["seeds"] <= 1 or not result["privacy"].get("private", True) or cfg.method == "public":
        return ""
    return "\n".join([
        "## Seeds: the ε of everything this run releases", "",
        f"* The generation stage ran {rel['seeds']} times (`--flow-seeds {rel['seeds']}`, seeds {cfg.seed + 1}–"
        f"{cfg.seed + rel['seeds']}) on the SAME private half, and `metrics.json` publishes every seed's scores "
        f"(`seeds`) and their mean and spread (`seed_summary`). Releases on the same data compose: the run is "
        f"**({rel['epsilon']:.4f}, {rel['delta']:.3g})-DP{' (an upper bound)' if rel['is_bound'] else ''}**, "
        f"{rel['how']} (`epsilon_spent`, `delta` in metrics.json); one seed alone is "
        f"({rel['epsilon_per_seed']:.4f}, {cfg.delta:g})-DP (`epsilon_per_seed`).",
        "* Choice: the seeds are composed and the total is reported, rather than each seed calibrated for a share of "
        "the budget, so that every seed is the same mechanism as a one-seed run at the target (its scores are those "
        "of the configured ε) and the published total says what publishing all of them costs.",
        "* The mean and spread over seeds describe how the algorithm's results vary between independent runs on "
        "the same private data: a statement about the algorithm, not a release of one run at the per-seed ε. A "
        "single run at the per-seed ε publishes one seed's numbers (`--flow-seeds 1`).", ""])


def write_outputs(run_dir: str, cfg: PipelineConfig, result: Dict[str, Any], images: torch.Tensor,
                  labels: Optional[torch.Tensor], class_names=None) -> Dict[str, str]:
    """Write ``samples.png``, ``metrics.json`` and ``privacy.md`` into ``run_dir``; returns their paths."""
    os.makedirs(run_dir, exist_ok=True)
    grid = samples_grid(images, labels, generator=torch.Generator().manual_seed(cfg.seed + 3))
    names = None
    if labels is not None:
        C = int(labels.max()) + 1
        names = list(class_names) if class_names and len(class_names) == C else [str(c) for c in range(C)]
    rel = result.get("release") or dict(epsilon=result["epsilon"], is_bound=_per_class(result["privacy"]))
    eps_txt = ("inf (non-private)" if math.isinf(cfg.epsilon) else
               f"≤ {rel['epsilon']:g}" if rel["is_bound"] else f"{rel['epsilon']:.2f}")
    what = {"flow": "DPSWflow-r", "gaussian": "DP Gaussian per class", "public": "public-only"}[cfg.method]
    title = (f"{result['dataset']}: {what}, ε = {eps_txt}, δ = {cfg.delta:g}" if cfg.method != "public" else
             f"{result['dataset']}: public-only baseline (no private data)")
    paths = dict(samples=os.path.join(run_dir, "samples.png"), metrics=os.path.join(run_dir, "metrics.json"),
                 privacy=os.path.join(run_dir, "privacy.md"))
    _save_grid_png(grid, paths["samples"], names, title)
    with open(paths["metrics"], "w") as f:
        json.dump(result["metrics"], f, indent=2, default=_json_default)
        f.write("\n")
    with open(paths["privacy"], "w") as f:
        if cfg.method == "flow":
            f.write(_privacy_md(cfg, result))
        else:
            from .baselines import baseline_privacy_md

            f.write(baseline_privacy_md(cfg, result))
        f.write(_seeds_md(cfg, result))
    return paths


def _flows_of(run: Dict[str, Any]) -> list:
    flow = run.get("flow")
    return [] if flow is None else list(getattr(flow, "flows", None) or [flow])


def released_epsilon(cfg: PipelineConfig, runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The (ε, δ) of everything a run publishes when its generation stage ran ``S = len(runs)`` times (the
    ``flow_seeds``) on the SAME private half: S releases on the same data compose. The run publishes every seed's
    metrics (and the first seed's samples), so its guarantee is the composition, not one seed's ε.

    How each method composes (``runs``: the outputs of ``stage_flow`` / ``stage_baseline``, one per seed):

    * one flow per seed (label-private, or unconditional): exactly, by RDP (dp-accounting) over every step of every
      seed's flow (the same sampled-without-replacement Gaussian events each seed's accountant recorded;
      substitution neighbours); each flow charges the tails of its planned T steps, so δ = δ_acc + S·T·δ_tail
      (δ_tail = 0 with orthogonal directions: δ is the configured one);
    * per-class flows (``labels="public"``): their exact ε depends on the class sizes, which are not published; the
      data-independent bound of basic composition, (S·ε, S·δ) (Dwork & Roth, "The Algorithmic Foundations of
      Differential Privacy", Thm. 3.16);
    * the DP Gaussian baseline: S Gaussian releases of noise σ on the same moments are one Gaussian release of noise
      σ/√S; its ε at δ by the PLD accountant (exact Gaussian composition);
    * the public-only baseline: ε = 0; a non-private run: ε = ∞.

    Returns:
        dict with ``epsilon`` and ``delta`` of the whole run, ``epsilon_per_seed`` (one seed alone, at the configured
        δ), ``seeds`` S, ``is_bound`` (an upper bound published instead of the exact value) and ``how`` (one line).
    """
    from ..privacy import PrivacyAccountant

    S, p, delta = len(runs), runs[0]["privacy"], cfg.delta
    one = runs[0]["epsilon"]
    out = dict(seeds=S, epsilon_per_seed=one, epsilon=one, delta=delta, is_bound=False, how="one seed")
    if cfg.method == "public" or not p.get("private", True):
        out.update(how="no private data used" if cfg.method == "public" else "non-private run")
        return out
    if cfg.method == "gaussian":
        acc = PrivacyAccountant("pld")
        acc.step(p["noise_std"] / p["sensitivity"], num_steps=S)
        eps = acc.get_epsilon(delta) if S > 1 else one
        return dict(out, epsilon=eps, how=f"{S} Gaussian release(s) of the per-class moments composed exactly "
                                          f"(one Gaussian of noise σ/√{S}; PLD, dp-accounting)")
    if _per_class(p):
        return dict(out, epsilon=S * cfg.epsilon, delta=S * delta, is_bound=True, epsilon_per_seed=cfg.epsilon,
                    how=f"basic composition of {S} per-class runs, each (ε, δ) = ({cfg.epsilon:g}, {delta:g})-DP "
                        f"(a bound that uses no class size)")
    flows = [f for r in runs for f in _flows_of(r)]
    if S == 1:
        return dict(out, how="one flow: its accountant")
    if any(f.ledger is None or f.ledger.accountant is None for f in flows):  # e.g. a rank without the ledger
        return dict(out, epsilon=S * one, delta=S * delta, is_bound=True,
                    how=f"basic composition of {S} runs, each ({one:.4g}, {delta:g})-DP")
    acc = PrivacyAccountant("rdp")
    for f in flows:
        for event, count in f.ledger.accountant._history:
            acc._record(event, count)
    d_acc, d_tail = flows[0].delta_split
    T = flows[0].config.steps
    rest = delta - T * d_tail  # each flow's accountant δ (flow.epsilon() asks its accountant there)
    return dict(out, epsilon=acc.get_epsilon(rest), delta=rest + S * T * d_tail,
                how=f"RDP composition (dp-accounting) of the {acc.steps} steps of the {S} flows (sampled without "
                    f"replacement, substitution neighbours)")


def _json_default(o):
    if isinstance(o, float) and math.isinf(o):
        return "inf"
    if isinstance(o, torch.Tensor):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _finite(v):
    """JSON has no inf: write it as the string "inf"."""
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return str(v)
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def seed_summary(rows) -> Dict[str, Dict[str, float]]:
    """{metric: {mean, std (sample, ddof 1; 0 for one seed), min, max, n}} over the per-seed rows' fid and
    accuracy_* values."""
    keys = [k for k in (rows[0] if rows else {}) if k == "fid" or k.startswith("accuracy_")]
    out = {}
    for k in keys:
        v = torch.tensor([float(r[k]) for r in rows], dtype=torch.float64)
        out[k] = dict(mean=float(v.mean()), std=float(v.std()) if v.numel() > 1 else 0.0, min=float(v.min()),
                      max=float(v.max()), n=int(v.numel()))
    return out
