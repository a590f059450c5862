"""Blocks of orthonormal directions applied as operators: Θx and Θᵀy without forming Θ (public names in
:mod:`fastdpot.flows.directions`; this module sits below the privacy core, the ops and the flows, which all read
blocks).

A block holds p <= D orthonormal directions θ_1 … θ_p of R^D, the rows of Θ (p, D):

* :class:`PatchDCTBlock` — an orthonormal colour transform, then the separable orthonormal 2-D DCT-II of every
  p × p patch of a grid shifted by (s_y, s_x), edge patches partial: 2·p·D multiply-adds per particle instead of the
  dense product's D² (Ahmed, Natarajan & Rao, "Discrete cosine transform", IEEE Trans. Computers 1974);
* :class:`RandomHadamardBlock` — rounds of a public random signed permutation and a block-diagonal Walsh–Hadamard
  transform: a random rotation in O(D log D) (Ailon & Chazelle, "The fast Johnson–Lindenstrauss transform", SIAM J.
  Comput. 2009);
* :class:`DenseBlock` — any (p, D) matrix with orthonormal rows (the fallback).

Fast blocks run in C++ (``csrc/block_transforms.h``, ``fastdpot._C_flow_block``) on CPU tensors; elsewhere, or
without the extension, through their materialised Θ (:meth:`DirectionBlock.matrix`, float64, memory checked).
"""
from __future__ import annotations

import math
from numbers import Integral
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ._ext import cpp_status, load_cpp
from ._validate import check_int, check_memory, check_tensor

__all__ = ["DirectionBlock", "DenseBlock", "PatchDCTBlock", "RandomHadamardBlock", "dct_matrix", "colour_basis",
           "patch_edges", "is_block", "coordinate_major"]


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


def colour_basis(channels: int) -> torch.Tensor:
    """An orthonormal colour transform (C, C) float64: identity for one channel; for three, luminance (1, 1, 1)/√3
    and two opponent channels (1, −1, 0)/√2, (1, 1, −2)/√6; identity otherwise."""
    if channels == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    if channels == 3:
        return torch.tensor([[1, 1, 1], [1, -1, 0], [1, 1, -2]], dtype=torch.float64) / torch.tensor(
            [[math.sqrt(3)], [math.sqrt(2)], [math.sqrt(6)]], dtype=torch.float64)
    return torch.eye(channels, dtype=torch.float64)


def patch_edges(size: int, patch: int, shift: int) -> List[int]:
    """The band edges of one image side: 0, the grid lines shift mod p + multiples of p, and the side (a partial
    band at either end where the grid does not fit)."""
    first = shift % patch
    return sorted({0, size, *range(first if first else patch, size, patch)})


def coordinate_major(x: torch.Tensor) -> bool:
    """Whether the (N, W) tensor ``x`` is stored coordinate-major (the transpose of a C-contiguous (W, N) tensor, as
    a flow may keep its particles so that the block kernels never transpose a tile); N >= 2 and W >= 2."""
    return x.dim() == 2 and x.shape[0] > 1 and x.shape[1] > 1 and x.t().is_contiguous()


def is_block(obj) -> bool:
    """Whether ``obj`` is a :class:`DirectionBlock` (not a tensor of directions)."""
    return isinstance(obj, DirectionBlock)


