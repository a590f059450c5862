"""Bad input refused up front with a message naming the argument, and ecosystem conventions (GeomLoss' SamplesLoss,
POT's sliced names). Issue 17."""
import math

import pytest
import torch

import fastdpot as F
from fastdpot import privacy as P
from fastdpot.ops import flow_step
from fastdpot.sinkhorn import select_backend, sinkhorn
from fastdpot.sliced import random_projections

META = torch.empty(8, 3, device="meta")
CPU = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
LABELS = torch.zeros(8, dtype=torch.long)


def _theta(k=2, d=3, dtype=torch.float32):
    return random_projections(k, d, generator=torch.Generator().manual_seed(1), dtype=dtype)


# every public tensor API, with the meta tensor in the slot named by the second element
META_CASES = {
    "sliced_wasserstein": (lambda: F.sliced_wasserstein(META, CPU, num_projections=4), "x"),
    "sliced_wasserstein_y": (lambda: F.sliced_wasserstein(CPU, META, num_projections=4), "y"),
    "dp_sliced_wasserstein": (lambda: F.dp_sliced_wasserstein(CPU, private=META, noise_std=0.1, num_projections=4), "private"),
    "SlicedWassersteinLoss": (lambda: F.SlicedWassersteinLoss(4)(META, CPU), "x"),
    "DPSlicedWassersteinLoss": (lambda: F.DPSlicedWassersteinLoss(0.1, 4, clip_radius=1.0)(CPU, private=META),
                                "private"),
    "sinkhorn": (lambda: sinkhorn(META, CPU), "x"),
    "SinkhornLoss": (lambda: F.SinkhornLoss()(CPU, META), "y"),
    "semi_debiased_sinkhorn_loss": (lambda: F.semi_debiased_sinkhorn_loss(META, None, CPU, 0.0), "fake"),
    "entropic_wasserstein": (lambda: F.entropic_wasserstein(META, CPU), "x"),
    "flow_step": (lambda: flow_step(META, CPU, _theta(), noise_std=0.1, step_size=0.5), "particles"),
    "flow.step": (lambda: F.DPSlicedWassersteinFlow(10, 3, 4, 0.5).step(META), "private_batch"),
    "flow.run": (lambda: F.DPSlicedWassersteinFlow(10, 3, 4, 0.5).run(META, steps=1, progress=False),
                 "private_data"),
    "flow init": (lambda: F.DPSlicedWassersteinFlow(8, 3, 4, 0.5, init=META), "init"),
    "ClassConditionalFlow.run": (lambda: F.ClassConditionalFlow(10, 3, 4, 0.5, num_classes=2).run(META, LABELS, steps=1,
                                                                                  progress=False), "private_data"),
    "clip_rows": (lambda: P.clip_rows(META, 1.0), "x"),
    "sliced_quantile_sketch": (lambda: P.sliced_quantile_sketch(META, _theta(dtype=torch.float64), 2, 0.1,
                                                                clip_radius=1.0), "x_private"),
    "class_conditional": (lambda: F.sinkhorn.class_conditional(META, LABELS, 2), "x"),
    "laplace_local_mechanism": (lambda: P.laplace_local_mechanism(META, 1.0, 1.0), "x"),
    "gaussian_local_mechanism": (lambda: P.gaussian_local_mechanism(META, 1.0, 1e-5, 1.0), "x"),
}


@pytest.mark.parametrize("case", sorted(META_CASES))
def test_meta_tensor_refused_naming_the_argument(case):
    fn, name = META_CASES[case]
    with pytest.raises(ValueError, match=rf"^{name} is on device 'meta'"):
        fn()


# ------------------------------------------------------------------------------------------ construction checks
@pytest.mark.parametrize("kw,name", [(dict(accountant="bogus"), "accountant"), (dict(backend="bogus"), "backend")])
def test_flow_checks_accountant_and_backend_at_construction(kw, name):
    with pytest.raises(ValueError, match=name):
        F.DPSlicedWassersteinFlow(10, 2, 5, 0.5, **kw)


@pytest.mark.parametrize("kw,pattern", [(dict(target_epsilon=-1), "target_epsilon"),
                                        (dict(accountant="bogus"), "accountant"),
                                        (dict(target_epsilon=1.0, steps=10), "batch_size or sample_rate")])
