"""The ops as PyTorch custom ops (issue 40.7, :mod:`fastdpot.ops.library`): ``torch.ops.fastdpot`` holds the losses'
and the flow step's kernels, each passes ``torch.library.opcheck`` (schema, fake kernel, autograd registration, AOT
dispatch with dynamic shapes), gives the eager op's values and gradients, and a training step with both losses
compiles with ``fullgraph=True`` and the default inductor backend with no graph break, drawing a fresh secret key at
every call and every release."""
import math
import os

import pytest
import torch

import fastdpot
from fastdpot import _dispatch
from fastdpot import sliced as S
from fastdpot._ext import cpp_status
from fastdpot.ops import flow_step, library
from fastdpot.ops.sliced_wasserstein import sliced_wasserstein_op

HAS_CPP = cpp_status("sliced")[0] and cpp_status("flow")[0]
needs_cpp = pytest.mark.skipif(not HAS_CPP, reason="C++ extensions fastdpot._C_sliced / _C_flow not built")
TRITON = os.environ.get("TRITON_INTERPRET", "0") == "1"  # the Triton kernels on CPU tensors (the interpreter)
needs_triton = [pytest.mark.triton, pytest.mark.skipif(not TRITON, reason="the triton rows need TRITON_INTERPRET=1")]
#: the loss op's kernels (the fused backends); the reference runs eagerly
FUSED = [pytest.param("cpu", marks=needs_cpp), pytest.param("triton", marks=needs_triton)]
BACKENDS = ["reference", pytest.param("cpu", marks=needs_cpp)]
F64 = torch.float64


def _data(n=23, m=17, d=3, k=6, dtype=F64, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=F64).to(dtype).requires_grad_(grad)
    y = (torch.randn(m, d, generator=g, dtype=F64) * 1.3 + 0.4).to(dtype).requires_grad_(grad)
    th = S.random_projections(k, d, g, dtype=dtype)
    return x, y, th


def _key(v=123456789):
    return torch.tensor(v, dtype=torch.int64)


# ------------------------------------------------------------------------------------------------ registration
def test_torch_ops_fastdpot_holds_the_ops():
    for name in ("sliced_wasserstein", "clip_rows", "privacy_draws", "flow_step"):
        assert hasattr(torch.ops.fastdpot, name), name
    assert library.OPS == ("sliced_wasserstein", "clip_rows", "privacy_draws", "flow_step")
    schema = str(torch.ops.fastdpot.sliced_wasserstein.default._schema)
    assert "Tensor key" in schema and "-> (Tensor, Tensor, Tensor)" in schema
    assert torch.Tag.nondeterministic_seeded in torch.ops.fastdpot.privacy_draws.default.tags


def test_importing_fastdpot_imports_neither_dynamo_nor_triton():
    """The ops register with torch.library alone; the backend resolution carries the marker of
    torch.compiler.assume_constant_result without importing Dynamo, and that marker is still the one torch sets."""
    import subprocess
    import sys

    code = "import sys, fastdpot, torch; print('torch._dynamo' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
    marked = torch.compiler.assume_constant_result(lambda: 0)
    assert marked._dynamo_marked_constant is True and library.fused_backend._dynamo_marked_constant is True
    assert _dispatch.auto_thresholds._dynamo_marked_constant is True


# ------------------------------------------------------------------------------------------------ opcheck
@pytest.mark.parametrize("backend", FUSED)
@pytest.mark.parametrize("sketch_bins", [None, 4])
def test_opcheck_sliced_wasserstein(backend, sketch_bins):
    x, y, th = _data()
    args = (x, y, th, 2, 0.3, _key(), sketch_bins, False, backend, sketch_bins is None, True)
    torch.library.opcheck(torch.ops.fastdpot.sliced_wasserstein.default, args)
    x2, y2, _ = _data(grad=False)  # no gradient asked: (0, d) placeholders
    loss, gx, gy = torch.ops.fastdpot.sliced_wasserstein(x2, y2, th, 1, 0.0, _key(0), sketch_bins, False, backend,
                                                         False, False)
    assert loss.shape == () and gx.shape == (0, 3) and gy.shape == (0, 3)


