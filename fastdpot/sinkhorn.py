"""Entropic optimal transport losses on op ``"sinkhorn"``: the GeomLoss-style module :class:`SinkhornLoss`,
DP-Sinkhorn's :func:`semi_debiased_sinkhorn_loss`, the local-DP :func:`entropic_wasserstein`, class conditioning.

Op ``"sinkhorn"`` itself (the validated entry point :func:`sinkhorn`, the ground costs, the reference and keops
backends, the ``auto`` rules, :func:`select_backend`) lives in :mod:`fastdpot.ops.sinkhorn`; its public names are
re-exported here, so ``fastdpot.sinkhorn.sinkhorn`` is the same function.

References:
    J. Feydy, T. Séjourné, F.-X. Vialard, S. Amari, A. Trouvé, G. Peyré, "Interpolating between Optimal
    Transport and MMD using Sinkhorn Divergences", AISTATS 2019; T. Cao, A. Bie, A. Vahdat, S. Fidler, K. Kreis,
    "Don't generate me: training differentially private generative models with Sinkhorn divergence", NeurIPS
    2021; D. Reshetova, W.-N. Chen, A. Özgür, "Training generative models from privatized data via entropic
    optimal transport".
"""
from __future__ import annotations

from typing import Optional

import torch

from ._validate import (check_bool, check_choice, check_int, check_nonnegative, check_positive, check_same_dim,
                        check_tensor)
from .ops.sinkhorn import (HIGH_DIM, SINKHORN_BACKENDS, TENSORIZED_MAX_SIZE, TENSORIZED_MAX_SIZE_CPU,  # noqa: F401
                           TENSORIZED_MAX_SIZE_HIGH_DIM, Cost, _check_backend, custom_cost, euclidean, l1,
                           select_backend, sinkhorn, squared_euclidean, squared_euclidean_l1)

__all__ = ["Cost", "squared_euclidean", "euclidean", "l1", "squared_euclidean_l1", "custom_cost",
           "class_conditional", "sinkhorn", "SinkhornLoss", "semi_debiased_sinkhorn_loss", "entropic_wasserstein",
           "entropic_regularization_for_noise", "TENSORIZED_MAX_SIZE",
           "TENSORIZED_MAX_SIZE_CPU", "HIGH_DIM", "TENSORIZED_MAX_SIZE_HIGH_DIM", "select_backend", "SINKHORN_BACKENDS"]


