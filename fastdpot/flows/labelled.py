r"""Label-private class-conditional flows: ONE DP sliced-Wasserstein flow on rows that carry a scaled one-hot label.

A labelled record (x, y), x ∈ R^d, y ∈ {0, …, C−1}, enters the flow as the row

.. math::  u = \varphi(x, y) = \big[\,\mathrm{clip}_r(x),\; c\,e_y\,\big] \in \mathbb R^{d + C},

built INSIDE the mechanism (:func:`embed_labelled_rows`, in the flow's clipping): the feature block is clipped to the ball of radius r
(or, with ``normalize=True``, scaled onto the sphere of radius r) and the label block is rebuilt as c times the
one-hot vector of its argmax, whatever the caller put there. The label scale c > 0 is a public choice. Particles
live in R^{d+C}; a particle's label is the argmax of its label block, read once at the end (post-processing), so
the generated class proportions come out of the flow, not from the private class counts.

Neighbouring relation: **replace one record (x, y) by any (x', y'), its label free to change** (substitution; the
data set size n is public, the labels and class sizes are not). Every quantity the flow uses or publishes is a
function of public values only: n, the batch size B, q = B/n, T, the noise multiplier z, Δ and σ; the particle
count N and the initial label allocation are given (public); no class count of the private data is computed.

Sensitivity. For any two rows, ‖φ(x, y) − φ(x', y')‖² = ‖clip_r(x) − clip_r(x')‖² + c²‖e_y − e_{y'}‖²
≤ (2r)² + 2c², i.e. the rows have diameter

.. math::  D_\varphi = \sqrt{4 r^2 + 2 c^2},

attained by x' = −x on the sphere with y ≠ y'. The per-step release of :class:`~fastdpot.flows.DPSlicedWassersteinFlow`
(the noisy projections U Θᵀ + V of the batch, or its sliced quantile sketch) changes, under the substitution of one
row of a fixed-size batch, by at most ‖Θ(u − u')‖ (per-point: exactly that row of the projected matrix; sketch:
per direction, sorting and rank-binning do not increase the ℓ1 change of a fixed-size batch, proof in
:func:`fastdpot.privacy.sliced_quantile_sketch`, and ℓ2 ≤ ℓ1 per direction). Hence, with D = d + C:

* orthogonal directions (⌈k/D⌉ blocks of orthonormal rows): ‖Θ(u − u')‖ ≤ ‖u − u'‖·sqrt(⌈k/D⌉), so
  Δ = D_φ·sqrt(⌈k/D⌉) for every draw of Θ (:func:`fastdpot.privacy.orthogonal_sliced_sensitivity`);
* uniform directions: ‖Θ(u − u')‖² / ‖u − u'‖² has the same law for every fixed u − u' ≠ 0 (Θ is drawn independently
  of the data and its rows are rotation invariant), so the tail bound of
  :func:`fastdpot.privacy.sliced_sensitivity` at dimension D applies with ``diameter = D_φ``.

The sampler (B rows uniformly without replacement from n, fresh each step) and the accountant event (RDP of the
sampled-without-replacement Gaussian, substitution neighbours, q = B/n) are those of the flow, unchanged; σ = z·Δ.

References:
    Sebag et al., "Differentially Private Gradient Flow based on the Sliced Wasserstein Distance", TMLR (the flow);
    Rakotomamonjy & Ralaivola, "Differentially Private Sliced Wasserstein Distance", ICML 2021 (the projected
    Gaussian mechanism and its sensitivity).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .._validate import check_int, check_positive, check_tensor
from .allocation import allocate_particles
from .config import LabelledFlowConfig
from .flow import DPSlicedWassersteinFlow
from .init import draw_init

__all__ = ["LabelledRowsFlow", "label_rows", "embed_labelled_rows", "labelled_rows_diameter"]


def labelled_rows_diameter(clip_radius: float, label_scale: float) -> float:
    """D_φ = sqrt(4r² + 2c²): the largest distance between two embedded rows [clip_r(x), c·e_y] (module docstring).

    Raises:
        ValueError: ``clip_radius`` or ``label_scale`` <= 0 or not finite.
    """
    r = check_positive(clip_radius, "clip_radius")
    c = check_positive(label_scale, "label_scale")
    return math.sqrt(4.0 * r * r + 2.0 * c * c)


def label_rows(x: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Pack labelled records into the flow's raw rows ``[x, onehot(y)]`` (n, d + C), in ``x``'s dtype.

    No bounding happens here: the flow rebuilds every row inside its step (:func:`embed_labelled_rows`). A label
    outside the public domain [0, C) (negative, or >= C) is mapped to class 0: a fixed map of the record, applied
    before the mechanism, whose sensitivity bound covers every record (any two embedded rows are at most
    sqrt(4r² + 2c²) apart), so no label value makes the run fail or shows in any message. Check the label
    encoding on your side of the data if class 0 must not absorb such records.

    Raises:
        ValueError / TypeError: ``x`` not a finite (n, d) tensor, ``labels`` not a 1-D integer tensor of length n
            (public properties: shape and dtype, never the label values).
    """
    check_tensor(x, "x", 2)
    C = check_int(num_classes, "num_classes", 1)
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.shape[0] != x.shape[0]:
        raise ValueError(f"labels must be a 1-D tensor of length {x.shape[0]}, got {getattr(labels, 'shape', labels)!r}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got dtype {labels.dtype}")
    labels = labels.long().to(x.device)
    labels = torch.where((labels >= 0) & (labels < C), labels, torch.zeros_like(labels))  # outside: class 0
    return torch.cat([x, torch.nn.functional.one_hot(labels, C).to(x.dtype)], dim=1)


