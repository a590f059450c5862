"""The cases of the GPU benchmark :mod:`bench.gpu_sinkhorn`: the problem, the implementations and their shared
schedule (the timing, the rows and the command line are that module's).

What is compared: entropic OT_ε between two float32 point clouds, **not** debiased (``debias=False``: two N×M
soft-min reductions per iteration, no OT_ε(α, α) / OT_ε(β, β) terms), cost ½‖x − y‖² (``p=2``, GeomLoss'
``SqDist(X,Y)/2``; fastdpot's default ``squared_euclidean()``), blur = 0.05 (ε = blur² = 0.0025), uniform weights.

* ``geomloss_online`` -- ``geomloss.SamplesLoss("sinkhorn", p=2, blur=0.05, scaling=s, diameter=D, debias=False,
  backend="online")`` (KeOps ``generic_logsumexp``, float32 accumulation);
* ``fastdpot``            -- :func:`fastdpot.sinkhorn.sinkhorn` with ``backend="auto"``, what a user gets by default.
  On CUDA, ``auto`` takes the dense engine while N·M ≤ 5000² (or ≤ 8192² for d ≥ 32) and KeOps above, so for every
  size here (N·M ≥ 10⁸) it **is** the ``keops`` backend (the row's ``backend`` field says which one ran; a separate
  ``fastdpot_keops`` row is added only where ``auto`` resolves to something else, e.g. in ``--smoke``);
* ``fastdpot_tensorized`` -- the dense torch engine (``backend="tensorized"``, the op's ``reference`` row), only
  where its (N, M) matrices fit comfortably (N·M ≤ 10⁸: two 400 MB cost matrices plus one work buffer).

Same work in every implementation: both libraries run the same symmetric, averaged log-domain Sinkhorn loop with
ε-scaling (GeomLoss' ``sinkhorn_loop``; fastdpot's ``reference.sinkhorn.sinkhorn_loop`` is written after it), and
both are given the same ``diameter`` D (the bounding-box diagonal of the data, computed once) and the same
``scaling`` s, hence the same ε list, from D² down to blur² (``epsilon_schedule``). s is chosen per case so that
the list has ``iterations - 2`` entries: with the initialisation and the final (differentiable) extrapolation
step, each library then makes exactly ``iterations`` (default 100) pairs of N×M soft-min reductions (f from g, g
from f) -- the work of 100 plain Sinkhorn iterations. The count is checked, not assumed: on the first (warm-up)
call of each implementation the soft-min calls are counted by wrapping the loop (``softmin_calls`` = 2 × 100).
fastdpot has no fixed-iteration mode at a single ε other than ``final_iters`` (extra iterations at blur², which
GeomLoss lacks), so the shared ε-scaling schedule is the common ground; per-iteration cost does not depend on ε
except through fastdpot's estimate-checked reduction (rows whose estimate is off are redone -- part of its time).
Known differences that stay: fastdpot's KeOps reduction accumulates in float64 and syncs once per soft-min for
that row check; GeomLoss copies 1/ε to the device for every soft-min. Values are reported (``value``,
``rel_diff_to_geomloss``) to show that the same problem was solved.

Inputs: x ~ N(0, I/d) (n rows), y ~ N(𝟙/√d, I/(4d)) (m = n rows): unit-scale clouds 1 apart in every d, so
ε/cost is comparable across d. Sizes: n = m ∈ {1e4, 5e4}, d ∈ {2, 64}; modes ``forward`` (inputs without grad)
and ``full`` (forward + backward, gradient w.r.t. x and y). Order (a ``--budget-s`` cut keeps the first):
forward d = 64 (n = 1e4, 5e4), forward d = 2, then the same in ``full``.
"""
from __future__ import annotations

import contextlib
import importlib
import math

import torch

CASE = "ot_eps"
ANCHORS = ["geomloss_online", "geomloss_tensorized"]
BLUR = 0.05
ITERATIONS = 100
#: the dense engines' size when no GPU is visible to plan with (:func:`dense_fits`)
DENSE_MAX = 10_000 * 10_000
_BACKEND_ARG = {"fastdpot": "auto", "fastdpot_keops": "keops", "fastdpot_tensorized": "tensorized"}


def plan(smoke=False, only=None, modes=("forward", "full")):
    """The (n, d, mode) cases in run order: forward d = 64, forward d = 2, then the same in full mode."""
    if smoke:
        pairs = [(200, 2), (160, 64)]
    elif only:
        pairs = only
    else:
        pairs = [(10_000, 64), (50_000, 64), (10_000, 2), (50_000, 2)]
    return [(n, d, mode) for mode in modes for n, d in pairs]


