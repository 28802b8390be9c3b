"""Planning latency of the cost-aware planner (paper §4.7: scheduling overhead <= 30 ms).

Sweeps N in [1, 64] for 512 prompts (4 samples each) with the roofline TPOT profile of
Qwen2.5-7B on 2 x H100 and prints the median, p90 and max wall time over repeats against the
project target of at most 10 ms per planning call. The first call on a new profile grid also
builds the cached TPOT table (flows/planning/cost.py) and is reported separately (once per
profile and process); the verdict counts it: every call, first included, within 10 ms. The
ranked planner is timed under the live default (objective ``value``, no measured error) and
under the simulator's (``budget`` with a measured prediction error, ``robust.TailModel``). Then
the first epoch's length prediction for 512 unseen prompts (once per step, before planning;
``first_epoch: learned`` fits the observed prompts, ``reference`` is the paper's rule).

    .venv/bin/python benchmarks/bench_planner.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from flows.planning import cost
from flows.planning.lengths import FIRST_EPOCH_PREDICTORS, LengthHistory, predict_lengths
from flows.planning.plan import ClusterSpec
from flows.planning.robust import MeasuredError
from flows.planning.scaling import plan_generation
from flows.planning.settings import PlannerSettings
from flows.planning.tpot import GPUS, MODELS, roofline_profile

TARGET_MS = 10.0


def workload(num_prompts: int, seed: int = 0) -> tuple[list[int], dict[int, float], dict[int, int]]:
    """Long-tailed response lengths (lognormal, capped at 2048) like the shared traces."""
    rng = random.Random(seed)
    ids = list(range(num_prompts))
    predicted = {i: float(min(2048, int(rng.lognormvariate(5.6, 0.6)))) for i in ids}
    prompt_lengths = {i: rng.randint(30, 700) for i in ids}
    return ids, predicted, prompt_lengths


def measured_error(num_groups: int = 256, seed: int = 2) -> MeasuredError:
    """Prediction errors like two steps of the traces' later epochs (log sd ~0.2, capped)."""
    rng = random.Random(seed)
    return MeasuredError.of([500.0] * num_groups,
                            [500.0 * rng.lognormvariate(0.0, 0.2) for _ in range(num_groups)], 2048.0)


def time_plans(assignment: str, repeats: int, objective: str = "value",
               tail_error: MeasuredError | None = None) -> tuple[float, list[float], int]:
    """(first call ms, later calls ms, chosen N); ``objective`` and ``tail_error`` as the
    planner is told them (the simulator's default: 'budget' with a measured error)."""
    cost._TABLES.clear()  # a cold first call for each assignment: the table is built again
    model = MODELS["qwen2.5-7b"]
    profile = roofline_profile(GPUS["h100"], model, 2)
    cluster = ClusterSpec(gpus_per_actor=2, max_actors=80, num_warm_actors=80,
                          weight_bytes=model.weight_bytes,
                          kv_bytes_per_token=model.kv_bytes_per_token,
                          transfer_bandwidth_bytes_per_s=80e9, num_prefill_gpus=8)
    ids, predicted, prompt_lengths = workload(512)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        plan = plan_generation(ids, predicted, group_size=4, prompt_lengths=prompt_lengths,
                               settings=PlannerSettings(policy="cost_aware", n_min=1, n_max=64, lam=0.7,
                                                        assignment=assignment, profile=profile, cluster=cluster,
                                                        objective=objective, tail_error=tail_error))
        times.append((time.perf_counter() - start) * 1e3)
        assert len({c.n for c in plan.candidates}) == 64
    return times[0], times[1:], plan.num_actors


def time_predictions(num_seen: int, repeats: int, first_epoch: str) -> list[float]:
    """Wall ms of predicting 512 unseen prompts (the first epoch's call, made once per step
    before planning) from a history of ``num_seen`` observed prompts."""
    rng = random.Random(1)
    history = LengthHistory()
    for pid in range(num_seen):
        ref = rng.randint(20, 800)
        top = min(2048, int(ref * 1.8 * rng.lognormvariate(0.0, 0.3)))
        history.record(pid, 0, [top], ref, rng.randint(30, 700))
    new = {num_seen + k: rng.randint(20, 800) for k in range(512)}
    prompts = {pid: rng.randint(30, 700) for pid in new}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        predict_lengths(history, list(new), new, max_length=2048, first_epoch=first_epoch,
                        prompt_lengths=prompts)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def repeats(text: str) -> int:
    """``--repeats``: a whole number >= 2 (a median and p90 need two timed calls)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number >= 2 (timed calls per path; "
                                         "the p90 needs at least two), e.g. --repeats 30")
    return value


def p90(times: list[float]) -> float:
    """The 90th percentile of ``times`` (>= 2 values), interpolated between them (the inclusive
    method: never above the largest, as the exclusive one is with few values)."""
    return statistics.quantiles(times, n=10, method="inclusive")[-1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=repeats, default=30, metavar="R",
                        help="timed calls per path after the first (at least 2; default %(default)s)")
    args = parser.parse_args(argv)
    print(f"planner: 512 prompts x 4 samples, N in [1, 64], target <= {TARGET_MS:.0f} ms per call")
    paths = {"ranked": ("ranked", "value", None), "round_robin": ("round_robin", "value", None),
             "ranked, budget, measured error": ("ranked", "budget", measured_error())}
    for label, (assignment, objective, error) in paths.items():
        first, times, chosen = time_plans(assignment, args.repeats, objective, error)
        median = statistics.median(times)
        verdict = "PASS" if max(first, *times) <= TARGET_MS else "FAIL"
        print(f"  {label:<12} first call {first:6.2f} ms | median {median:6.2f} ms | "
              f"p90 {p90(times):6.2f} ms | max {max(times):6.2f} ms over {len(times)} | "
              f"chosen N={chosen} | every call {verdict}")
    for seen in (512, 7473):  # one trace's prompts; GSM8K's training set
        for first_epoch in FIRST_EPOCH_PREDICTORS:
            times = time_predictions(seen, args.repeats, first_epoch)
            print(f"  prediction of 512 unseen prompts, {first_epoch:<9} from {seen:>5} seen: "
                  f"median {statistics.median(times):5.2f} ms | max {max(times):5.2f} ms")


if __name__ == "__main__":
    main()
