"""Command line: ``fastdpot flow [options]`` (also ``python -m fastdpot flow``) — the main job.

Each option sets one setting of :class:`~fastdpot.experiments.mainjob.config.MainJobConfig` (the table
:data:`OPTIONS`; ``--set NAME=VALUE`` sets any other by its dotted name). Runs
:func:`fastdpot.experiments.mainjob.pipeline.run_pipeline` and writes ``runs/<name>/{samples.png, epsilon.png,
quantiles.png (one-shot), metrics.json, privacy.md, config.json}``. ``--help`` groups the options by stage and method and states each default as a run gets
it (the ε table's values by ε, :func:`_table_text`); a setting whose dataclass field carries a help (the one-shot
method's) is an option without a line here (:func:`_field_options`). A value the run would ignore (a private-only
setting without ``--public-size 0``, a setting of another method, one that ``--quick`` lowers, a zero count) is
refused before any work, naming the option (exit status 2), and so are ``--method decoded`` at a finite ε and
``--distributed`` outside torchrun.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
from typing import List, Optional

from ..classifiers import CNN_ARCHS
from .settings import METHODS, PRIVATE_ONLY_TABLE, REPRESENTATION_KINDS

__all__ = ["build_parser", "main", "OPTIONS"]

_EPSILON = 10.0  # the parser's ε (MainJobConfig's)

#: option -> (setting, argparse keywords, help), written by hand; the settings whose dataclass field carries a help
#: (the one-shot method's) are added from the field (:func:`_field_options`), and every setting of the ε table states
#: the table's values in its help (:func:`_table_text`)
_HAND = {
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
    "--latent-dim": ("representation.latent_dim", dict(type=int),
                     "d of the code space (default: the public auto-encoder's 16 at 28/32 px, 48 at 64 px; with "
                     "--public-size 0, the DP auto-encoder's 16, dct's K²)"),
    "--ae-arch": ("representation.ae_arch", dict(choices=["conv", "convbn", "dcgan"]),
                  "public auto-encoder architecture (default: by image size)"),
    "--ae-epochs": ("representation.ae_epochs", dict(type=int), "public auto-encoder epochs"),
    "--ae-width": ("representation.ae_width", dict(type=int), "auto-encoder base channels w (default: the public "
                                                                "architecture's own; 16 for the DP auto-encoder)"),
    "--rep-kind": ("representation.kind", dict(choices=list(REPRESENTATION_KINDS)),
                   "with --public-size 0: pixels (the one-shot method's; with --method decoded the sensitive images "
                   "themselves), pca (one DP second-moment release), autoencoder (DP-SGD) or dct (public) (default: "
                   "pixels for the one-shot method, pca for the others)"),
    "--rep-lowpass": ("representation.lowpass", dict(type=int, metavar="K"),
                      "with --public-size 0: DP-PCA of the K x K lowest 2-D DCT frequencies (dct: those themselves) "
                      "(default: off, the whole image)"),
    "--rep-scale": ("representation.scale", dict(type=float), "with --public-size 0 and pca: the image scale S"),
    "--rep-epochs": ("representation.epochs", dict(type=float), "with --public-size 0: DP-SGD passes"),
    "--rep-batch-size": ("representation.batch_size", dict(type=int), "with --public-size 0: DP-SGD's batch size"),
    "--rep-clip-radius": ("representation.clip_radius", dict(type=float), "with --public-size 0: DP-SGD's C"),
    "--rep-lr": ("representation.lr", dict(type=float), "with --public-size 0: DP-SGD's Adam learning rate"),
    "--rep-label-weight": ("representation.label_weight", dict(type=float),
                           "with --public-size 0: the weight of the DP auto-encoder's label head (0: none)"),
    "--representation-share": ("representation.share", dict(type=float),
                               "with --public-size 0: the fraction of ε the representation is calibrated to alone "
                               "(default: the DP auto-encoder's 0.9)"),
    "--method": ("generation.method", dict(choices=list(METHODS)),
                 "oneshot (--public-size 0): the whole sensitive set released once as per-class sliced quantile "
                 "sketches, then flows in pixel space (its settings: the one-shot options below); flow: the per-step "
                 "DP flow, DPSWflow-r (its settings: the per-step flow options below); gaussian: the DP Gaussian per "
                 "class; public (--public-size > 0): the public part's own codes, no private data; decoded "
                 "(--public-size 0 --epsilon inf, ANALYSIS, not private): the sensitive codes decoded (default: "
                 "oneshot with --public-size 0, flow otherwise)"),
    "--num-particles": ("generation.num_particles", dict(type=int), "N (default: the test set's size; 60 000 with "
                                                                    "--public-size 0)"),
    "--num-projections": ("generation.num_projections", dict(type=int), "k (default: one orthogonal block)"),
    "--step-size": ("generation.step_size", dict(type=float),
                    "h of the flows (default: the per-step flow's 0.3, 5 for d >= 32 with --public-size > 0)"),
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
    "--init-scale": ("generation.init_scale", dict(type=float),
                     "s > 0 of --init (default: 0.3 with --public-size > 0)"),
    "--release": ("generation.release", dict(choices=["points", "sketch"]),
                  "the flows' per-step release: the B·k noisy projections, or the sliced quantile sketch"),
    "--sketch-bins": ("generation.sketch_bins", dict(type=int), "with --release sketch: L, the per-step sketch's bins "
                                                                  "per direction, <= B (default: 5, at most B)"),
    "--center": ("generation.center", dict(choices=["public", "none"]),
                 "public: codes shifted by their class's public mean and clipped to --clip-radius"),
    "--clip-radius": ("generation.clip_radius", dict(type=float), "r > 0 for --center public (default: the public "
                                                                    "codes' median distance to their class mean)"),
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
    "--quick": ("quick", True, "a short run on a small part of the data (at most 4000 training and 1000 test "
                               "images, 2 epochs, 2 one-shot passes over the blocks 28/0/0,7/0/0; no FID unless "
                               "--fid-samples, then at most 100): a setting given above its bound is refused"),
}


def _field_options() -> dict:
    """The options of the settings whose dataclass field carries ``metadata["help"]`` (the one-shot method's):
    ``--<leaf>`` (``--sketch-plan``), typed by the field's annotation, choices from ``metadata["choices"]``."""
    import typing

    from .settings import DataSettings, EvaluationSettings, GenerationSettings, RepresentationSettings

    out = {}
    for stage, cls in (("data", DataSettings), ("representation", RepresentationSettings),
                       ("generation", GenerationSettings), ("evaluation", EvaluationSettings)):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            meta = f.metadata
            if "help" not in meta:
                continue
            kind = next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
            kw = dict(type=kind, **({"choices": list(meta["choices"])} if meta.get("choices") else {}))
            out["--" + f.name.replace("_", "-")] = (f"{stage}.{f.name}", kw, meta["help"], meta.get("default_text"))
    return out


_FIELD_OPTIONS = _field_options()  # option -> (setting, argparse keywords, help, default text or None)
#: option -> (setting, argparse keywords, help): every named option of ``fastdpot flow`` but the flags
OPTIONS = {**_HAND, **{k: v[:3] for k, v in _FIELD_OPTIONS.items()}}
_DEFAULT_TEXT = {k: v[3] for k, v in _FIELD_OPTIONS.items() if v[3]}
#: where each section of :data:`PRIVATE_ONLY_TABLE` applies, and the stage of its settings
_TABLE_SCOPES = {"representation": ("representation", "with --public-size 0 and DP-PCA (--rep-kind pca)"),
                 "flow": ("generation", "with --public-size 0 --method flow"),
                 "generation": ("generation", "with --public-size 0 and the one-shot method")}


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)


