"""Command line: ``fastdpot flow [options]`` (also ``python -m fastdpot flow``) — the main job.

Each option sets one setting of :class:`~fastdpot.experiments.mainjob.config.MainJobConfig` (the table
:data:`OPTIONS`; ``--set NAME=VALUE`` sets any other by its dotted name). Runs
:func:`fastdpot.experiments.mainjob.pipeline.run_pipeline` and writes ``runs/<name>/{samples.png, metrics.json,
privacy.md, config.json}``. A value the run would ignore (a private-only setting without ``--public-size 0``, a zero
count) is refused, naming the option.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from typing import List, Optional

from ..classifiers import CNN_ARCHS
from .settings import REPRESENTATION_KINDS

__all__ = ["build_parser", "main", "OPTIONS"]

#: option -> (setting, argparse keywords, help); a default of None means "the setting's default"
OPTIONS = {
    "--dataset": ("data.dataset", dict(choices=["auto", "fashion-mnist", "idx", "celeba", "digits", "lfw"]),
                  "auto: --celeba-dir, else --data-dir, else Fashion-MNIST (Debian package), else digits"),
    "--data-dir": ("data.data_dir", {}, "folder of MNIST-format idx files (.gz or plain)"),
    "--celeba-dir": ("data.celeba_dir", {}, "folder of aligned CelebA JPEGs (crop 178, resize 64)"),
    "--max-train": ("data.max_train", dict(type=int), "use only the first N training images (default: all)"),
    "--public-size": ("data.public_size", dict(type=int),
                      "public training images (they train the auto-encoder), the rest private (default: half); 0: "
                      "the private-only protocol (no public image: a DP representation of the sensitive set and the "
                      "generator in one composed ε; DPImageBench's split and δ)"),
    "--validation-size": ("data.validation_size", dict(type=int),
                          "with --public-size 0: the validation (tuning) split taken from the training set"),
    "--delta": ("delta", dict(type=float), "δ of the whole run, in (0, 1) (default: 1e-5; with --public-size 0, "
                                          "DPImageBench's 1/(N ln N))"),
    "--seed": ("seed", dict(type=int), "seed of the public work (split, auto-encoder, initial particles, "
                                       "evaluation); privacy draws are secret unless --replayable-noise"),
    "--latent-dim": ("representation.latent_dim", dict(type=int), "d (default 16 for 28/32 px, 48 for 64 px; "
                                                                   "32 for DP-PCA)"),
    "--ae-arch": ("representation.ae_arch", dict(choices=["conv", "convbn", "dcgan"]),
                  "public auto-encoder architecture (default: by image size)"),
    "--ae-epochs": ("representation.ae_epochs", dict(type=int), "public auto-encoder epochs"),
    "--ae-width": ("representation.ae_width", dict(type=int), "public auto-encoder base channels w"),
    "--rep-kind": ("representation.kind", dict(choices=list(REPRESENTATION_KINDS)),
                   "with --public-size 0: pixels (the one-shot method's; with --method decoded the sensitive images "
                   "themselves), pca (one DP second-moment release), autoencoder (DP-SGD) or dct (public)"),
    "--rep-lowpass": ("representation.lowpass", dict(type=int, metavar="K"),
                      "with --public-size 0: DP-PCA of the K x K lowest 2-D DCT frequencies (dct: those themselves)"),
    "--rep-scale": ("representation.scale", dict(type=float), "with --public-size 0 and pca: the image scale S"),
    "--rep-epochs": ("representation.epochs", dict(type=float), "with --public-size 0: DP-SGD passes"),
    "--rep-batch-size": ("representation.batch_size", dict(type=int), "with --public-size 0: DP-SGD's batch size"),
    "--rep-clip-radius": ("representation.clip_radius", dict(type=float), "with --public-size 0: DP-SGD's C"),
    "--rep-lr": ("representation.lr", dict(type=float), "with --public-size 0: DP-SGD's Adam learning rate"),
    "--rep-label-weight": ("representation.label_weight", dict(type=float),
                           "with --public-size 0: the weight of the DP auto-encoder's label head (0: none)"),
    "--representation-share": ("representation.share", dict(type=float),
                               "with --public-size 0: the fraction of ε the representation is calibrated to alone"),
    "--method": ("generation.method", dict(choices=["flow", "gaussian", "public", "decoded"]),
                 "flow: the DP flow; gaussian: the DP Gaussian per class; public: the public part's own codes; "
                 "decoded (with --public-size 0, ANALYSIS, not private): the sensitive codes decoded"),
    "--num-particles": ("generation.num_particles", dict(type=int), "N (default: the test set's size; 60 000 with "
                                                                    "--public-size 0)"),
    "--num-projections": ("generation.num_projections", dict(type=int), "k (default: one orthogonal block)"),
    "--step-size": ("generation.step_size", dict(type=float), "h (default 0.3 for d < 32, 5 for d >= 32)"),
    "--diffusion": ("generation.diffusion", dict(type=float), "λ of the Brownian term sqrt(2λh)·ξ"),
    "--batch-size": ("generation.batch_size", dict(type=int), "B private rows per step"),
    "--epochs": ("generation.epochs", dict(type=float), "passes over the private data: T = epochs·n/B"),
    "--labels": ("generation.labels", dict(choices=["public", "private"]),
                 "private: one flow on [code, c·onehot(label)] (labels and class sizes protected); public: per-class "
                 "flows, labels and class sizes ASSUMED public (default: private for the flow)"),
    "--label-scale": ("generation.label_scale", dict(type=float), "c > 0, the label block's length"),
    "--directions": ("generation.directions", dict(choices=["orthogonal", "uniform"]),
                     "orthogonal blocks (deterministic sensitivity) or i.i.d. uniform directions (--bound)"),
    "--bound": ("generation.bound", dict(choices=["chernoff", "bernstein", "clt"]),
                "sensitivity tail bound over uniform directions (clt: an approximation, no guarantee)"),
    "--init": ("generation.init", dict(choices=["gaussian", "sphere", "gaussian_scaled"]),
               "the particles' data-independent start (times --init-scale)"),
    "--init-scale": ("generation.init_scale", dict(type=float), "s > 0 of --init"),
    "--release": ("generation.release", dict(choices=["points", "sketch"]),
                  "the flows' per-step release: the B·k noisy projections, or the sliced quantile sketch"),
    "--sketch-bins": ("generation.sketch_bins", dict(type=int), "L, the sketch's bins per direction (<= B)"),
    "--center": ("generation.center", dict(choices=["public", "none"]),
                 "public: codes shifted by their class's public mean and clipped to --clip-radius"),
    "--clip-radius": ("generation.clip_radius", dict(type=float), "r > 0 for --center public"),
    "--spread": ("generation.spread", dict(choices=["public", "flow"]),
                 "public: rescale each class's particles to the public codes' spread (post-processing)"),
    "--labels-from": ("generation.labels_from", dict(choices=["flow", "head"]),
                      "with --public-size 0: the samples' labels from the flow or the DP head"),
    "--flow-seeds": ("generation.flow_seeds", dict(type=int),
                     "run the generation stage with this many seeds; each is calibrated for its share of ε, so that "
                     "everything the run publishes stays within --epsilon"),
    "--checkpoint-every": ("generation.checkpoint_every", dict(type=int), "flow checkpoint period (steps)"),
    "--fid-samples": ("evaluation.fid_samples", dict(type=int), "generated images in FID (0: no FID)"),
    "--fid-real": ("evaluation.fid_real", dict(type=int), "reference images in FID (statistics cached)"),
    "--classifiers": ("evaluation.classifiers", {}, "comma-separated downstream classifiers: logreg, mlp, cnn "
                     "(default: cnn with --public-size 0, else all three)"),
    "--cnn-epochs": ("evaluation.cnn_epochs", dict(type=int), "epoch budget of the downstream CNN (the checkpoint "
                                                              "of the best validation accuracy is scored)"),
    "--cnn-arch": ("evaluation.cnn_arch", dict(choices=list(CNN_ARCHS)), "the downstream CNN (resnet20: He et al.'s "
                                                                        "ResNet-20, slower)"),
    "--device": ("device", {}, "cpu or cuda"),
    "--backend": ("backend", {}, "flow backend: auto, reference, cpu, triton, cuda"),
}
_FLAGS = {  # store_true options: (setting, value when given, help)
    "--unconditional": ("generation.class_conditional", False, "one flow for all classes (ignore labels)"),
    "--decode-off-sphere": ("generation.decode_on_sphere", False, "decode the particles as they are"),
    "--replayable-noise": ("replayable_noise", True, "draw every privacy draw from --seed (NO guarantee against "
                                                     "anyone who holds it; privacy.md says so)"),
    "--each-seed-at-epsilon": ("generation.each_seed_at_epsilon", True,
                               "with --flow-seeds S: each seed alone at --epsilon; the run then publishes their "
                               "composition, more than --epsilon (privacy.md states it)"),
    "--cnn-augment": ("evaluation.cnn_augment", True, "train the downstream CNN with shift/flip augmentation"),
    "--quick": ("quick", True, "a short run on a small part of the data"),
}


def _epsilon(s: str) -> float:
    v = float(s)
    if math.isnan(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"epsilon must be > 0 or 'inf', got {s!r}")
    return v


def _with_default(text: str, value) -> str:
    """An option's help with its default stated once (unless the text already states it)."""
    if "default" in text:
        return text
    return f"{text} (default: {'none' if value is None else value})"


