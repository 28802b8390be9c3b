"""Wire contracts between flows and actions: one pydantic model per message.

Payloads carry object-store keys and small statistics, never tensors (OpenWhisk caps params
and results at about 1 MB). Both sides import these models; actions validate the incoming
dict at the edge and return ``{"error": ..., "field": ...}`` when it does not fit.

Key conventions: ``store_uri`` names the store, ``base_key`` the model's config/tokenizer
artifact, ``policy_key`` a policy version's manifest. Every output key is chosen by the flow
from (run, step, shard), so running an action twice writes the same bytes to the same keys.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from actions.config.reward import RewardModelConfig, reward_model_key
from actions.config.vllm import VllmConfig
from actions.config.workload import AlgorithmConfig, LoraConfig, RewardFunctionConfig, WarmupConfig, WorkloadConfig


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


def rollout_temperature() -> Any:
    """The ``temperature`` field of the score and train requests: ``generation.temperature``, the
    rollouts' sampling temperature. The learner's log-probs (old, reference, trained) are of
    ``softmax(logits / temperature)``, the distribution the samples were drawn from, as TRL and
    verl compute them (``actions/rl/head.py``; top-k/top-p are not applied; 0, greedy decoding,
    reads as 1). Left out of a request at its default, 1, so that actions of the revision before
    it existed (which refuse unknown fields) still take a run that samples at temperature 1."""
    return Field(1.0, ge=0, exclude_if=lambda t: t == 1.0)


def vllm_settings() -> Any:
    """The ``vllm`` field of the requests that may start a vLLM engine: ``generation.vllm``.
    Left out of a request where nothing in it is set, so that actions of the revision before
    it existed (which refuse unknown fields) still take a run that sets none."""
    return Field(default_factory=VllmConfig, exclude_if=lambda v: not v.llm_kwargs())


class DecodeSettings(_Msg):
    """Which engine a generation action decodes with, and how (``generation.*``): what a
    pre-warm needs to build the engine the run's generate actions then use."""

    engine: Literal["torch", "vllm"] = "torch"
    kv_cache: Literal["static", "dynamic"] = "static"
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    compile_decode: bool = False
    fused_sampling: Literal["auto", "on", "off"] = "auto"
    vllm: VllmConfig = vllm_settings()

    @classmethod
    def of(cls, generation: Any) -> DecodeSettings:
        """The settings of a ``GenerationConfig``."""
        return cls(**{name: getattr(generation, name) for name in cls.model_fields})

    def engine_options(self) -> dict[str, Any]:
        """``load_engine``'s keyword arguments (everything but ``engine``)."""
        return self.model_dump(exclude={"engine"})


class ModelRef(_Msg):
    store_uri: str
    base_key: str
    policy_key: str
    policy_version: int = Field(ge=0)
    weights_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    """The committed fingerprint of ``policy_key``; loading refuses a tensor set that differs
    (a manifest overwritten after its commit). None: check the manifest against itself only."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """``model.dtype``: what the action loads the weights in (``device.action_dtype``)."""
    lora: LoraConfig | None = None
    """``model.lora``: set, ``policy_key`` names an adapter over the backbone ``backbone_key``
    (or the backbone itself at version 0, where the adapter is its seeded initialisation)."""
    backbone_key: str | None = None
    """With ``lora``: the frozen backbone's tensor manifest (policy version 0, the reference)."""

    @model_validator(mode="after")
    def _check_backbone(self) -> ModelRef:
        if self.lora is not None and self.backbone_key is None:
            raise ValueError("ModelRef.backbone_key is None with lora set; name the backbone's manifest")
        return self


class SampleStat(_Msg):
    """One generated sample, summarised for planning and accounting."""

    prompt_id: int
    sample_index: int
    length: int  # response tokens, EOS excluded
    finish_reason: Literal["stop", "length", "cut"]


class PartialSample(_Msg):
    """A cut sample: continue it from ``tokens`` with the same random stream."""

    prompt_id: int
    sample_index: int
    tokens: list[int]


