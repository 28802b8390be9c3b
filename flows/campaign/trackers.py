"""Experiment trackers: ``observability.report_to: [tensorboard, wandb, mlflow, trackio]``.

Every committed step's metrics go to each tracker asked for, at step = steps committed, under
the campaign's own names (verl's: ``reward/mean``, ``response_length/mean``, ``timing_s/*``,
``perf/throughput``, ...; the full list is ``flows/step/metrics.py``) and, for the metrics TRL's
GRPOTrainer logs, under TRL's names too (``reward``, ``completions/mean_length``, ``kl``,
``grad_norm``, ...: ``tensorboard.TRL_NAMES``; ``reward_std`` and ``frac_reward_zero_std`` are
computed as TRL's, ``actions/rl/batch.py``). Evaluations go in as
``eval/accuracy``, ``eval/reward_mean``, ``eval/mean_length`` and ``eval/reward_fn/<name>``
(``EvalRecord.scalars``) at the step they were measured (0 = before RL). The values are the ones
``summary.json`` holds for the same step.

Each tracker is an optional extra (``pip install 'rlhfless[wandb]'``) configured by its own
environment, as in TRL: ``WANDB_PROJECT``, ``WANDB_MODE=offline``, ``MLFLOW_TRACKING_URI``
(a database such as ``sqlite:///mlflow.db``, or a ``file:`` store, which MLflow 3 allows only with
``MLFLOW_ALLOW_FILE_STORE=true`` and which cannot hold a metric beside a folder of the same name:
there TRL's ``reward`` and GRPO's ``loss``, beside ``reward/mean`` and ``loss/policy``, are left
out), ``MLFLOW_EXPERIMENT_NAME``, ``TRACKIO_PROJECT``... A campaign's
tracker runs are named by its run id and keyed by its ``tracker_key`` (``CampaignState``: made with
the run's first commit), so a resumed campaign continues the same runs where the tracker can
(wandb's run id ``<run_id>-<key>`` with ``resume="allow"``, the MLflow run tagged with both, trackio's
run ``<run_id>-<key>``), and a new campaign of the same run id (in another store, or after its
store was cleared) starts its own instead of appending its steps to an old one's. A run committed
before the key (``""``) finds its tracker runs by the run id alone, as it made them. A missing
package, or an environment the tracker cannot start with (``tracker_env.py``), is refused before anything is written
(``check_trackers``, called by the pre-flight); a tracker that fails later all the same fails
the campaign with one line naming it. A tracker's run ends as the campaign did (``RunEnd``:
finished, failed, or killed by Ctrl-C or SIGTERM).

A tracker run's configuration (wandb's and trackio's ``config``, MLflow's params, flattened to
dotted keys) is every setting the campaign runs with, as ``rlhfless config`` prints it
(:func:`run_settings`), not the run id's fingerprint (``CampaignConfig.identity``, which leaves
out steps, budgets and settings at their defaults). The configuration holds no secret by design
(keys and passwords come from the environment); a URL's user name and password are removed all
the same.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from actions.store.credentials import redact
from flows.campaign.tensorboard import ScalarBoard, step_scalars
from flows.campaign.tracker_env import check_mlflow, check_wandb, tracker_error
from flows.config import CampaignConfig

if TYPE_CHECKING:
    from flows.campaign.state import EvalRecord

PACKAGES = {"tensorboard": "tensorboardX", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
"""The module each tracker needs (the extra of the same name installs it)."""
DEFAULT_PROJECT = "rlhfless"
log = logging.getLogger(__name__)


def requested(cfg: CampaignConfig) -> list[str]:
    """The trackers a campaign reports to (``observability.tensorboard: true`` counts as
    ``tensorboard``), in a fixed order."""
    asked = set(cfg.observability.report_to) | ({"tensorboard"} if cfg.observability.tensorboard else set())
    return [t for t in PACKAGES if t in asked]


def check_trackers(cfg: CampaignConfig) -> None:
    """Raise ValueError (one line) for a tracker whose package is not installed, or whose
    environment would not let it start (``tracker_env.py``: an MLflow tracking URI MLflow
    cannot open or a server that does not answer, wandb online without an API key)."""
    check_packages(cfg)
    environment = {"mlflow": check_mlflow, "wandb": check_wandb}
    for tracker in requested(cfg):
        if tracker in environment:
            environment[tracker]()


def check_packages(cfg: CampaignConfig) -> None:
    """Raise ValueError (one line) for a tracker whose package is not installed."""
    for tracker in requested(cfg):
        if importlib.util.find_spec(PACKAGES[tracker]) is None:
            field = ("observability.tensorboard=true" if tracker == "tensorboard" and cfg.observability.tensorboard
                     else f"observability.report_to {tracker!r}")
            raise ValueError(f"{field} needs the {PACKAGES[tracker]} package; install it with pip install "
                             f"'rlhfless[{tracker}]' or remove {tracker!r} from observability.report_to")


def without_path_prefixes(scalars: dict[str, float]) -> dict[str, float]:
    """``scalars`` less each name that is a folder of another (``reward`` beside ``reward/mean``).

    >>> without_path_prefixes({"reward": 1.0, "reward/mean": 1.0, "reward_std": 0.0})
    {'reward/mean': 1.0, 'reward_std': 0.0}
    """
    return {k: v for k, v in scalars.items() if not any(o.startswith(k + "/") for o in scalars)}


def run_settings(cfg: CampaignConfig, run_id: str) -> dict[str, Any]:
    """Every setting of ``cfg`` as ``rlhfless config`` prints it (``flows/commands/config_show.py``):
    defaults filled in, automatic values resolved (PPO's ``algorithm.kl_kind`` is ``k1``, as
    set), the settings a dump leaves out at their defaults put back, and with a dataset file
    the generated task's sizes left out; ``run_id`` is the campaign's (resolved) id. Strings
    pass through ``redact`` (a URL's ``user:password@``)."""
    settings = cfg.settings()
    settings["run_id"] = run_id
    return _redacted(settings)


def _redacted(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _redacted(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_redacted(v) for v in tree]
    return redact(tree) if isinstance(tree, str) else tree


def evals_at(step: int, evals: Sequence[EvalRecord]) -> list[tuple[int, dict[str, float]]]:
    """(step, scalars) of the evaluations to report with step ``step`` (step 1 also brings the
    one before RL, at step 0); scalars as ``EvalRecord.scalars`` names them."""
    return [(ev.step, ev.scalars()) for ev in evals if ev.step == step or (step == 1 and ev.step == 0)]


class StopRequested(Exception):
    """A campaign that stopped because its operator asked, not because something failed (a
    step's flow run cancelled in Prefect): trackers record it ``KILLED``, as a Ctrl-C."""


@dataclass(frozen=True)
class RunEnd:
    """How the campaign ended, as trackers record it: MLflow's run status (``FINISHED``,
    ``FAILED``, ``KILLED``) and the exit code wandb's ``finish`` takes (0 finished, else failed)."""

    status: str
    exit_code: int

    @classmethod
    def of(cls, exc: BaseException | None) -> RunEnd:
        """The end of a campaign that raised ``exc`` (None: it returned). Ctrl-C and SIGTERM
        (``SystemExit``: the CLI's ``Terminated``) stop it, with the status a shell reports
        (130, 143); so does a :class:`StopRequested` (a step run cancelled in Prefect: the exit
        status the CLI gives its one line, 2); any other exception fails it."""
        if exc is None:
            return cls("FINISHED", 0)
        if isinstance(exc, KeyboardInterrupt):
            return cls("KILLED", 130)
        if isinstance(exc, SystemExit):
            return cls("KILLED", exc.code if isinstance(exc.code, int) and exc.code else 1)
        if isinstance(exc, StopRequested):
            return cls("KILLED", 2)
        return cls("FAILED", 1)


class Tracker(Protocol):
    def add_step(self, step: int, metrics: dict[str, Any], evals: Sequence[EvalRecord]) -> None: ...
    def close(self, end: RunEnd) -> None: ...


def keyed(run_id: str, key: str) -> str:
    """The tracker run of campaign ``run_id`` keyed ``key`` (``""``: a run from before keys).

    >>> keyed("nightly", "3f9a0c1e"), keyed("nightly", "")
    ('nightly-3f9a0c1e', 'nightly')
    """
    return f"{run_id}-{key}" if key else run_id


class _Wandb:
    def __init__(self, cfg: CampaignConfig, run_id: str, run_dir: Path, key: str = "") -> None:
        import wandb

        folder = Path(os.environ.get("WANDB_DIR") or run_dir)  # wandb writes <folder>/wandb/
        folder.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT), id=keyed(run_id, key),
                               name=run_id, resume="allow", dir=str(folder), config=run_settings(cfg, run_id),
                               reinit="create_new")

    def add_step(self, step: int, metrics: dict[str, Any], evals: Sequence[EvalRecord]) -> None:
        scalars = step_scalars(metrics)
        for at, values in evals_at(step, evals):
            if at < step:
                self._run.log(values, step=at)
            else:
                scalars.update(values)
        self._run.log(scalars, step=step)

    def close(self, end: RunEnd) -> None:
        self._run.finish(exit_code=end.exit_code)


