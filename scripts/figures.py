"""Make every figure the documentation shows (``docs/gallery/*.png``) with the public API, on CPU.

    python scripts/figures.py                  # writes docs/gallery/*.png (about 6 min of CPU time on 2 cores)
    python scripts/figures.py --quick --out /tmp/figures   # the same code on tiny sizes, in seconds (a check)
    python scripts/figures.py --only epsilon_steps,audit_bounds   # some of them

1. ``flow_strip.png``: a private 2-D DP sliced-Wasserstein flow (ε = 10) as strips of frames, per-point release
   vs the sliced quantile sketch (:class:`fastdpot.DPSlicedWassersteinFlow`).
2. ``dpswgen_curve.png``: the DP sliced-Wasserstein loss of a DPSWgen generator along its private training
   (:func:`fastdpot.dpswgen.train_dpswgen` on :class:`fastdpot.experiments.papers.dpswgen.MLPGenerator`).
3. ``ldp_half_circle.png``: clean points on a half circle, their locally privatised release (Gaussian local
   mechanism, ε = 5), and samples of a generator trained on the release with the entropic loss W_{2,2σ²}
   (:func:`fastdpot.ldp.train_generator` on :class:`fastdpot.experiments.papers.ldp.MLPGenerator2D`).

4. ``particles_vs_data.png``: :func:`fastdpot.plot.particles`: the particles of a private 8-D flow against the data in
   two chosen directions (two coordinates; the plane the data lie near).
5. ``epsilon_steps.png``: :func:`fastdpot.plot.epsilon`: ε against steps for a
   :class:`fastdpot.privacy.PrivacyAccountant` (PLD and RDP), a flow and a
   :class:`fastdpot.DPSlicedWassersteinLoss` part-way through its plan.
6. ``audit_bounds.png``: :func:`fastdpot.plot.audit`: the audit's empirical lower bounds against the claimed ε, the
   local mechanisms correct and with their clipping removed (:func:`fastdpot.audit.run_case`).
7. ``epsilon_stages.png``: :func:`fastdpot.plot.epsilon_stages`: how a run's ε was spent, stage by stage, in a
   :class:`fastdpot.privacy.composition.ComposedLedger` (the one-shot release's two stages; a DP-SGD representation
   and a per-step flow, with its ε against releases), as ``epsilon.png`` of a main-job run folder.
8. ``release_quantiles.png``: :func:`fastdpot.plot.quantiles`: a one-shot release of the digits (ε ≈ 10) against the
   images its flows generate, as ``quantiles.png`` of a one-shot run folder.

Public draws (data, initial particles and weights, latents) are seeded; every privacy draw (batches, directions,
mechanism noise) is secret operating-system randomness, so two runs give figures that differ in their noise only.
``--quick`` shrinks every size (particles, steps, points) so that the whole script runs in seconds: its figures
show nothing, it only checks that the code runs.
"""
from __future__ import annotations

import argparse
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import fastdpot  # noqa: E402
import fastdpot.plot  # noqa: E402,F401  (the optional extra's pictures)
from fastdpot.dpswgen import train_dpswgen  # noqa: E402
from fastdpot.experiments.papers.dpswgen import MLPGenerator  # noqa: E402
from fastdpot.experiments.papers.ldp import MLPGenerator2D, half_circle  # noqa: E402
from fastdpot.ldp import train_generator  # noqa: E402
from fastdpot.privacy import gaussian_local_mechanism  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FULL = dict(points=4000, particles=1500, flow_steps=120, frames=(0, 20, 60, 120), gen_steps=300, gen_batch=500,
            ldp_points=3000, ldp_steps=200, audit_trials=100_000, digits=None)
QUICK = dict(points=200, particles=60, flow_steps=6, frames=(0, 2, 4, 6), gen_steps=4, gen_batch=50, ldp_points=60,
             ldp_steps=3, audit_trials=2_000, digits=300)


def _two_moons(n, g):
    t = torch.rand(n, generator=g) * torch.pi
    side = torch.randint(0, 2, (n,), generator=g)
    x = torch.stack([torch.cos(t), torch.sin(t)], 1)
    x[side == 1] = torch.stack([1 - torch.cos(t[side == 1]), 0.5 - torch.sin(t[side == 1])], 1)
    return (x - torch.tensor([0.5, 0.25])) * 0.8 + 0.05 * torch.randn(n, 2, generator=g)


