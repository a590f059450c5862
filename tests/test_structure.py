"""The package's structure, checked statically: no import cycle, no arrow from the library into the application
package (:mod:`fastdpot.experiments`; its command-line entry point ``fastdpot.__main__`` aside), no source file over
500 lines (the Python of ``fastdpot/``, ``kernels/`` and ``bench/``, the C++ and CUDA of ``csrc/``), and a
documentation folder of at most 1 MB (run artefacts live outside ``docs/``).

The import graph reads module-level and function-level imports from the source (nothing is imported): an arrow
m -> t for every ``import`` / ``from ... import`` in m that names a module t of the package (the longest existing
prefix of the name), and for every ``importlib.import_module(...)`` / ``__import__(...)`` call whose name is a
literal (an arrow to that module) or starts with a literal (an f-string ``f"fastdpot.kernels.{module}"`` or
``"fastdpot.kernels." + name``: an arrow to every module whose name starts with that prefix). A module's arrow to a
package that contains it (its own ``__init__``) is not an arrow between rooms.

The modules are those the wheel ships: ``fastdpot/`` and the Triton kernels of ``kernels/``, which ``setup.py``
ships as ``fastdpot.kernels`` (so ``kernels/dpswd.py`` is the module ``fastdpot.kernels.dpswd``, and an import of
``kernels.dpswd`` names it too).
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = "fastdpot"
#: source folder -> the name its modules are shipped under (setup.py's package_dir)
SHIPPED = {"fastdpot": "fastdpot", "kernels": "fastdpot.kernels"}
APPLICATION = "fastdpot.experiments"
ENTRY_POINTS = {"fastdpot.__main__"}


def _modules(root=ROOT):
    """``{module name: path}`` of every shipped ``.py`` file under ``root``."""
    mods = {}
    for folder, prefix in SHIPPED.items():
        top = os.path.join(root, folder)
        for dirpath, _, files in os.walk(top):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    parts = os.path.relpath(path, top)[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    mods[".".join([prefix] + parts)] = path
    return mods


def _shipped_name(name):
    """The shipped name of an imported module name (``kernels.x`` -> ``fastdpot.kernels.x``)."""
    for folder, prefix in SHIPPED.items():
        if folder != prefix and (name == folder or name.startswith(folder + ".")):
            return prefix + name[len(folder):]
    return name


def _literal_prefix(arg):
    """``(name, exact)`` of a dynamic import's first argument: a literal string (exact), the literal start of an
    f-string or of ``"literal" + expr`` (a prefix), or ``(None, False)`` when it starts with no literal."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value, True
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return arg.values[0].value, False
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):
        name, _ = _literal_prefix(arg.left)
        return name, False
    return None, False


def _is_dynamic_import(node):
    if not (isinstance(node, ast.Call) and node.args):
        return False
    fn = node.func
    return (isinstance(fn, ast.Attribute) and fn.attr == "import_module") or (
        isinstance(fn, ast.Name) and fn.id in ("import_module", "__import__"))


def _graph(root=ROOT):
    """``{module: set of modules it imports}`` over the shipped modules under ``root`` (module docstring)."""
    mods = _modules(root)

    def resolve(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: set() for m in mods}
    for m, path in mods.items():
        base = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            prefixes = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    b = base
                    for _ in range(node.level - 1):
                        b = b.rpartition(".")[0]
                    mod = b + ("." + mod if mod else "")
                targets = [mod] + [mod + "." + a.name for a in node.names]
            elif _is_dynamic_import(node):
                name, exact = _literal_prefix(node.args[0])
                if name is None:
                    continue
                if name.startswith("."):  # import_module(".x", package): relative to this module's package
                    name = base + name
                if exact:
                    targets = [name]
                else:
                    targets, prefixes = [], [_shipped_name(name)]
            else:
                continue
            found = [resolve(_shipped_name(t)) for t in targets if _shipped_name(t).split(".")[0] == PKG]
            for p in prefixes:
                found += [x for x in mods if x.startswith(p) or x == p.rstrip(".")]
            for r in found:
                if r and r != m and not (m.startswith(r + ".") and mods[r].endswith("__init__.py")):
                    edges[m].add(r)
    return edges


