"""Speculative decoding in the torch engine is exact: every kept token is plain decoding's.

Random tiny models (several seeds and shapes), drafts that are right, partly right and wrong,
ragged acceptance across rows, cuts in the middle of a speculative round, continuations of
cut samples, and the selector's own choices: the outputs must equal plain decoding's, token
for token and finish reason for finish reason.
"""

from __future__ import annotations

import pytest
import torch

from actions.engines.base import GenerationParams
from actions.engines.speculative import Speculation, _Batch
from actions.engines.torch_engine import SampleSpec, TorchEngine
from actions.models.modeling import build_tiny_model
from actions.tasks.repeat import make_rows

KW = {"seed": 7, "step": 2, "max_new_tokens": 30, "temperature": 1.0}
PARAMS = GenerationParams(**KW)


def _setup(seed: int, hidden: int = 32, layers: int = 2):
    torch.set_num_threads(1)
    model, tok = build_tiny_model(hidden_size=hidden, num_layers=layers, num_heads=2, intermediate_size=64,
                                  max_positions=256, seed=seed)
    model.eval()
    engine = TorchEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    rows = make_rows(5, max_count=9, seed=seed)
    specs = [SampleSpec(r.prompt_id, i, tuple(tok(r.prompt)["input_ids"])) for r in rows for i in range(3)]
    return engine, specs


@pytest.fixture(scope="module")
def setup():
    return _setup(0, 32, 2)


def test_another_model_shape_equals_plain():
    engine, specs = _setup(1, 48, 3)
    plain, _ = engine.generate(specs, PARAMS)
    for fixed in (("history", 4), None):
        spec = Speculation(history=_history(engine, specs, 5), fixed=fixed)
        assert _key(engine.generate(specs, PARAMS, speculation=spec)[0]) == _key(plain)


def _key(outs):
    return [(o.prompt_id, o.sample_index, o.tokens, o.finish_reason, o.stop_token) for o in outs]


_HISTORIES: dict = {}


def _history(engine, specs, step):
    key = (id(engine), step)
    if key not in _HISTORIES:
        _HISTORIES[key] = _make_history(engine, specs, step)
    return _HISTORIES[key]


def _make_history(engine, specs, step):
    """Responses of an earlier 'epoch'. Step 2 is the step generated: its noise, so every
    draft is right; another step has other noise, so a random model's drafts are mostly
    wrong. Ragged: odd prompts get step 2's responses cut short, so their rows run out of
    right drafts part-way while others still accept."""
    hist: dict[int, list[list[int]]] = {}
    for st in sorted({2, step}):
        outs, _ = engine.generate(specs, GenerationParams(**{**KW, "step": st}))
        for o in outs:
            if (st == 2) == (o.prompt_id % 2 == 1 or step == 2):
                toks = o.tokens + ([o.stop_token] if o.stop_token is not None else [])
                hist.setdefault(o.prompt_id, []).append(toks[:12] if step != 2 else toks)
    return hist


@pytest.mark.parametrize(("fixed", "temperature"), [(("history", 1), 1.0), (("history", 8), 1.0),
                                                     (("prompt_lookup", 4), 1.0), (("history", 3), 0.0),
                                                     (None, 0.0)])
def test_speculative_outputs_equal_plain(setup, fixed, temperature):
    engine, specs = setup
    plain, _ = engine.generate(specs, GenerationParams(**{**KW, "temperature": temperature}))
    for hist_step in (2, 5):  # step 2: every draft right; step 5: drafts partly right
        spec = Speculation(history=_history(engine, specs, hist_step), fixed=fixed)
        out, stats = engine.generate(specs, GenerationParams(**{**KW, "temperature": temperature}), speculation=spec)
        assert _key(out) == _key(plain), (fixed, hist_step)
        assert stats.spec["accepted"] <= stats.spec["proposed"]


