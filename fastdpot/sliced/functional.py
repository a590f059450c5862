"""The functional (DP) sliced Wasserstein losses: :func:`sliced_wasserstein` (POT's conventions) and
:func:`dp_sliced_wasserstein` (the DP-SW mechanism of Rakotomamonjy & Ralaivola, ICML 2021, points or sketch
release), on op ``"sliced_wasserstein"`` (:mod:`fastdpot.ops.sliced_wasserstein`).
"""
from __future__ import annotations

import math
import warnings
from typing import Optional

import numpy as np
import torch

from .._validate import (check_bool, check_choice, check_generator, check_int, check_nonnegative,
                         check_num_projections, check_positive, check_tensor, resolve_alias)
from ..ops import sliced_wasserstein as _op
from ..ops.sliced_wasserstein import _DTYPES
from ..reference import sliced as _ref
from . import _compiled

__all__ = ["sliced_wasserstein", "dp_sliced_wasserstein", "DEFAULT_NUM_PROJECTIONS", "DIRECTIONS", "RELEASES",
           "check_clip_radius"]

#: k when neither ``num_projections`` nor ``projections`` is given (POT's default ``n_projections=50``).
DEFAULT_NUM_PROJECTIONS = 50
#: ``directions=``: i.i.d. uniform on the sphere, or blocks of d orthonormal rows (as the flows).
DIRECTIONS = ("uniform", "orthogonal")
#: ``release=`` of the DP loss.
RELEASES = ("points", "sketch")


