"""A hostile store: whoever can write the store chooses every name, digest and byte in it.

Each case crafts a manifest, a blob, a commit record or a KV bundle, loads it the way actions
and flows do, and checks that (1) loading fails with a one-line error that names the key, and
(2) no file appears outside the store and the scratch model directory (a sentinel directory
beside them stays empty). The store-level cases run on the local store and on the real S3
server (``backend_store``); symlink cases are local only (S3 has no links). The last cases
replay the reproduced finding: a crafted store plus one ``/run evaluate`` request to the action
runtime (``actions/runtime/server.py``) used to write a file outside the model directory.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch

from actions.store import (
    IntegrityError,
    LocalStore,
    ObjectStore,
    blob_key,
    get_artifact,
    put_blob,
    sha256_hex,
)
from actions.store.safe_paths import MAX_NAME_CHARS, UnsafeName, check_name, write_beneath
from actions.store.weights import load_tensors, publish_tensors

try:
    from conftest import TINY_OVERRIDES
except ImportError:  # tests/ imported as a package
    from tests.conftest import TINY_OVERRIDES

MANIFEST = "runs/r1/base/manifest.json"
HOSTILE_NAMES = {
    "parent": "../escape.txt",
    "nested parent": "a/../../escape.txt",
    "absolute": "/tmp/escape.txt",
    "backslash parent": "..\\..\\escape.txt",
    "drive letter": "C:/Windows/escape.txt",
    "drive relative": "C:escape.txt",
    "NUL": "config.json\x00../../escape",
    "newline": "a\nb",
    "empty component": "a//b",
    "dot component": "./config.json",
    "empty": "",
    "oversized": "x" * (MAX_NAME_CHARS + 1),
    "oversized component": "a/" + "y" * 256,
}


def one_line_naming(exc: BaseException, *needles: str) -> str:
    """The error text, after checking it is one short line that contains every needle."""
    text = str(exc)
    assert "\n" not in text and len(text) < 1000, text
    for needle in needles:
        assert needle in text, f"{needle!r} not in: {text}"
    return text


def craft_manifest(store: ObjectStore, key: str, files: dict[str, dict], meta: dict | None = None) -> None:
    store.put(key, json.dumps({"schema": "rlhfless.artifact/v1", "files": files, "meta": meta or {}}).encode())


def entry(store: ObjectStore, data: bytes) -> dict:
    digest, _ = put_blob(store, data)
    return {"sha256": digest, "size": len(data)}


# ----------------------------------------------------------------------------- manifests
@pytest.mark.parametrize("case", list(HOSTILE_NAMES))
def test_manifest_file_names_that_are_not_safe_relative_paths_are_refused(backend_store: ObjectStore,
                                                                          case: str) -> None:
    craft_manifest(backend_store, MANIFEST, {HOSTILE_NAMES[case]: entry(backend_store, b"x"), "ok": entry(backend_store, b"y")})
    with pytest.raises(UnsafeName) as info:
        get_artifact(backend_store, MANIFEST)
    one_line_naming(info.value, MANIFEST, "not a safe relative path", "re-publish")


def test_a_wrong_digest_names_the_key_and_both_digests(backend_store: ObjectStore) -> None:
    claimed = sha256_hex(b"the real bytes")
    backend_store.put(blob_key(claimed), b"other bytes of..")  # same length, other content
    craft_manifest(backend_store, MANIFEST, {"config.json": {"sha256": claimed, "size": 16}})
    with pytest.raises(IntegrityError) as info:
        get_artifact(backend_store, MANIFEST)
    one_line_naming(info.value, blob_key(claimed), MANIFEST, f"expected sha256 {claimed}",
                    f"found {sha256_hex(b'other bytes of..')}")


def test_a_truncated_blob_is_refused_before_hashing(backend_store: ObjectStore) -> None:
    data = b"0123456789" * 100
    files = {"config.json": entry(backend_store, data)}
    backend_store.put(blob_key(files["config.json"]["sha256"]), data[:500])
    craft_manifest(backend_store, MANIFEST, files)
    with pytest.raises(IntegrityError) as info:
        get_artifact(backend_store, MANIFEST)
    one_line_naming(info.value, blob_key(files["config.json"]["sha256"]), MANIFEST, "expected 1000 bytes, found 500")


@pytest.mark.parametrize("bad", [{"size": 1}, {"sha256": "../../../runs/r2/secret", "size": 1},
                                 {"sha256": "AB" * 32, "size": 1}, {"sha256": "ab" * 32}, "not an entry",
                                 {"sha256": "ab" * 32, "size": -1}, {"sha256": "ab" * 32, "size": True}],
                         ids=["no digest", "digest is a path", "upper-case digest", "no size", "not an object",
                              "negative size", "boolean size"])
def test_a_manifest_entry_without_a_valid_digest_and_size_is_refused(backend_store: ObjectStore, bad) -> None:
    craft_manifest(backend_store, MANIFEST, {"config.json": bad})
    with pytest.raises(IntegrityError) as info:
        get_artifact(backend_store, MANIFEST)
    one_line_naming(info.value, MANIFEST, "'config.json'", "re-publish")


def test_a_name_component_is_limited_in_utf8_bytes_not_characters() -> None:
    from actions.store.safe_paths import MAX_COMPONENT_BYTES, name_problem

    assert name_problem("a" * MAX_COMPONENT_BYTES) is None
    # 200 characters, 400 bytes: over what S3 and most file systems take for one component
    assert "longer than 255 bytes" in name_problem("\u00e9" * 200)


# ----------------------------------------------------------------------------- tensor sets
def _policy(store: ObjectStore, key: str = "runs/r1/policy/v000001/manifest.json") -> tuple[str, str]:
    pub = publish_tensors(store, key, {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)})
    return key, pub.weights_sha256


def test_weights_are_checked_against_the_committed_fingerprint(backend_store: ObjectStore) -> None:
    key, sha = _policy(backend_store)
    assert torch.equal(load_tensors(backend_store, key, expected_sha256=sha)[0]["b"], torch.ones(3))
    # A second writer republishes other weights at the same key: the commit's fingerprint catches it.
    publish_tensors(backend_store, key, {"w": torch.zeros(2, 3), "b": torch.ones(3)})
    with pytest.raises(IntegrityError) as info:
        load_tensors(backend_store, key, expected_sha256=sha)
    one_line_naming(info.value, key, f"expected weights_sha256 {sha}", "found ")


def test_a_manifest_whose_table_and_fingerprint_disagree_is_refused(backend_store: ObjectStore) -> None:
    key, sha = _policy(backend_store)
    manifest = json.loads(backend_store.get(key))
    manifest["files"]["b"] = manifest["files"]["w"]  # point a tensor at another blob
    backend_store.put(key, json.dumps(manifest).encode())
    with pytest.raises(IntegrityError) as info:
        load_tensors(backend_store, key)
    one_line_naming(info.value, key, f"expected '{sha}'", "from its file table")
    del manifest["meta"]["weights_sha256"]
    backend_store.put(key, json.dumps(manifest).encode())
    with pytest.raises(IntegrityError) as info:
        load_tensors(backend_store, key)
    one_line_naming(info.value, key, "carries no weights_sha256")


def test_a_blob_that_is_not_one_tensor_is_an_integrity_error(backend_store: ObjectStore) -> None:
    """Digests prove bytes unchanged, not well formed: a hostile writer computes them itself."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode()
    blob = len(header).to_bytes(8, "little") + header + b"\0" * 16  # promises 4000 bytes, holds 16
    files = {"w": entry(backend_store, blob)}
    fingerprint = sha256_hex(f"w|{files['w']['sha256']}\n".encode())
    craft_manifest(backend_store, "runs/r1/policy/x/manifest.json", files, {"weights_sha256": fingerprint})
    with pytest.raises(IntegrityError) as info:
        load_tensors(backend_store, "runs/r1/policy/x/manifest.json")
    one_line_naming(info.value, "runs/r1/policy/x/manifest.json", "'w'", "not a valid one-tensor safetensors")


