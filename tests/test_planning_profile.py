"""TpotProfile: KV capacity in the roofline profile (a batch whose KV does not fit runs time-shared),
and what a profile file must hold to be loaded."""

from __future__ import annotations

import json
import re

import pytest

from flows.planning.tpot import GPUS, MODELS, kv_capacity_tokens, roofline_profile, roofline_tpot

H100, QWEN7, LLAMA70 = GPUS["h100"], MODELS["qwen2.5-7b"], MODELS["llama2-70b"]


def test_capacity_is_memory_left_after_weights():
    # 2 x 80 GB x 0.9 = 144 GB usable; 137.96 GB of bf16 weights; 327,680 B of KV per token
    # (2 x 80 layers x 8 KV heads x 128 x 2 B)
    assert kv_capacity_tokens(H100, LLAMA70, 2) == pytest.approx((144e9 - 137.96e9) / 327_680)
    assert kv_capacity_tokens(H100, QWEN7, 2) == pytest.approx((144e9 - 15.24e9) / 57_344)


def test_batch_beyond_capacity_is_time_shared():
    cap = kv_capacity_tokens(H100, LLAMA70, 2)  # ~18.4k tokens
    resident = int(cap // 600)  # 30 sequences of 600 tokens fit
    assert resident == 30
    assert roofline_tpot(H100, LLAMA70, 2, 171, 600, cap) == pytest.approx(
        171 / 30 * roofline_tpot(H100, LLAMA70, 2, 30, 600))
    # within capacity nothing changes
    assert roofline_tpot(H100, LLAMA70, 2, 16, 600, cap) == roofline_tpot(H100, LLAMA70, 2, 16, 600)
    # even one sequence that overflows the KV memory still runs, alone
    assert roofline_tpot(H100, LLAMA70, 2, 4, 30_000, cap) == pytest.approx(
        4 * roofline_tpot(H100, LLAMA70, 2, 1, 30_000))


def test_profile_applies_capacity_only_where_it_binds():
    qwen = roofline_profile(H100, QWEN7, 2)
    # 512 sequences x 4096 tokens = 2.1M < 2.25M: the traces' working points are unchanged
    assert qwen.tpot(512, 4096) == pytest.approx(roofline_tpot(H100, QWEN7, 2, 512, 4096))
    llama = roofline_profile(H100, LLAMA70, 2)
    assert llama.tpot(512, 1024) > 10 * llama.tpot(1, 1024)  # far more than bandwidth alone


def test_model_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="raise gpus_per_actor"):
        roofline_profile(H100, LLAMA70, 1)


def test_shrink_cost_round_trips_and_defaults_to_zero():
    from flows.planning.tpot import TpotProfile

    grid = dict(batch_sizes=(1, 4), contexts=(8.0, 16.0), seconds=((1e-3, 1e-3), (2e-3, 2e-3)),
                prefill_tokens_per_s=1e4)
    p = TpotProfile(**grid, shrink_s=1e-4, shrink_s_per_kv_token=1e-7)
    assert p.shrink(4, 10.0) == pytest.approx(1e-4 + 4e-6)
    assert TpotProfile.from_dict(p.to_dict()) == p
    old = p.to_dict()
    del old["shrink_s"], old["shrink_s_per_kv_token"]  # a profile written before the fields
    assert TpotProfile.from_dict(old).shrink(4, 10.0) == 0.0
    with pytest.raises(ValueError, match="shrink_s=-1"):
        TpotProfile(**grid, shrink_s=-1)


GRID = {"batch_sizes": [1, 4], "contexts": [8.0, 16.0], "seconds": [[1e-3, 1e-3], [2e-3, 2e-3]],
        "prefill_tokens_per_s": 1e4}


@pytest.mark.parametrize("seconds,named", [
    ([[float("nan"), 1e-3], [2e-3, 2e-3]], "profile.seconds[0][0]=nan"),
    ([[1e-3, 1e-3], [-2e-3, 2e-3]], "profile.seconds[1][0]=-0.002"),
    ([[0.0, 0.0], [0.0, 0.0]], "profile.seconds[0][0]=0.0"),
    ([[1e-3, float("inf")], [2e-3, 2e-3]], "profile.seconds[0][1]=inf"),
])
def test_decode_times_must_be_finite_and_positive(seconds, named):
    """A NaN time failed an assertion deep in the simulator; a negative or all-zero grid planned nonsense."""
    from flows.planning.tpot import TpotProfile

    with pytest.raises(ValueError, match=re.escape(named) + ".*finite number of seconds > 0"):
        TpotProfile.from_dict({**GRID, "seconds": seconds})


@pytest.mark.parametrize("text,named", [
    ("{}", "profile.batch_sizes is missing"),
    ("[]", "expected a JSON object"),
    ('{"batch_sizes": [1, 4], "contexts": [8, 16], "seconds": [[1, 1], [1, 1]]}',
     "profile.prefill_tokens_per_s is missing"),
    (json.dumps({**GRID, "batch_sizes": ["one", 4]}), "profile.batch_sizes=['one', 4]: must be a list of integers"),
    (json.dumps({**GRID, "batch_sizes": [1.5, 4]}), "profile.batch_sizes=[1.5, 4]: must be a list of integers"),
    (json.dumps({**GRID, "seconds": "fast"}), "profile.seconds='fast': must be a list of rows"),
    (json.dumps({**GRID, "prefill_tokens_per_s": True}), "profile.prefill_tokens_per_s=True: must be a number"),
    (json.dumps({**GRID, "prefill_tokens_per_s": float("nan")}), "profile.prefill_tokens_per_s=nan"),
    ('{"batch_sizes": [1, ', "is not valid JSON (line 1"),
    ('{"batch_sizes": [' + "9" * 5000 + "]}", "number too long"),
])
def test_a_malformed_profile_file_is_one_error_naming_the_file_and_the_key(tmp_path, text, named):
    from flows.planning.tpot import TpotProfile

    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ValueError) as exc:
        TpotProfile.load(path, "scaling.profile")
    assert str(exc.value).startswith(f"scaling.profile={str(path)!r}") and named in str(exc.value)
    assert "rlhfless profile" in str(exc.value)


def test_a_missing_or_undecodable_profile_file_names_the_file(tmp_path):
    from flows.planning.tpot import TpotProfile

    with pytest.raises(ValueError, match=r"--profile='.*none.json' cannot be read \(No such file"):
        TpotProfile.load(tmp_path / "none.json", "--profile")
    with pytest.raises(ValueError, match=r"--profile='.*' cannot be read \(Is a directory"):
        TpotProfile.load(tmp_path, "--profile")
    (tmp_path / "latin.json").write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        TpotProfile.load(tmp_path / "latin.json", "--profile")


def test_a_store_cache_entry_loads_as_the_profile_it_holds(tmp_path):
    """A campaign's measured profile, as cached in the store (``profiles/<key>.json``: its facts
    beside it), is a profile file too: the same grid as the bare profile."""
    from flows.planning.tpot import TpotProfile

    bare, entry = tmp_path / "bare.json", tmp_path / "entry.json"
    bare.write_text(json.dumps(GRID))
    entry.write_text(json.dumps({"schema": 1, "facts": {"threads": 2}, "profile": GRID}))
    assert TpotProfile.load(entry, "--profile") == TpotProfile.load(bare, "--profile")
    entry.write_text(json.dumps({"schema": 1, "facts": {}, "profile": {**GRID, "seconds": "fast"}}))
    with pytest.raises(ValueError, match="profile.seconds='fast'"):
        TpotProfile.load(entry, "--profile")
