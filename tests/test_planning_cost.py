"""TPOT profile and per-actor time estimates (paper §3.5)."""

import random

import pytest

from flows.planning.cost import (DecodeEstimator, actor_cost, brute_force_decode_time,
                                 decode_time, decode_time_desc, estimate_actor_time)
from flows.planning.tpot import (GPUS, MODELS, TpotProfile, parse_roofline_spec,
                                    roofline_profile, roofline_tpot)

# TPOT = 1 ms + 0.1 ms per sequence + 1 us per context token: bilinear, so exact in the grid
GRID = TpotProfile(batch_sizes=(1, 5), contexts=(0.0, 1000.0),
                   seconds=((1.1e-3, 2.1e-3), (1.5e-3, 2.5e-3)), prefill_tokens_per_s=1000.0)


def test_bilinear_interpolation_and_extrapolation():
    assert GRID.tpot(1, 0) == pytest.approx(1.1e-3)
    assert GRID.tpot(3, 500) == pytest.approx(1e-3 + 0.3e-3 + 0.5e-3)
    # beyond the grid: linear in batch and context
    assert GRID.tpot(11, 2000) == pytest.approx(1e-3 + 1.1e-3 + 2e-3)
    assert GRID.tpot_fn()(3, 500) == pytest.approx(GRID.tpot(3, 500))


def test_profile_json_round_trip(tmp_path):
    path = tmp_path / "p.json"
    GRID.save(path)
    assert TpotProfile.load(path) == GRID


def test_profile_validation():
    with pytest.raises(ValueError, match="batch_sizes"):
        TpotProfile((1,), (0.0, 1.0), ((1.0, 1.0),), 1.0)
    with pytest.raises(ValueError, match="seconds"):
        TpotProfile((1, 2), (0.0, 1.0), ((1.0, 1.0),), 1.0)


def test_roofline_formula():
    gpu, model = GPUS["h100"], MODELS["qwen2.5-7b"]
    assert model.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2
    # batch 1: weight streaming dominates: 15.24 GB / 2 GPUs / (3.35 TB/s * 0.8)
    assert roofline_tpot(gpu, model, 2, 1, 0) == pytest.approx(7.62e9 / (3.35e12 * 0.8))
    prof = roofline_profile(gpu, model, 2)
    assert prof.tpot(64, 1024) == pytest.approx(roofline_tpot(gpu, model, 2, 64, 1024))
    assert prof.tpot(512, 1000) > prof.tpot(8, 1000) > prof.tpot(1, 0)
    assert parse_roofline_spec("roofline:h100:qwen2.5-7b", 2).name == prof.name
    with pytest.raises(ValueError, match="roofline"):
        parse_roofline_spec("roofline:tpu:qwen2.5-7b", 2)


def test_shrinking_batch_matches_brute_force_within_2_percent():
    prof = roofline_profile(GPUS["h100"], MODELS["qwen2.5-7b"], 2)
    rng = random.Random(0)
    for _ in range(5):
        lengths = [rng.randint(1, 1500) for _ in range(rng.randint(1, 60))]
        exact = brute_force_decode_time(lengths, 300, prof)
        assert decode_time(lengths, 300, prof) == pytest.approx(exact, rel=0.02)


def test_group_paths_agree():
    prof = roofline_profile(GPUS["h100"], MODELS["qwen2.5-7b"], 2)
    groups = [900.0, 640.0, 640.0, 100.0]
    per_sample = [g for g in groups for _ in range(4)]
    reference = decode_time(per_sample, 200, prof)
    assert decode_time_desc(groups, 4, 200, prof.tpot_fn()) == pytest.approx(reference, rel=1e-9)
    est = DecodeEstimator(prof, 4, max_groups=4, max_context=1200)
    assert est.time_desc(groups, 200) == pytest.approx(reference, rel=0.01)
    assert est.slice_timer(groups)(0, 4, 200) == pytest.approx(reference, rel=0.01)
    assert est.slice_timer(groups)(1, 3, 200) == pytest.approx(
        decode_time([640.0] * 8, 200, prof), rel=0.01)


def test_actor_time_adds_prefill_and_cost_is_time_gpus_price():
    lengths = [10, 10, 20]
    decode = decode_time(lengths, 0, GRID)
    # 10 steps at batch 3, then 10 at batch 1 (contexts 5.5 and 15.5 tokens)
    assert decode == pytest.approx(10 * GRID.tpot(3, 5.5) + 10 * GRID.tpot(1, 15.5))
    assert estimate_actor_time(lengths, 0, GRID, prefill_tokens=500) == pytest.approx(0.5 + decode)
    assert estimate_actor_time([], 0, GRID) == 0.0
    assert actor_cost(10.0, 2, 0.5) == 10.0


def _profiles():
    yield roofline_profile(GPUS["h100"], MODELS["qwen2.5-7b"], 2)
    yield GRID  # extrapolates far beyond its 1..5 batch grid
    yield TpotProfile((1, 3, 10), (0.0, 50.0, 400.0),
                      ((1e-3, 1.2e-3, 2e-3), (1.1e-3, 1.5e-3, 2.6e-3), (2e-3, 2.2e-3, 4e-3)), 1e3)


@pytest.mark.parametrize("group_size", [1, 4])
def test_bucket_table_is_bucket_row_bit_for_bit(group_size):
    for prof in _profiles():
        table = DecodeEstimator(prof, group_size, max_groups=40, max_context=3000).table
        assert table.shape[0] == 40
        for j in range(40):
            row = prof.bucket_row((j + 1) * group_size, 3001)
            assert list(table[j][:len(row)]) == row[:table.shape[1]]
            assert table[j][7] == prof.tpot((j + 1) * group_size, 7.5 * 16)


def test_bucket_table_cache_is_keyed_by_grid_and_grows():
    prof = roofline_profile(GPUS["a100"], MODELS["qwen2.5-3b"], 1)
    small = DecodeEstimator(prof, 8, max_groups=4, max_context=100).table
    copy = TpotProfile.from_dict(prof.to_dict())  # e.g. the live flow reloading its file
    grown = DecodeEstimator(copy, 8, max_groups=10, max_context=2000).table
    assert grown.shape[0] == 10 and grown.shape[1] >= 2001 // 16 + 2
    assert (grown[:4, :small.shape[1]] == small).all()
    # a smaller request is served from the grown table: no rebuild
    assert DecodeEstimator(prof, 8, max_groups=3, max_context=50).table.base is grown.base


def test_sweep_is_slice_timer_bit_for_bit():
    rng = random.Random(3)
    prof = roofline_profile(GPUS["h100"], MODELS["qwen2.5-7b"], 2)
    for _ in range(20):
        n = rng.randint(1, 60)
        lengths = sorted((float(rng.choice([rng.randint(1, 40), rng.randint(1, 2000)]))
                          for _ in range(n)), reverse=True)
        est = DecodeEstimator(prof, rng.choice([1, 4, 8]), max_groups=n, max_context=3000)
        timer = est.slice_timer(lengths)
        slices = []
        for _ in range(30):
            start = rng.randrange(n)
            end = rng.randint(start + 1, n)
            slices.append((start, end, rng.uniform(0, 900)))
        assert est.sweep(lengths, *zip(*slices)) == [timer(*s) for s in slices]
    assert est.sweep(lengths, [], [], []) == []
    with pytest.raises(ValueError, match="slices"):
        DecodeEstimator(prof, 4, max_groups=2, max_context=100).sweep([3.0, 2.0, 1.0], [0], [3], [0.0])