def test_a_kv_bundle_whose_meta_does_not_match_its_tensors_is_refused(backend_store: ObjectStore) -> None:
    from actions.engines.kv_bundle import load_bundle

    key = "runs/r1/steps/000000/kv/v000000/manifest.json"
    publish_tensors(backend_store, key, {"p0.logits": torch.zeros(4)},
                    {"policy_version": 0, "prefixes": [[1, 2]], "num_layers": 1_000_000})
    with pytest.raises(IntegrityError) as info:
        load_bundle(backend_store, key, 0)
    one_line_naming(info.value, key, "malformed")


def test_optimizer_state_names_must_name_a_parameter() -> None:
    from actions.store.optim_state import load_optimizer_tensors

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    for name in ("p7.exp_avg", "p0.__class__", "../p0.exp_avg", "p0"):
        with pytest.raises(ValueError) as info:
            load_optimizer_tensors(opt, {name: torch.zeros(2)}, where="runs/r1/opt/manifest.json")
        one_line_naming(info.value, "runs/r1/opt/manifest.json", "p<index>.<field>")


# ----------------------------------------------------------------------------- commit records
def _committed(store: ObjectStore, **changes) -> None:
    from actions.store import commit_pointer
    from flows.campaign.state import CampaignState, pointer_key

    keys = {"base_key": "runs/r1/base/manifest.json", "init_key": "runs/r1/init/manifest.json",
            "train_key": "runs/r1/data/train/manifest.json", "eval_key": "runs/r1/data/eval/manifest.json",
            "tokens_key": "runs/r1/data/tokens.json", "model": {}}
    state = CampaignState(run_id="r1", fingerprint="f", identity={}, policy_key="runs/r1/init/manifest.json",
                          reference_key="runs/r1/init/manifest.json", prepared=keys)
    if "prepared" in changes:  # a key of the prepared inputs changed, the others as they were
        changes["prepared"] = state.prepared.model_copy(update=changes["prepared"])
    for field, value in changes.items():
        setattr(state, field, value)
    commit_pointer(store, pointer_key("r1"), {"step": 0, "state": state.model_dump(mode="json")})