class _Mlflow:
    def __init__(self, cfg: CampaignConfig, run_id: str, key: str = "") -> None:
        import mlflow

        self._mlflow = mlflow
        # The file store keeps a metric in a file named by its path: `reward` beside `reward/mean`
        # cannot exist there (a database backend holds both).
        self._file_store = mlflow.get_tracking_uri().startswith("file:") or "://" not in mlflow.get_tracking_uri()
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_PROJECT))
        tags = {"rlhfless_run_id": run_id, **({"rlhfless_tracker_key": key} if key else {})}
        found = mlflow.search_runs(filter_string=" and ".join(f"tags.{k} = '{v}'" for k, v in tags.items()),
                                   output_format="list")
        self._run = mlflow.start_run(run_id=found[0].info.run_id) if found else mlflow.start_run(
            run_name=run_id, tags=tags)
        if not found:
            mlflow.log_params({k: str(v)[:500] for k, v in _flat(run_settings(cfg, run_id)).items()})

    def add_step(self, step: int, metrics: dict[str, Any], evals: Sequence[EvalRecord]) -> None:
        scalars = step_scalars(metrics)
        if self._file_store:
            scalars = without_path_prefixes(scalars)
        self._mlflow.log_metrics(scalars, step=step, run_id=self._run.info.run_id)
        for at, values in evals_at(step, evals):
            self._mlflow.log_metrics(values, step=at, run_id=self._run.info.run_id)

    def close(self, end: RunEnd) -> None:
        self._mlflow.end_run(status=end.status)


