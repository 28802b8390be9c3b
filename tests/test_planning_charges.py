"""One model of migration and continuation charges, shared by the planner and the simulator."""

import pytest

from flows.planning import charges
from flows.planning.charges import Migration, continuation_start_s, migration_s
from flows.planning.migrate import plan_cut_points
from flows.planning.tpot import TpotProfile
from flows.simulate.cluster import ActorSpec, Sample, SimConfig, simulate_phase

FLAT = TpotProfile((1, 1000), (0.0, 10000.0), ((0.01, 0.01), (0.01, 0.01)), 1000.0)


def test_charges():
    assert migration_s(500, "reprefill", FLAT, 1e-3) == Migration(0.5, 0.5)  # 500 tokens at 1000/s
    assert migration_s(500, "kv", FLAT, 1e-3) == Migration(0.0, 0.5)  # shipped, no stall
    with pytest.raises(ValueError, match="migration"):
        migration_s(1, "teleport", FLAT, 0.0)
    kw = dict(cold_start_s=30.0, weight_transfer_s=0.2)
    assert continuation_start_s(released_warm=True, spare_warm=True, **kw) == 0.0
    assert continuation_start_s(released_warm=False, spare_warm=True, **kw) == 0.2
    assert continuation_start_s(released_warm=False, spare_warm=False, **kw) == 30.2


def _cut_case():
    """Actor 0: 4 samples, three short and one long; actor 1: a short sample (its slot is free
    early) and a very long one, still decoding when actor 0 reaches its cut point (3 of 4
    finished at tau 0.7)."""
    lengths = [[10, 10, 10, 200], [400, 5]]
    return lengths, [50.0, 50.0]


def _simulate(migration):
    samples = [Sample(i, 0, 50, n) for i, n in enumerate([10, 10, 10, 200])]
    specs = [ActorSpec(tuple(samples), 0.0, 0.0), ActorSpec((Sample(8, 1, 50, 400), Sample(9, 1, 50, 5)), 0.0, 0.0)]
    cfg = SimConfig(profile=FLAT, gpus_per_actor=1, cut_threshold=0.7, migration=migration,
                    kv_transfer_s_per_token=1e-3)
    result, _ = simulate_phase(specs, cfg)
    return result


def test_planner_and_simulator_use_the_same_migration_charge(monkeypatch):
    lengths, prompts = _cut_case()
    # with the real charges the cut pays (the long sample moves well before actor 1 ends)
    assert plan_cut_points(lengths, prompts, 0.7, FLAT, migration="reprefill") == [3, None]
    base = _simulate("reprefill")
    assert base.num_cut == 1
    # a dearer migration in the one shared definition: the planner stops cutting, and the
    # simulator's destination stalls for it
    real = charges.migration_s

    def dear(tokens, migration, profile, kv_s_per_token):
        m = real(tokens, migration, profile, kv_s_per_token)
        return Migration(m.stall_s + 10.0, m.delay_s + 10.0)

    monkeypatch.setattr(charges, "migration_s", dear)
    assert plan_cut_points(lengths, prompts, 0.7, FLAT, migration="reprefill") == [None, None]
    assert _simulate("reprefill").time_s == pytest.approx(base.time_s + 10.0)
