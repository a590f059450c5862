"""Which release to use at low dimension: the per-point release against the sketch, at ε = 5.

Two measurements on synthetic 2-D data (nothing here selects the main job's hyper-parameters):

* ``loss``: the DP-SWD loss in a user's own loop. A point cloud of N = 500 learnable points, started at
  N(0, 0.1²·I), trained by Adam (lr 0.02) on :class:`fastdpot.DPSlicedWassersteinLoss` built by ``from_privacy`` at
  (ε, δ) = (5, 1e-5) over T = 300 releases of B = 500 of n = 10 000 private rows: a ring of radius 1 (width 0.05),
  clip radius 1.2, k = 20 uniform directions. ``release="points"`` against ``release="sketch"`` (L bins).
* ``labelled``: label-private class-conditional flows (:class:`fastdpot.ClassConditionalFlow`,
  ``label_privacy="private"``) on three 2-D classes (Gaussian blobs of std 0.15 at distance 0.8 from the origin,
  shares 0.5 / 0.3 / 0.2 of n = 6 000 rows), N = 600 particles, k = 8, h = 0.5, B = 300, T = 200 at (5, 1e-5),
  label block c = 1, clip radius 1.5, points against sketch.

Reported per run: W2 between the generated points and 2 000 fresh data points (exact OT, POT's ``emd2``) before and
after, and for ``labelled`` the mean per-class W2; the ε spent. Seeds average the runs.

    python -m bench.release_guidance --seeds 0,1,2 --json out.json
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch

EPS, DELTA = 5.0, 1e-5


def ring(n, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(n, generator=g, dtype=torch.float64) * 2 * math.pi
    r = 1.0 + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)
    return torch.stack([r * a.cos(), r * a.sin()], 1).float()


def blobs(n, seed, shares=(0.5, 0.3, 0.2)):
    g = torch.Generator().manual_seed(seed)
    labels = torch.multinomial(torch.tensor(shares), n, replacement=True, generator=g)
    ang = 2 * math.pi * labels.double() / len(shares)
    centres = 0.8 * torch.stack([ang.cos(), ang.sin()], 1)
    return (centres + 0.15 * torch.randn(n, 2, generator=g, dtype=torch.float64)).float(), labels


def w2(a, b):
    """Exact W2 between two point clouds of equal weights (POT's emd2 on squared distances)."""
    import ot

    a, b = a.detach().double().numpy(), b.detach().double().numpy()
    return math.sqrt(ot.emd2([], [], ot.dist(a, b)))


def run_loss(release, seed, num_bins=10, steps=300, batch=500, k=20):
    from fastdpot import DPSlicedWassersteinLoss
    from fastdpot.privacy import FixedSizeSampler

    data, test = ring(10_000, 100 + seed), ring(2_000, 200 + seed)
    g = torch.Generator().manual_seed(seed)
    pts = (0.1 * torch.randn(500, 2, generator=g)).requires_grad_(True)
    kw = dict(release="sketch", sketch_bins=num_bins) if release == "sketch" else {}
    crit = DPSlicedWassersteinLoss.from_privacy(EPS, DELTA, batch, data.shape[0], steps, k, 2, 1.2, **kw)
    sampler = FixedSizeSampler(data.shape[0], batch)
    opt = torch.optim.Adam([pts], lr=0.02)
    before = w2(pts, test)
    for _ in range(steps):
        opt.zero_grad()
        crit(pts, private=data[sampler.sample()]).backward()
        opt.step()
    return dict(task="loss", release=release, num_bins=num_bins if release == "sketch" else None, seed=seed,
                w2_before=before, w2_after=w2(pts, test), epsilon=crit.epsilon())


def run_labelled(release, seed, num_bins=10, steps=200, batch=300, k=8):
    from fastdpot import ClassConditionalFlow

    x, lab = blobs(6_000, 300 + seed)
    xt, lt = blobs(2_000, 400 + seed)
    kw = dict(release="sketch", sketch_bins=num_bins) if release == "sketch" else {}
    cc = ClassConditionalFlow(600, 2, k, 0.5, num_classes=3, label_privacy="private", label_scale=1.0,
                              target_epsilon=EPS, delta=DELTA, clip_radius=1.5, batch_size=batch, steps=steps,
                              init_scale=0.3, generator=torch.Generator().manual_seed(seed), **kw)
    xs, ys = cc.run(x, lab, progress=False)
    per = [w2(xs[ys == c], xt[lt == c]) for c in range(3) if bool((ys == c).any())]
    return dict(task="labelled", release=release, num_bins=num_bins if release == "sketch" else None, seed=seed,
                w2_after=w2(xs, xt), w2_per_class=sum(per) / len(per), classes_found=len(per),
                epsilon=cc.epsilon())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--bins", default="10")
    ap.add_argument("--tasks", default="loss,labelled")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args(argv)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for task in args.tasks.split(","):
            fn = run_loss if task == "loss" else run_labelled
            for release, L in [("points", None)] + [("sketch", int(b)) for b in args.bins.split(",")]:
                t0 = time.perf_counter()
                row = fn(release, seed, **({} if L is None else dict(num_bins=L)))
                row["wall_s"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