def _seeded(make, seed):
    """``make()`` with the global torch RNG seeded (initial weights), the caller's RNG state left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def flow_strip(out, s):
    g = torch.Generator().manual_seed(0)
    private = _two_moons(s["points"], g)
    keep = s["frames"]
    rows = {}
    for release in ("points", "sketch"):
        kw = {} if release == "points" else dict(release="sketch", sketch_bins=20)
        flow = fastdpot.DPSlicedWassersteinFlow(num_particles=s["particles"], dim=2, num_projections=2,
                                                step_size=1.0, target_epsilon=10.0, delta=1e-5, clip_radius=1.0,
                                                batch_size=min(400, s["points"]), steps=s["flow_steps"],
                                                directions="orthogonal", init="gaussian_scaled", init_scale=0.5,
                                                generator=torch.Generator().manual_seed(1), **kw)
        frames = {0: flow.particles.clone()}

        def snap(f, frames=frames):
            if f.steps_taken in keep:
                frames[f.steps_taken] = f.particles.clone()

        flow.run(private, progress=False, callback=snap)
        rows[release] = (frames, flow.epsilon())
    n = s["particles"]
    fig, axes = plt.subplots(2, len(keep) + 1, figsize=(2.6 * (len(keep) + 1), 5.4), sharex=True, sharey=True)
    for r, (release, (frames, eps)) in enumerate(rows.items()):
        axes[r, 0].scatter(*private[:n].T, s=1, c="tab:gray")
        axes[r, 0].set_title("private data", fontsize=9)
        axes[r, 0].set_ylabel(f"release={release!r}\nε = {eps:.2f}", fontsize=9)
        for ax, step in zip(axes[r, 1:], keep):
            ax.scatter(*frames[step].T, s=1, c="tab:blue" if release == "points" else "tab:green")
            ax.set_title(f"step {step}", fontsize=9)
    for ax in axes.flat:
        ax.set_xlim(-1.3, 1.3)
        ax.set_ylim(-1.0, 1.0)
        ax.set_aspect("equal")
    fig.suptitle(f"DP sliced-Wasserstein flow on two moons, ε = 10, δ = 1e-5, {n} particles: per-point release "
                 "(top) vs sliced quantile sketch, L = 20 (bottom)", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "flow_strip.png"), dpi=80)
    plt.close(fig)


def dpswgen_curve(out, s):
    g = torch.Generator().manual_seed(2)
    private = _two_moons(s["points"], g)
    n = s["particles"]
    fig, ax = plt.subplots(1, 3, figsize=(11, 3))
    for i, (eps, release) in enumerate(((math.inf, "points"), (10.0, "sketch"))):
        kw = {} if release == "points" else dict(release="sketch", sketch_bins=25)
        model = _seeded(lambda: MLPGenerator(latent_dim=4, out_dim=2), 3)
        res = train_dpswgen(private, model, eps, 1e-5, steps=s["gen_steps"], batch_size=s["gen_batch"],
                            num_projections=20, clip_radius=1.5, lr=2e-3,
                            generator=torch.Generator().manual_seed(3), progress=False, **kw)
        label = "non-private" if math.isinf(eps) else f"ε = {res.epsilon:.2f}, sketch L = 25"
        ax[0].plot(res.losses, lw=1, label=label)
        samples = res.sample(n, generator=torch.Generator().manual_seed(4))
        ax[1 + i].scatter(*private[:n].T, s=1, c="tab:gray", label="private")
        ax[1 + i].scatter(*samples.T, s=1, c="tab:orange", label="generated")
        ax[1 + i].set_title(label, fontsize=9)
        ax[1 + i].set_aspect("equal")
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("loss (DP-SW₂²)")
    ax[0].set_yscale("log")
    ax[0].legend(fontsize=8)
    ax[0].set_title("DPSWgen training curve", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "dpswgen_curve.png"), dpi=80)
    plt.close(fig)


def ldp_half_circle(out, s):
    g = torch.Generator().manual_seed(5)
    n = s["ldp_points"]
    clean = half_circle(n, g)
    released, sigma = gaussian_local_mechanism(clean, 5.0, 1e-4, 1.0)  # secret noise (OS randomness)
    model = _seeded(lambda: MLPGenerator2D(latent_dim=2), 6)
    train_generator(model, released, sigma, "entropic", steps=s["ldp_steps"], seed=6)
    with torch.no_grad():
        samples = model.sample(n, generator=torch.Generator().manual_seed(7))
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2), sharex=True, sharey=True)
    for ax, pts, title, c in zip(axes, (clean, released, samples),
                                 ("clean (never released)", f"released: x + N(0, {sigma:.2f}²)",
                                  "generated (entropic W₂, λ = 2σ²)"), ("tab:gray", "tab:red", "tab:green")):
        ax.scatter(*pts.T, s=1, c=c)
        ax.set_title(title, fontsize=9)
        ax.set_xlim(-2.5, 2.5)
        ax.set_ylim(-2.0, 2.5)
        ax.set_aspect("equal")
    fig.suptitle("Locally privatised half circle, Gaussian local mechanism (ε, δ) = (5, 1e-4)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ldp_half_circle.png"), dpi=80)
    plt.close(fig)


def _moons_in(d, n, g):
    """Two moons in a plane of R^d (a seeded public orthonormal pair ``plane`` (2, d)), with a little noise off it."""
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    plane = q[:, :2].T.contiguous()
    return _two_moons(n, g) @ plane + 0.05 * torch.randn(n, d, generator=g), plane


def particles_vs_data(out, s):
    g = torch.Generator().manual_seed(8)
    d = 8
    private, plane = _moons_in(d, s["points"], g)
    flow = fastdpot.DPSlicedWassersteinFlow(num_particles=s["particles"], dim=d, num_projections=d, step_size=1.0,
                                            target_epsilon=10.0, delta=1e-5, clip_radius=1.5,
                                            batch_size=min(400, s["points"]), steps=s["flow_steps"],
                                            directions="orthogonal", release="sketch", sketch_bins=20,
                                            init="gaussian_scaled", init_scale=0.3,
                                            generator=torch.Generator().manual_seed(9))
    flow.run(private, progress=False)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.8))
    fastdpot.plot.particles(flow, private, (0, 1), ax=axes[0], title="coordinates 0 and 1")
    fastdpot.plot.particles(flow, private, plane, ax=axes[1], title="the plane of the moons (two chosen directions)")
    fig.suptitle(f"particles of a private 8-D flow (sketch release, ε = {flow.epsilon():.2f}, δ = 1e-5) against the "
                 f"data", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "particles_vs_data.png"), dpi=80)
    plt.close(fig)


def epsilon_steps(out, s):
    from fastdpot.privacy import PrivacyAccountant

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for kind in ("pld", "rdp"):  # Opacus' example: z = 1, q = 250/29999, 4199 steps
        acc = PrivacyAccountant(kind)
        acc.step(1.0, 250 / 29999, num_steps=4199 if s is FULL else 50)
        fastdpot.plot.epsilon(acc, 1e-5, ax=axes[0], label=f"accountant ({kind})")
    axes[0].set_title("PrivacyAccountant: z = 1, q = 250/29999", fontsize=9)
    g = torch.Generator().manual_seed(10)
    private = _two_moons(s["points"], g)
    flow = fastdpot.DPSlicedWassersteinFlow(num_particles=s["particles"], dim=2, num_projections=2, step_size=1.0,
                                            target_epsilon=10.0, delta=1e-5, clip_radius=1.0,
                                            batch_size=min(400, s["points"]), steps=s["flow_steps"],
                                            directions="orthogonal", generator=torch.Generator().manual_seed(11))
    flow.run(private, steps=s["flow_steps"] // 2, progress=False)  # half of its plan
    fastdpot.plot.epsilon(flow, ax=axes[1], label="flow")
    axes[1].set_title(f"DPSlicedWassersteinFlow: {flow.steps_taken} of {s['flow_steps']} steps", fontsize=9)
    crit = fastdpot.DPSlicedWassersteinLoss.from_privacy(5.0, 1e-5, batch_size=100, dataset_size=s["points"],
                                                         steps=40, num_projections=20, dim=2, clip_radius=1.0)
    for _ in range(10):
        crit(torch.randn(100, 2, generator=g), private=private[torch.randperm(s["points"], generator=g)[:100]])
    fastdpot.plot.epsilon(crit, ax=axes[2], label="loss")
    axes[2].set_title(f"DPSlicedWassersteinLoss: {crit.releases} of 40 releases", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "epsilon_steps.png"), dpi=80)
    plt.close(fig)


def audit_bounds(out, s):
    from fastdpot.audit import run_case

    results = [(f"{name}, {variant}", run_case(name, "reference", variant, trials=s["audit_trials"], seed=12))
               for name in ("laplace_local", "gaussian_local") for variant in ("correct", "no_clip")]
    fastdpot.plot.audit(results, path=os.path.join(out, "audit_bounds.png"))


def _save_small(fig, path):
    """Save with a 64-colour palette (a third of the bytes of full colour for these line drawings; docs/ stays under
    its 1 MB budget)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def _ledger(*stages):
    """A composed ledger at (ε, δ) = (10, 1e-5) of (name, noise multiplier, releases, batch size or None for the whole
    set) stages on n = 1438 rows (the noise multipliers: each stage calibrated to a share of ε = 10 once, by
    ``ComposedLedger.calibrate``, and written here: calibrating a subsampled stage takes seconds)."""
    from fastdpot.privacy.composition import ComposedLedger

    led = ComposedLedger(10.0, 1e-5)
    for name, z, releases, batch in stages:
        led.record(name, z, releases, dataset_size=1438, **(dict(sampling="full") if batch is None else
                                                             dict(batch_size=batch)))
    return led