def test_opcheck_clip_rows_privacy_draws_and_flow_step():
    x, _, th = _data()
    big = (x.detach() * 3).requires_grad_(True)  # some rows above the radius, some below
    torch.library.opcheck(torch.ops.fastdpot.clip_rows.default, (big, 2.0))
    # a random op: its outputs differ between runs, so only the checks that compare no values
    torch.library.opcheck(torch.ops.fastdpot.privacy_draws.default, (x.detach(), 5, True),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    for quantiles, extra in (("exact", {}), ("histogram", {"histogram_bins": 8})):
        args = (x.detach(), x.detach()[:9] * 0.5, th, None, None, 0.4, 0.5, 0.1, _key(), quantiles, None,
                extra.get("histogram_bins"), "auto")
        torch.library.opcheck(torch.ops.fastdpot.flow_step.default, args)
    table = torch.linspace(-1, 1, 5, dtype=F64).repeat(6, 1)
    levels = torch.linspace(0, 1, 5, dtype=F64)
    torch.library.opcheck(torch.ops.fastdpot.flow_step.default,
                          (x.detach(), None, th, table, levels, 0.0, 0.5, 0.0, _key(), "exact", None, None, "auto"))


# ------------------------------------------------------------------------------------------------ the eager op's values
@pytest.mark.parametrize("backend", FUSED)
@pytest.mark.parametrize("p", [1, 2])
def test_the_op_gives_the_eager_ops_values_and_gradients(backend, p):
    x, y, th = _data(dtype=torch.float32 if p == 1 else F64, seed=p)
    w = torch.tensor(0.7)  # an upstream gradient that is not 1
    for sketch_bins in (None, 5):
        got = library.keyed_sliced_wasserstein(x, y, th, p, 0.4, _key(77), sketch_bins=sketch_bins, backend=backend)
        want = sliced_wasserstein_op(x, y, th, p, 0.4, 77, backend=backend, sketch_bins=sketch_bins)
        sides = (y,) if sketch_bins else (x, y)
        g_got = torch.autograd.grad(got * w, sides)
        g_want = torch.autograd.grad(want * w, sides)
        assert float(got.detach()) == float(want.detach())
        for a, b in zip(g_got, g_want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_clip_rows_op_matches_the_privacy_core_with_its_gradient():
    from fastdpot.privacy import clip_rows

    g = torch.Generator().manual_seed(4)
    x = (torch.randn(9, 4, generator=g, dtype=F64) * 2).requires_grad_(True)
    torch.testing.assert_close(library.clip_rows(x, 2.0), clip_rows(x, 2.0), rtol=0, atol=0)
    up = torch.randn(9, 4, generator=g, dtype=F64)
    (got,) = torch.autograd.grad(library.clip_rows(x, 2.0), x, up)
    (want,) = torch.autograd.grad(clip_rows(x, 2.0), x, up)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: library.clip_rows(t, 2.0), (x,))
    with pytest.raises(ValueError, match="non-finite"):
        library.clip_rows(torch.full((2, 2), math.nan, dtype=F64), 1.0)


def test_privacy_draws_are_unit_fresh_and_62_bits():
    like = torch.zeros(5, 4, dtype=torch.float32)
    th, key = library.privacy_draws(like, 9, True)
    assert th.shape == (9, 4) and th.dtype == torch.float32 and key.dtype == torch.int64
    torch.testing.assert_close(th.double().norm(dim=1), torch.ones(9, dtype=F64), rtol=0, atol=1e-6)
    torch.testing.assert_close(th[:4].double() @ th[:4].double().T, torch.eye(4, dtype=F64), rtol=0, atol=1e-6)
    th2, key2 = library.privacy_draws(like, 9, True)
    assert int(key) != int(key2) and not torch.equal(th, th2) and 0 <= int(key) < 2 ** 62
    none, _ = library.privacy_draws(like, 0, False)
    assert none.shape == (0, 4)


def test_the_op_checks_values_when_it_runs():
    x, y, th = _data(grad=False)
    bad = x.clone()
    bad[1, 2] = math.inf
    with pytest.raises(ValueError, match="non-finite"):
        library.keyed_sliced_wasserstein(bad, y, th, 2, 0.1, _key())
    with pytest.raises(ValueError, match="unit-norm"):
        library.keyed_sliced_wasserstein(x, y, th * 2, 2, 0.1, _key())
    with pytest.raises(ValueError, match="key"):
        library.keyed_sliced_wasserstein(x, y, th, 2, 0.1, torch.tensor(-1))
    with pytest.raises(ValueError, match="sketch_bins"):
        library.keyed_sliced_wasserstein(x, y, th, 2, 0.1, _key(), sketch_bins=99)
    with pytest.raises(fastdpot.BackendUnavailableError, match="fused"):  # the reference is the eager oracle
        library.keyed_sliced_wasserstein(x, y, th, 2, 0.1, _key(), backend="reference")


# ------------------------------------------------------------------------------------------------ torch.compile
def _generator_and_data(seed=0):
    torch.manual_seed(seed)
    gen = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(32, 4, generator=g, dtype=F64)
    public = torch.randn(24, 3, generator=g, dtype=F64)
    private = torch.randn(20, 3, generator=g, dtype=F64) * 2
    return gen, z, public, private


def test_a_training_step_with_both_losses_compiles_with_no_graph_break():
    """fullgraph=True with the default (inductor) backend: the step is one graph; the explanation counts 0 breaks;
    the compiled step's loss and gradients are the eager step's (given directions, σ = 0), and with noise every call
    draws a fresh secret key (two calls differ, the same graph twice differs)."""
    gen, z, public, private = _generator_and_data()
    th = S.random_projections(16, 3, torch.Generator().manual_seed(1), dtype=F64)

    def step(z, public, private, noise_std):
        y = gen(z)
        return (fastdpot.sliced_wasserstein(y, public, num_projections=50)
                + fastdpot.dp_sliced_wasserstein(y, private=private, noise_std=noise_std, clip_radius=1.5,
                                                 num_projections=20))

    explained = torch._dynamo.explain(step)(z, public, private, 0.5)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons

    def given(z, public, private):  # the same step along given directions, no noise: deterministic
        y = gen(z)
        return (fastdpot.sliced_wasserstein(y, public, projections=th)
                + fastdpot.dp_sliced_wasserstein(y, private=private, noise_std=0.0, clip_radius=1.5,
                                                 projections=th))

    torch._dynamo.reset()
    compiled = torch.compile(given, fullgraph=True)  # backend "inductor", the default
    loss = compiled(z, public, private)
    grads = torch.autograd.grad(loss, list(gen.parameters()))
    want = given(z, public, private)
    want_grads = torch.autograd.grad(want, list(gen.parameters()))
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    noisy = torch.compile(step, fullgraph=True)
    first, second = noisy(z, public, private, 0.5), noisy(z, public, private, 0.5)
    assert float(first) != float(second) and math.isfinite(float(first))
    first.backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in gen.parameters())


