"""The cases of the GPU benchmark :mod:`bench.gpu_flow`: what is measured (the runner, the timing and the rows are
that module's).

Cases: ``flow_step`` (one DP sliced-Wasserstein flow step, forward only), ``dpswd`` (the DP-SW_2^2 loss, forward +
backward: gradient w.r.t. the generated side, M = N rows on both sides) and ``sketch`` (the same loss with the sliced
quantile sketch release, L = 10 bins). Sizes: N in {1e5, 1e6, 1e7}, d in {8, 48}, k in {128, 300}, and N = 1e6,
d = 3072, k = 1000; the target sizes (N = 1e7 and 1e6, d = 48, k = 128) first.

Implementations: the GPU backends ``cuda`` (where built) and ``triton`` (exact sort-based transport), their
``*_hist`` twins (sort-free histogram mode, :data:`HISTOGRAM_BINS` bins), and the anchors ``reference``
(``fastdpot.reference``, the torch math, noise drawn with ``torch.randn`` on the device:
:func:`bench.harness.torch_noise`), ``reference_hist`` (the histogram reference, N <= 1e6 only) and, for the DP-SWD
loss at the target size N = 1e6, d = 48, k = 128 (other sizes on request), ``reference_compiled``:
``torch.compile(fastdpot.reference.sliced.sliced_wasserstein, dynamic=False)`` -- the pure torch math the
``reference`` backend calls, compiled forward and backward -- with the same noise as the ``reference`` row, drawn
eagerly outside the compiled graph. The fastdpot rows draw keyed Philox normals in their kernels (the ``reference``
*backend* replays those streams in float64 torch, several times slower on a GPU: a test oracle, not a speed anchor).
The sketch case's reference row is the reference backend (its noise is k·L draws). Inputs: random non-zero float32
(Gaussian particles, a shifted Gaussian private batch, unit directions); the fastdpot rows of the DP loss clip the
private rows to :data:`CLIP`, which changes none of them.
"""
from __future__ import annotations

import torch

from .harness import Case, torch_noise

COMPILED = "reference_compiled"
ANCHORS = ["reference", "reference_hist", COMPILED]
TARGET_DPSWD = dict(N=10 ** 6, d=48, k=128)  # the DP-SWD target size; the default sizes compile only this one
HISTOGRAM_BINS = 1024  # B of the histogram rows (quantiles="histogram")
M_PRIVATE = 250  # private batch per flow step (DPSWflow-r uses B = 250)
#: the DP loss's clipping bound: above every row's norm, so the clipping pass runs (as in a user's call) and the
#: anchors, which do not clip, compute the same loss
CLIP = 1e6


def _sizes(quick: bool, smoke: bool):
    if smoke:
        return [dict(N=256, d=8, k=16)]
    ns = [10 ** 5, 10 ** 6] if quick else [10 ** 5, 10 ** 6, 10 ** 7]
    out = [dict(N=n, d=d, k=k) for n in ns for d in (8, 48) for k in (128, 300)]
    out.append(dict(N=10 ** 6, d=3072, k=1000))
    # the target sizes first (N = 1e7, d = 48, k = 128; N = 1e6), so that a --budget-s cut keeps them
    first = [dict(N=10 ** 7, d=48, k=128), dict(N=10 ** 6, d=48, k=128)]
    return [p for p in first if p in out] + [p for p in out if p not in first]


def _inputs(n, m, d, k, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, d, device=device, generator=g)
    y = torch.randn(m, d, device=device, generator=g) * 0.5 + 0.25
    th = torch.randn(k, d, device=device, generator=g)
    th /= th.norm(dim=1, keepdim=True)
    return x, y, th


def _flow_case(impl, N, d, k, M=M_PRIVATE, device="cuda"):
    from fastdpot.ops import flow_step

    backend = impl[:-len("_hist")] if impl.endswith("_hist") else impl  # triton, cuda or reference
    quantiles = "histogram" if impl.endswith("_hist") else "exact"

    def setup():
        return _inputs(N, M, d, k, device)

    bins = HISTOGRAM_BINS if quantiles == "histogram" else None
    if backend == "reference":  # the anchor: the torch math with torch's own device RNG (torch_noise)
        from fastdpot.reference.flow import flow_step as reference_step

        def forward(state):
            x, y, th = state
            nx, ny = torch_noise(x, y, th.shape[0], 0.5)
            return reference_step(x, y, th, nx, ny, step_size=1.0, diffusion=0.0, quantiles=quantiles,
                                  histogram_bins=bins)
    else:
        def forward(state):
            x, y, th = state
            return flow_step(x, y, th, noise_std=0.5, step_size=1.0, diffusion=0.0, seed=1234, quantiles=quantiles,
                             histogram_bins=bins, backend=backend)

    return Case(setup=setup, forward=forward, device=device)