# ----------------------------------------------------------------------------- warmup


class WarmupRequest(_Msg):
    store_uri: str
    base_key: str
    init_key: str
    dataset_key: str
    output_key: str
    warmup: WarmupConfig
    task: str | None
    """The synthetic task whose imperfect demonstrator writes the targets; None: the
    dataset's reference answers, verbatim (a user dataset with worked solutions)."""
    seed: int
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """``model.dtype``: what the warm-up trains in and publishes policy version 0 in, as
    ``ModelRef.dtype`` (``device.action_dtype``), so every later action loads v0 unconverted."""
    gradient_checkpointing: bool = False
    """``model.gradient_checkpointing``, as ``TrainStepRequest``'s."""


class WarmupResult(_Msg):
    policy_key: str
    weights_sha256: str
    loss_first: float
    loss_last: float
    num_steps: int


# ----------------------------------------------------------------------------- prefill


class PrefillRequest(_Msg):
    model: ModelRef
    dataset_key: str
    prompt_ids: list[int]
    prefix_len: int = Field(ge=1)
    output_key: str


class PrefillResult(_Msg):
    bundle_key: str
    num_unique_prefixes: int
    tokens_computed: int


# ----------------------------------------------------------------------------- generate


class GenerateRequest(_Msg):
    model: ModelRef
    dataset_key: str
    run_seed: int
    step: int = Field(ge=0)
    shard: str
    prompt_ids: list[int] = []
    group_size: int = Field(1, ge=1)
    partial_keys: list[str] = []
    """Continuation: objects holding PartialSample lists (cut samples to finish)."""
    max_new_tokens: int = Field(gt=0)
    temperature: float = Field(ge=0)
    top_k: int | None = Field(None, ge=1)
    """``generation.top_k``: sample among the k most likely tokens; None: off."""
    top_p: float | None = Field(None, gt=0, le=1)
    """``generation.top_p``: nucleus sampling mass; None: off."""
    dedup_prefill: bool = True
    kv_bundle_key: str | None = None
    cut_after: int | None = Field(None, ge=1)
    """Stop once this many samples finished and return the rest as partial (cut-and-migrate)."""
    engine: Literal["torch", "vllm"] = "torch"
    """Generation engine (``generation.engine``); see ``actions/engines/base.py``."""
    kv_cache: Literal["static", "dynamic"] = "static"
    """``generation.kv_cache`` (torch engine's plain decoding)."""
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    """``generation.cuda_graphs`` (torch engine on CUDA)."""
    compile_decode: bool = False
    """``generation.compile_decode`` (torch engine, static cache)."""
    fused_sampling: Literal["auto", "on", "off"] = "auto"
    """``generation.fused_sampling`` (either engine; the same tokens either way)."""
    vllm: VllmConfig = vllm_settings()
    """``generation.vllm`` (the vLLM engine's context and memory)."""
    speculation: Literal["auto", "off"] = "off"
    """``generation.speculation`` (torch engine; outputs are the same either way)."""
    draft_strategies: list[Literal["history", "prompt_lookup"]] = ["history", "prompt_lookup"]
    max_draft_len: int = Field(8, ge=1, le=64)
    draft_keys: list[str] = []
    """Objects of earlier epochs' responses (``flows/campaign/drafts.py``) for the ``history`` strategy."""
    spec_priors: dict[str, float] = {}
    """Strategy -> acceptance rate measured by earlier steps (the selector's starting estimate)."""
    output_key: str


class EngineEvents(_Msg):
    """What a worker process spent on its generation engine since its previous report: engine
    starts and in-place weight pushes (``actions/engines/factory.py``). vLLM: an engine built,
    a version pushed into it. Torch: the slot's model built, a version copied into its
    parameters (``actions/engines/torch_slot.py``). A pre-warm's or a profile's events ride on
    the process's next generate or evaluate result: none is lost or counted twice."""

    starts: int = Field(0, ge=0)
    start_s: float = Field(0.0, ge=0)
    """Seconds spent building engines (the engine's own start or the torch model's build, weights included)."""
    pushes: int = Field(0, ge=0)
    push_s: float = Field(0.0, ge=0)
    """Seconds spent pushing new policy versions into a running engine (read, reload, cache
    reset) or copying them into the torch slot's model (read, verify, copy)."""


