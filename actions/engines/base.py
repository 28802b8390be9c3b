r"""The generation-engine contract shared by the torch and the vLLM engine.

Actions talk to an engine only through ``GenerationEngine.generate``; ``factory.make_engine``
picks the implementation from ``generation.engine``. The contract, and which engine gives what:

======================================================  =========  ==========================
guarantee                                               torch      vllm
======================================================  =========  ==========================
every sample returned exactly once, in input order      yes        yes
``tokens`` exclude EOS; ``len(tokens) <= max_new``      yes        yes
``finish_reason`` in {"stop", "length", "cut"}          yes        yes
same (seed, step, prompt_id, sample_index) -> same      yes        yes (same engine, same
output, on the same weights                                        weights, same build)
fan-out invariance: output does not depend on which     yes*       yes*
other samples share the call
dedup / prefix reuse changes cost, never outputs        yes*       yes* (APC)
cut then continue == uncut run, token for token         yes*       yes* (same noise stream)
KV bundle (``prefixes``) from the prefill action        used       ignored: vLLM cannot
                                                                   import KV; APC dedups
speculative decoding (``speculation``), same outputs    yes*       not used (docs/vllm.md)
======================================================  =========  ==========================

Both engines sample with the same counter-based Gumbel-max noise (``sampling.py``) keyed by
``stream_key(seed, step, prompt_id, sample_index)`` and the response position, so given equal
logits they draw equal tokens, with the same top-k / top-p filtering applied to the logits
before the noise; temperature 0 is greedy argmax.

\* Up to float round-off: the draw from given logits is exact, but the logits a row gets depend
on the forward that computed them by round-off (its batch's padded width, a prefill of tokens
another call decoded, a verification's width; torch's static and dynamic KV cache give the same
bits). A token flips where its two best noisy scores lie within that round-off: rare in fp32
(about 1e-7; the tests compare token for token), common in bf16 (docs/gpu.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

FINISH_REASONS = ("stop", "length", "cut")


@dataclass
class SampleSpec:
    """A sample to generate: its identity, prompt and (for a continuation) tokens so far."""

    prompt_id: int
    sample_index: int
    prompt_tokens: tuple[int, ...]
    generated: tuple[int, ...] = ()


@dataclass
class SampleOut:
    prompt_id: int
    sample_index: int
    tokens: list[int]  # response tokens, EOS excluded; a continuation includes ``generated``
    finish_reason: str  # "stop" | "length" | "cut"
    stop_token: int | None = None  # the EOS id that ended a "stop" sample (models may have several)


@dataclass
class EngineStats:
    prefill_tokens: int = 0  # prompt tokens whose KV this call computed (cache hits excluded)
    decode_steps: int = 0  # engine steps after the first token
    decode_token_slots: int = 0  # sum of active rows over decode steps
    spec: dict | None = None  # speculative decoding counters (``speculative.SpecStats``); None: off
    kv_cache: str = "dynamic"  # the plain decode path: "dynamic", "static" or "static+graphs"
    graph_captures: int = 0  # CUDA graphs captured by this call (0 where warm graphs were replayed)
    graph_capture_s: float = 0.0  # seconds those captures took (warm-up forward included)


@dataclass(frozen=True)
class GenerationParams:
    """How one ``generate`` call samples: everything but the samples themselves and the state
    an engine may reuse (KV prefixes, speculation). Both engines take it whole; the decode loops
    read what they need from it.

    Attributes:
        seed, step: with each sample's (prompt_id, sample_index), the sample's stream key.
        max_new_tokens: bound on a sample's total response length (``generated`` counts).
        temperature: softmax temperature; 0 is greedy.
        dedup: share the prefill of identical contexts (torch: explicit; vllm: APC always).
        cut_after: stop once this many samples finished; the others come back with
            finish_reason "cut" and their tokens so far. None: no cut.
        top_k, top_p: top-k and nucleus filtering before the noise
            (``sampling.filter_logits``); None: off. Both engines apply the same filter.
    """

    seed: int
    step: int
    max_new_tokens: int
    temperature: float
    dedup: bool = True
    cut_after: int | None = None
    top_k: int | None = None
    top_p: float | None = None


@runtime_checkable
class GenerationEngine(Protocol):
    """What the generate and evaluate actions need from an engine."""

    eos_id: int  # the primary EOS id
    eos_ids: tuple[int, ...]  # every id that ends a sample

    def generate(
        self,
        samples: list[SampleSpec],
        params: GenerationParams,
        *,
        prefixes: Mapping[tuple[int, ...], Any] | None = None,
        speculation: Any = None,
    ) -> tuple[list[SampleOut], EngineStats]:
        """Generate every sample to EOS, ``params.max_new_tokens`` or the cut.

        Args:
            samples: what to generate; a spec with ``generated`` continues a cut sample from
                prompt + generated, at random-stream position ``len(generated)``.
            params: how to sample (:class:`GenerationParams`).
            prefixes: precomputed KV states of shared token prefixes (torch only).
            speculation: a ``speculative.Speculation`` (torch: draft and verify, same outputs
                as plain decoding); None: plain decoding. vLLM ignores it: its own
                speculative decoding is configured when the engine is built (docs/vllm.md).
        Returns:
            (one SampleOut per input sample, in input order; call statistics).
        """
        ...


class RowEnds:
    """How the rows of one decode call end, token by token (both torch decoders share it).

    A drawn EOS id ends its row as ``"stop"`` (the id is kept in ``stops``, not appended); any
    other token is appended, and the row ends as ``"length"`` at ``max_new_tokens`` generated
    tokens. A row still open when the call returns was cut (``reason`` None). Every row starts
    below ``max_new_tokens`` (``TorchEngine.generate`` returns the others as they are).
    """

    def __init__(self, num_rows: int, eos_ids: Sequence[int], max_new_tokens: int) -> None:
        self.reasons: list[str | None] = [None] * num_rows
        self.stops: list[int | None] = [None] * num_rows
        self.eos = frozenset(eos_ids)
        self.max_new_tokens = max_new_tokens
        self.num_done = 0

    def take(self, row: int, token: int, generated: list[int]) -> bool:
        """Apply ``token``, drawn for ``row``, to its ``generated`` list; True when the row ended."""
        if token in self.eos:
            self.reasons[row], self.stops[row] = "stop", token
        else:
            generated.append(token)
            if len(generated) >= self.max_new_tokens:
                self.reasons[row] = "length"
        if self.reasons[row] is None:
            return False
        self.num_done += 1
        return True

    def take_all(self, row: int, tokens: Sequence[int], generated: list[int]) -> bool:
        """``take`` of each of ``tokens`` in order until the row ends (the rest are dropped);
        True when it ended. A verification round's tokens mostly end nothing: one set check
        and one extend then, not a call per token."""
        if self.eos.isdisjoint(tokens) and len(generated) + len(tokens) < self.max_new_tokens:
            generated.extend(tokens)
            return False
        return any(self.take(row, t, generated) for t in tokens)

    def cut(self, cut_after: int | None) -> bool:
        """Whether ``cut_after`` rows have ended (the call stops and returns the rest as partial)."""
        return cut_after is not None and self.num_done >= cut_after
