"""Experiment trackers (observability.report_to) hold the same step metrics as summary.json,
in the run directory, and end their runs as the campaign ended; one whose environment would
not let it start is refused in one line before anything is written.

wandb runs in offline mode (its transaction log is read back record by record) and MLflow on a
``file:`` store (``MLFLOW_ALLOW_FILE_STORE=true``: MLflow 3 keeps it in maintenance mode), both
real libraries, and trackio on its local database where it is installed; nothing leaves the
machine. Each test skips, saying why,
where its tracker's package is not installed (``pip install 'rlhfless[wandb]'``...).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.campaign.state import EvalRecord
from flows.campaign.tensorboard import TRL_NAMES
from flows.campaign.trackers import check_trackers, step_scalars, without_path_prefixes
from flows.config import load_config

needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                 reason="wandb is not installed (pip install 'rlhfless[wandb]')")
needs_mlflow = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                  reason="mlflow is not installed (pip install 'rlhfless[mlflow]')")


def wandb_records(folder: Path) -> Iterator[Any]:
    """The ``Record`` protobufs of the offline run's transaction log under ``folder``: LevelDB
    log framing (a 7-byte file header; 32 KiB blocks of records with a 7-byte header: CRC, length,
    type FULL/FIRST/MIDDLE/LAST) around wandb's records."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(str(folder / "wandb" / "offline-run-*" / "run-*.wandb"))
    data, pos, block, pending = Path(path).read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):
            pos += left  # block trailer
            continue
        payload, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def read_wandb_history(folder: Path) -> dict[int, dict[str, float]]:
    """step -> logged values, from the offline run under ``folder``."""
    out: dict[int, dict[str, float]] = {}
    for record in wandb_records(folder):
        if record.HasField("history"):
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            out.setdefault(int(record.history.step.num), {}).update(
                {k: v for k, v in items.items() if not k.startswith("_")})
    return out


def read_wandb_exit_code(folder: Path) -> int | None:
    """The exit code the offline run's transaction log records (None: it has no exit record)."""
    codes = [record.exit.exit_code for record in wandb_records(folder) if record.HasField("exit")]
    return codes[-1] if codes else None


def read_mlflow_status(uri: str, run_id: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                filter_string=f"tags.rlhfless_run_id = '{run_id}'")
    return run.info.status


