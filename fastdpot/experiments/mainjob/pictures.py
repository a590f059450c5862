"""The run folder's pictures beside ``samples.png`` (drawn with :mod:`fastdpot.plot`; every number in them is public):

* ``epsilon.png`` (every run): how the run's ε was spent, stage by stage (the composed ledger's stages in the
  private-only protocol, the seeds in the public-half one: :func:`fastdpot.plot.epsilon_stages` of
  :func:`~fastdpot.experiments.mainjob.report.released_epsilon`'s ``stages``), with, where the run has a curve to
  show, its ε against releases (:func:`fastdpot.plot.epsilon`: the composed ledger, or the public-half run's one
  flow); a run that spends no ε (the public-only baseline) or holds none (a non-private run, the decoded analysis)
  says so;
* ``quantiles.png`` (``method="oneshot"``): the released quantile functions of a few directions and classes against
  the generated images' on the same directions (:func:`fastdpot.plot.quantiles`: public release against public
  output).
"""
from __future__ import annotations

import os
import textwrap
from typing import Any, Dict, List, Optional, Sequence

import torch

__all__ = ["write_pictures", "epsilon_picture", "quantiles_picture", "curve_source", "picked_directions"]


def write_pictures(run_dir: str, cfg, result: Dict[str, Any], runs: Sequence[Dict[str, Any]], ledger=None,
                   class_names: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """Write ``epsilon.png`` and, for the one-shot method, ``quantiles.png`` into ``run_dir``; returns their paths."""
    paths = {"epsilon": os.path.join(run_dir, "epsilon.png")}
    epsilon_picture(paths["epsilon"], cfg, result, curve_source(cfg, runs, ledger))
    first = runs[0]
    if first.get("release") is not None:
        paths["quantiles"] = os.path.join(run_dir, "quantiles.png")
        quantiles_picture(paths["quantiles"], first["release"], first["samples"], first["sample_labels"],
                          class_names)
    return paths


def curve_source(cfg, runs: Sequence[Dict[str, Any]], ledger=None):
    """What ``epsilon.png`` draws against releases: the private-only run's composed ledger, or the public-half run's
    one flow (one seed, one flow over n public-sized rows: label-private or without labels); None where the run has
    no such curve (per-class flows, whose ε reads the private class sizes; several seeds; one-release stages)."""
    if ledger is not None:
        return ledger if ledger.private and sum(s["releases"] for s in ledger.stages) > len(ledger.stages) else None
    p = runs[0]["privacy"]
    if len(runs) > 1 or cfg.generation.method != "flow" or not cfg.private or (
            p.get("class_conditional") and p.get("labels", "public") != "private"):
        return None
    flow = runs[0].get("flow")
    flows = [] if flow is None else list(getattr(flow, "flows", None) or [flow])
    return flows[0] if len(flows) == 1 and getattr(flows[0], "ledger", None) is not None else None


def epsilon_picture(path: str, cfg, result: Dict[str, Any], curve=None) -> None:
    """``epsilon.png``: the stages (left) and, given a ``curve`` source, ε against releases (right); the run's
    composition named at the top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ... import plot

    rel, method = result["release"], cfg.generation.method
    stages: List[Dict[str, Any]] = rel.get("stages") or []
    if not stages:
        fig, ax = plt.subplots(figsize=(6.0, 1.8))
        ax.axis("off")
        text = ("public-only baseline: no private data read, ε = 0" if method == "public" else
                "decoded sensitive codes: an analysis, NOT private (no ε holds)" if method == "decoded" else
                "a non-private run (ε = ∞): no privacy guarantee, nothing accounted")
        ax.text(0.5, 0.5, f"{result['dataset']}: {text}", ha="center", va="center", fontsize=10)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return
    wide = curve is not None
    fig, axes = plt.subplots(1, 2 if wide else 1, figsize=(12.0 if wide else 6.5, 4.6), squeeze=False)
    eps, delta = rel["epsilon"], rel["delta"]
    stated = f"ε {'≤' if rel['is_bound'] else '='} {eps:.4g} at δ = {delta:.3g}"
    plot.epsilon_stages([(s["stage"], s["epsilon"]) for s in stages], delta=delta, target=cfg.epsilon,
                        ax=axes[0, 0], title=f"how the run spent its budget: {stated}")
    if wide:  # a composed ledger's stages are shaded and named along the top
        plot.epsilon(curve, ax=axes[0, 1], label="run" if hasattr(curve, "epsilon_by_stage") else "flow")
    fig.suptitle("\n".join(textwrap.wrap(f"{result['dataset']}, {cfg.protocol} protocol, method {method}: "
                                         f"{rel['how']}", int(fig.get_figwidth() * 14))), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def picked_directions(release) -> List[int]:
    """A few directions of the release's first block, public choices from the block's spatial frequencies: its
    lowest frequency (the block's mean), its lowest non-zero frequency, and its lowest-frequency direction with fewer
    bins than the most (a coarser band of the bin plan) or, with one band only, the direction nearest the block's
    median frequency."""
    p = release.block_size
    f = release.blocks[0].frequency.to(torch.float64)
    bins = release.bins[:p]
    picks = [int(torch.argmin(f))]
    nonzero = torch.nonzero(f > f.min()).flatten()
    if nonzero.numel():
        picks.append(int(nonzero[torch.argmin(f[nonzero])]))
    coarse = torch.nonzero(bins < bins.max()).flatten()
    if coarse.numel():
        picks.append(int(coarse[torch.argmin(f[coarse])]))
    else:
        picks.append(int(torch.argmin((f - f.median()).abs())))
    return list(dict.fromkeys(picks))


def quantiles_picture(path: str, release, samples: torch.Tensor, labels: Optional[torch.Tensor],
                      class_names: Optional[Sequence[str]] = None, max_classes: int = 3) -> None:
    """``quantiles.png``: rows of classes (at most ``max_classes``, evenly spread over the C classes), columns of
    :func:`picked_directions`; each panel :func:`fastdpot.plot.quantiles` (the legend on the first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ... import plot

    C = release.num_classes
    classes = sorted({round(i * (C - 1) / max(1, max_classes - 1)) for i in range(min(C, max_classes))})
    directions = picked_directions(release)
    frequency = release.blocks[0].frequency
    tables = release.quantile_tables()
    fig, axes = plt.subplots(len(classes), len(directions), figsize=(4.0 * len(directions), 3.3 * len(classes)),
                             squeeze=False)
    names = list(class_names) if class_names and len(class_names) == C else None
    for r, c in enumerate(classes):
        for k, j in enumerate(directions):
            ax = axes[r, k]
            f = f", {float(frequency[j]):.3g} cycles/side"
            plot.quantiles(release, samples, labels, class_index=c, direction=j, tables=tables,
                           ax=ax, title=f"{names[c] if names else f'class {c}'}: direction {j} "
                                        f"({int(release.bins[j])} bins{f})")
    _one_legend(fig, axes)
    fig.suptitle("the one-shot release against the generated images, on directions θ_j of the release's first block, "
                 "about the class's public centre m_c", fontsize=9)
    fig.tight_layout()
    fig.subplots_adjust(top=1 - 1.0 / fig.get_figheight())  # the title and the legend above every panel
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _one_legend(fig, axes) -> None:
    """One legend for a grid of :func:`fastdpot.plot.quantiles` panels, under the title (none over a panel)."""
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for ax in axes.flat:
        ax.get_legend().remove()
    fig.legend(handles, labels, loc="upper center", ncol=4, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.3 / fig.get_figheight()))