def build_parser() -> argparse.ArgumentParser:
    """The ``fastdpot`` parser with its ``flow`` subcommand; every default is the setting's default (each option's
    help states it once)."""
    from .config import MainJobConfig, flat_settings

    defaults = flat_settings(MainJobConfig())
    p = argparse.ArgumentParser(prog="fastdpot", description="fastdpot command line")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("flow", help="private image generation (the main job)",
                       description="Private image generation with a DP sliced-Wasserstein flow or a baseline, "
                                   "decoded and scored (FID, downstream accuracy); the run's ε binds everything it "
                                   "publishes. Defaults: see fastdpot.experiments.mainjob.config.")
    f.add_argument("--epsilon", type=_epsilon, default=10.0, help="the run's ε; 'inf' for a non-private run "
                                                                  "(default: 10)")
    for opt, (name, kw, text) in OPTIONS.items():
        f.add_argument(opt, default=None, help=_with_default(text, defaults[name]), **kw)
    for opt, (_, _, text) in _FLAGS.items():
        f.add_argument(opt, action="store_true", help=text + " (default: off)")
    f.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="any setting by its dotted name (fastdpot.experiments.mainjob.config.setting_names()); "
                        "repeatable (default: none)")
    f.add_argument("--runs-dir", default="runs", help="parent folder of the run folders (default: runs)")
    f.add_argument("--name", default=None, help="run folder name (default: data set, ε, seed and a hash of the "
                                                "settings that change the run)")
    f.add_argument("--cache-dir", default=None, help="auto-encoder / FID cache (default $FASTDPOT_CACHE or "
                                                     "~/.cache/fastdpot)")
    f.add_argument("--no-progress", action="store_true", help="no progress bars or per-stage messages (default: off)")
    f.add_argument("--distributed", action="store_true",
                   help="under torchrun: shard the flow stage's particles over the ranks (docs/distributed.md) "
                        "(default: off)")
    f.add_argument("--dist-timeout", type=float, default=300.0,
                   help="seconds after which a dead or hanging rank stops the flow stage (default: 300)")
    return p


