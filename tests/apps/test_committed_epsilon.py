"""scripts/committed_epsilon.py: the ε of everything committed for one sensitive set, composed with dp-accounting
(run over the repository's results/ in the default test run, and checked on planted runs)."""
import importlib.util
import json
import os

import dp_accounting as dpa
import pytest

from fastdpot.privacy import DEFAULT_ORDERS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script():
    spec = importlib.util.spec_from_file_location("committed_epsilon", os.path.join(ROOT, "scripts",
                                                                                    "committed_epsilon.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(folder, name, m):
    os.makedirs(folder / name)
    (folder / name / "metrics.json").write_text(json.dumps(m))


def test_planted_runs_compose_as_dp_accounting_says(tmp_path):
    S = _script()
    delta = 1e-6
    stage = dict(stage="sketch", noise_multiplier=0.6, releases=1,
                 event=dict(sample_rate=1.0, dataset_size=1000, batch_size=1000))
    flow = dict(stage="flow", noise_multiplier=0.8, releases=50,
                event=dict(sample_rate=0.1, dataset_size=1000, batch_size=100))
    for i in range(2):
        _write(tmp_path, f"a{i}", dict(method="oneshot", protocol="private-only", n_sensitive=1000, epsilon_target=10.0,
                                       epsilon=9.9, delta=delta, stages=[stage]))
    _write(tmp_path, "b", dict(method="flow", protocol="private-only", n_sensitive=1000, epsilon_target=1.0,
                               epsilon=0.99, delta=delta, stages=[flow]))
    _write(tmp_path, "inf", dict(method="oneshot", protocol="private-only", n_sensitive=1000, epsilon_target="inf",
                                 epsilon="inf", delta=delta, stages=[]))
    table = S.committed_table(str(tmp_path))
    acc = dpa.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS), neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.GaussianDpEvent(0.6), 2)
    acc.compose(dpa.SampledWithoutReplacementDpEvent(1000, 100, dpa.GaussianDpEvent(0.8)), 50)
    assert f"**({acc.get_epsilon(delta):.2f}, 1e-06)**" in table and "all 3 private runs" in table
    assert "1 non-private run(s) or analyses (inf)" in table
    one = dpa.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS), neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    one.compose(dpa.GaussianDpEvent(0.6), 2)
    assert f"| 2 × oneshot | 10 | ({one.get_epsilon(delta):.2f}, 1e-06) |" in table


def test_the_committed_results_are_composed():
    table = _script().committed_table(os.path.join(ROOT, "results"))
    assert "private-only protocol" in table and "all " in table and "**(" in table
