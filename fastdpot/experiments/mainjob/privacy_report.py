"""``privacy.md``: the one writer of a run's privacy statement, for both protocols and every method.

Sections: what was released and the guarantee (:func:`_flow_md` for the public-half flows, :func:`_baseline_md`
for its baselines, :func:`_private_only_md` for the private-only protocol's composed ledger), the seeds
(:func:`_seeds_md`), where every setting came from (:func:`_settings_md`), what the evaluation read outside the
guarantee (:func:`_evaluation_md`) and which release came from a cache (:func:`_cache_md`).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from .settings import ONESHOT_SETTINGS

__all__ = ["privacy_md", "SETTING_ORIGINS", "ACCOUNTANT_CALLS"]


def privacy_md(cfg, result: Dict[str, Any]) -> str:
    """The text of ``privacy.md`` for a run with resolved settings ``cfg`` and the pipeline's ``result`` (its
    ``metrics``, ``privacy`` of the generation stage, ``release`` (the ε of everything published), ``representation``
    info)."""
    if cfg.protocol == "private-only":
        lines = ["# Privacy of this run (private-only protocol)", ""] + _private_only_md(result["metrics"])
    elif cfg.generation.method == "flow":
        lines = _flow_md(cfg, result)
    else:
        lines = ["# Privacy of this run", ""] + _baseline_md(cfg, result)
    lines += [_seeds_md(cfg, result), _settings_md(cfg, result), _evaluation_md(cfg, result), _cache_md(result)]
    return "\n".join(ln for ln in lines if ln is not None)


def _init_text(kind: str, s: float) -> str:
    """The start's law in words, e.g. ``N(0, 0.3²·I_d/d)``."""
    f = "" if s == 1.0 else f"{s:g}²·"
    return {"gaussian": f"N(0, {f}I_d)", "gaussian_scaled": f"N(0, {f}I_d/d)",
            "sphere": f"uniform on the sphere of radius {s:g}"}[kind]


def _flow_md(cfg, result: Dict[str, Any]) -> List[str]:
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
         + ("is one too (the median distance of the public latents to their class centre)" if cfg.generation.clip_radius is None
            else "was given")
         + "; the released particles live in the shifted space and get their class's centre added back "
           "(post-processing)." if p.get("center") == "public" else None),
        f"* The particle initialisation `{cfg.generation.init}` ({_init_text(cfg.generation.init, cfg.generation.init_scale)}), drawn from the "
        "flow's seeded generator independently of the data (no privacy cost), and all randomness not applied to "
        "private data.",
        "* Post-processing of the released particles (no privacy cost): "
        + ("each class's particles are rescaled about their own mean by a factor s_c chosen so that their spread "
           "on the unit sphere equals that of the PUBLIC half's latents of the class (s_c = "
           f"{[round(v, 4) for v in result['metrics']['spread_scales']]}); the spread of the samples comes from "
           "public data, their class means and shapes from the private flow; " if cfg.generation.spread == "public" else "")
        + ("the particles are scaled onto the unit sphere and decoded by the public decoder." if cfg.generation.decode_on_sphere
           else "the particles are decoded by the public decoder."),
        "* Not claimed: amplification by the diffusion term (paper Thm. 3; λ = 0 here anyway); floating-point "
        "attacks on Gaussian sampling (Mironov 2012).",
        "",
    ]
    return lines


#: The main job's defaults that predate the public-only tuning protocol (docs/mainjob/tuning.md, "Which defaults
#: predate the protocol"): chosen by sweeps of DP runs on the private half, scored on the real test set. Each entry:
#: (how privacy.md names it, whether a run's config uses it).
PREDATING_DEFAULTS = (
    ('`init="gaussian_scaled"`', lambda c: c.generation.init == "gaussian_scaled"),
    ("`init_scale=0.3`", lambda c: c.generation.init_scale == 0.3),
    ('`directions="orthogonal"`', lambda c: c.generation.directions == "orthogonal"),
    ("the k = d (+C) rule (one orthogonal block of directions per step)", lambda c: c.generation.num_projections is None),
    ('`center="none"`', lambda c: c.generation.center == "none"),
)


def _provenance_md(cfg) -> Optional[str]:
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


def _per_class(p: Dict[str, Any]) -> bool:
    """Whether the run used the per-class flows (labels and class sizes assumed public)."""
    return bool(p.get("class_conditional")) and p.get("labels", "public") != "private"


