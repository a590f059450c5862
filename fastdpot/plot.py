"""Pictures of a user's own objects: particles against data, ε against steps, an audit against its claims.

matplotlib is an optional extra (``pip install 'fastdpot[plot]'``): ``import fastdpot`` and ``import fastdpot.plot``
never import it; the first picture does, and says how to install it when it is missing. Every function draws into
``ax`` (a new figure when None), returns the ``matplotlib.axes.Axes``, and with ``path`` also saves the figure there
and closes it.

* :func:`particles`: particles (a flow, or any (N, d) rows) and data, projected on two chosen directions;
* :func:`epsilon`: ε against the number of releases of a :class:`~fastdpot.privacy.PrivacyAccountant`, a
  :class:`~fastdpot.privacy.PrivacyLedger`, a :class:`~fastdpot.privacy.composition.ComposedLedger`, a flow or a
  :class:`~fastdpot.DPSlicedWassersteinLoss` built by ``from_privacy`` (the numbers: :func:`epsilon_curve`);
* :func:`audit`: the audit's empirical lower bounds on ε against the claimed ε (:mod:`fastdpot.audit`).

A picture of private data (the data, or particles that have not been released) is not private: it is for the data
holder. The particles of a private flow are a release (post-processing of its noisy releases).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ._validate import check_int

__all__ = ["particles", "epsilon", "epsilon_curve", "audit"]


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:  # the optional extra
        raise ImportError(f"fastdpot.plot draws with matplotlib, an optional extra: pip install 'fastdpot[plot]' "
                          f"(or pip install matplotlib); {err}") from err
    return plt


def _axes(ax, figsize):
    if ax is not None:
        return ax
    _, ax = _pyplot().subplots(figsize=figsize)
    return ax


def _finish(ax, path: Optional[str]):
    if path is not None:
        fig = ax.figure
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        _pyplot().close(fig)
    return ax


def _rows(x, name: str) -> np.ndarray:
    if hasattr(x, "particles") and not isinstance(x, (torch.Tensor, np.ndarray)):
        x = x.particles  # a flow
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"{name} must be (rows, d) with at least one row, got shape {x.shape}")
    return x


# ------------------------------------------------------------------------------------------------ particles
def particles(source, data=None, directions=None, *, ax=None, path: Optional[str] = None, max_points: int = 5000,
              labels: Tuple[str, str] = ("particles", "data"), title: Optional[str] = None):
    """Scatter of particles against data on two chosen directions.

    Args:
        source: the particles, (N, d): a tensor, an array, or an object with a ``particles`` attribute (a flow).
        data: optional (M, d) rows drawn beneath (grey), e.g. the private data, a held-out set.
        directions: the two directions of the picture: None (coordinates 0 and 1), a pair of coordinate indices
            ``(i, j)``, or a (2, d) tensor / array of directions (each row normalised to unit length).
        ax: axes to draw into (default: a new figure). path: save the figure there (PNG, 100 dpi) and close it.
        max_points: at most this many rows of each cloud are drawn (an integer >= 1; a seeded public subsample: a
            display choice).
        labels: legend names of the particles and the data. title: the axes' title.

    Shape:
        source (N, d), data (M, d), directions (2, d) -> the picture of θ_1ᵀx against θ_2ᵀx.

    Returns:
        the ``matplotlib.axes.Axes``.

    Raises:
        ValueError: shapes that disagree, d < 2 without directions, coordinates out of range, a zero direction,
            ``max_points`` not an integer >= 1 (0 would draw nothing).
        ImportError: matplotlib is not installed (the ``plot`` extra).
    """
    max_points = check_int(max_points, "max_points", 1)
    x = _rows(source, "particles")
    d = x.shape[1]
    y = None if data is None else _rows(data, "data")
    if y is not None and y.shape[1] != d:
        raise ValueError(f"particles and data must share d, got {d} and {y.shape[1]}")
    theta, names = _directions(directions, d)
    ax = _axes(ax, (4.5, 4.5))
    g = np.random.default_rng(0)
    for pts, label, color in ((y, labels[1], "tab:gray"), (x, labels[0], "tab:blue")):
        if pts is None:
            continue
        if pts.shape[0] > max_points:
            pts = pts[g.choice(pts.shape[0], max_points, replace=False)]
        proj = pts @ theta.T
        ax.scatter(proj[:, 0], proj[:, 1], s=2, c=color, label=label, alpha=0.6 if color == "tab:gray" else 0.8)
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.legend(fontsize=8, markerscale=4)
    ax.set_title(title or f"{x.shape[0]} particles" + ("" if y is None else f" against {y.shape[0]} data rows"),
                 fontsize=9)
    return _finish(ax, path)


def _directions(directions, d: int):
    if directions is None:
        directions = (0, 1)
    if isinstance(directions, (tuple, list)) and len(directions) == 2 and all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in directions):
        if d < 2:
            raise ValueError(f"the rows have d = {d} < 2 coordinates: give directions=(2, d) rows")
        for i in directions:
            if not 0 <= i < d:
                raise ValueError(f"coordinate {i} out of range for d = {d}")
        theta = np.zeros((2, d))
        theta[0, directions[0]] = theta[1, directions[1]] = 1.0
        return theta, [f"coordinate {directions[0]}", f"coordinate {directions[1]}"]
    theta = _rows(directions, "directions")
    if theta.shape != (2, d):
        raise ValueError(f"directions must be two coordinates (i, j) or a (2, d) = (2, {d}) array, got shape "
                         f"{theta.shape}")
    norms = np.linalg.norm(theta, axis=1, keepdims=True)
    if not (norms > 0).all():
        raise ValueError("directions must be non-zero rows")
    return theta / norms, ["θ₁ᵀx", "θ₂ᵀx"]


# ------------------------------------------------------------------------------------------------ epsilon
def epsilon_curve(source, delta: Optional[float] = None, *, steps: Optional[int] = None,
                  points: int = 25) -> Tuple[np.ndarray, np.ndarray, int]:
    """ε at δ after t releases, for t on a grid of ``points`` values in [1, T], by replaying the source's releases in
    a fresh :class:`~fastdpot.privacy.PrivacyAccountant` of the same kind and settings (read from its public state).

    Args:
        source: a :class:`~fastdpot.privacy.PrivacyAccountant` (T = its recorded releases; ``delta`` required), a
            :class:`~fastdpot.privacy.PrivacyLedger` after ``bind`` (T = its planned steps; each release is its
            bound event, after whatever its accountant recorded before this ledger), a flow (its ``ledger``: private
            and calibrated, i.e. after its first run or step) or a :class:`~fastdpot.DPSlicedWassersteinLoss` built
            by ``from_privacy`` (T = its calibrated steps).
        delta: total δ (default: the ledger's, flow's or loss's δ). The sensitivity tails are charged as the
            source's own ``epsilon`` does: all T of them up front (a ledger with ``tails="planned"``, the flows),
            or those of the t releases so far (``tails="spent"``, the loss module).
            A :class:`~fastdpot.privacy.composition.ComposedLedger` (T = its recorded releases, replayed stage by
            stage in the order its stages were first recorded, in the accountant it uses; δ its run's δ).
        steps: plot up to this many releases instead of T (an integer >= 1). points: grid size (an integer >= 2;
            every release when T is smaller), plus the releases made so far.

    Returns:
        ``(t, eps, spent)``: int array of release counts, float array of ε (unit: nats of privacy loss, as every ε
        of fastdpot), and the number of releases the source has made (the accountant's: T).

    Raises:
        ValueError: a source of another kind, a ledger not bound yet (nothing says what its releases are), a
            non-private flow or composed ledger, a loss without calibration, no ``delta`` for an accountant, a δ not
            above the tails, ``points`` < 2 or ``steps`` < 1 (or not integers), nothing released or planned.
    """
    t, eps, spent, _ = _curve(source, delta, steps, points)
    return t, eps, spent


def _curve(source, delta, steps, points):
    """:func:`epsilon_curve`'s numbers and the total δ they are stated at."""
    from .privacy import PrivacyAccountant
    from .privacy.ledger import PrivacyLedger

    points = check_int(points, "points", 2)
    steps = None if steps is None else check_int(steps, "steps", 1)
    plan = _plan(source, delta, PrivacyAccountant, PrivacyLedger)
    total = plan["total"] if steps is None else steps
    if total < 1:
        raise ValueError(f"nothing to plot: {total} releases")
    grid = np.linspace(1, total, min(points, total)).round().astype(np.int64)
    grid = np.unique(np.append(grid, plan["spent"]) if 1 <= plan["spent"] <= total else grid)  # the current ε too
    acc = PrivacyAccountant(**plan["settings"])
    events = list(plan["events"])
    eps, done = [], 0
    for t in grid:
        need = int(t) - done
        while need > 0:
            event, count = events[0]
            take = min(need, count)
            acc.step(**event, num_steps=take)
            need, done = need - take, done + take
            events[0] = (event, count - take)
            if events[0][1] == 0:
                events.pop(0)
        rest = plan["delta_at"](int(t))
        if not rest > 0:
            raise ValueError(f"delta must exceed the sensitivity tails charged after {t} releases")
        eps.append(acc.get_epsilon(rest))
    return grid, np.asarray(eps, dtype=np.float64), plan["spent"], plan["delta"]


def _plan(source, delta, PrivacyAccountant, PrivacyLedger) -> dict:
    """What :func:`epsilon_curve` replays: accountant settings, the releases in order (event kwargs, count), the
    release count T, the releases made so far, and the accountant's δ after t releases."""
    if isinstance(source, PrivacyAccountant):
        if delta is None:
            raise ValueError("an accountant holds no δ: pass delta=")
        return dict(settings=_settings(source), events=source.history, total=source.steps, spent=source.steps,
                    delta=delta, delta_at=lambda t: delta)
    from .privacy.composition import ComposedLedger

    if isinstance(source, ComposedLedger):
        if not source.private:
            raise ValueError("a non-private composed ledger (epsilon=inf) spends no ε: nothing to plot")
        full = source.accountant_used == "pld"
        events = [(dict(noise_multiplier=s["noise_multiplier"], **({"sample_rate": 1.0} if full else s["event"])),
                   s["releases"]) for s in source.stages]
        total = sum(n for _, n in events)
        delta = source.delta if delta is None else delta
        return dict(settings=dict(accountant=source.accountant_used), events=events, total=total, spent=total,
                    delta=delta, delta_at=lambda t: delta)
    if isinstance(source, PrivacyLedger) or (hasattr(source, "ledger") and hasattr(source, "steps_taken")):
        ledger = source if isinstance(source, PrivacyLedger) else source.ledger
        if ledger is None:
            raise ValueError("a non-private flow spends no ε: nothing to plot")
        return _ledger_plan(ledger, delta)
    det = getattr(source, "privacy", None)
    if isinstance(det, dict) and hasattr(source, "releases"):
        delta = det["delta"] if delta is None else delta
        event = dict(noise_multiplier=det["noise_multiplier"], sample_rate=det["sample_rate"],
                     sampling="without_replacement", dataset_size=det["dataset_size"], batch_size=det["batch_size"])
        return dict(settings=dict(accountant=det["accountant"]), events=[(event, det["steps"])], total=det["steps"],
                    spent=source.releases, delta=delta, delta_at=lambda t: delta - t * det["delta_tail"])
    if hasattr(source, "privacy") and hasattr(source, "releases"):
        raise ValueError("this DPSlicedWassersteinLoss was built from a noise_std: it has no calibration to account "
                         "(build it with from_privacy)")
    raise ValueError(f"source must be a PrivacyAccountant, a PrivacyLedger, a ComposedLedger, a flow or a "
                     f"DPSlicedWassersteinLoss, got {type(source).__name__}")


def _settings(acc) -> dict:
    return dict(accountant=acc.accountant, orders=acc.orders,
                value_discretization_interval=acc.value_discretization_interval,
                neighboring_relation=acc.neighboring_relation)


def _ledger_plan(ledger, delta) -> dict:
    event = ledger.event
    if event is None or ledger.noise_multiplier is None:
        raise ValueError("the ledger is not bound yet (its sampling event is fixed by bind(), a flow's first run or "
                         "step): nothing says what its releases are")
    event = dict(event, noise_multiplier=ledger.noise_multiplier)
    delta = ledger.delta if delta is None else delta
    acc = ledger.accountant
    recorded = [] if acc is None else acc.history
    prior = (0 if acc is None else acc.steps) - ledger.steps_spent  # releases of others before this ledger's
    events = _take(recorded, max(0, prior)) + [(event, ledger.steps)]
    tail = ledger.delta_tail
    planned = ledger.tails == "planned"
    settings = _settings(acc) if acc is not None else dict(accountant=ledger.accountant_kind)
    return dict(settings=settings, events=events, total=ledger.steps, spent=ledger.steps_spent, delta=delta,
                delta_at=lambda t: delta - (ledger.steps if planned else max(0, prior) + t) * tail)


def _take(history: Sequence[Tuple[dict, int]], count: int) -> List[Tuple[dict, int]]:
    out = []
    for event, n in history:
        if count <= 0:
            break
        out.append((event, min(n, count)))
        count -= n
    return out


def epsilon(source, delta: Optional[float] = None, *, ax=None, path: Optional[str] = None,
            steps: Optional[int] = None, points: int = 25, label: Optional[str] = None):
    """ε against the number of releases (:func:`epsilon_curve`): solid up to the releases made so far, dashed for
    the rest of the plan, a dot at the current ε; the target ε as a dotted line where the source has one. The y axis
    names the δ the curve is stated at (the legend names each curve's δ when curves of several δ share the axes); the
    x axis has integer ticks (release counts).

    Args:
        source, delta, steps, points: as :func:`epsilon_curve`.
        ax: axes to draw into (default: a new figure; several sources can share one). path: save and close.
        label: the legend name (default: the source's class name).

    Returns:
        the ``matplotlib.axes.Axes``.

    Raises:
        ValueError: as :func:`epsilon_curve`. ImportError: matplotlib is not installed (the ``plot`` extra).
    """
    t, eps, spent, delta = _curve(source, delta, steps, points)
    ax = _axes(ax, (5.5, 3.6))
    from matplotlib.ticker import MaxNLocator

    label = label or type(source).__name__
    done = t <= spent
    line, = ax.plot(t[done], eps[done], lw=1.6, label=f"{label} (spent)" if (~done).any() else label)
    drawn = [line]
    if (~done).any():
        start = np.flatnonzero(done)[-1:] if done.any() else np.array([], dtype=np.int64)
        idx = np.concatenate([start, np.flatnonzero(~done)])
        drawn += ax.plot(t[idx], eps[idx], lw=1.2, ls="--", color=line.get_color(), label=f"{label} (planned)")
    if spent >= 1 and done.any():
        ax.plot([t[done][-1]], [eps[done][-1]], "o", color=line.get_color(), ms=4)
    target = _target(source)
    if target is not None and math.isfinite(target):
        drawn.append(ax.axhline(target, color=line.get_color(), ls=":", lw=1, label=f"{label} target ε = {target:g}"))
    for artist in drawn:
        artist.set_gid(f"fastdpot.epsilon delta={delta!r}")
    _name_delta(ax)
    ax.set_xlabel("releases (steps)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    ax.set_title("privacy spent against steps", fontsize=9)
    return _finish(ax, path)


def _name_delta(ax) -> None:
    """The y axis names the δ of every curve :func:`epsilon` drew on ``ax``; with several δ, each legend entry does."""
    tag = "fastdpot.epsilon delta="
    curves = [a for a in ax.get_children() if str(a.get_gid() or "").startswith(tag)]
    deltas = {a.get_gid()[len(tag):] for a in curves}
    if len(deltas) == 1:
        ax.set_ylabel(f"ε at δ = {float(deltas.pop()):.3g}")
        return
    ax.set_ylabel("ε (at each curve's δ: legend)")
    for a in curves:
        text = f", δ = {float(a.get_gid()[len(tag):]):.3g}"
        if not a.get_label().endswith(text):
            a.set_label(a.get_label() + text)


def _target(source) -> Optional[float]:
    ledger = getattr(source, "ledger", source)
    value = getattr(ledger, "target_epsilon", None)
    if value is None and isinstance(getattr(source, "privacy", None), dict):
        value = source.privacy.get("epsilon")
    return None if value is None else float(value)


# ------------------------------------------------------------------------------------------------ audit
def audit(results, *, ax=None, path: Optional[str] = None, title: Optional[str] = None):
    """The audit's empirical lower bounds on ε (bars; red where a claim is refuted) against the claimed ε (black
    ticks), one pair per audited release.

    Args:
        results: a mapping ``label -> AuditResult`` or a sequence of ``(label, AuditResult)``
            (:func:`fastdpot.audit.run_case`, :func:`fastdpot.audit.audit_mechanism`).
        ax: axes to draw into (default: a new figure). path: save and close. title: the axes' title.

    Returns:
        the ``matplotlib.axes.Axes``.

    Raises:
        ValueError: no results, or an item without ``epsilon_lower`` / ``epsilon``.
        ImportError: matplotlib is not installed (the ``plot`` extra).

    References:
        Jagielski, Ullman & Oprea, NeurIPS 2020; Nasr et al., USENIX Security 2023 (the lower bound:
        :mod:`fastdpot.audit.core`).
    """
    items = list(results.items()) if hasattr(results, "items") else list(results)
    if not items:
        raise ValueError("no audit results to plot")
    for label, r in items:
        if not (hasattr(r, "epsilon_lower") and hasattr(r, "epsilon")):
            raise ValueError(f"{label!r}: not an AuditResult (needs epsilon_lower and epsilon)")
    ax = _axes(ax, (max(4.5, 0.9 * len(items) + 2), 3.8))
    pos = np.arange(len(items))
    lower = [r.epsilon_lower for _, r in items]
    claimed = [r.epsilon for _, r in items]
    colors = ["tab:red" if r.violated else "tab:blue" for _, r in items]
    ax.bar(pos, lower, width=0.6, color=colors, label="audited ε ≥ (red: claim refuted)")
    ax.scatter(pos, claimed, marker="_", s=900, c="black", linewidths=2, label="claimed ε", zorder=3)
    ax.set_xticks(pos)
    ax.set_xticklabels([str(label) for label, _ in items], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("ε")
    ax.set_ylim(0, 1.08 * max(max(lower), max(claimed)))
    conf = {round(r.confidence, 6) for _, r in items}
    ax.set_title(title or "privacy audit: empirical lower bound\nagainst the claimed ε"
                 + (f" (confidence {conf.pop():g})" if len(conf) == 1 else ""), fontsize=9, pad=24)
    # above the axes, under the title: no bar or tick is ever hidden behind it
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False, markerscale=0.5,
              borderaxespad=0.2)
    return _finish(ax, path)
