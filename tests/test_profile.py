"""`rlhfless profile` writes a TPOT profile the planner can load."""

import json

from flows.cli import main
from flows.planning.profile import TpotProfile


def test_profile_writes_a_loadable_grid(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["profile", "--set", "model.hidden_size=32", "--set", "model.num_heads=2",
                 "--batch-sizes", "1,4", "--contexts", "8,16", "--output", str(out)])
    assert code == 0 and capsys.readouterr().out.strip().endswith("p.json")
    profile = TpotProfile.load(out)
    assert profile.batch_sizes == (1, 4) and all(s > 0 for row in profile.seconds for s in row)
    assert json.loads(out.read_text())["name"] == "measured-torch-cpu"


def test_profile_rejects_bad_grid(capsys):
    assert main(["profile", "--batch-sizes", "4,1"]) == 2
    assert "--batch-sizes" in capsys.readouterr().err
