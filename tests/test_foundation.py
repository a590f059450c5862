"""Foundation: the dispatch table, backend loading errors, argument validation, the env report."""
import math
import os
import subprocess
import sys

import pytest
import torch

import fastdpot
from fastdpot import _dispatch
from fastdpot._ext import BackendUnavailableError, cpp_status, load_cpp
from fastdpot._validate import (check_choice, check_delta, check_epsilon, check_finite_tensor, check_int,
                                check_nonnegative, check_positive, check_probability, check_same_dim, check_tensor)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- dispatch
@pytest.fixture
def op():
    """A throw-away op: reference always there, a 'cpu' backend that failed to load, an available 'keops'."""
    name = "_test_foundation_op"
    _dispatch.register(name, "reference")(lambda: "reference")
    _dispatch.register(name, "cpu", available=lambda: (False, "ImportError: no _C_x; run `pip install -e .`"))(
        lambda: "cpu")
    _dispatch.register(name, "keops")(lambda: "keops")
    yield name
    _dispatch._TABLE.pop(name, None)


def test_explicit_missing_backend_raises_naming_the_fix(op):
    with pytest.raises(BackendUnavailableError, match=r"pip install -e \."):
        _dispatch.dispatch(op, "cpu")
    with pytest.raises(BackendUnavailableError, match=r"no 'triton' backend.*implemented"):
        _dispatch.dispatch(op, "triton")


def test_auto_falls_back_and_respects_min_size(op):
    _dispatch.set_auto(op, "cpu", [("cpu", 0), ("keops", 1000)])
    assert _dispatch.dispatch(op, "auto", "cpu", size=10)[0] == "reference"  # cpu missing, keops too small
    name, fn = _dispatch.dispatch(op, "auto", "cpu", size=5000)
    assert (name, fn()) == ("keops", "keops")
    assert _dispatch.dispatch(op, "auto", "cuda", size=5000)[0] == "reference"  # no rule for cuda
    assert _dispatch.dispatch(op, "reference")[1]() == "reference"
    assert _dispatch.available_backends(op) == {"reference": (True, None), "keops": (True, None),
                                                "cpu": (False, "ImportError: no _C_x; run `pip install -e .`")}


def test_unknown_backend_and_op(op):
    with pytest.raises(ValueError, match="backend"):
        _dispatch.dispatch(op, "gpu")
    with pytest.raises(ValueError, match="backend"):
        _dispatch.register(op, "opencl")
    with pytest.raises(KeyError, match="unknown op"):
        _dispatch.dispatch("_no_such_op", "auto")


def test_op_without_reference_and_nothing_available():
    name = "_test_foundation_no_ref"
    _dispatch.register(name, "cpu", available=lambda: (False, "not built"))(lambda: None)
    try:
        with pytest.raises(BackendUnavailableError, match="no available backend"):
            _dispatch.dispatch(name, "auto")
    finally:
        _dispatch._TABLE.pop(name, None)


def test_missing_extension_errors_name_what_to_install():
    with pytest.raises(BackendUnavailableError, match=r"FASTDPOT_EXT=_definitely_missing"):
        load_cpp("_definitely_missing")
    ok, reason = cpp_status("_definitely_missing")
    assert not ok and "ModuleNotFoundError" in reason


def test_every_registered_op_has_a_working_reference():
    ops = _dispatch.registered_ops()
    for name in ops:
        if name.startswith("_test_"):
            continue
        avail = _dispatch.available_backends(name)
        assert avail.get("reference") == (True, None), f"op {name!r} has no reference backend"
        backend, fn = _dispatch.dispatch(name, "auto", "cpu", size=10)
        assert callable(fn) and avail[backend][0]


# ---------------------------------------------------------------- validation
def test_check_tensor():
    x = torch.randn(3, 4)
    assert check_tensor(x, "x", 2) is x
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        check_tensor([1.0], "x")
    with pytest.raises(ValueError, match=r"x must have 3 dimensions, got shape \(3, 4\)"):
        check_tensor(x, "x", 3)
    with pytest.raises(ValueError, match=r"x must not be empty, got shape \(0, 4\)"):
        check_tensor(torch.zeros(0, 4), "x")
    with pytest.raises(ValueError, match="x must be a floating-point tensor, got dtype torch.int64"):
        check_tensor(torch.ones(2, dtype=torch.int64), "x")
    with pytest.raises(ValueError, match="x must have dtype in"):
        check_tensor(x, "x", dtypes=(torch.float64,))
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[1, 2] = bad
        with pytest.raises(ValueError, match=r"x contains non-finite values"):
            check_tensor(y, "x")
    assert check_tensor(torch.full((2,), float("nan")), "x", finite=False).shape == (2,)
    assert check_finite_tensor(torch.ones(2, dtype=torch.int32), "i") is not None