def _seeds_md(cfg, result: Dict[str, Any]) -> Optional[str]:
    """The "Seeds" section: what S generation runs on the same private data release, and how the run's ε binds
    them."""
    rel = result.get("release")
    g = cfg.generation
    if rel is None or rel["seeds"] <= 1 or not cfg.private or g.method in ("public", "decoded"):
        return None
    how = ("each seed was calibrated alone to the run's ε (`--each-seed-at-epsilon`): the published total is their "
           "composition, more than the ε asked for" if g.each_seed_at_epsilon else
           "each seed was calibrated for its share, so that all of them together stay within the run's ε "
           "(the budget a user asks for binds everything one invocation publishes)")
    return "\n".join([
        "## Seeds: the ε of everything this run releases", "",
        f"* The generation stage ran {rel['seeds']} times (`--flow-seeds {rel['seeds']}`, seeds {cfg.seed + 1}–"
        f"{cfg.seed + rel['seeds']}) on the SAME private data, and `metrics.json` publishes every seed's scores "
        f"(`seeds`) and their mean and spread (`seed_summary`); {how}. Releases on the same data compose: the run "
        f"is **({rel['epsilon']:.4f}, {rel['delta']:.3g})-DP{' (an upper bound)' if rel['is_bound'] else ''}**, "
        f"{rel['how']} (`epsilon_spent`, `delta` in metrics.json); one seed alone is "
        f"({rel['epsilon_per_seed']:.4f}, {cfg.delta:g})-DP (`epsilon_per_seed`).",
        "* The mean and spread over seeds describe how the algorithm's results vary between independent runs on "
        "the same private data at the per-seed budget: a statement about the algorithm, not a release of one run at "
        "the run's ε.", ""])


#: Where each setting of the private-only protocol's release came from (privacy.md lists those of the run's method).
#: A value given for the run is the user's choice, and privacy.md says so; a value the ε table's row gave has the
#: origin that row states (``settings.PRIVATE_ONLY_TABLE[ε]["origins"]``), which wins over the entry here.
_ROW = "the ε table's row (settings.PRIVATE_ONLY_TABLE: the row's origins)"
SETTING_ORIGINS = {
    "data.validation_size": "DPImageBench's protocol (55 000 sensitive / 5 000 validation images)",
    "delta": "DPImageBench's protocol, δ = 1/(N ln N)",
    "generation.method": "validation split (docs/mainjob-private.md: the one-shot flow against the DP Gaussian and "
                         "the per-step flow)",
    "generation.num_particles": "DPImageBench's protocol (60 000 synthetic images)",
    "representation.kind": "validation split (docs/mainjob-private.md)",
    "representation.latent_dim": "DP-PCA: " + _ROW + "; the DP-SGD auto-encoder: d = 16, set by hand (one "
                                 "validation-split run, docs/mainjob-private.md)",
    "representation.share": "DP-PCA: " + _ROW + "; the DP-SGD auto-encoder: 0.9, set by hand (one validation-split "
                            "run, docs/mainjob-private.md)",
    "representation.scale": "data-independent: pixels in [0, 1] give image norms <= 28; S = 16 clips the rare "
                            "bright images",
    "representation.lowpass": "validation split (docs/mainjob-private.md)",
    "generation.sketch_blocks": _ROW,
    "generation.sketch_plan": _ROW,
    "generation.sketch_radius": _ROW,
    "generation.sketch_center": _ROW,
    "generation.sketch_mean_share": _ROW,
    "generation.sketch_rounds": _ROW,
    "generation.sketch_rotations": _ROW,
    "generation.sketch_rotation_bins": _ROW,
    "generation.sketch_clamp": _ROW,
    "generation.sketch_shrink": _ROW,
    "generation.sketch_floor": _ROW,
    "generation.sketch_block_directions": "data-independent: unset, every block is a full basis of the D pixels; a "
                                          "user may keep each block's lowest frequencies (a memory choice that reads "
                                          "no data)",
    "generation.release": "the public-half protocol's public-only sweep (docs/mainjob/tuning.md)",
    "generation.sketch_bins": "the public-half protocol's public-only sweep (docs/mainjob/tuning.md)",
    "generation.step_size": "for the per-step flow (h = 0.3) the validation split (docs/mainjob-private.md); for the "
                            "one-shot flow " + _ROW,
    "generation.epochs": "Sebag et al., TMLR (not tuned)",
    "generation.batch_size": "the public-half protocol's public-only sweep (docs/mainjob/tuning.md)",
    "generation.label_scale": "data-independent: c = 1, the codes' radius",
    "generation.directions": "data-independent: orthogonal blocks have a deterministic sensitivity (no tail, all "
                             "of δ to the accountant)",
    "generation.num_projections": "data-independent: one full orthonormal block in R^(d+C), the least noise per "
                                  "projected value at equal information per step",
    "generation.init": "data-independent: a Gaussian start about the origin of the codes' unit ball",
    "generation.init_scale": _ROW,
}
#: the settings each private-only method's release reads
_READS = {
    # every one-shot setting (settings.ONESHOT_SETTINGS: a new setting joins privacy.md by joining the method)
    "oneshot": ("generation.method", "generation.num_particles", "representation.kind")
    + tuple(f"generation.{name}" for name in ONESHOT_SETTINGS) + ("generation.step_size",),
    "flow": ("generation.method", "generation.num_particles", "representation.kind", "representation.latent_dim",
             "representation.share", "representation.scale", "representation.lowpass", "generation.release",
             "generation.sketch_bins", "generation.step_size", "generation.epochs", "generation.batch_size",
             "generation.label_scale", "generation.directions", "generation.num_projections", "generation.init",
             "generation.init_scale"),
    "gaussian": ("generation.method", "generation.num_particles", "representation.kind", "representation.latent_dim",
                 "representation.share", "representation.scale", "representation.lowpass"),
}


