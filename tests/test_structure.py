"""The package's structure, checked statically: no import cycle, no arrow from the library into the application
package (:mod:`fastdpot.experiments`; its command-line entry point ``fastdpot.__main__`` aside), no module over 600
lines, and a documentation folder of at most 1 MB (run artefacts live outside ``docs/``).

The import graph reads module-level and function-level imports from the source (nothing is imported): an arrow
m -> t for every ``import`` / ``from ... import`` in m that names a module t of the package (the longest existing
prefix of the name). A package's own ``__init__`` importing its submodules is not an arrow between rooms.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = "fastdpot"
APPLICATION = "fastdpot.experiments"
ENTRY_POINTS = {"fastdpot.__main__"}


def _modules():
    mods = {}
    for folder, _, files in os.walk(os.path.join(ROOT, PKG)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def _graph():
    mods = _modules()

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
            else:
                continue
            for t in targets:
                if t == PKG or t.startswith(PKG + "."):
                    r = resolve(t)
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


def test_the_library_never_imports_the_application():
    edges = _graph()
    arrows = sorted((m, t) for m, ts in edges.items() for t in ts
                    if not _in_app(m) and m not in ENTRY_POINTS and _in_app(t))
    assert arrows == []
    assert any(_in_app(t) for t in edges["fastdpot.__main__"])  # the check sees arrows where they exist


def test_the_check_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_no_module_over_600_lines():
    long = {m: n for m, p in _modules().items() if (n := sum(1 for _ in open(p))) > 600}
    assert long == {}


def test_docs_folder_is_at_most_1_mb():
    total = sum(os.path.getsize(os.path.join(folder, f))
                for folder, _, files in os.walk(os.path.join(ROOT, "docs")) for f in files)
    assert total <= 1_000_000, f"docs/ holds {total} bytes"
