"""The campaign's configuration: the workload the actions compute (``WorkloadConfig``, in
``actions/config/workload.py``) plus how and where the control plane runs it -- scaling, store,
invoker, budget, fault injection, observability, steps -- loaded from YAML plus ``--set``
overrides.

Every section forbids unknown keys, so a typo is an error naming the key rather than a
silently ignored setting; cross-field rules live in validators whose messages name the field,
the value and the fix. ``load_config`` turns the first validation error into one such line.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from actions.config.quoting import quote
from actions.config.section import BOOL_NOT_NUMBER, HomePath, bool_error_line, with_quiet_defaults
from actions.config.section import Section as _Section
from actions.config.workload import WorkloadConfig
from actions.store.endpoints import has_userinfo
from actions.store.safe_paths import check_run_id
from flows.config_overrides import apply_override, dotted_key
from flows.config_yaml import AliasBomb, load_yaml, yaml_problem
from flows.key_hints import elsewhere_hint
from flows.planning.registry import ScalingStrategy
from flows.planning.scaling import parse_scaling_policy  # the built-in strategies register on import
from flows.trl_names import trl_hint, trl_value_hint


class ScalingConfig(_Section):
    policy: str = "cost_aware"
    """``cost_aware``, ``fixed:N``, a registered name or ``package.module:function``, parsed
    once into a strategy (:attr:`strategy`, ``flows/planning/registry.py``)."""
    n_min: int = Field(1, ge=1)
    """``cost_aware``: the fewest generation actions a phase may run."""
    n_max: int = Field(4, ge=1)
    """``cost_aware``: the most generation actions a phase may run."""
    lam: float = Field(0.7, ge=0, le=1)
    """Weight of time in the ``paper`` objective (paper §3.5)."""
    objective: Literal["budget", "value", "slack", "paper"] = "value"
    """How ``cost_aware`` picks among its candidate plans (``flows/planning/objective.py``):
    ``value`` minimises cost + value_of_time_usd_per_s x phase time (the live default: the
    pool bills each action, and a second action must save more than it costs); ``budget`` takes
    the fastest plan billing no more than ``budget_actors`` actors held for the phase, and does
    not cut-and-migrate (the simulator's default, against a fixed GPU allocation); ``slack``
    takes the cheapest plan within (1 + time_slack) of the fastest; ``paper`` the paper's
    min-max lam. No objective picks a plan another feasible candidate beats on both predicted
    time and cost (on a step without a prefill action every candidate is feasible)."""
    value_of_time_usd_per_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    """Dollars one second of generation-phase time is worth to the operator. None: the price
    of the GPUs that wait for the phase (the learner's, ``price_per_gpu_second`` x their count:
    ``gpus_per_actor``, as the train action holds one actor's GPUs)."""
    time_slack: float = Field(0.05, ge=0, le=10)
    """``objective: slack``: accepted time above the fastest candidate's, as a fraction."""
    budget_actors: int = Field(3, ge=1)
    """``objective: budget``: the fixed allocation (decode actors held for the whole phase)
    whose bill a phase may not exceed; 3 is the paper's static fan-out."""
    gpus_per_actor: int = Field(1, ge=1)
    """GPUs each action holds: every activation's billed GPU-seconds are its seconds times this."""
    cold_start_s: float = Field(2.0, ge=0)
    """Seconds an OpenWhisk actor beyond the warm ones takes to start; the planner prices it.
    The local pool starts its workers with it and the in-process invoker has no containers, so
    none pays one there (on the pool an actor beyond ``invoker.num_workers`` queues for a worker
    instead, which the planner times). With ``generation.engine: vllm`` the planner adds an
    engine start for an action beyond the workers holding an engine (docs/vllm.md)."""
    profile: HomePath | None = None
    """TPOT profile JSON (``rlhfless profile``); None: measured by the pool at campaign start,
    or reused from the store's cache for the same model, dtype, device, engine and threads
    (``flows/campaign/live_profile.py``)."""
    prewarm: bool = True
    """Warm the generation actions (and load the new policy version in them) ahead of use,
    at the earliest past invocation offset minus ``prewarm_buffer_s`` and minus how long the
    last pre-warms took (paper §3.7); none where it could not finish before that invocation. On
    the local pool it also has every worker load the policy before the first step, and the next
    step's workers load each new version as it is published (``flows/campaign/warming.py``).
    False: no pre-warm of either kind (activations load the policy when invoked)."""
    prewarm_buffer_s: float = Field(0.2, ge=0)
    """Seconds of margin a pre-warm fires ahead of the generation actions' invocation."""
    tail_error_steps: int = Field(2, ge=0, le=64)
    """Steps of the length predictor's measured error (predicted against observed group max
    lengths) that scale ``cost_aware``'s robust tail (``flows/planning/robust.py``); 0: every
    action may run to the step's longest prediction. The simulator's default too."""
    tail_quantile: float = Field(0.5, gt=0, lt=1)
    """Quantile of an action's longest observed group its robust tail runs to."""
    _parsed: tuple[str, ScalingStrategy] | None = PrivateAttr(default=None)

    @field_validator("policy")
    @classmethod
    def _check_policy(cls, v: str) -> str:
        parse_scaling_policy(v)  # its message names scaling.policy, the value and the forms
        return v

    @property
    def strategy(self) -> ScalingStrategy:
        """The policy's registered strategy, parsed once per value."""
        if self._parsed is None or self._parsed[0] != self.policy:
            self._parsed = (self.policy, parse_scaling_policy(self.policy))
        return self._parsed[1]

    @model_validator(mode="after")
    def _check_range(self) -> ScalingConfig:
        if self.n_min > self.n_max:
            raise ValueError(f"scaling.n_min={self.n_min} is above scaling.n_max={self.n_max}; make n_min <= n_max")
        return self


def check_store_uri(v: str) -> str:
    """``v`` when it can name a store (a directory path, ``file://`` or ``s3://``), else
    ValueError naming it; a value that may carry a password (``user:password@``) is not quoted.
    ``store.uri`` and the ``--store`` of ``status``, ``gc`` and ``export`` pass through this."""
    # A mistyped scheme would otherwise be taken as a relative directory name ("s3:").
    if not v.strip():
        raise ValueError("store.uri is empty; use a directory path or s3://bucket/prefix")
    scheme = v.split(":", 1)[0].lower() if ":" in v else ""
    # a file:// URI names a directory by an empty or localhost authority; with an '@' anything
    # else may be user:password@ (a password may hold '/', '?' or '#'): not quoted
    if v.startswith("file://") and "@" in v and not v.startswith(("file:///", "file://localhost/")):
        raise ValueError("store.uri carries a user name or password (user:password@) in a file:// URI, which names "
                         "a local directory (file:///path); for S3 use s3://bucket/prefix with the keys in AWS_* "
                         "variables")
    if v.startswith("s3://"):  # the bucket's name, or credentials before it, refused before anything runs
        from actions.store.s3_settings import split_uri  # boto3 with it: only for an S3 store

        split_uri(v)
    if v.startswith(("s3://", "file://")) or (scheme not in ("s3", "file") and "://" not in v):
        return v
    if has_userinfo(v):  # not quoted: the part before '@' may be a password
        raise ValueError("store.uri carries a user name or password (user:password@) and is not a directory "
                         "path or s3://bucket/prefix; fix the scheme and put the keys in AWS_* variables")
    raise ValueError(f"store.uri {quote(v)} is not a directory path or s3://bucket/prefix; fix the scheme")


class StoreConfig(_Section):
    uri: str = "runs/store"
    """A directory, or s3://bucket/prefix (endpoint and keys from AWS_* environment variables)."""
    keep_last: int | None = 2
    """Policy versions kept after each commit: the newest this many, and the newest two whole
    whatever it says (with their optimizer state: a resume starts from the newest, or the one
    before it where the newest commit record is lost). Older versions' objects, and blobs nothing
    kept references, are deleted after the commit (``flows/campaign/collect.py``, docs/storage.md
    section 6). None: keep every version."""
    checkpoint_every: int = Field(0, ge=0)
    """Also keep every version whose number is a multiple of this, for good, with its optimizer
    state (a restart point). 0: none."""
    lease_ttl_s: float = Field(60.0, ge=2, le=3600)
    """Seconds a run's lease stays valid without renewal (renewed every third of it). A run
    whose process died on another host can be taken over this long after its last renewal."""

    @field_validator("keep_last")
    @classmethod
    def _check_keep_last(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"store.keep_last={v}: the newest version is always kept; use 1 or more, "
                             "or null to keep every version")
        return v

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, v: str) -> str:
        return check_store_uri(v)


LOCAL_TIMEOUT_S = 600.0
"""``invoker.timeout_s`` when unset, for activations on this machine."""


class InvokerConfig(_Section):
    kind: Literal["local", "inprocess", "openwhisk"] = "local"
    """Where actions run: ``local`` (a warm pool of worker processes on this machine),
    ``inprocess`` (in the flow's process, one at a time) or ``openwhisk`` (an OpenWhisk
    deployment: ``__OW_API_HOST``, ``__OW_API_KEY``; docs/openwhisk.md)."""
    num_workers: int = Field(0, ge=0)
    """Local warm pool size; 0 = scaling.n_max + 1 (N + 1 for ``fixed:N`` with N above n_max)."""
    num_cores: int = Field(0, ge=0)
    """Local pool and in-process: cores shared by the running actions, each setting torch's
    threads to its share when it starts (all of them when it runs alone); 0: the cores this
    process may run on."""
    package: str = "rlhfless"
    """OpenWhisk package holding the actions."""
    timeout_s: float | None = Field(None, gt=0)
    """Longest wait for one activation, seconds, queueing and polling included. None: 600 s for
    actions on this machine (local pool, and ``prepare`` in a child process); on OpenWhisk as
    long as the controller may take for the action, 2 x its time limit + 2 min
    (docs/openwhisk.md, section 7). A value below an OpenWhisk action's time limit is warned
    about: an activation still running at the deadline fails its step, not invoked again."""
    log_dir: HomePath | None = None
    """Local pool: directory of the per-worker log files (``worker-N.log``, the workers' stdout
    and stderr); None: ``logs`` in the run directory (the CLI's ``--out``, else ``runs/<run_id>``)."""
    max_request_mb: float = Field(64.0, gt=0)
    """Local pool: largest request body (MiB) a worker accepts; a larger one gets 413 unread."""
    read_timeout_s: float = Field(30.0, gt=0)
    """Local pool: a request must reach a worker whole within this many seconds of its first
    byte, else the connection is cut."""
    gpu_concurrency_limit: str | None = None
    """Prefect global concurrency limit held by every GPU action while it runs, one slot per
    ``scaling.gpus_per_actor`` (create it first: ``prefect gcl create gpu-actions --limit 8``).
    None: no limit. A name the server does not know is skipped with a warning, never blocks."""

    @field_validator("package")
    @classmethod
    def _check_package(cls, v: str) -> str:
        # PKG (in the connection's namespace), /NS/PKG, /NS (NS's actions outside a package) or
        # empty: the client resolves NAME, PKG/NAME and /NS/PKG/NAME only, so a namespace needs its "/".
        parts = v.removeprefix("/").split("/") if v else []
        if not all(parts) or len(parts) > (2 if v.startswith("/") else 1):
            inner = [p for p in v.split("/") if p]
            lead = "/" if v.startswith("/") or len(inner) == 2 else ""
            hint = f"; did you mean {quote(lead + '/'.join(inner))}?" if 0 < len(inner) <= 2 else ""
            raise ValueError(f"invoker.package {quote(v)} is not an OpenWhisk package path: write PKG, /NAMESPACE/PKG "
                             f"or /NAMESPACE (a namespace after a leading '/', no trailing '/'){hint}")
        return v

    def local_timeout_s(self) -> float:
        """``timeout_s`` for activations on this machine (local pool, child process): 600 s when unset."""
        return LOCAL_TIMEOUT_S if self.timeout_s is None else self.timeout_s


class BudgetConfig(_Section):
    usd: float | None = Field(None, gt=0)
    """Stop before a step (or evaluation) whose cost, judged from the last step's, would take
    the billed spend past this many dollars; None: no limit."""
    gpu_seconds: float | None = Field(None, gt=0)
    """The same limit in billed GPU-seconds; None: no limit."""


class FaultConfig(_Section):
    """Fault injection for resilience tests: every fault is transient and retried.

    Each kind picks a deterministic fraction of (action, shard) pairs by hash of ``seed``;
    a failure or a kill hits only the first attempt, and one shard gets at most one of them.
    """

    fail_fraction: float = Field(0.0, ge=0, lt=1)
    """The action raises at once, like a crashed container (``InjectedFault``: transient)."""
    kill_fraction: float = Field(0.0, ge=0, lt=1)
    """The worker process is killed (SIGKILL) ``kill_after_s`` into the activation."""
    kill_after_s: float = Field(0.2, ge=0, le=60)
    """Seconds into an activation a ``kill_fraction`` kill lands."""
    latency_fraction: float = Field(0.0, ge=0, le=1)
    """These activations sleep ``latency_s`` before running (every attempt that runs: an injected
    failure raises first)."""
    latency_s: float = Field(0.0, ge=0, le=600)
    """Seconds a ``latency_fraction`` activation sleeps."""
    actions: list[str] = ["generate", "score"]
    """The actions faults are injected into."""
    seed: int = 0
    """Picks which (action, shard) pairs are hit."""

    @field_validator("actions")
    @classmethod
    def _check_actions(cls, v: list[str]) -> list[str]:
        known = ("prefill", "generate", "score", "train_step", "warmup", "evaluate")
        unknown = [a for a in v if a not in known]
        if unknown:
            raise ValueError(f"faults.actions {quote(unknown)}: unknown action(s); choose from {', '.join(known)}")
        return v


class ObservabilityConfig(_Section):
    tensorboard: bool = False
    """Write each step's metrics as TensorBoard scalars (needs tensorboardX: the extra ``tensorboard``)."""
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "trackio"]] = []
    """Experiment trackers that get every step's metrics (each an optional extra of the same
    name; flows/campaign/trackers.py). ``tensorboard: true`` is ``report_to: [tensorboard]``."""
    tensorboard_dir: HomePath | None = None
    """Event-file directory; wandb writes its ``wandb/`` folder beside it (unless ``WANDB_DIR``).
    None: ``<run directory>/tensorboard``, the CLI's ``--out`` (default ``runs/<run_id>``);
    ``runs/<run_id>/tensorboard`` for a flow run started without the CLI."""