def inputs(n, m, d, device, seed=0):
    """x ~ N(0, I/d) (n, d) and y ~ N(1/√d, I/(4d)) (m, d), float32, on ``device``."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, d, device=device, generator=g) / math.sqrt(d)
    y = (0.5 * torch.randn(m, d, device=device, generator=g) + 1.0) / math.sqrt(d)
    return x, y


def diameter_of(x, y):
    """The bounding-box diagonal of x ∪ y (GeomLoss' and fastdpot's default ``diameter``)."""
    lo = torch.minimum(x.min(0).values, y.min(0).values)
    hi = torch.maximum(x.max(0).values, y.max(0).values)
    return float((hi - lo).norm())


def schedule_for(diameter, blur=BLUR, iterations=ITERATIONS):
    """(scaling, eps_list) with ``len(eps_list) == iterations - 2`` for ε-scaling from diameter² to blur².

    GeomLoss' ``epsilon_schedule`` (= fastdpot's) is [D², exp(arange(2 log D, 2 log blur, 2 log s))..., blur²]:
    k = ceil(log(D/blur) / log(1/s)) middle entries; log(1/s) = log(D/blur) / (k − ½) gives exactly k."""
    from fastdpot.reference.sinkhorn import epsilon_schedule

    k = iterations - 4  # middle entries; + the two ends = iterations - 2 ε values
    if k < 1:
        raise ValueError(f"iterations must be at least 5, got {iterations}")
    r = math.log(diameter / blur)
    if r <= 0:
        raise ValueError(f"the data's diameter {diameter:.3g} must exceed blur {blur}")
    for shift in (0.5, 0.25, 0.75):
        scaling = math.exp(-r / (k - 1 + shift))
        eps = epsilon_schedule(2, diameter ** 2, blur, scaling)
        if len(eps) == iterations - 2:
            return scaling, eps
    raise RuntimeError(f"no scaling gives {iterations - 2} ε values for diameter {diameter}")


def geomloss_schedule_len(diameter, scaling, blur=BLUR):
    """Length of GeomLoss' own ε list for these parameters (None when GeomLoss is not installed)."""
    try:
        from geomloss._legacy.sinkhorn_divergence import epsilon_schedule
    except ImportError:
        return None
    return len(epsilon_schedule(2, diameter, blur, scaling))


IMPLS = ("geomloss_online", "fastdpot", "fastdpot_keops", "geomloss_tensorized", "fastdpot_tensorized")


def anchor_of(impl):
    """The GeomLoss row an implementation is compared with: the dense engines with GeomLoss' dense engine
    (``backend="tensorized"``, no KeOps), the others with GeomLoss online (KeOps)."""
    return "geomloss_tensorized" if impl.endswith("_tensorized") else "geomloss_online"


def dense_fits(n, m, device):
    """Whether the dense engines run at n x m: every size on CPU (smoke sizes); on CUDA when about eight n x m float32
    matrices (cost, soft-min temporaries, gradients) fit in 80 % of the device's memory."""
    if device != "cuda":
        return True
    if not torch.cuda.is_available():  # planning without a GPU (tests): the size every current GPU holds
        return n * m <= DENSE_MAX
    return n * m * 4 * 8 <= 0.8 * torch.cuda.get_device_properties(0).total_memory


def impls_for(n, m, d, device, wanted=None):
    """[(impl, resolved backend)] of one case, anchor first; ``wanted``: a subset of ``IMPLS`` (None: all)."""
    from fastdpot.sinkhorn import select_backend

    auto = select_backend(n, m, d, device, "auto")
    out = [("geomloss_online", "keops"), ("fastdpot", auto)]
    if auto != "keops":
        out.append(("fastdpot_keops", "keops"))
    if dense_fits(n, m, device):
        out.append(("geomloss_tensorized", "tensorized"))
        if auto != "reference" or (wanted is not None and "fastdpot" not in wanted):  # else "fastdpot" is this row
            out.append(("fastdpot_tensorized", "reference"))
    return [(i, b) for i, b in out if wanted is None or i in wanted]


def make_impl(impl, diameter, scaling):
    """A callable (x, y) -> OT_ε for ``impl`` with the shared blur, diameter and scaling."""
    if impl.startswith("geomloss_"):
        from geomloss import SamplesLoss

        return SamplesLoss("sinkhorn", p=2, blur=BLUR, scaling=scaling, diameter=diameter, debias=False,
                           backend=impl[len("geomloss_"):])
    from fastdpot.sinkhorn import sinkhorn

    backend = _BACKEND_ARG[impl]
    return lambda x, y: sinkhorn(x, y, p=2, blur=BLUR, scaling=scaling, diameter=diameter, debias=False,
                                 backend=backend)


@contextlib.contextmanager
def count_softmins():
    """Count the soft-min reductions of fastdpot's and GeomLoss' Sinkhorn loops (wraps their ``sinkhorn_loop``)."""
    counter = [0]
    patched = []

    def wrap(loop):
        def wrapped(softmin, *args, **kwargs):
            def counted(*a, **k):
                counter[0] += 1
                return softmin(*a, **k)

            return loop(counted, *args, **kwargs)

        return wrapped

    for modname in ("fastdpot.ops.sinkhorn", "fastdpot.reference.sinkhorn", "geomloss._legacy.sinkhorn_samples"):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        orig = getattr(mod, "sinkhorn_loop", None)
        if orig is not None:
            setattr(mod, "sinkhorn_loop", wrap(orig))
            patched.append((mod, orig))
    try:
        yield counter
    finally:
        for mod, orig in patched:
            mod.sinkhorn_loop = orig
