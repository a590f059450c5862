"""Data loaders of the main job: IDX reader, Fashion-MNIST, CelebA folders, fallbacks, public/private split."""
import gzip
import os
import struct

import numpy as np
import pytest
import torch

from fastdpot.experiments.data import (FASHION_MNIST_DIR, ImageData, load_celeba_folder, load_dataset, load_digits,
                                   load_fashion_mnist, load_lfw_subset, load_mnist_format, public_private_split,
                                   read_idx)
from fastdpot.experiments.data.datasets import load_fashion_mnist_available


def _write_idx(path, arr, type_code, compress=False):
    """An IDX file written from the format description (magic 0 0 type ndim, big-endian sizes, big-endian data)."""
    dt = {0x08: ">u1", 0x0C: ">i4", 0x0D: ">f4"}[type_code]
    raw = bytes([0, 0, type_code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(dt).tobytes()
    with (gzip.open if compress else open)(path, "wb") as f:
        f.write(raw)


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("type_code,dtype", [(0x08, np.uint8), (0x0C, np.int32), (0x0D, np.float32)])
def test_read_idx_roundtrip(tmp_path, compress, type_code, dtype):
    rng = np.random.default_rng(0)
    arr = (rng.integers(0, 255, size=(7, 5, 3)) if dtype != np.float32 else rng.normal(size=(7, 5, 3))).astype(dtype)
    if dtype == np.int32:
        arr = arr * 70001 - 123456  # values that need all four big-endian bytes, negative ones too
    p = str(tmp_path / ("a.idx" + (".gz" if compress else "")))
    _write_idx(p, arr, type_code, compress)
    out = read_idx(p)
    assert out.shape == arr.shape and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, arr)


def test_read_idx_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x08\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="magic"):
        read_idx(str(bad))
    trunc = tmp_path / "trunc"
    trunc.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"\x00" * 9)
    with pytest.raises(ValueError, match="payload"):
        read_idx(str(trunc))
    with pytest.raises(FileNotFoundError):
        read_idx(str(tmp_path / "missing"))


def test_mnist_format_folder(tmp_path):
    imgs = np.arange(4 * 28 * 28, dtype=np.int64).reshape(4, 28, 28) % 256
    labs = np.array([3, 1, 4, 1])
    _write_idx(str(tmp_path / "t10k-images-idx3-ubyte.gz"), imgs, 0x08, compress=True)
    _write_idx(str(tmp_path / "t10k-labels-idx1-ubyte"), labs, 0x08)
    d = load_mnist_format(str(tmp_path), "test")
    assert d.images.shape == (4, 1, 28, 28) and d.images.dtype == torch.uint8
    assert torch.equal(d.images[:, 0].long(), torch.from_numpy(imgs))
    assert d.labels.tolist() == [3, 1, 4, 1] and d.labels.dtype == torch.int64
    assert len(load_dataset("idx", "test", data_dir=str(tmp_path))) == 4
    with pytest.raises(FileNotFoundError, match="train"):
        load_mnist_format(str(tmp_path), "train")
    _write_idx(str(tmp_path / "train-images-idx3-ubyte"), imgs, 0x08)
    _write_idx(str(tmp_path / "train-labels-idx1-ubyte"), labs[:3], 0x08)
    with pytest.raises(ValueError, match="labels do not match"):
        load_mnist_format(str(tmp_path), "train")
    with pytest.raises(ValueError, match="split"):
        load_mnist_format(str(tmp_path), "valid")


@pytest.mark.skipif(not load_fashion_mnist_available(), reason=f"Fashion-MNIST not installed in {FASHION_MNIST_DIR}")
def test_fashion_mnist_from_debian_package():
    x, y = load_fashion_mnist("test")
    assert x.shape == (10000, 28, 28) and x.dtype == torch.uint8
    assert y.shape == (10000,) and y.dtype == torch.int64
    assert torch.bincount(y).tolist() == [1000] * 10  # the test set is balanced
    assert y[:5].tolist() == [9, 2, 1, 1, 6]  # the published first test labels (ankle boot, pullover, trouser, ...)
    assert 0 < x.float().mean() < 255


