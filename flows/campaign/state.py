"""Campaign state: what one committed step leaves behind, and the commit itself.

A campaign's state is one JSON record per completed step under ``runs/<run_id>/campaign``
(storage.commit_pointer: create-once records plus a latest hint). Record k describes the
campaign after k RL steps: the policy version to continue from, optimizer and critic keys,
the response-length history, every step's metrics, evaluations and spend (the metrics and
evaluations of all but the latest steps in sealed history segments, ``history.py``, so that a
record's size does not grow with the run). Record 0 is written
after set-up and warm-up. A crash before a commit replays the step from the previous record;
every key a step writes is derived from (run, step, shard), so the replay overwrites the
same objects with the same bytes.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, field_validator, model_validator

from actions.contracts import EvaluateResult, Prepared
from actions.store import (
    IntegrityError,
    ObjectNotFound,
    ObjectStore,
    commit_key,
    commit_pointer,
    get_json,
    read_pointer,
)
from actions.store.safe_paths import STORE_FIX, UnsafeName, check_name, shown
from flows.campaign.data_copies import reconcile_data_paths
from flows.campaign.earlier_ids import as_recorded_then
from flows.campaign.history import seal, unseal
from flows.campaign.resume_values import as_set
from flows.campaign.reward_copies import described, reconcile_reward_paths
from flows.config import CampaignConfig, fingerprint_of
from flows.planning.planner import PlannerState
from flows.planning.record import PhaseObservation
from flows.step.metrics import REWARD_LOGGED


class EvalRecord(EvaluateResult):
    """One held-out evaluation as committed: the evaluate action's result, and when."""

    # records written before this model carried the action's "__warm" counts: ignored
    model_config = ConfigDict(extra="ignore")

    step: int
    policy_version: int
    billed_gpu_seconds: float = 0.0
    """Billed time of the evaluation's activations, failed attempts included, in the unit of
    ``billing`` (times ``scaling.gpus_per_actor``, as a step's); 0 in records from before it was kept."""
    useful_gpu_seconds: float = 0.0
    usd: float = 0.0

    def scalars(self) -> dict[str, float]:
        """What trackers plot for this evaluation: accuracy, mean reward and length, and each
        value the reward functions logged as ``eval/reward_fn/<name>``."""
        out = {"eval/accuracy": self.accuracy, "eval/reward_mean": self.reward_mean,
               "eval/mean_length": self.mean_length}
        out.update({f"eval/{REWARD_LOGGED}{name}": value for name, value in sorted(self.reward_metrics.items())})
        return out


SPEND_PARTS = ("steps", "evaluations", "setup")
"""What a campaign's activations are for: its RL steps, its held-out evaluations, its set-up
(prepare where it runs through the invoker, warm-up, the critic's first version, the profile
and the activation round-trip probes, at the start and at each resume that runs a step)."""
SPEND_KEYS = ("billed_gpu_seconds", "useful_gpu_seconds", "usd", *(f"{p}_billed_gpu_seconds" for p in SPEND_PARTS),
              "wall_seconds")


