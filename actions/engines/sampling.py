"""Counter-based sampling noise: a sample's randomness depends only on who it is.

A design invariant says scaling is invisible to learning: the tokens a sample draws may
depend only on (run seed, step, prompt id, sample index) and its logits -- never on the batch it
shares, the actor that runs it, or whether it was cut and migrated, except through the float
round-off those change the logits by (``base.py``). Stateful generators cannot give that
cheaply in a batch, so sampling uses the Gumbel-max trick with noise from a counter-based hash:

    token_t = argmax_v( logits_v / temperature + G(key, t, v) ),  G = -log(-log(U)),
    U = hash64(key, t, v) mapped to (0, 1)

``key`` = hash64(seed, step, prompt_id, sample_index); ``t`` is the position in the response,
which is also the "random-stream position" a migrated sample carries. Gumbel-max draws exactly
from softmax(logits / temperature). Temperature 0 means greedy argmax (no noise).

Top-k and top-p (nucleus) filtering (``filter_logits``) set the logits outside the kept set to
-inf *before* the noise is added, so the draw is exactly from the renormalised filtered softmax
and stays a pure function of (logits, key, position): cut-and-migrate and speculative
verification are as exact with filters as without. As in HF transformers and vLLM, temperature
comes first, then top-k, then top-p over the top-k survivors. Both rules keep every token tied
with the last one kept (the kept set depends on the logit values only, never on token order):

* top-k keeps the tokens whose logit is >= the k-th largest logit;
* top-p sorts the tokens by probability, keeps the shortest prefix whose cumulative
  probability reaches ``top_p`` (the top token always), and then every token whose logit is
  >= that prefix's smallest.

With both filters off the arithmetic is the unfiltered one, bit for bit. Greedy decoding
ignores them: the argmax is always kept.

The hash is MurmurHash3's 64-bit finaliser (fmix64) evaluated in int64 tensors; logical right
shifts are emulated with a mask because torch shifts signed integers arithmetically.

Noise is computed on the device of its keys (the logits' device in both engines), so a GPU
never waits for a host-built ``[rows, V]`` tensor. The integer hash and the uniform ``U`` are
exact on any device; ``-log(-log(U))`` goes through the device's float64 ``log``, whose last
bit may differ between CPU and CUDA libraries, and the result is rounded to float32, so CUDA
noise equals CPU noise except, rarely, in the last float32 bit (tests/test_sampling_device.py,
``gpu`` marker, measures how many entries differ).

Fused draws. Written as tensor operations, the hash and the noise take about twenty passes
over ``[rows, V]`` int64 and float64 temporaries per draw; at a real vocabulary that is most of
a small model's decode step (0.74 s of a draw of 64 rows over V = 151,936 on two CPU cores;
about a millisecond of HBM traffic on an H200). ``Sampler(fused=True)`` runs the same
arithmetic through ``torch.compile`` (one kernel that hashes, adds and takes the argmax without
materialising the noise) and draws the same tokens: on the CPU the noise is the eager noise bit
for bit (tests/test_sampling_fused.py); on CUDA ``tests/test_sampling_device.py`` compares the
two. ``fused_for`` says which draws fuse; where the compiler is unusable the draws run unfused
after one warning line.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

import torch

log = logging.getLogger(__name__)

_M1 = -49064778989728563  # 0xff51afd7ed558ccd as a signed int64
_M2 = -4265267296055464877  # 0xc4ceb9fe1a85ec53 as a signed int64
_GOLDEN = -7046029254386353131  # 0x9e3779b97f4a7c15 as a signed int64
_MASK64 = (1 << 64) - 1


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 values."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def _fmix64(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _shr(x, 33)
    x = x * _M1
    x = x ^ _shr(x, 33)
    x = x * _M2
    return x ^ _shr(x, 33)


def _py_fmix64(x: int) -> int:
    x &= _MASK64
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _MASK64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _MASK64
    return x ^ (x >> 33)


def stream_key(seed: int, step: int, prompt_id: int, sample_index: int) -> int:
    """The 64-bit stream key of one sample, as a signed int64 value."""
    h = 0
    for part in (seed, step, prompt_id, sample_index):
        h = _py_fmix64(h ^ (part & _MASK64) ^ 0x9E3779B97F4A7C15)
    return h - (1 << 64) if h >= (1 << 63) else h


def gumbel_noise(keys: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise for each (row, vocab entry).

    Args:
        keys: [B] int64 stream keys.
        positions: [B] int64 response positions (0 for the first generated token).
        vocab_size: V.
    Returns:
        [B, V] float32 noise.
    """
    return _noise(keys, positions, _vocab_term(vocab_size, keys.device))