@pytest.mark.parametrize("columns", [1, 2, 3])
def test_verification_drawn_a_few_columns_at_a_time_equals_plain(setup, monkeypatch, columns):
    """A large vocabulary draws a round's columns in groups (``_DRAW_ELEMENTS``): one column,
    or a few, per draw for the rows still matching; the tokens are plain decoding's."""
    import actions.engines.speculative as speculative

    engine, specs = setup
    # with every row alive, ``columns`` columns per draw; more as rows stop matching
    monkeypatch.setattr(speculative, "_DRAW_ELEMENTS", columns * len(specs) * engine.model.config.vocab_size)
    plain, _ = engine.generate(specs, PARAMS)
    for fixed in (("history", 8), ("prompt_lookup", 5)):
        spec = Speculation(history=_history(engine, specs, 5), fixed=fixed)
        out, stats = engine.generate(specs, PARAMS, speculation=spec)
        assert _key(out) == _key(plain), (columns, fixed)
        assert 0 < stats.spec["accepted"] < stats.spec["proposed"], stats.spec


@pytest.mark.parametrize("filters", [{"top_k": 10}, {"top_p": 0.85}, {"top_k": 12, "top_p": 0.9}])
def test_speculative_with_top_k_top_p_equals_plain(setup, filters):
    # Drafts come from unfiltered histories: the filtered draws keep some, reject others.
    engine, specs = setup
    kw = {**KW, **filters}
    plain, _ = engine.generate(specs, GenerationParams(**kw))
    assert _key(plain) != _key(engine.generate(specs, PARAMS)[0])  # the filters change the samples
    for fixed in (("history", 4), ("prompt_lookup", 3), None):
        spec = Speculation(history=_history(engine, specs, 2), fixed=fixed)
        out, stats = engine.generate(specs, GenerationParams(**kw), speculation=spec)
        assert _key(out) == _key(plain), (filters, fixed)
        if fixed == ("history", 4):
            assert 0 < stats.spec["accepted"] < stats.spec["proposed"], stats.spec
    spec = Speculation(history=_history(engine, specs, 2), fixed=("history", 5))
    cut, _ = engine.generate(specs, GenerationParams(**{**kw, "max_new_tokens": 60}, cut_after=5), speculation=spec)
    partial = [SampleSpec(s.prompt_id, s.sample_index, s.prompt_tokens, tuple(o.tokens))
               for s, o in zip(specs, cut) if o.finish_reason == "cut"]
    assert partial, "the cut should leave unfinished samples"
    long = GenerationParams(**{**kw, "max_new_tokens": 60})
    whole = {(o.prompt_id, o.sample_index): o for o in engine.generate(specs, long)[0]}
    for o in engine.generate(partial, GenerationParams(**{**kw, "max_new_tokens": 60}), speculation=spec)[0]:
        assert (o.tokens, o.finish_reason) == (whole[(o.prompt_id, o.sample_index)].tokens,
                                               whole[(o.prompt_id, o.sample_index)].finish_reason)


def test_ragged_acceptance_is_exercised_and_saves_forwards(setup):
    engine, specs = setup
    plain, ps = engine.generate(specs, PARAMS)
    out, stats = engine.generate(specs, PARAMS, speculation=Speculation(history=_history(engine, specs, 5),
                                                                      fixed=("history", 6)))
    assert _key(out) == _key(plain)
    s = stats.spec
    assert 0 < s["accepted"] < s["proposed"], s  # some drafts kept, some rejected: ragged rows
    assert stats.decode_token_slots < ps.decode_token_slots  # rows that accepted left earlier
    assert s["forwards_saved"] == ps.decode_steps - stats.decode_steps


