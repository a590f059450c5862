"""Cases of the benchmark of one DP sliced-Wasserstein flow step, fused C++ step vs the torch reference: the
suite ``flow`` of ``bench/test_flow.py`` (pytest-benchmark).

impls: ``fastdpot`` (op ``flow_step``, backend ``cpu``: csrc/flow.cpp) and ``reference`` (the anchor:
:func:`fastdpot.reference.flow.flow_step`, the torch math, with its noise from ``torch.randn``,
:func:`bench.harness.torch_noise`; the ``reference`` *backend* replays the kernel's keyed Philox streams in float64
for the tests, slower than a torch user's code). Both do the same work: k
fresh noisy projections (σ = 0.5) of N particles and M private rows, per-direction sort, sort-based quantile
transport (``quantiles="exact"``), drift and Euler--Maruyama update; float32, a fresh seed every call.

case ``sketch_step`` (impl ``fastdpot`` only): the same C++ step in sketch mode: the target is a (k, L)
quantile table (L = 5 levels) instead of M noisy private projections, and the particles get no smoothing noise
(as the flows run it), so the step is the points step minus the M·k private projections and both noise draws,
plus a table evaluation per rank.

case ``pixel_step``: the one-shot flow's step in pixel space (:class:`fastdpot.flows.ReleasedTargetFlow`): for each of
``classes`` classes, op ``flow_step`` (backend ``cpu``, no drift returned, particles kept coordinate-major as the flow
keeps them) moves the class's N/classes particles onto a (k, 8) quantile table along one block of k = D orthonormal
patch-DCT directions (``patch`` × ``patch`` patches of a side × side × ``channels`` image), clamped to [0, 1]. impls:
``fastdpot`` (the block as a fast transform: csrc/flow_block.cpp, written into a reused output buffer with the
finiteness check on, as the flow steps since 2026-11-29: ``out=``, ``error_if_nonfinite=True``), ``dense`` (the same
directions as a (k, D) matrix: torch.matmul around the C++ radix transport, the step before fast blocks); anchors ``matmul`` (the two
``torch.matmul`` calls of the dense shapes per class, the projection and the drift) and ``npsort`` (``numpy.sort``,
one thread, of the step's (k, N) float32 projections: the floor of any sort-based step, every projection ranked).

case ``oneshot_generation``: the one-shot method's generation stage as the ε table runs it at ε = 10 (10 classes, its
row's blocks, bins, rotations, passes and clamp, read from ``PRIVATE_ONLY_TABLE[10.0]``: since 2026-11-28 the 8
default patch blocks of 16 bins and 8 random-rotation blocks of 8, 4 passes: 64 steps of every class's flow, from
the release's marginal start; the rows before that date ran the 8 patch blocks of 4 bins, 32 steps); impl
``fastdpot`` (fast blocks) against ``dense`` (the same release's directions as dense blocks), the same samples to
float tolerance (tests/flows/test_blocks.py).

case ``histogram_step``: the same points step with ``quantiles="histogram"`` (``bins`` = 1024 bins per
direction, no sort): impl ``fastdpot`` is the C++ histogram kernel (csrc/flow_histogram.cpp: three passes that
recompute the projections per block of particles, nothing of size N·k stored), ``reference`` the torch reference
(:func:`fastdpot.reference.flow.flow_step`). Compare it with case ``step`` impl ``fastdpot``
(the C++ exact step) of the same run_id.

case ``histogram_vs_exact`` (issue 45): the two C++ steps side by side in one group at N = 2·10⁵, d = 48, k = 64,
M = 250, float32, σ = 0.5: impl ``histogram`` (the histogram step, ``bins`` = 1024) against its anchor ``exact``
(the exact step it approximates); target: the histogram step at least as fast. Its rows record the CPU's SIMD level
(``simd``: :func:`fastdpot.env.cpu_simd`) and the one the histogram kernel was compiled for (``kernel_simd``), since
the ratio depends on it (AVX2 machines ran the histogram step at 3x the exact step's time before issue 45).

    pytest bench/test_flow.py --benchmark-only -k quick    # tiny sizes, checks that every case runs
"""
from __future__ import annotations

from bench.harness import Case, suite_main, torch_noise

SUITE = "flow"
ANCHORS = ["reference", "matmul", "npsort", "exact"]