def class_conditional(x: torch.Tensor, labels: torch.Tensor, num_classes: int, scale: float = 15.0) -> torch.Tensor:
    """Class conditioning by concatenation: [x, scale·one_hot(label)] (DP-Sinkhorn uses scale 15; Cao et al., NeurIPS 2021).

    With the squared-Euclidean part of the cost, two points of different classes are 2·scale² further apart,
    so for scale² ≫ ε the transport plan never mixes classes.

    Shape: x (N, d), labels (N,) integers in [0, num_classes) -> (N, d + num_classes).
    """
    check_tensor(x, "x", ndim=2)
    num_classes = check_int(num_classes, "num_classes")
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.shape[0] != x.shape[0]:
        raise ValueError(f"labels must be a 1-D tensor of length {x.shape[0]}, got "
                         f"{tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):  # no value echoed: the
        raise ValueError(f"labels must lie in [0, {num_classes})")  # labels of DP-Sinkhorn's real data are private
    onehot = torch.nn.functional.one_hot(labels.long(), num_classes).to(x.dtype)
    return torch.cat([x, check_nonnegative(scale, "scale") * onehot], dim=1)


#: The loss names of GeomLoss' ``SamplesLoss`` that SinkhornLoss does not compute (kernel norms and Hausdorff).
_GEOMLOSS_OTHER_LOSSES = ("energy", "gaussian", "laplacian", "hausdorff")


class SinkhornLoss(torch.nn.Module):
    """Module form of :func:`sinkhorn` with GeomLoss' interface: ``SinkhornLoss("sinkhorn", p=, blur=, reach=,
    scaling=, debias=, backend=, diameter=)(x, y)`` or ``(a, x, b, y)`` with weights, batched (B, N, d) inputs
    included.

    Replacing ``geomloss.SamplesLoss("sinkhorn", p=2, blur=0.05, ...)`` by ``SinkhornLoss("sinkhorn", p=2,
    blur=0.05, ...)`` (the same call: GeomLoss' leading loss name, then the same keywords; backend names "auto",
    "tensorized", "online"; "multiscale" is refused) gives the same values and gradients (tested against GeomLoss,
    balanced and unbalanced, batched). The loss name may be left out: ``SinkhornLoss(p=2, blur=0.05)``.

    Args:
        loss: ``"sinkhorn"`` (GeomLoss' name of the Sinkhorn divergence; the only one computed here). ``p`` and
            ``blur`` may follow it positionally, as in GeomLoss; every other argument is a keyword.
        p, blur, scaling, cost, debias, backend, final_iters, reach, diameter: as :func:`sinkhorn`.

    Shape: x (N, d), y (M, d), a (N,), b (M,) -> 0-dim tensor; x (B, N, d), y (B, M, d), a (B, N), b (B, M) ->
    (B,); float32 or float64. See :func:`sinkhorn` for arguments, autograd (envelope theorem through the last step)
    and Raises.

    Raises:
        ValueError: ``loss`` other than ``"sinkhorn"`` (GeomLoss' other losses are named as not implemented; a
            number there is the former positional ``p``: pass it as ``p=``), and every argument check of
            :func:`sinkhorn`, at construction.
    """

    def __init__(self, loss: str = "sinkhorn", p: int = 2, blur: float = 0.05, *, scaling: float = 0.5,
                 cost: Optional[Cost] = None, debias: bool = True, backend: str = "auto", final_iters: int = 0,
                 reach: Optional[float] = None, diameter: Optional[float] = None):
        super().__init__()
        if not isinstance(loss, str):
            raise ValueError(f"SinkhornLoss's first argument is the loss name 'sinkhorn' (GeomLoss' SamplesLoss "
                             f"habit), got {loss!r}; pass the exponent as p={loss!r}")
        if loss in _GEOMLOSS_OTHER_LOSSES:
            raise ValueError(f"loss={loss!r} is one of GeomLoss' kernel or Hausdorff losses, which SinkhornLoss does "
                             f"not compute; it computes loss='sinkhorn' only")
        check_choice(loss, "loss", ("sinkhorn",))
        self.kw = dict(p=p, blur=blur, scaling=scaling, cost=cost, debias=debias, backend=backend,
                       final_iters=final_iters, reach=reach, diameter=diameter)
        # validate at construction (a wrong argument fails here, not at the first training step)
        check_choice(p, "p", (1, 2))
        check_positive(blur, "blur")
        if reach is not None:
            check_positive(reach, "reach")
        if diameter is not None:
            check_positive(diameter, "diameter")
        check_int(final_iters, "final_iters", minimum=0)
        check_bool(debias, "debias")
        if cost is not None and not isinstance(cost, Cost):
            raise ValueError(f"cost must be a fastdpot.sinkhorn.Cost or None, got {type(cost).__name__}")
        _check_backend(backend)
        if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not 0.0 < float(scaling) < 1.0:
            raise ValueError(f"scaling must be a number in (0, 1), got {scaling!r}")

    def forward(self, *args):
        """``forward(x, y)`` or ``forward(a, x, b, y)`` (GeomLoss' argument orders).

        Args:
            x: (N, d) or (B, N, d) points of α. y: (M, d) or (B, M, d) points of β.
            a: (N,) or (B, N) nonnegative weights of α. b: (M,) or (B, M) weights of β (uniform when not given).

        Returns:
            S_ε (``debias=True``) or OT_ε, a 0-dim tensor, or (B,) for batched inputs.

        Raises:
            ValueError: neither 2 nor 4 arguments, or any input :func:`sinkhorn` refuses.
        """
        if len(args) == 2:
            return sinkhorn(args[0], args[1], **self.kw)
        if len(args) == 4:
            a, x, b, y = args
            return sinkhorn(x, y, a, b, **self.kw)
        raise ValueError(f"SinkhornLoss takes (x, y) or (a, x, b, y), got {len(args)} arguments")

    def extra_repr(self):
        return ", ".join(f"{k}={v!r}" for k, v in self.kw.items())


def semi_debiased_sinkhorn_loss(fake: torch.Tensor, fake_extra: torch.Tensor, real: torch.Tensor, ratio: float,
                                **kwargs) -> torch.Tensor:
    """DP-Sinkhorn's semi-debiased loss L = 2·OT_ε(G, real) − OT_ε(G, G') (Cao et al., NeurIPS 2021, Eq. 6).

    G = ``fake`` (B rows); G' = [G_{rB+1..B}, ``fake_extra``] shares (1 − r)B rows with G, the rB others are
    fresh samples (fresh latents, same labels). r = 0: G' = G (biased); r = 1: G' independent of G (unbiased
    estimate of 2·S_ε up to the constant OT_ε(real, real)). Both OT terms are *not* debiased internally
    (``debias`` is forced False).

    Shape: fake (B, d), fake_extra (round(r·B), d), real (M, d) -> 0-dim tensor.

    Raises:
        ValueError: ratio outside [0, 1], fake_extra without round(ratio·B) rows, or of another dimension d,
            dtype or device than fake.
    """
    check_tensor(fake, "fake", ndim=2)
    check_tensor(real, "real", ndim=2)
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0.0 <= float(ratio) <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio!r}")
    B = fake.shape[0]
    k = int(round(float(ratio) * B))
    if fake_extra is None:
        fake_extra = fake[:0]
    check_tensor(fake_extra, "fake_extra", ndim=2, nonempty=False)
    check_same_dim(fake, fake_extra, "fake", "fake_extra")
    check_same_dim(fake, real, "fake", "real")
    if fake_extra.dtype != fake.dtype or fake_extra.device != fake.device:
        raise ValueError(f"fake_extra must have the dtype and device of fake ({fake.dtype}, {fake.device}), got "
                         f"{fake_extra.dtype}, {fake_extra.device}")
    if fake_extra.shape[0] != k:
        raise ValueError(f"fake_extra must have round(ratio*B) = {k} rows, got {fake_extra.shape[0]}")
    kwargs = dict(kwargs, debias=False)
    g_prime = torch.cat([fake[k:], fake_extra], dim=0)
    return 2.0 * sinkhorn(fake, real, **kwargs) - sinkhorn(fake, g_prime, **kwargs)


