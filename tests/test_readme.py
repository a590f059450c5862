"""The README's code is executed as written (the front door must stay true): every python block runs, and the
quickstart's printed numbers are checked."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _quickstart():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("<!-- SECTION:quickstart -->", 1)[1].split("<!-- /SECTION:quickstart -->", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README quickstart has no python block"
    return blocks[0]


def test_readme_quickstart_runs(capsys):
    ns = {}
    exec(compile(_quickstart(), "README.md:quickstart", "exec"), ns)
    out = capsys.readouterr().out
    eps_flow = float(re.search(r"flow: eps spent ([0-9.]+)", out).group(1))
    assert 0 < eps_flow <= 5.0
    eps = float(re.search(r"eps = ([0-9.]+)", out).group(1))
    assert 2.5 < eps < 4.0            # PLD value for q = 250/29999, z = 1, T = 4199 (pinned in test_privacy_*)
    assert ns["y"].grad is not None and float(ns["sigma"]) > 0
    assert ns["samples"].shape == (1000, 8)


def test_every_readme_python_block_runs_and_the_front_door_stays_small():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert len(text.encode()) <= 15 * 1024, "the README is a front door: at most 15 KB"
    assert "](../" not in text, "the README links outside the repository"
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks and blocks[0] == _quickstart()  # the quickstart runs above with its checks
    for i, block in enumerate(blocks[1:], 1):
        exec(compile(block, f"README.md:block{i}", "exec"), {})