# CelebA latent shape (d = 48, k = 300) at N = 10^6 and MNIST latent shape (d = 8, k = 70) at N = 10^5
SIZES = {"quick": dict(n=3_000, m=250, d=8, k=20), "1e6": dict(n=1_000_000, m=250, d=48, k=300),
         "1e5": dict(n=100_000, m=250, d=8, k=70),
         # the one-shot pixel-space flow: 60 000 Fashion-MNIST particles (6 000 per class), one block of 784 directions
         "pixel": dict(n=60_000, m=0, d=784, k=784), "pixel_quick": dict(n=600, m=0, d=784, k=784),
         # a million pixel-space particles in one flow; the CelebA shape (64 x 64 x 3) with full 12 288-direction blocks
         "pixel_1e6": dict(n=1_000_000, m=0, d=784, k=784, classes=1),
         "celeba": dict(n=100_000, m=0, d=12_288, k=12_288, classes=1, patch=8),
         "celeba_quick": dict(n=200, m=0, d=12_288, k=12_288, classes=1, patch=8),
         # issue 45's histogram-against-exact comparison
         "2e5": dict(n=200_000, m=250, d=48, k=64)}


def step_case(impl, n, m, d, k, quantiles="exact", noise_std=0.5, step_size=1.0):
    """One flow step (forward only) on N particles, M private rows, k directions, float32."""
    if impl not in ("fastdpot", "reference"):
        raise ValueError(f"impl must be fastdpot or reference, got {impl!r}")
    backend = "cpu" if impl == "fastdpot" else "reference"

    def setup():
        import torch

        import fastdpot.ops  # noqa: F401  (imports and extension loading are not part of the measurement)

        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, d, generator=g)
        y = torch.nn.functional.normalize(torch.randn(m, d, generator=g), dim=1)
        th = torch.nn.functional.normalize(torch.randn(k, d, generator=g), dim=1)
        return dict(x=x, y=y, th=th, seed=[0])

    mode, q = quantiles if isinstance(quantiles, tuple) else (quantiles, None)  # ("histogram", bins)

    def forward(s):
        s["seed"][0] += 1
        if backend == "reference":  # the anchor: the torch math with torch.randn noise (bench.harness.torch_noise)
            from fastdpot.reference.flow import flow_step as reference_step

            nx, ny = torch_noise(s["x"], s["y"], s["th"].shape[0], noise_std, seed=s["seed"][0])
            return reference_step(s["x"], s["y"], s["th"], nx, ny, step_size=step_size, quantiles=mode,
                                  histogram_bins=q)[0]
        from fastdpot.ops import flow_step

        new, drift, _ = flow_step(s["x"], s["y"], s["th"], noise_std=noise_std, step_size=step_size,
                                  seed=s["seed"][0], quantiles=mode, histogram_bins=q, backend=backend)
        return new

    return Case(setup=setup, forward=forward)


def sketch_step_case(impl, n, m, d, k, sketch_bins=5, quantiles="exact", step_size=1.0):
    """One sketch-mode flow step (forward only): N particles, a (k, L) table target, no smoothing noise, float32.
    ``m`` is unused (kept so the sizes are shared with ``step``)."""
    if impl != "fastdpot":
        raise ValueError(f"sketch_step is measured for impl fastdpot (the C++ step) only, got {impl!r}")

    def setup():
        import torch

        import fastdpot.ops  # noqa: F401

        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, d, generator=g)
        th = torch.nn.functional.normalize(torch.randn(k, d, generator=g), dim=1)
        table = torch.sort(torch.randn(k, sketch_bins, generator=g, dtype=torch.float64), dim=1).values
        levels = (torch.arange(sketch_bins, dtype=torch.float64) + 0.5) / sketch_bins
        return dict(x=x, th=th, sketch=(table, levels), seed=[0])

    def forward(s):
        from fastdpot.ops import flow_step

        s["seed"][0] += 1
        new, drift, _ = flow_step(s["x"], None, s["th"], noise_std=0.0, step_size=step_size, seed=s["seed"][0],
                                  quantiles=quantiles, backend="cpu", sketch=s["sketch"])
        return new

    return Case(setup=setup, forward=forward)


def histogram_step_case(impl, n, m, d, k, bins=1024, noise_std=0.5, step_size=1.0):
    """One histogram-mode flow step (forward only), float32: ``bins`` bins per direction, σ = ``noise_std``."""
    return step_case(impl, n, m, d, k, quantiles=("histogram", bins), noise_std=noise_std, step_size=step_size)


