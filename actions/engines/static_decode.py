"""Plain decoding over the engine-owned static KV cache, replayed as CUDA graphs on a GPU.

Per loaded model and process, a ``DecodeRuntime`` holds the ``StaticKV`` buffers, the decode
step's state tensors (each row's last token, model position, random-stream position and
stream key; the write column) and the CUDA graphs captured over them. One decode step --
the forward of every row's last token (``static_forward``), the counter-based Gumbel draw of
its next token (``sampling.Sampler``) and the advance of the positions and the column -- runs
entirely on the device; the host reads the drawn tokens back once per step to apply EOS,
length and cut rules (``base.RowEnds``). Steps on a GPU are pipelined: the next step is
launched as soon as the host has read the last one's tokens, before it applies them, so the
device does not idle through the host's bookkeeping. Finished rows' slots are then freed one
step later, and a call whose rows might go on runs one step past its end; no token changes
(rows never mix). A step that would capture a new graph is launched after the bookkeeping
instead, so a call never captures a graph only for a step it discards.

CUDA graphs. The step of a batch of ``b`` rows over an attention window of ``window`` columns
is captured once per (b, window, sampler, whether its draws are fused) and replayed. A call
pads its rows up to a batch bucket (``BATCH_BUCKETS``, as vLLM does) and its window to a
multiple of ``WINDOW_STEP``; finished rows keep running as idle rows until the live rows fit a
smaller bucket, and then the batch is compacted into it (their slots are released). Captures
stay valid while the buffers do: a warm container reuses them across calls of the same model,
and across policy versions, which the torch engine's generation slot copies into that model in
place (``torch_slot.py``); a call that needs more rows or columns than the buffers hold
reallocates them (and drops the graphs). Capture time and count are reported in
``EngineStats``. A capture that fails falls back to the eager step with one warning line; the
eager step runs exactly the same kernels.

Exactness. The tokens are those of the dynamic path (``TorchEngine._decode_dynamic``) up to
float round-off of the attention over a longer, masked window: each row's draw depends only
on its own logits, key and position, and rows never mix (``tests/test_static_decode.py``
compares token for token, dedup, uneven splits, cuts and continuations included).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass

import torch

from actions.engines.base import EngineStats, GenerationParams, RowEnds, SampleOut, SampleSpec
from actions.engines.compiled_step import CompiledStep
from actions.engines.kv_state import PrefixState, stack_logits
from actions.engines.sampling import Sampler, fused_draw, stream_key
from actions.engines.static_forward import StaticForward, unsupported_reason
from actions.engines.static_kv import StaticKV, round_up

__all__ = ["BATCH_BUCKETS", "WINDOW_STEP", "DecodeRuntime", "compact_rows", "decode_static", "runtime_for",
           "static_supported", "window_step"]

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
"""Batch sizes a CUDA graph is captured for; a larger batch runs at its own size."""

GRAPH_DRAW_ELEMENTS = 1 << 25
"""At most this many logits per draw inside a verification round (``DecodeRuntime._verify_step``):
a draw's hash and noise temporaries take tens of bytes per logit (a gigabyte or two at this
bound), and a round of 512 rows x 9 columns over a 151,936-token vocabulary has 700 million."""

WINDOW_STEP = 256
"""The attention window (and the buffers' columns) grows in steps of this many columns: a
step attends over at most ``WINDOW_STEP - 1`` masked columns more than it needs, and one
graph serves every step of a call within one window."""

CPU_WINDOW_STEP = 1
"""On the CPU (no graphs) the window is exactly the columns in use: the attention then has the
shapes of the dynamic path's and computes the same bits. On CUDA the eager step uses the
graphs' ``WINDOW_STEP``, so that graph replay and eager steps run the same kernels on the same
shapes and agree bit for bit; so does a compiled step anywhere (``window_step``)."""


def window_step(rt: "DecodeRuntime") -> int:
    """Columns the attention window grows by: ``WINDOW_STEP`` on CUDA, for a compiled step
    (each window is a shape ``torch.compile`` compiles for; fused kernels round differently
    from the dynamic path anyway) and for ``flex`` attention (whole key/value blocks, and a
    sum of another order anyway); else ``CPU_WINDOW_STEP``."""
    exact = rt.device.type != "cuda" and not rt.compiled and rt.forward.attention == "sdpa"
    return CPU_WINDOW_STEP if exact else WINDOW_STEP

_RUNTIMES: "weakref.WeakKeyDictionary[torch.nn.Module, DecodeRuntime]" = weakref.WeakKeyDictionary()
"""Each loaded model's runtime, dropped with the model (a runtime holds the model's
submodules, never the model itself)."""


def smallest_bucket(buckets: tuple[int, ...], n: int) -> int:
    """The smallest of ``buckets`` that holds ``n`` (``n`` itself above the largest)."""
    return next((b for b in buckets if b >= n), n)


def bucket_for(rows: int) -> int:
    """The smallest batch bucket that holds ``rows`` (``rows`` itself above the largest)."""
    return smallest_bucket(BATCH_BUCKETS, rows)


def static_supported(model: torch.nn.Module) -> bool:
    return unsupported_reason(model) is None


def runtime_for(model: torch.nn.Module, compiled: bool = False, attention: str = "sdpa") -> "DecodeRuntime":
    """The model's runtime, created on first use and kept as long as the model is (a warm
    container keeps its buffers and graphs across calls). A model whose parameters moved
    (``.to()`` another device or dtype and back, a re-materialised weight) gets a new one:
    captured graphs read the parameters at the addresses they had when captured. Weights
    copied into the same tensors in place keep the runtime, and its graphs see the new values.
    ``compiled`` and ``attention`` (``static_forward.ATTENTIONS``): how its step runs; a call
    that asks otherwise than the runtime was made for gets a new one."""
    rt = _RUNTIMES.get(model)
    if (rt is None or rt.signature != _signature(model) or rt.wants_compiled != compiled
            or rt.forward.attention != attention):
        rt = DecodeRuntime(model, compiled, attention)
        _RUNTIMES[model] = rt
    return rt


def _signature(model: torch.nn.Module) -> tuple:
    """Where the parameters live: (device, dtype, every parameter's address)."""
    params = list(model.parameters())
    return params[0].device, params[0].dtype, tuple(p.data_ptr() for p in params)


def _draws(sampling: Sampler) -> tuple[Sampler, bool]:
    """The part of a graph's key that says how it draws: the sampler, and whether its draws run
    fused (a sampling one whose fused draw works). After ``fused_draw.disable`` new graphs are
    captured unfused, and graphs captured fused are no longer replayed: one process draws one way."""
    return sampling, sampling.fused and sampling.temperature > 0 and fused_draw.error is None


@dataclass
class _State:
    """Per-row decode state on the device, ``[rows]`` each; ``col``: ``[1]``."""

    tok: torch.Tensor  # the last drawn token, the next forward's input
    pos: torch.Tensor  # its model position
    rpos: torch.Tensor  # its random-stream (response) position
    keys: torch.Tensor  # stream keys
    col: torch.Tensor  # the cache column its KV goes to (the same for every row)

    @classmethod
    def empty(cls, rows: int, device: torch.device) -> "_State":
        z = lambda n: torch.zeros(n, dtype=torch.long, device=device)  # noqa: E731
        return cls(z(rows), z(rows), z(rows), z(rows), z(1))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.tok, self.pos, self.rpos, self.keys, self.col


class DecodeRuntime:
    """Buffers, state and graphs of one model's decode step (module docstring)."""

    def __init__(self, model: torch.nn.Module, compiled: bool = False, attention: str = "sdpa") -> None:
        self.forward = StaticForward(model, attention)
        self.wants_compiled = compiled  # what the runtime was made for (runtime_for)
        self.compiled = compiled  # False after a compiler failure
        self._compiled_step = None
        self.signature = _signature(model)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.kv: StaticKV | None = None
        self.state: _State | None = None
        # plain steps keyed (b, window, sampler); verification rounds ("verify", b, w, window, sampler)
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        # verification rounds' inputs (each row's last token and draft) and draws, [rows, w_max]
        self.spec_ids: torch.Tensor | None = None
        self.spec_drawn: torch.Tensor | None = None
        self.offsets: torch.Tensor | None = None  # arange(w_max): a round's column offsets
        # one byte per cache column, never read or written: the compiled flex step reads its
        # window as the length of a slice of it (``compiled_step``), a tensor no step mutates
        self.spans: torch.Tensor | None = None
        self.pool = None
        self.capture_s = 0.0
        self.captures = 0
        self.graph_error: str | None = None
        # actions never overlap in one container, but a library caller's threads might: the
        # buffers and graphs serve one call at a time
        self.lock = threading.Lock()

    def ensure(self, rows: int, cols: int) -> StaticKV:
        """Buffers of at least ``rows`` x ``cols`` (grown, never shrunk; graphs dropped on growth)."""
        cols = round_up(cols, WINDOW_STEP)
        if self.kv is None or not self.kv.fits(rows, cols, self.dtype):
            if self.kv is not None:
                rows, cols = max(rows, self.kv.rows), max(cols, self.kv.cols)
            self.graphs.clear()
            self.spec_ids = self.spec_drawn = None  # sized by the rows: made again by ensure_verify
            self.kv = None  # free the old buffers before allocating the new
            f = self.forward
            self.kv = StaticKV(layers=len(f.layers), kv_heads=f.kv_heads, head_dim=f.head_dim, rows=rows,
                               cols=cols, dtype=self.dtype, device=self.device)
            self.state = _State.empty(rows, self.device)
            self.spans = torch.empty(cols, dtype=torch.uint8, device=self.device)
        return self.kv

    def ensure_verify(self, width: int) -> None:
        """Verification buffers for rounds of up to ``width`` columns over the rows ``ensure``
        made (grown, never shrunk; verification graphs dropped on growth)."""
        rows = self.kv.rows
        if self.spec_ids is None or self.spec_ids.shape[1] < width or self.spec_ids.shape[0] < rows:
            width = max(width, 0 if self.spec_ids is None else self.spec_ids.shape[1])
            for key in [k for k in self.graphs if k[0] == "verify"]:
                del self.graphs[key]
            self.spec_ids = torch.zeros((rows, width), dtype=torch.long, device=self.device)
            self.spec_drawn = torch.zeros((rows, width), dtype=torch.long, device=self.device)
            self.offsets = torch.arange(width, device=self.device)

    def verify_logits(self, b: int, w: int, window: int) -> torch.Tensor:
        """The verification forward of ``spec_ids[:b, :w]`` (each row's last token, then its
        draft): logits ``[b, w, V]``, keys and values written to columns ``col .. col + w - 1``.
        The state is not advanced (``advance`` does, once the host knows what was accepted).
        Attention by ``sdpa`` whatever the runtime's: a round is never compiled, and flex
        attention without the compiler is its unfused reference (``static_forward``)."""
        st, offs = self.state, self.offsets[:w]
        return self.forward(self.kv, self.spec_ids[:b, :w], st.pos[:b, None] + offs, st.col + offs, window,
                            attention="sdpa")

    def _verify_step(self, b: int, w: int, window: int, sampling: Sampler) -> None:
        """``verify_logits``, then every column's draw into ``spec_drawn[:b, :w]``: column c
        holds the token plain decoding draws after the row's input c (response position
        ``rpos + 1 + c``), whether or not the draft before it is kept. Drawing all columns
        costs one wide draw and keeps the round free of host decisions, so a graph holds it."""
        st, offs = self.state, self.offsets[:w]
        logits = self.verify_logits(b, w, window).reshape(b * w, -1)
        keys = st.keys[:b, None].expand(b, w).reshape(-1)
        rpos = (st.rpos[:b, None] + 1 + offs).reshape(-1)
        out = torch.empty(b * w, dtype=torch.long, device=self.device)
        # a fixed number of fixed-size draws (the shapes depend only on b, w and V, so a graph
        # holds them): the noise of one draw over b * w * V cells would need tens of gigabytes
        cells = max(1, GRAPH_DRAW_ELEMENTS // logits.shape[1])
        for i in range(0, b * w, cells):
            out[i:i + cells] = sampling.draw(logits[i:i + cells], keys[i:i + cells], rpos[i:i + cells])
        self.spec_drawn[:b, :w] = out.view(b, w)

    def verify(self, b: int, w: int, window: int, sampling: Sampler, graphs: bool) -> None:
        """``_verify_step``, replayed from a CUDA graph per (b, w, window, sampler) where ``graphs``."""
        if graphs and self.graph_error is None:
            key = ("verify", b, w, window, *_draws(sampling))
            g = self.graphs.get(key) or self._capture(key, lambda: self._verify_step(b, w, window, sampling))
            if g is not None:
                g.replay()
                return
        self._verify_step(b, w, window, sampling)

    def advance(self, accepted: list[int], nxt: list[int], w: int, col: int) -> int:
        """After a verification round at column ``col`` of width ``w`` over rows ``[0, b)``
        (``b = len(accepted)``): row r kept its input and ``accepted[r]`` draft tokens, and
        ``nxt[r]`` is its next input. Columns past a row's kept ones become holes (masked);
        the next round writes after the longest kept run. One host-to-device copy. Returns
        the next column."""
        b, longest = len(accepted), max(accepted)
        st = self.state
        t = torch.tensor([accepted, nxt], dtype=torch.long).to(self.device)
        acc = t[0]
        st.tok[:b] = t[1]
        st.pos[:b] += acc + 1
        st.rpos[:b] += acc + 1
        st.col += longest + 1
        self.kv.mask[:b, col:col + w] &= self.offsets[:w][None, :] <= acc[:, None]
        return col + longest + 1

    def step(self, b: int, window: int, sampling: Sampler, dense: bool = False) -> None:
        """One decode step of rows ``[0, b)``: forward, draw, advance (through ``torch.compile``
        where the runtime is ``compiled``, ``compiled_step``: fused kernels, which round
        differently from eager)."""
        if self.compiled:
            if self._compiled_step is None:
                self._compiled_step = CompiledStep(self, recompile_limit=8 * len(BATCH_BUCKETS))
            try:
                return self._compiled_step(b, window, sampling, dense)
            except Exception as exc:  # noqa: BLE001 -- a compiler failure falls back to eager
                self.compiled = False
                log.warning("torch.compile of the decode step failed, running it eagerly (attention by sdpa): "
                            "%s: %s", type(exc).__name__, str(exc)[:200])
                if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                    raise  # the capture holds the failed call's work: _capture captures the eager step anew
        # a runtime whose compilation failed attends by sdpa: uncompiled flex is its unfused reference
        self._step(b, window, sampling, dense, attention="sdpa" if self.wants_compiled else None)

    def _step(self, b: int, window: int, sampling: Sampler, dense: bool = False, attention: str | None = None) -> None:
        st = self.state
        logits = self.forward(self.kv, st.tok[:b, None], st.pos[:b, None], st.col, window, dense,
                              attention=attention)[:, -1]
        st.rpos[:b] += 1
        st.tok[:b] = sampling.draw(logits, st.keys[:b], st.rpos[:b])
        st.pos[:b] += 1
        st.col += 1

    def ready(self, b: int, window: int, sampling: Sampler, graphs: bool) -> bool:
        """Whether ``run`` of this shape starts at once (no graph to capture first)."""
        return not graphs or self.graph_error is not None or (b, window, *_draws(sampling)) in self.graphs

    def run(self, b: int, window: int, sampling: Sampler, graphs: bool) -> None:
        """``step``, replayed from a CUDA graph where ``graphs`` (captured on first use)."""
        if graphs and self.graph_error is None:
            key = (b, window, *_draws(sampling))
            g = self.graphs.get(key) or self._capture(key, lambda: self.step(b, window, sampling))
            if g is not None:
                g.replay()
                return
        # the CPU's step: unmasked where nothing in the window is masked (StaticForward), a check
        # that costs a device read on a GPU and is never made there
        dense = self.device.type == "cpu" and not self.compiled and bool(self.kv.mask[:b, :window - 1].all())
        self.step(b, window, sampling, dense)

    def _capture(self, key: tuple, step) -> torch.cuda.CUDAGraph | None:
        """A CUDA graph of ``step()`` (a plain step or a verification round), kept under ``key``
        (whose last item says whether its draws are fused, ``_draws``). Where a capture with
        fused draws fails, draws go unfused (``fused_draw.disable``) and the step is captured
        again, under the key of unfused draws: the graphs are worth more than the fused draw.
        Where the compiled step fails inside the capture (``step`` then runs eagerly from now
        on), the eager step is captured instead."""
        fused, compiled = key[-1], self.compiled
        try:
            return self._capture_once(key, step)
        except Exception as exc:  # noqa: BLE001 -- any capture failure falls back
            error = exc
        if compiled and not self.compiled:  # the compiler failed inside the capture
            try:
                return self._capture_once(key, step)
            except Exception as exc:  # noqa: BLE001
                error = exc
        if fused:
            fused_draw.disable(f"a CUDA graph capture with fused draws failed: {type(error).__name__}: "
                               f"{str(error)[:200]}")
            try:
                return self._capture_once((*key[:-1], False), step)
            except Exception as exc:  # noqa: BLE001
                error = exc
        self.graph_error = f"{type(error).__name__}: {str(error)[:200]}"
        log.warning("CUDA graph capture failed, decoding eagerly from now on: %s", self.graph_error)
        return None

    def _capture_once(self, key: tuple, step) -> torch.cuda.CUDAGraph:
        """``_capture``'s one attempt; on failure the state is restored and the error raised."""
        st = self.state
        saved = [t.clone() for t in st.tensors()]
        t0 = time.perf_counter()
        try:
            # warm-up on a side stream (lazy library set-up happens outside the capture); its
            # cache and mask writes are the ones the replay repeats, its state advance is undone
            current = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                step()
            current.wait_stream(side)
            for t, s in zip(st.tensors(), saved):
                t.copy_(s)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            g = torch.cuda.CUDAGraph()
            # graphs share one memory pool: they never run concurrently and keep no output in it
            with torch.cuda.graph(g, pool=self.pool):
                step()
            torch.cuda.synchronize(self.device)
        except Exception:
            for t, s in zip(st.tensors(), saved):
                t.copy_(s)
            raise
        self.capture_s += time.perf_counter() - t0
        self.captures += 1
        self.graphs[key] = g
        return g


def decode_static(engine, samples: list[SampleSpec], states: list[PrefixState], params: GenerationParams, *,
                  sampling: Sampler, stats: EngineStats, graphs: bool, padded: bool | None = None,
                  compiled: bool = False, attention: str = "sdpa") -> list[SampleOut]:
    """``TorchEngine``'s plain decode loop on the static cache (module docstring). Returns the
    samples in input order; updates ``stats`` and the engine's ``forward_cost``.

    ``graphs``: replay the step as CUDA graphs; ``padded`` (default: ``graphs``): run batch
    buckets with idle rows, as graphs need (the eager step can run either way, which is how the
    CPU tests exercise the bucket logic); ``compiled``: the step through ``torch.compile``
    (``DecodeRuntime.step``); ``attention``: its attention kernel (``static_forward.ATTENTIONS``)."""
    padded = graphs if padded is None else padded
    rt = runtime_for(engine.model, compiled, attention)
    with rt.lock:
        return _decode_locked(rt, engine, samples, states, params, sampling=sampling, stats=stats, graphs=graphs,
                              padded=padded)


def _decode_locked(rt: DecodeRuntime, engine, samples: list[SampleSpec], states: list[PrefixState],
                   params: GenerationParams, *, sampling: Sampler, stats: EngineStats, graphs: bool, padded: bool
                   ) -> list[SampleOut]:
    n = len(samples)
    captures0, capture_s0 = rt.captures, rt.capture_s
    width = max(s.length for s in states)
    remaining = max(params.max_new_tokens - len(s.generated) for s in samples)
    rows = bucket_for(n) if padded else n
    # steps on a GPU (replayed or eager) are pipelined (module docstring); on the CPU a step
    # runs as it is launched: nothing to overlap
    pipelined = graphs or rt.device.type == "cuda"
    # the last step writes column width + remaining - 2 (pipelined: one more, - 1)
    kv = rt.ensure(rows, width + max(remaining, 1))
    kv.load(states, rows)
    st = rt.state
    gen: list[list[int]] = [list(s.generated) for s in samples]
    _put(st.keys, [stream_key(params.seed, params.step, s.prompt_id, s.sample_index) for s in samples], rows)
    _put(st.rpos, [len(g) for g in gen], rows)
    _put(st.pos, [s.length for s in states], rows)
    st.col.fill_(width)
    st.tok[:rows].zero_()
    st.tok[:n] = sampling.draw(stack_logits(states), st.keys[:n], st.rpos[:n])
    slots: list[int | None] = [*range(n), *([None] * (rows - n))]  # batch row -> sample
    ends = RowEnds(n, engine.eos_ids, params.max_new_tokens)
    b, col, live = rows, width, n
    t_step, captured = None, rt.capture_s
    shrink: tuple[list[int], int] | None = None  # pipelined: (rows to keep, bucket), decided while the step ran

    def window() -> int:
        return min(round_up(col + 1, window_step(rt)), kv.cols)

    def launch() -> None:
        nonlocal col
        rt.run(b, window(), sampling, graphs)
        col += 1

    def compact(still: list[int], target: int) -> None:  # release the other rows' slots
        nonlocal slots, b
        compact_rows(rt, still, target, col)
        slots, b = [*(slots[j] for j in still), *([None] * (target - len(still)))], target

    while True:
        toks = st.tok[:b].tolist()  # the step's one device->host read
        if shrink is not None:  # compact away the rows that had finished before this step ran
            still, target = shrink
            toks = [*(toks[j] for j in still), *([0] * (target - len(still)))]
            compact(still, target)
            shrink = None
        # the next step runs while the host applies these tokens, where some row may need it
        # (not every live row reaches max_new_tokens with them) and it captures nothing
        early = (pipelined and rt.ready(b, window(), sampling, graphs)
                 and any(len(gen[i]) + 1 < params.max_new_tokens for i in slots if i is not None))
        if early:
            launch()
        keep = [j for j, i in enumerate(slots) if i is not None and not ends.take(i, toks[j], gen[i])]
        now = time.perf_counter()
        if t_step is not None:  # step to step is one plain round: the speculation selector's baseline
            # less any graph capture in it: paid once per warm container and shape, not per round
            engine.forward_cost.observe(live, 1, max(now - t_step - (rt.capture_s - captured), 0.0))
        t_step, live, captured = now, len(keep), rt.capture_s
        if not keep or ends.cut(params.cut_after):
            break
        target = bucket_for(live) if padded else live
        if target < b and not early:  # compact into the smaller batch now
            compact(keep, target)
        elif live < sum(i is not None for i in slots):
            kept = set(keep)
            slots = [i if j in kept else None for j, i in enumerate(slots)]
            if target < b:  # the next step already runs on these rows: compact after it
                shrink = keep, target
        if not early:
            launch()
        stats.decode_steps += 1
        stats.decode_token_slots += live
    stats.graph_captures += rt.captures - captures0
    stats.graph_capture_s += rt.capture_s - capture_s0
    stats.kv_cache = "static+graphs" if graphs and rt.graph_error is None else "static"
    return [SampleOut(s.prompt_id, s.sample_index, gen[i], ends.reasons[i] or "cut", ends.stops[i])
            for i, s in enumerate(samples)]


def _put(t: torch.Tensor, values: list[int], rows: int) -> None:
    """``t[:len(values)] = values``; padding rows up to ``rows`` get 0."""
    t[:rows].zero_()
    t[: len(values)] = torch.tensor(values, dtype=t.dtype).to(t.device)


def compact_rows(rt: DecodeRuntime, keep: list[int], rows: int, used_cols: int) -> None:
    """Move rows ``keep`` of the cache and the state to the front; the rest up to ``rows`` idle:
    what dropping finished rows costs the static path (timed by ``profiling.shrink_seconds``)."""
    rt.kv.compact(keep, rows, used_cols)
    idx = torch.tensor(keep, device=rt.device)
    m = len(keep)
    for t in rt.state.tensors()[:4]:
        t[:m] = t.index_select(0, idx)
        t[m:rows] = 0
