"""Speculative decoding on and off, side by side, at the same outputs (2 CPU cores).

Setup (cached in ``--workdir``): the default campaign configuration (repeat task, tiny model
of hidden 96) run for ``--rl-steps`` RL steps after its warm-up, in process. Its commits give
the warmed-up policy (version 0) and the policy after the RL steps (version N).

Workloads, each timed as one ``TorchEngine.generate`` call per step's prompts (8 prompts x 8
samples = 64 rows, 24 new tokens, temperature 1; prefill + decode: the generation phase of one
action), fastest of ``--repeats`` alternating on/off runs, outputs compared token for token:

* ``history``: the default task from the second epoch on. The epoch-1 responses of version 0
  are the drafts; version N generates epoch 2 (another step, so other noise).
* ``prompt_lookup``: the first epoch (no history), drafting from n-grams of prompt + response
  only. The repeat task's answers repeat one letter, so this is a self-quoting workload.
* ``first_epoch``: the first epoch with ``speculation: auto`` and every strategy allowed (no
  history exists yet), and the same on the untrained random-weight policy, where nothing a
  drafter proposes is kept: the selector must turn speculation off (target >= 0.97x).
* ``sweep``: every fixed (strategy, k) on the history workload, against the selector.

Next to each measured speed-up the benchmark prints its workload's ceiling (``spec_ceiling``,
``spec_costs``): the plain run's sequences, every allowed strategy's drafts replayed along
them, and rounds charged by forwards timed here (batch 1-64, width 1-9) plus a plain round's
host work. ``ceiling`` is a bound no choice of draft length per round can beat even knowing
which drafts will be accepted, with drafting and verification free; ``hindsight_schedule`` a
schedule such knowledge allows; the ``engine_`` pair charge speculative rounds what this
engine's rounds cost beyond a plain one. A bar above ``ceiling`` is out of reach on this
machine with these drafts. The forwards timed here are eager ones; where the engine decodes on
CUDA graphs or a compiled step a plain round costs a fraction of one, so those three do not
hold there. ``free_width_ceiling`` does: every round, whatever its width, is charged what the
engine's own plain rounds cost at its batch (``spec_costs.free_width_table``), so a bar above
it is out of reach on this runtime with these drafts for any engine.

Speculation "on" runs on a warm engine (one untimed call first: the cost model and acceptance
rates a warm action container would have). Run:

    nice -n 5 python benchmarks/bench_speculation.py [--workdir /tmp/bench_spec] [--threads 1]

With ``--model-config`` (a Hugging Face config.json, e.g. ``benchmarks/configs/qwen2.5-0.5b.json``)
the same workloads run on a randomly initialised model of that shape on ``--device`` (no
campaign, no download; ``spec_synthetic.py`` builds it): random prompts, no EOS, and a
policy made confident by scaling its logits until the mean top-token probability is
``--confidence`` (a trained policy on a narrow task is confident; a random one is not). Its
"history" is its own responses at other steps (other noise). The random-weight workload uses
the unscaled model. It also prints the cost of a verification forward at each width:

    python3 benchmarks/bench_speculation.py --device cuda --model-config benchmarks/configs/qwen2.5-0.5b.json \
        --new-tokens 64 --calls 2 --repeats 2

Output: JSON lines, each printed (and appended to ``--json``) as soon as it is measured, so a run
cut short keeps what it measured: the workload (with the verification forward's cost, on a
model shape), then one line per workload (``off_s``, ``on_s``, ``speedup``, ``same_outputs``,
``rows_equal``, ``accept_rate``; where the time went per round, ``round_split``; the seconds the
fastest speculative run spent in its decode loops, ``loop_s``, and capturing graphs, ``captures`` and
``capture_s`` (``off_captures`` for the plain run: a warm container captures each bucket and width
once); the engine's cost fit after the run, ``cost_fit``: ``spec_select.ForwardCost``'s c0..c4),
then the ceilings, then
every result in one line; last, one plain-text verdict line per workload.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import spec_costs  # siblings: a script's own directory is on sys.path
import torch
from json_lines import emit

from actions.contracts import ModelRef
from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.factory import make_engine
from actions.engines.speculative import Speculation, make_drafters
from actions.engines.torch_engine import TorchEngine
from actions.models.device import sync
from actions.models.loading import encode, load_model
from actions.tasks.stored import load_dataset

GROUP, PER_STEP, NEW_TOKENS = 8, 8, 24  # NEW_TOKENS: the default of --new-tokens


def _train(workdir: Path, rl_steps: int) -> tuple[ModelRef, ModelRef, list[list[SampleSpec]], object]:
    """(warmed-up policy, policy after the RL steps, prompt batches, tokenizer)."""
    from actions.store import open_store
    from flows.campaign.run import run_campaign
    from flows.campaign.state import load_state_at
    from flows.config import load_config

    store_dir = workdir / "store"
    cfg = load_config(None, [f"store.uri={store_dir}", "invoker.kind=inprocess", f"steps={rl_steps}",
                             "eval_every=0", "run_id=bench-spec", f"invoker.log_dir={workdir / 'logs'}",
                             "generation.speculation=off"])
    store = open_store(cfg.store.uri)
    if load_state_at(store, "bench-spec", rl_steps) is None:
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=120):
            run_campaign(cfg, progress=lambda m: None, resume=(store_dir / "runs").exists())
    refs = []
    for step in (0, rl_steps):
        st = load_state_at(store, "bench-spec", step)
        refs.append(ModelRef(store_uri=cfg.store.uri, base_key=st.prepared.base_key, policy_key=st.policy_key,
                             policy_version=st.policy_version, weights_sha256=st.weights_sha256 or None))
    _, tokenizer, _ = load_model(refs[0])
    data = load_dataset(cfg.store.uri, st.prepared.train_key)
    ids = sorted(data)[: PER_STEP * 4]
    batches = [[SampleSpec(p, i, encode(tokenizer, data[p].prompt)) for p in ids[j:j + PER_STEP] for i in range(GROUP)]
               for j in range(0, len(ids), PER_STEP)]
    return refs[0], refs[1], batches, tokenizer


def _engine(ref: ModelRef) -> TorchEngine:
    model, tokenizer, _ = load_model(ref, fresh=True)
    engine = make_engine("torch", model, tokenizer)
    assert isinstance(engine, TorchEngine)
    return engine


def _history(engine: TorchEngine, batches: list[list[SampleSpec]], new_tokens: int) -> dict[int, list[list[int]]]:
    hist: dict[int, list[list[int]]] = {}
    for step, specs in enumerate(batches):
        params = GenerationParams(seed=0, step=step, max_new_tokens=new_tokens, temperature=1.0)
        outs, _ = engine.generate(specs, params)
        for o in outs:
            hist.setdefault(o.prompt_id, []).append(o.tokens + ([o.stop_token] if o.stop_token is not None else []))
    return hist


def _run(engine, batches, step0: int, spec: Speculation | None, new_tokens: int) -> tuple[float, list, dict]:
    sync(engine.device)
    t0, outs = time.perf_counter(), []
    agg = dict.fromkeys(("proposed", "accepted", "rounds", "spec_rounds", "draft_len_sum", "seconds",
                         "spec_seconds", "decode_steps", "loop_rounds", "plain_calls", "graph_captures",
                         "graph_capture_s"), 0)
    for i, specs in enumerate(batches):
        params = GenerationParams(seed=0, step=step0 + i, max_new_tokens=new_tokens, temperature=1.0)
        o, stats = engine.generate(specs, params, speculation=spec)
        outs.append([(x.prompt_id, x.sample_index, x.tokens, x.finish_reason) for x in o])
        got = {**(stats.spec or {}), "decode_steps": stats.decode_steps, "graph_captures": stats.graph_captures,
               "graph_capture_s": stats.graph_capture_s}
        # the rounds of calls that ran the speculative loop (a call the estimates sent to the plain
        # loop counts its steps as rounds, untimed)
        got["loop_rounds"] = 0 if got.get("plain_calls") else got.get("rounds", 0)
        for k in agg:
            agg[k] += got.get(k, 0)
    sync(engine.device)
    return time.perf_counter() - t0, outs, agg


def compare(engine, batches, step0: int, spec: Speculation, repeats: int, new_tokens: int = NEW_TOKENS,
            guard: bool = False) -> dict:
    """Fastest seconds off and on (alternating), the ratio, and whether outputs are equal
    (``rows_equal``: rows whose tokens and finish reason equal the plain run's, on the last repeat)."""
    # each workload from a fresh container's whole-call rates (``spec_guard``, where graphs run),
    # or without them: the selector's speculation alone
    engine.call_rates, engine.compare_calls = None, guard
    _run(engine, batches[:1], step0, spec, new_tokens)  # warm the engine's estimates (a warm container)
    off, on, same = [], [], True
    for _ in range(repeats):
        t_off, o_off, off_agg = _run(engine, batches, step0, None, new_tokens)
        t_on, o_on, agg = _run(engine, batches, step0, spec, new_tokens)
        off.append((t_off, off_agg))
        on.append((t_on, agg))
        same &= o_off == o_on
    rows = [(a == b) for x, y in zip(o_off, o_on) for a, b in zip(x, y)]
    # The fastest of the repeats: on a shared machine the least-disturbed run is the measurement,
    # and its counters and time split are the ones reported beside it.
    (m_off, off_agg), (m_on, agg) = min(off, key=lambda r: r[0]), min(on, key=lambda r: r[0])
    acc = agg["accepted"] / agg["proposed"] if agg["proposed"] else 0.0
    plain_rounds = agg["loop_rounds"] - agg["spec_rounds"]
    return {"off_s": round(m_off, 3), "on_s": round(m_on, 3), "speedup": round(m_off / m_on, 3),
            "same_outputs": same, "rows_equal": f"{sum(rows)}/{len(rows)}", "accept_rate": round(acc, 3),
            "spec_round_share": round(agg["spec_rounds"] / max(agg["rounds"], 1), 3),
            "plain_calls": agg["plain_calls"],  # calls of the fastest run sent to the plain loop
            # graphs captured inside the fastest timed runs (a warm container has them already):
            # seconds a speed-up pays once per (bucket, width), not per call
            "captures": agg["graph_captures"], "capture_s": round(agg["graph_capture_s"], 3),
            "off_captures": off_agg["graph_captures"], "loop_s": round(agg["seconds"], 3),
            **round_split(m_off, off_agg, agg, plain_rounds), "cost_fit": engine.forward_cost.coefficients()}


def round_split(off_s: float, off_agg: dict, agg: dict, plain_rounds: int) -> dict:
    """Where a speculative run's time goes, per round (ms; None where no such round ran): the
    plain run's seconds per decode step (prefill included), the speculative loop's plain rounds
    and its speculative ones (drafting, verification, read-back and bookkeeping each), and the
    speculative rounds' mean width. The plain run is the alternative a speculative call gives up;
    the loop's plain rounds also draft and are not pipelined (``static_decode``)."""
    def ms(seconds: float, n: int) -> float | None:
        return round(1e3 * seconds / n, 3) if n else None

    spec_n = agg["spec_rounds"]
    return {"off_step_ms": ms(off_s, off_agg["decode_steps"]),
            "loop_plain_round_ms": ms(agg["seconds"] - agg["spec_seconds"], plain_rounds),
            "spec_round_ms": ms(agg["spec_seconds"], spec_n),
            "spec_width": round(1 + agg["draft_len_sum"] / spec_n, 2) if spec_n else None}


BARS = {"history (epoch 2)": 1.5, "prompt_lookup (epoch 1)": 1.2, "first_epoch auto (trained)": 0.97,
        "first_epoch auto (random weights)": 0.97}
"""Each workload's target speed-up (a floor for the first epoch: speculation must not lose)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/bench_spec")
    ap.add_argument("--rl-steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9,
                    help="alternating off/on runs per workload, the fastest of each kept (a run of 4 calls "
                         "takes 0.2-0.4 s on the CPU: with 3, the speed-ups of one workload spread by +-0.2x "
                         "from invocation to invocation)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (actions run with 1)")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="tokens per sample")
    ap.add_argument("--model-config", default=None,
                    help="a Hugging Face config.json: the synthetic workload on a random model of that shape")
    ap.add_argument("--device", default="cpu", help="with --model-config: cpu or cuda[:N]")
    ap.add_argument("--dtype", default=None, help="with --model-config: default bfloat16 on cuda, float32 on cpu")
    # 0.9: on the 0.5B shape its history drafts are then accepted ~0.66 of the time per token, as the
    # default task's trained policy's are on the CPU (docs/results.md)
    ap.add_argument("--confidence", type=float, default=0.9,
                    help="with --model-config: the policy's mean top-token probability (spec_synthetic.py)")
    ap.add_argument("--calls", type=int, default=4, help="generate calls per timed run")
    ap.add_argument("--json", default=None, help="also append every JSON line printed to this file")
    ap.add_argument("--guard", action="store_true",
                    help="keep the engine's whole-call comparison (spec_guard; where graphs run) on, as actions "
                         "run: a bucket whose speculative calls were slower then decodes plainly. Off by "
                         "default: the speed-ups are the selector's speculation")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, dict] = {}
    if args.model_config:
        import spec_synthetic

        device = torch.device(args.device)
        dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
        built = spec_synthetic.build(args.model_config, device, dtype, confidence=args.confidence, calls=args.calls,
                                     group=GROUP, per_call=PER_STEP)
        old = new = built["confident"]
        random_model, batches = built["random"], built["batches"]
        results["workload"] = {"device": str(device), "dtype": str(dtype), "logit_scale": built["logit_scale"],
                               "confidence": built["confidence"], "rows_per_call": len(batches[0]),
                               "calls": len(batches), "new_tokens": args.new_tokens,
                               "verify_forward": spec_synthetic.width_costs(
                                   new.model, (8, 64), (1, 2, 3, 5, 9), context=32 + args.new_tokens // 2)}
        emit({"bench": "speculation", "model_config": args.model_config, "workload": results["workload"]}, args.json)
    else:
        workdir = Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        v0, vn, batches, _ = _train(workdir, args.rl_steps)
        old, new = _engine(v0), _engine(vn)
        random_model = _engine(v0)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in random_model.model.parameters():
                p.normal_(0.0, 0.05)
    hist = _history(old, batches, args.new_tokens)
    step2 = 100  # epoch 2: other steps, so other noise than the drafts had

    def run(engine, spec: Speculation) -> dict:
        return compare(engine, batches, step2, spec, args.repeats, args.new_tokens, args.guard)

    workloads = {"history (epoch 2)": (new, Speculation(history=hist)),
                 "prompt_lookup (epoch 1)": (new, Speculation(strategies=("prompt_lookup",))),
                 "first_epoch auto (trained)": (new, Speculation()),
                 "first_epoch auto (random weights)": (random_model, Speculation())}
    for name, (engine, spec) in workloads.items():
        results[name] = run(engine, spec)
        emit({"bench": "speculation", "model_config": args.model_config, "name": name, "bar": BARS.get(name),
              **results[name]}, args.json)
    context = round(sum(len(s.prompt_tokens) for b in batches for s in b) / sum(map(len, batches))) + args.new_tokens // 2
    forwards = spec_costs.cost_table(new.model, context, Speculation().max_draft_len)
    plain_rounds = {}  # engine -> (round table, seconds outside the rounds, the plain run's sequences, free-width table)
    for name, (engine, spec) in workloads.items():
        if engine not in plain_rounds:
            plain_rounds[engine] = spec_costs.round_table(engine, batches, step2, forwards, args.new_tokens)
        table, rest, seqs, free = plain_rounds[engine]
        extra = spec_costs.speculative_overhead(engine, batches, step2, spec, table, args.new_tokens)
        bound = spec_costs.ceiling(batches, spec, table, extra, rest, seqs, args.new_tokens, free)
        if len(make_drafters(spec)) > 1:  # what each strategy's drafts alone could give
            bound["ceiling_by_strategy"] = {
                s: spec_costs.ceiling(batches, replace(spec, strategies=(s,)), table, extra, rest, seqs,
                                      args.new_tokens)["ceiling"] for s in make_drafters(spec)}
        results[name].update(bound)
        emit({"bench": "speculation_ceiling", "model_config": args.model_config, "name": name, **bound}, args.json)
    for label, table in (("forward_table_ms", forwards), ("round_table_ms", plain_rounds[new][0]),
                         ("free_width_table_ms", plain_rounds[new][3])):
        results[label] = {f"b{b}": [round(1e3 * table[(b, w)], 2) for w in range(1, 10)]
                          for b in sorted({b for b, _ in forwards})}
    if not args.no_sweep:
        sweep = {}
        for strategy in ("history", "prompt_lookup"):
            for k in (1, 2, 4, 8):
                sweep[f"{strategy}:{k}"] = run(new, Speculation(history=hist, fixed=(strategy, k)))
                emit({"bench": "speculation_sweep", "model_config": args.model_config, "fixed": f"{strategy}:{k}",
                      **sweep[f"{strategy}:{k}"]}, args.json)
        # Speed-ups, each against its own interleaved plain runs: the load of a shared machine
        # drifts over the minutes a sweep takes, so absolute seconds are not comparable.
        best = max(sweep, key=lambda s: sweep[s]["speedup"])
        sel = results["history (epoch 2)"]
        results["sweep"] = {"best_fixed": best, "best_fixed_speedup": sweep[best]["speedup"],
                            "selector_speedup": sel["speedup"],
                            "selector_vs_best": round(sel["speedup"] / sweep[best]["speedup"], 3),
                            "all": {k: v["speedup"] for k, v in sweep.items()}}
    emit({"bench": "speculation_all", "model_config": args.model_config, **results}, args.json)
    for name, bar in BARS.items():
        r = results[name]
        verdict = ("out of reach on this runtime with these drafts, whatever a verification costs"
                   if r["free_width_ceiling"] < bar else
                   "out of reach on this machine with these drafts" if r["ceiling"] < bar else
                   "out of reach for this engine's speculative rounds" if r["engine_ceiling"] < bar else "within reach")
        print(f"{name}: measured {r['speedup']}x, ceiling {r['ceiling']}x vs bar {bar}x (hindsight schedule "
              f"{r['hindsight_schedule']}x; with this engine's round overhead {r['engine_ceiling']}x, "
              f"schedule {r['engine_hindsight']}x; every width at a plain round's cost "
              f"{r['free_width_ceiling']}x): {verdict}")

if __name__ == "__main__":
    main()
