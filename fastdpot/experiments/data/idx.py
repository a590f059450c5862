"""Reader for the IDX format of MNIST / Fashion-MNIST (``*-idx3-ubyte`` images, ``*-idx1-ubyte`` labels).

The format (LeCun et al., http://yann.lecun.com/exdb/mnist/): a 4-byte magic ``0x00 0x00 <type> <ndim>``, then
``ndim`` big-endian uint32 sizes, then the data in row-major order, big-endian for multi-byte types.
Files may be gzip-compressed (``.gz``), as the Debian package ``dataset-fashion-mnist`` ships them.
"""
from __future__ import annotations

import gzip
import os
import struct
from typing import Optional, Tuple

import numpy as np
import torch

__all__ = ["read_idx", "find_idx_file", "load_idx_split"]

# IDX type byte -> numpy big-endian dtype
_IDX_TYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}

# standard file stems of the MNIST-format distributions
_STEMS = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (plain or ``.gz``) into a numpy array of its native shape and dtype.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the header is not a valid IDX header, or the payload size does not match it.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"IDX file not found: {path!r}")
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path!r} is not an IDX file: bad magic {raw[:4]!r}")
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_TYPES:
        raise ValueError(f"{path!r}: unknown IDX data type 0x{type_code:02x}")
    if ndim == 0:
        raise ValueError(f"{path!r}: IDX header declares 0 dimensions")
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path!r}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    dtype = _IDX_TYPES[type_code]
    expected = int(np.prod(shape)) * dtype.itemsize
    payload = raw[4 + 4 * ndim:]
    if len(payload) != expected:
        raise ValueError(f"{path!r}: IDX payload has {len(payload)} bytes, header {shape} needs {expected}")
    arr = np.frombuffer(payload, dtype=dtype).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def find_idx_file(data_dir: str, stem: str) -> Optional[str]:
    """Path of ``stem`` in ``data_dir`` (also ``stem.gz`` and the ``stem.idx3-ubyte`` spelling), or None."""
    candidates = [stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"]
    for name in candidates:
        p = os.path.join(data_dir, name)
        if os.path.isfile(p):
            return p
    return None


def load_idx_split(data_dir: str, split: str = "train") -> Tuple[torch.Tensor, torch.Tensor]:
    """Images and labels of one split of an MNIST-format folder.

    Shape:
        images: (n, H, W) uint8; labels: (n,) int64.

    Raises:
        ValueError: ``split`` not "train"/"test", or images and labels disagree in count.
        FileNotFoundError: the folder lacks the split's files (names as in the MNIST distribution).
    """
    if split not in _STEMS:
        raise ValueError(f"split must be one of {list(_STEMS)}, got {split!r}")
    img_stem, lab_stem = _STEMS[split]
    img_path, lab_path = find_idx_file(data_dir, img_stem), find_idx_file(data_dir, lab_stem)
    if img_path is None or lab_path is None:
        raise FileNotFoundError(f"no MNIST-format {split} files ({img_stem}[.gz], {lab_stem}[.gz]) in {data_dir!r}")
    images, labels = read_idx(img_path), read_idx(lab_path)
    if images.ndim != 3:
        raise ValueError(f"{img_path!r}: expected (n, H, W) images, got shape {images.shape}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(f"{lab_path!r}: {labels.shape} labels do not match {images.shape[0]} images")
    return torch.from_numpy(images.astype(np.uint8)), torch.from_numpy(labels.astype(np.int64))