def _settings_md(cfg, result: Dict[str, Any]) -> Optional[str]:
    """Where every setting of the private-only protocol's release came from (the public-half protocol states its
    own in the guarantee paragraph, :func:`_provenance_md`)."""
    method = cfg.generation.method
    if cfg.protocol != "private-only" or not cfg.private or method not in _READS:
        return None
    from .config import flat_settings

    resolved = dict(flat_settings(cfg), delta=cfg.delta)
    user = result.get("user_settings") or {}  # the settings this run was given that differ from the defaults
    from_row = _row_origins(cfg)
    rows = ["## Where each setting came from", "",
            "The guarantee holds for this run given its settings; none was chosen by looking at the sensitive set. "
            "Each was swept on the validation split, taken from a protocol or a paper, or set by hand on public "
            "grounds, as the table says.",
            "", "| setting | value | origin |", "|---|---|---|"]
    for name in ("data.validation_size", "delta") + _READS[method]:
        origin = ("given by the user for this run" if name in user else
                  from_row.get(name, SETTING_ORIGINS[name]))
        rows.append(f"| `{name}` | {resolved.get(name)} | {origin} |")
    return "\n".join(rows + [""])


def _row_origins(cfg) -> Dict[str, str]:
    """``{setting: origin}`` of the settings the run's ε table row gave it (the row's ``origins``): the one-shot
    method's from ``generation``, the per-step flow's start from ``flow``, DP-PCA's from ``representation``
    (config.resolve applies the same sections)."""
    from .settings import table_row

    row = table_row(cfg.epsilon, cfg.data)
    method, kind = cfg.generation.method, cfg.representation.kind
    sections = (["generation"] if method == "oneshot" else []) + (["flow"] if method == "flow" else []) + \
        (["representation"] if kind == "pca" else [])
    return {f"{'representation' if sec == 'representation' else 'generation'}.{k}": origin
            for sec in sections for k, origin in row["origins"][sec].items()}


def _evaluation_md(cfg, result: Dict[str, Any]) -> Optional[str]:
    """The evaluation statistics computed on sensitive data WITHOUT noise: outside the guarantee."""
    m = result["metrics"]
    rows = ["## Evaluation statistics outside the guarantee", ""]
    if cfg.protocol == "private-only":
        if m.get("fid") is not None:
            rows += [f"* FID (`fid`, {m.get('fid_real_samples')} images): computed against the SENSITIVE images "
                     "without noise (DPImageBench's protocol). It is a statistic of the sensitive set that no "
                     "accountant here counts: publishing it is outside the (ε, δ) above.",
                     "* The Inception statistics (mean and covariance of the features) of those sensitive images are "
                     "cached, keyed by content, in the `fid_real_stats/` folder of the user's cache (`--cache-dir`, "
                     "default `$FASTDPOT_CACHE` or `~/.cache/fastdpot`), never in this run folder. They are "
                     "sensitive-derived data, outside the guarantee like the FID itself: that folder (its README.txt "
                     "says so) belongs where the sensitive data's own protection applies and must not be published."]
        rows += ["* Label fidelity (`label_fidelity`): its judge is trained on the validation split only; it reads no "
                 "sensitive image (inside the guarantee: post-processing of the samples).",
                 "* Accuracy (`accuracy_*`) and `fid_test`: classifiers trained on the samples, their checkpoint "
                 "chosen on the validation split (`cnn_selected_epoch`), scored once on the public test set "
                 "(post-processing of the release).", ""]
    else:
        rows += ["* None: FID and accuracy are measured on the real test set, which is public; no evaluation "
                 "statistic reads the private half.", ""]
    return "\n".join(rows)