def _table_text(setting: str) -> Optional[str]:
    """What the ε table :data:`PRIVATE_ONLY_TABLE` gives ``setting`` (a dotted name), by ε, as ``--help`` states it
    (None: the table does not set it). A run takes the row of the ε nearest to its own in log ε (ε = ∞: the largest
    ε's row), so each row holds from the geometric mean with the row below to the one with the row above."""
    stage, _, leaf = setting.rpartition(".")
    eps = sorted(PRIVATE_ONLY_TABLE)
    texts = []
    for section in dict.fromkeys(k for e in eps for k in PRIVATE_ONLY_TABLE[e] if k != "origins"):  # settings only
        st, scope = _TABLE_SCOPES.get(section, ("generation", f"with --public-size 0 ({section})"))
        values = [PRIVATE_ONLY_TABLE[e].get(section, {}).get(leaf) for e in eps]
        if st != stage or all(v is None for v in values):
            continue
        runs = []  # [first row, last row, value]: consecutive rows of one value
        for i, v in enumerate(values):
            if runs and runs[-1][2] == v:
                runs[-1][1] = i
            else:
                runs.append([i, i, v])
        if len(runs) == 1:
            texts.append(f"{scope}: {_fmt(runs[0][2])} at every ε (the ε table)")
            continue
        pieces = []
        for a, b, v in runs:
            lo = math.sqrt(eps[a - 1] * eps[a]) if a > 0 else None
            hi = math.sqrt(eps[b] * eps[b + 1]) if b + 1 < len(eps) else None
            where = (f"ε < {hi:.3g}" if lo is None else f"ε >= {lo:.3g}" if hi is None else
                     f"{lo:.3g} <= ε < {hi:.3g}")
            at = [t for t, e in ((f"--epsilon {_EPSILON:g}", _EPSILON), ("inf", math.inf)) if
                  (lo is None or e >= lo) and (hi is None or e < hi)]
            pieces.append(f"{'not set' if v is None else _fmt(v)} for {where}"
                          + (f" (so at {' and '.join(at)})" if at else ""))
        texts.append(f"{scope}, by ε from the ε table: {', '.join(pieces)}")
    return "; ".join(texts) or None