@pytest.mark.parametrize("fn,value,match", [
    (check_positive, 0.0, "must be > 0"), (check_positive, -1, "must be > 0"),
    (check_positive, float("inf"), "must be > 0"), (check_positive, float("nan"), "must not be NaN"),
    (check_positive, True, "real number"), (check_positive, "1", "real number"),
    (check_nonnegative, -1e-9, ">= 0"), (check_nonnegative, float("inf"), ">= 0"),
    (check_probability, 0.0, r"\(0, 1\]"), (check_probability, 1.0 + 1e-12, r"\(0, 1\]"),
    (check_delta, 1.0, r"\(0, 1\)"), (check_delta, 0.0, r"\(0, 1\)"),
    (check_epsilon, 0.0, "> 0"), (check_epsilon, float("inf"), "> 0"),
    (check_int, 0, ">= 1"), (check_int, 2.0, "integer"), (check_int, True, "integer"),
])
def test_scalar_checks_raise_naming_argument_and_value(fn, value, match):
    with pytest.raises(ValueError, match=match) as err:
        fn(value, "arg_name")
    assert "arg_name" in str(err.value)
    if not (isinstance(value, float) and math.isnan(value)):
        assert repr(value) in str(err.value) or str(value) in str(err.value)


def test_scalar_checks_accept_valid_values():
    assert check_positive(2, "a") == 2.0 and isinstance(check_positive(2, "a"), float)
    assert check_probability(1.0, "q") == 1.0 and check_probability(0.0, "q", low_open=False) == 0.0
    assert check_delta(0.5) == 0.5 and check_epsilon(float("inf"), allow_inf=True) == math.inf
    assert check_int(5, "k") == 5 and check_int(0, "k", minimum=0) == 0 and check_nonnegative(0, "x") == 0.0
    assert check_choice("clt", "bound", ("clt", "bernstein")) == "clt"
    with pytest.raises(ValueError, match=r"bound must be one of \['clt', 'bernstein'\], got 'x'"):
        check_choice("x", "bound", ("clt", "bernstein"))
    assert check_same_dim(torch.zeros(2, 3), torch.zeros(5, 3), "x", "y") == 3
    with pytest.raises(ValueError, match="x and y must have the same dimension d, got 3 and 4"):
        check_same_dim(torch.zeros(2, 3), torch.zeros(5, 4), "x", "y")


# ---------------------------------------------------------------- random
def test_draw_seed_reproducible_and_in_range():
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    s1 = [fastdpot.draw_seed(g1) for _ in range(5)]
    assert s1 == [fastdpot.draw_seed(g2) for _ in range(5)]
    assert all(0 <= s < 2 ** 62 for s in s1) and len(set(s1)) == 5


# ---------------------------------------------------------------- env report
def test_env_report_runs():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-m", "fastdpot.env"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for needle in ("fastdpot 0.1.0", "install:", "versions:", "torch", "dp_accounting", "compiled extensions:",
                   "triton:", "keops:", "backends per op:", "caches:", "Triton cache"):
        assert needle in text, f"{needle!r} missing from the env report"
    for name in _dispatch.registered_ops():
        if not name.startswith("_test_"):
            assert name in text


class _FakeDist:
    def __init__(self, text):
        self.text = text

    def read_text(self, name):
        return self.text if name == "direct_url.json" else None


@pytest.mark.parametrize("url, editable, expect", [
    ("file:///no/such/clone", True, "no longer exists"),
    ("file://{other}", True, "but this interpreter imports"),
    ("file://{root}", True, "editable install of"),
    ("file://{root}", False, "installed from"),
    (None, None, "no pip install record"),
])
def test_env_install_location_flags_a_stale_editable_install(monkeypatch, tmp_path, url, editable, expect):
    import importlib.metadata as md
    import json

    from fastdpot import env as env_mod

    root = os.path.dirname(os.path.dirname(os.path.abspath(fastdpot.__file__)))
    if url is None:
        dists = [_FakeDist(None)]
    else:
        info = {"url": url.format(root=root, other=tmp_path), "dir_info": {"editable": editable}}
        dists = [_FakeDist(None), _FakeDist(json.dumps(info))]
    monkeypatch.setattr(md.Distribution, "discover", staticmethod(lambda **kw: iter(dists)))
    text = env_mod.install_location()
    assert expect in text
    assert text.startswith("WARNING") == (expect in ("no longer exists", "but this interpreter imports"))


