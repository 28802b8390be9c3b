"""The training campaign: set up once, then loop over RLHF steps, committing each one.

``rlhf_campaign`` resumes from the last committed step of its run, evaluates on the held-out
set before RL, every ``eval_every`` steps and at the end, stops cleanly before a step that
would exceed the budget (evaluating the policy it stops with, and committing why it stopped),
and returns the JSON summary the CLI writes.

Each concern lives in its own module, so the loop below reads top to bottom: the lease
(``holding.py``), set-up and evaluation (``setup.py``), one step (``advance.py``), garbage
collection (``collect.py``), the pool's pre-warm (``warming.py``), the background queue that
keeps Prefect's API calls off the critical path (``overhead.py``, ``prestart.py``) and
reports (``reporting.py``).
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Cancelled, Failed, State

from actions.store import ObjectStore, open_store
from actions.store.credentials import redact
from flows.campaign.advance import run_one_step
from flows.campaign.budget import budget_stop, evaluation_due, resume_stop, runs_a_step
from flows.campaign.collect import Collector
from flows.campaign.drafts import drop_unreferenced
from flows.campaign.earlier_ids import resumed_run_id
from flows.campaign.holding import holding_lease
from flows.campaign.learning_warnings import learning_warnings
from flows.campaign.lease import LeaseHeld, RunLease
from flows.campaign.live_profile import finish_profiling, start_profiling
from flows.campaign.overhead import Background, StepClock, hold_for_training, open_gate_when_running, quiet_step_flows
from flows.campaign.preflight import check_campaign
from flows.campaign.prestart import CancelledBeforeStart, FlowRunStarter
from flows.campaign.progress_line import print_line
from flows.campaign.reporting import Reporter, summarize
from flows.campaign.resume_setup import observed_setup_s, record_setup
from flows.campaign.setup import add_setup_spend, evaluate, model_ref, set_up
from flows.campaign.state import CampaignRefused, CampaignState, check_resume, commit_state, load_state
from flows.campaign.trackers import StopRequested
from flows.campaign.warming import PoolWarming
from flows.config import CampaignConfig
from flows.invokers.factory import make_invoker, pool_size
from flows.planning.planner import Planner
from flows.planning.record import StepRecord
from flows.planning.retention import Retention
from flows.step.context import RunContext, set_context
from flows.step.flow import rlhf_step
from flows.step.invoke import accounted
from flows.step.metrics import billing, timing_key
from flows.step.phase import build_planner

Progress = Callable[[str], None]


def run_campaign(cfg: CampaignConfig, *, resume: bool = False, progress: Progress = print_line,
                 store: ObjectStore | None = None, break_lease: bool = False) -> dict[str, Any]:
    """Run (or resume) a campaign to ``cfg.steps`` steps and return its summary.

    First the checks ``rlhfless train`` makes before it starts the flow
    (``flows/campaign/preflight.py``): a config that would fail after set-up wrote the store is
    refused with the same ``ValueError`` before anything is written. Then holds the run's
    lease throughout (``flows/campaign/holding.py``); every commit and collection checks it first.

    Raises:
        ValueError: those checks' refusal, marked as one (:func:`refused_at_start`), as are
            ``LeaseHeld`` (another process holds the run) and ``CampaignRefused`` (the run
            exists and cannot be continued as asked).
        StepRunCancelled: a step's own flow run was cancelled while it ran; that step is
            committed and the campaign stops as a cancelled one does (:func:`_loop`).
    """
    started = time.time()
    store = store or open_store(cfg.store.uri)  # as the CLI: first, so a resume's checks know the run exists
    if resume and (earlier := resumed_run_id(cfg, store)) is not None:  # a run derived before (earlier_ids.py)
        cfg = cfg.model_copy(update={"run_id": earlier})
    run_id = cfg.resolved_run_id()
    try:
        check_campaign(cfg, resumed=resume and load_state(store, run_id) is not None)
    except ValueError as exc:
        setattr(exc, _REFUSED, True)  # a ValueError later in the run is no refusal: it keeps its traceback
        raise
    with holding_lease(cfg, store, run_id, break_lease=break_lease, progress=progress) as lease:
        return _run_leased(cfg, store, run_id, lease, resume, progress, started)


class SessionWall:
    """This process's wall time since ``started``, added to the state at each commit (so a
    resumed run's ``spend["wall_seconds"]`` continues the runs before it)."""

    def __init__(self, started: float) -> None:
        self.started = self.mark = started

    def stamp(self, state: CampaignState) -> None:
        """Add the time since the last stamp (or the start) to ``state``, about to be committed."""
        now = time.time()
        state.add_wall(now - self.mark)
        self.mark = now

    def session_s(self) -> float:
        return time.time() - self.started

    def total_s(self, state: CampaignState) -> float:
        """Every process's wall time on the run: ``state``'s, committed, and this one's since."""
        return state.spend["wall_seconds"] + time.time() - self.mark


