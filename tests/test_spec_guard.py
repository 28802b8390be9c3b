"""Whole speculative calls against plain ones (``actions/engines/spec_guard.py``): the decisions,
and the engine's use of them where its plain loop is pipelined (CUDA graphs)."""

from __future__ import annotations

from cuda_graph_emulator import emulated_cuda_graphs
from test_speculative import _setup

from actions.engines.base import EngineStats, GenerationParams, SampleSpec
from actions.engines.spec_guard import CallRates
from actions.engines.speculative import Speculation
from actions.engines.static_decode import bucket_for

PARAMS = GenerationParams(seed=3, step=1, max_new_tokens=12, temperature=1.0)


def test_a_bucket_speculates_until_measured_then_measures_plain_once():
    rates = CallRates()
    assert rates.verdict(64) == "speculate"  # nothing measured
    rates.record(64, True, 1.0, 100)
    assert rates.verdict(64) == "measure" and rates.verdict(8) == "speculate"  # buckets apart
    rates.record(64, False, 1.0, 100)
    assert rates.verdict(64) == "speculate"  # equal: speculation did not lose


def _calls(rates: CallRates, n: int, spec_s: float, plain_s: float = 1.0) -> list[str]:
    """``n`` calls of bucket 64 as the engine makes them: each runs what ``verdict`` says and is
    recorded (100 new tokens)."""
    seen = []
    for _ in range(n):
        v = rates.verdict(64)
        rates.record(64, v == "speculate", spec_s if v == "speculate" else plain_s, 100)
        seen.append(v)
    return seen


def test_slower_speculation_runs_plain_and_rechecks_less_often_while_it_stays_slower():
    rates = CallRates(recheck=4, recheck_max=8)
    rates.record(64, False, 1.0, 100)
    rates.record(64, True, 2.0, 100)
    assert rates.verdict(64) == rates.verdict(64) == "plain"  # asking changes nothing
    seen = _calls(rates, 28, spec_s=2.0)
    speculated = [i for i, v in enumerate(seen) if v == "speculate"]
    assert speculated == [3, 11, 19, 27] and set(seen) == {"plain", "speculate"}, seen  # waits 4, 8, 8 (the cap)
    rates.record(64, True, 0.05, 100)  # a recheck that paid: the decayed mean falls within the margin
    assert not rates.slower(64)
    assert _calls(rates, 3, spec_s=0.9) == ["speculate"] * 3
    rates.record(64, True, 4.0, 100)  # slower again: the wait starts over from ``recheck``
    assert _calls(rates, 4, spec_s=4.0) == ["plain"] * 3 + ["speculate"]


def test_plain_calls_for_other_reasons_count_towards_a_recheck():
    """A call the engine decodes plainly for another reason (the selector's estimates) is
    recorded as plain and counts as one of the wait's calls; asking the verdict alone does not."""
    rates = CallRates(recheck=4)
    rates.record(64, False, 1.0, 100)
    rates.record(64, True, 2.0, 100)
    for _ in range(3):
        assert rates.verdict(64) == "plain"
        rates.record(64, False, 1.0, 100)
    assert rates.verdict(64) == "speculate"


def test_the_margin_and_the_decayed_means():
    rates = CallRates(margin=0.1, decay=0.5)
    rates.record(1, False, 1.0, 100)
    rates.record(1, True, 1.05, 100)  # 5% slower: within the margin
    assert not rates.slower(1)
    rates.record(1, True, 1.35, 100)  # mean 0.5 * 0.0105 + 0.5 * 0.0135 = 0.012: 20% slower
    assert rates.spec[1] == 0.012 and rates.slower(1)
    rates.record(1, True, 5.0, 0)  # no tokens, nothing learnt
    rates.record(1, True, 0.0, 10)
    assert rates.spec[1] == 0.012


def _engine():
    return _setup(0)  # a tiny Llama's engine and 15 rows


def _key(outs):
    return [(o.prompt_id, o.sample_index, o.tokens, o.finish_reason) for o in outs]


