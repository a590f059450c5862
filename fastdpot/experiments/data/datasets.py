"""Image data sets for the main job: Fashion-MNIST / MNIST-format folders, CelebA folders, and small fallbacks.

Every loader returns :class:`ImageData` with images as ``uint8`` tensors of shape (n, C, H, W) — the exact pixels
of the source — so hashing (for the auto-encoder cache) and FID (which quantises) see the true data.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from .idx import load_idx_split

__all__ = ["ImageData", "FASHION_MNIST_DIR", "load_fashion_mnist", "load_mnist_format", "load_celeba_folder",
           "load_digits", "load_lfw_subset", "load_dataset", "public_private_split", "to_float"]

#: where the Debian package ``dataset-fashion-mnist`` installs the four idx.gz files
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot")


@dataclass
class ImageData:
    """A labelled (or unlabelled) image set.

    Attributes:
        images: (n, C, H, W) uint8 tensor.
        labels: (n,) int64 tensor, or None for unlabelled data (CelebA, lfw_subset).
        name: data-set name recorded in the run's metrics.
        class_names: optional names of the labels.
    """
    images: torch.Tensor
    labels: Optional[torch.Tensor]
    name: str
    class_names: Optional[Tuple[str, ...]] = None

    def __post_init__(self):
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise ValueError(f"images must be a (n, C, H, W) uint8 tensor, got {self.images.dtype} "
                             f"{tuple(self.images.shape)}")
        if self.labels is not None and (self.labels.dim() != 1 or self.labels.shape[0] != self.images.shape[0]):
            raise ValueError(f"labels must have shape ({self.images.shape[0]},), got {tuple(self.labels.shape)}")

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def num_classes(self) -> int:
        """C = largest label + 1 (0 without labels)."""
        return 0 if self.labels is None else int(self.labels.max().item()) + 1

    def subset(self, index: torch.Tensor) -> "ImageData":
        """The images (and labels) at ``index``, same name and class names."""
        return ImageData(self.images[index], None if self.labels is None else self.labels[index], self.name,
                         self.class_names)


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 (n, C, H, W) -> float32 in [0, 1]."""
    return images.to(torch.float32).div_(255.0)


def load_mnist_format(data_dir: str, split: str = "train", name: str = "mnist-format") -> ImageData:
    """An MNIST-format folder (``train-images-idx3-ubyte[.gz]`` etc.) as :class:`ImageData` with C = 1."""
    images, labels = load_idx_split(data_dir, split)
    return ImageData(images.unsqueeze(1).contiguous(), labels, name)


