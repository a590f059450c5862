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

from .._blocks import DenseBlock, DirectionBlock, PatchDCTBlock, RandomHadamardBlock, dct_matrix
from .._validate import check_int, check_memory, check_tensor

__all__ = ["DirectionBlock", "PatchDCTBlock", "RandomHadamardBlock", "DenseBlock", "patch_dct_blocks",
           "hadamard_blocks", "dct_matrix", "patch_block", "image_blocks", "bins_by_frequency", "default_patches",
           "DEFAULT_PATCHES"]

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


def patch_block(height: int, width: int, patch: int, shift: Tuple[int, int] = (0, 0),
                channels: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """One orthonormal basis of R^{C·H·W} as a dense matrix: a p × p patch grid shifted by ``shift``, a 2-D DCT-II
    inside every patch (edge patches partial), crossed with an orthonormal colour transform, built as Kronecker
    products (the reference of :class:`PatchDCTBlock`, which applies the same basis without forming it).

    Returns:
        ``(directions (C·H·W, C·H·W) float64 with orthonormal rows, frequency (C·H·W,) float64)``: the spatial
        frequency of each direction in cycles per image side (0 for a patch mean), the channel index major.

    Raises:
        ValueError: sizes < 1, a patch larger than the image, a ``shift`` that is not a pair of integers in
            [0, patch), a basis that would not fit in memory (it is a dense (D, D) float64 matrix, D = C·H·W).
    """
    H, W, C = check_int(height, "height"), check_int(width, "width"), check_int(channels, "channels")
    # the patches' rows and their concatenation, (H·W)² each, then the colour product, (C·H·W)²: float64
    check_memory(8 * (H * W) ** 2 * (2 + C * C), "(height, width, channels)", (H, W, C), "cpu",
                 f"the dense ({C * H * W}, {C * H * W}) float64 basis of one block")
    block = PatchDCTBlock(H, W, patch, shift, C)
    return block._dense_matrix(), block.frequency


def patch_dct_blocks(height: int, width: int, channels: int = 1,
                     patches: Optional[Sequence[Tuple[int, int, int]]] = None,
                     per_block: Optional[int] = None) -> List[PatchDCTBlock]:
    """The fast blocks of :func:`image_blocks`, in its order: one :class:`PatchDCTBlock` per ``(patch, shift_y,
    shift_x)`` of ``patches`` (default :func:`default_patches`), each keeping its ``per_block`` lowest frequencies
    (default: all D = C·H·W directions). Nothing of size D² is formed.

    Raises:
        ValueError: no patch, an entry that is not a ``(patch, shift_y, shift_x)`` triple of integers with patch >= 1
            and shifts in [0, patch) (every entry checked before the first block is built), a patch larger than the
            image, ``per_block`` outside [1, D].
    """
    if patches is None:
        patches = default_patches(height, width)
    elif isinstance(patches, (str, bytes)) or not isinstance(patches, Sequence):
        raise ValueError(f"patches must be a sequence of (patch, shift_y, shift_x) triples, got {patches!r}")
    patches = [_check_patch(e) for e in patches]
    if not patches:
        raise ValueError("patches must name at least one block")
    H, W = check_int(height, "height"), check_int(width, "width")
    for entry in patches:
        if entry[0] > max(H, W):
            raise ValueError(f"patches entry {entry!r}: patch must be at most the image side, got {entry[0]} for "
                             f"{H} x {W}")
    return [PatchDCTBlock(H, W, p, (sy, sx), channels, per_block=per_block) for p, sy, sx in patches]


def hadamard_blocks(dim: int, count: int, seed: int, rounds: int = 3) -> List[RandomHadamardBlock]:
    """``count`` independent :class:`RandomHadamardBlock` rotations of R^dim, block b drawn from the public seed
    ``seed + b``."""
    count = check_int(count, "count")
    return [RandomHadamardBlock(dim, check_int(seed, "seed", 0) + b, rounds) for b in range(count)]


def image_blocks(height: int, width: int, channels: int = 1,
                 patches: Optional[Sequence[Tuple[int, int, int]]] = None,
                 per_block: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The blocks of :func:`patch_dct_blocks`, materialised and stacked: the blocks of :func:`patch_block` for each
    ``(patch, shift_y, shift_x)`` of ``patches`` (default :func:`default_patches`); with ``per_block`` = p < D, each
    block keeps only its p lowest-frequency directions (ties in their order), still orthonormal.

    Returns:
        ``(directions (B·p, D), frequency (B·p,))`` with D = C·H·W: B blocks of p orthonormal rows (p = D by default).

    Raises:
        ValueError: those of :func:`patch_dct_blocks`, a matrix that would not fit in memory (a smaller per_block
            bounds it).
    """
    # the size is known before any block is built (building the blocks of a huge image costs minutes by itself)
    H, W, C = check_int(height, "height"), check_int(width, "width"), check_int(channels, "channels")
    count = len(default_patches(H, W)) if patches is None else len(patches) if isinstance(patches, Sequence) else 1
    D = C * H * W
    p = D if per_block is None or not isinstance(per_block, int) else min(max(per_block, 1), D)
    check_memory(16 * max(count, 1) * p * D, "(height, width, channels)", (height, width, channels), "cpu",
                 f"{max(count, 1)} blocks of {p} directions in dimension {D} (a smaller per_block bounds it)")
    blocks = patch_dct_blocks(height, width, channels, patches, per_block)
    return torch.cat([b.matrix() for b in blocks]), torch.cat([b.frequency for b in blocks])


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
