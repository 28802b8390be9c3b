"""Choosing the local pool's idle worker by its warm state (flows/invokers/idle.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from flows.invokers.idle import IdleWorkers, affinity, held_policy, request_policy


@dataclass
class W:
    name: str
    warm: dict[str, str | None] = field(default_factory=dict)
    engine: str | None = None
    engine_policy: str | None = None


def test_an_activation_goes_where_its_action_left_its_policy_version():
    trainer = W("t", {"generate": "v1", "train_step": "v2"})  # trained v1 into v2
    warmed = W("g", {"generate": "v2"})  # pre-warmed for v2's generation
    other = W("o", {"generate": "v1", "score": "v1"})
    idle: IdleWorkers[W] = IdleWorkers()
    for w in (other, trainer, warmed):
        idle.put(w)
    assert affinity(trainer, "train_step", "v2") == 2 and affinity(other, "train_step", "v2") == 0
    assert idle.take("generate", "v2") is warmed  # not the trainer, although it generated once
    assert idle.take("train_step", "v2") is trainer
    assert idle.take("train_step", "v3") is other  # nobody holds it: the one idle longest
    assert idle.take_nowait("generate", "v2") is None


def test_equal_workers_are_taken_first_in_first_out_and_take_waits_for_a_put():
    idle: IdleWorkers[W] = IdleWorkers()
    a, b = W("a", {"generate": "v1"}), W("b", {"generate": "v1"})
    idle.put(a)
    idle.put(b)
    assert idle.take("generate", "v1") is a and idle.take("generate", "v9") is b
    got: list[W] = []
    taker = threading.Thread(target=lambda: got.append(idle.take("score", None)))
    taker.start()
    idle.put(a)
    taker.join(timeout=5)
    assert got == [a] and len(idle) == 0


def test_a_worker_that_ran_anything_comes_before_a_fresh_one_among_equals():
    """A fresh process's first activation imports torch: the set-up chain stays on one worker."""
    idle: IdleWorkers[W] = IdleWorkers()
    fresh, used, later = W("f"), W("u", {"prepare": None}), W("l")
    for w in (fresh, used, later):
        idle.put(w)
    assert idle.take("warmup", None) is used  # not the fresh one idle longer
    assert idle.take("warmup", None) is fresh and idle.take("warmup", None) is later  # then first in, first out
    holder = W("h", {"generate": "v1"})
    for w in (fresh, used, holder):
        idle.put(w)
    assert idle.take("generate", "v1") is holder  # affinity first


def test_the_policy_a_request_reads_and_the_one_a_worker_holds_after_it():
    ref = {"store_uri": "s", "base_key": "b", "policy_key": "p/1", "policy_version": 1}
    gen, train = {"model": ref}, {"policy": ref}
    assert request_policy(gen) == request_policy(train) == "p/1" and request_policy({"x": 1}) is None
    assert held_policy("generate", gen, {"samples": []}) == "p/1"
    published = {"policy_key": "p/2", "policy_version": 2, "weights_sha256": "0" * 64, "optimizer_key": "o/2",
                 "bytes_uploaded": 10, "metrics": {}, "__warm": {"hits": 1, "misses": 0}}
    assert held_policy("train_step", train, published) == "p/2"  # a training step holds what it published
    assert held_policy("train_step", train, {"error": "x"}) is None


def test_a_prewarm_skips_holders_and_an_activation_waits_for_the_load_in_flight():
    holder, ran, fresh = W("h", {"generate": "v2"}), W("r", {"generate": "v1"}), W("f")
    idle: IdleWorkers[W] = IdleWorkers(warming_wait_s=30.0)
    for w in (fresh, ran, holder):
        idle.put(w)
    assert idle.take_to_warm("generate", "v2", 1) == []  # an idle worker holds it already
    assert idle.take_to_warm("generate", "v3", 1) == [ran]  # one that ran the action, the longest idle
    assert idle.take_to_warm("generate", "v3", 2) == [holder]  # the load in flight counts; not the fresh one
    assert len(idle) == 1
    got: list[W] = []
    taker = threading.Thread(target=lambda: got.append(idle.take("generate", "v3")))
    taker.start()
    taker.join(timeout=0.3)
    assert got == []  # a worker is idle, but v3 is loading: wait for that load
    ran.warm["generate"] = "v3"
    idle.put(ran, warmed=("generate", "v3"))
    taker.join(timeout=5)
    assert got == [ran]
    # Once no load is in flight (one failed: its worker still holds v2), nobody waits.
    idle.put(holder, warmed=("generate", "v3"))
    assert idle.take("generate", "v3") is holder and idle.take("generate", "v3") is fresh


def test_an_activation_stops_waiting_for_a_prewarm_after_warming_wait_s():
    a, b = W("a"), W("b")
    idle: IdleWorkers[W] = IdleWorkers(warming_wait_s=0.2)
    idle.put(a)
    idle.put(b)
    assert idle.take_to_warm("generate", "v1", 1) == [a]
    assert idle.take("generate", "v1") is b  # after 0.2 s: the pre-warm may hang, the activation goes on


def test_a_vllm_request_goes_to_a_built_engine_ahead_of_a_worker_that_only_read_the_version():
    read_it = W("r", {"generate": "v2"})  # pre-warmed for v2 into a torch model: no engine
    engine_old = W("e", {"evaluate": "v1"}, engine="vllm", engine_policy="v1")  # built by an evaluation
    idle: IdleWorkers[W] = IdleWorkers()
    for w in (read_it, engine_old):
        idle.put(w)
    assert affinity(engine_old, "generate", "v2", "vllm") == 3 and affinity(read_it, "generate", "v2", "vllm") == 2
    assert idle.take("generate", "v2", "vllm") is engine_old  # a push beats a second engine start
    idle.put(engine_old)
    assert idle.take("generate", "v2") is read_it  # the torch engine keeps the version rule
    engine_old.engine_policy = "v2"
    assert idle.take("evaluate", "v2", "vllm") is engine_old  # evaluate shares generate's engine


def test_a_request_without_an_engine_leaves_engine_workers_free():
    engine = W("e", engine="vllm", engine_policy="v1")
    plain = W("p")
    idle: IdleWorkers[W] = IdleWorkers()
    idle.put(engine)  # idle longest, but it holds the engine
    idle.put(plain)
    assert idle.take("score", "v1") is plain


def test_a_vllm_prewarm_pushes_into_every_idle_engine_and_starts_only_what_count_lacks():
    fresh = [W(f"f{i}") for i in range(3)]
    engines = [W("e1", engine="vllm", engine_policy="v1"), W("e2", engine="vllm", engine_policy="v1")]
    holder = W("h", engine="vllm", engine_policy="v2")
    idle: IdleWorkers[W] = IdleWorkers()
    for w in (*fresh, *engines, holder):
        idle.put(w)
    taken = idle.take_to_warm("generate", "v2", 1, "vllm")
    assert taken == engines  # stale engines get the push; the holder already counts: no new engine
    for w in taken:
        w.engine_policy = "v2"
        idle.put(w, warmed=("vllm", "v2"))
    more = idle.take_to_warm("generate", "v2", 4, "vllm")
    assert more == [fresh[0]]  # three engines hold v2: one start for the fourth