def sliced_wasserstein(x, y, a=None, b=None, num_projections: Optional[int] = None, p: int = 2,
                       projections=None, seed=None, log: bool = False, *,
                       generator: Optional[torch.Generator] = None, backend: str = "auto",
                       n_projections: Optional[int] = None):
    r"""Monte-Carlo sliced Wasserstein distance SW_p^p between two weighted point clouds (no privacy).

    .. math::
        \mathrm{SW}_p^p(\mu, \nu) \approx \frac1k \sum_{j=1}^k W_p^p(\theta_j{}_\#\mu, \theta_j{}_\#\nu),
        \qquad \mu = \sum_i a_i\,\delta_{x_i},\ \nu = \sum_i b_i\,\delta_{y_i}

    with 1-D W_p^p computed by sorting (equal weights, N ≠ M: the merged quantile levels {i/N} ∪ {j/M}; weights:
    the merged cumulative weights, as POT's ``ot.wasserstein_1d``).

    A drop-in for POT's ``ot.sliced_wasserstein_distance(X_s, X_t, a=None, b=None, n_projections=50, p=2,
    projections=None, seed=None, log=False)``: the same positional order, numpy arrays in and out, sample weights,
    the default of 50 directions, ``seed``, ``log``. Two documented differences:

    * the value is the **p-th power** SW_p^p (what a loss wants; its gradient has no 1/(p·SW^{p−1}) blow-up at 0):
      POT's value is ``sliced_wasserstein(...) ** (1 / p)``;
    * ``projections`` are (k, d), one unit direction per **row** (fastdpot's layout everywhere); POT's are (d, k)
      columns: pass ``projections.T``. A (d, k) array with k ≠ d is refused with that hint.

    Args:
        x: (N, d) float32 / float64 torch tensor, or a numpy array (then the result is numpy too; integer arrays
            are read as float64).
        y: (M, d), same dtype, device and kind (torch / numpy) as x.
        a: optional (N,) nonnegative weights of x's rows (normalised to sum 1, default 1/N; the gradient w.r.t. them
            is that of the normalised weights). b: (M,) likewise. Non-uniform weights are computed by the reference
            backend (``backend="auto"`` falls back to it; a compiled backend asked for explicitly raises); uniform
            ones keep the fast path.
        num_projections: k, the number of random directions when ``projections`` is None (default
            :data:`DEFAULT_NUM_PROJECTIONS` = 50; k·d <= 2^31). Alias ``n_projections`` (POT's name).
        p: 1 or 2.
        projections: optional (k, d) directions with unit-norm rows.
        seed: POT's seed of the directions: an integer, a ``torch.Generator``, or a numpy ``RandomState`` /
            ``Generator`` (one integer is drawn from it). Alias of ``generator``.
        log: also return ``{"projections": (k, d), "projected_emds": (k,) W_p^p per direction}`` (computed by the
            reference backend).
        generator: torch.Generator for the directions (global generator when neither it nor ``seed`` is given).
        backend: "auto" (cpu kernel for CPU tensors when built, cuda / triton for CUDA tensors, else reference),
            "reference", "cpu", "triton", "cuda".

    Shape:
        x (N, d), y (M, d), a (N,), b (M,), projections (k, d) -> 0-d tensor (numpy inputs: a numpy scalar of
        x's dtype).

    Returns:
        SW_p^p (p-th power), differentiable w.r.t. x, y (and the weights on the reference backend); with ``log``
        a tuple (value, log dict).

    Raises:
        TypeError: x, y not both torch tensors or both numpy arrays; a number where the weights ``a`` go (the
            former third positional argument ``num_projections``: pass it by keyword); ``generator`` of a wrong type.
        ValueError: bad shapes / dtypes / non-finite or empty input, a tensor on an unsupported device (meta),
            p not in {1, 2}, projections not (k, d) with unit rows (tolerance
            :func:`fastdpot._validate.unit_norm_tolerance`), too many projections (k·d > 2^31), bad weights, a name
            given together with its alias, values whose distances overflow the dtype (the loss would be inf).
        BackendUnavailableError: an explicitly requested backend is not available.

    Under ``torch.compile``: the custom op ``torch.ops.fastdpot.sliced_wasserstein`` (one node of the graph, the
    value checks when it runs, the directions from the compiler's random numbers); weights, ``log``, numpy inputs, a
    generator or ``seed``, and the reference backend run eagerly at a graph break (:mod:`fastdpot.sliced._compiled`).

    References:
        Bonneel et al., "Sliced and Radon Wasserstein barycenters", JMIV 2015; Flamary et al., "POT: Python Optimal
        Transport", JMLR 2021 (``ot.sliced_wasserstein_distance``, which returns the p-th root).
    """
    num_projections = resolve_alias(num_projections, n_projections, "num_projections", "n_projections")
    if n_projections is not None:  # POT's name: its errors name it as passed (the checks below say num_projections)
        dim = None if torch.compiler.is_compiling() or getattr(x, "ndim", None) != 2 else int(x.shape[1])
        check_num_projections(n_projections, dim, "n_projections")
    generator = resolve_alias(generator, _seed_generator(seed), "generator", "seed")
    check_generator(generator, allow_privacy=False)
    check_bool(log, "log")
    if projections is None and num_projections is None:
        num_projections = DEFAULT_NUM_PROJECTIONS
    if torch.compiler.is_compiling():  # a custom op in the graph, or eager at a graph break (sliced._compiled)
        fused = _compiled.supported(x, y, backend, projections=projections,
                                    eager_only=log or a is not None or b is not None or generator is not None)
        if fused:
            return _compiled.compiled_sliced_wasserstein(x, y, num_projections, p, projections, fused)
        return _eager(sliced_wasserstein)(x, y, a, b, num_projections, p, projections, None, log,
                                          generator=generator, backend=backend)
    x, y, a, b, projections, as_numpy = _torch_inputs(x, y, a, b, projections)
    if not log:
        out = _op.sliced_wasserstein_op(x, y, projections, p, backend=backend, num_projections=num_projections,
                                        generator=generator, a=a, b=b)
        return out.detach().numpy()[()] if as_numpy else out
    theta = _op.check_inputs(x, y, p, num_projections, projections, generator)
    aw, bw = _op.check_weights(a, x.shape[0], "a", x), _op.check_weights(b, y.shape[0], "b", x)
    if backend not in ("auto", "reference"):
        raise ValueError(f"log=True is computed by the reference backend: backend must be 'auto' or 'reference', "
                         f"got {backend!r}")
    per = _ref.projected_wasserstein(x, y, theta, p, a=aw, b=bw)
    value = _op._check_overflow(per.mean(), x.dtype)
    if as_numpy:
        return value.detach().numpy()[()], dict(projections=theta.numpy(), projected_emds=per.detach().numpy())
    return value, dict(projections=theta, projected_emds=per)