def _run_leased(cfg: CampaignConfig, store: ObjectStore, run_id: str, lease: RunLease, resume: bool,
                progress: Progress, started: float) -> dict[str, Any]:
    existing = load_state(store, run_id)
    for line in check_resume(existing, cfg, resume, store):
        progress(line)
    if existing is not None and existing.step >= cfg.steps:  # a schedule's run after the last step says so
        progress(f"run {run_id!r} is complete: {existing.step}/{cfg.steps} steps committed; nothing to train "
                 f"(raise steps above {existing.step} to train further)")
    num_workers = pool_size(cfg)
    # Prefect artifacts and each step's flow run (flows/campaign/prestart.py), off the steps'
    # critical path: made in the generation phase of a step, never beside its training
    quiet_api = threading.Event()
    publisher = Background(quiet_api)
    tracker_key = existing.tracker_key if existing is not None else secrets.token_hex(4)  # committed by _start
    reporter = Reporter(cfg, run_id, publisher, progress, tracker_key)
    invoker = make_invoker(cfg, num_workers)
    ctx = RunContext(config=cfg, store=store, invoker=invoker, run_id=run_id)
    set_context(ctx)
    step_flow = FlowRunStarter(open_gate_when_running(rlhf_step, quiet_api), publisher)
    ctx.before_train = functools.partial(hold_for_training, quiet_api, publisher)
    collect = Collector(store, Retention(cfg.store.keep_last, cfg.store.checkpoint_every), lease, progress)
    warming = PoolWarming(cfg, invoker, num_workers)
    failure: BaseException | None = None  # how the trackers record the run's end
    wall = SessionWall(started)
    try:
        state = _start(ctx, existing, lease, collect, progress, wall, tracker_key)
        if state.stopped_reason is None and runs_a_step(cfg, state):
            warming.before_first_step(model_ref(ctx, state).model_dump(mode="json"))
        reporter.start(state.step)
        planner = build_planner(ctx, num_workers, state.planner)  # once: from the config and the profile
        with quiet_step_flows():
            state = _loop(ctx, state, planner, lease, collect, warming, step_flow, quiet_api, reporter, wall)
    except BaseException as exc:  # Ctrl-C and SIGTERM too: a tracker records them as killed
        failure = exc
        raise
    finally:
        set_context(None)
        warming.join()
        invoker.close()
        try:
            try:
                step_flow.close()  # a flow run prepared for a step that did not come
            finally:
                publisher.wait()
        except BaseException as exc:  # the run's own failure, if any, is the one trackers record
            failure = failure or exc
            raise
        finally:
            reporter.close(failure)  # last: a tracker that fails to end skips no other clean-up
    return summarize(state, wall.session_s(), wall.total_s(state), billing=billing(cfg.invoker.kind), gc=collect.totals,
                     warnings=learning_warnings(state.steps, cfg.steps, cfg.algorithm.name,
                                                cfg.algorithm.mask_truncated),
                     profile=ctx.live.describe() if ctx.live else None)