class _Trackio:
    def __init__(self, cfg: CampaignConfig, run_id: str, key: str = "") -> None:
        import trackio

        self._trackio = trackio
        trackio.init(project=os.environ.get("TRACKIO_PROJECT", DEFAULT_PROJECT), name=keyed(run_id, key),
                     config=run_settings(cfg, run_id), resume="allow")

    def add_step(self, step: int, metrics: dict[str, Any], evals: Sequence[EvalRecord]) -> None:
        scalars = step_scalars(metrics)
        for at, values in evals_at(step, evals):
            if at < step:
                self._trackio.log(values, step=at)
            else:
                scalars.update(values)
        self._trackio.log(scalars, step=step)

    def close(self, end: RunEnd) -> None:  # trackio records no run status
        self._trackio.finish()


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


class Trackers:
    """The campaign's trackers together; with none asked for it does nothing. A tracker's
    failure (to start, to log, to end) is one ``ValueError`` naming it (``tracker_error``)."""

    def __init__(self, trackers: Sequence[tuple[str, Tracker]] = ()) -> None:
        self._trackers = list(trackers)

    @classmethod
    def open(cls, cfg: CampaignConfig, run_id: str, key: str = "") -> Trackers:
        """Start (or, for a resumed campaign, continue) each tracker run ``cfg`` asks for, keyed
        ``key`` (the campaign's ``tracker_key``); the pre-flight checked their environment."""
        check_packages(cfg)
        run_dir = Path(cfg.observability.tensorboard_dir or f"runs/{run_id}/tensorboard").parent
        made = cls()
        for name in requested(cfg):
            try:
                made._trackers.append((name, _open_one(name, cfg, run_id, run_dir, key)))
            except Exception as exc:
                made.close(RunEnd.of(exc), quiet=True)  # the ones started end as failed
                raise tracker_error(name, exc) from None  # the library's chain may quote a secret
        return made

    @property
    def enabled(self) -> bool:
        return bool(self._trackers)

    def add_step(self, step: int, metrics: dict[str, Any], evals: Sequence[EvalRecord]) -> None:
        for name, tracker in self._trackers:
            try:
                tracker.add_step(step, metrics, evals)
            except Exception as exc:
                raise tracker_error(name, exc) from None

    def close(self, end: RunEnd | None = None, *, quiet: bool = False) -> None:
        """End every tracker's run as the campaign ended (``end``; None: finished), so a failed
        or interrupted campaign is not recorded as a successful run. A tracker that fails to end
        does not keep the others open; the first failure is raised after all were closed, unless
        ``quiet`` (the campaign is already failing with its own error, which must not be replaced)."""
        end = end or RunEnd.of(None)
        failures = []
        for name, tracker in self._trackers:
            try:
                tracker.close(end)
            except Exception as exc:
                failures.append(tracker_error(name, exc))
        self._trackers = []
        for failure in failures:
            log.warning("%s", failure)
        if failures and not quiet:
            raise failures[0]


def _open_one(name: str, cfg: CampaignConfig, run_id: str, run_dir: Path, key: str) -> Tracker:
    if name == "tensorboard":
        cfg_tb = cfg.model_copy(deep=True)
        cfg_tb.observability.tensorboard = True
        return ScalarBoard.open(cfg_tb, run_id)
    if name == "wandb":
        return _Wandb(cfg, run_id, run_dir, key)
    if name == "mlflow":
        return _Mlflow(cfg, run_id, key)
    return _Trackio(cfg, run_id, key)
