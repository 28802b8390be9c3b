"""The ``__*`` control keys that travel beside an action's request or result, outside its
contract (``actions/contracts.py``): how the runtime is asked to run, fail or pre-warm, and
what it reports about the activation. Invokers write them, the runtime reads them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from actions.contracts import DecodeSettings, without_control

PREWARM_ENGINE = "__prewarm_engine"
"""The pre-warm's engine as earlier revisions sent it (now within ``__prewarm_decode``)."""


class WarmCounts(BaseModel):
    """Warm-cache hits and misses during one activation (``actions/models/warm.py``)."""

    model_config = ConfigDict(extra="forbid")

    hits: int
    misses: int


class Control(BaseModel):
    """The ``__*`` keys that travel beside a request or a result, outside its contract.

    Requests: the action to run when the URL does not say (``__action``), fault injection
    (``faults.*``) and pre-warm calls. Results: the runtime's activation block and the warm
    cache's counts. :func:`split_control` takes them out of a message before it is validated.
    """

    # extra="ignore": a platform may add keys of its own (OpenWhisk's ``__ow_*``)
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    action: str | None = Field(None, alias="__action")
    inject_failure: bool = Field(False, alias="__inject_failure")
    """Fail this activation like a crashed container (transient: the flow retries)."""
    inject_kill_after_s: float | None = Field(None, alias="__inject_kill_after_s")
    """Kill the worker process this many seconds into the activation."""
    inject_latency_s: float = Field(0.0, ge=0, alias="__inject_latency_s")
    """Sleep this long before the action runs."""
    threads: int | None = Field(None, ge=1, strict=True, alias="__threads")
    """Torch threads for this activation (the invoker's share of its cores); None: the default."""
    prewarm: bool = Field(False, alias="__prewarm")
    """Only start the container (and load ``prewarm_model``); run no action."""
    prewarm_hold_s: float = Field(0.0, alias="__prewarm_hold_s")
    prewarm_model: dict[str, Any] | None = Field(None, alias="__prewarm_model")
    """A ``ModelRef`` as JSON: the policy version a pre-warmed container loads."""
    prewarm_decode: DecodeSettings = Field(DecodeSettings(), alias="__prewarm_decode")
    """The engine the pre-warm loads ``prewarm_model`` into, built with the run's decode
    settings: ``torch`` (the generation slot) or ``vllm`` (build the process's vLLM engine, or
    push the version into the running one); a fused draw is compiled as the run draws."""
    activation: dict[str, Any] | None = Field(None, alias="__activation")
    """Result side: the runtime's record of the activation (busy time, pid, image, cold)."""
    warm: WarmCounts | None = Field(None, alias="__warm")
    """Result side: warm-cache hits and misses."""

    @model_validator(mode="before")
    @classmethod
    def _engine_alone(cls, data: Any) -> Any:
        # A flow of an earlier revision names the pre-warm's engine alone (``__prewarm_engine``):
        # a vLLM container must not build a torch model beside its engine for it.
        if isinstance(data, dict) and PREWARM_ENGINE in data and "__prewarm_decode" not in data \
                and "prewarm_decode" not in data:
            data = {**data, "__prewarm_decode": {"engine": data[PREWARM_ENGINE]}}
        return data

    def to_payload(self) -> dict[str, Any]:
        """The keys that differ from their defaults, under their ``__`` names; a pre-warm's
        engine also under ``__prewarm_engine``, which runtimes of an earlier revision read."""
        out = self.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        if "__prewarm_decode" in out:
            out[PREWARM_ENGINE] = self.prewarm_decode.engine
        return out


def split_control(message: dict[str, Any]) -> tuple[dict[str, Any], Control]:
    """``message`` without its ``__*`` keys, and those keys as a :class:`Control`."""
    return without_control(message), Control.model_validate({k: v for k, v in message.items() if k.startswith("__")})


def take_activation(result: dict[str, Any]) -> dict[str, Any]:
    """Remove the runtime's ``__activation`` block from ``result`` and return it ({}: none)."""
    return Control.model_validate({"__activation": result.pop("__activation", None)}).activation or {}
