"""Error of the sort-free histogram step against the exact (sort-based) step, by number of bins.

Both steps are the C++ ``cpu`` backend with the SAME seed, hence the same Philox draws (particle smoothing noise,
private noise, Brownian term; pinned by tests/ops/test_flow_step_cpu_histogram.py), so every difference is the histogram CDF's.
Setup (synthetic): N particles ~ N(0, I_d), M private rows from a 2-component Gaussian mixture in d dimensions
(means ±1.5·e_1, std 0.5), k unit directions, σ = 0.1 smoothing, h = 1, float64. Reported per bin count B:

* ``level``: max over particles and directions of |u_hist − r/(N−1)| (the level error; its bound is
  (n_b + 1)/N, n_b the particles in the bin);
* ``drift``: ‖drift_hist − drift_exact‖_F / ‖drift_exact‖_F after one step;
* ``SW2``: the sliced-Wasserstein-2 distance (200 directions) between the particles of the two flows after
  T steps from the same start with the same seeds, next to the SW2 between the exact flow and the private rows
  (the error the flow itself makes).

    python -m bench.histogram_error                 # N = 20000, d = 8, k = 50, M = 1000, T = 30
"""
from __future__ import annotations

import argparse

import torch

from fastdpot.ops import flow_step
from fastdpot.reference.flow import histogram_levels


def _sw2(a, b, n_dir=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    th = torch.nn.functional.normalize(torch.randn(n_dir, a.shape[1], generator=g, dtype=a.dtype), dim=1)
    pa, pb = torch.sort(a @ th.t(), dim=0).values, torch.sort(b @ th.t(), dim=0).values
    lv = torch.linspace(0, 1, 1001, dtype=a.dtype)
    qa, qb = torch.quantile(pa, lv, dim=0), torch.quantile(pb, lv, dim=0)
    return float(((qa - qb) ** 2).mean().sqrt())


def measure(n=20000, d=8, k=50, m=1000, steps=30, bins=(16, 64, 256, 1024, 4096), sigma=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(n, d, generator=g, dtype=torch.float64)
    sign = torch.where(torch.rand(m, generator=g) < 0.5, -1.0, 1.0).double()
    y = 0.5 * torch.randn(m, d, generator=g, dtype=torch.float64)
    y[:, 0] += 1.5 * sign
    ths = [torch.nn.functional.normalize(torch.randn(k, d, generator=g, dtype=torch.float64), dim=1)
           for _ in range(steps)]
    kw = dict(noise_std=sigma, step_size=1.0, backend="cpu")
    _, d_exact, noise = flow_step(x0, y, ths[0], seed=1, return_noise=True, **kw)
    xe = x0
    for t in range(steps):
        xe = flow_step(xe, y, ths[t], seed=t + 1, **kw)[0]
    xp = x0 @ ths[0].t() + noise["particles"]
    ranks = torch.argsort(torch.argsort(xp, dim=0), dim=0).double() / (n - 1)
    rows = []
    for b in bins:
        _, d_hist, _ = flow_step(x0, y, ths[0], seed=1, quantiles="histogram", histogram_bins=b, **kw)
        level = float((histogram_levels(xp, b) - ranks).abs().max())
        xh = x0
        for t in range(steps):
            xh = flow_step(xh, y, ths[t], seed=t + 1, quantiles="histogram", histogram_bins=b, **kw)[0]
        rows.append(dict(bins=b, level=level, drift=float((d_hist - d_exact).norm() / d_exact.norm()),
                         sw2=_sw2(xh, xe)))
    return rows, _sw2(xe, y)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args(argv)
    rows, base = measure(n=args.n, steps=args.steps)
    print(f"N = {args.n}, T = {args.steps}; SW2(exact flow, private rows) = {base:.4f}")
    print("| bins B | max level error | relative drift difference (1 step) | SW2(hist, exact) after T steps |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['bins']} | {r['level']:.2e} | {r['drift']:.2e} | {r['sw2']:.2e} |")


if __name__ == "__main__":
    main()