# ---------------------------------------------------------------- import cost
# the main job's old import paths: thin modules that re-export fastdpot.experiments's public names
def test_import_loads_no_application_module_and_the_old_paths_are_gone():
    # `import fastdpot` is the library only; the applications (fastdpot.experiments: data, auto-encoders, metrics,
    # pipeline, CLI, ...) load when imported; the old alias modules no longer exist
    import importlib

    code = ("import sys, fastdpot; print(' '.join(sorted(m for m in sys.modules if m.startswith('fastdpot'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert not {m for m in loaded if m.startswith("fastdpot.experiments")}, sorted(loaded)
    for old in ("fastdpot.mainjob", "fastdpot.pipeline", "fastdpot.metrics", "fastdpot.cli", "fastdpot.data",
                "fastdpot.autoencoder", "fastdpot.baselines", "fastdpot.tuning", "fastdpot.flow",
                "fastdpot.distributed", "fastdpot.distributed_jobs", "fastdpot.label_flow", "fastdpot.class_flow"):
        with pytest.raises(ImportError):
            importlib.import_module(old)
    with pytest.raises(AttributeError):
        fastdpot.no_such_name


def test_the_top_level_namespace_is_the_public_api():
    assert sorted(set(fastdpot.__all__)) == sorted(fastdpot.__all__)
    for name in fastdpot.__all__:
        assert hasattr(fastdpot, name), name
    # in a fresh interpreter, `import fastdpot` binds nothing but the API and the subpackages it lives in
    code = "import fastdpot; print(' '.join(k for k in vars(fastdpot) if not k.startswith('_')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    public = set(out.stdout.split())
    submodules = {"sliced", "flows", "privacy", "sinkhorn", "ops", "reference"}
    assert public - set(fastdpot.__all__) <= submodules, sorted(public - set(fastdpot.__all__) - submodules)
    for internal in ("dispatch", "pipeline", "cli", "data", "mainjob", "MainJobConfig", "run_pipeline"):
        assert internal not in fastdpot.__all__ and not hasattr(fastdpot, internal), internal


# ---------------------------------------------------------------- API: errors at construction, budget errors
def test_bad_arguments_fail_at_construction():
    from fastdpot.sinkhorn import SinkhornLoss

    with pytest.raises(ValueError, match="backend"):
        fastdpot.SlicedWassersteinLoss(10, backend="bogus")
    with pytest.raises(ValueError, match="scaling"):
        SinkhornLoss(scaling=2.0)
    with pytest.raises(ValueError, match="scaling"):
        SinkhornLoss(scaling=True)


def test_budget_exhaustion_raises_budget_exceeded_error():
    from fastdpot.privacy import BudgetExceededError

    x = torch.randn(50, 3)
    loss = fastdpot.DPSlicedWassersteinLoss.from_privacy(10.0, 1e-5, 10, 50, 2, 4, 3, 1.0)
    y = torch.randn(10, 3)
    loss(y, private=x[:10])
    loss(y, private=x[10:20])
    with pytest.raises(BudgetExceededError, match="nothing was released"):
        loss(y, private=x[20:30])
    assert loss.releases == 2
    flow = fastdpot.DPSlicedWassersteinFlow(20, 3, 3, 0.5, noise_multiplier=2.0, batch_size=10, steps=1)
    flow.step(x[:10])
    with pytest.raises(BudgetExceededError, match="planned 1 private steps"):
        flow.step(x[:10])
    assert flow.steps_taken == 1


def test_import_leaves_heavy_optional_modules_unloaded():
    # dp-accounting (~1.2 s), scipy.optimize/stats (~1 s) and Triton (~0.3 s) load on first use, not with the package
    code = ("import sys, fastdpot, fastdpot.privacy; "
            "print(' '.join(m for m in ('dp_accounting', 'scipy.optimize', 'scipy.stats', 'triton') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [], out.stdout
    # and they are there when used: the accountant, the calibration and the orders still work
    from fastdpot.privacy import DEFAULT_ORDERS, PrivacyAccountant
    assert DEFAULT_ORDERS[:3] == (1.01, 1.02, 1.05)
    acc = PrivacyAccountant("rdp")
    acc.step(1.0, sample_rate=0.01, num_steps=10)
    assert 0 < acc.get_epsilon(1e-5) < 10