def _noise(keys: torch.Tensor, positions: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """``gumbel_noise`` over the vocabulary terms ``term`` ([V], ``_vocab_term``)."""
    row = _fmix64(keys ^ (positions * _GOLDEN))  # [B]
    x = _fmix64(row[:, None] ^ term[None, :])  # [B, V]
    # Top 53 bits -> a double in [0, 1); the half-ulp offset keeps U strictly inside (0, 1).
    u = (_shr(x, 11).to(torch.float64) + 0.5) / float(1 << 53)
    return (-torch.log(-torch.log(u))).to(torch.float32)


_VOCAB_TERMS: dict[tuple[int, str], torch.Tensor] = {}


def _vocab_term(vocab_size: int, device: torch.device) -> torch.Tensor:
    """``(v + 1) * M2`` for every vocabulary entry v, [V] int64: the same for every draw, so
    computed once per (V, device) rather than in every decode step."""
    key = (vocab_size, str(device))
    term = _VOCAB_TERMS.get(key)
    if term is None:
        term = (torch.arange(vocab_size, dtype=torch.int64, device=device) + 1) * _M2
        _VOCAB_TERMS[key] = term
    return term


def filter_logits(scaled: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Top-k, then top-p, filtering (module docstring): entries outside the kept set become -inf.

    Args:
        scaled: [B, V] float logits already divided by the temperature (top-p's probabilities
            are those of the tempered softmax).
        top_k: keep the k largest logits per row (and ties with the k-th); None, 0 or >= V: off.
        top_p: nucleus mass in (0, 1]; None or 1.0: off.
    Returns:
        ``scaled`` itself when both filters are off, else a new [B, V] tensor.
    """
    vocab = scaled.shape[-1]
    if top_k is not None and 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered = torch.sort(scaled, dim=-1, descending=True).values
        # float64: the cut-off decision should not hinge on float32 round-off over a large V
        mass = torch.cumsum(torch.softmax(ordered.double(), dim=-1), dim=-1)
        # Mass strictly before each sorted entry: non-decreasing and 0 for the top token, so the
        # entries with mass-before < top_p are a prefix of length >= 1 -- the nucleus.
        before = torch.nn.functional.pad(mass[:, :-1], (1, 0))
        num_kept = (before < top_p).sum(dim=-1, keepdim=True)
        floor = ordered.gather(-1, num_kept - 1)
        scaled = scaled.masked_fill(scaled < floor, float("-inf"))
    return scaled


FUSED_MIN_VOCAB = 8192
"""``fused_sampling: auto`` fuses the draws of vocabularies at least this large: real tokenizers
(32k-152k entries), where the unfused draw costs most; not the tiny character vocabularies of
the defaults and tests, where one compilation (seconds) would cost more than it saves."""

FUSED_SAMPLING = ("auto", "on", "off")


def fused_for(setting: str, vocab_size: int) -> bool:
    """Whether draws over ``vocab_size`` entries fuse under ``generation.fused_sampling``
    (``auto``: from ``FUSED_MIN_VOCAB`` up). It depends on the model only, never on the batch,
    so every actor of a run draws the same way.

    Raises:
        ValueError: ``setting`` is not one of ``FUSED_SAMPLING``.
    """
    check_fused_sampling(setting)
    return setting == "on" or (setting == "auto" and vocab_size >= FUSED_MIN_VOCAB)


def check_fused_sampling(setting: str) -> None:
    """Raise ``ValueError`` naming the setting and the accepted values unless ``setting`` is one
    of ``FUSED_SAMPLING``."""
    if setting not in FUSED_SAMPLING:
        raise ValueError(f"generation.fused_sampling {setting!r} is not one of {FUSED_SAMPLING}")


def _noisy_argmax(scaled: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                  term: torch.Tensor) -> torch.Tensor:
    """argmax(scaled + noise) per row: the draw after filtering. [B, V] -> [B] int64."""
    return (scaled + _noise(keys, positions, term)).argmax(dim=-1)


class _FusedDraw:
    """``_noisy_argmax`` through ``torch.compile``, one per process, compiled by ``prepare`` (a
    generate container's pre-warm) or else by the first draw (a decode loop's first draw comes
    before its timed steps; engines that never sample, such as prefill's and greedy
    evaluation's, never compile).

    Compiled for the vocabulary's size with a symbolic batch size (``mark_dynamic``), so one
    compilation serves every batch of a model on a device; one-row draws are padded to two rows,
    since the compiler specialises a size of 1 (a second compilation, seconds, in the middle of
    a decode loop). After a compiler failure (``disable``) every draw runs unfused; running out
    of memory is not a compiler failure and is raised."""

    def __init__(self) -> None:
        self.fn: Callable | None = None
        self.error: str | None = None
        self.lock = threading.Lock()

    def __call__(self, scaled: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                 term: torch.Tensor) -> torch.Tensor:
        # inside a compiled decode step (compile_decode) the outer compilation fuses the draw
        if self.error is not None or torch.compiler.is_compiling():
            return _noisy_argmax(scaled, keys, positions, term)
        rows = scaled.shape[0]
        # contiguous inputs, one row padded to two: other strides or a size of 1 would each be
        # a compilation of their own
        scaled, keys, positions = (torch.cat((t, t)) if rows == 1 else t.contiguous()
                                   for t in (scaled, keys, positions))
        try:
            with self.lock:  # the first call compiles; draws never overlap on one engine anyway
                if self.fn is None:
                    # a compilation per (vocabulary size, device, ...): room for many, since
                    # running out would fail as a compiler failure does, and disable fusion
                    cfg = torch._dynamo.config
                    cfg.recompile_limit = max(cfg.recompile_limit, 64)
                    # the vocabulary's size fixed (a known reduction length), the batch's not
                    self.fn = torch.compile(_noisy_argmax, dynamic=False, fullgraph=True)
            for t in (scaled, keys, positions):
                torch._dynamo.mark_dynamic(t, 0)
            with torch.no_grad():  # a draw never needs gradients, and the grad mode is a guard
                out = self.fn(scaled, keys, positions, term)
        except torch.OutOfMemoryError:
            raise  # the unfused draw needs more memory, not less
        except Exception as exc:  # noqa: BLE001 -- no compiler, or a backend failure: draw unfused
            self.disable(f"{type(exc).__name__}: {str(exc)[:200]}")
            return _noisy_argmax(scaled[:rows], keys[:rows], positions[:rows], term)
        return out[:rows]

    def prepare(self, vocab_size: int, device: torch.device, rows: int = 64) -> None:
        """Compile for draws over ``vocab_size`` entries on ``device`` now (a container's pre-warm,
        off any step's critical path), with inputs that pass the guards real draws pass: distinct
        contiguous tensors, float32 scores. ``rows``: the batch a GPU kernel is tuned for."""
        keys = torch.zeros(rows, dtype=torch.long, device=device)
        positions = torch.zeros(rows, dtype=torch.long, device=device)
        self(torch.zeros(rows, vocab_size, device=device), keys, positions, _vocab_term(vocab_size, device))

    def disable(self, reason: str) -> None:
        """Draw unfused from now on, in this process, after one warning line."""
        if self.error is None:
            self.error = reason
            log.warning("fused sampling is unavailable, drawing tokens unfused (the same tokens): %s", reason)


fused_draw = _FusedDraw()
"""The process's fused draw (``Sampler.fused``)."""


def sample_next(
    logits: torch.Tensor,
    keys: torch.Tensor,
    positions: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    fused: bool = False,
) -> torch.Tensor:
    """Draw one token per row from softmax(logits / temperature), filtered by ``top_k`` and
    ``top_p`` (``filter_logits``). logits [B, V] -> token ids [B] (int64). ``fused``: hash,
    noise and argmax in one compiled kernel (``fused_draw``; the same tokens)."""
    if temperature <= 0.0:
        return logits.argmax(dim=-1)  # the argmax survives any filter
    scaled = logits.float()
    if temperature != 1.0:  # x / 1.0 is x: a pass over [B, V] saved at the usual temperature
        scaled = scaled / temperature
    scaled = filter_logits(scaled, top_k, top_p)
    term = _vocab_term(logits.shape[-1], keys.device)
    return (fused_draw if fused else _noisy_argmax)(scaled, keys, positions, term)


@dataclass(frozen=True)
class Sampler:
    """How a decoder draws tokens: the arguments of ``sample_next`` after its tensors."""

    temperature: float
    """Softmax temperature; 0 is greedy argmax."""
    top_k: int | None = None
    """Keep the k most likely tokens; None or 0: off."""
    top_p: float | None = None
    """Keep the smallest most-likely set with this much probability; None or 1.0: off."""
    fused: bool = False
    """Draw through the compiled kernel (``fused_draw``; ``fused_for`` decides)."""

    def draw(self, logits: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``sample_next`` with these settings: logits [B, V] -> token ids [B]."""
        return sample_next(logits, keys, positions, self.temperature, self.top_k, self.top_p, self.fused)