@pytest.mark.parametrize("changes", [
    {"policy_key": "../../etc/manifest.json"}, {"policy_key": "runs/other-run/policy/manifest.json"},
    {"optimizer_key": "/abs/manifest.json"}, {"prepared": {"base_key": "runs\\r1\\..\\..\\x"}},
    {"run_id": "someone-else"}, {"weights_sha256": "not-a-digest"},
], ids=["traversal", "other run", "absolute", "backslash", "other run id", "bad fingerprint"])
def test_a_commit_record_naming_keys_outside_its_run_is_refused(backend_store: ObjectStore, changes) -> None:
    from flows.campaign.state import load_state

    _committed(backend_store, **changes)
    with pytest.raises((UnsafeName, IntegrityError)) as info:
        load_state(backend_store, "r1")
    one_line_naming(info.value, "commit record of run 'r1'")


def test_a_commit_record_that_is_not_a_record_is_refused(backend_store: ObjectStore) -> None:
    from flows.campaign.state import load_state

    backend_store.put("runs/r1/campaign/commits/step-000000.json", b"[1, 2, 3]")
    with pytest.raises(IntegrityError) as info:
        load_state(backend_store, "r1")
    one_line_naming(info.value, "runs/r1/campaign/commits/step-000000.json")


# ----------------------------------------------------------------------------- symlinks (local store)
@pytest.fixture
def layout(tmp_path: Path) -> tuple[LocalStore, Path]:
    """A local store and a sentinel directory beside it that must stay as it is."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret bytes")
    return LocalStore(tmp_path / "store"), outside


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def test_a_blob_that_is_a_symlink_out_of_the_store_is_not_read(layout) -> None:
    store, outside = layout
    digest = sha256_hex(b"secret bytes")  # the link's target even has the promised digest
    link = store.root / blob_key(digest)
    link.parent.mkdir(parents=True)
    link.symlink_to(outside / "secret")
    craft_manifest(store, MANIFEST, {"config.json": {"sha256": digest, "size": 12}})
    with pytest.raises(UnsafeName) as info:
        get_artifact(store, MANIFEST)
    one_line_naming(info.value, blob_key(digest), "symlink")
    with pytest.raises(UnsafeName):
        store.exists(blob_key(digest))
    assert store.list("blobs/") == []


def test_a_directory_symlink_out_of_the_store_is_neither_read_nor_written(layout) -> None:
    store, outside = layout
    store.root.mkdir(parents=True)
    (store.root / "runs").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    for attempt in (lambda: store.get("runs/secret"), lambda: store.put("runs/r1/x.json", b"{}"),
                    lambda: store.put_if_absent("runs/new", b"1"), lambda: store.get_buffer("runs/secret")):
        with pytest.raises(UnsafeName) as info:
            attempt()
        one_line_naming(info.value, "symlink")
    assert snapshot(outside) == before and store.list("runs/") == []


def test_writing_over_a_symlinked_key_replaces_the_link_not_its_target(layout) -> None:
    store, outside = layout
    store.put("runs/r1/latest.json", b"{}")
    (store.root / "runs/r1/latest.json").unlink()
    (store.root / "runs/r1/latest.json").symlink_to(outside / "secret")
    assert store.put_if_absent("runs/r1/latest.json", b"new") is False  # the link counts as present
    store.put("runs/r1/latest.json", b"new")
    assert (outside / "secret").read_bytes() == b"secret bytes"
    assert store.get("runs/r1/latest.json") == b"new"


# ----------------------------------------------------------------------------- model directories
@pytest.mark.parametrize("case", ["parent", "absolute", "backslash parent", "NUL"])
def test_base_files_are_written_only_beneath_the_model_directory(tmp_path: Path, case: str) -> None:
    from actions.engines.factory import write_model_dir

    name = HOSTILE_NAMES[case]
    with pytest.raises(UnsafeName) as info:
        write_model_dir({"config.json": b"{}", name: b"pwned"}, {"w": torch.zeros(1)})
    one_line_naming(info.value, "base model")
    assert not Path("/tmp/escape.txt").exists()


def test_write_beneath_refuses_a_symlinked_subdirectory(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeName):
        write_beneath(model_dir, "sub/config.json", b"{}", where="base model")
    assert list(outside.iterdir()) == []
    assert check_name("sub/config.json", where="w") == "sub/config.json"


# ----------------------------------------------------------------------------- the reproduced finding
@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Scratch model directories go under ``tmp``; ``outside`` is where an escape would land
    (``../../outside/pwned`` from a model directory ``tmp/<random>``)."""
    paths = {name: tmp_path / name for name in ("tmp", "outside")}
    for path in paths.values():
        path.mkdir()
    monkeypatch.setenv("TMPDIR", str(paths["tmp"]))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    return paths


