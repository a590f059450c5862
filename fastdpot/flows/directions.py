"""Public, data-independent direction sets for images: blocks of orthonormal directions with local structure.

A sliced flow on random global directions gives noisy images (Liutkus et al., "Sliced-Wasserstein Flows:
Nonparametric Generative Modeling via Optimal Transport and Diffusions", ICML 2019); local or multi-scale
directions keep them sharp (Dai & Seljak, "Sliced Iterative Normalizing Flows", ICML 2021, patch hierarchies; Du et
al., "Nonparametric Generative Modeling with Conditional Sliced-Wasserstein Flows", ICML 2023, locally connected
directions). Here every block is a full orthonormal basis of the image space R^{C·H·W}: the image is tiled into
p × p patches (a grid shifted by (s_y, s_x); edge patches are partial), each patch gets the orthonormal 2-D DCT-II of
its pixels, and the colour channels an orthonormal colour transform. A block of orthonormal directions costs the
sensitivity of one row (Σ_j (θ_jᵀx)² = ‖x‖²): :func:`fastdpot.privacy.class_sketch.class_quantile_sketch`.

Every direction carries its spatial frequency (cycles per image side), which a release may use, as public
information, to give low frequencies more quantile bins (:func:`bins_by_frequency`).
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import List, Optional, Sequence, Tuple

import torch

from .._validate import check_int, check_memory, check_tensor

__all__ = ["dct_matrix", "patch_block", "image_blocks", "bins_by_frequency", "default_patches", "DEFAULT_PATCHES"]

#: the default blocks of 28 × 28 images: the whole image, two shifted 14-px grids, two 7-px grids, two 4-px grids and
#: a 2-px grid (patch size, shift y, shift x)
DEFAULT_PATCHES = ((28, 0, 0), (14, 0, 0), (14, 7, 7), (7, 0, 0), (7, 3, 3), (4, 0, 0), (4, 2, 2), (2, 1, 1))


def default_patches(height: int, width: int) -> Tuple[Tuple[int, int, int], ...]:
    """The default blocks for H × W images: :data:`DEFAULT_PATCHES` at 28 × 28; else, with S = min(H, W), patches of
    S, S/2, S/4 and S/8 pixels, each but the first also on a grid shifted by half a patch, and 2-px patches shifted by
    one pixel (sizes below 2 dropped)."""
    if (height, width) == (28, 28):
        return DEFAULT_PATCHES
    S = min(check_int(height, "height"), check_int(width, "width"))
    out = [(S, 0, 0)]
    for p in (S // 2, S // 4, S // 8):
        if p >= 2:
            out += [(p, 0, 0), (p, p // 2, p // 2)]
    out.append((2, 1, 1))
    return tuple(out)


def dct_matrix(n: int) -> torch.Tensor:
    """The orthonormal DCT-II matrix (n, n) in float64: row u is the frequency-u cosine (u/2 cycles over n samples).

    References:
        Ahmed, Natarajan & Rao, "Discrete cosine transform", IEEE Transactions on Computers, 1974.
    """
    n = check_int(n, "n")
    k = torch.arange(n, dtype=torch.float64)
    m = torch.cos(math.pi * (2 * k[None, :] + 1) * k[:, None] / (2 * n)) * math.sqrt(2.0 / n)
    m[0] /= math.sqrt(2.0)
    return m


def _colour_basis(channels: int) -> torch.Tensor:
    """An orthonormal colour transform: identity for one channel; for three, luminance (1, 1, 1)/√3 and two
    opponent channels (1, −1, 0)/√2, (1, 1, −2)/√6."""
    if channels == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    if channels == 3:
        return torch.tensor([[1, 1, 1], [1, -1, 0], [1, 1, -2]], dtype=torch.float64) / torch.tensor(
            [[math.sqrt(3)], [math.sqrt(2)], [math.sqrt(6)]], dtype=torch.float64)
    return torch.eye(channels, dtype=torch.float64)


def _check_patch(entry) -> Tuple[int, int, int]:
    """One entry of ``patches``, ``(patch, shift_y, shift_x)``: integers, patch >= 1, each shift in [0, patch)."""
    if not (isinstance(entry, (tuple, list)) and len(entry) == 3 and
            all(isinstance(v, Integral) and not isinstance(v, bool) for v in entry)):
        raise ValueError(f"patches entries must be (patch, shift_y, shift_x) triples of integers, got {entry!r}")
    p, sy, sx = (int(v) for v in entry)
    if p < 1 or not (0 <= sy < p and 0 <= sx < p):
        raise ValueError(f"patches entry {entry!r} must have patch >= 1 and both shifts in [0, patch) (a grid "
                         f"shifted by s is the grid shifted by s mod patch: pass that)")
    return p, sy, sx


def _edges(size: int, p: int, shift: int) -> List[int]:
    first = shift % p
    return sorted({0, size, *range(first if first else p, size, p)})


def patch_block(height: int, width: int, patch: int, shift: Tuple[int, int] = (0, 0),
                channels: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """One orthonormal basis of R^{C·H·W}: a p × p patch grid shifted by ``shift``, a 2-D DCT-II inside every patch
    (edge patches partial), crossed with an orthonormal colour transform.

    Returns:
        ``(directions (C·H·W, C·H·W) float64 with orthonormal rows, frequency (C·H·W,) float64)``: the spatial
        frequency of each direction in cycles per image side (0 for a patch mean), the channel index major.

    Raises:
        ValueError: sizes < 1, a patch larger than the image, a ``shift`` that is not a pair of integers in
            [0, patch), a basis that would not fit in memory (it is a dense (D, D) float64 matrix, D = C·H·W).
    """
    H, W, p, C = (check_int(height, "height"), check_int(width, "width"), check_int(patch, "patch"),
                  check_int(channels, "channels"))
    if p > max(H, W):
        raise ValueError(f"patch must be at most the image side, got {p} for {H} x {W}")
    if not (isinstance(shift, (tuple, list)) and len(shift) == 2 and
            all(isinstance(v, Integral) and not isinstance(v, bool) and 0 <= v < p for v in shift)):
        raise ValueError(f"shift must be a pair (shift_y, shift_x) of integers in [0, patch = {p}), got {shift!r}")
    # the patches' rows and their concatenation, (H·W)² each, then the colour product, (C·H·W)²: float64
    check_memory(8 * (H * W) ** 2 * (2 + C * C), "(height, width, channels)", (H, W, C), "cpu",
                 f"the dense ({C * H * W}, {C * H * W}) float64 basis of one block")
    spatial, freq = [], []
    for a, b in zip(_edges(H, p, shift[0])[:-1], _edges(H, p, shift[0])[1:]):
        for c, d in zip(_edges(W, p, shift[1])[:-1], _edges(W, p, shift[1])[1:]):
            h, w = b - a, d - c
            basis = torch.kron(dct_matrix(h), dct_matrix(w)).view(h * w, h, w)
            rows = torch.zeros(h * w, H, W, dtype=torch.float64)
            rows[:, a:b, c:d] = basis
            spatial.append(rows.view(h * w, H * W))
            u = torch.arange(h, dtype=torch.float64).repeat_interleave(w) * (H / (2.0 * h))
            v = torch.arange(w, dtype=torch.float64).repeat(h) * (W / (2.0 * w))
            freq.append(torch.hypot(u, v))
    S, f = torch.cat(spatial), torch.cat(freq)
    colour = _colour_basis(C)
    return torch.kron(colour, S), f.repeat(C)


def image_blocks(height: int, width: int, channels: int = 1,
                 patches: Optional[Sequence[Tuple[int, int, int]]] = None,
                 per_block: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The blocks of :func:`patch_block` for each ``(patch, shift_y, shift_x)`` of ``patches`` (default
    :func:`default_patches`), stacked; with ``per_block`` = p < D, each block keeps only its p lowest-frequency
    directions (ties in their order), still orthonormal: a public choice that bounds the memory at large D.

    Returns:
        ``(directions (B·p, D), frequency (B·p,))`` with D = C·H·W: B blocks of p orthonormal rows (p = D by default).

    Raises:
        ValueError: no patch, an entry that is not a ``(patch, shift_y, shift_x)`` triple of integers with patch >= 1
            and shifts in [0, patch), ``per_block`` outside [1, D], a block that would not fit in memory.
    """
    if patches is None:
        patches = default_patches(height, width)
    elif isinstance(patches, (str, bytes)) or not isinstance(patches, Sequence):
        raise ValueError(f"patches must be a sequence of (patch, shift_y, shift_x) triples, got {patches!r}")
    patches = [_check_patch(e) for e in patches]  # every entry before the first block is built
    H, W, C = check_int(height, "height"), check_int(width, "width"), check_int(channels, "channels")
    for entry in patches:
        if entry[0] > max(H, W):
            raise ValueError(f"patches entry {entry!r}: patch must be at most the image side, got {entry[0]} for "
                             f"{H} x {W}")
    D = C * H * W
    if per_block is not None and not 1 <= check_int(per_block, "per_block") <= D:
        raise ValueError(f"per_block must be in [1, {D}], got {per_block}")
    rows_kept = D if per_block is None else per_block
    # the blocks' rows and their concatenation: 2 (B·p, D) float64
    check_memory(16 * len(patches) * rows_kept * D, "(height, width, channels)", (H, W, C), "cpu",
                 f"{len(patches)} blocks of {rows_kept} directions in dimension {D} (a smaller per_block bounds it)")
    out = []
    for p, sy, sx in patches:
        rows, freq = patch_block(height, width, p, (sy, sx), channels)
        if per_block is not None:
            if not 1 <= check_int(per_block, "per_block") <= rows.shape[0]:
                raise ValueError(f"per_block must be in [1, {rows.shape[0]}], got {per_block}")
            keep = torch.sort(torch.argsort(freq, stable=True)[:per_block]).values
            rows, freq = rows[keep], freq[keep]
        out.append((rows, freq))
    if not out:
        raise ValueError("patches must name at least one block")
    return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])