class CampaignConfig(WorkloadConfig):
    run_id: str | None = None
    """Names the run in the store; None derives it from the configuration's hash."""
    scaling: ScalingConfig = ScalingConfig()
    store: StoreConfig = StoreConfig()
    invoker: InvokerConfig = InvokerConfig()
    budget: BudgetConfig = BudgetConfig()
    faults: FaultConfig = FaultConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    price_per_gpu_second: float = Field(0.0004, ge=0)
    """USD per GPU-second (0.0004 = $1.44 per GPU-hour)."""
    steps: int = Field(24, ge=1)
    """RL steps of the campaign (a resume trains up to this many in all)."""
    eval_every: int = Field(4, ge=0)
    """Evaluate on the eval set every this many steps (0: only before and after)."""

    @field_validator("run_id")
    @classmethod
    def _check_run_id(cls, v: str | None) -> str | None:
        return v if v is None else check_run_id(v)

    @model_validator(mode="after")
    def _check_budget(self) -> CampaignConfig:
        if self.budget.usd is not None and self.price_per_gpu_second == 0:
            raise ValueError(f"budget.usd={self.budget.usd} can never be spent: price_per_gpu_second is 0, so every "
                             "step costs $0; set price_per_gpu_second (USD per GPU-second), or use budget.gpu_seconds")
        return self

    def overlap_scoring(self) -> bool:
        """Whether a shard's score is submitted while other shards still generate."""
        overlap = self.generation.score_while_generating
        return self.invoker.kind == "openwhisk" if overlap is None else overlap

    def score_bins(self, fan_out: int) -> int:
        """Score activations of a step whose scores wait for the end of generation
        (``flows/planning/score_batches.py``). One where every action shares this machine's
        processors (the local pool, in process): a second activation would load the policy and
        the reference again and score on a share of the same cores. The fan-out elsewhere,
        where each activation brings its own accelerator."""
        return 1 if self.invoker.kind in ("local", "inprocess") else fan_out

    def settings(self) -> dict[str, Any]:
        """Every setting as ``rlhfless config`` prints it (JSON values, in field order, those a
        dump leaves out at their defaults put back); with a dataset file the generated task's
        sizes, refused beside it, are left out."""
        generated = {"data": {"num_train_prompts", "num_eval_prompts"}} if self.data.train_path else None
        return with_quiet_defaults(self, self.model_dump(mode="json", exclude=generated))

    def identity(self) -> dict[str, Any]:
        """The settings that define what a run computes; resuming requires them unchanged.
        Steps, budgets, store, invoker, fault injection and observability may change between resumes."""
        data = self.model_dump(mode="json")
        for key in ("steps", "budget", "store", "invoker", "faults", "observability", "run_id", "eval_every"):
            data.pop(key, None)
        # Fan-out and planning change cost, never the training data.
        data.pop("scaling", None)
        data["model"].pop("gradient_checkpointing", None)  # memory for compute; the same weights
        # The tiny model's shape beside model.path, and the generated task's max_count,
        # num_eval_prompts and error_rate beside a dataset file, change nothing but stay: a run
        # id computed without them would not find the runs committed with them.
        data.pop("train", None)  # ranks of the learner: the same update up to round-off
        for key in ("assignment", "cut_threshold", "rank_slack", "migrate_window_s", "score_while_generating",
                    "dedup_prefill", "prefill_capacity", "prefill_action", "length_window", "first_epoch_predictor",
                    "kv_cache", "cuda_graphs", "compile_decode", "fused_sampling"):
            data["generation"].pop(key, None)
        # The vLLM engine's memory changes where samples are computed, never which; its context
        # (max_model_len) bounds the prompts kept (data.max_prompt_tokens), so it stays when set.
        vllm = data["generation"].pop("vllm", None) or {}
        if vllm.get("max_model_len") is not None:
            data["generation"]["vllm"] = {"max_model_len": vllm["max_model_len"]}
        # Sampling filters change the data, so they stay when set; when off they are left out
        # so that runs from before the filters existed keep their fingerprint (and run id).
        for key in ("top_k", "top_p"):
            if data["generation"].get(key) is None:
                data["generation"].pop(key, None)
        if data["data"].get("max_value") is None:  # likewise for the arith task's quantities
            data["data"].pop("max_value", None)
        if data["data"].get("eval_fraction") is None:  # and for the held-out share
            data["data"].pop("eval_fraction", None)
        # PPO used to compute k1 whatever kl_kind said, and its runs recorded the default k3: a
        # k1 PPO run is recorded as those were, so they resume; PPO's other estimators are new.
        algo = data["algorithm"]
        if algo["name"] == "ppo":
            algo["kl_kind"] = "k3" if algo["kl_kind"] == "k1" else f"ppo-{algo['kl_kind']}"
        for m in data["reward"]["models"]:  # unset and 0 both score the first logit, as runs did before
            if m.get("label") in (None, 0):  # label existed: those keep their fingerprint (a two-label
                m.pop("label", None)         # model's run resumes with label: 0)
        return data

    def fingerprint(self) -> str:
        return fingerprint_of(self.identity())

    def resolved_run_id(self) -> str:
        source = "dataset" if self.data.train_path else self.data.task  # a user dataset is not the task
        return self.run_id or f"{source}-{self.algorithm.name}-{self.fingerprint()}"


