"""`fastdpot flow`'s command line (issue 46, "The command line"): the one-shot method and its settings as named
options, defaults that --help states as a run gets them, and the runs it refuses before any work (options a run would
ignore, the decoded analysis at a finite ε, --distributed outside torchrun, a run of absurd length)."""
import argparse
import math

import pytest
import torch

from fastdpot.experiments.mainjob import MainJobConfig, cli
from fastdpot.experiments.mainjob.settings import METHODS, ONESHOT_SETTINGS, PRIVATE_ONLY_TABLE


def _flow_parser():
    parser = cli.build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["flow"]


def _helps():
    """{option: its --help text, expanded}."""
    sub = _flow_parser()
    fmt = sub._get_formatter()
    return {a.option_strings[0]: fmt._expand_help(a) for a in sub._actions if a.option_strings and a.help}


def _refused(argv, capsys, monkeypatch):
    """Run `fastdpot flow argv` that must stop before any work; returns its error message."""
    import fastdpot.experiments.mainjob.pipeline as pl

    def never(*a, **kw):
        raise AssertionError("the run started")

    monkeypatch.setattr(pl, "run_pipeline", never)
    capsys.readouterr()
    assert cli.main(["flow", "--no-progress", *argv]) == 2
    return capsys.readouterr().err


# ------------------------------------------------------------------------------------- the one-shot method, --help
def test_oneshot_is_a_method_of_the_command_line_with_its_settings_as_named_options():
    # "--method oneshot" was "invalid choice", and its settings were reachable through --set only
    args = _flow_parser().parse_args(["--public-size", "0", "--method", "oneshot", "--sketch-blocks", "28/0/0,7/0/0",
                                      "--sketch-plan", "3:8,inf:2", "--sketch-radius", "5", "--sketch-center", "half",
                                      "--sketch-mean-share", "0.2", "--sketch-rounds", "3",
                                      "--sketch-block-directions", "512"])
    args.set, args.epsilon = [], 10.0
    g = cli.config_from_args(args).resolved().generation
    assert (g.method, g.sketch_blocks, g.sketch_plan, g.sketch_radius, g.sketch_center, g.sketch_mean_share,
            g.sketch_rounds, g.sketch_block_directions) == ("oneshot", "28/0/0,7/0/0", "3:8,inf:2", 5.0, "half", 0.2,
                                                            3, 512)
    assert isinstance(g.sketch_rounds, int) and isinstance(g.sketch_radius, float)
    with pytest.raises(SystemExit):  # the choices of the setting
        _flow_parser().parse_args(["--sketch-center", "median"])


def test_help_names_every_method_and_every_setting_of_the_one_shot_method_and_the_table():
    helps = _helps()
    for method in METHODS:
        assert f"{method} (" in helps["--method"] or f"{method}:" in helps["--method"], method
    assert set(cli._HAND).isdisjoint(cli._FIELD_OPTIONS)  # an option made from a field replaces none written by hand
    options = {name: opt for opt, (name, *_) in cli.OPTIONS.items()}
    for leaf in ONESHOT_SETTINGS:
        assert f"generation.{leaf}" in options, leaf
    # every setting the ε table sets is a named option whose help gives the table's values and the one a run at
    # --epsilon 10 (the parser's ε) gets
    scopes = {"representation": "representation", "flow": "generation", "generation": "generation"}
    for eps, row in PRIVATE_ONLY_TABLE.items():
        for section, values in row.items():
            if section == "origins":  # where the row's settings came from (privacy.md), not settings
                continue
            for leaf, value in values.items():
                opt = options[f"{scopes[section]}.{leaf}"]
                text = helps[opt]
                shown = f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(value, str) else \
                    str(value)
                assert "ε table" in text and shown in text, (opt, shown, text)
                if len({r[section][leaf] for r in PRIVATE_ONLY_TABLE.values()}) > 1:
                    assert "--epsilon 10" in text, text


def test_help_says_which_value_a_run_gets_where_the_protocol_or_the_table_sets_it():
    # "(default: none)" was shown for --method, --rep-kind, --representation-share, --init-scale, --sketch-bins, ...
    none_means_none = {"--data-dir", "--celeba-dir", "--set", "--center"}  # --center's choice "none"
    for opt, text in _helps().items():
        if opt not in none_means_none:
            assert "(default: none)" not in text, (opt, text)
    helps = _helps()
    assert "oneshot with --public-size 0, flow otherwise" in helps["--method"]
    assert "'inf:16' for ε >= 3.16 (so at --epsilon 10 and inf)" in helps["--sketch-plan"]
    assert "'inf:2' for ε < 3.16" in helps["--sketch-plan"]
    cfg = MainJobConfig().with_settings(public_size=0).resolved()  # what the help says is what a run gets
    assert cfg.generation.sketch_plan == "inf:16" and cfg.generation.method == "oneshot"
    assert MainJobConfig(epsilon=1.0).with_settings(public_size=0).resolved().generation.sketch_plan == "inf:2"


def test_table_text_follows_the_table(monkeypatch):
    # the help is read from the ε table: a row or a setting added to it shows up without another line of the CLI
    table = {0.1: dict(generation=dict(sketch_rounds=8)), 1.0: dict(generation=dict(sketch_rounds=4)),
             10.0: dict(generation=dict(sketch_rounds=4))}
    monkeypatch.setattr(cli, "PRIVATE_ONLY_TABLE", table)
    text = cli._table_text("generation.sketch_rounds")
    assert "8 for ε < 0.316" in text and "4 for ε >= 0.316 (so at --epsilon 10 and inf)" in text
    assert cli._table_text("generation.sketch_plan") is None