def _torch_inputs(x, y, a, b, projections):
    """numpy in: everything numpy becomes a CPU tensor (integer arrays float64); returns the tensors and whether the
    result goes back to numpy."""
    for name, w in (("a", a), ("b", b)):
        if isinstance(w, (int, float)) and not isinstance(w, bool):
            raise TypeError(f"{name}={w!r}: {name} holds the sample weights (POT's positional order is X_s, X_t, a, b, "
                            f"n_projections, p, projections, seed, log); pass the number of directions as "
                            f"num_projections= (or n_projections=)")
    xn, yn = isinstance(x, np.ndarray), isinstance(y, np.ndarray)
    if xn != yn:
        raise TypeError(f"x and y must both be torch tensors or both numpy arrays, got {type(x).__name__} and "
                        f"{type(y).__name__}")
    if not xn:
        return x, y, a, b, projections, False

    def conv(v):
        if not isinstance(v, np.ndarray):
            return v
        if v.dtype.kind in "biu":
            v = v.astype(np.float64)
        return torch.from_numpy(np.ascontiguousarray(v))

    return conv(x), conv(y), conv(a), conv(b), conv(projections), True


def _seed_generator(seed):
    """POT's ``seed`` alias: an integer (or a numpy RandomState / Generator, which gives one integer) becomes a CPU
    generator seeded with it; a torch.Generator passes through."""
    if seed is None or isinstance(seed, torch.Generator):
        return seed
    if isinstance(seed, np.random.RandomState):
        seed = int(seed.randint(0, 2 ** 31 - 1))
    elif isinstance(seed, np.random.Generator):
        seed = int(seed.integers(0, 2 ** 63 - 1))
    from .._validate import check_seed

    g = torch.Generator()
    g.manual_seed(check_seed(seed, "seed"))
    return g