def epsilon_stages(out, s):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    fastdpot.plot.epsilon_stages(_ledger(("means", 1.27, 1, None), ("sketch", 0.545, 1, None)), ax=axes[0],
                                 title="one-shot release: two full-batch Gaussians (PLD)")
    per_step = _ledger(("representation", 2.83, s["flow_steps"] // 4, 256), ("flow", 1.36, s["flow_steps"], 128))
    fastdpot.plot.epsilon_stages(per_step, ax=axes[1], title="a DP representation, then a per-step flow (RDP)")
    fastdpot.plot.epsilon(per_step, ax=axes[2], label="run")
    axes[2].set_title("the same run: ε against releases, in stage order", fontsize=9, pad=18)
    fig.tight_layout()
    _save_small(fig, os.path.join(out, "epsilon_stages.png"))


def release_quantiles(out, s):
    from fastdpot.experiments.data import load_digits
    from fastdpot.flows import ClassConditionalFlow
    from fastdpot.flows.directions import patch_dct_blocks
    from fastdpot.privacy.class_sketch import class_quantile_sketch

    digits = load_digits("train")
    x, y = digits.images[:s["digits"]].flatten(1).double() / 255.0, digits.labels[:s["digits"]]
    led = _ledger(("sketch", 0.501, 1, None))  # the whole budget on the sketch, about the public grey image
    blocks = patch_dct_blocks(28, 28, 1, ((28, 0, 0), (7, 0, 0)))  # the public fast blocks, as the main job's
    freq = torch.cat([b.frequency for b in blocks])
    release = class_quantile_sketch(x, y, blocks, num_classes=10, sketch_bins=4, clip_radius=7.0,
                                    noise_multiplier=led.stages[0]["noise_multiplier"],
                                    centers=torch.full((784,), 0.5, dtype=torch.float64))
    flows = ClassConditionalFlow.from_release(release, s["particles"], domain=(0.0, 1.0),
                                              generator=torch.Generator().manual_seed(13))
    samples, labels = flows.run(steps=2 * release.num_blocks)
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.4))
    for r, c in enumerate((0, 7)):
        for k, j in enumerate((0, 1, 29)):  # the image's mean, the lowest horizontal frequency, a diagonal one
            fastdpot.plot.quantiles(release, samples, labels, class_index=c, direction=j, ax=axes[r, k],
                                    title=f"digit {c}: direction {j} ({float(freq[j]):.3g} cycles/side)")
    handles, names = axes[0, 0].get_legend_handles_labels()
    for ax in axes.flat:
        ax.get_legend().remove()
    fig.legend(handles, names, loc="upper center", ncol=4, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.955))
    fig.suptitle(f"a one-shot release of {len(y)} digits (ε = {led.epsilon():.3g}, δ = 1e-5, 4 bins) against the "
                 f"{s['particles']} images its flows generate", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    _save_small(fig, os.path.join(out, "release_quantiles.png"))


FIGURES = (flow_strip, dpswgen_curve, ldp_half_circle, particles_vs_data, epsilon_steps, audit_bounds, epsilon_stages,
           release_quantiles)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "gallery"), help="output folder")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the code runs (figures meaningless)")
    p.add_argument("--only", default=None, help="comma-separated figure names (default: all): "
                   + ", ".join(f.__name__ for f in FIGURES))
    a = p.parse_args(argv)
    names = None if a.only is None else a.only.split(",")
    unknown = sorted(set(names or ()) - {f.__name__ for f in FIGURES})
    if unknown:
        p.error(f"unknown figures {unknown}")
    os.makedirs(a.out, exist_ok=True)
    for make in FIGURES:
        if names is not None and make.__name__ not in names:
            continue
        make(a.out, QUICK if a.quick else FULL)
        print(f"wrote {os.path.join(a.out, make.__name__ + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
