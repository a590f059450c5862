"""Command line: ``fastdpot flow [options]`` (also ``python -m fastdpot flow``) — the main job.

Runs :func:`fastdpot.experiments.pipeline.run_pipeline` and writes ``runs/<name>/{samples.png, metrics.json, privacy.md}``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import List, Optional

__all__ = ["build_parser", "main"]


def _epsilon(s: str) -> float:
    v = float(s)
    if math.isnan(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"epsilon must be > 0 or 'inf', got {s!r}")
    return v


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help text already states its default, so that
    every option shows its default exactly once; a store_true flag gets ``(default: off)``, ``--help`` nothing."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or isinstance(action, argparse._HelpAction):
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return text + " (default: off)"
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The ``fastdpot`` parser with its ``flow`` subcommand; the defaults are :class:`PipelineConfig`'s."""
    from ..flows import INIT_KINDS
    from .config import AE_ARCHS, PipelineConfig
    from .metrics import CNN_ARCHS

    d = PipelineConfig()  # one set of defaults, shared with the Python API
    p = argparse.ArgumentParser(prog="fastdpot", description="fastdpot command line")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("flow", help="private image generation with a DP sliced-Wasserstein flow (DPSWflow-r)",
                       description="Train an auto-encoder on the public half, run the DP flow in its latent space "
                                   "on the private half, decode, and report FID / downstream accuracy / ε.",
                       formatter_class=_HelpFormatter)
    f.add_argument("--dataset", default="auto", choices=["auto", "fashion-mnist", "idx", "celeba", "digits", "lfw"],
                   help="auto: --celeba-dir, else --data-dir, else Fashion-MNIST (Debian package), else digits")
    f.add_argument("--data-dir", default=None, help="folder of MNIST-format idx files (.gz or plain; default: none)")
    f.add_argument("--celeba-dir", default=None,
                   help="folder of aligned CelebA JPEGs (crop 178, resize 64; default: none)")
    f.add_argument("--epsilon", type=_epsilon, default=d.epsilon, help="target ε; 'inf' for the non-private run")
    f.add_argument("--delta", type=float, default=d.delta,
                   help="target δ of the whole run, in (0, 1) (default: 1e-5; with --public-size 0, DPImageBench's "
                        "1/(N ln N) for N sensitive images)")
    f.add_argument("--epochs", type=float, default=d.epochs, help="passes over the private data: T = epochs·n/B")
    f.add_argument("--batch-size", type=int, default=d.batch_size, help="B private rows per step")
    f.add_argument("--num-particles", type=int, default=None, help="N (default: size of the real test set)")
    f.add_argument("--num-projections", type=int, default=None, help="k (default k = d for d < 32, 300 for d >= 32)")
    f.add_argument("--step-size", type=float, default=None, help="h (default 0.3 for d < 32, 5 for d >= 32)")
    f.add_argument("--latent-dim", type=int, default=None, help="d (default 16 for 28/32 px, 48 for 64 px)")
    f.add_argument("--diffusion", type=float, default=d.diffusion, help="diffusion coefficient λ of the Brownian term sqrt(2λh)·ξ")
    f.add_argument("--unconditional", action="store_true", help="one flow for all classes (ignore labels)")
    f.add_argument("--labels", default=None, choices=["public", "private"],
                   help="class-conditional flow: private: one flow on [latent, c·onehot(label)], neighbours replace "
                        "one labelled image with its label free to change (labels and class sizes protected); public: "
                        "one flow per label, labels and class sizes ASSUMED public (neighbours keep their label) "
                        "(default: private with --method flow, public with --method gaussian)")
    f.add_argument("--label-scale", type=float, default=d.label_scale,
                   help="c > 0, the length of the label block with --labels private (larger c separates the "
                        "classes but raises the sensitivity sqrt(4r² + 2c²))")
    f.add_argument("--ae-arch", choices=AE_ARCHS, default=d.ae_arch,
                   help="auto-encoder architecture (default: by image size)")
    f.add_argument("--ae-epochs", type=int, default=d.ae_epochs, help="auto-encoder epochs on the public half")
    f.add_argument("--ae-width", type=int, default=d.ae_width,
                   help="auto-encoder base channels w (convbn: w, 2w, 4w; default: the architecture's, 32 for convbn)")
    f.add_argument("--fid-samples", type=int, default=d.fid_samples, help="generated images in FID")
    f.add_argument("--fid-real", type=int, default=d.fid_real, help="real test images in FID (statistics cached)")
    f.add_argument("--max-train", type=int, default=None,
                   help="use only the first N training images (default: all)")
    f.add_argument("--directions", default=d.directions, choices=["orthogonal", "uniform"],
                   help="orthogonal: blocks of d orthonormal directions per step, deterministic sensitivity "
                        "2·sqrt(ceil(k/d)); uniform: i.i.d. directions (the papers'), sensitivity from --bound")
    f.add_argument("--bound", default="chernoff", choices=["chernoff", "bernstein", "clt"],
                   help="sensitivity tail bound over the directions (chernoff and bernstein are proven; clt is only "
                        "an approximation, no guarantee)")
    f.add_argument("--decode-off-sphere", action="store_true",
                   help="decode the particles as they are (default: scaled onto the unit sphere of the latents)")
    f.add_argument("--spread", default=d.spread, choices=["public", "flow"],
                   help="public: rescale each class's particles about their mean to the spread of the public "
                        "latents of that class (post-processing with public statistics, no privacy cost); flow: "
                        "the particles as the flow left them")
    f.add_argument("--center", default=d.center, choices=["public", "none"],
                   help="public: shift each private latent by the public half's mean latent of its class and clip "
                        "it to radius --clip-radius inside the flow (sensitivity 2r); none: latents on the unit "
                        "sphere (the papers', sensitivity 2)")
    f.add_argument("--clip-radius", type=float, default=d.clip_radius,
                   help="r > 0 for --center public (default: the median distance of the public latents to their "
                        "class mean)")
    f.add_argument("--init", default=d.init, choices=list(INIT_KINDS),
                   help="start of the flows' particles, drawn from the seeded generator independently of the data "
                        "(no privacy cost): gaussian N(0, I_d), sphere uniform on the unit sphere (where the latents "
                        "lie), gaussian_scaled N(0, I_d/d); all times --init-scale")
    f.add_argument("--init-scale", type=float, default=d.init_scale,
                   help="s > 0: gaussian N(0, s²I_d), sphere of radius s, gaussian_scaled N(0, s²I_d/d)")
    f.add_argument("--release", default=d.release, choices=["points", "sketch"],
                   help="per-step release of the flows: 'points' (the B·k noisy projections) or 'sketch' (the sliced "
                        "quantile sketch: L noisy rank-bin means per direction; same sensitivity, σ and ε)")
    f.add_argument("--sketch-bins", type=int, default=d.sketch_bins,
                   help="L, the sketch's bins per direction (1 <= L <= B; default min(5, B) with the sketch)")
    f.add_argument("--seed", type=int, default=0, help="seed of the public work (split, auto-encoder, initial "
                   "particles, evaluation); the flow's privacy draws are secret unless --replayable-noise")
    f.add_argument("--replayable-noise", action="store_true",
                   help="draw the flow's batches, directions and noise from --seed (replayable: NO privacy guarantee "
                        "against anyone who holds the seed or the checkpoint; privacy.md and metrics.json say so); "
                        "default: secret randomness from the operating system")
    f.add_argument("--method", default=d.method, choices=["flow", "gaussian", "public", "decoded"],
                   help="flow: the DP flow (with --epsilon inf: the non-private flow); gaussian: baseline, the DP "
                        "Gaussian per class in the same latent space at the same (ε, δ); public: baseline, the "
                        "public part's own labelled latents decoded (no private data); decoded (with --public-size 0, "
                        "ANALYSIS, not private): the sensitive images' own codes decoded, the representation's cap")
    f.add_argument("--public-size", type=int, default=d.public_size,
                   help="public training images (they train the auto-encoder), the rest private (default: half); "
                        "0: the private-only protocol (no public image: a DP representation of the sensitive "
                        "set, the label-private flow, one composed ε; DPImageBench's split and δ)")
    f.add_argument("--validation-size", type=int, default=d.validation_size,
                   help="with --public-size 0: the validation (tuning) split taken from the training set")
    f.add_argument("--representation-share", type=float, default=d.representation_share,
                   help="with --public-size 0: the fraction of ε the DP representation is calibrated to alone "
                        "(the flow takes the rest of the composed budget; default 0.3 for pca, 0.9 for autoencoder)")
    f.add_argument("--rep-kind", choices=["pca", "autoencoder", "dct"], default=d.rep_kind,
                   help="with --public-size 0: the representation: pca (one DP second-moment release), "
                        "autoencoder (DP-SGD) or dct (the --rep-lowpass K x K lowest DCT frequencies: public, no "
                        "release)")
    f.add_argument("--rep-lowpass", type=int, default=d.rep_lowpass, metavar="K",
                   help="with --public-size 0: --rep-kind pca: DP-PCA of the K x K lowest 2-D DCT frequencies "
                        "(default: of the pixels); --rep-kind dct: the K x K lowest frequencies themselves")
    f.add_argument("--rep-scale", type=float, default=d.rep_scale,
                   help="with --public-size 0 and --rep-kind pca: images are divided by this before clipping to "
                        "norm 1")
    f.add_argument("--rep-epochs", type=float, default=d.rep_epochs,
                   help="with --public-size 0: DP-SGD passes over the sensitive images")
    f.add_argument("--rep-batch-size", type=int, default=d.rep_batch_size,
                   help="with --public-size 0: DP-SGD's fixed batch size (sampled without replacement)")
    f.add_argument("--rep-clip-radius", type=float, default=d.rep_clip_radius,
                   help="with --public-size 0: DP-SGD's per-sample gradient bound C (Opacus' max_grad_norm)")
    f.add_argument("--rep-lr", type=float, default=d.rep_lr, help="with --public-size 0: DP-SGD's Adam learning rate")
    f.add_argument("--rep-label-weight", type=float, default=d.rep_label_weight,
                   help="with --public-size 0: weight of the representation's label head (0: no head)")
    f.add_argument("--labels-from", choices=["flow", "head"], default=d.labels_from,
                   help="with --public-size 0: the samples' labels: the flow's label block, or the DP head's")
    f.add_argument("--flow-seeds", type=int, default=d.flow_seeds,
                   help="run the flow (or baseline) stage with this many seeds on the same split and auto-encoder; "
                        "metrics.json reports each and their mean / spread")
    f.add_argument("--classifiers", default=d.classifiers,
                   help="comma-separated downstream classifiers trained on the samples: logreg, mlp, cnn")
    f.add_argument("--cnn-epochs", type=int, default=d.cnn_epochs, help="epochs of the downstream CNN")
    f.add_argument("--cnn-augment", action=argparse.BooleanOptionalAction, default=d.cnn_augment,
                   help="train the downstream CNN with shift/flip augmentation")
    f.add_argument("--cnn-arch", choices=CNN_ARCHS, default=d.cnn_arch,
                   help="downstream CNN: small (2 conv layers) or dropout (DPImageBench's 3-conv F-MNIST shape)")
    f.add_argument("--device", default="cpu", help="cpu or cuda")
    f.add_argument("--backend", default="auto", help="flow backend: auto, reference, cpu, triton")
    f.add_argument("--quick", action="store_true", help="a short run on a small part of the data")
    f.add_argument("--checkpoint-every", type=int, default=100, help="flow checkpoint period (steps)")
    f.add_argument("--runs-dir", default="runs", help="parent folder of the run folders")
    f.add_argument("--name", default=None, help="run folder name (default from dataset, ε, seed)")
    f.add_argument("--cache-dir", default=None, help="auto-encoder / FID cache (default $FASTDPOT_CACHE or "
                                                     "~/.cache/fastdpot)")
    f.add_argument("--no-progress", action="store_true", help="no progress bars or per-stage messages")
    f.add_argument("--distributed", action="store_true",
                   help="under torchrun: shard the flow stage's particles over the ranks (gloo on CPU, NCCL with "
                        "--device cuda); rank 0 holds the data and runs the other stages (docs/distributed.md)")
    f.add_argument("--dist-timeout", type=float, default=300.0,
                   help="seconds after which a dead or hanging rank stops the flow stage (with --distributed)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``fastdpot flow`` with ``argv`` (default: ``sys.argv[1:]``) and print the headline metrics; returns the
    exit status (0 on success, 2 on a bad configuration or missing data)."""
    args = build_parser().parse_args(argv)
    if args.command != "flow":  # pragma: no cover - argparse enforces the choice
        raise SystemExit(f"unknown command {args.command!r}")
    from .config import resolve_labels
    from .pipeline import PipelineConfig, run_pipeline

    cfg = PipelineConfig(dataset=args.dataset, data_dir=args.data_dir, celeba_dir=args.celeba_dir,
                         epsilon=args.epsilon, delta=args.delta, latent_dim=args.latent_dim,
                         num_projections=args.num_projections, step_size=args.step_size, diffusion=args.diffusion,
                         batch_size=args.batch_size, epochs=args.epochs, num_particles=args.num_particles,
                         class_conditional=not args.unconditional, labels=args.labels, label_scale=args.label_scale,
                         ae_arch=args.ae_arch, ae_epochs=args.ae_epochs, ae_width=args.ae_width,
                         fid_samples=args.fid_samples, fid_real=args.fid_real, max_train=args.max_train,
                         seed=args.seed, device=args.device, backend=args.backend, quick=args.quick,
                         checkpoint_every=args.checkpoint_every, bound=args.bound, directions=args.directions,
                         decode_on_sphere=not args.decode_off_sphere, spread=args.spread, init=args.init,
                         init_scale=args.init_scale, center=args.center, clip_radius=args.clip_radius,
                         replayable_noise=args.replayable_noise, release=args.release, sketch_bins=args.sketch_bins,
                         method=args.method, public_size=args.public_size, flow_seeds=args.flow_seeds,
                         classifiers=args.classifiers, cnn_epochs=args.cnn_epochs,
                         cnn_augment=args.cnn_augment, cnn_arch=args.cnn_arch,
                         validation_size=args.validation_size, representation_share=args.representation_share,
                         rep_kind=args.rep_kind, rep_scale=args.rep_scale, rep_lowpass=args.rep_lowpass,
                         rep_epochs=args.rep_epochs, rep_batch_size=args.rep_batch_size,
                         rep_clip_radius=args.rep_clip_radius, rep_lr=args.rep_lr,
                         rep_label_weight=args.rep_label_weight, labels_from=args.labels_from)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda was given but torch.cuda.is_available() is False")
    name = args.name or "{}_eps{}_seed{}{}".format(
        "celeba" if args.celeba_dir else "idx" if args.data_dir else args.dataset.replace("auto", "default"),
        "inf" if math.isinf(args.epsilon) else f"{args.epsilon:g}", args.seed, "_quick" if args.quick else "")
    run_dir = os.path.join(args.runs_dir, name)
    if args.distributed:
        if cfg.class_conditional and cfg.method == "flow" and resolve_labels(cfg.labels, cfg.method) == "private":
            print("fastdpot flow: error: --distributed shards the per-class flows only; the label-private flow "
                  "(--labels private, the default) is not sharded yet: pass --labels public (labels and class sizes "
                  "then ASSUMED public, as privacy.md will say) or --unconditional", file=sys.stderr)
            return 2
        from . import distributed_stage as distributed

        _, rank = distributed.init_from_env(args.device, timeout_s=args.dist_timeout)
        if rank != 0:  # the other ranks only move their shards of the flow stage(s)
            distributed.pipeline_follow()
            return 0
    try:
        metrics = run_pipeline(cfg, run_dir, progress=not args.no_progress, cache_dir=args.cache_dir)
    except (ValueError, FileNotFoundError) as err:
        print(f"fastdpot flow: error: {err}", file=sys.stderr)
        return 2
    finally:
        if args.distributed:
            distributed.pipeline_done()
    keys = ["dataset", "epsilon_spent", "epsilon", "delta", "steps", "noise_multiplier", "fid", "fid_generated_samples",
            "fid_real_samples", "accuracy_logreg", "accuracy_mlp", "accuracy_cnn", "label_fidelity", "wall_time_s"]
    if args.flow_seeds > 1:
        keys.append("seed_summary")
    print(json.dumps({k: metrics.get(k) for k in keys if k in metrics}, indent=2))
    print(f"outputs in {run_dir}/ (samples.png, metrics.json, privacy.md; private/ holds the flow checkpoint, a "
          f"private artefact: do not publish it)")
    return 0