class GenerateResult(_Msg):
    shard: str
    """The request's ``shard``: the flow's name for this slice of the step (``gen-3``, ``cont-0``)."""
    kind: Literal["first", "continuation"]
    """``first``: a planned slice of fresh prompts; ``continuation``: cut samples finished."""
    rollout_key: str
    samples: list[SampleStat]
    partial_key: str | None = None
    num_cut: int = 0
    prefill_tokens: int
    prefill_tokens_naive: int
    decode_steps: int
    kv_bundle_used: bool = False
    spec: dict[str, Any] | None = None
    """Speculative decoding counters (``speculative.SpecStats.to_dict``); None: decoded plainly."""
    engine_events: EngineEvents = EngineEvents()
    kv_cache: str = "dynamic"
    """The plain decode path that ran: ``dynamic``, ``static`` or ``static+graphs``."""
    graph_captures: int = 0
    """CUDA graphs this activation captured (0 where a warm container replayed its graphs)."""
    graph_capture_s: float = 0.0
    """Seconds those captures took."""


# ----------------------------------------------------------------------------- score


class RewardModelRef(_Msg):
    """A reward model as ``prepare`` stored it: its folder's files under ``manifest_key``."""

    index: int = Field(ge=0)
    """Its place in ``reward.models``; it is reported as ``reward_model/<index>``."""
    manifest_key: str
    settings: RewardModelConfig

    @property
    def name(self) -> str:
        return f"reward_model/{self.index}"


def reward_model_refs(workload: WorkloadConfig, run_prefix: str) -> list[RewardModelRef]:
    """The stored reward models of a run (``prepare`` writes each at ``reward_model_key``)."""
    return [RewardModelRef(index=i, manifest_key=reward_model_key(run_prefix, i), settings=m)
            for i, m in enumerate(workload.reward.models)]


class _Rewarded(_Msg):
    """What scores a completion: weighted functions and reward models, at least one of them."""

    rewards: list[RewardFunctionConfig] = []
    """The weighted reward functions (``WorkloadConfig.reward_functions``)."""
    reward_models: list[RewardModelRef] = []
    step: int = Field(0, ge=0)
    """Steps completed before this scoring: RL steps in a ``ScoreRequest`` (its ``algorithm``
    turns them into the optimizer steps ``trainer_state.global_step`` counts, as TRL does;
    ``actions/tasks/rewards/trainer_state.py``), optimizer steps already in an
    ``EvaluateRequest``, which carries no algorithm. Both fields existed before the counting
    did, so a request stays one that actions of that revision take."""
    max_steps: int = Field(0, ge=0)
    """The campaign's ``steps``, counted as ``step`` is (``trainer_state.max_steps``)."""

    @model_validator(mode="after")
    def _check_scored(self) -> _Rewarded:
        if not self.rewards and not self.reward_models:
            raise ValueError("rewards and reward_models are both empty; name a reward function or a reward model")
        return self


class ScoreRequest(_Rewarded):
    policy: ModelRef
    reference_key: str
    critic_key: str | None = None
    dataset_key: str
    rollout_keys: list[str]
    algorithm: AlgorithmConfig
    output_key: str
    temperature: float = rollout_temperature()
    """The rollouts' sampling temperature: the old and reference log-probs are of its distribution."""