def embed_labelled_rows(rows: torch.Tensor, feature_dim: int, clip_radius: float, label_scale: float,
                        normalize: bool = False) -> torch.Tensor:
    """The row map φ of the module docstring: ``[clip_r(x), c·e_{argmax(label block)}]`` for every row.

    Whatever the input, every output row has a feature block of norm <= r (exactly r with ``normalize``, a zero
    block mapped to r·e_1) and a label block c·e_j, so two output rows are at most sqrt(4r² + 2c²) apart. Ties in
    the label block go to the first maximal entry.

    Shape:
        rows (B, d + C) -> (B, d + C), same dtype.

    Raises:
        ValueError / TypeError: bad tensor, ``feature_dim`` not in [1, columns − 1], r or c <= 0.
    """
    from ..privacy import clip_rows, normalize_rows

    check_tensor(rows, "rows", 2)
    d = check_int(feature_dim, "feature_dim", 1)
    if d >= rows.shape[1]:
        raise ValueError(f"feature_dim must leave at least one label column, got {d} of {rows.shape[1]} columns")
    r = check_positive(clip_radius, "clip_radius")
    c = check_positive(label_scale, "label_scale")
    x, lab = rows[:, :d], rows[:, d:]
    x = normalize_rows(x) * r if normalize else clip_rows(x, r)
    onehot = torch.nn.functional.one_hot(lab.argmax(dim=1), lab.shape[1]).to(rows.dtype) * c
    return torch.cat([x, onehot], dim=1)