def _cache_md(result: Dict[str, Any]) -> Optional[str]:
    """Which release this run read back from a cache, and whose it was."""
    rep = result.get("representation") or {}
    if not rep.get("cached"):
        return None
    whose = ("this run's own release, kept in its run folder (`private/`) and read back when the run resumed"
             if rep.get("secure_mode", True) else
             "a replayable release (rebuildable from the seed), shared between replayable runs")
    return "\n".join(["## Releases read from a cache", "",
                      f"* The representation (its {rep.get('steps')} release(s), recorded in the ledger again) is "
                      f"{whose} (owner `{rep.get('cache_owner')}`).", ""])


def _baseline_md(cfg, result: Dict) -> List[str]:
    """privacy.md of a baseline run (``cfg.method`` "gaussian" or "public")."""
    p = result["privacy"]
    head = [
            f"* Data: `{result['dataset']}` training set, split with seed {cfg.seed} into a public part "
            f"({result['n_public']} images) and a disjoint private part ({result['n_private']} images).",
            "* Public by assumption: the public part, the auto-encoder trained on it, the real test set (FID and "
            "classifiers), the labels and so the class counts."]
    if p["method"] == "public":
        return head + [
            "* **Public-only baseline (`--method public`)**: the samples are the public part's own latents with "
            "their labels, decoded. No private image is read: nothing is released about the private part (ε = 0).",
            ""]
    if not p["private"]:
        guarantee = ["* **Non-private (`--epsilon inf`)**: the exact per-class moments, no noise, no guarantee."]
    else:
        guarantee = [f"* Guarantee: (ε, δ) = ({cfg.epsilon}, {cfg.delta}) by the Gaussian mechanism (analytic "
                     f"calibration, Balle & Wang, ICML 2018) per class and parallel composition over the classes."]
    bound = ("each latent scaled onto the unit sphere (r = 1)" if p["center"] == "none" else
             f"each latent shifted by its class's PUBLIC mean latent and clipped to radius r = {p['clip_radius']:.4g}")
    return head + [
        "* **DP Gaussian baseline (`--method gaussian`)**: per class, " + bound + " inside the mechanism; one "
        "release of (Σ x, Σ x xᵀ) with i.i.d. N(0, σ²) noise on every entry (float64), σ = "
        f"{p['noise_std']:.6g}, sensitivity Δ = {p['sensitivity']:.6g} (replace-one neighbours that keep the "
        "label; proof in `fastdpot.baselines.moments_sensitivity`).",
        "* Post-processing (no privacy cost): mean and covariance from the noisy moments, covariance projected onto "
        "the PSD cone, samples drawn from the Gaussian of each class, decoded by the public decoder.",
        *guarantee,
        "* Not covered: an image that changes class; floating-point attacks on Gaussian sampling (Mironov 2012).",
        ""]


def _non_finite(v) -> bool:
    """None, ∞ or its JSON spelling "inf" (:func:`fastdpot.experiments.report._finite`)."""
    return v is None or v == "inf" or (isinstance(v, float) and not math.isfinite(v))


def _accountant_words(m: Dict[str, Any]) -> str:
    """The composed ledger's accountant (``metrics["accountant"]``: :attr:`ComposedLedger.accountant_used`)."""
    return ("privacy-loss-distribution accountant (exact for these full-batch Gaussian mechanisms)"
            if m.get("accountant") == "pld" else "Rényi-DP accountant")


