"""Campaign configuration: one validated pydantic tree, from YAML plus ``--set`` overrides.

Every section forbids unknown keys, so a typo is an error naming the key rather than a
silently ignored setting. Cross-field rules live in validators whose messages name the field,
the value and the fix. The embedded defaults describe the laptop campaign ``make train`` runs:
tiny Llama on CPU, local warm pool, local store.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from actions.common.config_section import Section as _Section
# RewardFunctionConfig is re-exported: the contracts and callers take every section from here.
from actions.common.reward_config import TASK_REWARDS, RewardConfig, RewardFunctionConfig  # noqa: F401
from actions.common.safe_paths import check_run_id


class ModelConfig(_Section):
    path: str | None = None
    """Local Hugging Face model directory; None builds the tiny default from the fields below."""
    hidden_size: int = Field(96, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(256, ge=8)
    max_positions: int = Field(256, ge=16)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """What actions compute in: ``auto`` is bfloat16 on CUDA and float32 on the CPU (or
    ``RLHFLESS_DTYPE`` where the action's environment sets it). Training in bfloat16/float16
    keeps fp32 master weights in the optimizer state and publishes weights in this dtype."""
    gradient_checkpointing: bool = False
    """Recompute the transformer's activations in the backward pass (less memory, ~30% more
    training compute); the weights come out the same."""


class DataConfig(_Section):
    task: Literal["repeat", "arith"] = "repeat"
    """The synthetic task used when ``train_path`` is unset, and the default reward. ``repeat``:
    write a letter exactly k times; ``arith``: GSM8K-style arithmetic word problems."""
    train_path: str | None = None
    """A .jsonl or .parquet file, or a ``Dataset.save_to_disk`` folder; None generates the task."""
    eval_path: str | None = None
    """Held-out prompts in the same format; required with ``train_path``."""
    prompt_key: str = Field("prompt", min_length=1)
    """Column holding the prompt: a string, or a list of chat messages {role, content}."""
    answer_key: str = Field("answer", min_length=1)
    """Column holding the reference answer (for GSM8K, the worked solution ending ``#### N``)."""
    id_key: str | None = None
    """Column holding a unique id (int or string); None: a ``prompt_id`` column if present,
    else an id from the row's content."""
    chat_template: Literal["auto"] | bool = "auto"
    """Format prompts with the tokenizer's chat template: auto (when it has one), true, false."""
    system_prompt: str | None = None
    """Put first as a system message (or, without a chat template, before the prompt)."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Longest prompt in tokens (after formatting); None: no limit."""
    long_prompts: Literal["error", "truncate_left", "skip"] = "error"
    """What happens to a prompt above ``max_prompt_tokens``."""
    num_train_prompts: int = Field(512, ge=1)
    num_eval_prompts: int = Field(64, ge=1)
    max_count: int | None = Field(None, ge=1)
    """Largest k of the repeat task (answer length in tokens; None: 14), or the most operations
    of an arith problem (None: 3)."""


    @field_validator("chat_template", mode="before")
    @classmethod
    def _check_chat_template(cls, v: Any) -> Any:
        if v == "auto" or isinstance(v, bool):
            return v
        raise ValueError(f"data.chat_template {v!r} is not a mode; use auto, true or false")


class AlgorithmConfig(_Section):
    name: Literal["grpo", "ppo"] = "grpo"
    batch_size: int = Field(128, gt=0)
    """Samples (responses) per step = prompts per step x group_size."""
    group_size: int = Field(8, gt=0)
    """Responses per prompt (GRPO's n)."""
    kl_coef: float = Field(0.01, ge=0)
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    clip_low: float = Field(0.2, gt=0, lt=1)
    clip_high: float = Field(0.28, gt=0)
    value_clip: float = Field(0.2, gt=0)
    lr: float = Field(4e-4, gt=0)
    critic_lr: float = Field(2e-3, gt=0)
    epochs: int = Field(1, ge=1)
    num_minibatches: int = Field(2, ge=1)
    gamma: float = Field(1.0, ge=0, le=1)
    gae_lambda: float = Field(0.95, ge=0, le=1)
    max_grad_norm: float = Field(1.0, gt=0)
    scale_by_std: bool = True
    micro_batch_size: int | None = Field(None, gt=0)
    """Samples per forward/backward pass; gradients are accumulated over a mini-batch
    (``batch_size / num_minibatches`` samples) before each optimizer step, with every micro
    batch weighted by its share of the mini-batch's tokens, so the update equals the unsplit
    one to float round-off. None: the whole mini-batch at once."""

    @model_validator(mode="after")
    def _check_batch(self) -> AlgorithmConfig:
        if self.batch_size % self.group_size:
            raise ValueError(
                f"algorithm.group_size={self.group_size} does not divide algorithm.batch_size="
                f"{self.batch_size}; choose a batch_size that is a multiple of group_size"
            )
        if (self.batch_size // self.group_size) < self.num_minibatches:
            raise ValueError(
                f"algorithm.num_minibatches={self.num_minibatches} exceeds the {self.batch_size // self.group_size}"
                " prompts per step; lower num_minibatches or raise batch_size"
            )
        if self.micro_batch_size is not None:
            if self.prompts_per_step % self.num_minibatches:
                raise ValueError(
                    f"algorithm.micro_batch_size={self.micro_batch_size} needs equal mini-batches, but "
                    f"num_minibatches={self.num_minibatches} does not divide the {self.prompts_per_step} prompts per "
                    "step; choose a num_minibatches that divides batch_size / group_size"
                )
            mini = self.batch_size // self.num_minibatches
            if mini % self.micro_batch_size:
                raise ValueError(
                    f"algorithm.micro_batch_size={self.micro_batch_size} does not divide the mini-batch of {mini} "
                    f"samples (batch_size / num_minibatches); choose a divisor of {mini}"
                )
        return self

    @property
    def prompts_per_step(self) -> int:
        return self.batch_size // self.group_size


class WarmupConfig(_Section):
    steps: int | None = Field(None, ge=0)
    """Supervised steps before RL (0 skips warm-up). None: 300 on a synthetic task (its
    imperfect demonstrator), 0 on a user dataset, where warm-up trains on the reference answers
    verbatim and is an explicit choice (only for answers that are worked solutions)."""
    batch_size: int = Field(32, gt=0)
    lr: float = Field(3e-3, gt=0)
    error_rate: float | None = Field(None, ge=0, le=1)
    """How often the synthetic demonstrator errs: miscounts a long repeat answer (None: 0.9),
    stops an arith solution one operation early (None: 0.7)."""


class GenerationConfig(_Section):
    max_new_tokens: int = Field(24, gt=0)
    temperature: float = Field(1.0, ge=0)
    engine: Literal["torch", "vllm"] = "torch"
    dedup_prefill: bool = True
    assignment: Literal["ranked", "round_robin"] = "ranked"
    cut_threshold: float | None = Field(0.7, gt=0, le=1)
    """tau: an action stops once this fraction of its samples finished (None: never cut). Only
    actions the planner gives a cut point stop (``migrate.plan_cut_points``: where another
    action is predicted to still be decoding at that moment)."""
    rank_slack: float | None = Field(0.1, ge=0, le=10)
    """With ``scaling.policy: fixed:N``, ranked slices are sized, longest first, to keep every
    action's predicted end within (1 + rank_slack) x the balanced phase time (the fastest
    contiguous slicing of the ranking), instead of equal prompt counts; short slices still
    release early. None: equal counts (the paper's split), which lets the slice of the longest
    prompts set the phase time where decoding slows with batch and context. ``cost_aware``
    keeps equal counts (``flows/planning/scaling.py``)."""
    migrate_window_s: float = Field(0.25, ge=0)
    """Cut samples arriving within this many seconds of the first share one continuation."""
    score_while_generating: bool | None = None
    """Score a shard as soon as its generation returns (overlapping the rest of generation).
    Off, scores start when generation ends. That is right where score and generation actions
    share processors or accelerators (the local warm pool, one GPU for everything): there the
    overlap only slows the generation actions still running and inflates their billed time.
    None (default): on for ``invoker.kind: openwhisk``, where every action has its own
    accelerators, off for the local and in-process invokers (``CampaignConfig.overlap_scoring``)."""
    prefill_capacity: int = Field(64, gt=0)
    """B_prefill: most unique prefixes one prefill action computes (PAPER 3.1)."""
    length_window: int = Field(1, ge=1)
    """EWMA window (epochs) of the response-length predictor."""
    speculation: Literal["auto", "off"] = "auto"
    """Speculative decoding in the torch engine (``actions/engines/speculative.py``): ``auto``
    drafts and verifies where the selector predicts it pays, per decode round, and decodes
    plainly elsewhere; ``off`` never drafts. Outputs are plain decoding's either way (a draft
    token is kept only where it equals the target's own draw). ``engine: vllm``: see docs/vllm.md."""
    draft_strategies: list[Literal["history", "prompt_lookup"]] = Field(
        default_factory=lambda: ["history", "prompt_lookup"], min_length=1)
    """Drafting strategies the selector may use: ``history`` (the prompt's responses from
    earlier epochs, kept in the store) and ``prompt_lookup`` (n-grams of prompt + response)."""
    max_draft_len: int = Field(8, ge=1, le=64)
    """Longest draft (k) one verification forward checks."""

    @field_validator("speculation", mode="before")
    @classmethod
    def _yaml_off(cls, v: object) -> object:
        # YAML 1.1 reads a bare ``off`` as false: accept what the user wrote.
        return "off" if v is False else v


class ScalingConfig(_Section):
    policy: str = "cost_aware"
    """``cost_aware``, ``fixed:N`` or ``package.module:function``."""
    n_min: int = Field(1, ge=1)
    n_max: int = Field(4, ge=1)
    lam: float = Field(0.7, ge=0, le=1)
    """Weight of time in the ``paper`` objective (PAPER 3.5)."""
    objective: Literal["value", "slack", "paper"] = "value"
    """How ``cost_aware`` picks among its candidate plans (``flows/planning/objective.py``):
    ``value`` minimises cost + value_of_time_usd_per_s x phase time; ``slack`` takes the
    cheapest plan within (1 + time_slack) of the fastest; ``paper`` the paper's min-max lam.
    No objective picks a plan another candidate beats on both predicted time and cost."""
    value_of_time_usd_per_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    """Dollars one second of generation-phase time is worth to the operator. None: the price
    of the GPUs that wait for the phase (the learner's, ``price_per_gpu_second`` x their count)."""
    time_slack: float = Field(0.05, ge=0, le=10)
    """``objective: slack``: accepted time above the fastest candidate's, as a fraction."""
    gpus_per_actor: int = Field(1, ge=1)
    cold_start_s: float = Field(2.0, ge=0)
    profile: str | None = None
    """TPOT profile JSON (``rlhfless profile``); None: measured by the pool at campaign start,
    or reused from the store's cache for the same model, dtype, device, engine and threads
    (``flows/campaign/live_profile.py``)."""
    prewarm: bool = True
    """Warm the generation actions (and load the new policy version in them) ahead of use,
    at the earliest past invocation offset minus ``prewarm_buffer_s`` (PAPER 3.7)."""
    prewarm_buffer_s: float = Field(0.2, ge=0)

    @field_validator("policy")
    @classmethod
    def _check_policy(cls, v: str) -> str:
        if v == "cost_aware" or ":" in v:
            if v.startswith("fixed:"):
                n = v.split(":", 1)[1]
                if not n.isdigit() or int(n) < 1:
                    raise ValueError(f"scaling.policy {v!r}: fixed:N needs a positive integer N, e.g. fixed:2")
            return v
        raise ValueError(f"scaling.policy {v!r} is unknown; use cost_aware, fixed:N or package.module:function")

    @model_validator(mode="after")
    def _check_range(self) -> ScalingConfig:
        if self.n_min > self.n_max:
            raise ValueError(f"scaling.n_min={self.n_min} is above scaling.n_max={self.n_max}; make n_min <= n_max")
        return self


class StoreConfig(_Section):
    uri: str = "runs/store"
    """A directory, or s3://bucket/prefix (endpoint and keys from AWS_* environment variables)."""
    keep_last: int | None = 2
    """Policy versions kept after each commit: the newest this many (the newest's optimizer
    state too, for a resume). Older versions' objects, and blobs nothing kept references, are
    deleted after the commit (``flows/campaign/collect.py``). None: keep every version."""
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
        # A mistyped scheme would otherwise be taken as a relative directory name ("s3:").
        if not v.strip():
            raise ValueError("store.uri is empty; use a directory path or s3://bucket/prefix")
        scheme = v.split(":", 1)[0].lower() if ":" in v else ""
        if v.startswith(("s3://", "file://")) or (scheme not in ("s3", "file") and "://" not in v):
            return v
        raise ValueError(f"store.uri {v!r} is not a directory path or s3://bucket/prefix; fix the scheme")


class InvokerConfig(_Section):
    kind: Literal["local", "inprocess", "openwhisk"] = "local"
    num_workers: int = Field(0, ge=0)
    """Local warm pool size; 0 = scaling.n_max + 1."""
    num_cores: int = Field(0, ge=0)
    """Local pool and in-process: cores shared by the running actions, each setting torch's
    threads to its share when it starts (all of them when it runs alone); 0: the cores this
    process may run on."""
    package: str = "rlhfless"
    """OpenWhisk package holding the actions."""
    timeout_s: float = Field(600.0, gt=0)
    log_dir: str | None = None
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


class BudgetConfig(_Section):
    usd: float | None = Field(None, gt=0)
    gpu_seconds: float | None = Field(None, gt=0)


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
    latency_fraction: float = Field(0.0, ge=0, le=1)
    """These activations sleep ``latency_s`` before running (every attempt)."""
    latency_s: float = Field(0.0, ge=0, le=600)
    actions: list[str] = ["generate", "score"]
    seed: int = 0

    @field_validator("actions")
    @classmethod
    def _check_actions(cls, v: list[str]) -> list[str]:
        known = ("prefill", "generate", "score", "train_step", "warmup", "evaluate")
        unknown = [a for a in v if a not in known]
        if unknown:
            raise ValueError(f"faults.actions {unknown!r}: unknown action(s); choose from {', '.join(known)}")
        return v


class ObservabilityConfig(_Section):
    tensorboard: bool = False
    """Write each step's metrics as TensorBoard scalars (needs tensorboardX: the extra ``tensorboard``)."""
    tensorboard_dir: str | None = None
    """Event-file directory; None: ``runs/<run_id>/tensorboard``, beside the CLI's default run directory."""


class CampaignConfig(_Section):
    run_id: str | None = None
    """Names the run in the store; None derives it from the configuration's hash."""
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    reward: RewardConfig = RewardConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    warmup: WarmupConfig = WarmupConfig()
    generation: GenerationConfig = GenerationConfig()
    scaling: ScalingConfig = ScalingConfig()
    store: StoreConfig = StoreConfig()
    invoker: InvokerConfig = InvokerConfig()
    budget: BudgetConfig = BudgetConfig()
    faults: FaultConfig = FaultConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    price_per_gpu_second: float = Field(0.0004, ge=0)
    """USD per GPU-second (0.0004 = $1.44 per GPU-hour)."""
    seed: int = 0
    steps: int = Field(24, ge=1)
    eval_every: int = Field(4, ge=0)
    """Evaluate on the held-out set every this many steps (0: only before and after)."""

    @field_validator("run_id")
    @classmethod
    def _check_run_id(cls, v: str | None) -> str | None:
        return v if v is None else check_run_id(v)

    @model_validator(mode="after")
    def _resolve_defaults(self) -> CampaignConfig:
        if self.data.max_count is None:
            self.data.max_count = {"repeat": 14, "arith": 3}[self.data.task]
        if self.warmup.error_rate is None:
            self.warmup.error_rate = {"repeat": 0.9, "arith": 0.7}[self.data.task]
        if self.warmup.steps is None:
            self.warmup.steps = 0 if self.data.train_path else 300
        return self

    def reward_functions(self) -> list[RewardFunctionConfig]:
        """``reward.functions``, or the task's reward when unset."""
        return self.reward.functions or [RewardFunctionConfig(name=TASK_REWARDS[self.data.task])]

    def overlap_scoring(self) -> bool:
        """Whether a shard's score is submitted while other shards still generate."""
        overlap = self.generation.score_while_generating
        return self.invoker.kind == "openwhisk" if overlap is None else overlap

    def identity(self) -> dict[str, Any]:
        """The settings that define what a run computes; resuming requires them unchanged.
        Steps, budgets, store, invoker, fault injection and observability may change between resumes."""
        data = self.model_dump(mode="json")
        for key in ("steps", "budget", "store", "invoker", "faults", "observability", "run_id", "eval_every"):
            data.pop(key, None)
        # Fan-out and planning change cost, never the training data (ARCHITECTURE invariant 3).
        data.pop("scaling", None)
        data["model"].pop("gradient_checkpointing", None)  # memory for compute; the same weights
        for key in ("assignment", "cut_threshold", "rank_slack", "migrate_window_s", "score_while_generating",
                    "dedup_prefill", "prefill_capacity", "length_window"):
            data["generation"].pop(key, None)
        return data

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:12]

    def resolved_run_id(self) -> str:
        source = "dataset" if self.data.train_path else self.data.task  # a user dataset is not the task
        return self.run_id or f"{source}-{self.algorithm.name}-{self.fingerprint()}"


# ----------------------------------------------------------------------------- loading


def _first_error(exc: ValidationError, raw: dict[str, Any]) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        parent = loc.rsplit(".", 1)[0] if "." in loc else "top level"
        return f"unknown config key {loc!r}: not a setting of {parent}; check the spelling (see README, Configuration)"
    if msg.startswith("Value error, "):
        return msg[len("Value error, "):]
    value = raw
    for part in err["loc"]:
        if isinstance(value, dict):
            value = value.get(part, "<missing>")
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            value = value[part]  # an entry of a list setting, e.g. generation.draft_strategies.0
        else:
            value = "<missing>"
    return f"config {loc} = {value!r}: {msg.lower()}"


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], parsed YAML value)."""
    if "=" not in item:
        raise ValueError(f"--set {item!r} is not of the form dotted.key=value, e.g. --set algorithm.lr=1e-3")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ValueError(f"--set {item!r} has an empty key segment; use dotted.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def load_config(path: str | None = None, overrides: list[str] | None = None) -> CampaignConfig:
    """Read a YAML file (optional), apply ``--set`` overrides, validate.

    Raises:
        ValueError: a one-line message naming the field, the value and the fix.
    """
    raw: dict[str, Any] = {}
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"config file {path!r} cannot be read ({exc.strerror}); check --config") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ValueError(f"config file {path!r} is not valid YAML{where}; fix the syntax") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"config file {path!r} must hold a mapping of sections, not {type(loaded).__name__}")
        raw = loaded or {}
    for item in overrides or []:
        parts, value = parse_override(item)
        node = raw
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ValueError(f"--set {item!r}: {p!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    try:
        return CampaignConfig.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(_first_error(exc, raw)) from None