def dp_sliced_wasserstein(generated: torch.Tensor, *legacy, private: Optional[torch.Tensor] = None,
                          noise_std: Optional[float] = None, num_projections: Optional[int] = None, p: int = 2,
                          projections: Optional[torch.Tensor] = None, generator: Optional[torch.Generator] = None,
                          backend: str = "auto", return_noise: bool = False, clip_radius: Optional[float] = None,
                          secure_mode: bool = True, release: str = "points", sketch_bins: Optional[int] = None,
                          directions: str = "uniform"):
    r"""DP sliced Wasserstein distance DP-SW_p^p (Rakotomamonjy & Ralaivola, ICML 2021): Gaussian mechanism on the projected private data.

    .. math::
        \mathrm{DP\text{-}SW}_p^p = \frac1k\sum_j W_p^p\Big(\frac1M\sum_i\delta_{\theta_j^\top x_i + v_{ij}},
        \frac1N\sum_i\delta_{\theta_j^\top y_i + v'_{ij}}\Big),\quad v, v' \sim \mathcal N(0, \sigma^2)\ \text{i.i.d.}

    The same directions Θ for both sides, independent noise on each side. The release that carries the privacy
    guarantee is ``private Θᵀ + V``; everything computed from it (the loss, the gradient w.r.t. ``generated``) is
    post-processing. The guarantee itself — which (ε, δ) a given ``noise_std`` buys — needs a norm bound on the
    private rows (``clip_radius``: rows are clipped to it *inside*, before projection; required with noise), the
    sensitivity of the random projection and an accountant over all releases: see
    :func:`fastdpot.dp_sliced_wasserstein_noise_std` and :class:`fastdpot.DPSlicedWassersteinLoss`. This function
    alone releases once and accounts nothing.

    The private rows are passed by keyword only, ``dp_sliced_wasserstein(generated, private=x, noise_std=σ, ...)``,
    so that they cannot land in the unprotected slot by argument order (``nn.MSELoss``'s ``(input, target)`` order,
    or this function's former ``(x_private, y, noise_std)`` order): a second positional tensor raises TypeError. The
    remaining arguments are keyword-only as well.

    Args:
        generated: (N, d) generated / public rows (float32 / float64), the side gradients are meant for; never
            clipped, its noise is not needed for privacy.
        private: (M, d) private rows (keyword-only, required), same dtype and device; the only side the
            guarantee covers (clipped to ``clip_radius`` inside).
        noise_std: σ >= 0 (keyword-only, required), the standard deviation of the Gaussian noise added to every
            projected value (same unit as the rows). 0 gives the non-private distance.
        num_projections: k (random directions from ``generator``) when ``projections`` is None (k·d <= 2^31).
        p: 1 or 2.
        projections: optional (k, d) unit-norm directions (with ``directions="orthogonal"``: blocks of d
            orthonormal rows, checked).
        generator: with ``secure_mode=False``, the torch.Generator of the directions and the noise seed
            (replayable; no guarantee against anyone who holds its seed). Also accepts a
            :class:`fastdpot.privacy.randomness.PrivacyRandomness`.
        secure_mode: True (default): directions and the noise key come from the operating system (secret, not
            replayable; a ``torch.Generator`` then raises ValueError).
        backend: "auto", "reference", "cpu", "triton", "cuda" (every backend computes both releases).
        return_noise: also return the exact noise added, (M, k) and (N, k), so the reference can replay the run.
        clip_radius: R > 0, rows of ``private`` with norm > R are scaled onto the ball of radius R before
            projection (the mechanism's norm bound, in the rows' unit; ‖x − x'‖ ≤ 2R under substitution). Required
            when ``noise_std`` > 0: noise without a bound on the rows protects nothing. ``float("inf")`` is the
            explicit choice of no clipping: it warns (UserWarning) that no guarantee holds. May stay None with
            ``noise_std=0`` (the non-private distance).
        release: ``"points"`` (default: every projected private value with noise σ, the paper's release) or
            ``"sketch"``: the private side is released as the sliced quantile sketch
            (:func:`fastdpot.privacy.sliced_quantile_sketch`: per direction the sorted projections summed over L rank
            bins, N(0, σ²) on each bin SUM — the same sensitivity, hence the same (ε, δ) for the same σ, with noise
            σ/m_l on bin l's mean), fitted monotone (:func:`fastdpot.privacy.sketch.sketch_quantile_table`) into a
            quantile function Q_j. The generated side's sorted projections are binned by the same rule for its own
            size N (no noise: the target is the unsmoothed law) and the loss is
            ``(1/k) Σ_j Σ_l (m'_l/N)·|ȳ_jl − Q_j(u'_l)|^p`` with ȳ_jl the generated bin means at their levels u'_l
            (:func:`fastdpot.reference.sliced.sketch_sliced_wasserstein`). The noise of the bin sums is the keyed
            privacy-grade normal ``j·L + l`` of the release's secret key (:func:`fastdpot.ops.sliced_wasserstein.sketch_noise`);
            fused in the cpu and triton kernels; differentiable w.r.t. ``generated`` only.
        sketch_bins: L, 1 <= L <= min(M, N), required with ``release="sketch"``.
        directions: ``"uniform"`` (default: k i.i.d. directions on the sphere, the paper's) or ``"orthogonal"``
            (⌈k/d⌉ blocks of orthonormal directions, :func:`fastdpot._random.random_projections`: the projection's
            sensitivity is deterministic, :func:`fastdpot.privacy.orthogonal_sliced_sensitivity`).

    Shape:
        generated (N, d), private (M, d), projections (k, d) -> 0-d tensor
        [, noise_private (M, k), noise_generated (N, k)].

    Returns:
        DP-SW_p^p, differentiable w.r.t. ``generated`` and (points release, when it requires grad) ``private``; with
        ``return_noise`` a tuple (loss, noise_private, noise_generated) — in sketch mode (loss, noise on the bin
        sums (k, L) float64, None).

    Raises:
        TypeError: more than one positional argument (the former ``(x_private, y, noise_std, ...)`` order), or
            ``private`` / ``noise_std`` missing.
        ValueError: as :func:`sliced_wasserstein` (messages name ``private`` and ``generated``), plus ``noise_std``
            < 0 or non-finite, ``clip_radius`` <= 0 or NaN, ``clip_radius`` None with ``noise_std`` > 0,
            ``private`` and ``generated`` the same tensor, a ``torch.Generator``
            with ``secure_mode=True``, ``release`` or ``directions`` not one of the two, ``sketch_bins`` missing
            with ``"sketch"``, given with ``"points"``, < 1 or above the batch sizes, given ``projections`` that are
            not orthonormal blocks with ``"orthogonal"``.

    Under ``torch.compile`` (secure mode): the custom ops ``clip_rows``, ``privacy_draws`` (fresh secret directions
    and key when the graph runs, never while it is traced) and ``sliced_wasserstein`` of ``torch.ops.fastdpot``;
    ``return_noise``, a replayable generator and the reference backend run eagerly at a graph break
    (:mod:`fastdpot.sliced._compiled`).

    References:
        Rakotomamonjy & Ralaivola, "Differentially private sliced Wasserstein distance", ICML 2021 (mechanism
        M(X) = XΘᵀ + V, Lemma 2 and Proposition 2).
    """
    compiling = torch.compiler.is_compiling()
    x_private, y = _private_generated("dp_sliced_wasserstein", generated, legacy, private, finite=not compiling)
    if noise_std is None:
        raise TypeError("dp_sliced_wasserstein() needs noise_std= (σ >= 0, keyword-only)")
    noise_std = check_nonnegative(noise_std, "noise_std")
    check_release(release, sketch_bins)
    check_choice(directions, "directions", DIRECTIONS)
    clip_radius = check_clip_radius(clip_radius, noise_std, "dp_sliced_wasserstein")
    from ..privacy.randomness import PrivacyRandomness, privacy_randomness

    rng = generator if isinstance(generator, PrivacyRandomness) else privacy_randomness(secure_mode, generator)
    if compiling:  # the custom ops in the graph, the secret draws when it runs, or eager at a graph break
        fused = _compiled.supported(x_private, y, backend, projections=projections,
                                    eager_only=return_noise or not rng.secure_mode)
        if not fused:
            return _eager(dp_sliced_wasserstein)(
                generated, private=private, noise_std=noise_std, num_projections=num_projections, p=p,
                projections=projections, generator=generator, backend=backend, return_noise=return_noise,
                clip_radius=clip_radius, secure_mode=secure_mode, release=release, sketch_bins=sketch_bins,
                directions=directions)
        return _compiled.compiled_dp_sliced_wasserstein(
            x_private, y, noise_std=noise_std, clip_radius=clip_radius, num_projections=num_projections, p=p,
            projections=projections, fused=fused, sketch_bins=sketch_bins if release == "sketch" else None,
            orthogonal=directions == "orthogonal")
    if clip_radius is not None and not math.isinf(clip_radius):
        from ..privacy import clip_rows

        x_private = clip_rows(x_private, clip_radius)
    # the noise key is drawn from rng after the directions (seed=None)
    return _op.sliced_wasserstein_op(x_private, y, projections, p, noise_std, None, return_noise, backend,
                                     num_projections=num_projections, generator=rng, names=("private", "generated"),
                                     orthogonal=directions == "orthogonal",
                                     sketch_bins=sketch_bins if release == "sketch" else None)