def read_mlflow(uri: str, run_id: str) -> dict[int, dict[str, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                filter_string=f"tags.rlhfless_run_id = '{run_id}'")
    out: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for m in client.get_metric_history(run.info.run_id, key):
            out.setdefault(int(m.step), {})[key] = m.value
    return out


def read_trackio(run_id: str) -> dict[int, dict[str, float]]:
    """step -> values of the run in trackio's local database (``TRACKIO_DIR``)."""
    from trackio.sqlite_storage import SQLiteStorage

    out: dict[int, dict[str, float]] = {}
    for row in SQLiteStorage.get_logs("rlhfless", run_id):
        values = {k: v for k, v in row.items() if k not in ("step", "timestamp") and not k.startswith("_")}
        out.setdefault(int(row["step"]), {}).update(values)
    return out


def expected(summary: dict) -> dict[int, dict[str, float]]:
    """What every tracker must hold: each step's scalars as summary.json has them, plus the
    evaluations at the steps they were measured."""
    out = {n: step_scalars(s) for n, s in enumerate(summary["steps"], start=1)}  # at steps committed
    for ev in summary["evals"]:
        out.setdefault(int(ev["step"]), {}).update(EvalRecord(**ev).scalars())
    return out


def assert_same(held: dict[int, dict[str, float]], want: dict[int, dict[str, float]], who: str) -> None:
    assert sorted(held) == sorted(want), f"{who}: steps {sorted(held)} != {sorted(want)}"
    for step, values in want.items():
        for name, value in values.items():
            assert name in held[step], f"{who}: {name} missing at step {step}"
            assert held[step][name] == pytest.approx(value, rel=1e-6, abs=1e-9), f"{who}: {name} at step {step}"


def test_scalars_carry_trl_names_beside_the_campaign_names():
    s = step_scalars({"reward/mean": 0.25, "reward/std": 0.5, "response_length/mean": 7.0, "grad_norm": 1.5,
                      "plan": {"actors": 2}, "step": 1.0})
    assert s["reward"] == s["reward/mean"] == 0.25 and s["completions/mean_length"] == 7.0 and s["grad_norm"] == 1.5
    assert "plan" not in s and "step" not in s and "reward" in set(TRL_NAMES.values())
    # the batch's std is not TRL's reward_std (the mean of the groups' stds): no TRL name for it
    assert "reward_std" not in s and "reward/std" not in TRL_NAMES


def test_a_missing_tracker_package_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    cfg = load_config(None, ["observability.report_to=[wandb]"])
    with pytest.raises(ValueError, match=r"observability.report_to 'wandb' needs the wandb package; install it with "
                                         r"pip install 'rlhfless\[wandb\]'"):
        check_trackers(cfg)
    with pytest.raises(ValueError, match="observability.report_to.0"):
        load_config(None, ["observability.report_to=[neptune]"])


@needs_mlflow
@pytest.mark.parametrize("uri, env, says", [
    ("bogus://nowhere", {}, "MLFLOW_TRACKING_URI 'bogus://nowhere' names no tracking store MLflow can open here "
                            "(scheme 'bogus'; known: "),
    ("file:///nowhere/mlruns", {"MLFLOW_ALLOW_FILE_STORE": "false"},
     "is a file store, which MLflow 3 opens only with MLFLOW_ALLOW_FILE_STORE=true"),
    # a refused connection: MLflow's client alone would retry it for about four minutes
    ("http://bob:hunter2pw@127.0.0.1:9", {}, "MLFLOW_TRACKING_URI 'http://[REDACTED]@127.0.0.1:9': the tracking "
                                             "server did not answer within 3 s ([Errno 111] Connection refused)"),
])
def test_an_mlflow_tracking_uri_mlflow_cannot_use_is_refused_in_one_line_without_writing(tmp_path, monkeypatch, uri,
                                                                                         env, says):
    import time

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    t0 = time.monotonic()
    with pytest.raises(ValueError) as refused:
        check_trackers(load_config(None, ["observability.report_to=[mlflow]"]))
    message = str(refused.value)
    assert message.startswith("observability.report_to 'mlflow': ") and says in message and "\n" not in message
    assert "hunter2pw" not in message and time.monotonic() - t0 < 15 and not list(tmp_path.iterdir())


@needs_mlflow
def test_a_usable_mlflow_database_uri_passes_and_is_not_created(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    check_trackers(load_config(None, ["observability.report_to=[mlflow]"]))
    assert not (tmp_path / "mlflow.db").exists()  # the check reads; the tracker creates it


@needs_wandb
def test_wandb_online_without_an_api_key_is_refused_in_one_line(tmp_path, monkeypatch):
    from wandb.sdk import wandb_setup

    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no settings file
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(wandb_setup, "_singleton", None)  # wandb reads its environment once per process
    cfg = load_config(None, ["observability.report_to=[wandb]"])
    with pytest.raises(ValueError, match=r"^observability.report_to 'wandb': no W&B API key is configured for \S+ "
                                         r"and WANDB_MODE is not offline; set WANDB_API_KEY \(or run `wandb login`\), "
                                         r"or WANDB_MODE=offline"):
        check_trackers(cfg)
    for mode in ("offline", "disabled"):
        monkeypatch.setenv("WANDB_MODE", mode)
        monkeypatch.setattr(wandb_setup, "_singleton", None)
        check_trackers(cfg)


def test_a_tracker_that_fails_to_start_is_one_line_and_the_started_ones_are_closed(monkeypatch):
    from flows.campaign import trackers

    closed = []

    class Board:
        def close(self, *args):
            closed.append("tensorboard")

    class Refusing:
        def __init__(self, *args):
            raise RuntimeError("API request to http://bob:hunter2pw@tracker:5000/api failed\nwith a traceback")

    monkeypatch.setattr(trackers, "check_packages", lambda cfg: None)
    monkeypatch.setattr(trackers.ScalarBoard, "open", classmethod(lambda cls, cfg, run_id: Board()))
    monkeypatch.setattr(trackers, "_Mlflow", Refusing)
    with pytest.raises(ValueError) as refused:
        trackers.Trackers.open(load_config(None, ["observability.report_to=[tensorboard,mlflow]"]), "r")
    assert str(refused.value) == ("observability.report_to 'mlflow': RuntimeError: API request to http://[REDACTED]"
                                  "@tracker:5000/api failed with a traceback; check MLFLOW_TRACKING_URI")
    assert refused.value.__suppress_context__ and closed == ["tensorboard"]


@needs_mlflow
def test_train_refuses_a_bad_tracker_environment_before_anything_is_written(tmp_path, monkeypatch, capsys):
    from flows.commands.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://nowhere")
    store = tmp_path / "store"
    assert main(["train", "--set", f"store.uri={store}", "--set", "observability.report_to=[mlflow]",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlhfless: error: observability.report_to 'mlflow': MLFLOW_TRACKING_URI")
    assert not store.exists() and not (tmp_path / "run").exists()


def test_a_run_ends_in_the_trackers_as_the_campaign_ended():
    from flows.campaign.trackers import RunEnd

    class Terminated(SystemExit):  # as the CLI's, raised by SIGTERM
        pass

    assert RunEnd.of(None) == RunEnd("FINISHED", 0)
    assert RunEnd.of(RuntimeError("reward function raised")) == RunEnd("FAILED", 1)
    assert RunEnd.of(KeyboardInterrupt()) == RunEnd("KILLED", 130)
    assert RunEnd.of(Terminated(143)) == RunEnd("KILLED", 143)
    # a step run cancelled in Prefect stops the campaign on request: not a failure
    from flows.campaign.run import StepRunCancelled
    assert RunEnd.of(StepRunCancelled("stopped after step 2/4: its step run 'x' was cancelled")) == RunEnd("KILLED", 2)


@pytest.mark.parametrize("raised, end", [(RuntimeError("action score failed"), ("FAILED", 1)),
                                         (KeyboardInterrupt(), ("KILLED", 130))])
def test_a_campaign_that_fails_or_is_interrupted_ends_its_tracker_runs_so(tiny_config, monkeypatch, raised, end):
    from flows.campaign import run, trackers

    ended = []

    class Recording:
        def add_step(self, *args):
            pass

        def close(self, how):
            ended.append((how.status, how.exit_code))

    def fail(*args):
        raise raised

    monkeypatch.setattr(trackers, "_open_one", lambda *args: Recording())
    monkeypatch.setattr(run, "_start", fail)
    cfg = tiny_config("invoker.kind=inprocess", "observability.report_to=[tensorboard]")
    with pytest.raises(type(raised)):
        run.run_campaign(cfg, progress=lambda m: None)
    assert ended == [end]


def test_a_step_committed_before_a_stop_during_its_collection_is_in_the_trackers(tiny_config, prefect_harness,
                                                                                   monkeypatch):
    """Ctrl-C while the store is collected after step 1's commit: the trackers hold step 1 and
    the evaluation before RL that comes with it, as the store does (a resume starts at step 2)."""
    from actions.store import open_store
    from flows.campaign import run, trackers
    from flows.campaign.state import load_state

    logged, ended = [], []

    class Recording:
        def add_step(self, step, metrics, evals):
            logged.append((step, [at for at, _ in trackers.evals_at(step, evals)]))

        def close(self, how):
            ended.append(how.status)

    def interrupted(self, state):
        raise KeyboardInterrupt

    monkeypatch.setattr(trackers, "_open_one", lambda *args: Recording())
    monkeypatch.setattr(run.Collector, "__call__", interrupted)
    cfg = tiny_config("invoker.kind=inprocess", "observability.report_to=[tensorboard]", "run_id=cut")
    with pytest.raises(KeyboardInterrupt):
        run.run_campaign(cfg, progress=lambda m: None)
    assert load_state(open_store(cfg.store.uri), "cut").step == 1
    assert logged == [(1, [0])] and ended == ["KILLED"]


def _offline_wandb_and_file_mlflow(tmp_path: Path, monkeypatch) -> str:
    """wandb offline (its folder in each tracker's run directory) and MLflow on a ``file:``
    store under ``tmp_path``, whose URI this returns."""
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri


@needs_wandb
@needs_mlflow
def test_wandb_and_mlflow_record_a_failed_and_a_killed_run(tmp_path, monkeypatch):
    from flows.campaign.trackers import RunEnd, _Mlflow, _Wandb

    uri = _offline_wandb_and_file_mlflow(tmp_path, monkeypatch)
    cfg = load_config(None, [])
    for run_id, end in (("failed", RunEnd("FAILED", 1)), ("killed", RunEnd("KILLED", 143))):
        for tracker in (_Wandb(cfg, run_id, tmp_path / run_id), _Mlflow(cfg, run_id)):
            tracker.add_step(1, {"reward/mean": 0.5}, [])
            tracker.close(end)
        assert read_mlflow_status(uri, run_id) == end.status
        assert read_wandb_exit_code(tmp_path / run_id) == end.exit_code


@needs_wandb
@needs_mlflow
def test_a_resume_continues_its_tracker_runs_and_a_new_campaign_of_the_same_id_starts_its_own(tmp_path,
                                                                                             monkeypatch):
    """Tracker runs are keyed by the campaign's ``tracker_key``: its resume appends to them, a new
    campaign with the same run id (another store, a cleared one) does not rewrite their steps."""
    from mlflow.tracking import MlflowClient

    from flows.campaign.trackers import RunEnd, _Mlflow, _Wandb

    uri = _offline_wandb_and_file_mlflow(tmp_path, monkeypatch)
    cfg = load_config(None, [])
    runs = (("aaaa", 1, 0.25), ("aaaa", 2, 0.5), ("bbbb", 1, 0.75))  # a campaign, its resume, a new campaign
    for i, (key, step, reward) in enumerate(runs):
        for tracker in (_Wandb(cfg, "nightly", tmp_path / f"wb{i}", key), _Mlflow(cfg, "nightly", key)):
            tracker.add_step(step, {"reward/mean": reward}, [])
            tracker.close(RunEnd("FINISHED", 0))
    wandb_ids = [{r.run.run_id for r in wandb_records(tmp_path / f"wb{i}") if r.HasField("run")} for i in range(3)]
    assert wandb_ids == [{"nightly-aaaa"}, {"nightly-aaaa"}, {"nightly-bbbb"}]
    client = MlflowClient(tracking_uri=uri)
    found = client.search_runs([e.experiment_id for e in client.search_experiments()],
                               filter_string="tags.rlhfless_run_id = 'nightly'")
    history = {r.data.tags["rlhfless_tracker_key"]: [(m.step, m.value) for m in
                                                      client.get_metric_history(r.info.run_id, "reward/mean")]
               for r in found}
    assert history == {"aaaa": [(1, 0.25), (2, 0.5)], "bbbb": [(1, 0.75)]}


def test_trackers_do_not_change_the_run_identity():
    assert load_config(None, []).fingerprint() == load_config(None, ["observability.report_to=[mlflow]"]).fingerprint()


@needs_wandb
@needs_mlflow
def test_campaign_metrics_land_in_wandb_mlflow_and_tensorboard_as_in_the_summary(tmp_path, prefect_harness,
                                                                                 monkeypatch):
    # no capsys: Prefect's console handler keeps the stream of the test that first logs a flow
    # run, and capsys closes its stream when its test ends
    from flows.campaign.tensorboard import read_scalars
    from flows.commands.cli import main

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.chdir(tmp_path)  # a tracker that ignored --out would write runs/tracked/ here
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)  # wandb's folder goes into the run directory, --out
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    trackio = importlib.util.find_spec("trackio") is not None  # compared too where installed
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x keeps the file store behind this switch
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "algorithm": {"batch_size": 16, "group_size": 4}, "warmup": {"steps": 2}, "generation": {"max_new_tokens": 8},
        "data": {"num_train_prompts": 16, "num_eval_prompts": 4}, "steps": 2, "eval_every": 1, "run_id": "tracked",
        "store": {"uri": str(tmp_path / "store")}, "invoker": {"kind": "inprocess"},
        "observability": {"report_to": ["tensorboard", "wandb", "mlflow"] + ["trackio"] * trackio}}))
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    want = expected(summary)
    assert sorted(want) == [0, 1, 2] and "reward" in want[1] and "grad_norm" in want[1]
    assert not (tmp_path / "runs").exists()  # TensorBoard's and wandb's files are in --out
    assert_same(read_wandb_history(tmp_path / "run"), want, "wandb")
    assert_same(read_mlflow(uri, "tracked"), {s: without_path_prefixes(v) for s, v in want.items()}, "mlflow")
    assert read_wandb_exit_code(tmp_path / "run") == 0 and read_mlflow_status(uri, "tracked") == "FINISHED"
    if trackio:
        assert_same(read_trackio("tracked"), want, "trackio")
    tb = {}
    for name, points in read_scalars(tmp_path / "run" / "tensorboard").items():
        for step, value in points:
            tb.setdefault(step, {})[name] = value
    assert_same(tb, want, "tensorboard")
    # a resume continues the campaign's MLflow run (one run, every step once)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--steps", "3", "--resume"]) == 0
    resumed = expected(json.loads((tmp_path / "run" / "summary.json").read_text()))
    assert sorted(resumed) == [0, 1, 2, 3]
    assert_same(read_mlflow(uri, "tracked"), {s: without_path_prefixes(v) for s, v in resumed.items()}, "mlflow")