def _start(ctx: RunContext, existing: CampaignState | None, lease: RunLease, collect: Collector,
           progress: Progress, wall: SessionWall, tracker_key: str) -> CampaignState:
    """The state to continue from: a new run's record 0, committed, or the last commit of a
    resumed one (whose profile comes from the store's cache, usually). A resume profiles again
    only when it will run a step: one that runs none (the run is complete, or the budget cannot
    pay the set-up and the next step: ``resume_stop``, its ``stopped_reason``) invokes no action,
    so its summary bills what was committed. ``tracker_key`` keys a new run's tracker runs."""
    state = existing
    if state is None:
        state = set_up(ctx, progress)
        state.steps_configured = ctx.config.steps
        state.retention = _retention_of(ctx.config)
        state.tracker_key = tracker_key
        lease.check()
        wall.stamp(state)
        commit_state(ctx.store, state)
    else:  # finish a collection a crash may have cut short
        collect(state)
    state.stopped_reason = None
    if ctx.live is None and state.step < ctx.config.steps:  # a resume: the budget judged before its set-up
        state.stopped_reason = resume_stop(ctx.config, state, observed_setup_s(ctx.store, state.run_id, state.step))
        if state.stopped_reason is None:
            tokens = ctx.token_table(state.prepared.tokens_key)
            with accounted() as ledger:  # set-up's spend, committed with its first step
                ctx.live = finish_profiling(ctx, start_profiling(ctx, model_ref(ctx, state), tokens), progress)
            add_setup_spend(ctx, state, ledger, resumed=True)
            # kept now: should the budget stop the run before its first step, nothing commits it
            record_setup(ctx.store, state.run_id, state.step, state.resume_setup_s or 0.0)
    state.steps_configured = ctx.config.steps  # a resume's own, committed with its next step
    state.retention = _retention_of(ctx.config)
    return state


def _retention_of(cfg: CampaignConfig) -> dict[str, int | None]:
    """The retention a commit records for ``rlhfless gc`` (``CampaignState.retention``)."""
    return {"keep_last": cfg.store.keep_last, "checkpoint_every": cfg.store.checkpoint_every}


def _loop(ctx: RunContext, state: CampaignState, planner: Planner, lease: RunLease, collect: Collector,
          warming: PoolWarming, step_flow: FlowRunStarter, quiet_api: threading.Event,
          reporter: Reporter, wall: SessionWall) -> CampaignState:
    """Steps until ``steps`` or the budget: run one (planned and observed by ``planner``),
    pre-warm the next, evaluate, commit, report, collect. The budget is checked as soon as a
    step's cost is known (before its evaluation, which ``budget_stop`` reserves where due): the
    step after which it refuses the next is the run's last, so its policy is evaluated and its
    one commit record carries ``stopped_reason`` (``status``).

    A step reaches the trackers right after its commit, before the collection, so a stop during
    the collection (Ctrl-C, SIGTERM, a kill) leaves no committed step they lack. Only a stop in
    the instant between the commit and the report can (no store call lies between them): a
    resume does not log that step again, since nothing records which steps a tracker received
    and logging one it did receive would repeat it.

    A step's ``timing_s/commit`` is the previous step's commit and collection, which run in this
    step's period (the step's own happen after its metrics are committed); 0 for a run's first.

    A step whose own flow run was cancelled while it ran (nothing stops a subflow in its
    parent's process) ends the campaign: that step is evaluated where due and committed as
    any, its run set Cancelled, and ``StepRunCancelled`` unwinds the campaign as a cancel of
    the campaign run does; one cancelled before it started stops it so, with nothing to commit.

    Raises:
        StepRunCancelled: after that step's commit (:func:`_stop_cancelled`)."""
    cfg = ctx.config
    tokens = ctx.token_table(state.prepared.tokens_key)
    clock = StepClock()
    commit_s = 0.0
    stop = state.stopped_reason or budget_stop(cfg, state)  # a resumed run may have no budget left
    if state.step < cfg.steps and not stop:
        step_flow.prepare()
    while not stop and state.step < cfg.steps:
        lease.check()
        old_drafts = state.draft_index
        try:
            state, record = run_one_step(ctx, state, planner, tokens,
                                         functools.partial(step_flow.run, prepare_next=state.step + 1 < cfg.steps))
        except CancelledBeforeStart as before:  # the step's run, prepared ahead: nothing ran, nothing to commit
            raise _stop_cancelled(step_flow, before.flow_run, state, reporter) from None
        cancelled = step_flow.cancelled()  # its flow run, cancelled while it ran: this step is the last
        last = record.metrics  # the committed metrics of this step (state.steps[-1])
        last[timing_key("commit")] = commit_s
        state.stopped_reason = stop = budget_stop(cfg, state, before_evaluation=True)
        if state.step < cfg.steps and not stop and cancelled is None:
            # The next step generates with the version just trained: its workers load it
            # while this step is committed and the next step's flow run starts.
            warming.before_next_step(record.phase.num_actors, model_ref(ctx, state).model_dump(mode="json"))
        if evaluation_due(cfg, state, stop):
            state.add_evaluation(evaluate(ctx, state, clock))
        last[timing_key("period")], last[timing_key("overhead")] = clock.close_period(last[timing_key("work")])
        commit_s = _commit(ctx, state, lease, collect, reporter, wall, clock, quiet_api, record, old_drafts)
        if cancelled is not None:
            raise _stop_cancelled(step_flow, cancelled, state, reporter)
    if stop:
        state.stopped_reason = stop
        reporter.progress(f"stopped after step {state.step}/{cfg.steps}: {stop}; raise the budget and resume "
                          "the run to continue")
    return state


