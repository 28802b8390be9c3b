"""The workload's configuration: the sections the actions read (model, data, reward,
algorithm, warm-up, generation) and their root, ``WorkloadConfig``.

The campaign's whole configuration, ``flows.config.CampaignConfig``, extends the root with the
control plane's sections (scaling, store, invoker, budget, faults, observability) and loads it
from YAML plus ``--set`` overrides. Every section forbids unknown keys, so a typo is an error
naming the key rather than a silently ignored setting. Cross-field rules live in validators
whose messages name the field, the value and the fix. The embedded defaults describe the
laptop campaign ``make train`` runs: tiny Llama on CPU, local warm pool, local store.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from actions.config.algorithm_rules import check_algorithm_name

# LoraConfig and ModelConfig are re-exported, as the reward sections are.
from actions.config.model import LoraConfig, ModelConfig  # noqa: F401
from actions.config.quoting import chat_template_mode

# RewardFunctionConfig is re-exported: the contracts and callers take every section from here.
from actions.config.reward import (  # noqa: F401
    REFERENCE_REWARDS,
    TASK_REWARDS,
    RewardConfig,
    RewardFunctionConfig,
    RewardModelConfig,
)
from actions.config.section import HomePath
from actions.config.section import Section as _Section
from actions.config.vllm import VllmConfig


class DataConfig(_Section):
    task: Literal["repeat", "arith"] = "repeat"
    """The synthetic task used when ``train_path`` is unset, and the default reward. ``repeat``:
    write a letter exactly k times; ``arith``: GSM8K-style arithmetic word problems."""
    train_path: HomePath | None = None
    """A .jsonl or .parquet file, a .json file (JSON Lines or one array of objects), a folder of .parquet files, a
    ``Dataset.save_to_disk`` folder, or a hub id (``owner/name[/subset]``); None generates the task."""
    eval_path: HomePath | None = None
    """Held-out prompts in any form ``train_path`` takes (the ``test`` split, else ``validation``, where there are
    splits). Without it, ``eval_fraction`` of the training rows are held out, or nothing is evaluated."""
    eval_fraction: float | None = Field(None, gt=0, lt=1)
    """With ``train_path`` and no ``eval_path``: the share of the training rows held out for
    evaluation (chosen by the run's seed); None: evaluate nothing."""
    prompt_key: str = Field("prompt", min_length=1)
    """Column holding the prompt: a string, or a list of chat messages (``role``, ``content``
    and any other keys, such as ``tool_calls``, all kept for the chat template)."""
    answer_key: str | None = Field("answer", min_length=1)
    """Column holding the reference answer (for GSM8K, the worked solution ending ``#### N``).
    None: the dataset has no reference answers, as with length or format rewards. A row may
    lack one (the column absent or null) unless something reads it: a built-in reward that
    compares with it (``REFERENCE_REWARDS``) or warm-up on a dataset (``answer_need``)."""
    id_key: str | None = None
    """Column holding a unique id (int or string); None: a ``prompt_id`` column if any row has
    one (then every row must), else an id from the row's content."""
    chat_template: Literal["auto", "messages"] | bool = "auto"
    """Format prompts with the tokenizer's chat template: auto (when it has one), true, false, or
    messages (TRL's GRPOTrainer: chat-message prompts only; ``actions/tasks/chat.py``)."""
    system_prompt: str | None = None
    """Put first as a system message (or, without a chat template, before the prompt)."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Longest prompt in tokens (after formatting); None: for a dataset file, the model's context
    less ``generation.max_new_tokens`` (``actions/tasks/input_limits.py``); for a generated task, none.
    A value set may not exceed that room either, where the model states its context."""
    long_prompts: Literal["error", "truncate_left", "skip"] = "error"
    """What happens to a prompt above ``max_prompt_tokens``."""
    num_train_prompts: int = Field(512, ge=1)
    """Training prompts of the generated task; a dataset file is used whole (set beside
    ``train_path``, it is refused by ``load_config``)."""
    num_eval_prompts: int = Field(64, ge=1)
    """Eval prompts of the generated task, drawn as its training prompts are (from the
    repeat task's few distinct prompts, most of them are training prompts too). Not used with
    ``eval_path`` (every row of the file is evaluated), but part of the run's identity."""
    max_count: int | None = Field(None, ge=1)
    """Largest k of the repeat task (answer length in tokens; None: 14), or the most operations
    of an arith problem (None: 3). Not used with ``train_path``, but part of the run's identity."""
    max_value: int | None = Field(None, ge=1)
    """Largest quantity of an arith problem: every number in it, its worked solution and its
    answer lies in 0..max_value (None: 9). Only the arith task has quantities."""


    @model_validator(mode="after")
    def _check_max_value(self) -> DataConfig:
        if self.max_value is not None and (self.task != "arith" or self.train_path):
            raise ValueError(f"data.max_value={self.max_value} sets the quantities of the generated arith task, but "
                             f"{'data.train_path is set' if self.train_path else f'data.task is {self.task!r}'}; "
                             "remove data.max_value (or set data.task: arith without data.train_path)")
        return self

    @model_validator(mode="after")
    def _check_eval_fraction(self) -> DataConfig:
        if self.eval_fraction is not None and (self.eval_path or not self.train_path):
            why = "data.eval_path is set" if self.eval_path else "the generated task has its own eval set"
            raise ValueError(f"data.eval_fraction={self.eval_fraction} holds out training rows, but {why}; "
                             "remove data.eval_fraction (it needs data.train_path without data.eval_path)")
        return self

    @field_validator("chat_template", mode="before")
    @classmethod
    def _check_chat_template(cls, v: Any) -> Any:
        return chat_template_mode(v, "data.chat_template", ("messages",))


LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
"""How a policy loss reduces its per-token terms (``AlgorithmConfig.loss_agg``, ``actions/rl/masked.py: aggregate``)."""


class AlgorithmConfig(_Section):
    name: Literal["grpo", "ppo"] = "grpo"
    """``grpo``: group-relative advantages, no critic. ``ppo``: a learned critic and GAE
    (``critic_lr``, ``gamma``, ``gae_lambda``, ``value_clip``; GRPO refuses them at other than their
    defaults, since they would change its run id and nothing it computes)."""
    batch_size: int = Field(128, gt=0)
    """Samples (responses) per step = prompts per step x group_size."""
    group_size: int = Field(8, gt=0)
    """Responses per prompt (GRPO's n; GRPO needs 2 or more, PPO takes 1)."""
    kl_coef: float = Field(0.01, ge=0)
    """Weight of the KL penalty to the reference policy (the policy after warm-up); 0: none."""
    kl_kind: Literal["k1", "k2", "k3"] | None = None  # never None once validated: _default_kl_kind fills it
    """KL estimator (``actions/rl/kl.py``): GRPO adds ``kl_coef`` x it to the loss, reduced
    over tokens as ``loss_agg`` says (a token mean by default), PPO subtracts ``kl_coef`` x it
    from each token's reward. Unset or null: the algorithm's own, k3 for GRPO (DeepSeekMath eq. 4),
    k1 for PPO (Ouyang et al. eq. 2; TRL's ``kl_estimator``)."""
    clip_low: float = Field(0.2, gt=0, lt=1)
    """The importance ratio is clipped below at ``1 - clip_low`` (PPO's epsilon)."""
    clip_high: float = Field(0.28, gt=0)
    """The importance ratio is clipped above at ``1 + clip_high`` (DAPO's clip-higher; equal
    to ``clip_low`` is PPO's symmetric clip)."""
    value_clip: float = Field(0.2, gt=0)
    """PPO: the critic's new value is clipped to within this of its old one in the value loss."""
    lr: float = Field(6e-4, gt=0)
    """Policy learning rate (AdamW). The default campaign's held-out gain over seeds 0-2 is
    +0.30/+0.31/+0.23 at 6e-4 against +0.25/+0.22/+0.23 at 4e-4 (docs/results.md)."""
    critic_lr: float = Field(2e-3, gt=0)
    """PPO: the critic's learning rate (AdamW)."""
    epochs: int = Field(1, ge=1)
    """Passes over each step's samples, ``num_minibatches`` optimizer steps each."""
    num_minibatches: int = Field(2, ge=1)
    """Optimizer steps per epoch: the step's prompt groups, shuffled, are split into this many
    mini-batches of whole groups, as equal as they can be (one group apart at most where it does
    not divide ``batch_size / group_size``; ``actions/rl/update.py``, ``minibatches``)."""
    gamma: float = Field(1.0, ge=0, le=1)
    """PPO: discount per token in GAE."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """PPO: GAE's lambda (bias against variance of the advantage)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradients are clipped to this global L2 norm before each optimizer step."""
    scale_by_std: bool = True
    """GRPO: divide each group's centred rewards by their std (False: Dr. GRPO). PPO refuses
    False: it whitens its GAE advantages over the batch instead."""
    loss_agg: LossAgg = Field("token_mean", exclude_if=lambda v: v == "token_mean")
    """How the policy loss reduces its per-token terms (the clipped surrogate and GRPO's KL):
    ``token_mean`` over every real token of the mini-batch (DAPO; TRL's ``dapo``, and
    ``bnpo`` without micro-batches),
    so a long response weighs in proportion to its length; ``seq_mean_token_mean``, each
    response's token mean, then the mean over responses (the GRPO paper; TRL's ``grpo``), so a
    short response's tokens weigh more; ``seq_mean_token_sum_norm``, the token sum over
    responses x ``generation.max_new_tokens``, a constant (Dr. GRPO; TRL's ``dr_grpo``), free of
    either length bias. PPO's value loss is a token mean whatever this says; logged ``clipfrac``,
    ``ratio_mean``, ``kl`` and ``entropy`` stay token means (``actions/rl/masked.py``). Left out of
    a dump (requests, run identity) at its default, so runs from before it keep their ids and
    actions of the revision before it (which refuse unknown fields) still take the requests."""
    mask_truncated: bool = Field(False, exclude_if=lambda v: not v)
    """Leave completions cut at ``generation.max_new_tokens`` (no stop token; finish reason
    ``length``) out of the policy loss, their tokens masked (DAPO's overlong filtering; TRL's
    ``mask_truncated_completions``): an unfinished answer's reward says little about its tokens.
    They still count in their group's reward mean and std (the advantages of the others), and
    PPO's critic still learns from them. Left out of a dump at its default, as ``loss_agg`` is."""
    std_scope: Literal["group", "batch"] = Field("group", exclude_if=lambda v: v == "group")
    """GRPO with ``scale_by_std``: divide each group's centred rewards by the std of that group
    (``group``, the GRPO paper's) or of every scored reward of the step (``batch``: group mean,
    batch std, as in Lite PPO, arXiv 2508.08221; TRL's ``scale_rewards: batch``), which keeps a
    group's spread relative to the others' instead of stretching each to 1. Left out of a dump
    at its default, as ``loss_agg`` is."""
    micro_batch_size: int | None = Field(None, gt=0)
    """Samples per forward/backward pass; gradients are accumulated over a mini-batch
    (``batch_size / num_minibatches`` samples) before each optimizer step, with every micro
    batch weighted by its share of the mini-batch's tokens (of its responses, with a
    ``seq_mean`` ``loss_agg``), so the update equals the unsplit one to float round-off. None:
    the whole mini-batch at once."""

    @model_validator(mode="before")
    @classmethod
    def _default_kl_kind(cls, data: Any) -> Any:
        # Filled in, not left None, so requests and the run's identity carry the estimator used.
        if isinstance(data, dict) and data.get("kl_kind") is None:
            data = {**data, "kl_kind": "k1" if data.get("name") == "ppo" else "k3"}
        return data

    @model_validator(mode="after")
    def _check_name(self) -> AlgorithmConfig:
        check_algorithm_name(self)
        return self

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

    @property
    def optimizer_steps_per_step(self) -> int:
        """The policy's optimizer steps in one RL step: ``epochs x num_minibatches`` (TRL's
        ``global_step`` counts these; ``actions/tasks/rewards/trainer_state.py``)."""
        return self.epochs * self.num_minibatches


class WarmupConfig(_Section):
    steps: int | None = Field(None, ge=0)
    """Supervised steps before RL (0 skips warm-up). None: 300 on a synthetic task (its
    imperfect demonstrator), 0 on a user dataset, where warm-up trains on the reference answers
    verbatim and is an explicit choice (only for answers that are worked solutions)."""
    batch_size: int = Field(32, gt=0)
    """Warm-up: prompts (with their reference answers) per supervised step."""
    lr: float = Field(3e-3, gt=0)
    """Warm-up: learning rate (AdamW)."""
    error_rate: float | None = Field(None, ge=0, le=1)
    """How often the synthetic demonstrator errs: miscounts a long repeat answer (None: 0.9),
    stops an arith solution one operation early (None: 0.7). Not used with ``data.train_path``
    (warm-up trains on the file's answers), but part of the run's identity."""


class GenerationConfig(_Section):
    max_new_tokens: int = Field(24, gt=0)
    """The longest response, in tokens; a sample that reaches it is cut there (no stop token)."""
    temperature: float = Field(1.0, ge=0)
    """Softmax temperature of sampling; 0 is greedy decoding."""
    top_k: int | None = None
    """Top-k sampling: draw only among the k most likely tokens (and any tied with the k-th).
    None or 0: off (0 is read as None). Applied after the temperature, before ``top_p``
    (``actions/engines/sampling.py``); it changes the training data, so it is part of the run's
    identity."""
    top_p: float | None = None
    """Nucleus (top-p) sampling: draw only among the smallest set of most likely tokens whose
    probability, after the temperature and ``top_k``, reaches ``top_p``; in (0, 1]. None or
    1.0: off (1.0 is read as None)."""
    engine: Literal["torch", "vllm"] = "torch"
    """The generation engine of the generate, evaluate and profile actions: ``torch`` (this
    project's, CPU or CUDA) or ``vllm`` (installed separately, in its own environment: docs/vllm.md, "Using it")."""
    dedup_prefill: bool = True
    """Compute shared prompt prefill once: a group's prompt inside each generation action (the
    torch engine; vLLM's prefix cache always does), and prefixes shared across prompts in the
    separate prefill action where ``prefill_action`` runs it. Off: no prefill action runs, and
    the planner times none (no prefill phase, no prefix KV sent to the actions)."""
    assignment: Literal["ranked", "round_robin"] = "ranked"
    """How prompts are split over the generation actions: ``ranked`` (by predicted length,
    the longest first, paper §3.3) or ``round_robin`` in the step's order."""
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
    """B_prefill: most unique prefixes one prefill action computes (paper §3.1)."""
    prefill_action: Literal["auto", "always", "never"] = "auto"
    """With ``dedup_prefill``: whether the step runs the separate prefill action. ``auto``: only
    where the prefix its prompts share saves more prefill compute than the action's fixed cost
    (``flows/planning/prefix.py: prefill_action_pays``); otherwise each generation action
    prefills its own prompts, once per group. The samples are the same either way. The vLLM
    engine runs no prefill action (``always`` is refused with it): it cannot import the
    action's KV bundle, and its prefix cache computes a group's prompt once (docs/vllm.md)."""
    length_window: int = Field(1, ge=1)
    """EWMA window (epochs) of the response-length predictor."""
    first_epoch_predictor: Literal["reference", "learned"] = "learned"
    """Length prediction of a prompt without history: ``learned`` fits reference and prompt
    length against the group max of the prompts already seen (``flows/planning/first_epoch.py``),
    falling back to ``reference`` (the paper's rule: the reference answer's length, scaled) until
    enough prompts are seen."""
    speculation: Literal["auto", "off"] = "auto"
    """Speculative decoding in the torch engine (``actions/engines/speculative.py``): ``auto``
    drafts and verifies where the selector predicts it pays, per decode round, and decodes
    plainly elsewhere; ``off`` never drafts. Outputs are plain decoding's either way (a draft
    token is kept only where it equals the target's own draw; in bf16 up to kernel round-off).
    On a GPU with CUDA graphs ``auto`` measured 0.45-0.72x of plain decoding on an H200, where
    the selector misprices graphed rounds; the engine now also compares whole calls there and
    decodes plainly where speculative ones ran slower (docs/gpu.md; not yet measured on a GPU):
    ``off`` is the sure choice there.
    ``engine: vllm``: see docs/vllm.md."""
    draft_strategies: list[Literal["history", "prompt_lookup"]] = Field(
        default_factory=lambda: ["history", "prompt_lookup"], min_length=1)
    """Drafting strategies the selector may use: ``history`` (the prompt's responses from
    earlier epochs, kept in the store) and ``prompt_lookup`` (n-grams of prompt + response)."""
    max_draft_len: int = Field(8, ge=1, le=64)
    """Longest draft (k) one verification forward checks."""
    kv_cache: Literal["static", "dynamic"] = "static"
    """Torch engine, plain decoding: ``static`` decodes on a KV cache the engine preallocates
    and writes in place (``actions/engines/static_decode.py``; Llama, Qwen2, Qwen3 and Mistral
    layers, other models fall back to ``dynamic``); ``dynamic`` on Hugging Face's growing
    ``DynamicCache``. The same tokens either way (float round-off aside)."""
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    """Torch engine on a GPU: replay the static cache's decode step as CUDA graphs. ``auto``:
    where the model is on CUDA; ``on``: required (an action without CUDA fails); ``off``: eager.
    A capture that fails falls back to eager with one warning line."""
    compile_decode: bool = False
    """Torch engine, static cache: run the decode step through ``torch.compile`` (fused norms,
    rotary, residuals and sampling hash; the CUDA graphs then replay the compiled kernels).
    Measured on an H200 (docs/gpu.md): 1.2-1.3x faster steps than graphs alone on a 0.5B shape,
    slower on a 7B shape, where a whole-cache copy (since removed) cost 2.7 ms a step (static
    shapes: 2.04 ms against 4.20 on the 0.5B shape, 6.60 against 9.45 on the 7B). A warm
    container compiles the step about three times (the batch and the window are symbolic;
    30-100 s each), and fused kernels round differently from eager ones, so tokens can differ
    from ``compile_decode: false`` where two draws nearly tie. For long-lived warm containers;
    off by default."""
    fused_sampling: Literal["auto", "on", "off"] = "auto"
    """Both engines: draw each token (hash, Gumbel noise, argmax) in one compiled kernel instead
    of about twenty passes over ``[rows, vocabulary]`` temporaries (``actions/engines/sampling.py``).
    The same tokens (on the CPU bit for bit). ``auto``: for vocabularies of 8,192 entries or more,
    where it pays back its compilation (seconds, once per container) within a call; ``on``: every
    vocabulary; ``off``: never. Without a usable compiler the draws run unfused after one warning."""
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    """``engine: vllm``: the engine's context and memory (``actions/config/vllm.py``)."""

    @field_validator("top_k")
    @classmethod
    def _check_top_k(cls, v: int | None) -> int | None:
        if v is not None and v < 0:
            raise ValueError(f"generation.top_k={v} is negative; set the number of tokens to keep "
                             "(an integer >= 1, e.g. 50), or 0 / null to turn top-k sampling off")
        return v or None

    @field_validator("top_p")
    @classmethod
    def _check_top_p(cls, v: float | None) -> float | None:
        if v is not None and not 0.0 < v <= 1.0:  # also rejects NaN
            raise ValueError(f"generation.top_p={v} is outside (0, 1]; set the probability mass to keep "
                             "(e.g. 0.9), or 1.0 / null to turn top-p sampling off")
        return None if v == 1.0 else v

    @field_validator("speculation", "cuda_graphs", "fused_sampling", mode="before")
    @classmethod
    def _yaml_off(cls, v: object) -> object:
        # YAML 1.1 reads a bare ``off`` as false (and ``on`` as true): accept what the user wrote.
        return "off" if v is False else "on" if v is True else v

    @model_validator(mode="after")
    def _decode_settings_agree(self) -> "GenerationConfig":
        # Torch-engine settings that demand something (graphs required, a compiled step) are
        # refused where they would be ignored; "auto" and the defaults mean "where it applies".
        if self.engine == "vllm" and (self.cuda_graphs == "on" or self.compile_decode):
            what = "cuda_graphs 'on'" if self.cuda_graphs == "on" else "compile_decode true"
            raise ValueError(f"generation.{what} is a torch engine setting and generation.engine is 'vllm' (vLLM "
                             "captures and compiles its own decode step); remove it, or use engine: torch")
        if self.engine == "vllm" and self.prefill_action == "always":
            raise ValueError("generation.prefill_action 'always' and generation.engine is 'vllm', which runs no "
                             "prefill action (its prefix cache computes a group's prompt once); remove it, or use "
                             "engine: torch")
        if self.engine == "torch" and (vllm := self.vllm.llm_kwargs()):
            raise ValueError(f"generation.vllm.{next(iter(vllm))} is a vLLM engine setting and generation.engine is "
                             "'torch'; remove it, or use engine: vllm")
        if self.cuda_graphs == "on" and self.kv_cache != "static":
            raise ValueError("generation.cuda_graphs 'on' needs generation.kv_cache 'static'; "
                             "set kv_cache: static, or cuda_graphs: auto or off")
        if self.compile_decode and self.kv_cache != "static":
            raise ValueError("generation.compile_decode true compiles the static KV cache's decode step and "
                             "generation.kv_cache is 'dynamic'; set kv_cache: static, or compile_decode: false")
        return self


class TrainConfig(_Section):
    """How the train action runs its update (never what it computes)."""

    world_size: int | None = Field(None, ge=1)
    """Ranks of the learner inside one train activation: above 1, the update runs under FSDP2
    (``torch.distributed.fsdp.fully_shard``) over that many processes spawned by the action (NCCL,
    one GPU each, on CUDA; gloo on the CPU), and the result is the one-rank update up to float
    round-off (``actions/rl/sharded_train.py``, docs/scale.md). None: ``scaling.gpus_per_actor`` on
    CUDA, 1 on the CPU."""


class WorkloadConfig(_Section):
    """What the actions compute: the sections they read (model, data, reward, algorithm,
    warm-up, generation) and the seed. ``CampaignConfig`` adds how and where the work runs
    (scaling, store, invoker, budget, faults, observability, steps) for the control plane;
    an action's request carries a ``WorkloadConfig`` or one of its sections, never those."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    reward: RewardConfig = RewardConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    warmup: WarmupConfig = WarmupConfig()
    generation: GenerationConfig = GenerationConfig()
    train: TrainConfig = TrainConfig()
    seed: int = 0
    """Seeds the tiny model, the synthetic data, the prompt order and every sample's noise: on
    one CPU machine the same configuration and seed train the same weights (on CUDA, the same
    samples up to kernel round-off: docs/gpu.md), given reward functions that answer the same
    inputs the same way (a plug-in's own randomness is not seeded: derive it from its inputs)."""

    @model_validator(mode="after")
    def _resolve_defaults(self) -> WorkloadConfig:
        if self.data.max_count is None:
            self.data.max_count = {"repeat": 14, "arith": 3}[self.data.task]
        if self.warmup.error_rate is None:
            self.warmup.error_rate = {"repeat": 0.9, "arith": 0.7}[self.data.task]
        if self.warmup.steps is None:
            self.warmup.steps = 0 if self.data.train_path else 300
        self._check_lora()
        self._check_answer_key()
        return self

    def answer_need(self, split: Literal["train", "eval"] = "train") -> tuple[str, str] | None:
        """What reads the reference answer of a dataset file's ``split`` rows, as ``(what reads
        it, the other way out)`` for an error line, or None when nothing does (a row may then
        have none): a built-in reward that compares with it, or warm-up on the training rows."""
        for f in self.reward_functions():
            if f.name in REFERENCE_REWARDS:
                which = f"reward.functions {f.name}" if self.reward.functions else \
                    f"the default reward {f.name} (reward.functions unset)"
                return (f"{which} compares with a reference answer",
                        "or use rewards that need none (format, package.module:function, reward.models)")
        if split == "train" and self.data.train_path and self.warmup.steps:
            return f"warmup.steps={self.warmup.steps} trains on the reference answers", "or set warmup.steps: 0"
        return None

    def _check_answer_key(self) -> None:
        # Only a dataset file reads data.answer_key: a generated task names its own columns.
        need = self.answer_need()
        if self.data.answer_key is None and (self.data.train_path or self.data.eval_path) and need:
            raise ValueError(f"{need[0]} and data.answer_key is null; set data.answer_key to the column holding "
                             f"the reference answer, {need[1]}")

    def _check_lora(self) -> None:
        """Options LoRA cannot serve: one line naming both settings and the fix."""
        lora = self.model.lora
        if lora is None:
            return
        if self.generation.engine == "vllm":
            raise ValueError("model.lora is set with generation.engine='vllm', which loads full weights per version; "
                             "use generation.engine: torch with LoRA, or remove model.lora")
        if lora.bias != "none" and self.algorithm.kl_coef > 0:
            raise ValueError(f"model.lora.bias={lora.bias!r} trains backbone biases, but the KL reference "
                             f"(algorithm.kl_coef={self.algorithm.kl_coef}) is the backbone with the adapter off; "
                             "set model.lora.bias: none, or algorithm.kl_coef: 0")

    def reward_functions(self) -> list[RewardFunctionConfig]:
        """``reward.functions``, or the task's reward when unset (none with ``reward.models``)."""
        if self.reward.functions is None and self.reward.models:
            return []
        return self.reward.functions or [RewardFunctionConfig(name=TASK_REWARDS[self.data.task])]

    def workload(self) -> WorkloadConfig:
        """Just these sections (a ``CampaignConfig`` drops its control-plane ones)."""
        return WorkloadConfig.model_validate(self.model_dump(include=set(WorkloadConfig.model_fields)))
