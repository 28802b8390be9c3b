"""The live planner's inputs at campaign start: a measured profile and the transfer model.

``start_profiling`` submits the ``profile`` action (``actions/profile.py``) to the pool that
generates, so on OpenWhisk it runs beside the rest of start-up (warm-up, the first evaluation;
on this machine's shared cores the set-up runs it alone, ``flows/campaign/setup.py``);
``finish_profiling`` collects it into a ``LiveInputs``:

- the TPOT profile: measured by the pool on this campaign's model, dtype, device, engine (and
  the torch engine's decode path, ``generation.kv_cache``) and torch threads, or reused from
  the store's cache for exactly those (``source`` says which); an explicit ``scaling.profile``
  file wins over both (``file``), with a warning where the file says it was measured for
  another model, dtype, device or engine (``other_model_warning``); the progress line then names
  the file, and ``LiveInputs.profile_key`` (the summary's ``profile.key``, the cache entry to
  delete to measure again) is empty: the store's entry was not used;
- the locality model: the weight bytes a warm actor reads per new policy version (the whole
  model's as published; a LoRA run's adapter, the same at version 0 and after a resume), KV
  bytes per token from the model config and the store's read throughput as the pool measured
  it (a LoRA run's on the backbone's blobs), so the planner's transfer times are the ones this
  campaign pays.

A cached profile the flow cannot use (``TpotProfile.from_dict`` rejects it) is reported and
measured again (``refresh``); the action itself rejects one that is not what it wrote.
"""

from __future__ import annotations

import contextvars
import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from actions.contracts import DecodeSettings, ModelRef
from actions.store.profile_cache import ProfileFacts, ProfileRequest, ProfileResult
from flows.planning.tpot import CPU_TINY_PROFILE, ProfileIdentity, TpotProfile
from flows.step.context import RunContext
from flows.step.live_inputs import LiveInputs  # noqa: F401 (re-exported: set-up builds it here)
from flows.step.token_table import TokenTable

if TYPE_CHECKING:
    from flows.step.invoke import Returned

Progress = Callable[[str], None]


def profile_grid(group_size: int, batch_size: int, prompt_lengths: list[int],
                 max_new_tokens: int) -> tuple[list[int], list[int]]:
    """A small grid covering the batches and contexts one step's actions can meet.

    Batches: one group, the whole step's samples and their geometric middle (decode time is
    close to linear in the batch, so three points suffice; the profile extrapolates linearly).
    Contexts: the median prompt and the longest prompt plus a full response.

    >>> profile_grid(8, 128, [20, 30, 40], 24)
    ([8, 32, 128], [30, 64])
    """
    lo, hi = group_size, max(batch_size, group_size + 1)
    mid = round((lo * hi) ** 0.5)
    batches = sorted({lo, mid, hi}) if lo < mid < hi else [lo, hi]
    short = max(1, int(statistics.median(prompt_lengths)))
    long = max(short + 1, max(prompt_lengths) + max_new_tokens)
    return batches, [short, long]


def profile_request(ctx: RunContext, model: ModelRef, prompt_lengths: list[int]) -> ProfileRequest:
    """The grid for this campaign; only the transfer facts when ``scaling.profile`` is set."""
    cfg, gen = ctx.config, ctx.config.generation
    batches, contexts = profile_grid(cfg.algorithm.group_size, cfg.algorithm.batch_size, prompt_lengths,
                                     gen.max_new_tokens)
    return ProfileRequest(model=model, **DecodeSettings.of(gen).model_dump(), batch_sizes=batches, contexts=contexts, measure_grid=not cfg.scaling.profile,
                          threads=generation_threads(cfg))