def config_from_args(args):
    """The :class:`MainJobConfig` of parsed ``fastdpot flow`` arguments (the options given, then ``--set``)."""
    from .config import MainJobConfig, parse_settings

    settings = {"epsilon": args.epsilon}
    for opt, (name, _, _) in OPTIONS.items():
        v = getattr(args, opt[2:].replace("-", "_"))
        if v is not None:
            settings[name] = v
    for opt, (name, value, _) in _FLAGS.items():
        if getattr(args, opt[2:].replace("-", "_")):
            settings[name] = value
    settings.update(parse_settings(args.set))
    return MainJobConfig().with_settings(**settings)


def _name_options(message: str) -> str:
    """Append the command-line options whose settings an error message names (by dotted name, leaf name, or the
    ``rep_`` / ``representation_`` spelling of a representation setting)."""
    import re

    hits = set()
    for opt, (name, *_) in {**OPTIONS, **_FLAGS}.items():
        stage, _, leaf = name.rpartition(".")
        tokens = {name, leaf} | ({f"rep_{leaf}", f"representation_{leaf}"} if stage == "representation" else set())
        if stage == "representation" and leaf in ("epochs", "batch_size", "clip_radius", "lr"):
            tokens.discard(leaf)  # the generation stage's settings of the same leaf name own the bare word
        if any(re.search(rf"(?<![\w.]){re.escape(t)}(?!\w)", message) for t in tokens):
            hits.add(opt)
    return message + (f" (option {', '.join(sorted(hits))})" if hits else "")