class DirectionBlock:
    """p orthonormal directions of R^D (the rows of Θ (p, D)) applied as an operator.

    Attributes:
        dim: D. size: p (<= D). frequency: (p,) float64, each direction's spatial frequency in cycles per image side
            (a random rotation has none of its own: the value it was given), public information a release may use
            to choose bins (:func:`fastdpot.flows.directions.bins_by_frequency`).

    Shape:
        :meth:`forward`: (N, D) -> (N, p), x Θᵀ. :meth:`transpose`: (N, p) -> (N, D), y Θ. Both keep the input's dtype
        (float32 or float64) and device.
    """

    dim: int
    size: int
    frequency: torch.Tensor

    @property
    def shape(self) -> Tuple[int, int]:
        """(p, D)."""
        return self.size, self.dim

    def spec(self) -> Optional[Dict]:
        """The description the C++ kernels read (``csrc/flow_block.cpp``), or None (no fused kernel: dense)."""
        return None

    def _check_input(self, x: torch.Tensor, width: int, name: str) -> torch.Tensor:
        check_tensor(x, name, 2, finite=False, dtypes=(torch.float32, torch.float64))
        if x.shape[1] != width:
            raise ValueError(f"{name} must be (N, {width}) for this block, got {tuple(x.shape)}")
        return x

    def _apply(self, x: torch.Tensor, transpose: bool) -> torch.Tensor:
        spec = self.spec()
        if spec is not None and x.device.type == "cpu" and cpp_status("flow_block")[0]:
            width = self.dim if transpose else self.size
            if coordinate_major(x):  # (N, W) stored as its transpose: read and written without transposing
                out = torch.empty(width, x.shape[0], dtype=x.dtype)
                load_cpp("flow_block").apply(spec, x.detach().t().numpy(), out.numpy(), bool(transpose), True)
                return out.t()
            out = torch.empty(x.shape[0], width, dtype=x.dtype)
            load_cpp("flow_block").apply(spec, x.detach().contiguous().numpy(), out.numpy(), bool(transpose))
            return out
        th = self.matrix(x.dtype, x.device)
        return x @ th if transpose else x @ th.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x Θᵀ: every row's p projections. Shape: (N, D) -> (N, p)."""
        return self._apply(self._check_input(x, self.dim, "x"), False)

    def transpose(self, y: torch.Tensor) -> torch.Tensor:
        """y Θ: coefficients back to coordinates. Shape: (N, p) -> (N, D)."""
        return self._apply(self._check_input(y, self.size, "y"), True)

    def matrix(self, dtype: torch.dtype = torch.float64, device="cpu") -> torch.Tensor:
        """Θ (p, D), materialised (for references and tests; p·D values).

        Raises:
            ValueError: Θ would not fit in memory.
        """
        check_memory(8 * self.size * self.dim, "block", f"({self.size}, {self.dim})", device, "its dense matrix")
        eye = torch.eye(self.size, dtype=torch.float64)
        spec = self.spec()
        if spec is None or not cpp_status("flow_block")[0]:
            return self._dense_matrix().to(dtype=dtype, device=device)
        out = torch.empty(self.size, self.dim, dtype=torch.float64)
        load_cpp("flow_block").apply(spec, eye.numpy(), out.numpy(), True)
        return out.to(dtype=dtype, device=device)

    def _dense_matrix(self) -> torch.Tensor:
        raise NotImplementedError

    def check_orthonormal(self, tol: float = 1e-9, probes: int = 4,
                          generator: Optional[torch.Generator] = None) -> "DirectionBlock":
        """Check ΘΘᵀ = I_p through the operator itself: Θ(Θᵀu) = u for ``probes`` standard normal u in float64
        (a linear Θ with ΘΘᵀ ≠ I fails for almost every u), within ``tol`` relative to ‖u‖; returns self.

        Raises:
            ValueError: the block is not orthonormal (the largest relative deviation is named).
        """
        g = torch.Generator().manual_seed(0x5EED) if generator is None else generator
        u = torch.randn(probes, self.size, dtype=torch.float64, generator=g)
        back = self.forward(self.transpose(u))
        dev = float(((back - u).norm(dim=1) / u.norm(dim=1)).max())
        if not dev <= tol:
            raise ValueError(f"{type(self).__name__} is not orthonormal: Θ(Θᵀu) differs from u by {dev:.3g} of ‖u‖ "
                             f"(the sensitivity bounds assume orthonormal rows)")
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, dim={self.dim})"


class DenseBlock(DirectionBlock):
    """A block given as a (p, D) matrix Θ with orthonormal rows (checked, as
    :func:`fastdpot.privacy.class_sketch.check_orthonormal_blocks` does: ΘΘᵀ = I within ``tol``).

    Args:
        directions: (p, D) floating tensor. frequency: (p,) finite >= 0, or None (0). tol: None (1e-9 in float64,
            1e-5 in float32).

    Raises:
        ValueError: not 2-D, p > D, non-finite, rows not orthonormal.
    """

    def __init__(self, directions: torch.Tensor, frequency: Optional[torch.Tensor] = None,
                 tol: Optional[float] = None):
        check_tensor(directions, "directions", 2, dtypes=(torch.float32, torch.float64))
        p, d = directions.shape
        if p > d:
            raise ValueError(f"directions must have at most D rows, got {tuple(directions.shape)}")
        th = directions.detach().to(torch.float64).cpu()
        tol = (1e-9 if directions.dtype == torch.float64 else 1e-5) if tol is None else tol
        dev = float((th @ th.t() - torch.eye(p, dtype=torch.float64)).abs().max())
        if not dev <= tol:
            raise ValueError(f"directions must have orthonormal rows; the largest entry of ΘΘᵀ − I is {dev:.3g}")
        self._theta, self.size, self.dim = th, p, d
        self.frequency = _frequency(frequency, p)

    @classmethod
    def _checked(cls, theta: torch.Tensor, frequency: Optional[torch.Tensor] = None) -> "DenseBlock":
        """A block of float64 rows that the caller has just checked orthonormal (no second Gram matrix)."""
        self = cls.__new__(cls)
        self._theta, (self.size, self.dim) = theta, theta.shape
        self.frequency = _frequency(frequency, theta.shape[0])
        return self

    def _dense_matrix(self) -> torch.Tensor:
        return self._theta