def test_class_conditional_flow_checks_flow_kwargs_at_construction(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        F.ClassConditionalFlow(10, 2, 5, 0.5, num_classes=2, **kw)
    with pytest.raises(TypeError, match="bogus_kw"):
        F.ClassConditionalFlow(10, 2, 5, 0.5, num_classes=2, bogus_kw=1)


# ------------------------------------------------------------------------------------------------- flow_step
@pytest.mark.parametrize("kw,pattern", [(dict(seed=1.5), "seed must be an integer"),
                                        (dict(seed=2 ** 70), r"seed must be in \[0, 2\*\*63\)"),
                                        (dict(seed=-1), r"seed must be in \[0, 2\*\*63\)"),
                                        (dict(scale=2.0), "projections must have unit-norm rows")])
def test_flow_step_refuses_bad_seed_and_non_unit_projections(kw, pattern):
    th = _theta() * kw.pop("scale", 1.0)
    with pytest.raises(ValueError, match=pattern):
        flow_step(CPU, CPU, th, noise_std=0.1, step_size=0.5, **kw)


def test_float32_normalised_projections_accepted_in_float64():
    d = 300
    th = random_projections(50, d, generator=torch.Generator().manual_seed(2), dtype=torch.float32)
    th = (th / th.norm(dim=1, keepdim=True)).double()  # normalised in float32, then cast
    assert float((th.norm(dim=1) - 1).abs().max()) > 1e-10  # the old float64 tolerance refused it
    g = torch.Generator().manual_seed(3)
    x = torch.randn(20, d, generator=g, dtype=torch.float64)
    y = torch.randn(30, d, generator=g, dtype=torch.float64)
    ref = F.sliced_wasserstein(x, y, projections=th / th.norm(dim=1, keepdim=True), backend="reference")
    got = F.sliced_wasserstein(x, y, projections=th, backend="reference")
    assert torch.allclose(got, ref, rtol=1e-5)
    flow_step(x, y, th, noise_std=0.0, step_size=0.5)
    with pytest.raises(ValueError, match="unit-norm"):
        F.sliced_wasserstein(x, y, projections=th * 1.001)


def test_generator_of_the_wrong_type_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        F.sliced_wasserstein(CPU, CPU, num_projections=3, generator=0)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        random_projections(3, 3, generator=0)


# ---------------------------------------------------------------------------------------------------- overflow
def test_sliced_overflow_of_float32_is_named():
    with pytest.raises(ValueError, match="overflows torch.float32"):
        F.sliced_wasserstein(CPU * 1e30, CPU, num_projections=4, backend="reference")
    with pytest.raises(ValueError, match="overflows torch.float32"):
        F.sliced_wasserstein(CPU * 1e30, CPU, num_projections=4)
    assert torch.isfinite(F.sliced_wasserstein(CPU.double() * 1e30, CPU.double(), num_projections=4))  # fits in float64


def test_sinkhorn_overflow_of_the_dtype_is_named():
    with pytest.raises(ValueError, match="overflows torch.float32"):
        sinkhorn(CPU * 1e30, CPU)
    with pytest.raises(ValueError, match="overflows torch.float64"):
        sinkhorn(CPU.double() * 1e300, CPU.double())


def test_semi_debiased_fake_extra_of_another_dimension_is_named():
    fake = torch.randn(8, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="fake and fake_extra must have the same dimension d"):
        F.semi_debiased_sinkhorn_loss(fake, torch.randn(4, 2, dtype=torch.float64), fake, 0.5)
    with pytest.raises(ValueError, match="fake and real must have the same dimension d"):
        F.semi_debiased_sinkhorn_loss(fake, None, torch.randn(4, 2, dtype=torch.float64), 0.0)


# ------------------------------------------------------------------------------------------------- accounting
def test_unreachable_calibration_targets_say_why():
    with pytest.raises(ValueError, match=r"target_epsilon=1000000.0 is unreachable.*no privacy"):
        P.calibrate_noise_multiplier(1e6, 1e-5, 0.01, 100)
    with pytest.raises(ValueError, match=r"target_epsilon=0.0001 is unreachable with accountant='pld'.*"
                                         r"value_discretization_interval"):
        P.calibrate_noise_multiplier(1e-4, 1e-5, 0.01, 100)
    with pytest.raises(ValueError, match="unreachable") as info:
        F.dp_sliced_wasserstein_noise_std(1e6, 1e-5, 10, 1000, 10, 10, 3, 1.0)
    assert "bracket" not in str(info.value)


def test_pld_infinite_at_tiny_delta_falls_back_to_rdp():
    acc = P.PrivacyAccountant()
    acc.step(1.0, sample_rate=0.01, num_steps=100)
    rdp = acc.get_epsilon(1e-300, accountant="rdp")
    assert acc.get_epsilon(1e-300, accountant="pld") == float("inf")
    assert acc.get_epsilon(1e-300) == rdp < float("inf")
    assert acc.get_epsilon(1e-5) < acc.get_epsilon(1e-5, accountant="rdp")  # PLD still used where finite


# ------------------------------------------------------------------------------------------------ POT aliases
def test_pot_aliases_of_the_sliced_api():
    x, y = CPU.double(), CPU.double() + 1
    ref = F.sliced_wasserstein(x, y, num_projections=5, generator=F.make_generator(7))
    assert torch.equal(F.sliced_wasserstein(x, y, n_projections=5, seed=7), ref)
    assert torch.equal(F.sliced_wasserstein(x, y, n_projections=5, seed=F.make_generator(7)), ref)
    assert torch.equal(F.SlicedWassersteinLoss(n_projections=5, seed=7)(x, y), ref)
    with pytest.raises(ValueError, match="not both"):
        F.sliced_wasserstein(x, y, num_projections=5, n_projections=5)
    with pytest.raises(ValueError, match="not both"):
        F.SlicedWassersteinLoss(5, generator=F.make_generator(1), seed=7)
    with pytest.raises(ValueError, match="seed must be"):
        F.sliced_wasserstein(x, y, n_projections=5, seed=1.5)


# --------------------------------------------------------------------------------------- GeomLoss' SamplesLoss
geomloss = pytest.importorskip("geomloss")


def _pair(n=7, m=9, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(m, d, generator=g, dtype=torch.float64) + 0.5
    a = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    b = 2 * torch.rand(m, generator=g, dtype=torch.float64) + 0.1
    return x, y, a, b


def _value_and_grad(loss, *args):
    i = 0 if len(args) == 2 else 1  # the points x in (x, y) or (a, x, b, y)
    args = list(args)
    x = args[i] = args[i].clone().requires_grad_()
    v = loss(*args)
    return v.detach(), torch.autograd.grad(v, x)[0]


@pytest.mark.parametrize("reach", [None, 0.7])
@pytest.mark.parametrize("debias,p", [(True, 2), (False, 2), (False, 1)])
def test_sinkhorn_loss_matches_geomloss(reach, debias, p):
    x, y, a, b = _pair()
    kw = dict(p=p, blur=0.1, reach=reach, debias=debias, scaling=0.5)
    ours = F.SinkhornLoss(backend="tensorized", **kw)
    theirs = geomloss.SamplesLoss("sinkhorn", backend="tensorized", **kw)
    args = (x, y) if reach is None else (a, x, b, y)  # unequal masses: unbalanced only
    v1, g1 = _value_and_grad(ours, *args)
    v2, g2 = _value_and_grad(theirs, *args)
    assert torch.allclose(v1, v2, rtol=1e-10, atol=1e-12)
    assert torch.allclose(g1, g2, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("reach", [None, 0.5])
def test_sinkhorn_loss_batched_matches_geomloss(reach):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 6, 2, generator=g, dtype=torch.float64)
    y = torch.randn(3, 5, 2, generator=g, dtype=torch.float64)
    kw = dict(p=2, blur=0.1, reach=reach)
    ours = F.SinkhornLoss(backend="tensorized", **kw)
    theirs = geomloss.SamplesLoss("sinkhorn", backend="tensorized", **kw)
    if reach is None:
        v1, v2 = ours(x, y), theirs(x, y)
    else:
        a = torch.rand(3, 6, generator=g, dtype=torch.float64)
        b = torch.rand(3, 5, generator=g, dtype=torch.float64)
        v1, v2 = ours(a, x, b, y), theirs(a, x, b, y)
    assert v1.shape == (3,)
    assert torch.allclose(v1, v2, rtol=1e-10, atol=1e-12)


def test_sinkhorn_loss_takes_geomlosss_leading_loss_name():
    # issue 40: SinkhornLoss("sinkhorn", p=2, blur=0.05), GeomLoss' SamplesLoss habit, raised "multiple values for p"
    x, y, _, _ = _pair()
    theirs = geomloss.SamplesLoss("sinkhorn", p=2, blur=0.1, backend="tensorized")
    for ours in (F.SinkhornLoss("sinkhorn", p=2, blur=0.1, backend="tensorized"),
                 F.SinkhornLoss("sinkhorn", 2, 0.1, backend="tensorized"),  # GeomLoss' positional order
                 F.SinkhornLoss(loss="sinkhorn", p=2, blur=0.1, backend="tensorized")):
        assert torch.allclose(ours(x, y), theirs(x, y), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="'energy' is one of GeomLoss' kernel or Hausdorff losses.*'sinkhorn' only"):
        F.SinkhornLoss("energy", blur=0.1)
    with pytest.raises(ValueError, match=r"loss must be one of \['sinkhorn'\], got 'sinkhon'"):
        F.SinkhornLoss("sinkhon")
    with pytest.raises(ValueError, match="first argument is the loss name 'sinkhorn'.*pass the exponent as p=2"):
        F.SinkhornLoss(2)


@pytest.mark.parametrize("call", [
    lambda: F.SinkhornLoss(p=True),  # p = 1 by truthiness before
    lambda: F.SinkhornLoss("sinkhorn", p=2.0),
    lambda: F.sinkhorn.sinkhorn(torch.randn(4, 2), torch.randn(3, 2), p=True),
    lambda: F.dp_sliced_wasserstein(torch.randn(4, 2), private=torch.randn(3, 2), noise_std=0.0, num_projections=3,
                                    p=True),
])
def test_a_bool_or_a_float_is_not_an_integer_choice(call):
    with pytest.raises(ValueError, match=r"p must be one of (the integers )?\[1, 2\]"):
        call()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sinkhorn_has_the_dtype_policy_of_the_losses_and_flows(dtype):
    # float16 was refused by the sliced losses but accepted by Sinkhorn and the flows: float32/float64 everywhere
    x = torch.randn(5, 2).to(dtype)
    with pytest.raises(ValueError, match=r"x must have dtype in \['torch.float32', 'torch.float64'\]"):
        F.sinkhorn.sinkhorn(x, x)
    with pytest.raises(ValueError, match="x must have dtype in"):
        F.SinkhornLoss("sinkhorn", blur=0.5)(x[None], x[None])  # batched
    with pytest.raises(ValueError, match="dtype in"):
        F.sliced_wasserstein(x, x, num_projections=3)


def test_sinkhorn_backend_names_of_geomloss():
    assert select_backend(10, 10, 2, backend="online") == "keops"
    assert select_backend(10, 10, 2, backend="tensorized") == "reference"
    with pytest.raises(ValueError, match="multiscale.*not implemented"):
        F.SinkhornLoss(backend="multiscale")
    with pytest.raises(ValueError, match="reach"):
        F.SinkhornLoss(reach=0.0)
    x, y, a, b = _pair()
    with pytest.raises(ValueError, match="same total mass.*reach="):
        sinkhorn(x, y, a, b)


# ------------------------------------------------------------------------------------------- progress and output
def test_flow_bar_is_not_redrawn_every_step_off_a_terminal(monkeypatch):
    import io
    import sys

    buf = io.StringIO()  # not a terminal, like a redirected run
    monkeypatch.setattr(sys, "stderr", buf)
    data = torch.randn(40, 2, generator=torch.Generator().manual_seed(5))
    flow = F.DPSlicedWassersteinFlow(16, 2, 3, 0.5, generator=F.make_generator(0))
    flow.run(data, steps=300, progress=True)
    out = buf.getvalue()
    assert "SW flow" in out and "300/300" in out
    assert out.count("\r") == 0 and len(out.splitlines()) <= 4, f"{len(out.splitlines())} lines for 300 steps"


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_in_a_log(monkeypatch):
    import io

    from fastdpot import _progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    log, tty = io.StringIO(), Terminal()
    for stream in (log, tty):
        with _progress.progress_bar(total=50, desc="demo", file=stream) as bar:
            for _ in range(50):
                bar.update(1)
                bar.set_postfix(eps="1.5")
    assert "\r" not in log.getvalue() and log.getvalue().endswith("\n")  # no bar redraws in a log file
    assert log.getvalue().splitlines()[-1].startswith("demo: 50/50 [") and "eps=1.5" in log.getvalue()
    assert "\r" in tty.getvalue() and "50/50" in tty.getvalue()  # tqdm's bar on a terminal
    monkeypatch.setattr(_progress, "LOG_INTERVAL_S", 0.0)  # a line every few seconds: here, every update
    many = io.StringIO()
    with _progress.progress_bar(total=3, desc="lines", file=many) as bar:
        for _ in range(3):
            bar.update(1)
    assert [ln.split(" [")[0] for ln in many.getvalue().splitlines()] == ["lines: 0/3", "lines: 1/3", "lines: 2/3",
                                                                           "lines: 3/3", "lines: 3/3"]
    quiet = io.StringIO()
    with _progress.progress_bar(total=3, desc="late", file=quiet, delay=60.0) as bar:  # over before the delay
        bar.update(3)
    assert quiet.getvalue() == ""


def test_dpswgen_shows_progress(monkeypatch):
    import io
    import math
    import sys

    from fastdpot.dpswgen import train_dpswgen

    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    from fastdpot.experiments.papers.dpswgen import MLPGenerator

    data = torch.randn(30, 2, generator=torch.Generator().manual_seed(6))
    train_dpswgen(data, MLPGenerator(4, 2), math.inf, 1e-5, steps=3, batch_size=10, num_projections=4,
                  generator=F.make_generator(1))
    assert "SWgen" in buf.getvalue() and "3/3" in buf.getvalue()
    buf.truncate(0)
    train_dpswgen(data, MLPGenerator(4, 2), math.inf, 1e-5, steps=2, batch_size=10, num_projections=4,
                  generator=F.make_generator(1), progress=False)
    assert "SWgen" not in buf.getvalue()


def _run_python(*args):
    import os
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("the notice is only dropped where torch sees no CUDA")
    pytest.importorskip("pykeops")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr


def test_keops_cuda_notice_dropped_on_cpu_machines_other_lines_kept(monkeypatch, capsys):
    from fastdpot import _ext

    def fake_import(name):
        print("[KeOps] Warning : CUDA libraries not found or could not be loaded; Switching to CPU only.")
        print("[KeOps] something else")
        return object(), None

    monkeypatch.setattr(_ext, "_try_import", fake_import)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    mod, err = _ext.import_pykeops.__wrapped__()
    out = capsys.readouterr().out
    assert mod is not None and err is None
    assert "CUDA libraries not found" not in out and "[KeOps] something else" in out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA machine: the notice means something
    _ext.import_pykeops.__wrapped__()
    assert "CUDA libraries not found" in capsys.readouterr().out


@pytest.mark.slow
def test_pykeops_import_has_no_cuda_notice_on_a_cpu_machine():
    out = _run_python("-c", "from fastdpot._ext import import_pykeops; print(import_pykeops()[1])")
    assert "None" in out and "CUDA libraries not found" not in out
    # a plain import does print it here: the test can fail
    assert "CUDA libraries not found" in _run_python("-c", "import pykeops")


@pytest.mark.slow
def test_env_report_has_no_keops_cuda_notice_on_a_cpu_machine():
    out = _run_python("-m", "fastdpot.env")
    assert "keops: importable" in out
    assert "CUDA libraries not found" not in out


def test_cli_flow_help_gives_every_option_one_help_text_and_one_default():
    import argparse

    from fastdpot.experiments.mainjob.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["flow"]
    fmt = sub._get_formatter()
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{action.option_strings} has no help text"
        text = fmt._expand_help(action)
        # one "(default ...)" clause; the word may also name a value (--sketch-blocks 'default')
        assert text.lower().count("(default") == 1, f"{action.option_strings}: {text!r}"


def test_cli_representation_kinds_are_the_settings_kinds():
    # --rep-kind pixels (the one-shot method's, and the real-data analysis run of the report) was refused by the CLI
    from fastdpot.experiments.mainjob.cli import build_parser
    from fastdpot.experiments.mainjob.settings import REPRESENTATION_KINDS

    for kind in REPRESENTATION_KINDS:
        args = build_parser().parse_args(["flow", "--public-size", "0", "--rep-kind", kind])
        assert args.rep_kind == kind


# -------------------------------------------------------------------------------------------------- docstrings
def _public_members_without_docstring():
    import importlib
    import inspect

    modules = ["fastdpot", "fastdpot.sliced", "fastdpot.sinkhorn", "fastdpot.flows", "fastdpot.privacy",
               "fastdpot.dpswgen", "fastdpot.dp_sinkhorn", "fastdpot.ldp", "fastdpot.audit", "fastdpot.ops",
               "fastdpot.experiments.papers.dpswgen", "fastdpot.experiments.papers.dp_sinkhorn", "fastdpot.experiments.papers.ldp",
               "fastdpot.experiments.mainjob", "fastdpot.experiments.mainjob.autoencoder",
               "fastdpot.experiments.mainjob.tuning", "fastdpot.experiments.mainjob.pipeline",
               "fastdpot.experiments.mainjob.config", "fastdpot.experiments.mainjob.generation",
               "fastdpot.experiments.mainjob.protocols", "fastdpot.experiments.mainjob.evaluation",
               "fastdpot.experiments.mainjob.report", "fastdpot.experiments.mainjob.codes",
               "fastdpot.experiments.mainjob.representation", "fastdpot.experiments.metrics",
               "fastdpot.experiments.data", "fastdpot.experiments.mainjob.cli", "fastdpot.experiments.mainjob.distributed",
               "fastdpot.privacy.moments", "fastdpot.flows.allocation", "fastdpot.generators"]
    seen, missing = set(), []
    for name in modules:
        mod = importlib.import_module(name)
        for attr in getattr(mod, "__all__", [n for n in dir(mod) if not n.startswith("_")]):
            obj = getattr(mod, attr, None)
            if obj is None or id(obj) in seen or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            seen.add(id(obj))
            if not (obj.__doc__ or "").strip():
                missing.append(f"{name}.{attr}")
            if not inspect.isclass(obj) or not obj.__module__.startswith("fastdpot"):
                continue
            for member, value in vars(obj).items():
                if member.startswith("_") or member == "extra_repr":  # nn.Module's repr hook
                    continue
                fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if inspect.isfunction(fn) and not (fn.__doc__ or "").strip():
                    missing.append(f"{obj.__module__}.{obj.__name__}.{member}")
    return missing


def test_every_public_function_method_and_property_has_a_docstring():
    assert _public_members_without_docstring() == []


@pytest.mark.parametrize("loss", [F.SlicedWassersteinLoss, F.DPSlicedWassersteinLoss, F.SinkhornLoss])
def test_each_loss_forward_documents_its_arguments(loss):
    doc = loss.forward.__doc__ or ""
    assert "Returns" in doc or "returns" in doc.lower()
    inspect = __import__("inspect")
    for arg, par in list(inspect.signature(loss.forward).parameters.items())[1:]:
        if par.kind is not inspect.Parameter.VAR_POSITIONAL:
            assert arg in doc, f"{loss.__name__}.forward does not document {arg}"


# ---------------------------------------------------------------------------------- Opacus names, one name per ε
def test_noise_std_accepts_opacus_names_and_names_what_the_caller_passed():
    kw = dict(batch_size=250, dataset_size=2000, num_projections=20, dim=4, clip_radius=1.0)
    sigma, details = F.dp_sliced_wasserstein_noise_std(8.0, 1e-5, steps=80, **kw)
    sigma2, details2 = F.dp_sliced_wasserstein_noise_std(target_epsilon=8.0, target_delta=1e-5, epochs=10, **kw)
    assert details2["steps"] == 80 and sigma2 == sigma
    with pytest.raises(ValueError, match="^target_epsilon must be > 0"):
        F.dp_sliced_wasserstein_noise_std(target_epsilon=-1.0, delta=1e-5, steps=80, **kw)
    with pytest.raises(ValueError, match="^epsilon must be > 0"):
        F.dp_sliced_wasserstein_noise_std(epsilon=-1.0, delta=1e-5, steps=80, **kw)
    with pytest.raises(ValueError, match="^target_delta must be in"):
        F.dp_sliced_wasserstein_noise_std(8.0, target_delta=2.0, steps=80, **kw)
    with pytest.raises(ValueError, match=r"^epsilon=1000000.0 is unreachable"):
        F.dp_sliced_wasserstein_noise_std(epsilon=1e6, delta=1e-5, steps=10, **kw)
    with pytest.raises(ValueError, match="not both"):
        F.dp_sliced_wasserstein_noise_std(8.0, 1e-5, target_epsilon=8.0, steps=80, **kw)
    with pytest.raises(ValueError, match="steps or epochs"):
        F.dp_sliced_wasserstein_noise_std(8.0, 1e-5, steps=80, epochs=10, **kw)
    with pytest.raises(ValueError, match=r"needs \['steps'\]"):
        F.dp_sliced_wasserstein_noise_std(8.0, 1e-5, **kw)


def test_opacus_aliases_in_the_trainers_and_the_loss_module():
    from fastdpot.dp_sinkhorn import DPSinkhornConfig
    from fastdpot.dpswgen import train_dpswgen
    from fastdpot.experiments.papers.dpswgen import MLPGenerator

    cfg = DPSinkhornConfig(max_grad_norm=1.5, target_delta=1e-6)
    assert cfg.clip_radius == 1.5 and cfg.delta == 1e-6 and cfg.max_grad_norm is None
    with pytest.raises(ValueError, match="clip_radius or its alias max_grad_norm"):
        DPSinkhornConfig(clip_radius=2.0, max_grad_norm=1.0)
    kw = dict(batch_size=250, dataset_size=2000, num_projections=20, dim=4, clip_radius=1.0)
    a = F.DPSlicedWassersteinLoss.from_privacy(8.0, 1e-5, steps=80, **kw)
    b = F.DPSlicedWassersteinLoss.from_privacy(target_epsilon=8.0, target_delta=1e-5, epochs=10, **kw)
    assert a.noise_std == b.noise_std and b.privacy["steps"] == 80
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = MLPGenerator(2, 3).double()
    r = train_dpswgen(x, model, target_epsilon=math.inf, target_delta=1e-5, epochs=0.5, batch_size=20,
                      progress=False, generator=torch.Generator().manual_seed(1), secure_mode=False)
    assert r.steps == 1
    with pytest.raises(ValueError, match="epsilon or its alias target_epsilon"):
        train_dpswgen(x, model, 1.0, 1e-5, target_epsilon=2.0, steps=1, batch_size=20, progress=False)
    with pytest.raises(ValueError, match="steps or epochs"):
        train_dpswgen(x, model, 1.0, 1e-5, steps=1, epochs=1.0, batch_size=20, progress=False)


def test_train_dpswgen_errors_name_the_budget_argument_the_caller_used():
    from fastdpot.dpswgen import train_dpswgen

    from fastdpot.experiments.papers.dpswgen import MLPGenerator

    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    m = MLPGenerator(2, 3).double()
    with pytest.raises(ValueError, match="^target_epsilon must be > 0"):
        train_dpswgen(x, m, target_epsilon=-1.0, delta=1e-5, steps=1, batch_size=20, progress=False)
    with pytest.raises(ValueError, match="^epsilon must be > 0"):
        train_dpswgen(x, m, -1.0, 1e-5, steps=1, batch_size=20, progress=False)
    with pytest.raises(ValueError, match="^target_delta must be in"):
        train_dpswgen(x, m, 1.0, target_delta=2.0, steps=1, batch_size=20, progress=False)


@pytest.mark.parametrize("spelled", ["epsilon", "target_epsilon"])
def test_dpswgen_errors_name_the_target_as_the_caller_spelled_it(spelled):
    from fastdpot.dpswgen import train_dpswgen
    from fastdpot.experiments.papers.dpswgen import MLPGenerator

    data = torch.randn(30, 2, generator=torch.Generator().manual_seed(6))
    with pytest.raises(ValueError, match=rf"^{spelled}=1000000000.0 is unreachable"):
        train_dpswgen(data, MLPGenerator(4, 2), delta=1e-5, steps=3, batch_size=10, num_projections=4,
                      progress=False, **{spelled: 1e9})


# ------------------------------------------------------------------------------------------ issue 46: wrong names
@pytest.mark.parametrize("k,pattern", [(0, "must be >= 1"), (-3, "must be >= 1"), (2.0, "must be an integer"),
                                       (True, "must be an integer"),
                                       (10 ** 9, "directions in dimension d=3 exceed the maximum")])
def test_pot_alias_errors_name_n_projections_as_passed(k, pattern):
    x = CPU.double()
    with pytest.raises(ValueError, match=rf"^n_projections(=\d+)? {pattern}"):
        F.sliced_wasserstein(x, x + 1, n_projections=k)
    if "maximum" not in pattern:  # the module does not know d yet
        with pytest.raises(ValueError, match=rf"^n_projections {pattern}"):
            F.SlicedWassersteinLoss(n_projections=k)
    with pytest.raises(ValueError, match=r"^num_projections must be >= 1"):
        F.sliced_wasserstein(x, x + 1, num_projections=0)  # the own name still named as passed


# ----------------------------------------------------------- issue 46: no data-dependent count in an error message
BAD = CPU.clone()
BAD[1, 2], BAD[4, 0], BAD[6, 1] = float("nan"), float("inf"), -float("inf")

# mechanisms reading private data, each given rows with three non-finite values, in the slot named
PRIVATE_NON_FINITE = {
    "dp_sliced_wasserstein": (lambda: F.dp_sliced_wasserstein(CPU, private=BAD, noise_std=0.1, num_projections=4),
                              "private"),
    "DPSlicedWassersteinLoss": (lambda: F.DPSlicedWassersteinLoss(0.1, 4, clip_radius=1.0)(CPU, private=BAD),
                                "private"),
    "flow.run": (lambda: F.DPSlicedWassersteinFlow(10, 3, 4, 0.5).run(BAD, steps=1, progress=False), "private_data"),
    "ClassConditionalFlow.run": (lambda: F.ClassConditionalFlow(10, 3, 4, 0.5, num_classes=2).run(
        BAD, LABELS, steps=1, progress=False), "private_data"),
    "sliced_quantile_sketch": (lambda: P.sliced_quantile_sketch(BAD.double(), _theta(dtype=torch.float64), 2, 0.1,
                                                                clip_radius=1.0), "x_private"),
    "laplace_local_mechanism": (lambda: P.laplace_local_mechanism(BAD, 1.0, 1.0), "x"),
    "gaussian_local_mechanism": (lambda: P.gaussian_local_mechanism(BAD, 1.0, 1e-5, 1.0), "x"),
    "dp_second_moment": (lambda: P.moments.dp_second_moment(BAD, 1.0), "rows"),
    "release_class_moments": (lambda: P.moments.release_class_moments(BAD, LABELS, 2, 1.0), "rows"),
    "release_class_means": (lambda: P.moments.release_class_means(BAD, LABELS, 2, 1.0, clip_radius=1.0), "rows"),
    "class_quantile_sketch": (lambda: P.class_sketch.class_quantile_sketch(
        BAD, LABELS, torch.eye(3, dtype=torch.float64), num_classes=2, sketch_bins=2, noise_multiplier=1.0,
        clip_radius=1.0), "x_private"),
    "semi_debiased_sinkhorn_loss": (lambda: F.semi_debiased_sinkhorn_loss(CPU, None, BAD, 0.0), "real"),
}


@pytest.mark.parametrize("case", sorted(PRIVATE_NON_FINITE))
def test_non_finite_private_rows_are_refused_without_counting_them(case):
    import fastdpot.privacy.class_sketch  # noqa: F401  (P.class_sketch, P.moments)
    import fastdpot.privacy.moments  # noqa: F401

    fn, name = PRIVATE_NON_FINITE[case]
    with pytest.raises(ValueError) as err:
        fn()
    msg = str(err.value)
    assert msg.startswith(f"{name} contains non-finite values"), msg
    assert not any(c.isdigit() for c in msg), msg  # how many (3), or where, is a statistic of the private rows


def test_out_of_range_private_labels_are_not_echoed():
    with pytest.raises(ValueError) as err:
        F.sinkhorn.class_conditional(CPU, torch.tensor([0, 1, 0, 1, 7, 0, 1, -4]), 2)
    assert str(err.value) == "labels must lie in [0, 2)"