def _image_shape(d):
    """(side, channels) of a square image of d values: 1 channel when d is a square, else 3."""
    side = int(round(d ** 0.5))
    return (side, 1) if side * side == d else (int(round((d / 3) ** 0.5)), 3)


def histogram_vs_exact_case(impl, n, m, d, k, bins=1024):
    """The C++ histogram step (impl ``histogram``, ``bins`` bins) or the C++ exact step (impl ``exact``, the anchor)
    of :func:`step_case`; the rows record the CPU's SIMD level and the histogram kernel's (module docstring)."""
    if impl not in ("histogram", "exact"):
        raise ValueError(f"histogram_vs_exact impls are histogram and exact, got {impl!r}")
    from fastdpot.env import cpu_simd, kernel_simd

    case = step_case("fastdpot", n, m, d, k, quantiles=("histogram", bins) if impl == "histogram" else "exact")
    case.info = dict(simd=cpu_simd(), kernel_simd=kernel_simd("flow_histogram"))
    return case


def pixel_step_case(impl, n, m, d, k, classes=10, sketch_bins=8, patch=7):
    """One step of the one-shot pixel-space flow over ``classes`` classes of n/classes particles (module docstring);
    impl ``fastdpot`` (the fast block), ``dense`` (its matrix), ``matmul`` or ``npsort`` (the anchors). ``m`` is
    unused; k must be d (a full block)."""
    if impl not in ("fastdpot", "dense", "matmul", "npsort"):
        raise ValueError(f"pixel_step impls are fastdpot, dense, matmul and npsort, got {impl!r}")
    if k != d:
        raise ValueError(f"pixel_step runs one full block: k must be d = {d}, got {k}")
    per = n // classes

    def setup():
        import torch

        import fastdpot.ops  # noqa: F401
        from fastdpot.flows.directions import PatchDCTBlock

        side, ch = _image_shape(d)
        block = PatchDCTBlock(side, side, patch, channels=ch)
        g = torch.Generator().manual_seed(0)
        xs = [torch.rand(d, per, generator=g).t() for _ in range(classes)]  # coordinate-major, as the flow keeps them
        table = torch.sort(torch.randn(k, sketch_bins, generator=g, dtype=torch.float64), dim=1).values * 0.2
        levels = (torch.arange(sketch_bins, dtype=torch.float64) + 0.5) / sketch_bins
        state = dict(xs=xs, block=block, sketch=(table, levels))
        if impl == "fastdpot":  # the step's output buffers, reused every round as a flow reuses its spare
            state["outs"] = [torch.empty_like(x) for x in xs]
        if impl in ("dense", "matmul"):
            state["th"] = block.matrix(torch.float32)
        if impl == "npsort":  # the projections of all N particles, (k, N) float32, as the step sorts them; built
            # class by class into one array, the particles then dropped (at the CelebA shape each (N, D) is 4.9 GB)
            P, start = torch.empty(k, n - n % classes), 0
            for x in xs:
                P[:, start:start + x.shape[0]] = block.forward(x).t()
                start += x.shape[0]
            state = dict(P=P.numpy())
        return state

    def forward(s):
        import torch

        from fastdpot.ops import flow_step

        if impl == "npsort":
            import numpy as np

            return np.sort(s["P"], axis=1)  # numpy's sort runs on one thread
        out = []
        for c, x in enumerate(s["xs"]):
            if impl == "matmul":
                out.append(torch.matmul(torch.matmul(s["th"], x.t()).t(), s["th"]))
            elif impl == "fastdpot":  # as ReleasedTargetFlow.step: into the spare buffer, non-finite steps refused
                out.append(flow_step(x, None, s["block"], noise_std=0.0, step_size=float(k), quantiles="exact",
                                     backend="cpu", sketch=s["sketch"], domain=(0.0, 1.0), return_drift=False,
                                     out=s["outs"][c], error_if_nonfinite=True)[0])
            else:
                out.append(flow_step(x, None, s["th"], noise_std=0.0, step_size=float(k), quantiles="exact",
                                     backend="cpu", sketch=s["sketch"], domain=(0.0, 1.0), return_drift=False)[0])
        if impl == "fastdpot":  # the rank pass's layout, timed and chosen during the untimed first call
            from fastdpot._ext import load_cpp

            info["rank_layout"] = load_cpp("flow_block").rank_layout(per)
        return out

    info = {}
    return Case(setup=setup, forward=forward, info=info)