def test_two_releases_in_one_graph_draw_their_own_keys():
    _, _, public, private = _generator_and_data(3)
    th = S.random_projections(8, 3, torch.Generator().manual_seed(2), dtype=F64)

    def two(y, x):
        a = fastdpot.dp_sliced_wasserstein(y, private=x, noise_std=0.5, clip_radius=1.0, projections=th)
        b = fastdpot.dp_sliced_wasserstein(y, private=x, noise_std=0.5, clip_radius=1.0, projections=th)
        return a, b

    torch._dynamo.reset()
    a, b = torch.compile(two, fullgraph=True, backend="aot_eager")(public, private)
    assert float(a) != float(b)  # not one draw shared by both (the draws are not merged or baked in)


def test_compiled_checks_and_eager_features():
    _, _, public, private = _generator_and_data(5)
    torch._dynamo.reset()
    loss = torch.compile(lambda y, x: fastdpot.dp_sliced_wasserstein(y, private=x, noise_std=0.5, clip_radius=1.0,
                                                                     num_projections=4),
                         fullgraph=True, backend="aot_eager")
    bad = private.clone()
    bad[0, 0] = math.nan
    with pytest.raises(Exception, match="non-finite"):  # the op's kernel checks the values when the graph runs
        loss(public, bad)
    with pytest.raises(Exception, match="clip_radius"):  # argument checks run while tracing
        torch.compile(lambda y, x: fastdpot.dp_sliced_wasserstein(y, private=x, noise_std=0.5, num_projections=4),
                      fullgraph=True, backend="aot_eager")(public, private)
    # return_noise is a replay feature: eager, at a graph break (so not under fullgraph=True)
    out = torch.compile(lambda y, x: fastdpot.dp_sliced_wasserstein(y, private=x, noise_std=0.5, clip_radius=1.0,
                                                                    num_projections=4, return_noise=True),
                        backend="aot_eager")(public, private)
    assert len(out) == 3 and out[1].shape == (20, 4) and out[2].shape == (24, 4)


