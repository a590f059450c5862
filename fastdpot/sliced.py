"""(DP) sliced Wasserstein losses — Rakotomamonjy & Ralaivola, ICML 2021.

Public API: :func:`sliced_wasserstein`, :func:`dp_sliced_wasserstein`, :class:`SlicedWassersteinLoss`,
:class:`DPSlicedWassersteinLoss`, :func:`dp_sliced_wasserstein_noise_std`.

The losses add their conventions (POT's argument aliases, the privacy randomness, clipping, the sketch release,
the calibration, the modules) to op ``"sliced_wasserstein"``, whose entry point, checks and backends (reference,
cpu, triton) live in :mod:`fastdpot.ops.sliced_wasserstein`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from . import _dispatch
from ._validate import (check_choice, check_delta, check_generator, check_int, check_nonnegative, check_positive,
                        check_tensor, resolve_alias)
from .ops import sliced_wasserstein as _op
# kept importable from here (kernels/, tests, users): the op's direction sampler and autograd Functions
from ._random import random_projections
from .ops.sliced_wasserstein import _DTYPES

__all__ = ["sliced_wasserstein", "dp_sliced_wasserstein", "SlicedWassersteinLoss", "DPSlicedWassersteinLoss",
           "dp_sliced_wasserstein_noise_std", "random_projections"]


# ------------------------------------------------------------------------------------------------------------
# public functions
# ------------------------------------------------------------------------------------------------------------
def sliced_wasserstein(x: torch.Tensor, y: torch.Tensor, num_projections: Optional[int] = None, p: int = 2,
                       projections: Optional[torch.Tensor] = None, generator: Optional[torch.Generator] = None,
                       backend: str = "auto", *, n_projections: Optional[int] = None,
                       seed: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""Monte-Carlo sliced Wasserstein distance SW_p^p between two point clouds (no privacy).

    .. math::
        \mathrm{SW}_p^p(\mu, \nu) \approx \frac1k \sum_{j=1}^k W_p^p(\theta_j{}_\#\mu, \theta_j{}_\#\nu)

    with 1-D W_p^p computed by sorting (N ≠ M: the merged quantile levels {i/N} ∪ {j/M}).

    Args:
        x: (N, d) float32 / float64.
        y: (M, d), same dtype and device as x.
        num_projections: k, the number of random directions (drawn from ``generator``) when ``projections`` is
            None.
        p: 1 or 2.
        projections: optional (k, d) directions with unit-norm rows.
        generator: torch.Generator for the directions (global generator when None).
        backend: "auto" (cpu kernel for CPU tensors when built, cuda / triton for CUDA tensors, else reference),
            "reference", "cpu", "triton", "cuda" (the Triton kernels with CUB sorts, ``fastdpot._C_cuda_flow``).
        n_projections, seed: POT's names (``ot.sliced_wasserstein_distance``), aliases of ``num_projections`` and
            ``generator``; ``seed`` may be an integer (a generator seeded with it) or a ``torch.Generator``.
            Giving a name and its alias together is an error.

    Shape:
        x (N, d), y (M, d), projections (k, d) -> 0-d tensor.

    Returns:
        SW_p^p (p-th power, not the p-th root), differentiable w.r.t. x and y.

    Raises:
        ValueError: bad shapes / dtypes / non-finite or empty input, a tensor on an unsupported device (meta),
            p not in {1, 2}, projections not (k, d) with unit rows (tolerance
            :func:`fastdpot._validate.unit_norm_tolerance`: rows normalised in float32 pass in float64), neither
            ``num_projections`` nor ``projections`` given, a name given together with its alias, values whose
            distances overflow the dtype (the loss would be inf).
        TypeError: ``generator`` neither None nor a ``torch.Generator``.
        BackendUnavailableError: an explicitly requested backend is not available.

    References:
        Bonneel et al., "Sliced and Radon Wasserstein barycenters", JMIV 2015; POT ``ot.sliced_wasserstein_distance``
        (which returns the p-th root).
    """
    num_projections = resolve_alias(num_projections, n_projections, "num_projections", "n_projections")
    generator = resolve_alias(generator, _seed_generator(seed), "generator", "seed")
    check_generator(generator, allow_privacy=False)
    return _op.sliced_wasserstein_op(x, y, projections, p, backend=backend, num_projections=num_projections,
                                  generator=generator)


