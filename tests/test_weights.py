"""Policy weights in the object store (both backends): round trip, dedup, fingerprint, views."""

from __future__ import annotations

import hashlib

import pytest
import torch

from actions.store import IntegrityError, ObjectStore, blob_key, read_manifest
from actions.store.weights import (
    load_tensors,
    publish_tensors,
    serialize_tensor,
    weights_sha256,
)


def _policy(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(300, 64, generator=g),  # 75 KiB
        "layers.0.attn.q.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "layers.0.mlp.up.weight": torch.randn(512, 256, generator=g),  # 512 KiB: "large" path
        "layers.0.norm.weight": torch.ones(64, dtype=torch.float16),
        "step_counter": torch.tensor(7, dtype=torch.int64),  # 0-d
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "ids": torch.arange(10, dtype=torch.int32),
    }


def test_round_trip_preserves_every_dtype_and_shape(backend_store: ObjectStore) -> None:
    tensors = _policy()
    published = publish_tensors(backend_store, "policy/v1/manifest.json", tensors, {"step": 1})
    loaded, meta = load_tensors(backend_store, "policy/v1/manifest.json")
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape, name
        assert torch.equal(loaded[name], t), name
    assert meta == {"step": 1, "weights_sha256": published.weights_sha256}
    assert weights_sha256(loaded) == published.weights_sha256


def test_only_changed_tensors_are_uploaded(backend_store: ObjectStore) -> None:
    tensors = _policy()
    first = publish_tensors(backend_store, "policy/v1/manifest.json", tensors)
    assert first.stats.num_uploaded == len(tensors)
    same = publish_tensors(backend_store, "policy/v2/manifest.json", tensors)
    assert (same.stats.num_uploaded, same.stats.bytes_uploaded) == (0, 0)
    changed = dict(tensors)
    changed["layers.0.mlp.up.weight"] = tensors["layers.0.mlp.up.weight"] + 1
    third = publish_tensors(backend_store, "policy/v3/manifest.json", changed)
    blob = serialize_tensor("layers.0.mlp.up.weight", changed["layers.0.mlp.up.weight"])
    assert third.stats.num_uploaded == 1 and third.stats.bytes_uploaded == len(blob)
    assert third.weights_sha256 != first.weights_sha256 == same.weights_sha256


def test_loaded_tensors_are_writable_views_that_never_touch_the_store(backend_store: ObjectStore) -> None:
    tensors = _policy()
    publish_tensors(backend_store, "m.json", tensors)
    loaded, _ = load_tensors(backend_store, "m.json")
    loaded["embed.weight"].add_(1.0)  # in-place update, e.g. by an optimizer
    again, _ = load_tensors(backend_store, "m.json")
    assert torch.equal(again["embed.weight"], tensors["embed.weight"])


def test_non_contiguous_and_cuda_free_inputs(backend_store: ObjectStore) -> None:
    base = torch.randn(32, 16)
    tensors = {"t": base.t(), "s": base[::2]}
    publish_tensors(backend_store, "m.json", tensors)
    loaded, _ = load_tensors(backend_store, "m.json")
    assert torch.equal(loaded["t"], base.t()) and torch.equal(loaded["s"], base[::2])


def test_corrupted_tensor_blob_is_named(backend_store: ObjectStore) -> None:
    tensors = {"w": torch.randn(8, 8)}
    publish_tensors(backend_store, "m.json", tensors)
    digest = read_manifest(backend_store, "m.json")["files"]["w"]["sha256"]
    backend_store.put(blob_key(digest), serialize_tensor("w", torch.zeros(8, 8)))
    with pytest.raises(IntegrityError, match=rf"{blob_key(digest)} for file 'w' is corrupted"):
        load_tensors(backend_store, "m.json")


def test_fingerprint_matches_its_reference_definition() -> None:
    # The fingerprint is recorded in campaign state; it must never drift. Reference: in name
    # order, "name|sha256(safetensors file holding only that tensor)\n".
    from safetensors.torch import save

    tensors = _policy(seed=3)
    h = hashlib.sha256()
    for name in sorted(tensors):
        blob = save({name: tensors[name].contiguous()})
        h.update(f"{name}|{hashlib.sha256(blob).hexdigest()}\n".encode())
    assert weights_sha256(tensors) == h.hexdigest()
    changed = dict(tensors, ids=tensors["ids"].to(torch.int64))  # same values, other dtype
    assert weights_sha256(changed) != weights_sha256(tensors)