def _frequency(frequency, p: int) -> torch.Tensor:
    if frequency is None:
        return torch.zeros(p, dtype=torch.float64)
    f = torch.as_tensor(frequency, dtype=torch.float64).flatten()
    f = f.expand(p).clone() if f.numel() == 1 else f
    if f.numel() != p or not bool(torch.isfinite(f).all()) or bool((f < 0).any()):
        raise ValueError(f"frequency must be a number or ({p},), finite and >= 0, got {tuple(f.shape)}")
    return f


class PatchDCTBlock(DirectionBlock):
    """The orthonormal basis of R^{C·H·W} of :func:`fastdpot.flows.directions.patch_block`: a p × p patch grid
    shifted by ``shift`` (edge patches partial), the 2-D DCT-II inside every patch, crossed with the orthonormal colour
    transform (:func:`colour_basis`); with ``per_block`` = q < D only its q lowest-frequency directions (ties in their
    order), as :func:`fastdpot.flows.directions.image_blocks` keeps them. Same directions, same order.

    Args:
        height, width: H, W >= 1. patch: p in [1, max(H, W)]. shift: (s_y, s_x) integers in [0, p). channels: C >= 1.
        per_block: None (all D) or q in [1, D].

    Raises:
        ValueError: sizes < 1, a patch larger than the image, a malformed shift, ``per_block`` outside [1, D].
    """

    def __init__(self, height: int, width: int, patch: int, shift: Tuple[int, int] = (0, 0), channels: int = 1,
                 per_block: Optional[int] = None):
        H, W = check_int(height, "height"), check_int(width, "width")
        p, C = check_int(patch, "patch"), check_int(channels, "channels")
        if p > max(H, W):
            raise ValueError(f"patch must be at most the image side, got {p} for {H} x {W}")
        if not (isinstance(shift, (tuple, list)) and len(shift) == 2 and
                all(isinstance(v, Integral) and not isinstance(v, bool) and 0 <= v < p for v in shift)):
            raise ValueError(f"shift must be a pair (shift_y, shift_x) of integers in [0, patch = {p}), got {shift!r}")
        sy, sx = int(shift[0]), int(shift[1])
        self.height, self.width, self.patch, self.shift, self.channels = H, W, p, (sy, sx), C
        self.dim = C * H * W
        check_memory(16 * self.dim, "height*width*channels", (H, W, C))
        ey, ex = patch_edges(H, p, sy), patch_edges(W, p, sx)
        self._rows = [(a, b - a) for a, b in zip(ey[:-1], ey[1:])]
        self._cols = [(a, b - a) for a, b in zip(ex[:-1], ex[1:])]
        freq = []
        for _, h in self._rows:
            for _, w in self._cols:
                u = torch.arange(h, dtype=torch.float64).repeat_interleave(w) * (H / (2.0 * h))
                v = torch.arange(w, dtype=torch.float64).repeat(h) * (W / (2.0 * w))
                freq.append(torch.hypot(u, v))
        full = torch.cat(freq).repeat(C)
        if per_block is None:
            self._keep = None
            self.frequency, self.size = full, self.dim
        else:
            q = check_int(per_block, "per_block")
            if not 1 <= q <= self.dim:
                raise ValueError(f"per_block must be in [1, {self.dim}], got {per_block}")
            self._keep = torch.sort(torch.argsort(full, stable=True)[:q]).values
            self.frequency, self.size = full[self._keep], q
        sizes = sorted({s for _, s in self._rows + self._cols})
        mats, offsets, at = [], [-1] * (sizes[-1] + 1), 0
        for s in sizes:
            offsets[s] = at
            mats.append(dct_matrix(s).flatten())
            at += s * s
        self._spec = dict(kind="patch_dct", channels=C, height=H, width=W, colour=colour_basis(C).numpy(),
                          rows=torch.tensor(self._rows, dtype=torch.int64).numpy(),
                          cols=torch.tensor(self._cols, dtype=torch.int64).numpy(),
                          dct=torch.cat(mats).numpy(), dct_offsets=torch.tensor(offsets, dtype=torch.int64).numpy(),
                          keep=None if self._keep is None else self._keep.numpy())

    def spec(self) -> Dict:
        return self._spec

    def _dense_matrix(self) -> torch.Tensor:
        H, W, C = self.height, self.width, self.channels
        spatial = []
        for a, h in self._rows:
            for c, w in self._cols:
                rows = torch.zeros(h * w, H, W, dtype=torch.float64)
                rows[:, a:a + h, c:c + w] = torch.kron(dct_matrix(h), dct_matrix(w)).view(h * w, h, w)
                spatial.append(rows.view(h * w, H * W))
        th = torch.kron(colour_basis(C), torch.cat(spatial))
        return th if self._keep is None else th[self._keep]

    def __repr__(self) -> str:
        return (f"PatchDCTBlock({self.height}x{self.width}x{self.channels}, patch={self.patch}, shift={self.shift}, "
                f"size={self.size})")


