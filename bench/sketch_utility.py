"""Utility of the sketch release vs the per-point release on a synthetic class (a quick check).

One anisotropic 16-d Gaussian class of 3 000 points (mean of norm 0.6, standard deviations 0.02 .. 0.25 along a
random orthonormal basis, rows clipped to radius 1 inside the flow), (ε, δ) = (10, 1e-5), T = 300 steps, B = 100,
k = 16 orthogonal directions per step, N = 1 000 particles started at N(0, 0.3²·I/d). Reported: the relative
covariance error ``‖Cov(particles) − Cov(data)‖_F / ‖Cov(data)‖_F`` and the mean error ``‖mean − mean‖``, for
``release="points"`` and ``release="sketch"`` (L bins) at the given step sizes, over seeds. Synthetic data only:
nothing here selects the main job's hyper-parameters.

    python -m bench.sketch_utility                       # L = 5, h = 0.1, points at h in {0.1, 0.3, 1}, 1 seed
    python -m bench.sketch_utility --seeds 0,1,2 --bins 5,10 --json out.json
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch

from fastdpot.flows import DPSlicedWassersteinFlow


def make_class(n=3000, d=16, seed=0):
    """(n, d) float32 samples of the anisotropic Gaussian class (a function of ``seed`` only)."""
    g = torch.Generator().manual_seed(1000 + seed)
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    stds = torch.logspace(math.log10(0.02), math.log10(0.25), d, dtype=torch.float64)
    mean = torch.nn.functional.normalize(torch.randn(d, generator=g, dtype=torch.float64), dim=0) * 0.6
    x = mean + (torch.randn(n, d, generator=g, dtype=torch.float64) * stds) @ basis.t()
    return x.float()


def errors(particles, data):
    cp, cd = torch.cov(particles.double().t()), torch.cov(data.double().t())
    return dict(cov_rel_err=float(torch.linalg.norm(cp - cd) / torch.linalg.norm(cd)),
                mean_err=float(torch.linalg.norm(particles.double().mean(0) - data.double().mean(0))))


def run_one(data, release, step_size, num_bins, seed, epsilon=10.0, steps=300, batch=100, particles=1000):
    d = data.shape[1]
    kw = dict(release="sketch", sketch_bins=num_bins) if release == "sketch" else {}
    flow = DPSlicedWassersteinFlow(particles, d, d, step_size, target_epsilon=epsilon, delta=1e-5, clip_radius=1.0,
                                   batch_size=batch, steps=steps, directions="orthogonal", init="gaussian_scaled",
                                   init_scale=0.3, generator=torch.Generator().manual_seed(seed), **kw)
    t0 = time.perf_counter()
    flow.run(data, progress=False)
    return dict(release=release, num_bins=num_bins if release == "sketch" else None, step_size=step_size,
                seed=seed, epsilon=flow.epsilon(), noise_multiplier=flow.noise_multiplier, wall_s=round(
                    time.perf_counter() - t0, 2), **errors(flow.particles, data))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--bins", default="5")
    ap.add_argument("--sketch-h", default="0.1")
    ap.add_argument("--points-h", default="0.1,0.3,1")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args(argv)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        data = make_class(seed=seed)
        for h in (float(v) for v in args.points_h.split(",") if v):
            rows.append(run_one(data, "points", h, None, seed))
            print(json.dumps(rows[-1]), flush=True)
        for h in (float(v) for v in args.sketch_h.split(",") if v):
            for L in (int(v) for v in args.bins.split(",")):
                rows.append(run_one(data, "sketch", h, L, seed))
                print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