def test_the_reference_backend_runs_eagerly_at_a_graph_break():
    """backend='reference' is torch autograd through the sorts (it also differentiates w.r.t. the directions): a
    compiled call runs it eagerly, at a graph break, with the eager value and gradients."""
    _, _, public, private = _generator_and_data(8)
    th = S.random_projections(6, 3, torch.Generator().manual_seed(3), dtype=F64).requires_grad_(True)

    def run(y, x):
        return 2 * fastdpot.sliced_wasserstein(y * 1.0, x, projections=th, backend="reference")

    y = public.clone().requires_grad_(True)
    want = run(y, private)
    want_g = torch.autograd.grad(want, (y, th))
    assert torch._dynamo.explain(run)(y, private).graph_break_count >= 1
    torch._dynamo.reset()
    got = torch.compile(run, backend="aot_eager")(y, private)
    for a, b in zip(torch.autograd.grad(got, (y, th)), want_g):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert float(got.detach()) == float(want.detach())


def test_a_replayable_generator_is_drawn_eagerly_at_a_graph_break():
    """A torch.Generator cannot enter a graph: its draws are made eagerly (one graph break, so no fullgraph), and the
    compiled function gives the eager function's value for the same generator state."""
    _, _, public, private = _generator_and_data(6)

    def run(y, x, seed):
        return 2 * fastdpot.dp_sliced_wasserstein(y * 1.0, private=x, noise_std=0.5, clip_radius=1.0,
                                                  num_projections=6, secure_mode=False,
                                                  generator=torch.Generator().manual_seed(seed))

    want = run(public, private, 11)
    explained = torch._dynamo.explain(run)(public, private, 11)
    assert explained.graph_break_count >= 1
    torch._dynamo.reset()
    got = torch.compile(run, backend="aot_eager")(public, private, 11)
    assert float(got) == pytest.approx(float(want), rel=1e-12)


# issue 46: a last batch of another size. Dynamo's automatic dynamic shapes compile the second size with symbolic
# batch sizes (SymInt) and reuse that graph for the third; dynamic=True makes them symbolic from the first call.
# One compiled function per test, reused across the sizes (compiling is the slow part); aot_eager runs the fake
# kernels and AOT autograd with the symbolic sizes, as inductor does.
DYNAMIC = [pytest.param(None, id="automatic"), pytest.param(True, id="dynamic=True")]
SIZES = ((16, 19, 14), (12, 15, 10), (9, 11, 7))  # (generated N, public, private M) of three batches