def _cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, count = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = count[0]
        count[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _in_app(m):
    return m == APPLICATION or m.startswith(APPLICATION + ".")


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_graph_holds_the_kernels_and_their_lazy_imports():
    edges = _graph()
    kernels = {m for m in edges if m.startswith("fastdpot.kernels.")}
    assert {"fastdpot.kernels", "fastdpot.kernels.dpswd", "fastdpot.kernels.flow_step"} <= set(edges)
    # ops/_triton.py imports f"fastdpot.kernels.{module}" on first use: an arrow to every kernel module
    assert kernels | {"fastdpot.kernels"} <= edges["fastdpot.ops._triton"]
    assert "fastdpot.kernels._common" in edges["fastdpot.kernels.dpswd"]  # a kernel's relative import


def test_the_library_never_imports_the_application():
    edges = _graph()
    arrows = sorted((m, t) for m, ts in edges.items() for t in ts
                    if not _in_app(m) and m not in ENTRY_POINTS and _in_app(t))
    assert arrows == []
    assert any(_in_app(t) for t in edges["fastdpot.__main__"])  # the check sees arrows where they exist


def _foundation(m):
    """The modules below the privacy package: the package's private top-level modules (``fastdpot._validate``,
    ``_random``, ``_checkpoint``, ``_blocks``, ``_ext``, ...), not the ops, the flows or anything built on them."""
    return m.startswith("fastdpot._") and "." not in m[len("fastdpot."):]


def _reached_from(edges, package):
    """Every module reachable by arrows from the modules of ``package``, outside it."""
    seen, todo = set(), [m for m in edges if m == package or m.startswith(package + ".")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += list(edges[m])
    return {m for m in seen if not (m == package or m.startswith(package + "."))}


def test_the_privacy_package_imports_nothing_above_it():
    """The mechanisms and the accounting sit below the ops, the flows and everything built on them: every arrow out
    of fastdpot.privacy (followed transitively, function-level imports included) ends in the foundation. Sampling
    from a release is post-processing and lives with the flows (fastdpot.flows.allocation.sample_class_gaussians)."""
    above = sorted(m for m in _reached_from(_graph(), "fastdpot.privacy") if not _foundation(m))
    assert above == []


def test_the_layer_check_sees_a_planted_arrow_up(tmp_path):
    _plant(tmp_path, {"fastdpot/__init__.py": "", "fastdpot/_validate.py": "", "fastdpot/flows/__init__.py": "",
                      "fastdpot/flows/allocation.py": "from .._validate import x\n",
                      "fastdpot/privacy/__init__.py": "",
                      "fastdpot/privacy/moments.py": "from .._validate import x\n\n\ndef f():\n"
                                                     "    from ..flows.allocation import g\n"})
    reached = _reached_from(_graph(str(tmp_path)), "fastdpot.privacy")
    assert reached == {"fastdpot._validate", "fastdpot.flows.allocation"}
    assert [m for m in sorted(reached) if not _foundation(m)] == ["fastdpot.flows.allocation"]


def test_the_check_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def _plant(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def test_the_check_finds_the_loop_through_a_lazy_kernel_import(tmp_path):
    """The loop of an op module that loads its kernel through importlib while the kernel imports the op module
    (and the kernels' package imports the registration module) is found; the same tree with what both sides
    need moved below them has none."""
    files = {
        "fastdpot/__init__.py": "",
        "fastdpot/ops/__init__.py": "",
        "fastdpot/ops/_triton.py": "import importlib\n\n\ndef _lazy(module):\n"
                                   "    return importlib.import_module(f'fastdpot.kernels.{module}')\n",
        "fastdpot/ops/sliced_wasserstein.py": "from ._triton import _lazy\n\nclass GradientInForward:\n    pass\n",
        "kernels/__init__.py": "from fastdpot.ops._triton import _lazy  # noqa\n",
        "kernels/dpswd.py": "from fastdpot.ops.sliced_wasserstein import GradientInForward\n",
    }
    _plant(tmp_path, files)
    cycles = _cycles(_graph(str(tmp_path)))
    assert cycles == [["fastdpot.kernels", "fastdpot.kernels.dpswd", "fastdpot.ops._triton",
                       "fastdpot.ops.sliced_wasserstein"]]
    _plant(tmp_path, {"fastdpot/ops/_shared.py": "class GradientInForward:\n    pass\n",
                      "fastdpot/ops/_status.py": "def _lazy(module):\n    return None\n",
                      "kernels/__init__.py": "from fastdpot.ops._status import _lazy  # noqa\n",
                      "kernels/dpswd.py": "from fastdpot.ops._shared import GradientInForward\n"})
    assert _cycles(_graph(str(tmp_path))) == []


def test_the_check_follows_every_form_of_dynamic_import(tmp_path):
    _plant(tmp_path, {
        "fastdpot/__init__.py": "",
        "fastdpot/a.py": "import importlib\nimportlib.import_module('fastdpot.b')\n",
        "fastdpot/b.py": "__import__('fastdpot.c')\n",
        "fastdpot/c.py": "from importlib import import_module\nimport_module('fastdpot.sub.' + NAME)\n",
        "fastdpot/d.py": "import importlib\nimportlib.import_module('.b', __package__)\n",
        "fastdpot/e.py": "import importlib\nimportlib.import_module(some_name)\n",  # no literal: no arrow
        "fastdpot/sub/__init__.py": "",
        "fastdpot/sub/x.py": "",
        "kernels/__init__.py": "",
        "kernels/k.py": "import kernels._common\n",
        "kernels/_common.py": "",
    })
    edges = _graph(str(tmp_path))
    assert edges["fastdpot.a"] == {"fastdpot.b"}
    assert edges["fastdpot.b"] == {"fastdpot.c"}
    assert edges["fastdpot.c"] == {"fastdpot.sub", "fastdpot.sub.x"}
    assert edges["fastdpot.d"] == {"fastdpot.b"}
    assert edges["fastdpot.e"] == set()
    assert edges["fastdpot.kernels.k"] == {"fastdpot.kernels._common"}


MAX_LINES = 500
#: folder -> file endings whose files are held to MAX_LINES
SIZED = {"fastdpot": (".py",), "kernels": (".py",), "bench": (".py",), "csrc": (".cpp", ".h", ".cu", ".cuh")}


def _sized_files(root=ROOT):
    for folder, endings in SIZED.items():
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for f in files:
                if f.endswith(endings):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def _too_long(root=ROOT):
    out = {}
    for rel in _sized_files(root):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            out[rel] = n
    return out


def test_no_source_file_over_500_lines():
    assert _too_long() == {}


def test_the_line_check_sees_every_kind_of_source(tmp_path):
    files = {"fastdpot/a.py": 501, "fastdpot/b.py": 500, "kernels/k.py": 600, "bench/g.py": 501, "bench/r.json": 900,
             "csrc/x.cpp": 501, "csrc/x.h": 501, "csrc/cuda/y.cu": 501, "csrc/z.txt": 900, "tests/t.py": 900}
    _plant(tmp_path, {rel: "\n" * n for rel, n in files.items()})
    want = ("fastdpot/a.py", "kernels/k.py", "bench/g.py", "csrc/x.cpp", "csrc/x.h", "csrc/cuda/y.cu")
    assert _too_long(str(tmp_path)) == {os.path.join(*r.split("/")): files[r] for r in want}


def test_docs_folder_is_at_most_1_mb():
    total = sum(os.path.getsize(os.path.join(folder, f))
                for folder, _, files in os.walk(os.path.join(ROOT, "docs")) for f in files)
    assert total <= 1_000_000, f"docs/ holds {total} bytes"


# ----------------------------------------------------------------- every privacy noise draw is the library's
#: calls that draw noise; in the application each must be a mechanism of fastdpot.privacy (or a flow), so none may
#: appear in fastdpot/experiments/ except a PUBLIC draw marked on its line with ``# public draw: <why>``
_NOISE_CALLS = {"randn", "randn_like", "normal", "normal_", "laplace", "exponential", "exponential_", "poisson",
                "multivariate_normal", "sample", "rsample"}


def _noise_draws(path):
    """``[(line, call)]`` of the noise-drawing calls of one source file that carry no ``# public draw:`` marker."""
    with open(path) as f:
        source = f.read()
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in _NOISE_CALLS and "# public draw:" not in lines[node.lineno - 1]:
                out.append((node.lineno, name))
    return out


def test_no_application_module_draws_noise_itself():
    found = {p: d for m, p in _modules().items() if m.startswith(APPLICATION) and (d := _noise_draws(p))}
    assert found == {}


def test_the_noise_check_sees_a_planted_mechanism(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\n\ndef release(x, rng):\n    return x.sum(0) + rng.normal(x.shape[1:])\n\n\n"
                   "def other(x):\n    return x + torch.randn(3)\n\n\ndef latent(g):\n"
                   "    return torch.randn(4, generator=g)  # public draw: the generator's input\n")
    assert _noise_draws(str(bad)) == [(5, "normal"), (9, "randn")]