class ScoreResult(_Msg):
    scored_key: str
    num_samples: int
    reward_mean: float
    reward_sum: float
    kl_mean: float
    reward_metrics: dict[str, list[float]] = {}
    """What the reward functions passed to TRL's ``log_metric`` on this shard: name -> values
    in call order (the step's metrics average them, ``flows/step/metrics.py``)."""
    reward_values: dict[str, list[float]] = {}
    """Each reward function's and reward model's own scores on this shard, unweighted, by the
    name ``reward.functions`` / ``reward.models`` gives it: the rows it scored (its Nones left
    out). The step's metrics report their mean and std per name, as TRL's ``rewards/<name>/*``."""


# ----------------------------------------------------------------------------- train


class TrainStepRequest(_Msg):
    policy: ModelRef
    optimizer_key: str | None
    critic_key: str | None = None
    critic_optimizer_key: str | None = None
    scored_keys: list[str]
    algorithm: AlgorithmConfig
    seed: int
    step: int
    output_prefix: str
    gradient_checkpointing: bool = False
    world_size: int | None = Field(None, ge=1)
    """``train.world_size``; None: ``gpus_per_actor`` on CUDA, 1 on the CPU."""
    gpus_per_actor: int = Field(1, ge=1)
    temperature: float = rollout_temperature()
    """The rollouts' sampling temperature: the trained log-probs are of its distribution
    (:func:`rollout_temperature`)."""
    max_new_tokens: int | None = Field(None, ge=1, exclude_if=lambda n: n is None)
    """``generation.max_new_tokens``, sent only for ``algorithm.loss_agg: seq_mean_token_sum_norm``,
    which divides by it (left out otherwise, as ``temperature`` is at 1)."""


class TrainStepResult(_Msg):
    policy_key: str
    policy_version: int
    weights_sha256: str
    optimizer_key: str
    critic_key: str | None = None
    critic_optimizer_key: str | None = None
    bytes_uploaded: int
    metrics: dict[str, float]


# ----------------------------------------------------------------------------- evaluate


class EvaluateRequest(_Rewarded):
    model: ModelRef
    dataset_key: str
    max_new_tokens: int = Field(gt=0)
    engine: Literal["torch", "vllm"] = "torch"
    """Generation engine (``generation.engine``); greedy either way."""
    kv_cache: Literal["static", "dynamic"] = "static"
    """``generation.kv_cache`` (torch engine's plain decoding)."""
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    """``generation.cuda_graphs`` (torch engine on CUDA)."""
    compile_decode: bool = False
    """``generation.compile_decode`` (torch engine, static cache)."""
    fused_sampling: Literal["auto", "on", "off"] = "auto"
    """``generation.fused_sampling``: greedy evaluation never draws, but a vLLM engine it starts
    serves the container's generation too, and a torch engine is kept per decode settings."""
    vllm: VllmConfig = vllm_settings()
    """``generation.vllm``: a vLLM engine it starts serves the container's generation too."""
    output_key: str


class EvaluateResult(_Msg):
    accuracy: float
    """Fraction of completions whose reward functions' sum reached its row's best (``rewards.is_best``)."""
    mean_length: float
    """Tokens per completion, its stop token included (as training's ``response_length``)."""
    num_prompts: int
    reward_mean: float = 0.0
    """Mean reward of the completions some reward applied to (as training's ``reward/mean``)."""
    reward_metrics: dict[str, float] = {}
    """The mean of each value the reward functions logged with ``log_metric`` while scoring
    the evaluation, by name (TRL reports them as the evaluation's metrics)."""
    engine_events: EngineEvents = EngineEvents()


# ----------------------------------------------------------------------------- prepare


class PrepareRequest(_Msg):
    """``prepare``: put the workload's model, initial weights and datasets into the store.

    ``workload.model.path`` and ``workload.data.*_path`` are read where the action runs, so
    the control plane runs it where those files are (``flows/campaign/inputs.py``)."""

    workload: WorkloadConfig
    store_uri: str
    run_prefix: str
    """Every object goes under it (``<run_prefix>/base/``, ``/init/``, ``/data/``)."""
    steps: int = Field(1, ge=1, exclude_if=lambda n: n == 1)
    """The campaign's RL steps: the reward plug-ins' start-up call gets its ``trainer_state.max_steps``
    (left out at 1, as ``temperature`` is, :func:`rollout_temperature`)."""