def load_fashion_mnist(split: str = "train", data_dir: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Fashion-MNIST (Xiao et al. 2017) from the Debian package ``dataset-fashion-mnist`` or ``data_dir``.

    Shape:
        images: (n, 28, 28) uint8 (n = 60 000 train, 10 000 test); labels: (n,) int64 in [0, 10).

    Raises:
        ValueError: bad ``split``.
        FileNotFoundError: the files are missing (install with ``apt-get install dataset-fashion-mnist``).
    """
    d = data_dir or FASHION_MNIST_DIR
    try:
        return load_idx_split(d, split)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{err}; install the Debian package with `apt-get install -y dataset-fashion-mnist` "
                                f"or pass data_dir=<folder with the idx files>") from None


def _center_crop_resize(img, crop: int, size: int):
    from PIL import Image

    img = img.convert("RGB")
    w, h = img.size
    c = min(crop, w, h)
    left, top = (w - c) // 2, (h - c) // 2
    img = img.crop((left, top, left + c, top + c))
    return np.asarray(img.resize((size, size), Image.BICUBIC), dtype=np.uint8)


def load_celeba_folder(folder: str, split: str = "train", size: int = 64, crop: int = 178,
                       max_images: Optional[int] = None, test_fraction: float = 0.1, seed: int = 0) -> ImageData:
    """A folder of aligned CelebA JPEGs (``img_align_celeba``), centre-cropped to ``crop`` and resized to ``size``.

    The split follows ``list_eval_partition.txt`` when it lies in ``folder`` or its parent (0 = train, 1 = valid,
    2 = test; valid joins train); otherwise a seeded random ``test_fraction`` of the files is the test split.
    Unlabelled (``labels`` is None).

    Shape:
        images: (n, 3, size, size) uint8.

    Raises:
        ValueError: bad ``split``, ``size`` or ``crop``; FileNotFoundError: no JPEGs in ``folder``.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if size < 1 or crop < 1:
        raise ValueError(f"size and crop must be >= 1, got size={size!r}, crop={crop!r}")
    from PIL import Image

    files = sorted(p for ext in ("*.jpg", "*.jpeg", "*.png", "*.JPG")
                   for p in glob.glob(os.path.join(folder, "**", ext), recursive=True))
    if not files:
        raise FileNotFoundError(f"no JPEG/PNG images in CelebA folder {folder!r}")
    part = None
    for cand in (os.path.join(folder, "list_eval_partition.txt"),
                 os.path.join(os.path.dirname(os.path.abspath(folder)), "list_eval_partition.txt")):
        if os.path.isfile(cand):
            with open(cand) as f:
                part = {ln.split()[0]: int(ln.split()[1]) for ln in f if len(ln.split()) == 2}
            break
    if part is not None:
        keep = [p for p in files if (part.get(os.path.basename(p), 0) == 2) == (split == "test")]
    else:
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(len(files), generator=g)
        n_test = max(1, int(round(test_fraction * len(files)))) if len(files) > 1 else 0
        idx = perm[:n_test] if split == "test" else perm[n_test:]
        keep = [files[i] for i in sorted(idx.tolist())]
    if max_images is not None:
        keep = keep[:max_images]
    if not keep:
        raise FileNotFoundError(f"the {split} split of {folder!r} is empty")
    arr = np.stack([_center_crop_resize(Image.open(p), crop, size) for p in keep])
    return ImageData(torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous(), None, "celeba")


def _resize_gray(arr01: np.ndarray, size: int) -> torch.Tensor:
    """(n, h, w) floats in [0, 1] -> (n, 1, size, size) uint8 via Pillow bilinear resampling."""
    from PIL import Image

    out = [np.asarray(Image.fromarray(np.clip(a * 255.0 + 0.5, 0, 255).astype(np.uint8)).resize(
        (size, size), Image.BILINEAR), dtype=np.uint8) for a in arr01]
    return torch.from_numpy(np.stack(out)).unsqueeze(1).contiguous()


def _seeded_holdout(n: int, test_fraction: float, seed: int, split: str) -> torch.Tensor:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = int(round(test_fraction * n))
    return torch.sort(perm[:n_test] if split == "test" else perm[n_test:]).values


def load_digits(split: str = "train", size: int = 28, test_fraction: float = 0.2, seed: int = 0) -> ImageData:
    """scikit-learn's 8×8 digits (1797 images, ships in the wheel), upsampled to ``size`` px; seeded split."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    from sklearn.datasets import load_digits as _ld

    d = _ld()
    idx = _seeded_holdout(len(d.target), test_fraction, seed, split)
    images = _resize_gray(d.images[idx.numpy()] / 16.0, size)
    return ImageData(images, torch.as_tensor(d.target[idx.numpy()], dtype=torch.int64), "digits")


def load_lfw_subset(split: str = "train", size: int = 28, test_fraction: float = 0.2, seed: int = 0) -> ImageData:
    """scikit-image's ``lfw_subset`` (200 grey 25×25 crops, ships in the wheel), resized; unlabelled."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    from skimage import data as skdata

    x = np.asarray(skdata.lfw_subset(), dtype=np.float64)
    idx = _seeded_holdout(x.shape[0], test_fraction, seed, split)
    return ImageData(_resize_gray(x[idx.numpy()], size), None, "lfw_subset")


def load_dataset(dataset: str = "auto", split: str = "train", data_dir: Optional[str] = None,
                 celeba_dir: Optional[str] = None, max_images: Optional[int] = None) -> ImageData:
    """Load one split by name.

    ``dataset``: "auto" (``celeba_dir`` if given, else the idx files in ``data_dir`` if given, else Fashion-MNIST
    from the Debian package, else the scikit-learn digits fallback), "fashion-mnist", "idx" (needs ``data_dir``),
    "celeba" (needs ``celeba_dir``), "digits", "lfw".

    Raises:
        ValueError: unknown ``dataset`` or a missing required folder argument.
    """
    choices = ("auto", "fashion-mnist", "idx", "celeba", "digits", "lfw")
    if dataset not in choices:
        raise ValueError(f"dataset must be one of {list(choices)}, got {dataset!r}")
    if dataset == "auto":
        if celeba_dir is not None:
            dataset = "celeba"
        elif data_dir is not None:
            dataset = "idx"
        elif os.path.isdir(FASHION_MNIST_DIR) and load_fashion_mnist_available():
            dataset = "fashion-mnist"
        else:
            dataset = "digits"
    if dataset == "celeba":
        if celeba_dir is None:
            raise ValueError("dataset='celeba' needs celeba_dir=<folder of aligned JPEGs>, got None")
        return load_celeba_folder(celeba_dir, split, max_images=max_images)
    if dataset == "idx":
        if data_dir is None:
            raise ValueError("dataset='idx' needs data_dir=<folder of MNIST-format idx files>, got None")
        out = load_mnist_format(data_dir, split, name=f"idx:{os.path.basename(os.path.normpath(data_dir))}")
    elif dataset == "fashion-mnist":
        imgs, labels = load_fashion_mnist(split, data_dir)
        out = ImageData(imgs.unsqueeze(1).contiguous(), labels, "fashion-mnist", FASHION_MNIST_CLASSES)
    elif dataset == "digits":
        out = load_digits(split)
    else:
        out = load_lfw_subset(split)
    if max_images is not None and len(out) > max_images:
        out = out.subset(torch.arange(max_images))
    return out


def load_fashion_mnist_available(data_dir: Optional[str] = None) -> bool:
    """Whether the four Fashion-MNIST idx files can be found."""
    from .idx import _STEMS, find_idx_file

    d = data_dir or FASHION_MNIST_DIR
    return all(find_idx_file(d, s) is not None for pair in _STEMS.values() for s in pair)


def public_private_split(num_samples: int, seed: int, public_fraction: float = 0.5,
                         public_size: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Disjoint public / private index sets of a training set, from a recorded seed.

    The public part trains the auto-encoder (public by assumption); only the private part enters the DP flow.
    ``public_size`` (an integer in [1, num_samples)) fixes the public part's size instead of ``public_fraction``.

    Returns:
        (public_index, private_index): sorted int64 tensors whose union is ``range(num_samples)``.

    Raises:
        ValueError: ``num_samples`` < 2, ``public_fraction`` outside (0, 1), ``public_size`` outside [1, num_samples).
    """
    if isinstance(num_samples, bool) or int(num_samples) != num_samples or num_samples < 2:
        raise ValueError(f"num_samples must be an integer >= 2, got {num_samples!r}")
    if not 0.0 < public_fraction < 1.0:
        raise ValueError(f"public_fraction must be in (0, 1), got {public_fraction!r}")
    perm = torch.randperm(int(num_samples), generator=torch.Generator().manual_seed(int(seed)))
    n_pub = min(max(1, int(round(public_fraction * num_samples))), num_samples - 1)
    if public_size is not None:
        if isinstance(public_size, bool) or int(public_size) != public_size or not 1 <= public_size < num_samples:
            raise ValueError(f"public_size must be an integer in [1, {num_samples}), got {public_size!r}")
        n_pub = int(public_size)
    return torch.sort(perm[:n_pub]).values, torch.sort(perm[n_pub:]).values