def test_the_engine_consults_the_rates_only_where_its_plain_loop_is_pipelined(monkeypatch):
    """On the CPU the engine keeps no rates (its plain loop runs each step before the next):
    speculative calls go to the selector as before. Where it replays graphs (emulated here) it
    makes them on first use, and a call that speculated is recorded."""
    engine, specs = _engine()
    assert not engine.graphs
    _, stats = engine.generate(specs, PARAMS, speculation=Speculation(strategies=("prompt_lookup",)))
    assert stats.spec["plain_calls"] == 0 and engine.call_rates is None  # a first call probes the strategy
    emulated_cuda_graphs(monkeypatch)
    engine, specs = _engine()
    engine.graphs = engine.pad_batches = True
    plain, _ = engine.generate(specs, PARAMS)
    out, stats = engine.generate(specs, PARAMS, speculation=Speculation(strategies=("prompt_lookup",)))
    assert _key(out) == _key(plain) and stats.kv_cache == "static+graphs" and stats.spec["plain_calls"] == 0
    assert engine.call_rates is not None and set(engine.call_rates.spec) == {bucket_for(len(specs))}
    assert not engine.call_rates.plain  # a call not asked to speculate is not the plain side
    engine.call_rates, engine.compare_calls = None, False  # benchmarks of the selector alone
    engine.generate(specs, PARAMS, speculation=Speculation(strategies=("prompt_lookup",)))
    assert engine.call_rates is None


def test_the_engine_decodes_plainly_where_speculative_calls_were_slower_and_records_every_call(monkeypatch):
    """With the rates of a graph-replaying engine: a call asked to speculate whose bucket's
    speculative calls ran slower decodes plainly (the same tokens, counted as a plain call) and
    its time is recorded as plain; a fixed choice (benchmarks) bypasses the rates and records
    nothing; a call that speculates records its time as speculative."""
    engine, specs = _engine()
    bucket = bucket_for(len(specs))
    engine.call_rates = rates = CallRates()
    plain, _ = engine.generate(specs, PARAMS)
    assert not rates.plain and not rates.spec  # not asked to speculate: not compared
    # the selector's own estimates decide past the rates (and here they would not pay): kept
    # out, so that every plain call below is the rates' decision
    monkeypatch.setattr(engine, "_skip_speculation", lambda *_: False)
    spec = Speculation(strategies=("prompt_lookup",))
    _, stats = engine.generate(specs, PARAMS, speculation=spec)  # nothing measured: speculates
    assert stats.spec["plain_calls"] == 0 and set(rates.spec) == {bucket} and not rates.plain
    out, stats = engine.generate(specs, PARAMS, speculation=spec)  # "measure": one plain call
    assert _key(out) == _key(plain) and stats.spec["plain_calls"] == 1 and set(rates.plain) == {bucket}
    rates.spec[bucket] = 10 * rates.plain[bucket]  # speculative calls far slower
    before = rates.plain[bucket]
    out, stats = engine.generate(specs, PARAMS, speculation=spec)
    assert _key(out) == _key(plain) and stats.spec["plain_calls"] == 1 and stats.spec["spec_rounds"] == 0
    assert rates.plain[bucket] != before  # the plain call's time was recorded
    slow = rates.spec[bucket]
    _, stats = engine.generate(specs, PARAMS, speculation=Speculation(strategies=("prompt_lookup",),
                                                                     fixed=("prompt_lookup", 2)))
    assert stats.spec["spec_rounds"] > 0 and rates.spec[bucket] == slow  # fixed: neither asked nor told
    rates.spec[bucket] = rates.plain[bucket] / 10  # speculative calls far faster
    _, stats = engine.generate(specs, PARAMS, speculation=spec)
    assert stats.spec["plain_calls"] == 0 and rates.spec[bucket] != rates.plain[bucket] / 10


def test_graph_captures_are_left_out_of_a_calls_time():
    """A capture (with any compilation inside it) is paid once per warm container and shape:
    the call's recorded seconds leave it out."""
    engine, specs = _engine()
    engine.call_rates = rates = CallRates()
    outs, _ = engine.generate(specs, PARAMS)
    tokens = sum(len(o.tokens) for o in outs)
    engine._record_call(specs, outs, True, 1.0, EngineStats(graph_capture_s=0.75))
    assert rates.spec[bucket_for(len(specs))] == 0.25 / tokens


def test_a_continuation_counts_only_the_tokens_it_drew():
    """Continuations (cut rows resumed elsewhere) return their earlier tokens too: a call's
    rate counts only the tokens drawn in it."""
    engine, specs = _engine()
    engine.call_rates = rates = CallRates()
    first, _ = engine.generate(specs, PARAMS)
    cont = [SampleSpec(o.prompt_id, o.sample_index, s.prompt_tokens, tuple(o.tokens[:3]))
            for s, o in zip(specs, first)]
    outs, _ = engine.generate(cont, PARAMS)
    drawn = sum(len(o.tokens) for o in outs) - sum(len(c.generated) for c in cont)
    assert 0 < drawn < sum(len(o.tokens) for o in outs)
    engine._record_call(cont, outs, True, 1.0, EngineStats())
    assert rates.spec[bucket_for(len(cont))] == 1.0 / drawn
