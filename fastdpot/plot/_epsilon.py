"""ε against releases (:func:`fastdpot.plot.epsilon`, :func:`fastdpot.plot.epsilon_curve`) and a run's ε stage by
stage (:func:`fastdpot.plot.epsilon_stages`)."""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .._validate import check_int
from ._common import _axes, _finish


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
    from ..privacy import PrivacyAccountant
    from ..privacy.ledger import PrivacyLedger

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
    from ..privacy.composition import ComposedLedger

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
    the rest of the plan, a dot at the current ε; the target ε as a dotted line where the source has one; a composed
    ledger's stages shaded and named along the top. The y axis names the δ the curve is stated at (the legend names
    each curve's δ when curves of several δ share the axes); the x axis has integer ticks (release counts).

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
    ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", integer=True))
    ax.legend(fontsize=8)
    staged = _mark_stages(ax, source)
    ax.set_title("privacy spent against steps" + (", in stage order" if staged else ""), fontsize=9,
                 pad=18 if staged else 6)
    return _finish(ax, path)


def _mark_stages(ax, source) -> bool:
    """A composed ledger's stages on the release axis: shaded spans, named along the top (True when drawn)."""
    from ..privacy.composition import ComposedLedger

    if not isinstance(source, ComposedLedger) or len(source.stages) < 2:
        return False
    edge, centres = 0, []
    for i, s in enumerate(source.stages):
        ax.axvspan(edge + 0.5, edge + s["releases"] + 0.5, color="0.5", alpha=0.06 + 0.08 * (i % 2), lw=0)
        centres.append(edge + 0.5 + s["releases"] / 2)
        edge += s["releases"]
    top = ax.secondary_xaxis("top")
    top.set_xticks(centres)
    top.set_xticklabels([s["stage"] for s in source.stages], fontsize=8)
    top.tick_params(length=0)
    return True


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


# ------------------------------------------------------------------------------------------------ stages
def epsilon_stages(source, delta: Optional[float] = None, *, target: Optional[float] = None, ax=None,
                   path: Optional[str] = None, title: Optional[str] = None):
    """How a run's ε was spent, stage by stage: one bar per stage, in the order recorded, from the composed ε of the
    stages before it (grey) up to the composed ε with it (blue: the stage's increment), each labelled with that ε;
    the target ε dotted. ε does not add up under composition: an increment is what the stage added to the composed ε
    after the stages before it, not its ε alone.

    Args:
        source: a :class:`~fastdpot.privacy.composition.ComposedLedger` (its stages, their releases and noise
            multipliers, :meth:`~fastdpot.privacy.composition.ComposedLedger.epsilon_by_stage`, its δ and target ε),
            or a sequence of ``(label, ε)`` pairs: the composed ε of each stage with the stages before it, as the
            caller composed them (finite, >= 0, non-decreasing), with ``delta`` the δ they hold at.
        delta: δ of the picture (default: the ledger's; required with pairs).
        target: the target ε, dotted (default: the ledger's; none with pairs).
        ax: axes to draw into (default: a new figure). path: save and close. title: the axes' title.

    Returns:
        the ``matplotlib.axes.Axes``.

    Raises:
        ValueError: a non-private ledger or one without stages, pairs without ``delta``, an empty sequence, ε values
            that are not finite, negative or decreasing. ImportError: matplotlib is not installed (the ``plot``
            extra).
    """
    from ..privacy.composition import ComposedLedger

    if isinstance(source, ComposedLedger):
        if not source.private:
            raise ValueError("a non-private composed ledger (epsilon=inf) spends no ε: nothing to plot")
        delta = source.delta if delta is None else delta
        target = source.target_epsilon if target is None else target
        values = source.epsilon_by_stage(delta)
        labels = [_stage_label(s) for s in source.stages]
    else:
        if delta is None:
            raise ValueError("(label, ε) pairs hold at a δ the picture must name: pass delta=")
        pairs = list(source)
        if not pairs or not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
            raise ValueError("source must be a ComposedLedger or a non-empty sequence of (label, ε) pairs")
        labels, values = [str(p[0]) for p in pairs], [float(p[1]) for p in pairs]
    if not values:
        raise ValueError("the ledger has no stage: nothing to plot")
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"every stage's ε must be finite and >= 0, got {values}")
    if any(b < a * (1 - 1e-9) for a, b in zip(values, values[1:])):
        raise ValueError(f"the composed ε of the stages so far cannot decrease, got {values}")
    ax = _axes(ax, (max(5.5, 1.5 * len(values) + 2.2), 3.8))
    pos = np.arange(len(values))
    before = np.array([0.0] + values[:-1])
    after = np.array(values)
    ax.bar(pos, before, width=0.6, color="0.85", label="ε before the stage")
    ax.bar(pos, np.maximum(after - before, 0.0), bottom=before, width=0.6, color="tab:blue",
           label="added by the stage")
    top = max(values + ([target] if target is not None and math.isfinite(target) else []))
    for x, b, a in zip(pos, before, after):
        text = f"ε = {a:.4g}" + (f"\n(+{a - b:.3g})" if x > 0 else "")
        ax.text(x, a + 0.02 * top, text, ha="center", va="bottom", fontsize=8)
    if target is not None and math.isfinite(target):
        ax.axhline(target, color="black", ls=":", lw=1, label=f"target ε = {target:g}")
    ax.set_xticks(pos)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_xlim(-0.6, len(values) - 0.4)
    ax.set_ylim(0, 1.25 * top if top > 0 else 1.0)
    ax.set_ylabel(f"composed ε at δ = {float(delta):.3g}")
    ax.set_title(title or f"privacy spent stage by stage: ε = {values[-1]:.4g} at δ = {float(delta):.3g}",
                 fontsize=9, pad=24)
    ax.legend(fontsize=7.5, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False, borderaxespad=0.2,
              handlelength=1.5, columnspacing=1.0)
    return _finish(ax, path)


def _stage_label(stage: dict) -> str:
    """A ledger stage's name, releases, noise multiplier and sampling (public settings)."""
    e = stage["event"]
    n, b = e["dataset_size"], e["batch_size"]
    sampling = "all n rows" if b == n else f"B = {b} of n"
    return f"{stage['stage']}\n{stage['releases']} × z = {stage['noise_multiplier']:.3g}\n{sampling}"
