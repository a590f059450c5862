"""The documentation runs as written (issue 31, "Docs that run as written"): every ```python block of README.md and
of docs/**/*.md is executed in the default run.

* Every block runs ON ITS OWN, in a fresh namespace (a reader copies one block), in page order in a fresh temporary
  folder per page (the checkpoints they write land there), with the global torch RNG seeded and restored
  afterwards. A block that needs the names of the block before it starts with the visible comment
  ``# continued from the block above`` and runs joined with it (in its namespace, as if pasted below it); a
  continuation of a block that does not run here must be marked as not runnable too.
* A block that cannot run here starts with the visible comment ``# not runnable here: <why>`` (needs CUDA, several
  processes under torchrun, a user's CelebA folder, minutes of compute). Exactly those blocks are skipped; any
  other block that raises fails its page.
* An expected output written in a block as ``# prints: TEXT`` must be printed by that block: some line of its
  output has the same words, numbers equal to the digits shown (within one unit of the last digit shown).
* A page whose blocks call ``torch.distributed.init_process_group`` runs as the single process of a gloo group
  (the environment ``torchrun --nproc_per_node 1`` would set); the group is destroyed after the page.
* The README is a front door: at most 15 KB, no link outside the repository, and its quickstart (the first block,
  between the ``SECTION:quickstart`` markers) prints the numbers it promises.

The blocks use small shapes: each runs in seconds to a minute on 2 cores. A block that runs for more than five
minutes fails (shrink it, or mark it as not runnable here with the reason).
"""
import contextlib
import glob
import io
import os
import re
import socket
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", flags=re.S | re.M)
MARK = re.compile(r"\A\s*# not runnable here:(.*)$", flags=re.M)
CONTINUED = re.compile(r"\A\s*# continued from the block above\b")
PRINTS = re.compile(r"#\s*prints:\s*(.+?)\s*$", flags=re.M)
MAX_BLOCK_S = 300.0


def _pages():
    docs = sorted(glob.glob(os.path.join("docs", "**", "*.md"), root_dir=ROOT, recursive=True))
    return ["README.md"] + docs


def _fenced(text):
    """``[(line, language, code, why_not_runnable or None)]`` of every fenced block of ``text``."""
    out = []
    for m in FENCE.finditer(text):
        code = m.group(2)
        mark = MARK.match(code)
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1).strip(), code,
                    None if mark is None else mark.group(1).strip()))
    return out


def _blocks(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return _fenced(f.read())


def _python_blocks(page):
    return [(line, code, why) for line, lang, code, why in _blocks(page) if lang == "python"]


PAGES = [p for p in _pages() if _python_blocks(p)]


def _same(expected: str, got: str) -> bool:
    """A word of an expected output against a printed one: equal, or numbers equal to the digits shown."""
    if expected == got:
        return True
    try:
        want, have = float(expected), float(got)
    except ValueError:
        return False
    shown = len(expected.split(".", 1)[1]) if "." in expected and "e" not in expected.lower() else 0
    return abs(want - have) <= 10.0 ** -shown * (1 + 1e-9)


def _check_prints(code: str, output: str, where: str) -> None:
    """Every ``# prints: TEXT`` of ``code`` matches a line of ``output`` (word by word, :func:`_same`)."""
    lines = [ln.split() for ln in output.splitlines()]
    for expected in PRINTS.findall(code):
        want = expected.split()
        if not any(len(ln) == len(want) and all(_same(a, b) for a, b in zip(want, ln)) for ln in lines):
            raise AssertionError(f"{where}: the docs say it prints {expected!r}; it printed:\n{output}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_readme(outputs, ns):
    """The quickstart's promises: ε of the flow within its target, the accountant's ε, the gradient, the samples."""
    out = outputs[0]
    eps_flow = float(re.search(r"flow: eps spent ([0-9.]+)", out).group(1))
    assert 0 < eps_flow <= 5.0
    eps = float(re.search(r"eps = ([0-9.]+)", out).group(1))
    assert 2.5 < eps < 4.0  # PLD value for q = 250/29999, z = 1, T = 4199 (pinned in tests/privacy)
    assert ns["y"].grad is not None and float(ns["sigma"]) > 0
    assert ns["samples"].shape == (1000, 8)


PAGE_CHECKS = {"README.md": _check_readme}


def _run_blocks(blocks, page):
    """Run ``[(line, code, why_not_runnable)]`` of ``page`` as the module doc says; returns, per block run, its
    output and the namespace it ran in."""
    outputs, spaces = [], []
    ns, ran_before = None, False
    for i, (line, code, why) in enumerate(blocks):
        where = f"{page}:{line}"
        continued = CONTINUED.match(code) is not None
        if continued and i == 0:
            raise AssertionError(f"{where} is marked as a continuation but is the page's first block")
        if why is not None:
            ran_before = False
            continue
        if continued and not ran_before:
            raise AssertionError(f"{where} continues a block that does not run here: mark it as not runnable too")
        if not continued:
            ns = {"__name__": "__docs__"}
        buf = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, where, "exec"), ns)
        took = time.perf_counter() - t0
        print(buf.getvalue(), end="")
        print(f"{where}: {took:.1f} s")
        assert took < MAX_BLOCK_S, f"{where} ran {took:.0f} s: shrink it or mark it as not runnable here"
        _check_prints(code, buf.getvalue(), where)
        outputs.append(buf.getvalue())
        spaces.append(ns)
        ran_before = True
    return outputs, spaces


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs(page, tmp_path, monkeypatch):
    blocks = _python_blocks(page)
    runnable = [(line, code) for line, code, why in blocks if why is None]
    if not runnable:
        pytest.skip(f"every block of {page} is marked: " + "; ".join(why for _, _, why in blocks))
    if any("init_process_group" in code for _, code in runnable):  # what torchrun sets, for one process
        for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1",
                               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1").items():
            monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            outputs, spaces = _run_blocks(blocks, page)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    if page in PAGE_CHECKS:
        PAGE_CHECKS[page](outputs, spaces[0])


