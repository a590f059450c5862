"""The evaluation stage (not part of the release): FID, downstream classifiers and label fidelity.

* FID (:mod:`fastdpot.experiments.metrics`): ``evaluation.fid_samples`` generated images (picked with ``seed + 2``)
  against ``evaluation.fid_real`` reference images picked with a fixed seed, whose Inception statistics are cached
  by content (:func:`fastdpot.experiments.metrics.real_statistics`) in :func:`fid_cache_dir`. The reference is the
  protocol's: the real test set (public-half), the sensitive set (private-only: DPImageBench's protocol, an
  evaluation statistic of the sensitive images computed WITHOUT noise, outside the guarantee; ``fid_test`` beside
  it against the test set). The cached statistics of the sensitive set are sensitive-derived data: they stay in the
  user's cache folder, never in the run folder.
* Downstream accuracy: the ``evaluation.classifiers`` trained on every generated labelled image, tested on the
  whole real test set (:func:`fastdpot.experiments.metrics.downstream_accuracy`).
* Label fidelity (private-only): the share of generated images that a CNN trained on the validation split assigns
  to their generated class (the judge reads no sensitive image).
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

import torch

from ..data import to_float

__all__ = ["evaluate", "fid_cache_dir", "FID_REFERENCE"]

#: what the FID of each protocol is measured against
FID_REFERENCE = {"public-half": "the real test set",
                 "private-only": "the sensitive training images (DPImageBench's protocol: an evaluation statistic of "
                                 "the sensitive set, computed without noise, outside the guarantee)"}


def fid_cache_dir(cache_dir: Optional[str]) -> Optional[str]:
    """The folder of the cached FID reference statistics: ``<cache_dir>/fid_real_stats`` (the run's ``--cache-dir``,
    default ``$FASTDPOT_CACHE`` or ``~/.cache/fastdpot``), or None. In the private-only protocol it holds statistics
    of the sensitive images: sensitive-derived data (its README.txt says so; docs/privacy.md)."""
    return os.path.join(cache_dir, "fid_real_stats") if cache_dir else None


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


def evaluate(cfg, images: torch.Tensor, labels: Optional[torch.Tensor], data: Dict[str, Any], *,
             cache_dir: Optional[str] = None, progress: bool = True) -> Dict[str, Any]:
    """FID, downstream accuracy and (private-only) label fidelity of generated ``images`` (N, C, H, W) in [0, 1]
    with ``labels`` (N,) or None; ``data`` from :func:`fastdpot.experiments.mainjob.protocols.load_data`.

    Returns:
        dict: ``fid``, ``fid_generated_samples``, ``fid_real_samples``, ``fid_real`` (what it is measured against;
        none of them with ``evaluation.fid_samples=0``), ``accuracy_<classifier>`` (with labels), ``fid_test`` and
        ``label_fidelity`` (private-only), seconds.
    """
    from .. import metrics as M
    from .protocols import NUM_CLASSES

    e = cfg.evaluation
    out: Dict[str, Any] = {}
    if e.fid_samples > 0:
        out.update(_fid(M, cfg, images, data, progress, fid_cache_dir(cache_dir)))
    test = data["test"]
    if labels is not None and test.labels is not None:
        t0 = time.perf_counter()
        acc = M.downstream_accuracy(images, labels, to_float(test.images), test.labels,
                                    classifiers=[v for v in e.classifiers.split(",") if v], seed=cfg.seed,
                                    cnn_epochs=e.cnn_epochs, cnn_augment=e.cnn_augment, cnn_arch=e.cnn_arch)
        out.update({f"accuracy_{k}": v for k, v in acc.items()})
        out.update(downstream_train_samples=int(images.shape[0]), downstream_test_samples=len(test),
                   downstream_seconds=time.perf_counter() - t0)
    if cfg.protocol == "private-only" and labels is not None and data["validation"].labels is not None:
        val = data["validation"]
        judge = M.train_cnn(to_float(val.images), val.labels, NUM_CLASSES, epochs=e.cnn_epochs, seed=cfg.seed + 5)
        out["label_fidelity"] = float((M.cnn_predict(judge, images) == labels).double().mean())
        out["label_fidelity_judge_accuracy_on_test"] = float(
            (M.cnn_predict(judge, to_float(test.images)) == test.labels).double().mean())
    return out