_COMPILED_FN = {}


def compiled_reference_loss():
    """``torch.compile(fastdpot.reference.sliced.sliced_wasserstein, dynamic=False)``, built once per process
    (Dynamo compiles it again for each new input shape)."""
    if "sw" not in _COMPILED_FN:
        from fastdpot.reference.sliced import sliced_wasserstein

        _COMPILED_FN["sw"] = torch.compile(sliced_wasserstein, dynamic=False)
    return _COMPILED_FN["sw"]


def _dpswd_case(impl, N, d, k, M=None, device="cuda", sketch_bins=None):
    """DP-SW_2^2 forward + backward (gradient w.r.t. the generated side); ``sketch_bins``: the sketch release of
    the private side (L bins, σ on each bin sum) instead of the points release."""
    from fastdpot.sliced import dp_sliced_wasserstein

    m = N if M is None else M

    def setup():
        x, y, th = _inputs(N, m, d, k, device)
        return x, y.requires_grad_(True), th

    if impl == COMPILED:
        forward = _compiled_forward
    elif impl == "reference" and not sketch_bins:  # the anchor: the torch math with torch's RNG (torch_noise)
        def forward(state):
            from fastdpot.reference.sliced import sliced_wasserstein

            x, y, th = state
            nx, ny = torch_noise(x, y, th.shape[0], 0.5)
            return sliced_wasserstein(x, y, th, 2, nx, ny)
    else:
        def forward(state):
            x, y, th = state
            return dp_sliced_wasserstein(y, private=x, noise_std=0.5, clip_radius=CLIP, p=2, projections=th,
                                         generator=torch.Generator().manual_seed(1234), secure_mode=False,
                                         backend=impl,  # replayable noise: a timing, not a release
                                         **(dict(release="sketch", sketch_bins=sketch_bins) if sketch_bins else {}))

    def backward(state, loss):
        loss.backward()
        state[1].grad = None

    return Case(setup=setup, forward=forward, backward=backward, device=device)


def _compiled_forward(state):
    """The ``reference`` anchor with the torch math compiled: the same ``torch_noise``, drawn eagerly outside the
    compiled graph, then ``compiled_reference_loss()``."""
    x, y, th = state
    nx, ny = torch_noise(x, y, th.shape[0], 0.5)
    return compiled_reference_loss()(x, y, th, 2, nx, ny)


def _sketch_case(impl, N, d, k, M=None, device="cuda"):
    """The DP-SWD loss with the sliced quantile sketch release (L = 10 bins): :func:`_dpswd_case`."""
    return _dpswd_case(impl, N, d, k, M=M, device=device, sketch_bins=10)


CASES = {"flow_step": _flow_case, "dpswd": _dpswd_case, "sketch": _sketch_case}


#: largest N at which the flow step's torch reference is timed (None: every N); at N = 1e7 one reference step takes
#: about 10 s on an H100 (bench/results/), which a short device lease cannot spare on every run
MAX_REFERENCE_N = [None]


def _gpu_impls():
    """The GPU backends to time: ``cuda`` (where ``fastdpot._C_cuda_flow`` is built and a GPU is visible) and
    ``triton``."""
    from fastdpot._cuda_prims import cuda_status

    return (["cuda"] if cuda_status()[0] else []) + ["triton"]


def _impls(case, n, compiled=False):
    """Implementations of ``case`` at N = ``n``; ``compiled``: add the ``reference_compiled`` anchor (DP-SWD)."""
    gpu = _gpu_impls()
    if case == "flow_step":
        ref = MAX_REFERENCE_N[0] is None or n <= MAX_REFERENCE_N[0]
        return ([i for g in gpu for i in (g, g + "_hist")] + (["reference"] if ref else [])
                + (["reference_hist"] if n <= 10 ** 6 and ref else []))
    return gpu + ["reference"] + ([COMPILED] if compiled else [])


def _wants_compiled(params, compiled):
    """Whether the DP-SWD rows at ``params`` include ``reference_compiled`` (``compiled``: all, target, none)."""
    return compiled == "all" or (compiled == "target" and params == TARGET_DPSWD)


def modelled_bytes(case, N, d, k, M=M_PRIVATE, itemsize=4):
    """Minimal traffic model of :mod:`bench.gpu_flow`'s docstring (bytes)."""
    if case == "flow_step":
        return itemsize * (N * d + M * d + 2 * N * d + 2 * N * k + 2 * M * k)
    return itemsize * (2 * N * d + N * d + 2 * 2 * N * k)
