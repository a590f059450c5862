"""The main job, one pipeline for both protocols: data → representation → generation (× seeds) → decoding →
evaluation → report.

1. :func:`~fastdpot.experiments.mainjob.protocols.load_data` — the protocol's split (public / private halves, or
   sensitive set / validation split) and the test set;
2. :func:`~fastdpot.experiments.mainjob.protocols.stage_representation` — the code space (the public auto-encoder,
   or a DP representation of the sensitive images recorded in the run's ledger);
3. :data:`~fastdpot.experiments.mainjob.generation.GENERATORS` — the generator on the private codes (the flow or a
   baseline), once per seed, within the run's ε;
4. decoding (public-half: :mod:`~fastdpot.experiments.mainjob.codes`'s post-processing; private-only: the DP
   representation's decoder, and its head's labels with ``labels_from="head"``);
5. :func:`~fastdpot.experiments.mainjob.evaluation.evaluate` — FID, accuracy, label fidelity;
6. :func:`~fastdpot.experiments.mainjob.report.write_outputs` — ``samples.png``, ``epsilon.png`` (how the run's ε
   was spent, stage by stage), ``quantiles.png`` (one-shot: the release against the generated images),
   ``metrics.json``, ``privacy.md``, ``config.json``.

Only the representation (private-only) and the generation stage read private data, each through mechanisms of
:mod:`fastdpot.privacy` or a flow; the run's ε binds everything it publishes.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import replace
from typing import Any, Dict, Optional

import torch

from .config import MainJobConfig, flat_settings
from .report import finite_json, released_epsilon, seed_summary, write_outputs

__all__ = ["run_pipeline", "check_run_folder"]

#: settings that do not change what the checkpointed generation stage releases (a resumed run may change them)
_SCORING = ("generation.flow_seeds", "generation.each_seed_at_epsilon", "evaluation.classifiers",
            "evaluation.cnn_epochs", "evaluation.cnn_augment", "evaluation.cnn_arch", "evaluation.fid_samples",
            "evaluation.fid_real")


def check_run_folder(run_dir: str, cfg: MainJobConfig) -> None:
    """Refuse a run folder that holds a checkpoint of other settings, naming the settings that differ.

    Raises:
        ValueError: the folder's ``config.json`` differs from ``cfg`` in a setting that changes the run.
    """
    private = os.path.join(run_dir, "private")
    path = os.path.join(run_dir, "config.json")
    if not os.path.isdir(private) or not os.path.isfile(path) or not os.listdir(private):
        return
    with open(path) as f:
        old = json.load(f)
    new = finite_json(flat_settings(cfg))
    diff = sorted(k for k in set(old) | set(new) if k not in _SCORING and old.get(k) != new.get(k))
    if diff:
        shown = ", ".join(f"{k} ({old.get(k)!r} there, {new.get(k)!r} now)" for k in diff[:6])
        raise ValueError(f"{run_dir!r} holds a run of other settings: {shown}{' ...' if len(diff) > 6 else ''}; "
                         f"use another --name (or delete the folder)")


def run_pipeline(cfg: MainJobConfig, run_dir: str, progress: bool = True, cache_dir: Optional[str] = None,
                 data: Optional[Dict[str, Any]] = None, calibration_size: Optional[int] = None) -> Dict[str, Any]:
    """Run every stage and write the outputs into ``run_dir``; returns the metrics (also in ``metrics.json``).

    The generation stage checkpoints under ``run_dir/private/`` every ``generation.checkpoint_every`` steps; calling
    again with the same folder and settings resumes it (the split and the public auto-encoder are deterministic and
    cached; a secure private-only run keeps its DP representation in ``private/`` for itself only). ``private/``
    holds private artefacts (checkpoints; the per-flow n_c, q_c, z_c of per-class flows): never publish it.
    ``data`` replaces :func:`~fastdpot.experiments.mainjob.protocols.load_data`'s output (a tuning stand-in);
    ``calibration_size``: a stand-in's real-run size (every stage takes the real run's noise relative to its signal).

    Raises:
        ValueError: invalid settings (:meth:`MainJobConfig.resolved`), a run folder of other settings.
    """
    from ...privacy.composition import ComposedLedger
    from .autoencoder import default_cache_dir
    from .evaluation import evaluate
    from .generation import GENERATORS
    from .protocols import load_data, protocol_delta, run_owner, stage_representation

    user = {k: v for k, v in flat_settings(cfg).items() if v != flat_settings(MainJobConfig()).get(k)}
    cfg = cfg.resolved()
    private_only = cfg.protocol == "private-only"
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    times: Dict[str, float] = {}
    t0 = time.perf_counter()
    data = load_data(cfg) if data is None else data
    n = len(data["private"])
    if cfg.delta is None:
        cfg = replace(cfg, delta=protocol_delta(calibration_size or n))
    os.makedirs(run_dir, exist_ok=True)
    check_run_folder(run_dir, cfg)
    with open(os.path.join(run_dir, "config.json"), "w") as f:  # before anything is released: resumption checks it
        json.dump(finite_json(flat_settings(cfg)), f, indent=2)
    ledger = ComposedLedger(cfg.epsilon, cfg.delta) if private_only else None
    times["data"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    secure = not cfg.replayable_noise
    rep = stage_representation(
        cfg, data, ledger, progress=progress, calibration_size=calibration_size,
        cache_dir=(os.path.join(run_dir, "private") if secure else os.path.join(cache_dir, "dp_representation"))
        if private_only else cache_dir, owner=(run_owner(run_dir) if secure else f"replayable:seed{cfg.seed}"))
    times["representation"] = round(time.perf_counter() - t0, 2)
    g = cfg.generation
    num_particles = g.num_particles or ((1000 if cfg.quick else 60_000) if private_only else len(data["test"]))
    centers = radius = None
    if g.center == "public" and g.method != "public":
        from .codes import public_centers

        nc = (None if rep["labels"] is None or not g.class_conditional else
              int(rep["public_labels"].max()) + 1 if g.labels == "private" else
              int(max(int(rep["labels"].max()), int(rep["public_labels"].max()))) + 1)
        centers, radius = public_centers(rep["public_codes"], None if nc is None else rep["public_labels"],
                                         g.clip_radius, num_classes=nc)
    labels = rep["labels"] if g.class_conditional else None
    private_dir = os.path.join(run_dir, "private")
    os.makedirs(private_dir, exist_ok=True)
    runs, per_seed, z = [], [], None
    for i in range(g.flow_seeds):  # the first seed is the run's (its checkpoint, samples.png, top-level metrics)
        seed = cfg.seed + 1 + i
        t0 = time.perf_counter()
        ckpt = os.path.join(private_dir, "flow_checkpoint.pt" if i == 0 else f"flow_checkpoint_seed{seed}.pt")
        run = GENERATORS[g.method](
            cfg, rep["codes"], labels, num_particles, seed, ledger=ledger, public_labels=rep["public_labels"],
            public_codes=rep["public_codes"], num_classes=rep["num_classes"], normalize=rep["normalize"],
            centers=centers, clip_radius=radius, checkpoint_path=ckpt if g.method == "flow" and not private_only
            else None, calibration_size=calibration_size, noise_multiplier=z, progress=progress,
            image_shape=tuple(data["private"].images.shape[1:]))
        z = (run["privacy"].get("budget") or {}).get("noise_multiplier", run["privacy"].get("noise_multiplier"))
        runs.append(run)
        if i == 0 and run["privacy"].get("flows") and not private_only:  # per-flow values: private (they read n_c)
            with open(os.path.join(private_dir, "flows.json"), "w") as f:
                json.dump(finite_json(run["privacy"]["flows"]), f, indent=2, default=_json_default)
        t_gen = time.perf_counter() - t0
        t0 = time.perf_counter()
        images, sample_labels, scales = _decode(cfg, rep, run)
        if data["private"].labels is None:  # unlabelled data: one class, no labels to publish
            sample_labels = None
        t_dec = time.perf_counter() - t0
        t0 = time.perf_counter()
        met = evaluate(cfg, images, sample_labels, data, cache_dir=cache_dir, progress=progress)
        if i == 0:
            times.update(generation=round(t_gen, 2), decode=round(t_dec, 2),
                         metrics=round(time.perf_counter() - t0, 2))
            first = (run, images, sample_labels, scales, met)
        per_seed.append(dict(flow_seed=seed, **{k: v for k, v in met.items()
                                                if k in ("fid", "label_fidelity", "cnn_selected_epoch")
                                                or k.startswith("accuracy_")}))
    run, images, sample_labels, scales, met = first
    release = released_epsilon(cfg, runs, ledger)
    metrics = _metrics(cfg, data, rep, run, release, met, times, per_seed, ledger, num_particles, scales)
    result = dict(metrics=metrics, privacy=run["privacy"], release=release, dataset=data["dataset"],
                  n_public=metrics.get("n_public"), n_private=n, latent_dim=int(rep["codes"].shape[1]),
                  representation=rep["info"], user_settings=user, epsilon=run["epsilon"])
    write_outputs(run_dir, cfg, result, images, sample_labels, getattr(data["test"], "class_names", None), runs=runs,
                  ledger=ledger)
    return metrics


def _decode(cfg, rep, run):
    """Post-processing of the released samples into images (and, private-only with ``labels_from="head"``, the DP
    head's labels); the public-half protocol's spread calibration with public statistics."""
    samples, labels, scales = run["samples"], run["sample_labels"], None
    g = cfg.generation
    if cfg.protocol == "public-half":
        from .codes import calibrate_spread, decode_codes

        if g.spread == "public" and g.method == "flow":
            samples, scales = calibrate_spread(samples, labels, rep["public_codes"],
                                               rep["public_labels"] if labels is not None else None)
        return decode_codes(rep["model"], samples, device=cfg.device, on_sphere=g.decode_on_sphere), labels, scales
    images = rep["decode"](samples)
    if g.labels_from == "head":
        from .representation import head_labels

        labels = head_labels(rep["model"], samples)
    return images, labels, scales


def _metrics(cfg, data, rep, run, release, met, times, per_seed, ledger, num_particles, scales) -> Dict[str, Any]:
    """metrics.json: the protocol's and method's fields, every seed's scores and the ε of the whole run."""
    p, g = run["privacy"], cfg.generation
    common = dict(protocol=cfg.protocol, dataset=data["dataset"], method=g.method, seed=cfg.seed,
                  epsilon_target=cfg.epsilon, epsilon_spent=release["epsilon"], epsilon=release["epsilon"],
                  epsilon_spent_is_bound=release["is_bound"], epsilon_per_seed=release["epsilon_per_seed"],
                  epsilon_composition=release["how"], delta=release["delta"], delta_target=cfg.delta,
                  epsilon_stages=[dict(s, stage=s["stage"].replace("\n", ", ")) for s in release["stages"]],
                  flow_seeds=g.flow_seeds, private=bool(p.get("private", True)), quick=cfg.quick,
                  noise="replayable from seed: NO privacy guarantee against anyone who holds the seed or the checkpoint"
                        if cfg.replayable_noise else "secret (operating-system CSPRNG; not stored)",
                  num_particles=int(run["samples"].shape[0]), latent_dim=int(rep["codes"].shape[1]),
                  n_private=len(data["private"]), n_test=len(data["test"]), resumed=run["resumed"],
                  wall_time_s=dict(times, total=round(sum(times.values()), 2)), device=cfg.device,
                  torch_threads=torch.get_num_threads(), machine=platform.machine(), processor=platform.processor(),
                  seeds=per_seed, seed_summary=seed_summary(per_seed))
    if cfg.protocol == "private-only":
        common.update(n_sensitive=len(data["private"]), n_validation=len(data["validation"]),
                      neighbouring_relation="replace one labelled image (x, y) by any (x', y'), its label free to "
                                            "change",
                      stages=ledger.stages, accountant=ledger.accountant_used, representation=rep["info"],
                      generation=p, labels_from=g.labels_from)
        if g.method == "decoded":
            common.update(epsilon=float("inf"), epsilon_spent=float("inf"))
    else:
        cond = bool(p.get("class_conditional", g.class_conditional)) and (g.method != "flow" or _per_class(p))
        label_private = g.method == "flow" and bool(p.get("class_conditional")) and not cond
        common.update(n_public=len(data["public"]), public_size=cfg.data.public_size, split_seed=cfg.seed,
                      flow_seed=cfg.seed + 1, center=g.center, clip_radius=p.get("clip_radius"),
                      neighbouring_relation=("replace one image, its label unchanged (labels and class sizes assumed "
                                             "public)" if cond else
                                             "replace one labelled image (x, y) by any (x', y'), its label free to "
                                             "change (n public; labels and class sizes protected)" if label_private
                                             else "replace one image (substitution)"),
                      autoencoder=dict(rep["config"], cached=rep["info"]["cached"], train_bce=rep["info"]["train_loss"],
                                       train_bce_per_epoch=rep["info"]["train_loss_per_epoch"],
                                       test_recon_mse=rep["recon_mse"]))
        if g.method == "flow":
            f0 = p["flows"][0]
            common.update(steps=p["steps"], steps_taken=[f["steps_taken"] for f in p["flows"]],
                          batch_size=p["batch_size"], sensitivity=f0["sensitivity"],
                          accountant="rdp (dp-accounting), sampled without replacement, substitution neighbours",
                          class_conditional=cond or label_private, labels=p.get("labels"),
                          label_scale=p.get("label_scale"), num_projections=p["num_projections"],
                          step_size=p["step_size"], diffusion=g.diffusion, epochs=g.epochs, init=g.init,
                          init_scale=g.init_scale, release=g.release, sketch_bins=g.sketch_bins, spread=g.spread,
                          spread_scales=scales,
                          **({} if cond else dict(noise_multiplier=f0["noise_multiplier"], noise_std=f0["noise_std"],
                                                  sample_rate=f0["sample_rate"])))
        else:
            common.update(class_conditional=g.class_conditional, noise_std=p.get("noise_std"),
                          sensitivity=p.get("sensitivity"),
                          accountant=("Gaussian mechanism, one release per class (analytic σ), parallel composition, "
                                      "replace-one neighbours keeping the label" if g.method == "gaussian" else
                                      "none: no private data used"))
    return finite_json(dict(common, **met))


def _per_class(p: Dict[str, Any]) -> bool:
    return bool(p.get("class_conditional")) and p.get("labels", "public") != "private"


def _json_default(o):
    if isinstance(o, torch.Tensor):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