def entropic_regularization_for_noise(sigma: float, p: int = 2) -> float:
    """The entropic regularisation matched to additive local-DP noise: λ = p·σ^p (Reshetova, Chen & Özgür).

    σ is the Gaussian noise standard deviation per coordinate (p = 2) or the Laplace scale (p = 1).
    """
    sigma = check_positive(sigma, "sigma")
    check_choice(p, "p", (1, 2))
    return p * sigma ** p


def entropic_wasserstein(x: torch.Tensor, y: torch.Tensor, p: int = 2, reg: float = 1.0, *,
                         a: Optional[torch.Tensor] = None, b: Optional[torch.Tensor] = None, scaling: float = 0.5,
                         backend: str = "auto", final_iters: int = 0) -> torch.Tensor:
    """Entropic Wasserstein W_{p,λ}(α, β) = min_π E_π ‖x − y‖_p^p + λ·I_π, **not** debiased (Reshetova, Chen & Özgür).

    I_π = KL(π | α⊗β) is the mutual information of the coupling. Costs: p = 2 → ‖x − y‖₂² (no ½),
    p = 1 → ‖x − y‖₁. For data privatised once by additive noise of std σ (Gaussian, p = 2) or scale σ
    (Laplace, p = 1), use λ = p·σ^p (:func:`entropic_regularization_for_noise`): the population minimiser over
    generators then recovers the clean distribution (Reshetova et al., Theorem 1).

    Shape: x (N, d), y (M, d) -> 0-dim tensor. Autograd and Raises as :func:`sinkhorn`.

    References:
        D. Reshetova, W.-N. Chen, A. Özgür, "Training generative models from privatized data via entropic optimal
        transport", Eq. for W_{p, pσ^p}.
    """
    check_choice(p, "p", (1, 2))
    reg = check_positive(reg, "reg")
    cost = squared_euclidean(half=False) if p == 2 else l1()
    return sinkhorn(x, y, a, b, p=p, blur=reg ** (1.0 / p), scaling=scaling, cost=cost, debias=False,
                    backend=backend, final_iters=final_iters)
