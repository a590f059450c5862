"""The module forms of the sliced Wasserstein losses and the calibration of the DP one:
:class:`SlicedWassersteinLoss`, :class:`DPSlicedWassersteinLoss` (its release counter and calibration in its
``state_dict``), :func:`dp_sliced_wasserstein_noise_std`.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from .. import _dispatch
from .._validate import (check_choice, check_delta, check_generator, check_int, check_nonnegative,
                         check_num_projections, check_positive, resolve_alias)
from .functional import (DEFAULT_NUM_PROJECTIONS, DIRECTIONS, _eager, _private_generated, _seed_generator,
                         check_clip_radius, check_release, dp_sliced_wasserstein, sliced_wasserstein)

__all__ = ["SlicedWassersteinLoss", "DPSlicedWassersteinLoss", "dp_sliced_wasserstein_noise_std"]


def dp_sliced_wasserstein_noise_std(epsilon: Optional[float] = None, delta: Optional[float] = None,
                                    batch_size: Optional[int] = None, dataset_size: Optional[int] = None,
                                    steps: Optional[int] = None, num_projections: Optional[int] = None,
                                    dim: Optional[int] = None, clip_radius: Optional[float] = None,
                                    bound: str = "chernoff", accountant: str = "rdp", *,
                                    target_epsilon: Optional[float] = None, target_delta: Optional[float] = None,
                                    epochs: Optional[float] = None, directions: str = "uniform"
                                    ) -> Tuple[float, dict]:
    r"""σ for DP-SWD training: ``steps`` releases of a fresh batch of B of n private rows, (ε, δ)-DP overall.

    Goes through the privacy core (:mod:`fastdpot.privacy`):

    1. δ split: uniform directions, ``split_delta(delta, steps)`` -> δ_acc for the accountant and δ_tail per release
       for the sensitivity bound over the random directions (union bound over the ``steps`` draws of Θ:
       δ = δ_acc + steps·δ_tail); orthogonal directions, δ_acc = δ and δ_tail = 0 (deterministic sensitivity);
    2. Δ: uniform, ``sliced_sensitivity(k, d, δ_tail, bound, diameter=2·radius)`` — rows clipped to ``clip_radius``
       differ by at most 2·radius under substitution, Rakotomamonjy & Ralaivola, ICML 2021 (Lemma 2 / CLT variant);
       orthogonal, ``orthogonal_sliced_sensitivity(k, d, diameter=2·radius)`` = 2·radius·sqrt(⌈k/d⌉);
    3. z = ``calibrate_noise_multiplier(ε, δ_acc, B/n, steps, sampling="without_replacement")`` — fixed-size
       batches drawn uniformly without replacement, fresh every step, substitution neighbours, RDP;
    4. σ = z·Δ.

    Args:
        epsilon, delta: the target (ε, δ) of the whole training run.
        batch_size: B, private rows per release (must be what the sampler draws).
        dataset_size: n.
        steps: T, the number of releases (training steps).
        num_projections: k (k·d <= 2^31).
        dim: d.
        clip_radius: the ℓ2 norm bound the private rows are clipped to.
        bound: "chernoff" (default, proven), "bernstein" (proven, looser), "clt" (k > 30, the authors' normal
            approximation: not a guarantee, see :func:`fastdpot.privacy.sliced_sensitivity`) — any bound
            :func:`fastdpot.privacy.sliced_sensitivity` offers. Unused with ``directions="orthogonal"``.
        accountant: passed to ``calibrate_noise_multiplier``.
        target_epsilon, target_delta: Opacus' names (``make_private_with_epsilon``), aliases of ``epsilon`` and
            ``delta``: the (ε, δ) the whole run is calibrated to.
        epochs: Opacus' alternative to ``steps``: T = ceil(epochs·n/B) releases.
        directions: ``"uniform"`` (default) or ``"orthogonal"`` (the loss must then draw orthogonal blocks:
            :class:`DPSlicedWassersteinLoss` built by ``from_privacy`` with the same ``directions`` does).

    Every argument but ``bound``, ``accountant`` and ``directions`` is required (under its name or its alias); each
    has a default of None only so that the aliases can replace it. Error messages name the argument as the caller
    passed it.

    Returns:
        (noise_std, details) with details = dict(noise_multiplier, sensitivity, delta_accountant, delta_tail,
        sample_rate, steps, directions, ...). σ is a standard deviation on projected values.

    Raises:
        ValueError: invalid ε, δ, sizes (batch_size > dataset_size), clip_radius <= 0, too many projections, unknown
            bound or directions, bound="clt" with k <= 30; a required argument missing; a name given together with
            its alias (or ``steps`` with ``epochs``); an unreachable target (the message says why).

    References:
        Rakotomamonjy & Ralaivola, ICML 2021, Lemma 2 and Proposition 2; Rowland et al., "Orthogonal Estimation of
        Wasserstein Distances", AISTATS 2019 (orthogonal directions).
    """
    from .. import privacy
    from .._validate import check_epsilon

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
        steps = max(1, math.ceil(check_positive(epochs, "epochs") * n / B))
    T = check_int(steps, "steps")
    d = check_int(dim, "dim")
    k = check_num_projections(num_projections, d)
    clip_radius = check_positive(clip_radius, "clip_radius")
    check_choice(directions, "directions", DIRECTIONS)
    if directions == "orthogonal":  # deterministic sensitivity: all of δ goes to the accountant
        delta_acc, delta_tail = delta, 0.0
        sens = privacy.orthogonal_sliced_sensitivity(k, d, diameter=2.0 * clip_radius)
    else:  # `bound` is validated by the privacy core (it owns the list of bounds: clt, bernstein, ...)
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
                   delta=float(delta), accountant=accountant, directions=directions)
    return sigma, details


class SlicedWassersteinLoss(nn.Module):
    """``nn.Module`` form of :func:`fastdpot.sliced_wasserstein`: fresh random directions at every call.

    ``n_projections`` and ``seed`` (an integer or a generator) are POT's names, aliases of ``num_projections``
    (default 50, as POT) and ``generator``; giving both names of one argument is a ValueError.

    Shape: x (N, d), y (M, d) -> 0-d tensor (SW_p^p).
    """

    def __init__(self, num_projections: Optional[int] = None, p: int = 2,
                 generator: Optional[torch.Generator] = None, backend: str = "auto", *,
                 n_projections: Optional[int] = None, seed=None):
        super().__init__()
        k_name = "num_projections" if n_projections is None else "n_projections"  # errors name what was passed
        num_projections = resolve_alias(num_projections, n_projections, "num_projections", "n_projections")
        self.num_projections = check_num_projections(
            DEFAULT_NUM_PROJECTIONS if num_projections is None else num_projections, None, k_name)
        self.p = check_choice(p, "p", (1, 2))
        self.generator = check_generator(resolve_alias(generator, _seed_generator(seed), "generator", "seed"),
                                         allow_privacy=False)
        self.backend = check_choice(backend, "backend", ("auto",) + _dispatch.BACKENDS)

    def forward(self, x, y):
        """SW_p^p between ``x`` (N, d) and ``y`` (M, d) with k fresh random directions; see
        :func:`fastdpot.sliced_wasserstein` (arguments, Raises). Returns a 0-d tensor differentiable w.r.t. x, y."""
        return sliced_wasserstein(x, y, num_projections=self.num_projections, p=self.p, generator=self.generator,
                                  backend=self.backend)

    def extra_repr(self):
        return f"num_projections={self.num_projections}, p={self.p}, backend={self.backend!r}"


def _read_only(name: str, doc: str):
    """A property over ``self._<name>`` whose assignment raises AttributeError (privacy state is not editable)."""
    def get(self):
        return getattr(self, "_" + name)

    def refuse(self, value):
        raise AttributeError(f"{name} is read-only: it is part of the privacy calibration or accounting of this "
                             f"{type(self).__name__}; build a new loss (from_privacy) instead of editing it")

    get.__doc__ = doc
    return property(get, refuse, doc=doc)


_STATE_FORMAT = 1
_STATE_KEYS = ("format", "kind", "releases", "noise_std", "num_projections", "clip_radius", "release",
               "sketch_bins", "directions", "privacy")


class DPSlicedWassersteinLoss(nn.Module):
    """``nn.Module`` form of :func:`fastdpot.dp_sliced_wasserstein`: fresh directions and fresh noise at every call.

    Built directly (``noise_std``, and ``clip_radius`` whenever ``noise_std`` > 0) it accounts nothing. Built with :meth:`from_privacy` it
    holds the calibration: it clips private rows to ``clip_radius`` inside, checks that every batch has the size the
    accountant assumed, counts releases and refuses the release number ``steps + 1`` (the guarantee covers
    ``steps`` releases; the caller must still sample batches uniformly without replacement, fresh each step —
    :class:`fastdpot.privacy.FixedSizeSampler`).

    Randomness: ``secure_mode=True`` (default) draws directions and noise keys from the operating system (secret, not
    replayable; a ``generator`` then raises ValueError); ``secure_mode=False`` replays them from ``generator`` (no
    guarantee against anyone who holds its seed).

    ``release="sketch"`` with ``sketch_bins=L`` releases the private side as a sliced quantile sketch (see
    :func:`fastdpot.dp_sliced_wasserstein`): same σ, same sensitivity and accounting, L noisy bin means per
    direction. ``directions="orthogonal"`` draws ⌈k/d⌉ blocks of orthonormal directions (calibrate with the same
    ``directions``: deterministic sensitivity, all of δ to the accountant).

    State: the release counter :attr:`releases` and the calibration (:attr:`privacy`, :attr:`noise_std`, ...) are
    read-only attributes, and they are the module's ``state_dict()`` (its ``_extra_state``: plain numbers, strings
    and a dict, loadable with ``torch.load(weights_only=True)``). ``load_state_dict`` refuses a state without that
    entry, of another calibration (an edited noise, clip radius, number of directions, ...) or whose counter is
    behind this module's own (it would re-enable releases already made); it accepts one at or ahead of it (resume).

    Call: ``loss(generated, private=x_private)`` — the private rows keyword-only (see :meth:`forward`).
    :meth:`epsilon` / :meth:`get_epsilon` report the ε spent by the releases so far (``from_privacy`` modules).

    Shape: generated (N, d), private (M, d) -> 0-d tensor (DP-SW_p^p).

    Clipping: ``clip_radius`` R > 0 (the ℓ2 bound of the private rows, their unit) is required when ``noise_std`` >
    0 (noise without a bound on the rows protects nothing); ``clip_radius=float("inf")`` releases unclipped rows and
    warns (UserWarning) that no guarantee holds; ``noise_std=0`` needs none (the non-private distance).

    Raises (construction): ValueError for a bad ``noise_std``, ``num_projections`` (k·d <= 2^31: k <= 2^31 here,
    checked against d at the call), ``p``, ``clip_radius`` (<= 0, or None with ``noise_std`` > 0),
    ``release``/``sketch_bins``, ``directions``, or a generator with ``secure_mode=True``.
    """

    releases = _read_only("releases", "Releases made so far (read-only; part of the state_dict).")
    noise_std = _read_only("noise_std", "σ, the noise standard deviation on projected values (read-only).")
    num_projections = _read_only("num_projections", "k directions per release (read-only).")
    clip_radius = _read_only("clip_radius", "Clipping radius of the private rows (inf: none), or None with "
                                            "noise_std = 0 (read-only).")
    release = _read_only("release", "'points' or 'sketch' (read-only).")
    sketch_bins = _read_only("sketch_bins", "L, the sketch's bins per direction, or None (read-only).")
    directions = _read_only("directions", "'uniform' or 'orthogonal' (read-only).")

    def __init__(self, noise_std: float, num_projections: int, p: int = 2, clip_radius: Optional[float] = None,
                 generator: Optional[torch.Generator] = None, backend: str = "auto", *, secure_mode: bool = True,
                 release: str = "points", sketch_bins: Optional[int] = None, directions: str = "uniform"):
        super().__init__()
        check_release(release, sketch_bins)
        from ..privacy.randomness import PrivacyRandomness, privacy_randomness

        self._rng = (generator if isinstance(generator, PrivacyRandomness)
                     else privacy_randomness(secure_mode, generator))
        self.secure_mode = self._rng.secure_mode
        self._release, self._sketch_bins = release, sketch_bins
        self._directions = check_choice(directions, "directions", DIRECTIONS)
        self._noise_std = check_nonnegative(noise_std, "noise_std")
        self._num_projections = check_num_projections(num_projections, None)
        self.p = check_choice(p, "p", (1, 2))
        self._clip_radius = check_clip_radius(clip_radius, self._noise_std, type(self).__name__)
        self.generator = generator
        self.backend = check_choice(backend, "backend", ("auto",) + _dispatch.BACKENDS)
        self._privacy: Optional[Dict[str, Any]] = None
        self._releases = 0

    @property
    def privacy(self) -> Optional[Dict[str, Any]]:
        """The calibration of :meth:`from_privacy` (a copy: editing it changes nothing), or None."""
        return None if self._privacy is None else dict(self._privacy)

    @classmethod
    def from_privacy(cls, epsilon: Optional[float] = None, delta: Optional[float] = None,
                     batch_size: Optional[int] = None, dataset_size: Optional[int] = None,
                     steps: Optional[int] = None, num_projections: Optional[int] = None, dim: Optional[int] = None,
                     clip_radius: Optional[float] = None, bound: str = "chernoff", p: int = 2,
                     generator: Optional[torch.Generator] = None, backend: str = "auto", *,
                     secure_mode: bool = True, release: str = "points", sketch_bins: Optional[int] = None,
                     target_epsilon: Optional[float] = None, target_delta: Optional[float] = None,
                     epochs: Optional[float] = None, directions: str = "uniform"):
        """Module whose ``noise_std`` makes ``steps`` releases (ε, δ)-DP.

        See :func:`dp_sliced_wasserstein_noise_std` for the arguments and the calibration (Opacus' names
        ``target_epsilon``, ``target_delta`` and ``epochs`` are accepted there and here as aliases; ``directions``
        both calibrates and draws).
        """
        sigma, details = dp_sliced_wasserstein_noise_std(epsilon, delta, batch_size, dataset_size, steps,
                                                         num_projections, dim, clip_radius, bound=bound,
                                                         target_epsilon=target_epsilon, target_delta=target_delta,
                                                         epochs=epochs, directions=directions)
        mod = cls(sigma, num_projections, p=p, clip_radius=clip_radius, generator=generator, backend=backend,
                  secure_mode=secure_mode, release=release, sketch_bins=sketch_bins, directions=directions)
        mod._privacy = details
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
            ValueError: bad tensors (see :func:`fastdpot.dp_sliced_wasserstein`), a batch of another size or
                dimension than calibrated (nothing is released or counted).
            fastdpot.privacy.BudgetExceededError: all ``steps`` calibrated releases are used (nothing is
                released).
        """
        compiling = torch.compiler.is_compiling()
        x_private, y = _private_generated(f"{type(self).__name__}.forward", generated, legacy, private,
                                          finite=not compiling)
        if compiling:  # the counter is Python state: checked and counted eagerly, at a graph break, before the release
            _eager(type(self)._admit)(self, tuple(x_private.shape), True)
        else:
            self._admit(tuple(x_private.shape), False)
        out = dp_sliced_wasserstein(y, private=x_private, noise_std=self._noise_std,
                                    num_projections=self._num_projections, p=self.p, generator=self._rng,
                                    backend=self.backend, clip_radius=self._clip_radius, release=self._release,
                                    sketch_bins=self._sketch_bins, directions=self._directions)
        if not compiling:
            self._releases += 1
        return out

    def _admit(self, shape, count: bool) -> None:
        """Refuse a release the calibration does not cover (a batch of another size or dimension, a budget used up);
        with ``count``, count it now (under ``torch.compile``, where it runs eagerly before the graph's release: a
        release that then fails is counted, an over-count)."""
        det = self._privacy
        if det is not None:
            if shape[0] != det["batch_size"]:
                raise ValueError(f"private must hold batch_size={det['batch_size']} rows (the accountant's "
                                 f"assumption), got {shape[0]}")
            if shape[1] != det["dim"]:
                raise ValueError(f"private must have dim={det['dim']} columns, got {shape[1]}")
            if self._releases >= det["steps"]:
                from ..privacy import BudgetExceededError

                raise BudgetExceededError(f"privacy budget exhausted: noise_std was calibrated for steps="
                                          f"{det['steps']} releases, all of them used; nothing was released")
        if count:
            self._releases += 1

    # -- state ------------------------------------------------------------------------------------------------
    def get_extra_state(self) -> Dict[str, Any]:
        """The counter and the calibration, as plain values (``state_dict()['_extra_state']``)."""
        return dict(format=_STATE_FORMAT, kind=type(self).__name__, releases=self._releases,
                    noise_std=self._noise_std, num_projections=self._num_projections, clip_radius=self._clip_radius,
                    release=self._release, sketch_bins=self._sketch_bins, directions=self._directions,
                    privacy=self.privacy)

    def set_extra_state(self, state: Dict[str, Any]) -> None:
        """Restore the release counter of :meth:`get_extra_state`, validated whole before anything is assigned.

        Raises:
            ValueError: not a state of this kind and format; a calibration (σ, k, clip radius, release, bins,
                directions, the ``privacy`` details) other than this module's; a counter that is not an integer,
                exceeds the calibrated ``steps``, or is behind this module's own count.
        """
        from .._checkpoint import require_state, state_int

        what = type(self).__name__
        require_state(state, _STATE_KEYS, what)
        if state["format"] != _STATE_FORMAT or state["kind"] != what:
            raise ValueError(f"not a {what} state of format {_STATE_FORMAT}: got kind {state['kind']!r}, format "
                             f"{state['format']!r}")
        mine = self.get_extra_state()
        for key in _STATE_KEYS[3:]:
            if state[key] != mine[key]:
                raise ValueError(f"state[{key!r}] = {state[key]!r} differs from this module's {mine[key]!r}: a state "
                                 f"of another calibration cannot be loaded (its releases were not made with this "
                                 f"noise); build the module with the same arguments")
        hi = None if self._privacy is None else self._privacy["steps"]
        releases = state_int(state["releases"], "releases", 0, hi)
        if releases < self._releases:
            raise ValueError(f"state['releases'] = {releases} is behind this module's {self._releases} releases: "
                             f"loading it would re-enable releases already made")
        self._releases = releases

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if prefix + "_extra_state" not in state_dict:  # refused even with strict=False: it would reset the counter
            raise ValueError(f"the state dict has no {prefix + '_extra_state'!r} entry (the release counter and "
                             f"calibration of this {type(self).__name__}); refusing to load it")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # -- accounting -------------------------------------------------------------------------------------------
    def epsilon(self, delta: Optional[float] = None) -> float:
        """ε spent by the releases made so far (Opacus' ``accountant.get_epsilon(delta)``).

        The :attr:`releases` so far are composed as sampled-without-replacement Gaussian releases (noise multiplier
        z, B of n rows each, as calibrated by :meth:`from_privacy`) in an RDP accountant, asked at
        δ_acc = ``delta − releases·δ_tail``: with uniform directions the sensitivity over the random directions
        fails with probability δ_tail per release (union bound; Rakotomamonjy & Ralaivola, "Differentially private
        sliced Wasserstein distance", ICML 2021); orthogonal ones have δ_tail = 0. After all ``steps`` releases at
        the calibrated δ this is at most the target ε.

        Args:
            delta: total δ in (0, 1) (default: the δ given to :meth:`from_privacy`).

        Returns:
            ε >= 0 (0.0 before the first release).

        Raises:
            RuntimeError: the module was built directly from a ``noise_std`` (no calibration: nothing to account).
            ValueError: ``delta`` not in (0, 1), or ``delta <= releases·δ_tail``.
        """
        from .. import privacy

        if self._privacy is None:
            raise RuntimeError("this DPSlicedWassersteinLoss was built from a noise_std, not by from_privacy(): it "
                               "has no sensitivity or sampling to account; use from_privacy(epsilon, delta, ...)")
        det = self._privacy
        delta = det["delta"] if delta is None else check_delta(delta)
        rest = delta - self._releases * det["delta_tail"]
        if not rest > 0:
            raise ValueError(f"delta must exceed releases·delta_tail = {self._releases * det['delta_tail']!r}, got "
                             f"{delta!r}")
        if self._releases == 0:
            return 0.0
        acc = privacy.PrivacyAccountant(accountant=det["accountant"])
        acc.step(det["noise_multiplier"], det["sample_rate"], num_steps=self._releases,
                 sampling="without_replacement", dataset_size=det["dataset_size"], batch_size=det["batch_size"])
        return float(acc.get_epsilon(rest))

    def get_epsilon(self, delta: Optional[float] = None) -> float:
        """Alias of :meth:`epsilon` (the name Opacus' accountants use)."""
        return self.epsilon(delta)

    def extra_repr(self):
        return (f"noise_std={self._noise_std:.4g}, num_projections={self._num_projections}, p={self.p}, "
                f"clip_radius={self._clip_radius}, backend={self.backend!r}, release={self._release!r}"
                + (f", sketch_bins={self._sketch_bins}" if self._sketch_bins is not None else "")
                + (f", directions={self._directions!r}" if self._directions != "uniform" else ""))