def test_draft_len_counts_the_columns_verified_not_the_k_chosen(setup, monkeypatch):
    """History drafts of 3 tokens under a fixed k of 6: each speculative forward verifies at
    most 3 columns, and ``draft_len_sum`` adds what each verified (its width - 1), as the
    static path does, not the 6 chosen."""
    static, specs = setup
    engine = TorchEngine(static.model, eos_id=static.eos_ids, pad_id=static.pad_id, kv_cache="dynamic")
    plain, _ = engine.generate(specs, PARAMS)
    hist = {o.prompt_id: [list(o.tokens[:3])] for o in plain}
    spec = Speculation(history=hist, fixed=("history", 6))
    _, static_stats = static.generate(specs, PARAMS, speculation=spec)
    widths: list[int] = []
    forward = engine.model.forward

    def spy(*args, **kwargs):
        width = kwargs["input_ids"].shape[1]
        if 1 < width <= 1 + 6:  # a verification (prefill forwards are the prompts, far wider)
            widths.append(width - 1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", spy)
    out, stats = engine.generate(specs, PARAMS, speculation=spec)
    assert _key(out) == _key(plain)
    s = stats.spec
    assert s["spec_rounds"] == len(widths) > 0 and max(widths) <= 3, (s, widths)
    assert s["draft_len_sum"] == sum(widths)
    assert (s["spec_rounds"], s["draft_len_sum"]) == (static_stats.spec["spec_rounds"],
                                                      static_stats.spec["draft_len_sum"])


@pytest.mark.parametrize("cut_after", [1, 9])
def test_cut_mid_round_carries_exactly_the_accepted_tokens(setup, cut_after):
    engine, specs = setup
    kw = {**KW, "max_new_tokens": 60}
    whole, _ = engine.generate(specs, GenerationParams(**kw))
    spec = Speculation(history=_history(engine, specs, 5), fixed=("history", 5))
    cut, _ = engine.generate(specs, GenerationParams(**kw, cut_after=cut_after), speculation=spec)
    by_id = {(o.prompt_id, o.sample_index): o for o in whole}
    partial = []
    for s, o in zip(specs, cut):
        ref = by_id[(s.prompt_id, s.sample_index)]
        if o.finish_reason == "cut":  # a prefix of the plain sample, nothing drafted but not kept
            assert ref.tokens[:len(o.tokens)] == o.tokens
            partial.append(SampleSpec(s.prompt_id, s.sample_index, s.prompt_tokens, tuple(o.tokens)))
        else:
            assert (o.tokens, o.finish_reason) == (ref.tokens, ref.finish_reason)
    assert partial, "the cut should leave unfinished samples"
    cont, _ = engine.generate(partial, GenerationParams(**kw), speculation=spec)  # continued speculatively too
    for o in cont:
        ref = by_id[(o.prompt_id, o.sample_index)]
        assert (o.tokens, o.finish_reason) == (ref.tokens, ref.finish_reason)


def test_selector_driven_run_equals_plain_on_both_strategies(setup):
    engine, specs = setup
    plain, _ = engine.generate(specs, PARAMS)
    for strategies in (("history",), ("prompt_lookup",), ("history", "prompt_lookup")):
        spec = Speculation(strategies=strategies, history=_history(engine, specs, 2))
        out, stats = engine.generate(specs, PARAMS, speculation=spec)
        assert _key(out) == _key(plain), strategies
        assert stats.spec["rounds"] == stats.decode_steps


def test_rollback_masks_holes_and_compaction_keeps_valid_columns_in_order():
    layer = type("L", (), {})()
    keys = torch.arange(2 * 6, dtype=torch.float32).view(2, 1, 6, 1)
    layer.keys, layer.values = keys.clone(), keys.clone()
    cache = type("C", (), {"layers": [layer]})()
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    batch = _Batch(cache, mask, torch.zeros(2, dtype=torch.long))
    # The last 4 columns were [token, d1, d2, d3]; row 0 kept d1, row 1 kept nothing.
    batch.rollback(torch.tensor([1, 0]), [1, 0], width=4)
    # d2, d3 were rejected by both rows: cropped; row 1's d1 is a hole.
    assert batch.mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 0]]
    assert batch.holes == 2  # counted on the host: the padding column and the new hole
    batch._compact()
    assert batch.mask.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert layer.keys[:, 0, :, 0].tolist() == [[1.0, 2.0, 3.0], [6.0, 7.0, 8.0]]