def _seed_generator(seed):
    """POT's ``seed`` alias: an integer becomes a CPU generator seeded with it; a generator passes through."""
    if seed is None or isinstance(seed, torch.Generator):
        return seed
    from ._validate import check_seed

    g = torch.Generator()
    g.manual_seed(check_seed(seed, "seed"))
    return g


def dp_sliced_wasserstein(generated: torch.Tensor, *legacy, private: Optional[torch.Tensor] = None,
                          noise_std: Optional[float] = None, num_projections: Optional[int] = None, p: int = 2,
                          projections: Optional[torch.Tensor] = None, generator: Optional[torch.Generator] = None,
                          backend: str = "auto", return_noise: bool = False, clip_radius: Optional[float] = None,
                          secure_mode: bool = True, release: str = "points", sketch_bins: Optional[int] = None):
    r"""DP sliced Wasserstein distance DP-SW_p^p (Rakotomamonjy & Ralaivola, ICML 2021): Gaussian mechanism on the projected private data.

    .. math::
        \mathrm{DP\text{-}SW}_p^p = \frac1k\sum_j W_p^p\Big(\frac1M\sum_i\delta_{\theta_j^\top x_i + v_{ij}},
        \frac1N\sum_i\delta_{\theta_j^\top y_i + v'_{ij}}\Big),\quad v, v' \sim \mathcal N(0, \sigma^2)\ \text{i.i.d.}

    The same directions Θ for both sides, independent noise on each side. The release that carries the privacy
    guarantee is ``private Θᵀ + V``; everything computed from it (the loss, the gradient w.r.t. ``generated``) is
    post-processing. The guarantee itself — which (ε, δ) a given ``noise_std`` buys — needs a norm bound on the
    private rows (pass ``clip_radius``: rows are clipped to it *inside*, before projection), the sensitivity of the
    random projection and an accountant over all releases: see :func:`dp_sliced_wasserstein_noise_std` and
    :class:`DPSlicedWassersteinLoss`. This function alone releases once and accounts nothing.

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
        num_projections: k (random directions from ``generator``) when ``projections`` is None.
        p: 1 or 2.
        projections: optional (k, d) unit-norm directions.
        generator: with ``secure_mode=False``, the torch.Generator of the directions and the noise seed
            (replayable; no guarantee against anyone who holds its seed). Also accepts a
            :class:`fastdpot.privacy.randomness.PrivacyRandomness`.
        secure_mode: True (default): directions and the noise key come from the operating system (secret, not
            replayable; a ``torch.Generator`` then raises ValueError).
        backend: "auto", "reference", "cpu", "triton", "cuda".
        return_noise: also return the exact noise added, (M, k) and (N, k), so the reference can replay the run.
        clip_radius: if given, rows of ``private`` with norm > radius are scaled onto the ball of that radius before
            projection (the mechanism's norm bound; ‖x − x'‖ ≤ 2·radius under substitution).
        release: ``"points"`` (default: every projected private value with noise σ, the paper's release) or
            ``"sketch"``: the private side is released as the sliced quantile sketch
            (:func:`fastdpot.privacy.sliced_quantile_sketch`: per direction the sorted projections summed over L rank
            bins, N(0, σ²) on each bin SUM — the same sensitivity, hence the same (ε, δ) for the same σ, with noise
            σ/m_l on bin l's mean), fitted monotone (:func:`fastdpot.privacy.sketch.sketch_quantile_table`) into a
            quantile function Q_j. The generated side's sorted projections are binned by the same rule for its own
            size N (no noise: the target is the unsmoothed law) and the loss is
            ``(1/k) Σ_j Σ_l (m'_l/N)·|ȳ_jl − Q_j(u'_l)|^p`` with ȳ_jl the generated bin means at their levels u'_l.
            Computed in torch (backend "auto" or "reference"); differentiable w.r.t. ``y`` only.
        sketch_bins: L, 1 <= L <= min(M, N), required with ``release="sketch"``.

    Shape:
        generated (N, d), private (M, d), projections (k, d) -> 0-d tensor
        [, noise_private (M, k), noise_generated (N, k)].

    Returns:
        DP-SW_p^p, differentiable w.r.t. ``generated`` and (when it requires grad) ``private``; with
        ``return_noise`` a tuple (loss, noise_private, noise_generated) — in sketch mode (loss, noise on the bin
        sums (k, L), None).

    Raises:
        TypeError: more than one positional argument (the former ``(x_private, y, noise_std, ...)`` order), or
            ``private`` / ``noise_std`` missing.
        ValueError: as :func:`sliced_wasserstein` (messages name ``private`` and ``generated``), plus ``noise_std``
        < 0 or non-finite, ``clip_radius`` <= 0, ``private`` and ``generated`` the same tensor, a ``torch.Generator``
        with ``secure_mode=True``, ``release`` not one of the two, ``sketch_bins`` missing with ``"sketch"``, given
        with ``"points"``, < 1 or above the batch sizes, a compiled backend with ``"sketch"``.

    References:
        Rakotomamonjy & Ralaivola, "Differentially private sliced Wasserstein distance", ICML 2021 (mechanism
        M(X) = XΘᵀ + V, Lemma 2 and Proposition 2).
    """
    x_private, y = _private_generated("dp_sliced_wasserstein", generated, legacy, private)
    if noise_std is None:
        raise TypeError("dp_sliced_wasserstein() needs noise_std= (σ >= 0, keyword-only)")
    noise_std = check_nonnegative(noise_std, "noise_std")
    _check_release(release, sketch_bins)
    if clip_radius is not None:
        clip_radius = check_positive(clip_radius, "clip_radius")
        from .privacy import clip_rows

        x_private = clip_rows(x_private, clip_radius)
    from .privacy.randomness import PrivacyRandomness, privacy_randomness

    rng = generator if isinstance(generator, PrivacyRandomness) else privacy_randomness(secure_mode, generator)
    names = ("private", "generated")
    if release == "sketch":
        theta = _op.check_inputs(x_private, y, p, num_projections, projections, rng, names)
        if backend not in ("auto", "reference"):
            raise ValueError(f"release='sketch' is computed in torch: backend must be 'auto' or 'reference', got "
                             f"{backend!r}")
        return _sketch_loss(x_private, y, theta, p, noise_std, sketch_bins, rng, bool(return_noise))
    # the noise key is drawn from rng after the directions (seed=None)
    return _op.sliced_wasserstein_op(x_private, y, projections, p, noise_std, None, return_noise, backend,
                                  num_projections=num_projections, generator=rng, names=names)


