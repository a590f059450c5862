"""The main job: private image generation with a DP sliced-Wasserstein flow in an auto-encoder's latent space.

Stages (Sebag et al., TMLR, DPSWflow-r), each a function that can be run and tested on its own (all importable
from this module):

1. :func:`stage_data` (:mod:`fastdpot.experiments.stages`) — load the training and test images, split the training
   set into disjoint public and private halves with a recorded seed.
2. :func:`stage_autoencoder` (:mod:`fastdpot.experiments.stages`) — train (or load from cache) the auto-encoder on the
   PUBLIC half only; encode the private half to unit-sphere latents.
3. :func:`stage_flow` (:mod:`fastdpot.experiments.flow_stage`) — the DP flow on the private latents
   (:class:`fastdpot.flows.ClassConditionalFlow` when the data are labelled, else
   :class:`fastdpot.flows.DPSlicedWassersteinFlow`), noise calibrated by the privacy core to (ε, δ); checkpointed,
   and resumed from its checkpoint when the run folder already holds one. With ``center="public"``
   (:func:`public_centers`) each latent is first shifted by its class's PUBLIC mean latent and clipped to a small
   ball inside the step, which lowers the sensitivity from 2 to 2r. (``method="gaussian"`` / ``"public"``: the
   baselines of :mod:`fastdpot.experiments.baselines` instead.)
4. :func:`calibrate_spread` (optional post-processing, ``spread="public"``) — scale each class's particles about
   their mean so that their spread on the unit sphere equals that of the PUBLIC latents of the class; then
   :func:`stage_decode` — decode the particles to images (both in :mod:`fastdpot.experiments.stages`).
5. :func:`stage_metrics` (:mod:`fastdpot.experiments.stages`) — FID against the real test set and downstream
   classifier accuracy.
6. :func:`write_outputs` (:mod:`fastdpot.experiments.report`) — ``samples.png``, ``metrics.json``, ``privacy.md`` in
   the run folder.

:func:`run_pipeline` (here) chains them with wall-clock times per stage; :class:`PipelineConfig`
(:mod:`fastdpot.experiments.config`) holds the settings. Only the flow stage touches private data through a privacy
mechanism; the auto-encoder, the public half and the test set are public by assumption.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict
from typing import Any, Dict, Optional

import torch

from .autoencoder import default_cache_dir
from .config import DEFAULT_SKETCH_BINS, METHODS, PipelineConfig  # noqa: F401  (public names of this module)
from .flow_stage import public_centers, stage_flow
from .report import _finite, _json_default, _per_class, released_epsilon, samples_grid, seed_summary, write_outputs
from .stages import calibrate_spread, stage_autoencoder, stage_data, stage_decode, stage_metrics

__all__ = ["PipelineConfig", "run_pipeline", "stage_data", "stage_autoencoder", "stage_flow", "calibrate_spread",
           "stage_decode", "stage_metrics", "write_outputs", "samples_grid"]


def run_pipeline(cfg: PipelineConfig, run_dir: str, progress: bool = True,
                 cache_dir: Optional[str] = None, data: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run every stage and write the outputs into ``run_dir``; returns the metrics dict (also in metrics.json).

    The flow stage checkpoints to ``run_dir/private/flow_checkpoint.pt`` every ``cfg.checkpoint_every`` steps;
    calling again with the same ``run_dir`` and config resumes the flow from it (data split and auto-encoder are
    deterministic and cached). ``private/`` holds private artefacts (the checkpoint: particles mid-run, the
    generator state that replays every draw with ``replayable_noise``; ``flows.json``: per-class n_c, q_c, z_c, ε_c):
    keep it with the private data, never publish it. ``samples.png``, ``metrics.json``, ``privacy.md`` and
    ``config.json`` are the publishable outputs.
    ``data`` replaces :func:`stage_data`'s output (a dict with ``public``, ``private``, ``test`` and ``dataset``;
    :mod:`fastdpot.experiments.tuning` passes splits of the public half).

    Raises:
        ValueError: invalid configuration (see :meth:`PipelineConfig.resolved`).
    """
    from tqdm.auto import tqdm

    cfg = cfg.resolved()
    if cfg.public_size == 0:  # no public image: the private-only protocol
        from .private_only import run_private_only

        return run_private_only(cfg, run_dir, progress=progress, cache_dir=cache_dir)
    os.makedirs(run_dir, exist_ok=True)
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    times: Dict[str, float] = {}
    stages = tqdm(total=5, desc="pipeline", disable=not progress, position=0)

    def mark(name, t0):
        times[name] = round(time.perf_counter() - t0, 2)
        stages.update(1)
        stages.set_postfix_str(f"{name} done in {times[name]:.0f}s")

    cfg_path = os.path.join(run_dir, "config.json")
    private_dir = os.path.join(run_dir, "private")
    ckpt = os.path.join(private_dir, "flow_checkpoint.pt")
    if os.path.isfile(ckpt):
        with open(cfg_path) as f:
            old = json.load(f)
        scoring = ("flow_seeds", "classifiers", "cnn_epochs", "cnn_augment", "cnn_arch")  # do not change the checkpointed flow
        strip = lambda c: {k: v for k, v in c.items() if k not in scoring}  # noqa: E731
        if strip(old) != strip(_finite(asdict(cfg))):
            raise ValueError(f"{run_dir!r} holds a flow checkpoint of a different config; use another --name or "
                             f"delete the folder")
    with open(cfg_path, "w") as f:
        json.dump(_finite(asdict(cfg)), f, indent=2)

    t0 = time.perf_counter()
    data = stage_data(cfg) if data is None else data  # given: the tuning protocol's stand-in split
    mark("data", t0)
    t0 = time.perf_counter()
    ae = stage_autoencoder(cfg, data, progress=progress, cache_dir=cache_dir)
    mark("autoencoder", t0)
    n_particles = cfg.num_particles or len(data["test"])
    labels = ae["labels"] if cfg.class_conditional else None
    centers, radius = None, None
    if cfg.center == "public" and cfg.method != "public":
        nc = (None if labels is None else int(ae["public_labels"].max()) + 1 if cfg.labels == "private" else
              int(max(int(labels.max()), int(ae["public_labels"].max()))) + 1)  # label-private: C from public labels
        centers, radius = public_centers(ae["public_latents"], None if labels is None else ae["public_labels"],
                                         cfg.clip_radius, num_classes=nc)
    fid_cache = os.path.join(cache_dir, "fid_real_stats",
                             f"{data['dataset'].replace(':', '_').replace('/', '_')}_n{cfg.fid_real}.npz")
    os.makedirs(private_dir, exist_ok=True)
    per_seed, runs = [], []
    for i in range(cfg.flow_seeds):  # the first seed is the run's (its checkpoint, samples.png, top-level metrics)
        seed = cfg.seed + 1 + i
        t0 = time.perf_counter()
        if cfg.method == "flow":
            path = ckpt if i == 0 else os.path.join(private_dir, f"flow_checkpoint_seed{seed}.pt")
            fl_i = stage_flow(cfg, ae["latents"], labels, n_particles, checkpoint_path=path, progress=progress,
                              centers=centers, clip_radius=radius, seed=seed,
                              public_labels=ae["public_labels"] if labels is not None else None)
            if i == 0:  # per-flow values: private (they depend on the class sizes n_c)
                with open(os.path.join(private_dir, "flows.json"), "w") as f:
                    json.dump(_finite(fl_i["privacy"]["flows"]), f, indent=2, default=_json_default)
        else:
            from .baselines import stage_baseline

            fl_i = stage_baseline(cfg, ae, n_particles, seed, centers=centers, clip_radius=radius)
        runs.append(fl_i)
        if i == 0:
            mark("flow", t0)
        t0 = time.perf_counter()
        samples, scales_i = fl_i["samples"], None
        if cfg.spread == "public" and cfg.method == "flow":
            samples, scales_i = calibrate_spread(samples, fl_i["sample_labels"], ae["public_latents"],
                                                 ae["public_labels"] if fl_i["sample_labels"] is not None else None)
        images_i = stage_decode(ae["model"], samples, device=cfg.device, on_sphere=cfg.decode_on_sphere)
        if i == 0:
            mark("decode", t0)
        t0 = time.perf_counter()
        met_i = stage_metrics(cfg, images_i, fl_i["sample_labels"], data["test"], fid_cache=fid_cache,
                              progress=progress)
        if i == 0:
            mark("metrics", t0)
            fl, spread_scales, images, met = fl_i, scales_i, images_i, met_i
        per_seed.append(dict(flow_seed=seed, **{k: v for k, v in met_i.items()
                                                if k == "fid" or k.startswith("accuracy_")}))
    stages.close()

    p = fl["privacy"]
    cond = bool(p.get("class_conditional", cfg.class_conditional)) and (cfg.method != "flow" or _per_class(p))
    label_private = cfg.method == "flow" and bool(p.get("class_conditional")) and not cond
    private = bool(p["private"])
    # the run publishes every seed's metrics: its ε is that of all S releases on the same private half, composed
    # (report.released_epsilon); class-conditional: z_c, σ_c, q_c = B/n_c and the exact ε_c are functions of the
    # private class sizes, not published (they are in private/flows.json): the data-independent bound instead
    release = released_epsilon(cfg, runs)
    common = dict(
        dataset=data["dataset"], method=cfg.method, n_public=len(data["public"]), n_private=len(data["private"]),
        public_size=cfg.public_size, n_test=len(data["test"]), split_seed=cfg.seed, seed=cfg.seed,
        flow_seed=cfg.seed + 1, quick=cfg.quick, private=private, epsilon_target=cfg.epsilon,
        epsilon_spent=release["epsilon"] if private else math.inf, epsilon_spent_is_bound=release["is_bound"],
        delta=release["delta"], delta_target=cfg.delta, flow_seeds=cfg.flow_seeds,
        epsilon_per_seed=release["epsilon_per_seed"] if private else math.inf,
        epsilon_composition=release["how"],
        noise="replayable from seed: NO privacy guarantee against anyone who holds the seed or the checkpoint"
              if cfg.replayable_noise else "secret (operating-system CSPRNG; not stored)",
        neighbouring_relation=("replace one image, its label unchanged (labels and class sizes assumed public)"
                               if cond else
                               "replace one labelled image (x, y) by any (x', y'), its label free to change (n "
                               "public; labels and class sizes protected)" if label_private else
                               "replace one image (substitution)"),
        num_particles=int(fl["samples"].shape[0]), latent_dim=int(ae["latents"].shape[1]), center=cfg.center,
        clip_radius=radius,
        autoencoder=dict(ae["config"], cached=ae["info"]["cached"], train_bce=ae["info"]["train_loss"],
                         train_bce_per_epoch=ae["info"]["train_loss_per_epoch"], test_recon_mse=ae["recon_mse"]),
        flow_resumed=fl["resumed"], wall_time_s=dict(times, total=round(sum(times.values()), 2)),
        device=cfg.device, torch_threads=torch.get_num_threads(), machine=platform.machine(),
        seeds=per_seed, seed_summary=seed_summary(per_seed))
    if cfg.method == "flow":
        per_flow = {} if cond else dict(noise_multiplier=p["flows"][0]["noise_multiplier"],
                                        noise_std=p["flows"][0]["noise_std"],
                                        sample_rate=p["flows"][0]["sample_rate"])
        specific = dict(
            steps=p["steps"], steps_taken=[f["steps_taken"] for f in p["flows"]], batch_size=p["batch_size"],
            **per_flow, sensitivity=p["flows"][0]["sensitivity"],
            accountant="rdp (dp-accounting), sampled without replacement, substitution neighbours",
            class_conditional=cond or label_private, labels=p.get("labels"), label_scale=p.get("label_scale"),
            num_projections=p["num_projections"], step_size=p["step_size"], diffusion=cfg.diffusion,
            epochs=cfg.epochs, init=cfg.init, init_scale=cfg.init_scale, release=cfg.release,
            sketch_bins=cfg.sketch_bins, spread=cfg.spread, spread_scales=spread_scales)
    else:
        specific = dict(class_conditional=cfg.class_conditional, noise_std=p.get("noise_std"),
                        sensitivity=p.get("sensitivity"),
                        accountant=("Gaussian mechanism, one release per class (analytic σ), parallel composition, "
                                    "replace-one neighbours keeping the label" if cfg.method == "gaussian" else
                                    "none: no private data used"))
    metrics = _finite(dict(common, **specific, **met))
    result = dict(metrics=metrics, privacy=p, epsilon=fl["epsilon"], release=release, dataset=data["dataset"],
                  n_public=len(data["public"]), n_private=len(data["private"]),
                  latent_dim=int(ae["latents"].shape[1]))
    write_outputs(run_dir, cfg, result, images, fl["sample_labels"], data["test"].class_names)
    return metrics
