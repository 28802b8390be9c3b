"""``train``'s bill line: action-seconds counted once per GPU an action holds say so."""

import pytest

from flows.commands.cli import _print_summary


def _summary(unit: str) -> dict:
    return {"billed_gpu_seconds": 43.2, "billing": {"unit": unit, "meaning": ""}, "wall_seconds": 21.6,
            "wall_seconds_total": 21.6, "billed_gpu_seconds_by_part": {"steps": 40.0, "evaluations": 2.0, "setup": 1.2}}


@pytest.mark.parametrize("unit, gpus, shown", [
    ("action-seconds", 2, "billed 43.2 action-seconds x 2 GPUs per actor (steps 40.0"),
    ("action-seconds", 1, "billed 43.2 action-seconds (steps 40.0"),
    ("GPU-seconds", 2, "billed 43.2 GPU-seconds (steps 40.0"),  # the unit already counts the GPUs
])
def test_the_bill_line_names_the_gpus_per_actor_it_counts(capsys, tmp_path, unit, gpus, shown):
    _print_summary(_summary(unit), tmp_path / "summary.json", gpus)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "billed" in x]
    assert shown in line, line