@needs_cpp
@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_both_losses_compile_over_three_batch_sizes_with_no_graph_break(dynamic):
    """fullgraph=True over three batch sizes of every side: the losses along given directions (σ = 0) give the eager
    values and gradients, the private releases (points, sketch, orthogonal directions) run with fresh secret draws,
    and the third size compiles nothing (main: Unsupported assume_constant_result ... fused_backend at the second
    graph, or at once with dynamic=True)."""
    th = S.random_projections(8, 3, torch.Generator().manual_seed(1), dtype=F64)

    def step(y, y2, public, private):  # y2: a copy of y, so that one backward gives each sum's gradient
        given = (fastdpot.sliced_wasserstein(y, public, projections=th)
                 + fastdpot.dp_sliced_wasserstein(y, private=private, noise_std=0.0, clip_radius=1.5, projections=th))
        noisy = (fastdpot.sliced_wasserstein(y2, public, num_projections=6, p=1)
                 + fastdpot.dp_sliced_wasserstein(y2, private=private, noise_std=0.5, clip_radius=1.5,
                                                  num_projections=6)
                 + fastdpot.dp_sliced_wasserstein(y2, private=private, noise_std=0.5, clip_radius=1.5,
                                                  num_projections=5, release="sketch", sketch_bins=3)
                 + fastdpot.dp_sliced_wasserstein(y2, private=private, noise_std=0.5, clip_radius=1.5,
                                                  num_projections=4, directions="orthogonal"))
        return given, noisy

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    g = torch.Generator().manual_seed(2)
    for i, (n, m_pub, m_priv) in enumerate(SIZES):
        y = torch.randn(n, 3, generator=g, dtype=F64).requires_grad_(True)
        y2 = y.detach().clone().requires_grad_(True)
        public = torch.randn(m_pub, 3, generator=g, dtype=F64)
        private = torch.randn(m_priv, 3, generator=g, dtype=F64) * 2
        # automatic dynamic shapes recompile once, at the second size; the third (and dynamic=True's second) reuse
        with torch._dynamo.config.patch(error_on_recompile=i >= (1 if dynamic else 2)):
            given, noisy = compiled(y, y2, public, private)
        g_given, g_noisy = torch.autograd.grad(given * 0.7 + noisy, (y, y2))
        want = step(y, y2, public, private)[0]
        (g_want,) = torch.autograd.grad(want * 0.7, y)
        torch.testing.assert_close(given.detach(), want.detach(), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(g_given, g_want, rtol=1e-10, atol=1e-14)
        assert g_noisy.shape == (n, 3) and math.isfinite(float(noisy.detach())) and bool(torch.isfinite(g_noisy).all())


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_the_flow_step_compiles_over_three_sizes(dynamic):
    """The op flow_step over three sizes of the particles and the private rows (a guard against the losses'
    problem: it passed on main too): the eager step's values, no recompilation after the dynamic graph."""
    g = torch.Generator().manual_seed(7)
    th = S.random_projections(5, 3, g, dtype=torch.float32)

    def step(parts, priv, key):
        return flow_step(parts, priv, th, noise_std=0.5, step_size=0.5, diffusion=0.1, seed=key,
                         quantiles="histogram", histogram_bins=6)[0]

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for i, (n, m) in enumerate(((40, 15), (33, 12), (27, 20))):
        parts, priv = torch.randn(n, 3, generator=g), torch.randn(m, 3, generator=g)
        with torch._dynamo.config.patch(error_on_recompile=i >= (1 if dynamic else 2)):
            got = compiled(parts, priv, _key(9 + i))
        want = flow_step(parts, priv, th, noise_std=0.5, step_size=0.5, diffusion=0.1, seed=9 + i,
                         quantiles="histogram", histogram_bins=6)[0]
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_the_flow_steps_eager_features_are_refused_under_compile():
    """``out=`` and ``error_if_nonfinite=`` (a flow's double buffer, eager) are refused while tracing, as direction
    blocks and domain are: the custom op has no out argument."""
    g = torch.Generator().manual_seed(8)
    th = S.random_projections(5, 3, g, dtype=torch.float32)
    parts, priv = torch.randn(40, 3, generator=g), torch.randn(15, 3, generator=g)
    for extra in (dict(out=torch.empty(40, 3)), dict(error_if_nonfinite=True)):
        torch._dynamo.reset()
        compiled = torch.compile(lambda a, b: flow_step(a, b, th, noise_std=0.5, step_size=0.5, **extra)[0],
                                 fullgraph=True, backend="aot_eager")
        with pytest.raises(Exception, match="out and error_if_nonfinite are not supported under torch.compile"):
            compiled(parts, priv)


def test_size_class_keeps_the_auto_choice_and_guards_on_thresholds_only(monkeypatch):
    """_dispatch.size_class: a plain size with the same auto choice as a (symbolic) size; compiled with
    dynamic=True, sizes on one side of a threshold share a graph and crossing it recompiles."""
    monkeypatch.setattr(_dispatch, "_TABLE", dict(_dispatch._TABLE))
    _dispatch.register("_test_sizes", "reference")(lambda: "reference")
    _dispatch.register("_test_sizes", "cpu")(lambda: "cpu")
    _dispatch.register("_test_sizes", "keops")(lambda: "keops")
    _dispatch.set_auto("_test_sizes", "cpu", [("keops", 20), ("cpu", 8)])
    assert _dispatch.auto_thresholds("_test_sizes", "cpu") == (8, 20)
    assert _dispatch.auto_thresholds("_test_sizes", "cuda") == () == _dispatch.auto_thresholds("sliced_wasserstein",
                                                                                                 "cpu")
    for size in (0, 7, 8, 19, 20, 10 ** 9):
        cls = _dispatch.size_class("_test_sizes", "cpu", size)
        assert cls <= size and (_dispatch.dispatch("_test_sizes", device_type="cpu", size=cls)[0]
                                == _dispatch.dispatch("_test_sizes", device_type="cpu", size=size)[0])
    compiles = []

    def count(gm, inputs):
        compiles.append(1)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(lambda x: x * _dispatch.size_class("_test_sizes", "cpu", x.shape[0]), backend=count,
                      dynamic=True, fullgraph=True)
    for n, cls in ((10, 8), (12, 8), (15, 8), (25, 20), (30, 20)):
        assert float(f(torch.ones(n))[0]) == cls
    assert len(compiles) == 2  # one graph per class, not per size


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_flow_step_compiles_with_its_key_as_an_input(backend):
    g = torch.Generator().manual_seed(7)
    parts, priv = torch.randn(40, 3, generator=g), torch.randn(15, 3, generator=g)
    th = S.random_projections(5, 3, g, dtype=torch.float32)

    def step(parts, priv, key):
        return flow_step(parts, priv, th, noise_std=0.5, step_size=0.5, diffusion=0.1, seed=key, backend=backend)[0]

    explained = torch._dynamo.explain(step)(parts, priv, _key(9))
    assert explained.graph_break_count == 0
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    want = flow_step(parts, priv, th, noise_std=0.5, step_size=0.5, diffusion=0.1, seed=9, backend=backend)[0]
    torch.testing.assert_close(compiled(parts, priv, _key(9)), want, rtol=0, atol=0)
    assert not torch.equal(compiled(parts, priv, _key(10)), want)  # a new key, no recompilation needed


def test_the_dp_loss_module_counts_its_releases_under_compile_without_recompiling():
    """The module's counter is Python state: under torch.compile it is checked and counted eagerly (one graph break)
    before the graph's release, so the budget still refuses release T + 1 and the calls do not recompile (after the
    second, which meets the eager helper made by the first)."""
    _, _, public, private = _generator_and_data(9)
    crit = fastdpot.DPSlicedWassersteinLoss.from_privacy(5.0, 1e-5, 20, 200, 4, 8, 3, clip_radius=1.0)
    torch._dynamo.reset()
    step = torch.compile(lambda y, x: crit(y, private=x), backend="aot_eager")
    step(public, private)
    step(public, private)
    with torch._dynamo.config.patch(error_on_recompile=True):
        values = [float(step(public, private)) for _ in range(2)]
    assert crit.releases == 4 and values[0] != values[1]
    with pytest.raises(fastdpot.BudgetExceededError):
        step(public, private)
    assert crit.releases == 4