def test_fashion_mnist_missing_folder_names_the_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        load_fashion_mnist("train", data_dir=str(tmp_path))


def _write_celeba(folder, n, partition=None):
    """Aligned-CelebA-like JPEGs (178×218): a blue centre 178×178 square, red bands above and below it."""
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    names = []
    for i in range(n):
        a = np.zeros((218, 178, 3), dtype=np.uint8)
        a[:, :, 0] = 255                       # red everywhere ...
        a[20:198, :, :] = (0, 0, 200)          # ... except the centred 178×178 square
        a[20:198, :10, 1] = 40 * (i % 5)       # a per-image mark inside the crop
        name = f"{i + 1:06d}.jpg"
        Image.fromarray(a).save(os.path.join(folder, name), quality=95)
        names.append(name)
    if partition is not None:
        with open(os.path.join(folder, "list_eval_partition.txt"), "w") as f:
            for name, p in zip(names, partition):
                f.write(f"{name} {p}\n")
    return names


def test_celeba_folder_crop_resize_and_split(tmp_path):
    folder = str(tmp_path / "img_align_celeba")
    _write_celeba(folder, 10)
    tr = load_celeba_folder(folder, "train")
    te = load_celeba_folder(folder, "test")
    assert tr.images.shape == (9, 3, 64, 64) and te.images.shape == (1, 3, 64, 64)
    assert tr.labels is None and tr.name == "celeba"
    # the centre crop removed the red bands: every pixel is blue
    x = torch.cat([tr.images, te.images]).float()
    assert x[:, 0].max() < 60 and x[:, 2].min() > 150
    # the split is a partition and is reproducible
    again = load_celeba_folder(folder, "train")
    assert torch.equal(again.images, tr.images)
    d = load_dataset("auto", "train", celeba_dir=folder, max_images=4)
    assert d.images.shape == (4, 3, 64, 64)


def test_celeba_partition_file_is_honoured(tmp_path):
    folder = str(tmp_path / "celeba")
    _write_celeba(folder, 6, partition=[0, 0, 1, 2, 2, 0])
    assert len(load_celeba_folder(folder, "train")) == 4  # train + valid
    assert len(load_celeba_folder(folder, "test")) == 2
    with pytest.raises(ValueError, match="split"):
        load_celeba_folder(folder, "val")
    with pytest.raises(FileNotFoundError):
        load_celeba_folder(str(tmp_path / "empty"), "train")


def test_fallbacks_ship_in_wheels():
    tr, te = load_digits("train"), load_digits("test")
    assert tr.images.shape[1:] == (1, 28, 28) and len(tr) + len(te) == 1797
    assert set(tr.labels.tolist()) == set(range(10))
    lf = load_lfw_subset("train")
    assert lf.images.shape[1:] == (1, 28, 28) and lf.labels is None and len(lf) + len(load_lfw_subset("test")) == 200
    assert len(load_dataset("lfw", "test")) == 40


def test_public_private_split():
    pub, priv = public_private_split(1001, seed=3)
    assert len(pub) == 500 or len(pub) == 501
    both = torch.cat([pub, priv])
    assert torch.equal(torch.sort(both).values, torch.arange(1001))  # disjoint and covering
    p2, q2 = public_private_split(1001, seed=3)
    assert torch.equal(pub, p2) and torch.equal(priv, q2)
    p3, _ = public_private_split(1001, seed=4)
    assert not torch.equal(pub, p3)
    for bad in [dict(num_samples=1, seed=0), dict(num_samples=10, seed=0, public_fraction=1.0),
                dict(num_samples=10, seed=0, public_fraction=0.0)]:
        with pytest.raises(ValueError):
            public_private_split(**bad)


def test_load_dataset_argument_errors():
    with pytest.raises(ValueError, match="dataset"):
        load_dataset("cifar")
    with pytest.raises(ValueError, match="celeba_dir"):
        load_dataset("celeba")
    with pytest.raises(ValueError, match="data_dir"):
        load_dataset("idx")
    with pytest.raises(ValueError, match="uint8"):
        ImageData(torch.zeros(2, 1, 4, 4), None, "x")