_EAGER = {}


def _eager(fn):
    """``torch.compiler.disable(fn)``: what a compiled function runs eagerly, at a graph break (generators, weights,
    log, the reference backend: :mod:`fastdpot.sliced._compiled`). Made on first use, under ``torch.compile``, where
    Dynamo is imported already (importing it for ``import fastdpot`` would cost 1.7 s)."""
    wrapped = _EAGER.get(fn.__qualname__)
    if wrapped is None:
        wrapped = _EAGER[fn.__qualname__] = torch.compiler.disable(fn)
    return wrapped


def _private_generated(fname, generated, legacy, private, finite: bool = True):
    """Check the (generated, private=) call form of a private entry point; return ``(private, generated)``.

    The call form: the private rows must come by keyword, never by position (a positional order can be swapped
    without anyone noticing). Both sides are checked as (rows, d) tensors under their names; the private rows'
    finiteness here, before any clipping renames them (``finite=False``: under ``torch.compile``, where the
    custom ops check it when the graph runs).
    """
    if legacy:
        raise TypeError(
            f"{fname}() takes the private rows by keyword only: write {fname}(generated, private=x_private, "
            f"noise_std=sigma, ...) (the former positional order (x_private, y, noise_std, ...) and PyTorch's "
            f"(input, target) order are both refused, so private data cannot land in the unprotected slot); got "
            f"{1 + len(legacy)} positional arguments")
    if private is None:
        raise TypeError(f"{fname}() needs the private rows as private= (keyword-only); the positional argument is "
                        f"the generated / public side")
    check_tensor(generated, "generated", ndim=2, dtypes=_DTYPES, finite=False)
    check_tensor(private, "private", ndim=2, dtypes=_DTYPES, finite=finite)
    if private is generated:
        raise ValueError("private and generated are the same tensor; pass the private rows as private= and the "
                         "generated rows as the positional argument")
    return private, generated


