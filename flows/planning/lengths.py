"""Per-prompt response-length history and prediction (paper §3.2).

RLHF revisits the same prompt set every epoch, so the length a prompt produced last epoch
predicts its next one (paper: ~70% of prompts change by <= 50 tokens between epochs). Only the
ranking matters: the planner sorts prompts by it (§3.3).

- Observed length of a GRPO group = **max** over its n samples [I]. The paper does not say
  max or mean; the group's samples run on one actor and the actor finishes with its longest
  sample, so the max is what sets the actor's time and what straggler control needs.
- Prediction = EWMA over the last ``window`` observed epochs, oldest to newest, with the usual
  span smoothing ``alpha = 2 / (window + 1)`` and weights renormalised over the finite window:
  ``pred = sum_k alpha (1-alpha)^k v_{-1-k} / sum_k alpha (1-alpha)^k``. ``window = 1`` (the
  paper's default) is the last observed value.
- No history (first epoch): the reference answer's length [P §3.2], scaled by what the
  prompts already observed say of references: ``sum(observed) / sum(reference)`` over every
  prompt recorded with its reference length (their latest group max; 1.0 before any). The
  scale leaves the ranking as it is; it is there for the planner's time estimates, which need
  tokens: on a trace of code answers (lcb) responses ran about twice their references, and
  slices balanced on unscaled references under-counted the long groups' KV reads.
- ``first_epoch="learned"``: a prompt without history is predicted by the fit of
  ``first_epoch.py`` (reference and prompt length against the group max of the prompts seen so
  far, censored at the cap), falling back to the scaled reference above while the fit has too
  few observations.
- ``rank_correlation`` (Spearman, ties get their average rank) is the prediction-quality
  metric: 1.0 means a perfect ranking, which is all the planner needs.

The history is plain data (JSON round-trippable via ``to_dict``/``from_dict``); where it is
stored (object store, campaign state) is the caller's business.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from flows.planning.first_epoch import fit_lengths, predict_group_max

FIRST_EPOCH_PREDICTORS = ("reference", "learned")


@dataclass
class LengthHistory:
    """prompt_id -> [(epoch, observed length)], sorted by epoch, one entry per epoch."""

    observations: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    references: dict[int, float] = field(default_factory=dict)
    """prompt_id -> reference answer length (tokens), for the first-epoch scale."""
    prompt_lengths: dict[int, float] = field(default_factory=dict)
    """prompt_id -> prompt length (tokens), a feature of the learned first-epoch fit."""

    def record(self, prompt_id: int, epoch: int, response_lens: Sequence[int],
               reference_length: float | None = None, prompt_length: float | None = None,
               keep: int | None = None) -> None:
        """Store the group's max length for ``epoch``; recording an epoch again replaces it
        (a replayed step must not count twice). ``reference_length`` and ``prompt_length``
        (tokens): the prompt's features, which calibrate predictions of prompts not seen yet.
        ``keep``: the prompt's most recent epochs kept (None: all); predictions read the last
        ``window`` only, so a campaign keeps its history bounded with ``keep >= window``."""
        if not response_lens:
            raise ValueError(f"response_lens for prompt {prompt_id}: empty; pass the "
                             "length of every sample of the group")
        if keep is not None and keep < 1:
            raise ValueError(f"keep={keep}: keep at least the latest epoch (>= 1), or None for all")
        entries = self.observations.setdefault(int(prompt_id), [])
        entries[:] = [e for e in entries if e[0] != epoch]
        insort(entries, (int(epoch), float(max(response_lens))))
        if keep is not None:
            del entries[:-keep]
        if reference_length is not None and reference_length > 0:
            self.references[int(prompt_id)] = float(reference_length)
        if prompt_length is not None and prompt_length > 0:
            self.prompt_lengths[int(prompt_id)] = float(prompt_length)

    def fit_observations(self) -> tuple[list[float], list[float | None], list[float]]:
        """(reference length, prompt length or None, latest group max) of every prompt
        recorded with a reference length, as columns in prompt-id order (the learned
        first-epoch fit's data, ``first_epoch.fit_lengths``)."""
        refs: list[float] = []
        prompts: list[float | None] = []
        maxes: list[float] = []
        for pid, ref in sorted(self.references.items()):
            entries = self.observations.get(pid)
            if entries:
                refs.append(ref)
                prompts.append(self.prompt_lengths.get(pid))
                maxes.append(entries[-1][1])
        return refs, prompts, maxes

    def reference_scale(self) -> float:
        """Observed group max per reference token over the prompts recorded with a reference
        (latest observation each); 1.0 when there are none."""
        observed = reference = 0.0
        for pid, ref in sorted(self.references.items()):  # in prompt order: the sum is the same however recorded
            entries = self.observations.get(pid)
            if entries:
                observed += entries[-1][1]
                reference += ref
        return observed / reference if reference > 0 and observed > 0 else 1.0

    def last(self, prompt_id: int, window: int) -> list[float]:
        """The last ``window`` observed lengths, oldest first (empty when unseen)."""
        return [v for _, v in self.observations.get(prompt_id, [])[-window:]]

    def to_dict(self) -> dict:
        return {"observations": {str(pid): [[e, v] for e, v in entries]
                                 for pid, entries in sorted(self.observations.items())},
                "references": {str(pid): v for pid, v in sorted(self.references.items())},
                "prompt_lengths": {str(pid): v for pid, v in sorted(self.prompt_lengths.items())}}

    @classmethod
    def from_dict(cls, data: Mapping) -> "LengthHistory":
        obs = {int(pid): [(int(e), float(v)) for e, v in entries]
               for pid, entries in data.get("observations", {}).items()}
        refs = {int(pid): float(v) for pid, v in data.get("references", {}).items()}
        prompts = {int(pid): float(v) for pid, v in data.get("prompt_lengths", {}).items()}
        return cls({pid: sorted(entries) for pid, entries in obs.items()}, refs, prompts)


def ewma(values: Sequence[float]) -> float:
    """EWMA of ``values`` (oldest first) with span ``len(values)``, normalised weights."""
    alpha = 2.0 / (len(values) + 1)
    weights = [alpha * (1 - alpha) ** k for k in range(len(values))]  # k = 0 is newest
    newest_first = list(reversed(values))
    return sum(w * v for w, v in zip(weights, newest_first)) / sum(weights)


def predict_lengths(history: LengthHistory, prompt_ids: Sequence[int],
                    reference_lengths: Mapping[int, int], window: int = 1,
                    max_length: float | None = None, first_epoch: str = "reference",
                    prompt_lengths: Mapping[int, int] | None = None) -> dict[int, float]:
    """Predicted response length (tokens) per prompt id.

    Args:
        history: observed group lengths of past epochs.
        prompt_ids: prompts of this step.
        reference_lengths: prompt id -> token length of the dataset's reference answer, used
            (times ``history.reference_scale()``) when a prompt has no history.
        window: number of most recent epochs in the EWMA (1 = last value).
        max_length: the generation cap (``max_new_tokens``): no response runs longer, so no
            prediction is larger (a scaled reference can be). None: uncapped.
        first_epoch: 'reference' (the paper's rule, scaled) or 'learned' (``first_epoch.py``,
            with the paper's rule as its fallback) for prompts without history.
        prompt_lengths: prompt id -> prompt tokens, a feature of the learned fit (optional).
    """
    if window < 1:
        raise ValueError(f"lengths.window={window}: must be >= 1 (1 = last epoch only)")
    if first_epoch not in FIRST_EPOCH_PREDICTORS:
        raise ValueError(f"first_epoch={first_epoch!r}: use one of {FIRST_EPOCH_PREDICTORS}")
    out: dict[int, float] = {}
    scale = fit = None
    fitted = first_epoch != "learned"  # nothing to fit for the paper's rule
    for pid in prompt_ids:
        past = history.last(pid, window)
        if past:
            out[pid] = ewma(past)
        elif pid in reference_lengths:
            if not fitted:  # once per call, and only when some prompt is new
                fit, fitted = fit_lengths(*history.fit_observations(), cap=max_length), True
            if fit is not None and reference_lengths[pid] > 0:
                out[pid] = predict_group_max(fit, float(reference_lengths[pid]),
                                             (prompt_lengths or {}).get(pid), max_length)
            else:
                if scale is None:
                    scale = history.reference_scale()
                out[pid] = float(reference_lengths[pid]) * scale
        else:
            raise ValueError(f"reference_lengths: no entry for prompt {pid} and no history; "
                             "pass the reference answer length of every prompt")
        if max_length is not None:
            out[pid] = min(out[pid], float(max_length))
    return out


def _average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def rank_correlation(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Spearman rank correlation; 0.0 when undefined (fewer than 2 values or a constant side)."""
    if len(predicted) != len(actual):
        raise ValueError(f"rank_correlation: {len(predicted)} predicted vs {len(actual)} "
                         "actual values; pass one of each per prompt")
    if len(predicted) < 2:
        return 0.0
    rp, ra = _average_ranks(predicted), _average_ranks(actual)
    mp, ma = sum(rp) / len(rp), sum(ra) / len(ra)
    cov = sum((p - mp) * (a - ma) for p, a in zip(rp, ra))
    vp = sum((p - mp) ** 2 for p in rp)
    va = sum((a - ma) ** 2 for a in ra)
    if vp == 0 or va == 0:
        return 0.0
    return cov / (vp * va) ** 0.5