def fingerprint_of(identity: dict[str, Any]) -> str:
    """The fingerprint of an identity (``CampaignConfig.identity``): 12 hex digits of its sha256."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- loading


def _in_raw(err: dict, raw: dict[str, Any]) -> tuple[list[Any], Any, int | None]:
    """(the parts of ``err``'s location that are keys or indices of ``raw``, the value there,
    the number of parts before the first that is not: a union member's tag, such as
    ``literal['all-linear']`` or ``list[str]``, which pydantic puts in the location; None where
    every part is a key). A last part missing from its section is the missing field itself."""
    kept: list[Any] = []
    value: Any = raw
    union = None
    loc = err["loc"]
    for i, part in enumerate(loc):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            value = value[part]  # an entry of a list setting, e.g. generation.draft_strategies[0]
        elif isinstance(value, dict) and i == len(loc) - 1 and err["type"] == "missing":
            value = "<missing>"
        else:
            union = len(kept) if union is None else union
            continue
        kept.append(part)
    return kept, value, union


def _first_error(exc: ValidationError, raw: dict[str, Any]) -> str:
    errors = exc.errors()
    err = errors[0]
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        # a list's entry as [i] (reward.functions[0].wieght); the last part is a key, even a number (YAML's 1:)
        parent = dotted_key(err["loc"][:-1]) if len(err["loc"]) > 1 else "top level"
        loc = f"{parent}.{err['loc'][-1]}" if len(err["loc"]) > 1 else str(err["loc"][-1])
        return (f"unknown config key {quote(loc)}: not a setting of {parent}; check the spelling "
                f"(see README, Configuration){trl_hint(loc) or elsewhere_hint(loc, CampaignConfig)}")
    if msg.startswith("Value error, "):
        return msg[len("Value error, "):]
    if err["type"] == BOOL_NOT_NUMBER:  # the section knows its field, not where it sits
        return bool_error_line(dotted_key(err["loc"]), err["ctx"])
    kept, value, union = _in_raw(err, raw)
    fix = " (nan and inf are refused)" if err["type"] == "finite_number" else ""
    if isinstance(value, bool) and err["type"] == "literal_error":  # the user typed on, yes or no, not a bool
        fix = f" (YAML reads {'on, yes and true' if value else 'off, no and false'} as {value}; quote the word)"
    elif err["type"] == "literal_error":
        fix = trl_value_hint(kept[-1] if kept else "", value)
    if union is not None:  # a value no member of a union accepts: each member's complaint, at the union's field
        kept = kept[:union]
        value = _value_at(raw, kept)
        alternatives = []
        for e in errors:
            parts, at, first = _in_raw(e, raw)
            if first == union and parts[:union] == kept:
                inner = "".join(f"[{p}]" for p in parts[union:])  # within the value: a list's entry
                alternatives.append((f"entry {inner} = {quote(at)}: " if inner else "") + e["msg"].lower())
        msg = "; or ".join(dict.fromkeys(alternatives))
    return f"config {dotted_key(kept)} = {quote(value)}: {msg.lower()}{fix}"


def _value_at(raw: dict[str, Any], parts: list[Any]) -> Any:
    for part in parts:
        raw = raw[part]
    return raw


def load_config(path: str | None = None, overrides: list[str] | None = None) -> CampaignConfig:
    """Read a YAML file (optional), apply ``--set`` overrides, validate.

    Raises:
        ValueError: a one-line message naming the field, the value and the fix.
    """
    return validate_config(config_input(path, overrides))


def validate_config(raw: dict[str, Any]) -> CampaignConfig:
    """The configuration ``raw`` (``config_input``'s) describes, validated; ValueError as
    :func:`load_config`'s. ``raw`` is left as it was."""
    try:
        cfg = CampaignConfig.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(_first_error(exc, raw)) from None
    _check_task_sizes(cfg)
    return cfg


def config_input(path: str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """What the user wrote: the YAML file (optional) with the ``--set`` overrides applied, not
    validated (``load_config`` validates it). Raises ValueError for a file that cannot be read
    or parsed, or an override that cannot be applied."""
    raw: dict[str, Any] = {}
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"config file {path!r} cannot be read ({exc.strerror}); check --config") from None
        try:
            loaded = load_yaml(text)
        except AliasBomb as exc:
            raise ValueError(f"config file {path!r} is refused: {exc}; write the repeated settings out, or use "
                             "fewer anchors") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"config file {path!r} is not valid YAML{yaml_problem(exc)}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"config file {path!r} must hold a mapping of sections, not {type(loaded).__name__}")
        raw = loaded or {}
    for item in overrides or []:
        apply_override(raw, item, CampaignConfig)
    return raw


def _check_task_sizes(cfg: CampaignConfig) -> None:
    """Refuse a size of the generated task written beside a dataset file, which would be
    ignored. Checked on what the user wrote (``model_fields_set`` of a config just loaded), not
    in ``DataConfig``: a request or a stored identity carries every field, defaults included."""
    for name in sorted({"num_train_prompts", "num_eval_prompts"} & cfg.data.model_fields_set):
        if cfg.data.train_path:
            raise ValueError(f"data.{name}={getattr(cfg.data, name)} sizes the generated task, but data.train_path "
                             "is set and every row of the file is used; remove it (to train on fewer rows, keep "
                             "fewer in the file)")