def oneshot_generation_case(impl, n, m, d, k, classes=10):
    """The one-shot generation stage (module docstring): the ε = 10 row's passes over its blocks for ``classes``
    classes of n/classes particles, from a release of random images (noise-free, its tables shrunk as a run's);
    impl ``fastdpot`` (fast blocks) or ``dense`` (dense blocks of the same directions). ``m`` and ``k`` are unused."""
    if impl not in ("fastdpot", "dense"):
        raise ValueError(f"oneshot_generation impls are fastdpot and dense, got {impl!r}")
    from fastdpot.experiments.mainjob.settings import PRIVATE_ONLY_TABLE

    row = PRIVATE_ONLY_TABLE[10.0]["generation"]

    def setup():
        import torch

        from fastdpot.experiments.mainjob.oneshot import ROTATION_SEED, parse_plan
        from fastdpot.flows.directions import DenseBlock, bins_by_frequency, hadamard_blocks, patch_dct_blocks
        from fastdpot.privacy.class_sketch import class_quantile_sketch

        side, ch = _image_shape(d)
        blocks = patch_dct_blocks(side, side, ch)
        bins = bins_by_frequency(torch.cat([b.frequency for b in blocks]), parse_plan(row["sketch_plan"]))
        blocks += hadamard_blocks(d, row["sketch_rotations"], seed=ROTATION_SEED)
        bins = torch.cat([bins, torch.full((row["sketch_rotations"] * d,), row["sketch_rotation_bins"])])
        if impl == "dense":
            blocks = [DenseBlock(b.matrix(), frequency=b.frequency) for b in blocks]
        g = torch.Generator().manual_seed(0)
        x = torch.rand(2000, d, generator=g, dtype=torch.float64)
        y = torch.arange(2000) % classes
        release = class_quantile_sketch(x, y, blocks, num_classes=classes, sketch_bins=bins,
                                        noise_multiplier=0.0, clip_radius=row["sketch_radius"],
                                        centers=torch.full((d,), 0.5, dtype=torch.float64))
        return dict(release=release, tables=release.quantile_tables())

    def forward(s):
        import torch

        from fastdpot.experiments.mainjob.oneshot import flow_steps
        from fastdpot.flows import ReleasedClassFlows

        flows = ReleasedClassFlows(s["release"], particles_per_class=[n // classes] * classes,
                                   domain=(0.0, 1.0) if row["sketch_clamp"] == "step" else None,
                                   generator=torch.Generator().manual_seed(1), backend="cpu")
        rot = row["sketch_rotations"]
        out, labels = flows.run(steps=flow_steps(s["release"].num_blocks - rot, rot, row["sketch_rounds"]))
        return out.clamp_(0.0, 1.0), labels

    return Case(setup=setup, forward=forward)


CASES = {"step": step_case, "sketch_step": sketch_step_case, "histogram_step": histogram_step_case,
         "pixel_step": pixel_step_case, "oneshot_generation": oneshot_generation_case,
         "histogram_vs_exact": histogram_vs_exact_case}


IMPLS = {"step": ("fastdpot", "reference"), "histogram_step": ("fastdpot", "reference"), "sketch_step": ("fastdpot",),
         "pixel_step": ("fastdpot", "dense", "matmul", "npsort"), "oneshot_generation": ("fastdpot", "dense"),
         "histogram_vs_exact": ("histogram", "exact")}
#: the sizes each case runs at (default: every size of SIZES that no case claims here)
CASE_SIZES = {"pixel_step": ("pixel", "pixel_quick", "pixel_1e6", "celeba", "celeba_quick"),
              "oneshot_generation": ("pixel", "pixel_quick"), "histogram_vs_exact": ("2e5", "quick")}
_LATENT = tuple(s for s in SIZES if s == "quick" or not any(s in v for v in CASE_SIZES.values()))
#: (size, case, impl) not measured: the dense products at a million particles or 12 288 dimensions (TFLOPs a step)
SKIP = {(size, "pixel_step", impl) for size in ("pixel_1e6", "celeba", "celeba_quick") for impl in ("dense", "matmul")}
#: extra parameters of a case (added to the size's)
EXTRA = {"histogram_step": dict(bins=1024), "histogram_vs_exact": dict(bins=1024)}


def main(argv=None):
    """``python -m bench.flow [--quick] [--sizes ..] [--impls ..]``: :func:`bench.harness.suite_main`."""
    return suite_main("bench.test_flow", argv)


if __name__ == "__main__":
    raise SystemExit(main())