def check_clip_radius(clip_radius, noise_std: float, what: str, stacklevel: int = 3) -> Optional[float]:
    """The clipping bound of a private loss with noise ``noise_std`` (σ >= 0, checked): returns R as a float (inf
    kept: no clipping), or None when none was given and σ = 0 (the non-private distance needs none).

    Raises:
        ValueError: ``clip_radius`` None with σ > 0 (noise without a bound on the rows protects nothing), or not a
            number > 0.

    Warns:
        UserWarning: ``clip_radius=inf`` (the rows are not clipped: no differential-privacy guarantee holds).
    """
    if clip_radius is None:
        if noise_std > 0:
            raise ValueError(
                f"{what}: noise_std={noise_std!r} > 0 needs clip_radius=R, the ℓ2 bound the private rows are "
                f"clipped to (noise without a bound on the rows protects nothing; calibrate σ for R with "
                f"dp_sliced_wasserstein_noise_std). clip_radius=float('inf') releases unclipped rows, without any "
                f"guarantee")
        return None
    radius = check_positive(clip_radius, "clip_radius", allow_inf=True)
    if math.isinf(radius):
        warnings.warn(f"{what}: clip_radius=inf does not clip the private rows, so no differential-privacy "
                      f"guarantee holds for this release (its sensitivity is unbounded)", UserWarning,
                      stacklevel=stacklevel)
    return radius


def check_release(release, sketch_bins):
    """``release`` one of :data:`RELEASES`; ``sketch_bins`` an integer >= 1 with ``"sketch"``, None with ``"points"``."""
    check_choice(release, "release", RELEASES)
    if release == "sketch":
        if sketch_bins is None:
            raise ValueError("sketch_bins (L, the sketch's bins per direction) is required for release='sketch'")
        check_int(sketch_bins, "sketch_bins", 1)
    elif sketch_bins is not None:
        raise ValueError(f"sketch_bins is only used with release='sketch', got sketch_bins={sketch_bins!r}")