def _commit(ctx: RunContext, state: CampaignState, lease: RunLease, collect: Collector, reporter: Reporter,
            wall: SessionWall, clock: StepClock, quiet_api: threading.Event, record: StepRecord,
            old_drafts: dict[str, int]) -> float:
    """Commit the step ``record`` ran as ``state``, report it, then collect; returns the seconds
    the commit and the collection took (the next step's ``timing_s/commit``)."""
    lease.check()
    t_commit = time.time()
    state.mark_checkpoint(ctx.config.store.checkpoint_every)
    wall.stamp(state)
    commit_state(ctx.store, state)
    commit_s = time.time() - t_commit
    clock.add_work(commit_s)
    quiet_api.clear()  # published once the next step's flow run is running (or at the end)
    # Reported before the collection (seconds on S3): a stop during it leaves no committed
    # step the trackers lack, and a resume finishes the collection (``_start``).
    reporter.committed(state, record)
    t_collect = time.time()
    collect(state)  # after the commit, never before
    drop_unreferenced(ctx.store, ctx.prefix, old_drafts, state.draft_index)
    clock.add_work(time.time() - t_collect)
    return commit_s + time.time() - t_collect


class StepRunCancelled(StopRequested):
    """A step's own flow run was cancelled while it ran; the step was committed and the
    campaign stops (:func:`rlhf_campaign` ends its run Cancelled with this one line; trackers
    record it KILLED, not FAILED). An
    ``Exception``, not a ``BaseException`` like a cancel's ``TerminationSignal``: Prefect raises
    the end state's exception from the flow's result inside its event loop, where a
    ``KeyboardInterrupt`` would come out as ``asyncio.CancelledError``."""


def _stop_cancelled(step_flow: FlowRunStarter, flow_run: Any, state: CampaignState,
                    reporter: Reporter) -> StepRunCancelled:
    """After the commit of the step whose ``flow_run`` was cancelled (or before the step, if it
    was cancelled before it started): end that run Cancelled
    (it would stay Cancelling), say so in one line, and return the exception that stops the
    campaign (raised where the loop is, so the clean-ups of a stopped campaign run: the lease
    released, the GPU slots free, the next step's prepared flow run deleted)."""
    line = (f"stopped after step {state.step}/{state.steps_configured}: its step run {flow_run.name!r} was "
            f"cancelled; resume the run to continue")
    try:
        step_flow.mark_cancelled(flow_run, line)
    except Exception as exc:  # noqa: BLE001 - the stop goes on; the run stays Cancelling, as said
        reporter.progress(f"warning: step run {flow_run.name!r} ({flow_run.id}) stays Cancelling: setting it "
                          f"Cancelled failed: {redact(str(exc))}; `prefect flow-run cancel {flow_run.id}` ends it")
    reporter.progress(line)
    return StepRunCancelled(line)