def start_profiling(ctx: RunContext, model: ModelRef,
                    tokens: TokenTable) -> tuple[Any, ProfileRequest] | None:
    """Submit the profile action (None when the engine has no profiler). ``tokens``: the
    prepared token table (its prompt lengths, read without building its rows)."""
    from prefect.context import FlowRunContext

    from flows.step.invoke import invoke_action  # Prefect task; keeps this module importable alone

    req = profile_request(ctx, model, tokens.prompt_lengths())
    kwargs = dict(action="profile", payload=req.model_dump(mode="json"), shard="profile")
    if FlowRunContext.get() is not None:
        return invoke_action.submit(**kwargs), req
    # outside a flow (a campaign run directly) Prefect has no task runner to submit to
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="profile")
    # in a copy of this context, as Prefect's submit runs it: the set-up's ledger counts it
    future = pool.submit(contextvars.copy_context().run, invoke_action, **kwargs)
    pool.shutdown(wait=False)
    return future, req


def finish_profiling(ctx: RunContext, started: tuple[Any, ProfileRequest] | None,
                     progress: Progress = print) -> LiveInputs:
    """The planner's inputs from the submitted profile action (see the module docstring)."""
    from flows.step.invoke import invoke_action

    path = ctx.config.scaling.profile
    if started is None:
        if path:
            profile = TpotProfile.load(path, "scaling.profile")
            _warn_other_model(ctx, path, profile, None, progress)
            return LiveInputs(profile, "file")
        progress(f"profile: engine {ctx.config.generation.engine} has no profiler; planning with "
                 f"{CPU_TINY_PROFILE.name} (set scaling.profile to a measured file)")
        return LiveInputs(CPU_TINY_PROFILE, "built-in")
    future, req = started
    result = _result(future.result())
    if result.rejected:
        progress(f"profile: {result.rejected}")
    if path:  # an explicit file wins; the measured transfer facts still apply
        profile, source = TpotProfile.load(path, "scaling.profile"), "file"
        _warn_other_model(ctx, path, profile, result.facts, progress)
    else:
        try:
            profile = TpotProfile.from_dict(result.profile)
        except (ValueError, KeyError, TypeError) as exc:
            # source: a grid the cache held, or one measured just now (which the action does not cache)
            progress(f"profile: {result.source} profile {result.profile_key!r} is unusable ({exc}); measuring again")
            again = req.model_copy(update={"refresh": True})
            out = invoke_action(action="profile", payload=again.model_dump(mode="json"), shard="profile-refresh")
            result = _result(out)
            profile = TpotProfile.from_dict(result.profile)
        source = result.source
    activation_s = measure_activation_s()
    push_s = float(result.profile.get("weight_push_s", 0.0)) if source != "file" else 0.0
    unpriced = source == "file" and ctx.config.generation.engine == "vllm"  # a profile file holds no push time
    # a file was never the store's cache entry: name the file, and no key (the summary's
    # profile.key is the entry to delete to measure again; the action's key is another config's)
    key = "" if source == "file" else result.profile_key
    progress(f"profile: {source} {profile.name} ({path if source == 'file' else key}); store reads "
             f"{result.store_read_bytes_per_s / 1e6:.0f} MB/s, {weights_text(result.weight_bytes, req.model)}, "
             f"activation round trip {activation_s * 1e3:.0f} ms"
             + (f", weight push {push_s * 1e3:.0f} ms" if push_s else "")
             + ("; the weight push into the vLLM engines is not timed from a profile file: plans leave it out"
                if unpriced else ""))
    # A generation action on a warm vLLM engine pays the push of the step's version into it
    # (when no pre-warm did it first): a fixed cost per action, as the round trip is.
    return LiveInputs(profile, source, weight_bytes=float(result.weight_bytes),
                      kv_bytes_per_token=float(result.kv_bytes_per_token),
                      transfer_bandwidth_bytes_per_s=result.store_read_bytes_per_s,
                      threads=result.facts.threads, activation_s=activation_s + push_s, profile_key=key,
                      weight_push_s=push_s, measure_s=result.measure_s)


