"""The torch generation engine: KV-cached batched sampling on any HF causal LM.

What it does, and why:

* **Prefill once per unique prefix.** ``prefill`` runs padded batches of token sequences (one
  call per run of similar lengths where the padding saved pays for a call: ``prefill_plan``)
  and returns each one's KV cache and last-position logits. With ``dedup`` a GRPO group's n samples
  share one prefill of their prompt; a KV bundle from the ``prefill`` action can supply the
  first ``L`` tokens (a template shared across prompts), and only the suffix is computed here.
* **Fork, then decode.** Each sample's row starts from its prompt's KV (left-padded to the
  batch's longest), decodes one token per step, and leaves the batch the moment it emits any
  of the EOS ids (recorded as ``stop_token``) or reaches ``max_new_tokens`` -- finished rows
  cost nothing (Hugging Face ``generate`` keeps them until the longest row ends).
* **Cut.** With ``cut_after = m`` the call stops as soon as m samples have finished and returns
  the others as partial samples (tokens so far); continuing one later re-prefills
  prompt + tokens so far, and its random stream resumes at the same position (sampling.py).

* **Static cache and CUDA graphs.** Decoding runs on a KV cache the engine owns
  (``static_kv``, ``static_decode``): preallocated buffers written in place, with the decode
  step (forward, draw, advance) replayed as a CUDA graph on a GPU; speculative rounds run on
  the same cache, their verification graphed too (``static_speculative``). ``kv_cache="dynamic"``
  (or a model ``static_forward`` does not support) keeps the Hugging Face ``DynamicCache``
  loops (below, and ``speculative``); all give the same tokens.
* **Sliding windows.** Models with sliding-window layers (``kv_state.sliding_window``) decode on
  the dynamic path, with every column cached: the attention mask applies the window, which
  Hugging Face counts in cache columns, so each row's tokens stay in consecutive columns.
* **Any device.** Work happens on the model's device (``next(model.parameters()).device``):
  token ids and masks are built on the host and moved once per forward, and each decode step
  reads its sampled tokens back in one transfer. The generate action loads KV bundles onto
  the device once per container (``kv_bundle.load_bundle``); a host state a caller passes in
  is moved when used.

Shapes: KV per layer ``[rows, kv_heads, positions, head_dim]``; masks ``[rows, positions]``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch
from transformers import DynamicCache

from actions.engines.base import EngineStats, GenerationParams, RowEnds, SampleOut, SampleSpec
from actions.engines.kv_state import PrefixState, sliding_window, stack_logits, stack_states
from actions.engines.prefill_plan import CALL_TOKENS, plan_prefill_calls
from actions.engines.sampling import Sampler, fused_draw, fused_for, stream_key
from actions.engines.spec_guard import CallRates
from actions.engines.spec_select import AcceptanceTracker, ForwardCost, can_pay
from actions.engines.speculative import SpecStats, Speculation, decode_speculative
from actions.engines.static_decode import bucket_for, decode_static, static_supported
from actions.engines.static_forward import ATTENTIONS
from actions.engines.static_speculative import decode_static_speculative
from actions.models.cache_name import cache_of, with_cache
from actions.models.special_tokens import special_tokens

KV_CACHES = ("static", "dynamic")
CUDA_GRAPHS = ("auto", "on", "off")

RECHECK_CALLS = 4
"""Of the calls the estimates would decode plainly, the this-many-th speculates anyway (to
re-measure); while they keep saying no, each wait doubles, up to ``RECHECK_MAX`` calls."""

RECHECK_MAX = 16

__all__ = ["EngineStats", "PrefixState", "SampleOut", "SampleSpec", "TorchEngine"]


class TorchEngine:
    """Batched sampling over a loaded model, on the model's device (fp32 on CPU by default)."""

    def __init__(self, model: torch.nn.Module, *, eos_id: int | Sequence[int], pad_id: int,
                 kv_cache: str = "static", cuda_graphs: str = "auto", compile_decode: bool = False,
                 fused_sampling: str = "auto", decode_attention: str = "sdpa") -> None:
        """``eos_id``: the id, or every id, that ends a sample (``special_tokens.eos_ids``);
        ``pad_id``: any valid id (padding is masked out). ``kv_cache``: ``static`` (the
        engine's own preallocated cache, where the model is supported) or ``dynamic``;
        ``cuda_graphs``: ``auto`` (on where the model is on CUDA and the cache is static),
        ``on`` (required: a CPU model or a dynamic cache is an error) or ``off``;
        ``compile_decode``: the static step through ``torch.compile`` (``static_decode``);
        ``fused_sampling``: ``auto``, ``on`` or ``off`` (``sampling.fused_for``), the draws
        through one compiled kernel (compiled by the first draw; under ``auto`` a model whose
        output size is unknown draws unfused); ``decode_attention``: the static step's attention
        kernel, ``sdpa`` or ``flex`` (``static_forward.ATTENTIONS``; ``flex`` is meant for a
        compiled step on a GPU, needs the static cache, and on CUDA ``compile_decode``).

        Raises:
            ValueError: an unknown ``kv_cache``, ``cuda_graphs``, ``fused_sampling`` or
                ``decode_attention``, ``cuda_graphs="on"`` where graphs cannot run, or
                ``decode_attention="flex"`` without the static cache or, on CUDA, uncompiled.
        """
        if kv_cache not in KV_CACHES:
            raise ValueError(f"generation.kv_cache {kv_cache!r} is not one of {KV_CACHES}")
        if cuda_graphs not in CUDA_GRAPHS:
            raise ValueError(f"generation.cuda_graphs {cuda_graphs!r} is not one of {CUDA_GRAPHS}")
        self.model = model
        self.eos_ids = (eos_id,) if isinstance(eos_id, int) else tuple(eos_id)
        self.eos_id = self.eos_ids[0] if self.eos_ids else -1
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.kv_cache = kv_cache
        self.graphs, self.compiled = decode_path(self.static, self.device, cuda_graphs, compile_decode)
        # batch buckets with idle rows: graphs need them, and each batch size is a shape to compile
        self.pad_batches = self.graphs or self.compiled
        if cuda_graphs == "on" and not self.graphs:
            where = "a CUDA device" if self.device.type != "cuda" else "kv_cache 'static' and a supported model"
            raise ValueError(f"generation.cuda_graphs 'on' needs {where} (model on {self.device}, kv_cache "
                             f"{kv_cache!r}); use 'auto' or 'off'")
        if decode_attention not in ATTENTIONS:
            raise ValueError(f"decode attention {decode_attention!r} is not one of {ATTENTIONS}")
        if decode_attention != "sdpa" and not self.static:
            raise ValueError(f"decode attention {decode_attention!r} runs on the static KV cache (kv_cache "
                             f"{kv_cache!r}, model supported: {static_supported(model)}); use 'sdpa'")
        if decode_attention == "flex" and self.device.type == "cuda" and not compile_decode:
            # uncompiled, flex attention is an unfused reference that materialises the scores
            raise ValueError("decode attention 'flex' on CUDA runs fused only in the compiled step; set "
                             "compile_decode true, or use 'sdpa'")
        self.decode_attention = decode_attention
        self.vocab_size = _vocab_size(model)  # 0: unknown
        self.fused_sampling = fused_for(fused_sampling, self.vocab_size)
        # The price of one more prefill call in tokens of padded compute (prefill_plan).
        self.prefill_call_tokens: float = CALL_TOKENS.get(self.device.type, CALL_TOKENS["cuda"])
        self.prefill_calls = 0  # forwards ``prefill`` ran, over the engine's life
        # Speculation estimates survive across warm calls; a cold engine starts from priors.
        self.forward_cost = ForwardCost()
        self.acceptance = AcceptanceTracker()
        self._hopeless_calls = 0  # calls decoded plainly by estimate since the last recheck
        self._recheck_after = RECHECK_CALLS
        # whole calls, speculative against plain, where the plain loop is pipelined (graphs):
        # the rounds the selector prices leave out what a call gives up by speculating
        # (made on first use, ``_rates``; ``compare_calls`` False turns it off, for benchmarks
        # of the selector alone)
        self.call_rates: CallRates | None = None
        self.compare_calls = True

    def prepare_draws(self) -> None:
        """Compile the fused draw now, where this engine draws fused (``fused_sampling``): for a
        container's pre-warm, so that no generate call pays the compilation."""
        if self.fused_sampling and self.vocab_size:
            fused_draw.prepare(self.vocab_size, self.device)

    @classmethod
    def for_model(cls, model: torch.nn.Module, tokenizer: object, **options) -> "TorchEngine":
        """An engine over ``model`` with the EOS and pad ids of the model and its tokenizer
        (``special_tokens``); ``options``: the constructor's decode settings."""
        ids = special_tokens(model, tokenizer)
        return cls(model, eos_id=ids.eos_ids, pad_id=ids.pad_id, **options)

    @property
    def static(self) -> bool:
        """Whether plain decoding runs on the static cache: asked of the model at hand (a caller
        may wrap or swap ``model`` after construction)."""
        return self.kv_cache == "static" and static_supported(self.model)

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(
        self, sequences: list[tuple[int, ...]], prefixes: dict[tuple[int, ...], PrefixState] | None = None
    ) -> tuple[list[PrefixState], int]:
        """KV for each sequence. A sequence that extends a known prefix computes only its
        suffix. Returns (states, tokens computed)."""
        out: list[PrefixState | None] = [None] * len(sequences)
        by_prefix: dict[tuple[tuple[int, ...], bool], list[int]] = {}
        for i, seq in enumerate(sequences):
            best = _longest_prefix(seq, prefixes or {})
            # A sequence that is a known prefix itself (nothing to compute) goes apart from
            # the longer ones that extend the same prefix: a prompt may be another's L-prefix.
            by_prefix.setdefault((best, len(seq) == len(best)), []).append(i)
        computed = 0
        for (prefix, _), group in by_prefix.items():
            base = prefixes[prefix] if prefix else None
            # one padded call per run of similar suffix lengths, where the padding saved pays for
            # the call (prefill_plan); rows never mix in a forward (padding changes a row's logits
            # by float round-off only: base.py's table)
            for part in plan_prefill_calls([len(sequences[i]) - len(prefix) for i in group], self.prefill_call_tokens):
                idxs = [group[k] for k in part]
                suffixes = [sequences[i][len(prefix):] for i in idxs]
                states, n = self._extend(base, [sequences[i] for i in idxs], suffixes)
                computed += n
                self.prefill_calls += 1
                for i, st in zip(idxs, states):
                    out[i] = st
        return out, computed  # type: ignore[return-value]

    def _extend(
        self, base: PrefixState | None, full: list[tuple[int, ...]], suffixes: list[tuple[int, ...]]
    ) -> tuple[list[PrefixState], int]:
        if any(len(s) == 0 for s in suffixes):
            # Whole sequence already cached: nothing to compute.
            assert base is not None and all(len(s) == 0 for s in suffixes), "mixed empty suffixes"
            base = self._on_device(base)
            return [base for _ in full], 0
        rows = len(full)
        width = max(len(s) for s in suffixes)
        start = base.length if base else 0
        # Left padding keeps every row's last token at -1. After a prefix, though, it would sit
        # between the prefix and the suffix, where a sliding window (counted in cache columns:
        # kv_state.sliding_window) would count it as tokens: such models pad on the right there.
        right = base is not None and sliding_window(self.model) is not None
        cols = [range(len(s)) if right else range(width - len(s), width) for s in suffixes]
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for r, (s, c) in enumerate(zip(suffixes, cols)):
            ids[r, c.start:c.stop] = torch.tensor(s)
            mask[r, c.start:c.stop] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0) + start
        # logits of each row's last column only: the output head over all columns would cost
        # rows x width x vocab for nothing
        last = sorted({c.stop - 1 for c in cols})
        if base is None:
            # A full cache: given none, Hugging Face builds one from the config whose sliding-window
            # layers keep only their last window - 1 columns, and the states below take every column
            cache = DynamicCache()
        else:
            base = self._on_device(base)
            cache = DynamicCache(ddp_cache_data=[(k.unsqueeze(0).expand(rows, -1, -1, -1).contiguous(),
                                                  v.unsqueeze(0).expand(rows, -1, -1, -1).contiguous())
                                                 for k, v in base.kv])
            mask = torch.cat([torch.ones((rows, start), dtype=torch.long), mask], dim=1)
        dev = self.device
        keep_logits = 1 if last == [width - 1] else torch.tensor(last, device=dev)
        res = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                         use_cache=True, logits_to_keep=keep_logits, **with_cache(cache))
        layers = cache_of(res).layers
        states = []
        for r, (seq, c) in enumerate(zip(full, cols)):
            keep = torch.cat([torch.arange(start), torch.arange(start + c.start, start + c.stop)]).to(dev)
            kv = [(layer.keys[r][:, keep].clone(), layer.values[r][:, keep].clone()) for layer in layers]
            states.append(PrefixState(tuple(seq), kv, res.logits[r, last.index(c.stop - 1)].clone()))
        return states, sum(len(s) for s in suffixes)

    def _skip_speculation(self, spec: Speculation, batch: int) -> bool:
        """True where the warm estimates say no strategy could pay even with full-length
        drafts on every row: the call then runs the plain loop, without drafting overhead.
        Some such calls speculate anyway, to re-measure (``RECHECK_CALLS``). Never before
        every allowed strategy has been measured once."""
        if spec.fixed is not None:
            return False
        names = [n for n in spec.strategies if n != "history" or spec.history]
        if not all(self.acceptance.known(n) for n in names):
            return False  # a strategy never measured: its prior alone must not rule it out (one probe will)
        if can_pay(self.acceptance, names, batch, self.forward_cost.snapshot(), spec.max_draft_len):
            self._hopeless_calls, self._recheck_after = 0, RECHECK_CALLS
            return False
        self._hopeless_calls += 1
        if self._hopeless_calls < self._recheck_after:
            return True
        # a recheck costs a few drafting rounds and a probe (a few percent of a call on the CPU):
        # where nothing has paid for a while, spend it more rarely
        self._hopeless_calls, self._recheck_after = 0, min(2 * self._recheck_after, RECHECK_MAX)
        return False

    def _on_device(self, state: PrefixState) -> PrefixState:
        """The state with its tensors on this engine's device (a no-op for states already there)."""
        if state.last_logits.device == self.device:
            return state
        kv = [(k.to(self.device), v.to(self.device)) for k, v in state.kv]
        return PrefixState(state.tokens, kv, state.last_logits.to(self.device))

    # ------------------------------------------------------------------ decode
    @torch.no_grad()
    def generate(
        self,
        samples: list[SampleSpec],
        params: GenerationParams,
        *,
        prefixes: dict[tuple[int, ...], PrefixState] | None = None,
        speculation: Speculation | None = None,
    ) -> tuple[list[SampleOut], EngineStats]:
        """Generate every sample; see the module docstring for dedup and cut semantics.
        ``speculation``: decode speculatively (``speculative.py``; same outputs); None: plain.
        ``params.top_k``, ``params.top_p``: sampling filters (``sampling.filter_logits``); None: off."""
        full = {i for i, s in enumerate(samples) if len(s.generated) >= params.max_new_tokens}
        if full:
            return self._generate_without(full, samples, params, prefixes=prefixes, speculation=speculation)
        sampling = Sampler(params.temperature, params.top_k, params.top_p, self.fused_sampling)
        stats = EngineStats()
        if not samples:
            return [], stats
        contexts = [s.prompt_tokens + s.generated for s in samples]
        if params.dedup:
            unique = list(dict.fromkeys(contexts))
            states, stats.prefill_tokens = self.prefill(unique, prefixes)
            lookup = dict(zip(unique, states))
            row_states = [lookup[c] for c in contexts]
        else:
            row_states, stats.prefill_tokens = self.prefill(contexts, prefixes)
        if speculation is not None:
            self.acceptance.priors.update(speculation.priors)
        t_decode = time.perf_counter()
        if speculation is None or self._plain_by_choice(speculation, len(samples)):
            outs = self._decode(samples, row_states, params, sampling, stats)
            if speculation is not None:  # decoded plainly by choice: say so in the counters
                stats.spec = SpecStats(rounds=stats.decode_steps, plain_calls=1).to_dict()
                # the plain side of the comparison: calls asked to speculate only (an
                # evaluation's greedy calls on the same engine are another workload)
                self._record_call(samples, outs, False, time.perf_counter() - t_decode, stats)
            return outs, stats
        if self.static:
            outs, spec_stats = decode_static_speculative(
                self, samples, row_states, params, sampling=sampling, stats=stats, spec=speculation,
                tracker=self.acceptance, cost=self.forward_cost, graphs=self.graphs, padded=self.pad_batches,
                compiled=self.compiled, attention=self.decode_attention)
        else:
            outs, spec_stats = decode_speculative(
                self, samples, row_states, params, sampling=sampling, stats=stats, spec=speculation,
                tracker=self.acceptance, cost=self.forward_cost)
        stats.spec = spec_stats.to_dict()
        if speculation.fixed is None:  # a fixed choice (benchmarks) says nothing of the selector's calls
            self._record_call(samples, outs, True, time.perf_counter() - t_decode, stats)
        return outs, stats

    def _plain_by_choice(self, spec: Speculation, batch: int) -> bool:
        """Whether a call asked to speculate decodes plainly: where the estimates say nothing
        could pay (``_skip_speculation``), or else where whole speculative calls of its bucket
        ran slower than plain ones (``spec_guard``, engines that replay graphs). A fixed
        choice (benchmarks) always speculates."""
        if self._skip_speculation(spec, batch):
            return True
        rates = self._rates()
        return spec.fixed is None and rates is not None and rates.verdict(bucket_for(batch)) != "speculate"

    def _rates(self) -> CallRates | None:
        """The whole-call rates where this engine replays graphs (its plain loop is pipelined)."""
        if not self.compare_calls:
            return None
        if self.call_rates is None and self.graphs:
            self.call_rates = CallRates()
        return self.call_rates

    def _record_call(self, samples: list[SampleSpec], outs: list[SampleOut], speculative: bool,
                     seconds: float, stats: EngineStats) -> None:
        """A decode loop's seconds per new token, for ``spec_guard``, less its graph captures
        (and the compilations inside them: paid once per warm container and shape). The loops
        end by reading their last tokens back, so the device has finished."""
        rates = self._rates()
        if rates is not None:
            tokens = sum(len(o.tokens) for o in outs) - sum(len(s.generated) for s in samples)
            rates.record(bucket_for(len(samples)), speculative, seconds - stats.graph_capture_s, tokens)

    def _generate_without(self, full: set[int], samples: list[SampleSpec], params: GenerationParams,
                          **options) -> tuple[list[SampleOut], EngineStats]:
        """``generate`` where the samples at indices ``full`` are continuations that already have
        ``max_new_tokens`` tokens: they finish as ``"length"`` with nothing drawn (a draw would
        take them past the limit) and count as finished for the cut, as vLLM's engine does."""
        rest = [s for i, s in enumerate(samples) if i not in full]
        cut = None if params.cut_after is None else max(params.cut_after - len(full), 0)
        outs, stats = self.generate(rest, replace(params, cut_after=cut), **options)
        drawn = iter(outs)
        return [SampleOut(s.prompt_id, s.sample_index, list(s.generated), "length") if i in full else next(drawn)
                for i, s in enumerate(samples)], stats

    def _decode(self, samples: list[SampleSpec], states: list[PrefixState], params: GenerationParams,
                sampling: Sampler, stats: EngineStats) -> list[SampleOut]:
        """Plain decoding: on the static cache where it runs, else the dynamic loop."""
        if self.static:
            return decode_static(self, samples, states, params, sampling=sampling, stats=stats, graphs=self.graphs,
                                 padded=self.pad_batches, compiled=self.compiled,
                                 attention=self.decode_attention)
        return self._decode_dynamic(samples, states, params, sampling, stats)

    def _decode_dynamic(
        self,
        samples: list[SampleSpec],
        states: list[PrefixState],
        params: GenerationParams,
        sampling: Sampler,
        stats: EngineStats,
    ) -> list[SampleOut]:
        n, dev = len(samples), self.device
        cache, mask = stack_states(states)
        keys = torch.tensor([stream_key(params.seed, params.step, s.prompt_id, s.sample_index) for s in samples],
                            device=dev)
        gen: list[list[int]] = [list(s.generated) for s in samples]
        positions = torch.tensor([len(g) for g in gen], dtype=torch.long, device=dev)  # random-stream position
        next_pos = torch.tensor([st.length for st in states], dtype=torch.long, device=dev)  # model position
        logits = stack_logits(states)
        active = torch.arange(n, device=dev)
        rows = list(range(n))  # host copy of ``active``
        ends = RowEnds(n, self.eos_ids, params.max_new_tokens)
        t_step, b_step = None, 0
        while True:
            tok = sampling.draw(logits, keys[active], positions[active])
            # one device->host copy per step
            keep = [j for j, (row, t) in enumerate(zip(rows, tok.tolist())) if not ends.take(row, t, gen[row])]
            # The copy waited for the last step's forward: step to step is one plain round, the
            # speculation selector's baseline (ForwardCost).
            now = time.perf_counter()
            if t_step is not None:
                self.forward_cost.observe(b_step, 1, now - t_step)
            t_step, b_step = now, len(keep)
            if not keep or ends.cut(params.cut_after):
                break
            if len(keep) < len(rows):
                keep_t = torch.tensor(keep, device=dev)
                cache.batch_select_indices(keep_t)
                mask = mask[keep_t]
                active, tok = active[keep_t], tok[keep_t]
                rows = [rows[j] for j in keep]
            positions[active] += 1
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long, device=dev)], dim=1)
            res = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[active][:, None],
                             use_cache=True, **with_cache(cache))
            next_pos[active] += 1
            logits = res.logits[:, -1]
            stats.decode_steps += 1
            stats.decode_token_slots += len(rows)
        return [SampleOut(s.prompt_id, s.sample_index, gen[i], ends.reasons[i] or "cut", ends.stops[i])
                for i, s in enumerate(samples)]


def decode_path(static: bool, device: torch.device, cuda_graphs: str, compile_decode: bool) -> tuple[bool, bool]:
    """(steps replay CUDA graphs, steps run through ``torch.compile``) for a decode on the
    static cache or not (``static``) on ``device``, under ``generation.cuda_graphs`` and
    ``compile_decode``: what the settings do, whatever their spelling."""
    return static and device.type == "cuda" and cuda_graphs != "off", compile_decode and static


def _longest_prefix(seq: tuple[int, ...], prefixes: dict[tuple[int, ...], PrefixState]) -> tuple[int, ...]:
    best: tuple[int, ...] = ()
    for p in prefixes:
        if len(p) > len(best) and len(p) <= len(seq) and seq[: len(p)] == p:
            best = p
    return best


def _vocab_size(model: torch.nn.Module) -> int:
    """The width of the model's logits: its output layer's rows, else ``config.vocab_size``, else
    0 (unknown)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return weight.shape[0]
    return getattr(getattr(model, "config", None), "vocab_size", None) or 0