def _help(opt: str, text: str, setting: str, value) -> str:
    """An option's help with its default stated once: the hand-written clause ``(default ...)`` that closes the
    text, or ``(default: value)``; either followed by the ε table's values of the setting."""
    table = _table_text(setting)
    if "(default" in text:
        return text if table is None else f"{text[:-1]}; {table})" if text.endswith(")") else f"{text} ({table})"
    own = _DEFAULT_TEXT.get(opt) or (None if value is None and table else "none" if value is None else value)
    return f"{text} (default: {'; '.join(str(x) for x in (own, table) if x is not None)})"


def _group(setting: str) -> str:
    """The ``--help`` section of a setting's option."""
    from .settings import FLOW_ONLY_SETTINGS, ONESHOT_SETTINGS

    stage, _, leaf = setting.rpartition(".")
    if stage == "generation" and leaf in ONESHOT_SETTINGS:
        return "the one-shot method (--method oneshot, the default with --public-size 0)"
    if (stage, leaf) in FLOW_ONLY_SETTINGS:
        return "the per-step flow (--method flow, the default with --public-size > 0)"
    return {"data": "data and protocol", "representation": "code space", "generation": "generation (every method)",
            "evaluation": "evaluation"}.get(stage, "run")


def _epsilon(s: str) -> float:
    v = float(s)
    if math.isnan(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"epsilon must be > 0 or 'inf', got {s!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The ``fastdpot`` parser with its ``flow`` subcommand; every default is the setting's default (each option's
    help states it once, and where the protocol or the ε table sets it, which value a run gets)."""
    from .config import MainJobConfig, flat_settings

    defaults = flat_settings(MainJobConfig())
    p = argparse.ArgumentParser(prog="fastdpot", description="fastdpot command line")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("flow", help="private image generation (the main job)",
                       description="Private image generation with a DP sliced-Wasserstein flow, the one-shot "
                                   "release or a baseline (--method: " + ", ".join(METHODS) + "), decoded and scored "
                                   "(FID, downstream accuracy); the run's ε binds everything it publishes. Defaults: "
                                   "see fastdpot.experiments.mainjob.config.")
    order = ["data and protocol", "code space", "generation (every method)", _group("generation.sketch_plan"),
             _group("generation.epochs"), "evaluation", "run"]
    groups = {name: f.add_argument_group(name) for name in order}

    def group(name):
        return groups.setdefault(name, f.add_argument_group(name))

    group("run").add_argument("--epsilon", type=_epsilon, default=_EPSILON,
                              help=f"the run's ε; 'inf' for a non-private run (default: {_EPSILON:g})")
    for opt, (name, kw, text) in OPTIONS.items():
        group(_group(name)).add_argument(opt, default=None, help=_help(opt, text, name, defaults[name]), **kw)
    for opt, (name, _, text) in _FLAGS.items():
        group(_group(name)).add_argument(opt, action="store_true", help=text + " (default: off)")
    r = group("run")
    r.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="any setting by its dotted name (fastdpot.experiments.mainjob.config.setting_names()); "
                        "repeatable (default: none)")
    r.add_argument("--runs-dir", default="runs", help="parent folder of the run folders (default: runs)")
    r.add_argument("--name", default=None, help="run folder name (default: data set, ε, seed and a hash of the "
                                                "settings that change the run)")
    r.add_argument("--cache-dir", default=None, help="auto-encoder / FID cache (default $FASTDPOT_CACHE or "
                                                     "~/.cache/fastdpot)")
    r.add_argument("--no-progress", action="store_true", help="no progress bars or per-stage messages (default: off)")
    r.add_argument("--distributed", action="store_true",
                   help="under torchrun (torchrun --nproc_per_node K -m fastdpot flow --distributed ...): shard the "
                        "flow stage's particles over the ranks (docs/distributed.md) (default: off)")
    r.add_argument("--dist-timeout", type=float, default=300.0,
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

        try:
            _, rank = distributed.init_from_env(resolved.device, timeout_s=args.dist_timeout)
        except RuntimeError as err:
            print(f"fastdpot flow: error: {err}", file=sys.stderr)
            return 2
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
    print(f"outputs in {run_dir}/ (samples.png, epsilon.png, quantiles.png for the one-shot method, metrics.json, "
          f"privacy.md; private/ holds the checkpoints, private "
          f"artefacts: do not publish them)")
    return 0
