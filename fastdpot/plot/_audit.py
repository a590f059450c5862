"""The audit's lower bounds against the claimed ε (:func:`fastdpot.plot.audit`)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ._common import _axes, _finish


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
