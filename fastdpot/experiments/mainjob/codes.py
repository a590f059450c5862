"""The public-half protocol's code space around the generator: public class centres (``center="public"``), the
spread calibration with public statistics (``spread="public"``) and the decoding of the released particles. All of
it is public or post-processing of a release: no privacy cost."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..._validate import check_int, check_positive, check_tensor
from .autoencoder import decode

__all__ = ["public_centers", "calibrate_spread", "decode_codes"]


def public_centers(public_latents: torch.Tensor, public_labels: Optional[torch.Tensor],
                   clip_radius: Optional[float] = None, num_classes: Optional[int] = None
                   ) -> Tuple[torch.Tensor, float]:
    """Centres and clipping radius of ``center="public"``, from PUBLIC latents only (no privacy cost).

    Args:
        public_latents: (n, d) latents of the public half. public_labels: (n,) labels, or None for one centre.
        clip_radius: r > 0, or None for the median distance of the public latents to their class's centre.
        num_classes: C (default: max public label + 1); every class 0..C-1 must have at least one public row.

    Returns:
        (centers (C, d) float32 — the class means of the public latents, or (1, d) without labels —, r).

    Raises:
        ValueError: empty or non-finite latents, a class without public rows, r <= 0.
    """
    check_tensor(public_latents, "public_latents", 2)
    if public_latents.shape[0] == 0:
        raise ValueError("public_latents is empty")
    z = public_latents.double()
    if public_labels is None:
        centers = z.mean(0, keepdim=True)
        dist = (z - centers).norm(dim=1)
    else:
        c = int(public_labels.max()) + 1 if num_classes is None else check_int(num_classes, "num_classes")
        counts = torch.bincount(public_labels, minlength=c)[:c]
        if bool((counts == 0).any()):
            raise ValueError(f"classes {torch.nonzero(counts == 0).flatten().tolist()} have no public rows to "
                             f"centre on")
        centers = torch.zeros(c, z.shape[1], dtype=torch.float64).index_add_(0, public_labels, z)
        centers /= counts[:, None].double()
        dist = (z - centers[public_labels]).norm(dim=1)
    r = float(dist.median()) if clip_radius is None else check_positive(clip_radius, "clip_radius")
    if not r > 0:
        raise ValueError("the public latents all sit on their centres: give clip_radius")
    return centers.float(), r


def _sphere_spread(x: torch.Tensor) -> float:
    """RMS distance of the rows of ``x``, scaled onto the unit sphere, to their mean."""
    u = x.double() / x.double().norm(dim=1, keepdim=True).clamp_min(1e-12)
    return float(((u - u.mean(0)) ** 2).sum(1).mean().sqrt())


def calibrate_spread(samples: torch.Tensor, labels: Optional[torch.Tensor], reference: torch.Tensor,
                     reference_labels: Optional[torch.Tensor], iters: int = 50) -> Tuple[torch.Tensor, list]:
    """Scale each class's particles about their mean so that their spread on the unit sphere equals the reference's.

    For each class c (one group when ``labels`` is None) with particles x and particle mean m, find s_c ≥ 0 by
    bisection such that the RMS distance of the unit-normalised rows of ``m + s_c (x − m)`` to their mean equals
    that of the unit-normalised reference rows of class c.

    Privacy: with ``reference`` the PUBLIC latents this is post-processing of the released particles with public
    statistics (no privacy cost). Why: at ε = 10 the per-class flows add σ ≈ 10–17 to projected values of spread
    ≈ 0.35, and the force that matches the variance of the noisy projections scales as 1/σ², so the flow moves the
    particle mean to the class mean but barely contracts the N(0, I_d) initial cloud (d-dimensional spread ≈ 1 per
    coordinate against ≈ 0.02 for the latents of one class).

    Shape:
        samples (N, d), labels (N,) or None, reference (M, d), reference_labels (M,) or None.
        Returns (calibrated samples (N, d) float32, [s_c per class]).

    Raises:
        ValueError: shapes disagree, or a class of ``labels`` has no reference row.
    """
    check_int(iters, "iters")
    if samples.dim() != 2 or reference.dim() != 2 or samples.shape[1] != reference.shape[1]:
        raise ValueError(f"samples (N, d) and reference (M, d) must agree in d, got {tuple(samples.shape)} and "
                         f"{tuple(reference.shape)}")
    if (labels is None) != (reference_labels is None):
        raise ValueError("give labels for both samples and reference, or for neither")
    groups = [None] if labels is None else [int(c) for c in torch.unique(labels)]
    out = samples.detach().clone().float()
    scales = []
    for c in groups:
        sel = slice(None) if c is None else labels == c
        ref = reference if c is None else reference[reference_labels == c]
        if ref.shape[0] < 2:
            raise ValueError(f"class {c} has {ref.shape[0]} reference rows; need at least 2")
        x = samples[sel].double()
        if x.shape[0] < 2:
            scales.append(1.0)
            continue
        target, m = _sphere_spread(ref), x.mean(0)
        dev = x - m
        spread = lambda s: _sphere_spread(m + s * dev)  # noqa: E731
        lo, hi = 0.0, 1.0
        while spread(hi) < target and hi < 1e6:
            lo, hi = hi, hi * 2.0
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if spread(mid) < target else (lo, mid)
        s_c = 0.5 * (lo + hi)
        out[sel] = (m + s_c * dev).float()
        scales.append(s_c)
    return out, scales


def decode_codes(model, samples: torch.Tensor, device="cpu", on_sphere: bool = True) -> torch.Tensor:
    """Decode (N, d) latent particles to (N, C, H, W) images in [0, 1].

    With ``on_sphere`` the particles are first scaled to unit norm: the auto-encoder's latents all lie on S^{d-1},
    while noisy private flows leave particles off it (post-processing; no privacy cost).
    """
    if on_sphere:
        samples = samples / samples.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return decode(model, samples, device=device).clamp_(0.0, 1.0)
