"""A floor on the generation phases of a trace when the bill is capped: plans without cuts only.

``bound.phase_floor`` ignores cost: a step at its floor decodes every long sample alone. This
module adds a budget of GPU-seconds over the trace (static:3's, for the issue's bar) and gives
the smallest total phase time any plan *without cut-and-migrate* could have within it (the
default ``budget`` objective does not cut; static:N and round-robin:N never do). It uses the
simulator's own charges (``timeline`` start-ups, the profile's TPOT grid) and three facts:

1. Memory envelope (``tpot_envelope``): ``TPOT(b, c) >= m + kappa * b * c`` on the profile's
   grid (the roofline's weight read plus KV read; compute only adds). The grid is read with
   bilinear interpolation, which reproduces a bilinear function exactly, so an envelope that
   holds at the grid points holds between them. Beyond the grid it is not claimed: a step whose
   batch or context could leave the grid gets no bound.
2. Under it, an actor that decodes samples of lengths l_s after prompts p_s spends at least
   ``m * L + kappa * K`` seconds decoding, with L its longest sample and
   ``K = sum_s l_s * (p_s + (l_s + 1) / 2)`` (the simulator's midpoint charge summed over its
   segments telescopes to this). Without cuts a prompt's samples stay on one actor.
3. Counting actors by level: if every actor ends within T' of the earliest start, the actors
   whose longest sample reaches l (they hold every group reaching l, KV work K_l) number at
   least ``ceil(kappa * K_l / (T' - m * l))``, and the decode steps billed over all actors are
   ``sum_a L_a = sum_l N_l``. So a serverless plan ending by T bills at least
   ``prefill GPUs x P + g * (m * sum_l N_l + kappa * K) + g * (N_1 - co-located) x
   (the wait of a remote actor's transfers)`` (``serverless_bill_floor``). A serverful plan of
   N actors bills N * g * T and cannot end before ``start + max_l (m * l + kappa * K_l / N)``.

Across steps the cap is on the total, so the floor is a Lagrangian dual (weak duality): for any
price mu >= 0 of a GPU-second, the optimum is at least ``sum over steps of min over plans of
(T + mu * GPU-s) - mu * budget``; the per-step minimum is taken on a grid of T (a plan ending in
[T_j, T_j+1] costs at least T_j + mu * bill floor(T_j+1)), and the best mu is kept.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from flows.planning.timeline import actor_start, prefill_seconds
from flows.planning.tpot import TpotProfile
from flows.simulate.bound import phase_floor
from flows.simulate.policies import ClusterModel, serverful_ready_s
from flows.simulate.replay import TraceStep

_T_GRID = tuple(1.005 ** j for j in range(141))  # T / the step's floor: 1.0 .. ~2.0
_PRICES = (0.0,) + tuple(10 ** (k / 20) for k in range(-80, 41))  # mu, per GPU-s: 1e-4 .. 100


class Envelope(NamedTuple):
    """``TPOT(b, c) >= m_s + kappa_s * b * c`` for 1 <= b <= max_batch, 0 <= c <= max_context."""

    m_s: float
    kappa_s: float
    max_batch: float
    max_context: float


def tpot_envelope(profile: TpotProfile) -> Envelope | None:
    """The largest memory envelope the grid supports: m = the smallest step at the grid's
    first context, kappa the smallest slope over b * c left above it at every grid point. None
    when the grid does not start at batch 1 and context 0 (the envelope would rest on
    extrapolated values)."""
    bs, cs, grid = profile.batch_sizes, profile.contexts, profile.seconds
    if bs[0] > 1 or cs[0] > 0:
        return None
    m = min(row[0] for row in grid)
    slopes = [(v - m) / (b * c) for b, row in zip(bs, grid) for c, v in zip(cs, row) if c > 0]
    return Envelope(m, max(0.0, min(slopes)), bs[-1], cs[-1])


class StepTerms(NamedTuple):
    """What the bill floor of one step needs. ``levels``: (length l, kappa * K_l) at each
    distinct group length, l descending; ``work_at[l - 1]``: kappa * K_l for l = 1..L."""

    levels: tuple[tuple[int, float], ...]
    work_at: np.ndarray
    kv_work_s: float  # kappa * K over every sample
    prefill_gpu_s: float  # the prefill actor's bill, every serverless plan pays it
    first_ready_s: float  # no serverless actor decodes earlier
    remote_wait_s: float  # billed seconds a remote actor waits for its transfers, at least
    colocated: int
    serverless_floor_s: float
    serverful_floor_s: float
    serverful_start_s: float  # no serverful actor decodes earlier


def step_terms(step: TraceStep, model: ClusterModel, env: Envelope) -> StepTerms | None:
    """The step's terms, or None when its batch or context could leave the envelope's grid."""
    samples = sum(len(r.response_lens) for r in step.prompts)
    longest_context = max(r.prompt_len + max(r.response_lens) for r in step.prompts) + 1  # + midpoint
    if samples > env.max_batch or longest_context > env.max_context:
        return None
    groups = sorted(((max(r.response_lens), env.kappa_s * sum(n * (r.prompt_len + (n + 1) / 2)
                                                                for n in r.response_lens))
                     for r in step.prompts), reverse=True)
    levels, acc = [], 0.0
    for length, work in groups:
        acc += work
        if levels and levels[-1][0] == length:
            levels[-1] = (length, acc)
        else:
            levels.append((length, acc))
    work_at = np.zeros(levels[0][0])
    for length, work in levels:  # longest first: each shorter level overwrites the lengths it reaches
        work_at[:length] = work
    cluster, profile = model.cluster_spec(), model.profile
    prefill_s = prefill_seconds(sum(r.prompt_len for r in step.prompts), profile, cluster)
    remote = actor_start(cluster.colocated_actors, cluster, prefill_s, 0.0)
    floor = phase_floor(step, model)
    return StepTerms(tuple(levels), work_at, acc, prefill_s * cluster.prefill_gpus,
                     actor_start(0, cluster, prefill_s, 0.0).ready_s,
                     remote.ready_s - remote.invoked_s + remote.prewarm_idle_s, cluster.colocated_actors,
                     floor.serverless_s, floor.serverful_s,
                     serverful_ready_s(min(r.prompt_len for r in step.prompts), profile))


def serverless_bill_floor(terms: StepTerms, env: Envelope, model: ClusterModel,
                          times_s: Sequence[float]) -> np.ndarray:
    """GPU-s below which no serverless plan without cuts ends the step by each of ``times_s``
    (fact 3 of the module docstring); inf where none can. Shape: ``[len(times_s)]``."""
    lengths = np.arange(1, len(terms.work_at) + 1)  # [L]
    room = np.asarray(times_s, dtype=float)[:, None] - terms.first_ready_s - env.m_s * lengths  # [T, L]
    with np.errstate(divide="ignore", invalid="ignore"):
        counts = np.maximum(1.0, np.ceil(terms.work_at / room - 1e-12))
    feasible = (room > 0).all(axis=1) & (counts.max(axis=1, initial=1.0) <= model.max_actors)
    remote = np.maximum(0.0, counts.max(axis=1, initial=1.0) - terms.colocated)
    bill = (terms.prefill_gpu_s + model.gpus_per_actor
            * (env.m_s * counts.sum(axis=1) + terms.kv_work_s + remote * terms.remote_wait_s))
    return np.where(feasible, bill, math.inf)


def serverful_time_floor(terms: StepTerms, env: Envelope, num_actors: int) -> float:
    """Seconds before which no serverful plan of ``num_actors`` actors ends the step."""
    decode = max(env.m_s * length + work / num_actors for length, work in terms.levels)
    return max(terms.serverful_floor_s, terms.serverful_start_s + decode)


def capped_time_floor(steps: Sequence[TraceStep], model: ClusterModel, budget_gpu_s: float) -> float | None:
    """Total generation-phase seconds below which no plan without cuts runs ``steps`` while
    billing at most ``budget_gpu_s`` GPU-s over them (module docstring); None when the
    profile or a step leaves the envelope's grid."""
    env = tpot_envelope(model.profile)
    if env is None:
        return None
    every = [step_terms(step, model, env) for step in steps]
    if any(t is None for t in every):
        return None
    g = model.gpus_per_actor
    per_step = []  # (serverless (T, bill floor) grid, serverful (T, bill) options)
    for t in every:
        times = [t.serverless_floor_s * x for x in _T_GRID]
        grid = list(zip(times, serverless_bill_floor(t, env, model, times).tolist()))
        unbounded = t.prefill_gpu_s + g * (env.m_s * t.levels[0][0] + t.kv_work_s)  # the bill floor as T grows
        fixed = [(serverful_time_floor(t, env, n), n * g) for n in range(1, model.max_actors + 1)]
        per_step.append((grid, unbounded, fixed))
    best = 0.0
    for mu in _PRICES:
        total = -mu * budget_gpu_s
        for grid, unbounded, fixed in per_step:
            # a plan ending in [lo, hi] bills at least the floor at hi (inf: none ends by hi)
            serverless = min([lo + mu * bill if bill < math.inf else math.inf
                              for (lo, _), (_, bill) in zip(grid, grid[1:])]
                             + [grid[-1][0] + mu * unbounded])
            serverful = min(time_s * (1 + mu * gpus) for time_s, gpus in fixed)
            total += min(serverless, serverful)
        best = max(best, total)
    return best