_REFUSED = "rlhfless_refused_at_start"  # set on a start-up check's ValueError (run_campaign)
_ENDED = "rlhfless_ended_in_one_line"  # set on an exception rlhf_campaign made its run's end


def refused_at_start(exc: BaseException) -> bool:
    """Whether ``exc`` refused the campaign before it wrote anything: a start-up check's
    ``ValueError`` (``check_campaign``), the lease held by another process (``LeaseHeld``) or a
    run that cannot be continued as asked (``CampaignRefused``)."""
    return isinstance(exc, (LeaseHeld, CampaignRefused)) or getattr(exc, _REFUSED, False)


class _EndedQuietly(logging.Filter):
    """Drops a run logger's record of an exception :func:`rlhf_campaign` made its run's end (a
    Failed or Cancelled state with a one-line message): the engine raises it again from the
    run's result once the run has ended, and a deployment's engine logs it there as "Engine
    execution exited with unexpected exception" with its traceback (30-40 lines through
    Prefect's frames), which the UI's log tab shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not getattr(exc, _ENDED, False)


_QUIET = _EndedQuietly()


def _ended(exc: BaseException, state: Callable[..., State], message: str) -> State:
    """The run's end ``state`` (``Failed``, ``Cancelled``) with ``message``, carrying ``exc``: a
    direct call of the flow (``rlhfless train``, tests) raises it from the flow's result, as if
    the flow had raised it, and Prefect logs no traceback of it (:class:`_EndedQuietly`)."""
    setattr(exc, _ENDED, True)
    logging.getLogger("prefect.flow_runs").addFilter(_QUIET)  # the engine's run loggers; once (addFilter dedups)
    return state(message=message, data=exc)


@flow(name="rlhf-campaign", log_prints=True)
def rlhf_campaign(config: CampaignConfig, resume: bool = False, break_lease: bool = False) -> dict[str, Any] | State:
    """Prefect entrypoint. ``config`` arrives as a dict (deployment parameters, the CLI) and is
    validated by Prefect with pydantic before the run starts: a bad value fails the run with
    ``ParameterTypeError`` naming the field (``config.algorithm.batch_size``), and a deployment
    rejects it when the run is created (the parameter schema is CampaignConfig's JSON schema).
    What pydantic cannot see (a missing dataset or model, an engine not installed, a tracker's
    package or environment, an unreachable controller) fails the run next with the ``ValueError`` that
    ``rlhfless train`` prints, before the store is written (``run_campaign``).

    Such a refusal (:func:`refused_at_start`: the checks, the lease held by another process, a
    resume that changes what the run computes) ends the run ``Failed`` with one line as its
    message and its one ERROR log line, ``TYPE: message`` with secrets scrubbed, and no
    traceback in the run's log. A step run cancelled while it ran ends the run ``Cancelled``
    after that step's commit (``StepRunCancelled``). Any other exception fails the run with
    its traceback, as Prefect records one."""
    try:
        return run_campaign(config, resume=resume, break_lease=break_lease)
    except StepRunCancelled as exc:
        return _ended(exc, Cancelled, str(exc))
    except ValueError as exc:
        if not refused_at_start(exc):
            raise
        line = f"{type(exc).__name__}: {redact(str(exc))}"
        get_run_logger().error(line)
        return _ended(exc, Failed, line)


__all__ = ["rlhf_campaign", "run_campaign", "CampaignRefused", "StepRunCancelled", "check_resume", "refused_at_start"]