def default_run_name(cfg) -> str:
    """``<data>_eps<ε>_seed<seed>[_quick]_<hash>``: the hash of the settings that change the run, so that two runs of
    different settings never share a folder."""
    from .config import flat_settings
    from .pipeline import _SCORING

    d = cfg.data
    key = json.dumps({k: str(v) for k, v in flat_settings(cfg).items() if k not in _SCORING}, sort_keys=True)
    return "{}_eps{}_seed{}{}_{}".format(
        "celeba" if d.celeba_dir else "idx" if d.data_dir else d.dataset.replace("auto", "default"),
        "inf" if math.isinf(cfg.epsilon) else f"{cfg.epsilon:g}", cfg.seed, "_quick" if cfg.quick else "",
        hashlib.sha256(key.encode()).hexdigest()[:8])


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``fastdpot flow`` with ``argv`` (default: ``sys.argv[1:]``) and print the headline metrics; returns the
    exit status (0 on success, 2 on a bad setting or missing data)."""
    args = build_parser().parse_args(argv)
    from .pipeline import run_pipeline

    try:
        cfg = config_from_args(args)
        resolved = cfg.resolved()
    except ValueError as err:
        print(f"fastdpot flow: error: {_name_options(str(err))}", file=sys.stderr)
        return 2
    if resolved.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda was given but torch.cuda.is_available() is False")
    run_dir = os.path.join(args.runs_dir, args.name or default_run_name(resolved))
    if args.distributed:
        g = resolved.generation
        if g.class_conditional and g.method == "flow" and g.labels == "private":
            print("fastdpot flow: error: --distributed shards the per-class flows only; the label-private flow "
                  "(--labels private, the default) is not sharded yet: pass --labels public (labels and class sizes "
                  "then ASSUMED public, as privacy.md will say) or --unconditional", file=sys.stderr)
            return 2
        from . import distributed

        _, rank = distributed.init_from_env(resolved.device, timeout_s=args.dist_timeout)
        if rank != 0:  # the other ranks only move their shards of the flow stage(s)
            distributed.pipeline_follow()
            return 0
    try:
        metrics = run_pipeline(cfg, run_dir, progress=not args.no_progress, cache_dir=args.cache_dir)
    except (ValueError, FileNotFoundError) as err:
        print(f"fastdpot flow: error: {_name_options(str(err))}", file=sys.stderr)
        return 2
    finally:
        if args.distributed:
            distributed.pipeline_done()
    keys = ["dataset", "protocol", "method", "epsilon_spent", "delta", "steps", "noise_multiplier", "fid",
            "fid_generated_samples", "fid_real_samples", "accuracy_logreg", "accuracy_mlp", "accuracy_cnn",
            "label_fidelity", "wall_time_s"]
    if resolved.generation.flow_seeds > 1:
        keys.append("seed_summary")
    print(json.dumps({k: metrics.get(k) for k in keys if k in metrics}, indent=2))
    print(f"outputs in {run_dir}/ (samples.png, metrics.json, privacy.md; private/ holds the checkpoints, private "
          f"artefacts: do not publish them)")
    return 0