class CampaignState(BaseModel):
    run_id: str
    fingerprint: str
    identity: dict[str, Any]
    step: int = 0
    policy_key: str
    policy_version: int = 0
    reference_key: str
    optimizer_key: str | None = None
    critic_key: str | None = None
    critic_optimizer_key: str | None = None
    prepared: Prepared
    planner: PlannerState = PlannerState()
    """What the planner has learned (``flows/planning/planner.py``): a resume plans from it."""
    steps: list[dict[str, Any]] = []
    """Every step's metrics by output name (``flows/step/metrics.py``)."""
    evals: list[EvalRecord] = []
    weights_sha256: str = ""
    spend: dict[str, float] = dict.fromkeys(SPEND_KEYS, 0.0)
    """What the run cost so far: ``billed_gpu_seconds``, ``useful_gpu_seconds`` and ``usd`` of
    every activation the campaign invoked through its invoker, billed time by part (``steps_``,
    ``evaluations_``, ``setup_billed_gpu_seconds``: :meth:`add_spend`), and ``wall_seconds``, the
    wall time of the processes that ran it, each up to its last commit (:meth:`add_wall`)."""
    spend_since_step: int = 0
    """The step from which ``spend`` counts evaluations, set-up and wall time: a run committed
    before they were counted reads them as 0 up to the step it was resumed from (its steps were
    counted)."""
    tracker_key: str = ""
    """The key of this campaign's experiment-tracker runs (``trackers.py``), made with its first
    commit: a resume continues those runs, a new campaign of the same run id starts its own. ""
    in a record from before it: the trackers find their runs by the run id alone."""
    draft_index: dict[str, int] = {}
    """prompt_id -> step whose draft object holds its latest responses (``flows/campaign/drafts.py``)."""
    stopped_reason: str | None = None
    resume_setup_s: float | None = None
    """The billed seconds of the set-up a resume repeats (its profile, read from the store's
    cache, and its round-trip probes), as the last set-up paid it (``setup.add_setup_spend``);
    a resume's budget check counts it before paying it (``budget.resume_stop``). None in
    records from before it was kept."""
    steps_configured: int | None = None
    """``steps`` of the campaign that committed this record (a resume may raise it); None in
    records from before it was kept."""
    sealed: dict[str, int] = {}
    """History list (``SEALED``) -> its leading entries sealed into history segments by the
    commits so far (``history.py``); a commit record carries only the entries after them."""
    _recorded: dict[str, int] = PrivateAttr(default_factory=dict)
    # History list -> its length in the record this state was read from or last committed as.
    # Only those entries are sealed: the step being committed may be replayed after a crash with
    # other measured times, and a sealed segment can never change.
    retention: dict[str, int | None] | None = None
    """``store.keep_last`` and ``store.checkpoint_every`` of the campaign that committed this
    record: what ``rlhfless gc`` applies to the run when neither a flag nor ``--config`` says
    otherwise. None in records from before it was kept."""
    checkpoints: list[int] = []
    """Versions committed as checkpoints (``store.checkpoint_every`` at their commit): every
    later collection keeps them, whatever the settings it runs with."""

    def mark_checkpoint(self, every: int) -> None:
        """Record this commit's version as a checkpoint where ``store.checkpoint_every`` (``every``)
        makes it one."""
        if every > 0 and self.step % every == 0 and self.step not in self.checkpoints:
            self.checkpoints.append(self.step)

    @model_validator(mode="before")
    @classmethod
    def _spend_of_older_records(cls, data: Any) -> Any:
        """Records written before the spend was broken down counted only the steps in it (and
        no wall time)."""
        if not isinstance(data, dict) or not isinstance(data.get("spend"), dict):
            return data
        spend = data["spend"]
        if all(key in spend for key in SPEND_KEYS):
            return data
        filled = {key: 0.0 for key in SPEND_KEYS} | {"steps_billed_gpu_seconds": spend.get("billed_gpu_seconds", 0.0)}
        return {**data, "spend": filled | spend, "spend_since_step": data.get("step", 0)}

    def add_spend(self, part: str, billed: float, useful: float, usd: float) -> None:
        """Add activations' cost to ``spend``: to the totals and to ``part``'s billed time
        (``SPEND_PARTS``). A new dict: a copy of this state may share the old one."""
        spend = dict(self.spend)
        for key, value in (("billed_gpu_seconds", billed), ("useful_gpu_seconds", useful), ("usd", usd),
                           (f"{part}_billed_gpu_seconds", billed)):
            spend[key] = spend.get(key, 0.0) + value
        self.spend = spend

    def add_wall(self, seconds: float) -> None:
        """Add ``seconds`` of a process's wall time to ``spend["wall_seconds"]`` (a new dict)."""
        self.spend = {**self.spend, "wall_seconds": self.spend.get("wall_seconds", 0.0) + seconds}

    def add_evaluation(self, record: EvalRecord) -> None:
        """Record an evaluation, and its cost in ``spend``."""
        self.evals.append(record)
        self.add_spend("evaluations", record.billed_gpu_seconds, record.useful_gpu_seconds, record.usd)

    @field_validator("steps")
    @classmethod
    def _nan_of_null(cls, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A metric committed as null (JSON has no NaN or infinity) is read back as NaN, as the
        step held it: a resumed run's outputs and warnings (``nonfinite_update``) see it as they did."""
        return [{k: math.nan if v is None else v for k, v in m.items()} for m in steps]

    @model_validator(mode="before")
    @classmethod
    def _planner_of_older_records(cls, data: Any) -> Any:
        """Records written before the planner kept its own state held its parts at the top
        level, and its calibration's data in the steps' metrics: gathered into ``planner``."""
        if not isinstance(data, dict) or "planner" in data:
            return data
        data = dict(data)
        old = {k: data.pop(k) for k in ("length_history", "call_history", "spec_rates", "spec_speedup") if k in data}
        steps = data.get("steps") if isinstance(data.get("steps"), list) else []
        phases = [o for m in steps if isinstance(m, dict) and (o := PhaseObservation.from_metrics(m)) is not None]
        data["planner"] = {**old, "phases": phases}
        return data

    @model_validator(mode="before")
    @classmethod
    def _hindsight_of_older_phases(cls, data: Any) -> Any:
        """Phases committed before each kept its hindsight prediction
        (``PhaseObservation.hindsight_generate_s``) take it from their step's metrics, which
        recorded it, matched by the plan and the measurement: the calibration then reads a resumed
        run's steps as it reads new ones (a fan-out's scale is kept however old it is)."""
        planner = data.get("planner") if isinstance(data, dict) else None
        steps = data.get("steps") if isinstance(data, dict) else None
        if not (isinstance(planner, dict) and isinstance(planner.get("phases"), list) and isinstance(steps, list)
                and any(isinstance(p, dict) and p.get("hindsight_generate_s") is None for p in planner["phases"])):
            return data
        found = {(m.get("plan/predicted_generate_s"), m.get("timing_s/generate"), m.get("plan/decode_scale")):
                 m["plan/hindsight_generate_s"] for m in steps
                 if isinstance(m, dict) and m.get("plan/hindsight_generate_s") is not None}

        def filled(phase: Any) -> Any:
            if not isinstance(phase, dict) or phase.get("hindsight_generate_s") is not None:
                return phase
            h = found.get((phase.get("predicted_generate_s"), phase.get("generate_s"), phase.get("decode_scale")))
            return phase if h is None else {**phase, "hindsight_generate_s": h}

        phases = [filled(p) for p in planner["phases"]]
        return data if phases == planner["phases"] else {**data, "planner": {**planner, "phases": phases}}

    @property
    def length_history(self) -> dict[str, Any]:
        """The planner's length history (``LengthHistory.to_dict``)."""
        return self.planner.length_history


SEALED = ("steps", "evals")
"""The state's lists that grow with every step, kept in sealed history segments."""


def pointer_key(run_id: str) -> str:
    return f"runs/{run_id}/campaign"


def load_state(store: ObjectStore, run_id: str) -> CampaignState | None:
    """The run's last committed state, or None before its first commit (see :func:`parse_state`
    for the checks)."""
    record = read_pointer(store, pointer_key(run_id))
    return None if record is None else parse_state(store, record, run_id)


def parse_state(store: ObjectStore, record: dict[str, Any], run_id: str, *, history: bool = True) -> CampaignState:
    """The campaign state in a commit record of ``run_id``, with its sealed history read back from
    ``store``, checked before anything in it is used. ``history=False``: the history lists hold
    the record's own entries only (for readers of its keys; such a state is never committed).

    A commit record comes from the store: it must be a valid state of this run, and every
    object key it names must be a safe key under this run's own prefix (``runs/<run_id>/``), so a
    crafted record cannot point a step at another run's objects or outside the store.

    Raises:
        IntegrityError / UnsafeName: one line naming the commit and the offending field.
    """
    where = f"commit record of run {run_id!r}"
    try:
        state = CampaignState.model_validate(_unsealed(store, record.get("state"), run_id) if history
                                             else record.get("state"))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise IntegrityError(f"{where} is not a valid campaign state ({'.'.join(map(str, err['loc']))}: "
                             f"{err['msg']}); it was not written by this version or was tampered with") from None
    if state.run_id != run_id:
        raise IntegrityError(f"{where} belongs to run {shown(state.run_id)}; it was copied or tampered with")
    if state.weights_sha256 and not re.fullmatch(r"[0-9a-f]{64}", state.weights_sha256):
        raise IntegrityError(f"{where}: weights_sha256 {shown(state.weights_sha256)} is not a sha256 digest")
    prefix = f"{pointer_key(run_id).rsplit('/', 1)[0]}/"
    for field, key in _state_keys(state):
        check_name(key, where=f"{where}, {field}", what="key", fix=STORE_FIX)
        if not key.startswith(prefix):
            raise UnsafeName(f"{where}, {field}: key {shown(key)} is outside the run's prefix {prefix!r}; {STORE_FIX}")
    if history:
        _check_history(state, where)
        state._recorded = {name: len(getattr(state, name)) for name in SEALED}
    return state


def _check_history(state: CampaignState, where: str) -> None:
    """Each step's metrics name their step: entry i is step i's. A record committed by a revision
    from before the history was sealed reads only the latest entries of a sealed run, and a
    record it committed then lacks the sealed ones; caught here rather than lost (and then
    refused a hundred steps later, when a segment would be sealed again with other entries)."""
    for i, metrics in enumerate(state.steps):
        step = metrics.get("step")
        if isinstance(step, (int, float)) and step != i:
            raise IntegrityError(
                f"{where}: entry {i} of its step metrics is step {step:g}'s, so steps are missing from its "
                f"history; a revision older than the one that wrote the run's history segments "
                f"({pointer_key(state.run_id)}/history/) committed it. Resume runs with this revision or later")


def _unsealed(store: ObjectStore, data: Any, run_id: str) -> Any:
    """A record's state with each sealed list whole again (records from before the history was
    sealed hold every entry and no ``sealed``: unchanged)."""
    if not isinstance(data, dict) or not isinstance(data.get("sealed"), dict):
        return data
    data = dict(data)
    for name in SEALED:
        if isinstance(data.get(name), list):
            data[name] = unseal(store, run_id, name, data["sealed"].get(name, 0)) + data[name]
    return data


def _state_keys(state: CampaignState) -> list[tuple[str, str]]:
    """(field, object key) for every key a state names."""
    keys = [(f, getattr(state, f)) for f in ("policy_key", "reference_key", "optimizer_key", "critic_key",
                                            "critic_optimizer_key")]
    keys += [(f"prepared.{k}", v) for k, v in state.prepared.object_keys().items()]
    return [(f, k) for f, k in keys if k is not None]


def load_state_at(store: ObjectStore, run_id: str, step: int, *, history: bool = True) -> CampaignState | None:
    """The state committed at ``step`` (None if that step was never committed); ``history``: as
    :func:`parse_state` (False reads no history segment: for the keys a record names)."""
    try:
        record = get_json(store, commit_key(pointer_key(run_id), step))
    except ObjectNotFound:
        return None
    return parse_state(store, record, run_id, history=history)


RESUMABLE_CHANGES = (("price_per_gpu_second",), ("algorithm", "micro_batch_size"), ("generation", "speculation"),
                     ("generation", "max_draft_len"), ("generation", "draft_strategies"), ("generation", "engine"))
"""Settings of the identity a resume may change: the price (it turns billed time into USD and
weighs the planner's cost), the learner's micro-batches (the update equals the unsplit one to
round-off: the fix an out-of-memory error advises), speculative decoding and the engine (both
draw the same counter-based tokens from logits equal up to round-off: ``actions/engines/base.py``).
A derived run id hashes them, as the identity holds them since before they could change (a run
that may change them names its run_id)."""


class CampaignRefused(ValueError):
    """The run exists and cannot be continued as asked (exit code 2 at the CLI)."""


def check_resume(existing: CampaignState | None, cfg: CampaignConfig, resume: bool,
                 store: ObjectStore | None = None) -> list[str]:
    """Refuse (CampaignRefused) to start over an existing run without ``resume``, or to resume
    one made with a different configuration (``CampaignConfig.identity``). With the run's
    ``store``, a reward model path is compared by what it holds, not by its spelling
    (``reward_copies``); so is a data path whose digest the run recorded (``data_copies``).
    The CLI calls it before Prefect starts, the campaign again before its first step.

    Returns:
        the resume's warning lines (a reward model folder or a data file changed since the run
        stored its copy: ``reward_copies``, ``data_copies``).
    """
    if existing is None:
        return []
    if not resume:
        raise CampaignRefused(
            f"run {existing.run_id!r} already has {existing.step} committed step(s); pass --resume (or the parameter "
            "resume=true of a deployment run) to continue it, or set run_id to start a new run"
        )
    identity, warnings = (reconcile_reward_paths(existing.run_id, existing.identity, cfg, store) if store is not None
                          else (cfg.identity(), []))
    identity, changed = reconcile_data_paths(existing.run_id, identity, existing.identity,
                                             existing.prepared.data.get("sources", {}))
    warnings += changed
    identity = _as_recorded(as_recorded_then(identity, existing.identity), existing.identity, RESUMABLE_CHANGES)
    if existing.fingerprint != fingerprint_of(identity):
        # a reward model's path by what the folder holds (``described``), any other by its values
        differing = differing_values(existing.identity, identity)
        # the values as --set takes them: a key the identity lacks is its default (resume_values)
        diff = [d if store is not None and (d := described(k, existing.identity, identity)) != k
                else _run_and_now(k, a, b) for k, a, b in as_set(differing, existing.identity, identity)]
        shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
        raise CampaignRefused(
            f"refusing to resume run {existing.run_id!r}: it was made with a different configuration "
            f"(settings differ: {shown}); set them back (e.g. --set KEY=VALUE with the run's value, or that key of a "
            "deployment run's config parameter) or use a new run_id"
            + _keep_weights_hint(existing.run_id, differing)
        )
    return warnings


def _keep_weights_hint(run_id: str, differing: list[tuple[str, Any, Any]]) -> str:
    """Where ``model.lora`` is among the ``differing`` settings (``differing_values``, run then
    now): how a new run starts from the weights run ``run_id`` trained (its policy exported as
    a model folder, a LoRA run's adapter merged into it, since a new run's ``model.path`` loads
    the folder's model and not an ``adapter/`` beside it)."""
    lora = [(k, run) for k, run, _ in differing if k == "model.lora" or k.startswith("model.lora.")]
    if not lora:
        return ""
    trained_lora = any(k != "model.lora" or run is not None for k, run in lora)  # a sub-key: LoRA then and now
    merge = " --merge-lora" if trained_lora else ""
    return (f"; to keep the weights it trained, export them (rlhfless export {run_id} --out DIR{merge}, "
            "with --store URI where the run's store is not the default) and start a new run with model.path: DIR "
            "and the model.lora you want")


def _as_recorded(identity: dict[str, Any], recorded: dict[str, Any], paths: tuple[tuple[str, ...], ...]
                 ) -> dict[str, Any]:
    """``identity`` with the value at each of ``paths`` that ``recorded`` holds put back as it
    was recorded (a copy: ``identity`` is not changed)."""
    out = copy.deepcopy(identity)
    for path in paths:
        here, there = out, recorded
        for key in path[:-1]:
            here, there = here.get(key), there.get(key) if isinstance(there, dict) else None
            if not isinstance(here, dict) or not isinstance(there, dict):
                break
        else:
            if path[-1] in there:
                here[path[-1]] = there[path[-1]]
    return out


def differing_values(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value in ``old``, value in ``new``; None where absent) of each setting that
    differs between two identities; a list's entries by index where both lists have as many
    (``reward.models[0].path``), else the list whole.

    >>> differing_values({"algorithm": {"lr": 1, "kl": "k3"}, "seed": 0}, {"algorithm": {"lr": 2, "kl": "k3"}})
    [('algorithm.lr', 1, 2), ('seed', 0, None)]
    >>> differing_values({"models": [{"path": "a", "weight": 1}]}, {"models": [{"path": "b", "weight": 1}]})
    [('models[0].path', 'a', 'b')]
    """
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and old != new:
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differing_values(a, b, f"{prefix}[{i}]")]
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [(prefix or "(the whole configuration)", old, new)] if old != new else []
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new)):
        out += differing_values(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key))
    return out


def _run_and_now(key: str, old: Any, new: Any) -> str:
    """``key`` with the value the run was made with and the one asked for now (``shown_value``).

    >>> _run_and_now("model.lora", None, {"r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": "all-linear",
    ...                                   "bias": "none"})
    "model.lora: run None, now {'r': 8, 'alpha': 16.0, 'dropout': 0.0, 'target_modules': 'all-linear', 'bias': 'none'}"
    """
    return f"{key}: run {shown_value(old)}, now {shown_value(new)}"


def shown_value(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for a refusal's line, at most about ``limit`` characters where it is
    longer. A section (dict) or list is whole up to twice ``limit``, beyond that cut after its
    last entry that fits, saying how many more there are, so no key or value is cut in two; any
    other value is cut in the middle (a path's end tells most).

    >>> shown_value({f"k{i}": i for i in range(40)}, 40)
    "{'k0': 0, 'k1': 1, 'k2': 2, 'k3': 3, ... and 36 more}"
    """
    text = repr(value)
    if len(text) <= limit or (isinstance(value, (dict, list)) and len(text) <= 2 * limit):
        return text
    if isinstance(value, (dict, list)):
        items = [f"{k!r}: {v!r}" for k, v in value.items()] if isinstance(value, dict) else [repr(v) for v in value]
        kept: list[str] = []
        while len(kept) < len(items) and len(", ".join(kept + [items[len(kept)]])) <= limit:
            kept.append(items[len(kept)])
        kept = kept or [_cut(items[0], limit)]
        opened, closed = ("{", "}") if isinstance(value, dict) else ("[", "]")
        return f"{opened}{', '.join(kept)}, ... and {len(items) - len(kept)} more{closed}"
    return _cut(text, limit)


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters in the middle."""
    return text if len(text) <= limit else text[: limit // 2 - 2] + "..." + text[-(limit // 2 - 1):]


def commit_state(store: ObjectStore, state: CampaignState) -> str:
    """Commit ``state`` as its step: first seal the history segments filled by entries an earlier
    record already holds (recording their counts in ``state.sealed``), then write the record with
    the entries after them. Returns the record's key."""
    starts = {name: state.sealed.get(name, 0) for name in SEALED}
    # only the entries after the sealed ones are dumped: dumping the whole history each commit
    # cost time and memory growing with the run (0.26 s a commit at 10,000 steps)
    data = state.model_copy(update={n: getattr(state, n)[starts[n]:] for n in SEALED}).model_dump(mode="json")
    recorded = state._recorded
    # a new dict, not an update in place: a shallow copy of the state may share the old one
    state.sealed = {name: seal(store, state.run_id, name, data[name][:max(recorded.get(name, 0) - start, 0)], start)
                    for name, start in starts.items()}
    for name in SEALED:
        data[name] = data[name][state.sealed[name] - starts[name]:]
    data["sealed"] = dict(state.sealed)
    key = commit_pointer(store, pointer_key(state.run_id), {"step": state.step, "state": data})
    state._recorded = {name: len(getattr(state, name)) for name in SEALED}
    return key
