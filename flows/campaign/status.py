"""What ``rlhfless status`` says of a run beyond its last commit: whether a process trains it
now (its lease), and so which state it is in.

The lease shows who holds it (host, pid, since when, when it expires), never its token. A
lease whose holder is alive is ``running``; one whose holder is gone (expired, or a process of
this host that no longer runs: ``lease.takeover_reason``) is shown as ``stale``, left by a
process that died, and the run is not running. A run whose lease is held before its first
commit (``train`` still setting it up) is ``running`` with no step committed. ``export`` and
``gc``, which need a commit, say why a run has none by the same judgement (:func:`committed_state`).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from actions.store import ObjectStore
from flows.campaign.holder import machine_identity
from flows.campaign.lease import pid_alive, read_lease, takeover_reason
from flows.campaign.reporting import json_safe
from flows.campaign.state import CampaignState, load_state


def lease_status(store: ObjectStore, run_id: str, now: float | None = None) -> dict[str, Any] | None:
    """The run's lease as ``status`` shows it, or None (no lease, or a damaged one):
    ``held`` (its holder runs), ``host``, ``pid``, ``since`` and ``expires`` (UTC),
    ``expires_in_s`` (negative: past), and ``stale``: why it no longer holds (None while held)."""
    record = read_lease(store, run_id)
    if record is None:
        return None
    now = time.time() if now is None else now
    stale = takeover_reason(record, now=now, host=socket.gethostname(), pid=os.getpid(), pid_alive=pid_alive,
                            break_lease=False, machine=machine_identity())
    return {"held": stale is None, "host": record.host, "pid": record.pid, "since": _utc(record.since),
            "expires": _utc(record.expires), "expires_in_s": round(record.expires - now, 1), "stale": stale}


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def run_state(state: CampaignState, lease: dict[str, Any] | None) -> str:
    """One word (or two) for where the run stands: ``running`` (its lease is held),
    ``stopped: budget`` (its budget stopped it: ``stopped_reason``), ``complete`` (its commits
    reach the steps it was configured for), ``incomplete`` (they do not: it failed, was
    interrupted or killed; ``train --resume`` continues it), or ``not running`` (a run
    committed before the configured steps were recorded)."""
    if lease is not None and lease["held"]:
        return "running"
    if state.stopped_reason:
        return "stopped: budget"
    if state.steps_configured is None:
        return "not running"
    return "complete" if state.step >= state.steps_configured else "incomplete"


def status_report(store: ObjectStore, run_id: str) -> dict[str, Any] | None:
    """What ``rlhfless status`` prints of ``run_id``: its last commit, state word and lease; or
    None where the store holds nothing of it (no such run). A run set up under a held lease, not
    yet committed, is ``running`` with ``steps_committed`` 0 and null for what only a commit
    records; one stopped or killed before its first commit (its lease or set-up objects left,
    no commit) is ``incomplete`` alike: ``train`` (``--resume`` or not) sets it up again."""
    state = load_state(store, run_id)
    lease = lease_status(store, run_id)
    if state is None:
        held = lease is not None and lease["held"]
        if lease is None and not store.list(f"runs/{run_id}/"):
            return None
        return {"run_id": run_id, "state": "running" if held else "incomplete", "steps_committed": 0, "lease": lease,
                **dict.fromkeys(("steps_configured", "policy_version", "weights_sha256", "spend", "stopped_reason",
                                 "last_eval", "last_metrics"))}
    last = state.steps[-1] if state.steps else {}
    return {
        "run_id": state.run_id, "state": run_state(state, lease), "steps_committed": state.step,
        "steps_configured": state.steps_configured, "lease": lease, "policy_version": state.policy_version,
        "weights_sha256": state.weights_sha256, "spend": state.spend, "stopped_reason": state.stopped_reason,
        "last_eval": state.evals[-1].model_dump(mode="json") if state.evals else None,
        "last_metrics": json_safe({k: v for k, v in last.items() if k != "plan"}),  # NaN is null
    }


def committed_state(store: ObjectStore, run_id: str, uri: str, then: str) -> CampaignState:
    """The latest commit of ``run_id``; else ValueError, one line saying why there is none
    as ``status`` judges the lease (:func:`lease_status`), then ``then`` (what the command
    does about it, e.g. ``"there is nothing to collect"``):

    * its lease is held: ``train`` is setting the run up (prepare, the profile, warm-up, the
      first evaluation come before its first commit), and who holds it;
    * a stale lease (its process gone, or expired) or set-up objects without a lease: its
      set-up was interrupted, and ``train --resume`` sets it up again;
    * nothing of it in ``uri``: the run id or the store is wrong.
    """
    state = load_state(store, run_id)
    if state is not None:
        return state
    lease = lease_status(store, run_id)
    if lease is None and not store.list(f"runs/{run_id}/"):
        raise ValueError(f"run {run_id!r} has no committed state in store {uri}; check the run id and --store")
    head = f"run {run_id!r} has committed nothing yet"
    if lease is not None and lease["held"]:
        raise ValueError(f"{head}: it is being trained by host {lease['host']!r} pid {lease['pid']} since "
                         f"{lease['since']}, and its first commit comes once set-up (prepare, the profile, "
                         f"warm-up, the first evaluation) is done; {then}")
    why = f" ({lease['stale']})" if lease is not None else ""
    raise ValueError(f"{head}: its set-up was interrupted{why}; `rlhfless train --run-id {run_id} --resume` with "
                     f"its configuration sets it up again; {then}")


def committed_runs(store: ObjectStore) -> list[str]:
    """The runs of ``store``, sorted, found by their commit records
    (``runs/<run>/campaign/commits/step-*.json``), never by the ``latest.json`` hint, which a
    crash between the first record and the hint leaves unwritten."""
    return sorted({parts[1] for parts in (k.split("/") for k in store.list("runs/"))
                   if len(parts) == 5 and parts[2:4] == ["campaign", "commits"] and parts[4].startswith("step-")
                   and parts[4].endswith(".json")})


def stored_runs(store: ObjectStore) -> list[str]:
    """Every run ``store`` holds an object of (``runs/<run>/...``), committed or not: a run
    stopped or failed before its first commit has its set-up objects or lease only."""
    return sorted({parts[1] for parts in (k.split("/") for k in store.list("runs/")) if len(parts) > 2})


def same_task_runs_hint(store: ObjectStore, run_id: str, explicit: bool) -> str:
    """For a ``--resume`` that finds no run ``run_id``: where ``run_id`` was derived (not set
    explicitly: ``<task>-<algorithm>-<fingerprint>``), the runs of the store with the same task
    and algorithm and how to resume one, since the fingerprint takes the settings as typed (a
    reward model path spelled otherwise names another run); else empty."""
    if explicit:
        return ""
    prefix = run_id.rsplit("-", 1)[0] + "-"
    others = [r for r in committed_runs(store) if r.startswith(prefix) and r != run_id]
    if not others:
        return ""
    return (f"; the store holds {', '.join(others[:5])}{' ...' if len(others) > 5 else ''} of the same task and "
            "algorithm, whose run ids were derived from other settings as typed (a path spelled otherwise "
            "included): pass --run-id RUN (run_id in a deployment's config) to resume one")