# --------------------------------------------------------------------------------------------- refused before work
@pytest.mark.parametrize("argv, names", [
    (["--each-seed-at-epsilon"], ["--each-seed-at-epsilon", "flow_seeds=1", "ignore"]),
    (["--flow-seeds", "2", "--each-seed-at-epsilon", "--epsilon", "inf"], ["--each-seed-at-epsilon", "ignore"]),
    (["--quick", "--public-size", "0", "--validation-size", "100000"], ["--validation-size", "quick", "ignore"]),
    (["--public-size", "0", "--max-train", "1000", "--validation-size", "1000"], ["--validation-size", "max_train"]),
    (["--method", "gaussian", "--epochs", "5"], ["--epochs", "gaussian", "ignore"]),
    (["--public-size", "0", "--method", "gaussian", "--init-scale", "0.2"], ["--init-scale", "ignore"]),
    (["--quick", "--epochs", "5"], ["--epochs", "quick", "ignore"]),
    (["--public-size", "0", "--method", "flow", "--labels-from", "head"], ["--labels-from", "--rep-kind", "none"]),
    (["--quick", "--public-size", "0", "--sketch-rounds", "4"], ["--sketch-rounds", "quick", "ignore"]),
])
def test_options_a_run_would_ignore_are_refused(argv, names, capsys, monkeypatch):
    err = _refused(argv, capsys, monkeypatch)
    assert all(n in err for n in names), err


def test_each_seed_at_epsilon_and_the_quick_bounds_are_still_accepted_where_they_act():
    g = MainJobConfig().with_settings(flow_seeds=2, each_seed_at_epsilon=True).resolved().generation
    assert g.flow_seeds == 2 and g.each_seed_at_epsilon
    q = MainJobConfig(quick=True).with_settings(**{"generation.epochs": 1.5, "validation_size": 300,
                                                   "public_size": 0, "method": "flow"}).resolved()
    assert q.generation.epochs == 1.5 and q.data.validation_size == 300


def test_the_decoded_analysis_needs_epsilon_inf(capsys, monkeypatch):
    # at the default ε = 10 it read the images without noise into a folder named like a private run
    err = _refused(["--public-size", "0", "--method", "decoded"], capsys, monkeypatch)
    assert "--epsilon inf" in err and "ANALYSIS" in err
    ok = MainJobConfig(epsilon=math.inf).with_settings(public_size=0, method="decoded", kind="pixels").resolved()
    assert ok.generation.method == "decoded" and not ok.private


def test_distributed_outside_torchrun_says_to_launch_it_with_torchrun(capsys, monkeypatch):
    import torch.distributed as dist

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    err = _refused(["--distributed", "--labels", "public"], capsys, monkeypatch)
    assert "torchrun --nproc_per_node" in err and "-m fastdpot flow --distributed" in err and "RANK" in err
    assert not dist.is_initialized()


def test_a_run_of_absurd_length_is_refused_with_the_time_it_would_take(capsys, monkeypatch):
    # --quick lowered --epochs 1e12 to 2 without a word; without --quick the flow would take 1e12·n/B steps
    for argv in (["--quick", "--epochs", "1e12"], ["--epochs", "1e12"]):
        err = _refused(argv, capsys, monkeypatch)
        assert "at 1 ms a step, 31.7 years" in err and "--epochs" in err, err
    assert MainJobConfig().with_settings(**{"generation.epochs": 1e3}).resolved().generation.epochs == 1e3
    # the DP representation's DP-SGD passes likewise (--rep-epochs, private-only protocol)
    err = _refused(["--public-size", "0", "--method", "flow", "--rep-epochs", "1e12"], capsys, monkeypatch)
    assert "at 1 ms a step, 31.7 years" in err and "rep_epochs" in err, err


def test_the_flow_stage_refuses_more_steps_than_a_run_takes_before_any_release(monkeypatch):
    # epochs within the settings' bound, but T = epochs·n/B = 1e6 * 2000/100 = 2e7 steps on this data
    import fastdpot.experiments.mainjob.generation as gen

    def reached(*a, **kw):
        raise AssertionError("the flow's budget was calibrated")

    monkeypatch.setattr(gen, "seed_targets", reached)
    cfg = MainJobConfig().with_settings(class_conditional=False, **{"generation.epochs": 1e6}).resolved()
    codes = torch.nn.functional.normalize(torch.randn(2000, 4, generator=torch.Generator().manual_seed(0)), dim=1)
    with pytest.raises(ValueError, match=r"T = 2e\+07 flow steps .* at 1 ms a step, 5\.56 hours"):
        gen.generate_flow(cfg, codes, None, 10, 1, progress=False)


def test_every_fastdpot_flow_command_of_the_docs_is_accepted():
    # the pages' commands name options that exist and settings a run takes (a page showing a refused command fails)
    import pathlib
    import re
    import shlex

    root = pathlib.Path(__file__).resolve().parents[2]
    seen = 0
    for page in sorted((root / "docs").rglob("*.md")):
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if "fastdpot flow" not in line:
                    continue
                words = shlex.split(line.split("fastdpot flow", 1)[1].split("#", 1)[0])
                if "--help" in words:
                    continue
                args = _flow_parser().parse_args([w.replace("DIR", "/tmp") for w in words if w != "..."])
                cli.config_from_args(args).resolved()
                seen += 1
    assert seen >= 20