class RandomHadamardBlock(DirectionBlock):
    """A random rotation of R^D in O(D log D): ``rounds`` times, a random permutation with random signs, then a
    block-diagonal Walsh–Hadamard transform on the power-of-two pieces of D (largest first: 784 = 512 + 256 + 16),
    each piece scaled by 1/√size. Every factor is orthogonal, so Θ is; the permutations mix the pieces. The draws come
    from the PUBLIC ``seed`` (data-independent: a release may use the block).

    Args:
        dim: D >= 1. seed: integer >= 0 (public). rounds: >= 1 (default 3). frequency: the spatial frequency a bin
            plan reads for every direction (a random rotation mixes all frequencies and has none of its own; default
            0: a plan's first entry).

    Raises:
        ValueError: D < 1, a bad seed or round count.

    References:
        Ailon & Chazelle, "The fast Johnson–Lindenstrauss transform and approximate nearest neighbors", SIAM J.
        Comput. 2009 (randomised Hadamard rotations).
    """

    def __init__(self, dim: int, seed: int, rounds: int = 3, frequency: float = 0.0):
        D = check_int(dim, "dim")
        self.seed, self.rounds = check_int(seed, "seed", 0), check_int(rounds, "rounds")
        check_memory(16 * D * self.rounds, "dim", D)
        self.dim = self.size = D
        g = torch.Generator().manual_seed(self.seed)
        self._perm = torch.stack([torch.randperm(D, generator=g) for _ in range(self.rounds)])
        self._sign = (torch.randint(0, 2, (self.rounds, D), generator=g) * 2 - 1).to(torch.float64)
        pieces, start = [], 0
        for bit in reversed(range(D.bit_length())):
            if D >> bit & 1:
                pieces.append((start, 1 << bit))
                start += 1 << bit
        self._pieces = pieces
        self.frequency = _frequency(frequency, D)
        self._spec = dict(kind="hadamard", dim=D, perm=self._perm.numpy(), sign=self._sign.numpy(),
                          pieces=torch.tensor(pieces, dtype=torch.int64).numpy())

    def spec(self) -> Dict:
        return self._spec

    def _dense_matrix(self) -> torch.Tensor:
        from scipy.linalg import hadamard

        D = self.dim
        wht = torch.zeros(D, D, dtype=torch.float64)
        for a, s in self._pieces:
            wht[a:a + s, a:a + s] = torch.from_numpy(hadamard(s).astype("float64")) / math.sqrt(s)
        th = torch.eye(D, dtype=torch.float64)
        for r in range(self.rounds):  # round r: y_i = sign_i · x_{perm_i}, then the pieces' Hadamard
            step = torch.zeros(D, D, dtype=torch.float64)
            step[torch.arange(D), self._perm[r]] = self._sign[r]
            th = wht @ step @ th
        return th

    def __repr__(self) -> str:
        return f"RandomHadamardBlock(dim={self.dim}, seed={self.seed}, rounds={self.rounds})"


def block_list(blocks: Sequence[DirectionBlock], name: str = "blocks") -> List[DirectionBlock]:
    """Validate a non-empty sequence of blocks of one dimension and one size; returns it as a list.

    Raises:
        ValueError / TypeError: empty, an element that is not a :class:`DirectionBlock`, sizes or dimensions differ.
    """
    out = list(blocks)
    if not out:
        raise ValueError(f"{name} must hold at least one block")
    for b in out:
        if not isinstance(b, DirectionBlock):
            raise TypeError(f"{name} must hold DirectionBlock objects, got {type(b).__name__}")
    if len({(b.size, b.dim) for b in out}) != 1:
        raise ValueError(f"{name} must share one size and dimension, got {sorted({b.shape for b in out})}")
    return out
