"""Cases of the (DP) sliced Wasserstein loss benchmark, forward + backward: the suite ``sliced`` of
``bench/test_sliced.py`` (pytest-benchmark).

impls: ``fastdpot`` (the C++ ``cpu`` backend), ``pot`` (``ot.sliced_wasserstein_distance`` on torch tensors with
the same projections; it returns the p-th root, which changes nothing in cost), ``reference``
(:func:`fastdpot.reference.sliced.sliced_wasserstein`, the torch math; in the ``dp`` case its noise comes from
``torch.randn``, :func:`bench.harness.torch_noise`: the ``reference`` backend's float64 replay of the kernel's keyed
streams is a test oracle, which rows of 2026-11-22 to 11-26 timed). The ``dp``
case adds σ = 0.5 noise on both sides (fastdpot and reference only: POT has no noise); the fastdpot rows of the DP
cases clip the private rows to :data:`CLIP`, which changes none of them (the anchors do not clip). The ``sketch`` case is the
DP-SWD loss with the sliced quantile sketch release (``release="sketch"``, L = 10 bins, σ = 0.5 on each bin sum):
impl ``fastdpot`` the fused C++ kernel, ``reference`` the torch reference
(:func:`fastdpot.reference.sliced.sketch_sliced_wasserstein`); compare it with ``dp``/``fastdpot`` (the points
release) of the same run. The ``step`` case is a generator's training step with both losses, forward + backward
w.r.t. its weights: impl ``eager`` (the functions as called) and ``compiled`` (the same loss function under
``torch.compile(fullgraph=True)``, the default inductor backend, compiled in the untimed setup: the losses are the
custom ops of :mod:`fastdpot.ops.library` in one graph); ``eager`` is the anchor of its group, so the ``compiled``
row's ratio is "× eager".

    pytest bench/test_sliced.py --benchmark-only -k quick      # tiny sizes, checks that every case runs
    pytest bench/test_sliced.py --benchmark-only -k "not quick" --benchmark-json=bench/results/cpu-<rev>.json
"""
from __future__ import annotations

from bench.harness import Case, suite_main, torch_noise

SUITE = "sliced"
#: the DP cases' clipping bound: above every row's norm, so the clipping pass runs (as in a user's call) and the
#: anchors, which do not clip, compute the same loss
CLIP = 1e6
ANCHORS = ["pot", "reference", "eager"]

#: size id -> sizes; the id "quick" is what ``-k quick`` selects
SIZES = {"quick": dict(n=2_000, m=1_500, d=8, k=20), "1e5": dict(n=100_000, m=100_000, d=48, k=500),
         "d784": dict(n=10_000, m=10_000, d=784, k=1000)}


def _setup(n, m, d, k, seed=0):
    import torch

    from fastdpot.sliced import random_projections

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)  # private side (no gradient)
    y = (torch.randn(m, d, generator=g) + 0.5).requires_grad_(True)  # generated side
    th = random_projections(k, d, generator=g, dtype=torch.float32)
    return dict(x=x, y=y, th=th)


def _backward(state, out):
    state["y"].grad = None
    out.backward()


def sw_case(impl, n, m, d, k, p=2):
    """SW_p^p between x (N, d) and y (M, d) requiring grad, k fixed directions, forward + backward w.r.t. y."""
    import torch

    def forward(s):
        if impl == "fastdpot":
            from fastdpot.sliced import sliced_wasserstein

            return sliced_wasserstein(s["x"], s["y"], projections=s["th"], p=p, backend="cpu")
        if impl == "reference":
            from fastdpot.reference.sliced import sliced_wasserstein

            return sliced_wasserstein(s["x"], s["y"], s["th"], p=p)
        if impl == "pot":
            import ot

            return ot.sliced_wasserstein_distance(s["x"], s["y"], projections=s["th"].T, p=p)
        raise ValueError(f"impl must be fastdpot, reference or pot, got {impl!r}")

    del torch
    return Case(setup=lambda: _setup(n, m, d, k), forward=forward, backward=_backward)


