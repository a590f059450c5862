"""Cases of the benchmark of the Sinkhorn divergence S_ε, forward + backward w.r.t. both point clouds: the
suite ``sinkhorn`` of ``bench/test_sinkhorn.py`` (pytest-benchmark).

All impls compute the debiased Sinkhorn divergence with p = 2 (cost ½‖x − y‖²), blur = 0.05, scaling = 0.5 in
float32 on the same inputs:

* ``fastdpot``            -- :func:`fastdpot.sinkhorn.sinkhorn`, ``backend="auto"`` (KeOps above 2048² on CPU);
* ``fastdpot_tensorized`` -- the dense reference engine (where the (N, M) matrices fit);
* ``geomloss_online``     -- ``geomloss.SamplesLoss("sinkhorn", backend="online")`` (KeOps; same ε schedule);
* ``geomloss_tensorized`` -- ``SamplesLoss(..., backend="tensorized")`` (where it fits in memory);
* ``pot``                 -- ``ot.bregman.sinkhorn_log`` on torch tensors (POT's torch backend) at the final
  ε = blur², three problems (xy, xx, yy) for the debiased value, with as many iterations as fastdpot's ε schedule
  has updates. POT has no ε-scaling in its log solver, so "same schedule" here means same iteration count; its
  gradient flows through the cost matrices (envelope gradient of ``ot.sinkhorn2``).

    pytest bench/test_sinkhorn.py --benchmark-only -k quick    # tiny sizes, checks that every case runs
    (full sizes: N = M = 5 000 and 20 000 in d = 2, N = M = 2 000 in d = 784)
"""
from __future__ import annotations

import os

from bench.harness import Case, ROOT, suite_main

# KeOps compiles each formula once; every measurement subprocess reuses the project's cache
os.environ.setdefault("KEOPS_CACHE_FOLDER", os.path.join(ROOT, ".cache", "keops"))

SUITE = "sinkhorn"
ANCHORS = ["geomloss_online", "geomloss_tensorized", "pot"]
IMPLS = ("fastdpot", "fastdpot_tensorized", "geomloss_online", "geomloss_tensorized", "pot")

SIZES = {"quick": dict(n=300, m=250, d=2), "quick16": dict(n=200, m=150, d=16), "5e3": dict(n=5_000, m=5_000, d=2),
         "2e4": dict(n=20_000, m=20_000, d=2), "d784": dict(n=2_000, m=2_000, d=784)}
BLUR, SCALING = 0.05, 0.5
#: dense impls are skipped above this N·M (4 float32 matrices of 20 000² = 6.4 GB plus temporaries)
DENSE_MAX = 10_000 * 10_000


def _setup(n, m, d, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    if d == 2:
        x = torch.randn(n, d, generator=g)
        y = 0.5 * torch.randn(m, d, generator=g) + 1.0
    else:  # image-like data in [0, 1]
        x = torch.rand(n, d, generator=g)
        y = torch.rand(m, d, generator=g) ** 2
    return dict(x=x.requires_grad_(True), y=y.requires_grad_(True))


def _backward(state, out):
    state["x"].grad = None
    state["y"].grad = None
    out.backward()


def _pot_divergence(x, y, n_iter):
    import ot
    import torch

    def ot_eps(u, v):
        a = torch.full((u.shape[0],), 1.0 / u.shape[0], dtype=u.dtype)
        b = torch.full((v.shape[0],), 1.0 / v.shape[0], dtype=v.dtype)
        C = 0.5 * torch.cdist(u, v) ** 2
        return ot.sinkhorn2(a, b, C, reg=BLUR ** 2, method="sinkhorn_log", numItermax=n_iter, stopThr=0.0,
                            warn=False)

    return ot_eps(x, y) - 0.5 * ot_eps(x, x) - 0.5 * ot_eps(y, y)


def divergence_case(impl, n, m, d):
    """S_ε(x, y) with x (N, d), y (M, d) both requiring grad; forward + backward."""

    def forward(s):
        x, y = s["x"], s["y"]
        if impl in ("fastdpot", "fastdpot_tensorized"):
            from fastdpot.sinkhorn import sinkhorn

            return sinkhorn(x, y, blur=BLUR, scaling=SCALING, backend="auto" if impl == "fastdpot" else "tensorized")
        if impl.startswith("geomloss"):
            from geomloss import SamplesLoss

            return SamplesLoss("sinkhorn", p=2, blur=BLUR, scaling=SCALING, backend=impl.split("_")[1])(x, y)
        if impl == "pot":
            return _pot_divergence(x, y, s["n_iter"])
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")

    def setup():
        from fastdpot.reference.sinkhorn import epsilon_schedule

        s = _setup(n, m, d)
        x, y = s["x"].detach(), s["y"].detach()
        lo = x.min(0).values.minimum(y.min(0).values)
        hi = x.max(0).values.maximum(y.max(0).values)
        diam = float((hi - lo).norm())
        s["n_iter"] = len(epsilon_schedule(2, diam ** 2, BLUR, SCALING)) + 1
        return s

    return Case(setup=setup, forward=forward, backward=_backward)


CASES = {"divergence": divergence_case}


def impls(params):
    """The impls measured at ``params``: the dense ones only up to :data:`DENSE_MAX`."""
    dense = ("fastdpot_tensorized", "geomloss_tensorized", "pot")
    return tuple(i for i in IMPLS if i not in dense or params["n"] * params["m"] <= DENSE_MAX)


def main(argv=None):
    """``python -m bench.sinkhorn [--quick] [--sizes ..] [--impls ..]``: :func:`bench.harness.suite_main`."""
    return suite_main("bench.test_sinkhorn", argv)


if __name__ == "__main__":
    raise SystemExit(main())