#: The exact dp-accounting computation of a composed ledger's ε (:class:`fastdpot.privacy.composition.
#: ComposedLedger`, by ``metrics["accountant"]``), and why its neighbouring relation is the right one: privacy.md
#: writes both, so that a reader recomputes the stated ε (tests/apps/test_private_only.py does).
ACCOUNTANT_CALLS = {
    "pld": ("`dp_accounting.pld.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE"
            ", value_discretization_interval=1e-3)`, composing `dp_accounting.GaussianDpEvent(z)` once per release "
            "(z: the noise multipliers of the table), then `get_epsilon(δ)`",
            "Why ADD_OR_REMOVE_ONE, though the neighbours are replace-one: z = σ/Δ, with Δ the largest change of a "
            "release when one labelled image is replaced by any other, so a replacement moves a release's mean by at "
            "most Δ, one unit of z: the pair N(0, z²), N(1, z²), which is what dp-accounting's Gaussian event "
            "describes under ADD_OR_REMOVE_ONE. Its REPLACE_ONE relation instead takes the event's unit for an "
            "add/remove sensitivity and moves the mean by two units (dp-accounting: \"the same privacy loss "
            "distribution with twice the sensitivity\"); with this Δ, which already covers a replacement, it would "
            "count the replacement twice and state a larger ε than these releases have."),
    "rdp": ("`dp_accounting.rdp.RdpAccountant(orders=fastdpot.privacy.DEFAULT_ORDERS, neighboring_relation="
            "dp_accounting.NeighboringRelation.REPLACE_ONE)`, composing "
            "`dp_accounting.SampledWithoutReplacementDpEvent(n, B, dp_accounting.GaussianDpEvent(z))` once per "
            "release on a batch of B of the n images and `dp_accounting.GaussianDpEvent(z)` once per release on all "
            "of them (n, B and z: the table), then `get_epsilon(δ)`",
            "Why REPLACE_ONE: it is the relation of sampling without replacement (Wang, Balle & Kasiviswanathan, "
            "AISTATS 2019, the only one dp-accounting accepts for it), and its bound takes the base Gaussian's "
            "Rényi divergence α/(2z²): a mean shift of one unit of z = σ/Δ under a replacement, which Δ (the "
            "replace-one sensitivity) is. dp-accounting gives a whole-data-set GaussianDpEvent the same α/(2z²) "
            "under either relation."),
}


def _private_only_md(m: Dict[str, Any]) -> List[str]:
    lines = []
    if m["method"] == "decoded":
        return lines + ["**Analysis run (`--method decoded`): the sensitive images' own codes, decoded. It "
                                   "releases the sensitive data: no differential-privacy guarantee.**", ""]
    if _non_finite(m["epsilon"]) or _non_finite(m["epsilon_target"]):  # metrics.json writes ∞ as "inf"
        return lines + ["**Non-private run (`--epsilon inf`): no differential-privacy guarantee.**", ""]
    lines += [f"The whole run is **({m['epsilon']:.4g}, {m['delta']:.3g})-differentially private** for neighbouring "
              f"data sets that differ by the replacement of one labelled image by any other (its label free to "
              f"change; n = {m['n_sensitive']} is public). Everything the run publishes (the samples, their labels, "
              f"metrics computed from them, except the evaluation statistics listed below as outside the guarantee) "
              f"is post-processing of the stages below, composed in one {_accountant_words(m)}, all of δ to the "
              f"accountant (every stage has a deterministic sensitivity). No image outside the sensitive set was "
              f"used for any weight, statistic or setting. The validation split ({m['n_validation']} images, disjoint from the sensitive set, the same "
              f"split for every run) is an explicit tuning split: the protocol's swept settings were chosen on it "
              f"(`python -m fastdpot.experiments.mainjob.tuning`; the others were set by hand on public grounds: "
              f"\"Where each setting came from\" below says which), and it trains the label-fidelity judge, an "
              f"evaluation model that is not released.", "",
              "| stage | mechanism | noise multiplier | releases | batch / n |", "|---|---|---|---|---|"]
    what = {"representation": "DP-PCA: Gaussian second-moment matrix, sensitivity sqrt(2)"
            if m["representation"].get("kind") == "pca" else "DP-SGD, per-sample clipping, sensitivity 2C",
            "flow": "label-private sliced quantile sketch, orthogonal directions",
            "gaussian": "Gaussian mechanism on per-class moments, sensitivity sqrt(6)",
            "means": "Gaussian mechanism on per-class (count, Σ(x − 0.5)), labels private",
            "sketch": "one-shot per-class sliced quantile sketches of every image on public patch-DCT blocks, with "
                      "the class histogram (labels private)"}
    for s in m["stages"]:
        e = s["event"]
        lines.append(f"| {s['stage']} | {what.get(s['stage'], '')} | {s['noise_multiplier']:.6g} | {s['releases']} | "
                     f"{e['batch_size']} / {e['dataset_size']} |")
    call, why = ACCOUNTANT_CALLS["pld" if m.get("accountant") == "pld" else "rdp"]
    lines += ["", f"Noise: {m['noise']}.", "",
              f"Accountant: the ε above is dp-accounting's {call}, at δ = {m['delta']!r}. {why}", ""]
    if str(m["noise"]).startswith("replayable"):
        lines += ["**Replayable noise (`--replayable-noise`): every privacy draw came from the seed. There is NO "
                  "privacy guarantee against anyone who holds it: the noise can be recomputed and removed.**", ""]
    return lines