def weights_text(weight_bytes: float, model: ModelRef) -> str:
    """The progress line's words for the bytes a warm actor reads per new policy version: the
    whole model's weights, or a LoRA run's adapter (``actions/profile.py: transfer_facts``), in
    kB below a megabyte so that a small adapter does not read as 0.0 MB.

    >>> weights_text(644072, ModelRef(store_uri="s", base_key="b", policy_key="p", policy_version=0))
    'weights 0.6 MB'
    """
    if model.lora is None:
        return f"weights {weight_bytes / 1e6:.1f} MB"
    size = f"{weight_bytes / 1e6:.1f} MB" if weight_bytes >= 1e6 else f"{weight_bytes / 1e3:.1f} kB"
    return f"adapter {size} per version (LoRA: a warm actor holds the backbone)"


def other_model_warning(path: str, profile: TpotProfile, facts: ProfileFacts | None, engine: str,
                        model: str) -> str | None:
    """The warning line when the ``scaling.profile`` file at ``path`` says it was measured on
    another model, dtype, device or engine than this campaign's (``facts``: what its pool's
    ``profile`` action found; None: only ``engine`` is known). Not a refusal: a roofline or a
    profile of other hardware is a legitimate what-if. None when the file states no identity
    (older files) or nothing it states differs."""
    if profile.identity is None:
        return None
    here = (ProfileIdentity(model, engine=engine) if facts is None else
            ProfileIdentity(model, facts.model_config_sha256, facts.dtype, facts.device, facts.engine))
    differences = profile.identity.differences(here)
    if not differences:
        return None
    mine, digests = profile.identity, (profile.identity.model_config_sha256, here.model_config_sha256)
    # another model when the digests differ, or, where one is not stated, the names do
    other_model = digests[0] != digests[1] if None not in digests else mine.model != here.model
    measured = (f"for {mine.model}, not this campaign's {model}" if other_model
                else "on another setup than this campaign's")
    return (f"profile: warning: scaling.profile {path!r} was measured {measured}: {'; '.join(differences)}; "
            "planning with it as given (a what-if); to plan with this campaign's speed, measure it with "
            "`rlhfless profile` or unset scaling.profile")


def _warn_other_model(ctx: RunContext, path: str, profile: TpotProfile, facts: ProfileFacts | None,
                      progress: Progress) -> None:
    model = ctx.config.model.path or "tiny model"
    line = other_model_warning(path, profile, facts, ctx.config.generation.engine, model)
    if line:
        progress(line)


def measure_activation_s(repeats: int = 5) -> float:
    """Median wall time of an empty activation (``noop``) through the flow's task path: the
    task submission, the invoker's round trip and the runtime's dispatch, which every
    generation action pays on top of its work."""
    import time

    from flows.step.invoke import invoke_action

    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        invoke_action(action="noop", payload={"probe": i}, shard=f"probe-{i}")  # noop ignores it; tells probes apart
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _result(out: Returned) -> ProfileResult:
    """The profile action's result, validated on arrival (``invoke_action``)."""
    assert isinstance(out.result, ProfileResult), type(out.result)
    return out.result


def generation_threads(cfg: Any) -> int | None:
    """Torch threads of one generation action at the widest fan-out on the local pool (its
    invoker divides ``invoker.num_cores`` among running activations, leaving generation's the
    control plane's core, ``flows.invokers.cores``) or in process (all of them, one activation
    at a time); None on OpenWhisk, whose containers set their own."""
    if cfg.invoker.kind == "openwhisk":
        return None
    from flows.invokers.cores import activation_threads

    cores = pool_cores(cfg)
    if cfg.invoker.kind != "local":
        return cores
    return activation_threads(cores, min(cfg.scaling.n_max, cores), "generate")


def pool_cores(cfg: Any) -> int:
    """Cores the local pool's activations share (``flows/invokers/cores.py``)."""
    from flows.invokers import cores

    return cores.pool_cores(cfg)