def dp_case(impl, n, m, d, k, p=2, noise_std=0.5):
    """DP-SW_p^p: as ``sw`` plus N(0, σ²) on every projected value of both sides (fresh seed each call)."""
    import torch

    def forward(s):
        g = s["gen"]
        if impl == "fastdpot":
            from fastdpot.sliced import dp_sliced_wasserstein

            return dp_sliced_wasserstein(s["y"], private=s["x"], noise_std=noise_std, clip_radius=CLIP,
                                         projections=s["th"], p=p, generator=g, secure_mode=False, backend="cpu")
        if impl == "reference":  # the anchor: the torch math with torch.randn noise (bench.harness.torch_noise)
            from fastdpot.reference.sliced import sliced_wasserstein

            nx, ny = torch_noise(s["x"], s["y"], s["th"].shape[0], noise_std,
                                 seed=int(torch.randint(2 ** 62, (1,), generator=g)))
            return sliced_wasserstein(s["x"], s["y"], s["th"], p, nx, ny)
        raise ValueError(f"impl must be fastdpot or reference, got {impl!r}")

    def setup():
        s = _setup(n, m, d, k)
        s["gen"] = torch.Generator().manual_seed(1)
        return s

    return Case(setup=setup, forward=forward, backward=_backward)


def sketch_case(impl, n, m, d, k, p=2, noise_std=0.5, sketch_bins=10):
    """DP-SW_p^p with the private side released as a sliced quantile sketch (L = ``sketch_bins`` bins, σ on each bin
    sum, isotonic fit) and the generated side binned likewise: the fused C++ kernel (``fastdpot``) or the torch
    reference (``reference``)."""
    import torch

    if impl not in ("fastdpot", "reference"):
        raise ValueError(f"impl must be fastdpot or reference for the sketch case, got {impl!r}")

    def forward(s):
        from fastdpot.sliced import dp_sliced_wasserstein

        return dp_sliced_wasserstein(s["y"], private=s["x"], noise_std=noise_std, clip_radius=CLIP,
                                     projections=s["th"], p=p, generator=s["gen"], secure_mode=False, release="sketch",
                                     sketch_bins=sketch_bins,
                                     backend="cpu" if impl == "fastdpot" else "reference")

    def setup():
        s = _setup(n, m, d, k)
        s["gen"] = torch.Generator().manual_seed(1)
        return s

    return Case(setup=setup, forward=forward, backward=_backward)


def step_case(impl, n, m, d, k, p=2, noise_std=0.5):
    """One training step of a generator G (a linear layer d -> d on M latent rows): SW_p^p(G(z), x) with k fresh
    uniform directions plus DP-SW_p^p(G(z), private=x, σ, clipped to :data:`CLIP`, secure mode: k fresh secret
    directions and a fresh key), forward + backward w.r.t. G's weights; ``eager`` calls the functions, ``compiled``
    their ``torch.compile(fullgraph=True)`` (inductor), compiled and run once in the setup."""
    import torch

    if impl not in ("eager", "compiled"):
        raise ValueError(f"impl must be eager or compiled for the step case, got {impl!r}")

    def setup():
        from fastdpot import dp_sliced_wasserstein, sliced_wasserstein

        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, d, generator=g)
        z = torch.randn(m, d, generator=g)
        torch.manual_seed(0)
        gen = torch.nn.Linear(d, d)

        def loss_fn(z, x):
            y = gen(z)
            return (sliced_wasserstein(y, x, num_projections=k, p=p)
                    + dp_sliced_wasserstein(y, private=x, noise_std=noise_std, clip_radius=CLIP, num_projections=k,
                                            p=p))

        fn = torch.compile(loss_fn, fullgraph=True) if impl == "compiled" else loss_fn
        fn(z, x).backward()  # compiles (compiled) and warms up; not timed
        return dict(fn=fn, z=z, x=x, gen=gen)

    def forward(s):
        return s["fn"](s["z"], s["x"])

    def backward(s, out):
        s["gen"].zero_grad(set_to_none=True)
        out.backward()

    return Case(setup=setup, forward=forward, backward=backward)


CASES = {"sw": sw_case, "dp": dp_case, "sketch": sketch_case, "step": step_case}
IMPLS = {"sw": ("fastdpot", "pot", "reference"), "dp": ("fastdpot", "reference"), "sketch": ("fastdpot", "reference"),
         "step": ("eager", "compiled")}


def main(argv=None):
    """``python -m bench.sliced [--quick] [--sizes ..] [--impls ..]``: :func:`bench.harness.suite_main`."""
    return suite_main("bench.test_sliced", argv)


if __name__ == "__main__":
    raise SystemExit(main())