def test_calls_that_cannot_pay_run_the_plain_loop_and_remeasure_ever_more_rarely():
    engine, specs = _setup(0, 32, 2)
    plain, _ = engine.generate(specs, PARAMS)
    engine.acceptance.priors["prompt_lookup"] = 0.0  # measured: nothing a draft proposes is kept
    engine.acceptance.prior_weight = 1e6
    plain_calls = []
    for _ in range(12):
        out, stats = engine.generate(specs, PARAMS, speculation=Speculation(strategies=("prompt_lookup",)))
        assert _key(out) == _key(plain)
        plain_calls.append(stats.spec["plain_calls"])
    # the 4th call re-measures, then the 8th after it (the wait doubles while nothing pays)
    assert plain_calls == [1, 1, 1, 0] + [1] * 7 + [0]
    # acceptance that pays resets the wait: a hopeless spell re-measures after 4 calls again
    engine.acceptance.priors["prompt_lookup"] = 1.0
    lookup = Speculation(strategies=("prompt_lookup",))
    assert engine.generate(specs, PARAMS, speculation=lookup)[1].spec["plain_calls"] == 0
    engine.acceptance.priors["prompt_lookup"] = 0.0
    plain_calls = [engine.generate(specs, PARAMS, speculation=Speculation(strategies=("prompt_lookup",)))[1]
                   .spec["plain_calls"] for _ in range(4)]
    assert plain_calls == [1, 1, 1, 0]


def test_the_selector_measures_plain_rounds_before_weighing_drafts_against_them():
    """A fresh engine has timed no plain round: its first speculative call's first round is
    plain, so the cost fit can tell a speculative round's overhead from every round's fixed
    cost. A plain call times its steps too, and a speculative call after it drafts at once."""
    engine, specs = _setup(0, 32, 2)
    assert engine.forward_cost.plain_weight == 0.0
    spec = Speculation(strategies=("prompt_lookup",))
    out, stats = engine.generate(specs, PARAMS, speculation=spec)
    assert stats.spec["spec_rounds"] < stats.spec["rounds"]
    assert engine.forward_cost.plain_weight >= 1.0

    fresh, _ = _setup(0, 32, 2)
    plain, pstats = fresh.generate(specs, PARAMS)
    assert _key(plain) == _key(out)
    # every decode forward is one observation of a width-1 round
    assert fresh.forward_cost.plain_weight == pytest.approx(
        sum(0.99 ** i for i in range(pstats.decode_steps)), rel=1e-9)


def test_a_strategy_never_measured_is_probed_once_before_its_prior_can_rule_it_out():
    """A default prior too pessimistic for speculation to pay must not keep a strategy off for
    good: the first call probes it (and outputs stay plain decoding's); a caller's prior counts
    as a measurement, as the remeasure test above relies on."""
    engine, specs = _setup(0, 32, 2)
    plain, _ = engine.generate(specs, PARAMS)
    engine.acceptance.prior_rate = 0.01
    assert not engine.acceptance.known("prompt_lookup")
    out, stats = engine.generate(specs, PARAMS, speculation=Speculation(strategies=("prompt_lookup",)))
    assert _key(out) == _key(plain)
    assert stats.spec["plain_calls"] == 0 and stats.spec["spec_rounds"] >= 1 and stats.spec["proposed"] > 0
    assert engine.acceptance.known("prompt_lookup")
    engine.acceptance.priors["history"] = 0.3
    assert engine.acceptance.known("history")


def test_a_damaged_drafts_object_costs_only_its_drafts(tmp_path, caplog):
    """Drafts only change speed: a truncated object, one that is not UTF-8, one whose
    responses are not a mapping, and a missing one are each skipped (the damaged ones with a
    warning naming them), and the good objects' drafts still come back, later keys winning."""
    import logging

    from actions.store import LocalStore, put_json
    from actions.store.drafts import read_drafts

    store = LocalStore(tmp_path / "store")
    put_json(store, "d/1.json", {"step": 1, "responses": {"0": [[1, 2, 3]], "1": [[4]], "x": [[9]]}})
    store.put("d/2.json", b'{"step": 2, "responses": {"0": [[1,2')
    store.put("d/3.json", b"\xff\xfe")
    put_json(store, "d/4.json", {"step": 4, "responses": [1]})
    put_json(store, "d/5.json", {"step": 5, "responses": {"1": [[5, 6], [7, "bad"], "bad"]}})
    keys = ["d/1.json", "d/2.json", "d/3.json", "d/4.json", "d/missing.json", "d/5.json"]
    with caplog.at_level(logging.WARNING, logger="actions.store.drafts"):
        drafts = read_drafts(store, keys, [0, 1, 2])
    assert drafts == {0: [[1, 2, 3]], 1: [[5, 6]]}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "d/2.json is not JSON" in warned[0] and "d/3.json is not JSON" in warned[1]
