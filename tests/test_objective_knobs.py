"""A knob of another objective than the one configured is named in one warning line, where the
user set it off its default (``train`` and ``config``: a setting; ``simulate``: a flag)."""

from __future__ import annotations

import argparse

import pytest

from flows.planning.objective import unread_knob_warnings


def test_a_knob_of_another_objective_is_one_line_naming_both_objectives():
    (line,) = unread_knob_warnings("budget", {"objective", "value_of_time_usd_per_s", "budget_actors"})
    assert line == ("warning: scaling.value_of_time_usd_per_s is the 'value' objective's knob; "
                    "scaling.objective is 'budget', which ignores it")
    (line,) = unread_knob_warnings("value", {"budget_actors"})
    assert "scaling.budget_actors is the 'budget' objective's knob; scaling.objective is 'value'" in line
    assert unread_knob_warnings("value", {"value_of_time_usd_per_s", "n_max"}) == []


@pytest.mark.parametrize("sets, warned", [
    (["scaling.objective=budget", "scaling.value_of_time_usd_per_s=0.01"], True),
    (["scaling.budget_actors=2"], True),  # the default objective, value
    (["scaling.objective=budget", "scaling.budget_actors=2"], False),
    (["scaling.objective=budget"], False),  # a default is no setting
])
def test_train_warns_of_a_knob_its_objective_ignores(monkeypatch, capsys, tmp_path, sets, warned):
    import flows.commands.cli as cli

    def stop(*args, **kwargs):
        raise cli.UsageError("stopped before the campaign")

    monkeypatch.setattr(cli, "_preflight", stop)
    args = ["train", "--out", str(tmp_path / "out"), *[a for s in sets for a in ("--set", s)]]
    assert cli.main(args) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning: scaling.")]
    assert len(lines) == (1 if warned else 0), lines


def test_config_warns_on_stderr_and_a_configuration_it_wrote_back_warns_of_nothing(capsys, tmp_path, monkeypatch):
    import flows.commands.cli as cli

    assert cli.main(["config", "--set", "scaling.objective=budget", "--set", "scaling.time_slack=0.2"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == ["warning: scaling.time_slack is the 'slack' objective's knob; scaling.objective is "
                                "'budget', which ignores it"]
    assert "warning" not in out  # stdout stays the YAML that --config reads
    (tmp_path / "whole.yaml").write_text(out)  # every knob written, all but time_slack at their defaults
    assert cli.main(["config", "--config", str(tmp_path / "whole.yaml")]) == 0
    assert capsys.readouterr().err.splitlines() == err.splitlines()

    def stop(*args, **kwargs):
        raise cli.UsageError("stopped before the campaign")

    monkeypatch.setattr(cli, "_preflight", stop)
    assert cli.main(["config"]) == 0
    (tmp_path / "default.yaml").write_text(capsys.readouterr().out)
    assert cli.main(["train", "--out", str(tmp_path / "o"), "--config", str(tmp_path / "default.yaml")]) == 2
    assert "warning: scaling." not in capsys.readouterr().err


@pytest.mark.parametrize("flags, warned", [
    (["--objective", "budget", "--value-of-time", "8"], "--value-of-time is the 'value' objective's knob; "
                                                        "--objective is 'budget', which ignores it"),
    (["--objective", "value", "--budget-actors", "4", "--lam", "0.5"], "--budget-actors is the 'budget'"),
    (["--objective", "budget", "--budget-actors", "4"], None),
    (["--objective", "paper", "--value-of-time", "8"], "--value-of-time"),
])
def test_simulate_warns_of_a_flag_its_objective_ignores(capsys, tmp_path, flags, warned):
    from flows.simulate.cli import add_arguments, build_model

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    build_model(parser.parse_args(["--trace", str(tmp_path / "t.jsonl"), *flags]))
    lines = [x for x in capsys.readouterr().err.splitlines() if "objective's knob" in x]
    if warned is None:
        assert lines == []
    else:
        assert any(warned in x and x.startswith("rlhfless simulate: warning: ") for x in lines), lines
    if "--lam" in flags:  # the paper objective's knob too: one line each
        assert len(lines) == 2, lines