def _prepared_store(store: ObjectStore, tmp_path: Path):
    from actions.prepare import prepare
    from flows.config import load_config

    cfg = load_config(None, [*TINY_OVERRIDES, f"store.uri={tmp_path / 'unused'}"])
    return prepare(cfg, store, "runs/r1")


@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_crafted_store_plus_one_evaluate_request_writes_nothing_outside(backend: str, tmp_path: Path, sandbox,
                                                                        request, monkeypatch) -> None:
    from actions.runtime.server import ActionRuntime

    if backend == "local":
        store: ObjectStore = LocalStore(tmp_path / "store")
    else:
        server = request.getfixturevalue("s3_server")
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        store = request.getfixturevalue("s3_store")
    prepared = _prepared_store(store, tmp_path)
    files, meta = get_artifact(store, prepared.base_key)
    escapes = {"../../outside/pwned": b"pwned", str(sandbox["outside"] / "abs-pwned"): b"pwned"}
    table = {name: entry(store, data) for name, data in {**files, **escapes}.items()}
    craft_manifest(store, prepared.base_key, table, meta)
    payload = {"model": {"store_uri": store.uri, "base_key": prepared.base_key, "policy_key": prepared.init_key,
                         "policy_version": 0},
               "dataset_key": prepared.eval_key, "rewards": [{"name": "repeat"}], "max_new_tokens": 4,
               "output_key": "runs/r1/evals/v000000.json"}
    status, result = ActionRuntime().run({"value": payload, "action_name": "/guest/rlhfless/evaluate"})
    assert status == 200 and "error" in result, result
    one_line_naming(Exception(result["error"]), prepared.base_key, "not a safe relative path")
    assert list(sandbox["outside"].iterdir()) == []
    assert not [p for p in tmp_path.rglob("*pwned")], "a crafted file name escaped"
    assert not store.exists("runs/r1/evals/v000000.json")


def test_instantiate_writes_base_files_only_beneath_its_scratch_directory(sandbox) -> None:
    """Defence in depth: even base files that skipped the manifest check cannot escape."""
    from actions.models.modeling import instantiate

    with pytest.raises(UnsafeName):
        instantiate({"config.json": b"{}", "../../outside/pwned": b"x"}, {})
    with pytest.raises(UnsafeName):
        instantiate({"config.json": b"{}", str(sandbox["outside"] / "abs"): b"x"}, {})
    assert list(sandbox["outside"].iterdir()) == []
    assert not [p for p in sandbox["tmp"].rglob("*") if p.is_file()], "the scratch directory was not removed"


def test_an_action_refuses_a_policy_overwritten_after_its_commit(tmp_path: Path) -> None:
    """The flow passes the commit's ``weights_sha256`` with every policy (``ModelRef``): a second
    writer that replaced the policy manifest cannot make an action load other weights."""
    from actions.runtime.server import ActionRuntime

    store = LocalStore(tmp_path / "store")
    prepared = _prepared_store(store, tmp_path)
    committed = json.loads(store.get(prepared.init_key))["meta"]["weights_sha256"]
    tensors, _ = load_tensors(store, prepared.init_key)
    publish_tensors(store, prepared.init_key, {name: t + 1 for name, t in tensors.items()})
    payload = {"model": {"store_uri": store.uri, "base_key": prepared.base_key, "policy_key": prepared.init_key,
                         "policy_version": 0, "weights_sha256": committed},
               "dataset_key": prepared.eval_key, "rewards": [{"name": "repeat"}], "max_new_tokens": 4,
               "output_key": "runs/r1/evals/v000000.json"}
    status, result = ActionRuntime().run({"value": payload, "action_name": "/guest/rlhfless/evaluate"})
    assert status == 200 and "error" in result, result
    one_line_naming(Exception(result["error"]), prepared.init_key, f"expected weights_sha256 {committed}")