class LabelledRowsFlow(DPSlicedWassersteinFlow):
    """A :class:`~fastdpot.flows.DPSlicedWassersteinFlow` in R^{d+C} whose private rows are labelled records,
    embedded inside the step as ``[clip_r(x), c·e_y]`` (module docstring: relation, proof of Δ).

    Args:
        num_particles: N >= 2.
        dim: D = d + C, the dimension of the particles and of the raw rows (:func:`label_rows`).
        num_projections, step_size: k directions in R^D per step, h.
        num_classes: C >= 1 (public: the label domain); the feature dimension is d = D − C >= 1.
        label_scale: c > 0, the length of the label block (public). Larger c separates the classes in the
            projections but raises the sensitivity Δ = sqrt(4r² + 2c²)·(direction factor).
        init: a tensor (N, D), or a kind of :func:`fastdpot.flows.draw_init` for the feature block (scale
            ``init_scale``); then the label block of particle i is c·e_{j_i}, the first ``class_particles[0]``
            particles in class 0, the next in class 1, … (data-independent).
        class_particles: C public particle counts summing to N for a string ``init`` (default: equal shares,
            :func:`fastdpot.flows.allocation.allocate_particles`); unused with a tensor ``init``.
        **kwargs: every other :class:`~fastdpot.flows.DPSlicedWassersteinFlow` argument (``clip_radius`` and
            ``normalize`` act on the feature block).

    Shape:
        particles (N, D); private data (n, D) raw rows (:func:`label_rows`).

    Raises:
        ValueError: C < 1 or >= D, c <= 0, ``class_particles`` not C counts summing to N, and every error of
            :class:`~fastdpot.flows.DPSlicedWassersteinFlow`.
    """

    _config_class = LabelledFlowConfig

    def __init__(self, num_particles: int, dim: int, num_projections: int, step_size: float, *, num_classes: int,
                 label_scale: float = 1.0, init=None, init_scale: float = 1.0,
                 class_particles: Optional[Sequence[int]] = None, generator: Optional[torch.Generator] = None,
                 **kwargs):
        D = check_int(dim, "dim", 2)
        C = check_int(num_classes, "num_classes", 1)
        if C >= D:
            raise ValueError(f"num_classes must be < dim = d + C (at least one feature column), got {C} and {D}")
        c = check_positive(label_scale, "label_scale")
        N = check_int(num_particles, "num_particles", 2)
        if generator is None:
            from .._random import make_generator

            generator = make_generator()
        if init is None or isinstance(init, str):
            counts = allocate_particles(N, "equal", C, minimum=1 if N >= C else 0) if class_particles is None else \
                [check_int(v, "class_particles[i]", 0) for v in class_particles]
            if len(counts) != C or sum(counts) != N:
                raise ValueError(f"class_particles must be {C} counts summing to num_particles = {N}, got {counts}")
            self._labelled_init = dict(kind="gaussian" if init is None else init, scale=float(init_scale),
                                       generator=generator.get_state(), class_particles=list(counts))
            init = self._labelled_start(self._labelled_init, N, D, C, c, generator)
            init_scale = 1.0
        self._label_fields = dict(num_classes=C, label_scale=c)
        super().__init__(N, D, num_projections, step_size, init=init, init_scale=init_scale, generator=generator,
                         **kwargs)

    def _make_config(self, **fields) -> LabelledFlowConfig:
        return LabelledFlowConfig(**fields, **self._label_fields)

    @staticmethod
    def _labelled_start(record, N: int, D: int, C: int, c: float, generator: torch.Generator) -> torch.Tensor:
        """The data-independent start of ``record``: the feature block drawn from ``generator``, the label block
        c·e_j with ``class_particles[j]`` particles in class j, in order."""
        counts = [int(v) for v in record["class_particles"]]
        if len(counts) != C or sum(counts) != N or min(counts) < 0:
            raise ValueError(f"class_particles must be {C} counts summing to {N}, got {counts}")
        x = draw_init(record["kind"], N, D - C, generator, record["scale"])
        lab = torch.repeat_interleave(torch.arange(C), torch.tensor(counts))
        return torch.cat([x, torch.nn.functional.one_hot(lab, C).to(x.dtype) * c], dim=1)

    def _record_init(self, init, generator, init_scale):
        """The labelled start's record (kind, scale, generator state before the draw, class_particles), taken in
        the constructor; a tensor ``init`` given by the caller, or a flow rebuilt from a state, as the base class."""
        record = self.__dict__.pop("_labelled_init", None)
        return record if record is not None else super()._record_init(init, generator, init_scale)

    def _reproduce_init(self, record):
        if record["kind"] == "tensor":
            return None
        if not isinstance(record.get("class_particles"), list):
            raise ValueError("state['init'] of a LabelledRowsFlow needs class_particles")
        g = torch.Generator(device="cpu")
        g.set_state(record["generator"])
        cfg = self.config
        return self._labelled_start(record, cfg.num_particles, cfg.dim, cfg.num_classes, cfg.label_scale, g)

    @property
    def feature_dim(self) -> int:
        """d = D − C."""
        return self.config.dim - self.config.num_classes

    @property
    def row_diameter(self) -> float:
        """sqrt(4r² + 2c²), the largest distance between two embedded rows (the sensitivity's D)."""
        return labelled_rows_diameter(self.config.clip_radius, self.config.label_scale)

    def _clip(self, batch: torch.Tensor) -> torch.Tensor:
        c = self.config
        return embed_labelled_rows(batch, self.feature_dim, c.clip_radius, c.label_scale, c.normalize)

    def _sketch_clip_radius(self) -> float:
        """The sketch clips the EMBEDDED rows to the ball of radius sqrt(r² + c²) that holds them (a no-op on them,
        and a 1-Lipschitz projection in any case, so the bound ‖Θ(u − u')‖ of the module docstring is kept)."""
        return math.sqrt(self.config.clip_radius ** 2 + self.config.label_scale ** 2)

    def labelled_samples(self):
        """``(features (N, d), labels (N,))``: the feature block and the argmax of the label block (post-processing).
        """
        d = self.feature_dim
        x = self._particles
        return x[:, :d], x[:, d:].argmax(dim=1).cpu()