def test_a_block_runs_on_its_own_unless_marked_as_a_continuation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = (1, "x = 41\n", None)
    alone = (5, "print(x + 1)\n", None)  # uses the block above without saying so: fails, as it would for a reader
    with pytest.raises(NameError, match="'x' is not defined"):
        _run_blocks([first, alone], "page.md")
    joined = (5, "# continued from the block above: x\nprint(x + 1)   # prints: 42\n", None)
    outputs, spaces = _run_blocks([first, joined], "page.md")
    assert outputs == ["", "42\n"] and spaces[0] is spaces[1]
    fresh = (9, "y = 1\n", None)
    _, spaces = _run_blocks([first, joined, fresh], "page.md")
    assert "x" not in spaces[2]  # a block without the mark starts afresh
    skipped = (1, "# not runnable here: needs a CUDA GPU\nx = 41\n", "needs a CUDA GPU")
    with pytest.raises(AssertionError, match="continues a block that does not run here"):
        _run_blocks([skipped, joined], "page.md")
    with pytest.raises(AssertionError, match="first block"):
        _run_blocks([joined], "page.md")
    assert CONTINUED.match("# continued from the block above: x, y\n") and not CONTINUED.match("x = 1\n")


def test_the_test_sees_every_python_block():
    # a block fenced ```py, ```python3 or ```pycon would escape the test above: only ```python is Python here
    other = [(page, line, lang) for page in _pages() for line, lang, _, _ in _blocks(page)
             if lang.lower().startswith("py") and lang != "python"]
    assert other == []
    assert sum(len(_python_blocks(p)) for p in _pages()) >= 10 and "README.md" in PAGES


def test_marked_blocks_say_why_and_only_python_blocks_are_marked():
    marked = [(page, line, lang, why) for page in _pages() for line, lang, _, why in _blocks(page) if why is not None]
    assert all(lang == "python" for _, _, lang, _ in marked), marked
    continued = [(page, line, lang) for page in _pages() for line, lang, code, _ in _blocks(page)
                 if CONTINUED.match(code)]
    assert all(lang == "python" for _, _, lang in continued), continued
    assert all(len(why.split()) >= 2 for _, _, _, why in marked), marked  # a reason, not a bare mark


def test_the_readme_is_a_small_front_door_whose_first_block_is_the_quickstart():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.encode()) <= 15 * 1024, "the README is a front door: at most 15 KB"
    assert "](../" not in text, "the README links outside the repository"
    section = text.split("<!-- SECTION:quickstart -->", 1)[1].split("<!-- /SECTION:quickstart -->", 1)[0]
    quick = [code for _, lang, code, _ in _fenced(section) if lang == "python"]
    assert quick and quick[0] == _python_blocks("README.md")[0][1]  # checked by PAGE_CHECKS above


def test_the_checks_fail_for_the_right_reasons():
    code = 'print(f"{x:.2f} {ok}")   # prints: 1.82 True\n'
    _check_prints(code, "1.82 True\n", "ok")
    _check_prints(code, "1.8199 True\n", "one unit of the last digit shown")
    with pytest.raises(AssertionError, match="1.82 True"):
        _check_prints(code, "1.84 True\n", "a wrong number")
    with pytest.raises(AssertionError):
        _check_prints(code, "1.82 False\n", "a wrong word")
    with pytest.raises(AssertionError):
        _check_prints(code, "", "nothing printed")
    assert MARK.match("# not runnable here: needs a CUDA GPU\nimport torch\n").group(1).strip() == "needs a CUDA GPU"
    assert MARK.match("import torch\n# not runnable here: too late\n") is None  # the mark must open the block
