"""The evaluation stage (not part of the release): downstream accuracy, FID and label fidelity.

* Downstream accuracy: the ``evaluation.classifiers`` trained on every generated labelled image. The CNN's training
  length is chosen on a SELECTION split, never on the test set: it trains for ``evaluation.cnn_epochs`` epochs, is
  scored on the selection split after every epoch, and the checkpoint of the best score is kept
  (:func:`fastdpot.experiments.metrics.select_cnn`, as DPImageBench selects its classifiers). The test set is read
  once, at the end, by that checkpoint; nothing reads it before (this stage scores the classifiers first).
  :func:`selection_split`: private-only, the validation split (disjoint from the sensitive set and the test set);
  public-half, :data:`SELECTION_SIZE` images of the public part. LogReg and MLP (public-half) have no epochs to
  choose (:func:`fastdpot.experiments.metrics.downstream_accuracy`).
* FID (:mod:`fastdpot.experiments.metrics`): ``evaluation.fid_samples`` generated images (picked with ``seed + 2``)
  against ``evaluation.fid_real`` reference images picked with a fixed seed, whose Inception statistics are cached
  by content (:func:`fastdpot.experiments.metrics.real_statistics`) in :func:`fid_cache_dir`. The reference is the
  protocol's: the real test set (public-half), the sensitive set (private-only: DPImageBench's protocol, an
  evaluation statistic of the sensitive images computed WITHOUT noise, outside the guarantee; ``fid_test`` beside
  it against the test set). The cached statistics of the sensitive set are sensitive-derived data: they stay in the
  user's cache folder, never in the run folder.
* Label fidelity (private-only): the share of generated images that a CNN trained on the validation split for
  ``min(cnn_epochs, JUDGE_EPOCHS)`` epochs assigns to their generated class (the judge reads no sensitive image).
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional, Tuple

import torch

from ..data import to_float

__all__ = ["evaluate", "selection_split", "fid_cache_dir", "FID_REFERENCE", "SELECTION_SIZE", "JUDGE_EPOCHS"]

#: what the FID of each protocol is measured against
FID_REFERENCE = {"public-half": "the real test set",
                 "private-only": "the sensitive training images (DPImageBench's protocol: an evaluation statistic of "
                                 "the sensitive set, computed without noise, outside the guarantee)"}
#: public-half: the public images that select the CNN's checkpoint (at most; a fixed-seed subset of the public part)
SELECTION_SIZE = 5000
#: the label-fidelity judge's epochs (its fixed schedule before checkpoint selection existed; it has no split to
#: select on: the validation split is its training set)
JUDGE_EPOCHS = 5


def fid_cache_dir(cache_dir: Optional[str]) -> Optional[str]:
    """The folder of the cached FID reference statistics: ``<cache_dir>/fid_real_stats`` (the run's ``--cache-dir``,
    default ``$FASTDPOT_CACHE`` or ``~/.cache/fastdpot``), or None. In the private-only protocol it holds statistics
    of the sensitive images: sensitive-derived data (its README.txt says so; docs/privacy.md)."""
    return os.path.join(cache_dir, "fid_real_stats") if cache_dir else None


def selection_split(cfg, data: Dict[str, Any]) -> Tuple[Optional[Any], str]:
    """``(images, what)``: the :class:`~fastdpot.experiments.data.ImageData` that selects the downstream CNN's
    checkpoint, and its description for ``metrics.json``. private-only: ``data["validation"]`` (the validation split:
    5 000 training images disjoint from the sensitive set, the same for every run; the tuning stand-in's own
    validation part). public-half: the first :data:`SELECTION_SIZE` images of a fixed-seed permutation of the public
    part (public images; the test set is never used). None when there is none.

    Raises:
        ValueError: the selection split is the test set itself.
    """
    if cfg.protocol == "private-only":
        sel, what = data.get("validation"), "the validation split"
    else:
        pub = data.get("public")
        if pub is None:
            return None, "none"
        idx = torch.randperm(len(pub), generator=torch.Generator().manual_seed(0))[:min(SELECTION_SIZE, len(pub))]
        sel, what = pub.subset(torch.sort(idx).values), "the public part"
    if sel is not None and sel is data.get("test"):
        raise ValueError("the selection split of the downstream classifiers must not be the test set")
    return sel, (f"{what} ({len(sel)} images)" if sel is not None else "none")


def _reference_statistics(M, images, n_real: int, stats_dir: Optional[str], cfg, progress: bool):
    ri = torch.sort(torch.randperm(len(images), generator=torch.Generator().manual_seed(12345))[:n_real]).values
    return M.real_statistics(to_float(images.images[ri]), device=cfg.device, cache_dir=stats_dir, progress=progress)


def _fid(M, cfg, images, data, progress: bool, stats_dir: Optional[str]) -> Dict[str, Any]:
    """FID of ``evaluation.fid_samples`` generated images against the protocol's reference (and, private-only,
    ``fid_test`` against the test set), the reference statistics cached by content in ``stats_dir``."""
    e = cfg.evaluation
    private_only = cfg.protocol == "private-only"
    ref = data["private"] if private_only else data["test"]
    n_gen, n_real = min(e.fid_samples, images.shape[0]), min(e.fid_real, len(ref))
    gi = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(cfg.seed + 2))[:n_gen]
    t0 = time.perf_counter()
    mu_r, sig_r, cached = _reference_statistics(M, ref, n_real, stats_dir, cfg, progress)
    t_real = time.perf_counter() - t0
    t0 = time.perf_counter()
    mu_g, sig_g = M.feature_statistics(M.inception_features(images[gi], device=cfg.device, progress=progress,
                                                            desc="FID generated"))
    out = dict(fid=M.frechet_distance(mu_r, sig_r, mu_g, sig_g), fid_generated_samples=n_gen,
               fid_real_samples=n_real, fid_real=FID_REFERENCE[cfg.protocol], fid_real_stats_cached=cached,
               fid_real_seconds=t_real, fid_generated_seconds=time.perf_counter() - t0)
    if private_only:
        test = data["test"]
        mu_t, sig_t, cached_t = _reference_statistics(M, test, min(n_real, len(test)), stats_dir, cfg, progress)
        out.update(fid_test=M.frechet_distance(mu_t, sig_t, mu_g, sig_g), fid_test_real_stats_cached=cached_t)
    return out


def _accuracy(M, cfg, images, labels, data) -> Dict[str, Any]:
    """The downstream classifiers: the CNN selected on :func:`selection_split`, then the test set read once."""
    e = cfg.evaluation
    test = data["test"]
    names = [v for v in e.classifiers.split(",") if v]
    t0 = time.perf_counter()
    out: Dict[str, Any] = {}
    if "cnn" in names:
        sel, what = selection_split(cfg, data)
        num_classes = int(labels.max()) + 1
        if sel is not None and sel.labels is not None:
            net, record = M.select_cnn(images, labels, to_float(sel.images), sel.labels, num_classes,
                                       epochs=e.cnn_epochs, seed=cfg.seed, augment=e.cnn_augment, arch=e.cnn_arch)
            out.update(cnn_selected_epoch=record.epoch, cnn_validation_accuracy=list(record.validation_accuracy),
                       cnn_selection=f"checkpoint of the best accuracy on {what}, within {e.cnn_epochs} epochs")
        else:
            net = M.train_cnn(images, labels, num_classes, epochs=e.cnn_epochs, seed=cfg.seed,
                              augment=e.cnn_augment, arch=e.cnn_arch)
            out.update(cnn_selection=f"none (no labelled selection split): {e.cnn_epochs} epochs")
        out["accuracy_cnn"] = M.accuracy_on(net, to_float(test.images), test.labels)  # the test set, read once
    others = [v for v in names if v != "cnn"]
    if others:
        acc = M.downstream_accuracy(images, labels, to_float(test.images), test.labels, classifiers=others,
                                    seed=cfg.seed)
        out.update({f"accuracy_{k}": v for k, v in acc.items()})
    return dict(out, cnn_arch=e.cnn_arch, downstream_train_samples=int(images.shape[0]),
                downstream_test_samples=len(test), downstream_seconds=time.perf_counter() - t0)


def evaluate(cfg, images: torch.Tensor, labels: Optional[torch.Tensor], data: Dict[str, Any], *,
             cache_dir: Optional[str] = None, progress: bool = True) -> Dict[str, Any]:
    """Downstream accuracy, FID and (private-only) label fidelity of generated ``images`` (N, C, H, W) in [0, 1]
    with ``labels`` (N,) or None; ``data`` from :func:`fastdpot.experiments.mainjob.protocols.load_data`. The
    classifiers come first: no statistic reads the test set before the CNN's checkpoint is chosen.

    Returns:
        dict: ``accuracy_<classifier>``, ``cnn_selected_epoch``, ``cnn_validation_accuracy`` (per epoch) and
        ``cnn_selection`` (with labels); ``fid``, ``fid_generated_samples``, ``fid_real_samples``, ``fid_real``
        (what it is measured against; none of them with ``evaluation.fid_samples=0``), ``fid_test`` and
        ``label_fidelity`` (private-only), seconds.

    Raises:
        ValueError: a selection split that is the test set.
    """
    from .. import metrics as M
    from .protocols import NUM_CLASSES

    e = cfg.evaluation
    out: Dict[str, Any] = {}
    test = data["test"]
    if labels is not None and test.labels is not None:
        out.update(_accuracy(M, cfg, images, labels, data))
    if e.fid_samples > 0:
        out.update(_fid(M, cfg, images, data, progress, fid_cache_dir(cache_dir)))
    if cfg.protocol == "private-only" and labels is not None and data["validation"].labels is not None:
        val = data["validation"]
        judge = M.train_cnn(to_float(val.images), val.labels, NUM_CLASSES, epochs=min(e.cnn_epochs, JUDGE_EPOCHS),
                            seed=cfg.seed + 5)
        out["label_fidelity"] = float((M.cnn_predict(judge, images) == labels).double().mean())
        out["label_fidelity_judge_accuracy_on_test"] = float(
            (M.cnn_predict(judge, to_float(test.images)) == test.labels).double().mean())
    return out