class Prepared(_Msg):
    """What ``prepare`` wrote to the store (``actions/prepare.py``)."""

    base_key: str
    init_key: str
    train_key: str
    eval_key: str
    tokens_key: str
    model: dict[str, Any]
    data: dict[str, Any] = {}
    """What loading the datasets did (``build.Datasets.summary``): rows kept, dropped, truncated."""

    def object_keys(self) -> dict[str, str]:
        """field -> object key, for every key this names (garbage collection, commit checks)."""
        return {f: getattr(self, f) for f in ("base_key", "init_key", "train_key", "eval_key", "tokens_key")}


class CriticInitRequest(_Msg):
    """``init_critic`` (PPO): the critic's first version, the policy's backbone with a zero value head."""

    model: ModelRef
    """The policy version the critic starts from (v0, after warm-up)."""
    output_key: str
    """Manifest key of the critic's weights."""


class CriticInitResult(_Msg):
    critic_key: str
    weights_sha256: str


class PromptTokens(_Msg):
    """One training prompt in the token table (``Prepared.tokens_key``): what the planner needs
    without loading a tokenizer."""

    prompt: list[int]
    answer_len: int = Field(ge=0)
    """Tokens of the reference answer (or the cap without one): the first epoch's length prediction."""


def parse_token_table(raw: dict[str, Any]) -> dict[int, PromptTokens]:
    """The stored token table (JSON object, prompt id as a string key) with int keys."""
    return {int(pid): PromptTokens.model_validate(row) for pid, row in raw.items()}


class NoopResult(_Msg):
    """``noop``: an empty activation (pre-warm, the invoker's round-trip probe)."""

    ok: bool


RESULT_MODELS: dict[str, type[_Msg]] = {
    "warmup": WarmupResult, "prefill": PrefillResult, "generate": GenerateResult, "score": ScoreResult,
    "train_step": TrainStepResult, "evaluate": EvaluateResult, "noop": NoopResult, "prepare": Prepared,
    "init_critic": CriticInitResult,
}
"""Each action's result contract, by action name (``profile``'s is ``profile_cache.ProfileResult``,
which imports this module: the flow adds it, ``flows/step/invoke.py``)."""


def without_control(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without the ``__*`` control keys that travel beside a contract
    (``actions/runtime/control.py``)."""
    return {k: v for k, v in message.items() if not k.startswith("__")}


def parse_result(action: str, result: dict[str, Any], model: type[BaseModel] | None = None) -> BaseModel:
    """Validate what ``action`` returned against its contract, the moment it arrives.

    Raises:
        ValueError: one line naming the action, the field, the value and the fix (an action
            of another version answered).
    """
    body = without_control(result)
    model = model or RESULT_MODELS[action]
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "result"
        raise ValueError(f"action {action} returned a result that does not fit {model.__name__}: {field}: "
                         f"{err['msg'].lower()} (got {_shown(err)}); deploy actions of this version") from None


def _shown(err: Any) -> str:
    text = "<missing>" if err["type"] == "missing" else repr(err.get("input", "<missing>"))
    return text if len(text) <= 80 else text[:77] + "..."


def parse_request(model: type[_Msg], args: dict[str, Any]) -> _Msg | dict[str, Any]:
    """Validate an incoming payload; on failure return the OpenWhisk application-error dict
    ``{"error": "<field>: <problem> (got <value>)", "field": ...}`` instead of raising."""
    payload = without_control(args)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "payload"
        # An unknown key's value is never quoted: it may be a secret bound as an action's default
        # parameter, which the container's environment (what ``redact`` scrubs) does not hold.
        got = "" if err["type"] == "extra_forbidden" else f" (got {_shown(err)})"
        return {"error": f"{model.__name__}.{field}: {err['msg'].lower()}{got}", "field": field}