def bins_by_frequency(frequency: torch.Tensor, plan: Sequence[Tuple[float, int]]) -> torch.Tensor:
    """Quantile bins per direction from its (public) frequency: ``plan`` lists ``(max_frequency, bins)`` in
    increasing frequency; a direction gets the bins of the first entry whose frequency bound it does not exceed (the
    last entry's bound may be ``inf``).

    Shape: frequency (k,) -> (k,) int64.

    Raises:
        TypeError: ``frequency`` not a tensor.
        ValueError: a non-finite frequency, an empty plan, an entry that is not a (max_frequency, bins) pair, a NaN
            bound, bounds not increasing, bins < 1, a frequency above the last bound.
    """
    check_tensor(frequency, "frequency", floating=False, nonempty=False)
    if not plan:
        raise ValueError("plan must have at least one (max_frequency, bins) entry")
    for entry in plan:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], Real) and
                not isinstance(entry[0], bool) and not math.isnan(float(entry[0]))):
            raise ValueError(f"plan entries must be (max_frequency, bins) pairs with a number max_frequency (inf "
                             f"allowed), got {entry!r}")
    bounds = [float(b) for b, _ in plan]
    if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
        raise ValueError(f"plan's frequency bounds must increase, got {bounds}")
    out = torch.zeros(frequency.shape, dtype=torch.int64)
    done = torch.zeros(frequency.shape, dtype=torch.bool)
    for bound, bins in plan:
        check_int(bins, "bins")
        sel = (frequency <= bound) & ~done
        out[sel] = int(bins)
        done |= sel
    if not bool(done.all()):
        raise ValueError(f"plan's last bound {bounds[-1]} is below the largest frequency {float(frequency.max())}")
    return out