_RELEASES = ("points", "sketch")


def _private_generated(fname, generated, legacy, private):
    """Check the (generated, private=) call form of a private entry point; return ``(private, generated)``.

    Both sides are validated as (rows, d) tensors by the caller; here only the call form: the private rows must
    come by keyword, never by position (a positional order can be swapped without anyone noticing).
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
    # types and shapes here; finiteness once, by the op's check_inputs (on the clipped private rows)
    check_tensor(generated, "generated", ndim=2, dtypes=_DTYPES, finite=False)
    check_tensor(private, "private", ndim=2, dtypes=_DTYPES, finite=False)
    if private is generated:
        raise ValueError("private and generated are the same tensor; pass the private rows as private= and the "
                         "generated rows as the positional argument")
    return private, generated


def _check_release(release, sketch_bins):
    check_choice(release, "release", _RELEASES)
    if release == "sketch":
        if sketch_bins is None:
            raise ValueError("sketch_bins (L, the sketch's bins per direction) is required for release='sketch'")
        check_int(sketch_bins, "sketch_bins", 1)
    elif sketch_bins is not None:
        raise ValueError(f"sketch_bins is only used with release='sketch', got sketch_bins={sketch_bins!r}")


def _sketch_loss(x_private, y, theta, p, noise_std, sketch_bins, rng, return_noise):
    """DP-SW_p^p with the private side released as a sliced quantile sketch (see :func:`dp_sliced_wasserstein`)."""
    from .privacy.sketch import (bin_index, bin_levels, bin_sizes, quantile_table_eval, sketch_quantile_table,
                                 sliced_quantile_sketch)

    m, n = x_private.shape[0], y.shape[0]
    if sketch_bins > min(m, n):
        raise ValueError(f"sketch_bins must be at most both batch sizes (private: {m}, generated: {n}), got {sketch_bins}")
    x = x_private.detach().to(torch.float64)
    # the rows were clipped by the caller's radius (or are used as given): clip at a radius no row exceeds
    r = float(torch.linalg.vector_norm(x, dim=1).max()) * (1.0 + 1e-12) + 1e-300
    sk = sliced_quantile_sketch(x, theta.detach(), sketch_bins, noise_std, clip_radius=r, generator=rng,
                                return_noise=return_noise)
    table, levels = sketch_quantile_table(sk)
    th = theta.to(y.dtype)
    yp = torch.sort(y @ th.transpose(0, 1), dim=0).values  # (N, k), differentiable w.r.t. y
    sizes = bin_sizes(n, sketch_bins).to(y.device)
    sums = torch.zeros(sketch_bins, th.shape[0], dtype=y.dtype, device=y.device).index_add(
        0, bin_index(sizes).to(y.device), yp)
    gen_means = (sums / sizes.to(y.dtype).unsqueeze(1)).transpose(0, 1)  # (k, L)
    target = quantile_table_eval(table.to(y.device), levels.to(y.device), bin_levels(sizes).to(y.device))
    w = sizes.to(y.dtype) / n
    loss = ((gen_means - target.to(y.dtype)).abs() ** p * w).sum(1).mean()
    return (loss, sk.noise, None) if return_noise else loss


def dp_sliced_wasserstein_noise_std(epsilon: Optional[float] = None, delta: Optional[float] = None,
                                    batch_size: Optional[int] = None, dataset_size: Optional[int] = None,
                                    steps: Optional[int] = None, num_projections: Optional[int] = None,
                                    dim: Optional[int] = None, clip_radius: Optional[float] = None,
                                    bound: str = "chernoff", accountant: str = "rdp", *,
                                    target_epsilon: Optional[float] = None, target_delta: Optional[float] = None,
                                    epochs: Optional[float] = None) -> Tuple[float, dict]:
    r"""σ for DP-SWD training: ``steps`` releases of a fresh batch of B of n private rows, (ε, δ)-DP overall.

    Goes through the privacy core (:mod:`fastdpot.privacy`):

    1. ``split_delta(delta, steps)`` -> δ_acc for the accountant and δ_tail per release for the sensitivity bound
       over the random directions (union bound over the ``steps`` draws of Θ: δ = δ_acc + steps·δ_tail);
    2. Δ = ``sliced_sensitivity(k, d, δ_tail, bound, diameter=2·radius)`` — rows clipped to ``clip_radius`` differ by at
       most 2·radius under substitution, Rakotomamonjy & Ralaivola, ICML 2021 (Lemma 2 / CLT variant);
    3. z = ``calibrate_noise_multiplier(ε, δ_acc, B/n, steps, sampling="without_replacement")`` — fixed-size
       batches drawn uniformly without replacement, fresh every step, substitution neighbours, RDP;
    4. σ = z·Δ.

    Args:
        epsilon, delta: the target (ε, δ) of the whole training run.
        batch_size: B, private rows per release (must be what the sampler draws).
        dataset_size: n.
        steps: T, the number of releases (training steps).
        num_projections: k.
        dim: d.
        clip_radius: the ℓ2 norm bound the private rows are clipped to.
        bound: "chernoff" (default, proven), "bernstein" (proven, looser), "clt" (k > 30, the authors' normal
            approximation: not a guarantee, see :func:`fastdpot.privacy.sliced_sensitivity`) — any bound
            :func:`fastdpot.privacy.sliced_sensitivity` offers.
        accountant: passed to ``calibrate_noise_multiplier``.
        target_epsilon, target_delta: Opacus' names (``make_private_with_epsilon``), aliases of ``epsilon`` and
            ``delta``: the (ε, δ) the whole run is calibrated to.
        epochs: Opacus' alternative to ``steps``: T = ceil(epochs·n/B) releases.

    Every argument but ``bound`` and ``accountant`` is required (under its name or its alias); each has a default
    of None only so that the aliases can replace it. Error messages name the argument as the caller passed it.

    Returns:
        (noise_std, details) with details = dict(noise_multiplier, sensitivity, delta_accountant, delta_tail,
        sample_rate, steps, ...). σ is a standard deviation on projected values.

    Raises:
        ValueError: invalid ε, δ, sizes (batch_size > dataset_size), clip_radius <= 0, unknown bound, bound="clt" with
            k <= 30; a required argument missing; a name given together with its alias (or ``steps`` with
            ``epochs``); an unreachable target (the message says why).

    References:
        Rakotomamonjy & Ralaivola, ICML 2021, Lemma 2 and Proposition 2.
    """
    from . import privacy
    from ._validate import check_delta, check_epsilon

    eps_name = "target_epsilon" if target_epsilon is not None else "epsilon"
    epsilon = resolve_alias(epsilon, target_epsilon, "epsilon", "target_epsilon")
    delta_name = "target_delta" if target_delta is not None else "delta"
    delta = resolve_alias(delta, target_delta, "delta", "target_delta")
    if steps is not None and epochs is not None:
        raise ValueError(f"give steps or epochs, not both (got steps={steps!r}, epochs={epochs!r})")
    required = dict(epsilon=epsilon, delta=delta, batch_size=batch_size, dataset_size=dataset_size,
                    steps=steps if epochs is None else epochs, num_projections=num_projections, dim=dim,
                    clip_radius=clip_radius)
    missing = [k for k, v in required.items() if v is None]
    if missing:
        raise ValueError(f"dp_sliced_wasserstein_noise_std needs {missing} (epsilon/delta may be passed as "
                         f"target_epsilon/target_delta, steps as epochs)")
    epsilon = check_epsilon(epsilon, eps_name)
    delta = check_delta(delta, delta_name)
    B = check_int(batch_size, "batch_size")
    n = check_int(dataset_size, "dataset_size")
    if B > n:
        raise ValueError(f"batch_size must be <= dataset_size, got batch_size={B} and dataset_size={n}")
    if epochs is not None:
        import math

        steps = max(1, math.ceil(check_positive(epochs, "epochs") * n / B))
    T = check_int(steps, "steps")
    k = check_int(num_projections, "num_projections")
    d = check_int(dim, "dim")
    clip_radius = check_positive(clip_radius, "clip_radius")
    # `bound` is validated by the privacy core (it owns the list of bounds: clt, bernstein, ...)
    delta_acc, delta_tail = privacy.split_delta(delta, T)
    sens = privacy.sliced_sensitivity(k, d, delta_tail, bound=bound, diameter=2.0 * clip_radius)
    q = B / n
    try:
        z = privacy.calibrate_noise_multiplier(epsilon, delta_acc, q, T, sampling="without_replacement",
                                               accountant=accountant, dataset_size=n, batch_size=B)
    except ValueError as err:  # name the target as the caller passed it
        raise ValueError(str(err).replace("target_epsilon=", f"{eps_name}=")) from None
    sigma = float(z) * float(sens)
    details = dict(noise_multiplier=float(z), sensitivity=float(sens), delta_accountant=float(delta_acc),
                   delta_tail=float(delta_tail), sample_rate=q, steps=T, batch_size=B, dataset_size=n,
                   num_projections=k, dim=d, clip_radius=clip_radius, bound=bound, epsilon=float(epsilon),
                   delta=float(delta), accountant=accountant)
    return sigma, details


# ------------------------------------------------------------------------------------------------------------
# modules
# ------------------------------------------------------------------------------------------------------------
class SlicedWassersteinLoss(nn.Module):
    """``nn.Module`` form of :func:`sliced_wasserstein`: fresh random directions at every call.

    ``n_projections`` and ``seed`` (an integer or a generator) are POT's names, aliases of ``num_projections`` and
    ``generator``; giving both names of one argument is a ValueError.

    Shape: x (N, d), y (M, d) -> 0-d tensor (SW_p^p).
    """

    def __init__(self, num_projections: Optional[int] = None, p: int = 2,
                 generator: Optional[torch.Generator] = None, backend: str = "auto", *,
                 n_projections: Optional[int] = None, seed=None):
        super().__init__()
        num_projections = resolve_alias(num_projections, n_projections, "num_projections", "n_projections")
        if num_projections is None:
            raise ValueError("num_projections (alias n_projections) is required")
        self.num_projections = check_int(num_projections, "num_projections")
        self.p = check_choice(p, "p", (1, 2))
        self.generator = check_generator(resolve_alias(generator, _seed_generator(seed), "generator", "seed"),
                                         allow_privacy=False)
        self.backend = check_choice(backend, "backend", ("auto",) + _dispatch.BACKENDS)

    def forward(self, x, y):
        """SW_p^p between ``x`` (N, d) and ``y`` (M, d) with k fresh random directions; see
        :func:`sliced_wasserstein` (arguments, Raises). Returns a 0-d tensor differentiable w.r.t. x and y."""
        return sliced_wasserstein(x, y, self.num_projections, p=self.p, generator=self.generator,
                                  backend=self.backend)

    def extra_repr(self):
        return f"num_projections={self.num_projections}, p={self.p}, backend={self.backend!r}"


class DPSlicedWassersteinLoss(nn.Module):
    """``nn.Module`` form of :func:`dp_sliced_wasserstein`: fresh directions and fresh noise at every call.

    Built directly (``noise_std``, optional ``clip_radius``) it accounts nothing. Built with :meth:`from_privacy` it
    holds the calibration: it clips private rows to ``clip_radius`` inside, checks that every batch has the size the
    accountant assumed, counts releases and refuses the release number ``steps + 1`` (the guarantee covers
    ``steps`` releases; the caller must still sample batches uniformly without replacement, fresh each step —
    :class:`fastdpot.privacy.FixedSizeSampler`).

    Randomness: ``secure_mode=True`` (default) draws directions and noise keys from the operating system (secret, not
    replayable; a ``generator`` then raises ValueError); ``secure_mode=False`` replays them from ``generator`` (no
    guarantee against anyone who holds its seed).

    ``release="sketch"`` with ``sketch_bins=L`` releases the private side as a sliced quantile sketch (see
    :func:`dp_sliced_wasserstein`): same σ, same sensitivity and accounting, L noisy bin means per direction.

    Call: ``loss(generated, private=x_private)`` — the private rows keyword-only (see :meth:`forward`).
    :meth:`epsilon` / :meth:`get_epsilon` report the ε spent by the releases so far (``from_privacy`` modules).

    Shape: generated (N, d), private (M, d) -> 0-d tensor (DP-SW_p^p).
    """

    def __init__(self, noise_std: float, num_projections: int, p: int = 2, clip_radius: Optional[float] = None,
                 generator: Optional[torch.Generator] = None, backend: str = "auto", *, secure_mode: bool = True,
                 release: str = "points", sketch_bins: Optional[int] = None):
        super().__init__()
        _check_release(release, sketch_bins)
        self.release, self.sketch_bins = release, sketch_bins
        from .privacy.randomness import PrivacyRandomness, privacy_randomness

        self._rng = (generator if isinstance(generator, PrivacyRandomness)
                     else privacy_randomness(secure_mode, generator))
        self.secure_mode = self._rng.secure_mode
        self.noise_std = check_nonnegative(noise_std, "noise_std")
        self.num_projections = check_int(num_projections, "num_projections")
        self.p = check_choice(p, "p", (1, 2))
        self.clip_radius = None if clip_radius is None else check_positive(clip_radius, "clip_radius")
        self.generator = generator
        self.backend = backend
        self.privacy = None
        self.releases = 0

    @classmethod
    def from_privacy(cls, epsilon: Optional[float] = None, delta: Optional[float] = None,
                     batch_size: Optional[int] = None, dataset_size: Optional[int] = None,
                     steps: Optional[int] = None, num_projections: Optional[int] = None, dim: Optional[int] = None,
                     clip_radius: Optional[float] = None, bound: str = "chernoff", p: int = 2,
                     generator: Optional[torch.Generator] = None, backend: str = "auto", *,
                     secure_mode: bool = True, release: str = "points", sketch_bins: Optional[int] = None,
                     target_epsilon: Optional[float] = None, target_delta: Optional[float] = None,
                     epochs: Optional[float] = None):
        """Module whose ``noise_std`` makes ``steps`` releases (ε, δ)-DP.

        See :func:`dp_sliced_wasserstein_noise_std` for the arguments and the calibration (Opacus' names
        ``target_epsilon``, ``target_delta`` and ``epochs`` are accepted there and here as aliases).
        """
        sigma, details = dp_sliced_wasserstein_noise_std(epsilon, delta, batch_size, dataset_size, steps,
                                                         num_projections, dim, clip_radius, bound=bound,
                                                         target_epsilon=target_epsilon, target_delta=target_delta,
                                                         epochs=epochs)
        mod = cls(sigma, num_projections, p=p, clip_radius=clip_radius, generator=generator, backend=backend,
                  secure_mode=secure_mode, release=release, sketch_bins=sketch_bins)
        mod.privacy = details
        return mod

    def forward(self, generated: torch.Tensor, *legacy, private: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One release: DP-SW_p^p between ``generated`` and the private rows (clipped to ``clip_radius`` inside).

        Called as ``loss(generated, private=x_private)``: the private rows are keyword-only, so neither the former
        ``loss(x_private, y)`` order nor PyTorch's ``loss(input, target)`` order can put them in the unprotected
        slot (both raise TypeError).

        Args:
            generated: (N, d) generated rows (float32 / float64), the side the gradient is for.
            private: (M, d) private rows, keyword-only; with :meth:`from_privacy` M must be the calibrated
                ``batch_size`` and d the calibrated ``dim``.

        Returns:
            0-d tensor DP-SW_p^p, differentiable w.r.t. ``generated``.

        Raises:
            TypeError: the private rows passed by position, or ``private`` missing.
            ValueError: bad tensors (see :func:`dp_sliced_wasserstein`), a batch of another size or dimension than
                calibrated (nothing is released or counted).
            fastdpot.privacy.BudgetExceededError: all ``steps`` calibrated releases are used (nothing is
                released).
        """
        x_private, y = _private_generated(f"{type(self).__name__}.forward", generated, legacy, private)
        if self.privacy is not None:
            if x_private.shape[0] != self.privacy["batch_size"]:
                raise ValueError(f"private must hold batch_size={self.privacy['batch_size']} rows (the accountant's "
                                 f"assumption), got {x_private.shape[0]}")
            if x_private.shape[1] != self.privacy["dim"]:
                raise ValueError(f"private must have dim={self.privacy['dim']} columns, got {x_private.shape[1]}")
            if self.releases >= self.privacy["steps"]:
                from .privacy import BudgetExceededError

                raise BudgetExceededError(f"privacy budget exhausted: noise_std was calibrated for steps="
                                          f"{self.privacy['steps']} releases, all of them used; nothing was released")
        out = dp_sliced_wasserstein(y, private=x_private, noise_std=self.noise_std,
                                    num_projections=self.num_projections, p=self.p, generator=self._rng,
                                    backend=self.backend, clip_radius=self.clip_radius, release=self.release,
                                    sketch_bins=self.sketch_bins)
        self.releases += 1
        return out

    def epsilon(self, delta: Optional[float] = None) -> float:
        """ε spent by the releases made so far (Opacus' ``accountant.get_epsilon(delta)``).

        The :attr:`releases` so far are composed as sampled-without-replacement Gaussian releases (noise multiplier
        z, B of n rows each, as calibrated by :meth:`from_privacy`) in an RDP accountant, asked at
        δ_acc = ``delta − releases·δ_tail``: the sensitivity over the random directions fails with probability
        δ_tail per release (union bound; Rakotomamonjy & Ralaivola, "Differentially private sliced Wasserstein
        distance", ICML 2021). After all ``steps`` releases at the calibrated δ this is at most the target ε.

        Args:
            delta: total δ in (0, 1) (default: the δ given to :meth:`from_privacy`).

        Returns:
            ε >= 0 (0.0 before the first release).

        Raises:
            RuntimeError: the module was built directly from a ``noise_std`` (no calibration: nothing to account).
            ValueError: ``delta`` not in (0, 1), or ``delta <= releases·δ_tail``.
        """
        from . import privacy

        if self.privacy is None:
            raise RuntimeError("this DPSlicedWassersteinLoss was built from a noise_std, not by from_privacy(): it "
                               "has no sensitivity or sampling to account; use from_privacy(epsilon, delta, ...)")
        det = self.privacy
        delta = det["delta"] if delta is None else check_delta(delta)
        rest = delta - self.releases * det["delta_tail"]
        if not rest > 0:
            raise ValueError(f"delta must exceed releases·delta_tail = {self.releases * det['delta_tail']!r}, got "
                             f"{delta!r}")
        if self.releases == 0:
            return 0.0
        acc = privacy.PrivacyAccountant(accountant=det["accountant"])
        acc.step(det["noise_multiplier"], det["sample_rate"], num_steps=self.releases, sampling="without_replacement",
                 dataset_size=det["dataset_size"], batch_size=det["batch_size"])
        return float(acc.get_epsilon(rest))

    def get_epsilon(self, delta: Optional[float] = None) -> float:
        """Alias of :meth:`epsilon` (the name Opacus' accountants use)."""
        return self.epsilon(delta)

    def extra_repr(self):
        return (f"noise_std={self.noise_std:.4g}, num_projections={self.num_projections}, p={self.p}, "
                f"clip_radius={self.clip_radius}, backend={self.backend!r}, release={self.release!r}"
                + (f", sketch_bins={self.sketch_bins}" if self.sketch_bins is not None else ""))