def test_blob_encoding_is_byte_identical_to_safetensors() -> None:
    from actions.store.weights import tensor_blob_parts

    for name, t in {**_policy(), "unicodé€": torch.ones(3), 'q"\\': torch.zeros(2, 2)}.items():
        header, data = tensor_blob_parts(name, t)
        assert header + bytes(data) == serialize_tensor(name, t), name


def test_optimizer_scalars_ride_in_the_manifest_so_no_other_run_shares_their_blobs(backend_store: ObjectStore) -> None:
    """AdamW's step counts are the same bytes in any two runs at one step: as blobs, another run's
    collection could delete one between this publish finding it present and this manifest."""
    def state(seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {"p0.step": torch.tensor(7.0), "p0.exp_avg": torch.randn(8, 4, generator=g),
                "p0.exp_avg_sq": torch.rand(8, 4, generator=g), "p1.step": torch.tensor(7.0),
                "p1.exp_avg": torch.randn(4, generator=g), "p1.exp_avg_sq": torch.rand(4, generator=g),
                "count": torch.tensor(3, dtype=torch.int64)}

    blobs = []
    for run, seed in (("a", 1), ("b", 2)):
        key = f"runs/{run}/optimizer/manifest.json"
        publish_tensors(backend_store, key, state(seed), scalars_in_meta=True)
        manifest = read_manifest(backend_store, key)
        assert set(manifest["files"]) == {"p0.exp_avg", "p0.exp_avg_sq", "p1.exp_avg", "p1.exp_avg_sq"}
        blobs.append({entry["sha256"] for entry in manifest["files"].values()})
        loaded, _ = load_tensors(backend_store, key)
        for name, t in state(seed).items():
            assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape and torch.equal(loaded[name], t)
    assert not blobs[0] & blobs[1]  # two seeds: no blob in common
    # a damaged entry is named, never guessed at
    publish_tensors(backend_store, "runs/c/m.json", {"w": torch.ones(2)}, {"scalars": {"p0.step": ["float32", "7"]}})
    with pytest.raises(IntegrityError, match=r"manifest 'runs/c/m.json': scalar 'p0.step' is not \[dtype, number\]"):
        load_tensors(backend_store, "runs/c/m.json")
    publish_tensors(backend_store, "runs/c/n.json", {"w": torch.ones(2)}, {"scalars": [7]})
    with pytest.raises(IntegrityError, match=r"manifest 'runs/c/n.json': its scalars are not a table"):
        load_tensors(backend_store, "runs/c/n.json")
    with pytest.raises(ValueError, match=r"scalars \['flag'\] have a dtype outside"):
        publish_tensors(backend_store, "runs/c/o.json", {"flag": torch.tensor(True)}, scalars_in_meta=True)


def test_host_copies_are_made_by_the_uploading_threads_a_few_at_a_time(tmp_path, monkeypatch) -> None:
    """A tensor that needs a host copy (one on a GPU; here, a non-contiguous one) is copied by the
    thread that uploads it and freed once it is up: at most ``max_concurrency`` copies are alive
    at once, not the whole set (a 7B model's optimizer state is 91 GB)."""
    import threading
    import weakref

    from actions.store import LocalStore, weights

    alive, most, lock = [0], [0], threading.Lock()
    copy = weights._tensor_bytes

    def counted(tensor: torch.Tensor) -> memoryview:
        view = copy(tensor)
        with lock:
            alive[0] += 1
            most[0] = max(most[0], alive[0])

        def freed() -> None:
            with lock:
                alive[0] -= 1

        weakref.finalize(view.obj, freed)  # the array that owns the host copy: freed with the last view
        return view

    monkeypatch.setattr(weights, "_tensor_bytes", counted)
    base = torch.randn(64, 24, 16)
    tensors = {f"t{i}": base[:, i].clone().t() for i in range(24)}  # non-contiguous: each needs a copy
    store = LocalStore(tmp_path / "store", max_concurrency=3)
    published = publish_tensors(store, "m.json", tensors)
    assert 1 <= most[0] <= 3 and alive[0] == 0
    loaded, _ = load_tensors(store, "m.json")
    assert all(torch.equal(loaded[n], t) for n, t in tensors.items())
    assert published.weights_sha256 == weights_sha256(tensors)


def test_a_tensor_safetensors_cannot_store_fails_before_any_blob_is_up(tmp_path) -> None:
    from actions.store import LocalStore

    store = LocalStore(tmp_path / "store")
    tensors = {**{f"w{i}": torch.randn(64, 64) for i in range(8)}, "z": torch.zeros(3, dtype=torch.complex128)}
    with pytest.raises(ValueError, match="tensor 'z' has dtype complex128, which safetensors cannot store"):
        publish_tensors(store, "m.json", tensors)
    assert not store.exists("m.json") and not list((tmp_path / "store").rglob("blobs/**/*[0-9a-f]"))


def test_stored_tensors_read_one_tensor_at_a_time_what_load_tensors_reads(backend_store: ObjectStore,
                                                                          monkeypatch) -> None:
    """``StoredTensors``: the names, values and meta scalars of ``load_tensors``, each tensor
    fetched when looked up and never kept; renaming fetches nothing; ``stream`` yields in name
    order with the blobs fetched ahead bounded by its byte budget; a damaged blob is named when
    its turn comes."""
    from actions.store import weights
    from actions.store.weights import StoredTensors

    tensors = {**_policy(), "p0.step": torch.tensor(3.0)}
    published = publish_tensors(backend_store, "m.json", tensors, {"step": 1}, scalars_in_meta=True)
    whole, _ = load_tensors(backend_store, "m.json")
    blobs = set(read_manifest(backend_store, "m.json")["files"])  # the 0-d tensors ride in the manifest
    assert blobs < set(whole)
    fetched: list[str] = []
    get_blob = weights.get_blob

    def counted(store, digest, *, name="", **kw):
        fetched.append(name)
        return get_blob(store, digest, name=name, **kw)

    monkeypatch.setattr(weights, "get_blob", counted)
    lazy = StoredTensors(backend_store, "m.json", expected_sha256=published.weights_sha256)
    assert sorted(lazy) == sorted(whole) and len(lazy) == len(whole) and not fetched
    assert lazy.meta["step"] == 1
    for name in sorted(whole):
        t = lazy[name]
        assert t.dtype == whole[name].dtype and torch.equal(t, whole[name]), name
    assert sorted(fetched) == sorted(blobs)  # every blob once
    assert lazy["mask"] is not lazy["mask"]  # nothing cached: a caller's drop frees the tensor
    fetched.clear()
    renamed = lazy.renamed({"w": "embed.weight", "n": "p0.step"})
    assert sorted(renamed) == ["n", "w"] and not fetched
    assert torch.equal(renamed["w"], whole["embed.weight"]) and torch.equal(renamed["n"], whole["p0.step"])
    fetched.clear()
    order = []
    for name, t in lazy.stream(budget=0):  # at most the next blob ahead of the caller
        order.append(name)
        assert len(fetched) <= len([n for n in order if n in blobs]) + 1
        assert torch.equal(t, whole[name])
    assert order == sorted(whole)
    fetched.clear()
    streamed = dict(lazy.stream())  # a budget above the set: every blob fetched up front
    assert streamed.keys() == whole.keys() and sorted(fetched) == sorted(blobs)
    with pytest.raises(IntegrityError, match="weights_sha256"):
        StoredTensors(backend_store, "m.json", expected_sha256="0" * 64)
    digest = read_manifest(backend_store, "m.json")["files"]["mask"]["sha256"]
    backend_store.put(blob_key(digest), serialize_tensor("mask", torch.tensor([False, False, False])))
    seen = []
    with pytest.raises(IntegrityError, match=rf"{blob_key(digest)} for file 'mask' is corrupted"):
        for name, _ in StoredTensors(backend_store, "m.json").stream(budget=0):
            seen.append(name)
    assert seen == [n for n in sorted(whole) if n < "mask"]
