"""``rlhfless export``: a committed policy version as a folder ``from_pretrained`` loads, with
the logits the store's version gives (fp32, <= 1e-6), its tokenizer and chat template."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from actions.contracts import ModelRef
from actions.store import LocalStore
from flows.commands.cli import main
from flows.commands.tiny_model_dir import write_tiny_model_dir

try:
    from faultproxy import SilentServer
except ImportError:  # tests/ imported as a package
    from tests.faultproxy import SilentServer


@pytest.fixture(scope="module")
def run_store(tmp_path_factory) -> tuple[Path, dict]:
    """A store with run ``ex``: prepared from a tiny Qwen2 folder (commit 0) and one trained
    version (commit 1: the initial weights moved by noise, as an update would)."""
    from actions.prepare import prepare
    from actions.store.weights import load_tensors, publish_tensors
    from flows.campaign.state import CampaignState, commit_state
    from flows.config import load_config

    tmp = tmp_path_factory.mktemp("export")
    model = write_tiny_model_dir(tmp / "qwen2", "qwen2").path
    cfg = load_config(None, [f"model.path={model}", f"store.uri={tmp / 'store'}", "run_id=ex"])
    store = LocalStore(tmp / "store")
    prepared = prepare(cfg.workload(), store, "runs/ex")
    init, _ = load_tensors(store, prepared.init_key)
    g = torch.Generator().manual_seed(0)
    trained = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in init.items()}
    v1 = publish_tensors(store, "runs/ex/steps/000000/train/policy/manifest.json", trained)
    state = CampaignState(run_id="ex", fingerprint=cfg.fingerprint(), identity=cfg.identity(), step=0,
                          policy_key=prepared.init_key, reference_key=prepared.init_key, prepared=prepared)
    commit_state(store, state)
    commit_state(store, state.model_copy(update={"step": 1, "policy_key": v1.manifest_key, "policy_version": 1,
                                                 "weights_sha256": v1.weights_sha256}))
    return tmp / "store", {"base": prepared.base_key, "v0": prepared.init_key, "v1": v1.manifest_key,
                           "sha1": v1.weights_sha256, "model": model}


def _logits_of_store(store: Path, base: str, policy: str, ids: torch.Tensor) -> torch.Tensor:
    from actions.models.loading import load_model

    model, _, _ = load_model(ModelRef(store_uri=str(store), base_key=base, policy_key=policy, policy_version=1,
                                      dtype="float32"))
    with torch.no_grad():
        return model(ids).logits


def test_export_round_trip_gives_the_stores_logits(tmp_path, run_store, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    store, keys = run_store
    assert main(["export", "ex", "--store", str(store), "--out", str(tmp_path / "v1")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 1 and report["policy_version"] == 1 and report["weights_sha256"] == keys["sha1"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= set(report["files"])
    tok = AutoTokenizer.from_pretrained(tmp_path / "v1")
    source = AutoTokenizer.from_pretrained(keys["model"])
    chat = [{"role": "user", "content": "What is 2+3?"}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == source.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant" in text
    ids = tok(text + "It is 5.", return_tensors="pt", add_special_tokens=False).input_ids
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "v1", dtype=torch.float32).eval()
    with torch.no_grad():
        got = exported(ids).logits
    want = _logits_of_store(store, keys["base"], keys["v1"], ids)
    assert (got - want).abs().max().item() <= 1e-6
    initial = _logits_of_store(store, keys["base"], keys["v0"], ids)
    assert (got - initial).abs().max().item() > 1e-2  # the trained version, not the initial one
    assert exported.generation_config.eos_token_id == source_eos(keys["model"])

    # --step 0: the initial policy; from_pretrained gives the source folder's logits
    assert main(["export", "ex", "--store", str(store), "--step", "0", "--out", str(tmp_path / "v0")]) == 0
    sha0 = json.loads(capsys.readouterr().out)["weights_sha256"]  # no warm-up: the initial manifest's own
    assert re.fullmatch("[0-9a-f]{64}", sha0) and sha0 != keys["sha1"]
    v0 = AutoModelForCausalLM.from_pretrained(tmp_path / "v0", dtype=torch.float32).eval()
    with torch.no_grad():
        assert (v0(ids).logits - initial).abs().max().item() <= 1e-6


def source_eos(model: Path) -> list[int]:
    return json.loads((model / "generation_config.json").read_text())["eos_token_id"]


def test_sharded_export_loads_and_merge_lora_is_refused_for_a_full_run(tmp_path, run_store):
    from transformers import AutoModelForCausalLM

    from actions.models.export import export_policy

    store, keys = run_store
    folder = export_policy(LocalStore(store), keys["base"], keys["v1"], tmp_path / "sharded", max_shard_size="50KB")
    assert "model.safetensors.index.json" in folder.files and sum(f.endswith(".safetensors") for f in folder.files) > 1
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(folder.path, dtype=torch.float32)(ids).logits
    assert (got - _logits_of_store(store, keys["base"], keys["v1"], ids)).abs().max().item() <= 1e-6
    with pytest.raises(ValueError, match="no LoRA adapter"):
        export_policy(LocalStore(store), keys["base"], keys["v1"], tmp_path / "merged", merge_lora=True, run="ex")
    assert not (tmp_path / "merged").exists() and not list(tmp_path.glob(".merged.*"))


@pytest.fixture(scope="module")
def lora_store(tmp_path_factory) -> tuple[Path, dict]:
    """A ``model.lora`` run ``lx``: the backbone (commit 0) and one trained adapter (commit 1:
    the seeded adapter moved by noise, its B factors off zero so the update is not empty)."""
    from actions.models.loading import load_model
    from actions.models.lora import adapter_tensors
    from actions.prepare import prepare
    from actions.store.weights import publish_tensors
    from flows.campaign.state import CampaignState, commit_state
    from flows.config import load_config

    tmp = tmp_path_factory.mktemp("export-lora")
    model = write_tiny_model_dir(tmp / "qwen2", "qwen2").path
    cfg = load_config(None, [f"model.path={model}", f"store.uri={tmp / 'store'}", "run_id=lx", "model.lora.r=4"])
    store = LocalStore(tmp / "store")
    prepared = prepare(cfg.workload(), store, "runs/lx")
    ref = ModelRef(store_uri=str(tmp / "store"), base_key=prepared.base_key, policy_key=prepared.init_key,
                   policy_version=0, dtype="float32", lora=cfg.model.lora, backbone_key=prepared.init_key)
    seeded, _, _ = load_model(ref, fresh=True)
    g = torch.Generator().manual_seed(1)
    adapter = {k: v.detach() + 0.05 * torch.randn(v.shape, generator=g) for k, v in adapter_tensors(seeded).items()}
    v1 = publish_tensors(store, "runs/lx/steps/000000/train/policy/manifest.json", adapter)
    state = CampaignState(run_id="lx", fingerprint=cfg.fingerprint(), identity=cfg.identity(), step=0,
                          policy_key=prepared.init_key, reference_key=prepared.init_key, prepared=prepared)
    commit_state(store, state)
    commit_state(store, state.model_copy(update={"step": 1, "policy_key": v1.manifest_key, "policy_version": 1,
                                                 "weights_sha256": v1.weights_sha256}))
    trained = ref.model_copy(update={"policy_key": v1.manifest_key, "policy_version": 1,
                                     "weights_sha256": v1.weights_sha256})
    return tmp / "store", {"ref": trained, "backbone": ref}


def test_lora_run_exports_the_adapter_in_peft_format_or_merged(tmp_path, lora_store, capsys):
    """The adapter export (backbone folder + PEFT ``adapter/``) gives the logits the store's
    LoRA version gives as the actions load it (fp32, <= 1e-6); the merged export within 1e-5
    (merging adds B A into W first, a different order of the same sums); neither is the
    backbone alone."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from actions.models.loading import load_model

    store, keys = lora_store
    ids = torch.tensor([[5, 9, 14, 3, 22, 7]])
    with torch.no_grad():
        want = load_model(keys["ref"], fresh=True)[0](ids).logits
        backbone = load_model(keys["backbone"], fresh=True)[0](ids).logits
    assert (want - backbone).abs().max() > 1e-3  # the adapter changes the model

    assert main(["export", "lx", "--store", str(store), "--out", str(tmp_path / "adapter-form")]) == 0
    assert (tmp_path / "adapter-form" / "adapter" / "adapter_config.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "adapter-form")
    peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter-form" / "adapter").eval()
    with torch.no_grad():
        assert (peft_model(ids).logits - want).abs().max() <= 1e-6
    # PEFT's auto class finds the backbone from the adapter alone: the exported folder, not the
    # temporary one the backbone was read into
    from peft import AutoPeftModelForCausalLM

    auto = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter-form" / "adapter").eval()
    with torch.no_grad():
        assert (auto(ids).logits - want).abs().max() <= 1e-6

    assert main(["export", "lx", "--store", str(store), "--out", str(tmp_path / "merged"), "--merge-lora"]) == 0
    assert not (tmp_path / "merged" / "adapter").exists()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        assert (merged(ids).logits - want).abs().max() <= 1e-5
    capsys.readouterr()


def test_an_exported_model_stops_where_the_run_stopped(tmp_path):
    """A folder whose config names one EOS (512) and whose tokenizer ends a turn with another
    (514, ``<|im_end|>``), without a generation_config.json: the run stops at both, and so does
    ``generate`` on the exported folder."""
    from transformers import AutoTokenizer, GenerationConfig

    from actions.models.export import export_policy
    from actions.models.loading import load_model
    from actions.models.special_tokens import special_tokens
    from actions.prepare import prepare
    from flows.config import load_config

    folder = write_tiny_model_dir(tmp_path / "qwen2", "qwen2").path
    (Path(folder) / "generation_config.json").unlink()
    config = json.loads((Path(folder) / "config.json").read_text())
    (Path(folder) / "config.json").write_text(json.dumps({**config, "eos_token_id": 512}))
    cfg = load_config(None, [f"model.path={folder}", f"store.uri={tmp_path / 'store'}", "run_id=eos"])
    store = LocalStore(tmp_path / "store")
    prepared = prepare(cfg.workload(), store, "runs/eos")
    model, tokenizer, _ = load_model(ModelRef(store_uri=str(tmp_path / "store"), base_key=prepared.base_key,
                                              policy_key=prepared.init_key, policy_version=0))
    ran = special_tokens(model, tokenizer)
    assert set(ran.eos_ids) == {514, 512}
    export_policy(store, prepared.base_key, prepared.init_key, tmp_path / "out", run="eos")
    gen = GenerationConfig.from_pretrained(tmp_path / "out")
    assert set(gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]) == {514, 512}
    assert gen.pad_token_id == ran.pad_id
    assert AutoTokenizer.from_pretrained(tmp_path / "out").eos_token_id == 514


# ----------------------------------------------------------------------------- a stopped or odd export

_SLOW_EXPORT = """
import sys, time
import actions.models.export as ex
stop_as_trained = ex._stop_as_trained
def slow(model, folder):  # stands in for a long save_pretrained: the partial folder exists meanwhile
    stop_as_trained(model, folder)
    print("writing", flush=True)
    time.sleep(60)
ex._stop_as_trained = slow
from flows.commands.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_during_export_removes_the_partial_folder(tmp_path, run_store):
    """``timeout`` or a container stop sends SIGTERM: the export unwinds (exit 143) and leaves
    neither --out nor the hidden folder it was writing beside it."""
    import signal
    import subprocess
    import sys

    store, _ = run_store
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_EXPORT, "export", "ex", "--store", str(store),
                             "--out", str(tmp_path / "model")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout.readline().strip() == "writing", proc.stderr.read()[-2000:]
        assert [p.name for p in tmp_path.glob(".model.*")], "the partial folder is written beside --out"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_sigterm_unwinds_inside_the_block_only():
    """What ``train`` and ``export`` run under: SIGTERM is SystemExit(143) inside, and the
    previous handler is back outside."""
    import signal
    import time

    from flows.commands.cli import sigterm_unwinds

    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exc, sigterm_unwinds():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # interrupted by the handler's SystemExit
    assert exc.value.code == 143 and signal.getsignal(signal.SIGTERM) is previous


def test_exported_folder_and_files_get_the_usual_modes(tmp_path, run_store):
    """Readable as ``save_pretrained`` leaves a folder (0o777 / 0o666 less the umask), not
    owner-only like a temporary folder: another user or a serving container can load it."""
    import stat

    from actions.models.export import export_policy

    store, keys = run_store
    previous = os.umask(0o027)
    try:
        folder = export_policy(LocalStore(store), keys["base"], keys["v1"], tmp_path / "out")
    finally:
        os.umask(previous)
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in [tmp_path / "out", *(tmp_path / "out").rglob("*")]}
    assert modes["out"] == 0o750 and "out/tokenizer.json" in modes and "out/model.safetensors" in modes
    assert {m for k, m in modes.items() if k != "out"} == {0o640}, modes
    assert sorted(folder.files) == sorted(k.removeprefix("out/") for k in modes if k != "out")


def test_a_symlink_out_is_refused_before_any_work(tmp_path, run_store, capsys):
    """A link to an empty folder passes "new or empty", but the final rename cannot replace a
    link with a folder: refused up front, naming the link and the fix, and nothing is written."""
    store, _ = run_store
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert main(["export", "ex", "--store", str(store), "--out", str(tmp_path / "link")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "symbolic link" in err and "not a link" in err and "Errno" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"] and not any((tmp_path / "real").iterdir())


def test_the_current_folder_as_out_is_refused_before_any_work(tmp_path, run_store, capsys, monkeypatch):
    """The folder is written beside --out and renamed over it: over the current folder, the
    shell would be left in a deleted one (and '.' has no name to write beside)."""
    store, _ = run_store
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    for out in (".", str(tmp_path / "here"), "../here"):
        assert main(["export", "ex", "--store", str(store), "--out", out]) == 2
        err = capsys.readouterr().err
        assert f"export --out {out!r} is the current folder; pass a new folder path, e.g. ./policy" in err, err
    assert not any((tmp_path / "here").iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == ["here"]


def test_a_run_before_its_first_commit_is_named_as_in_progress(tmp_path, capsys):
    """Prepare, warm-up and the first step come before a run's first commit: while its lease
    is held, export says so and names the holder, not "check the run id"."""
    from flows.campaign.lease import RunLease

    store = LocalStore(tmp_path / "s")
    # a trainer on another host: a lease of this very process would be judged gone (the CLI is
    # never the process that trains), see test_uncommitted_runs.py
    lease = RunLease.acquire(store, "busy", renew=False, host="trainer", pid=4242, progress=lambda m: None)
    try:
        assert main(["export", "busy", "--store", str(tmp_path / "s"), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert "run 'busy' has committed nothing yet: it is being trained by host 'trainer' pid 4242" in err, err
        assert f"`rlhfless status busy --store {tmp_path / 's'}`" in err
    finally:
        lease.release()
    assert main(["export", "busy", "--store", str(tmp_path / "s"), "--out", str(tmp_path / "o")]) == 2
    assert "has no committed state in store" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_bf16_lora_version_exports_in_bf16_as_it_was_trained(tmp_path, lora_store):
    """A LoRA run trained in bfloat16 over a backbone stored as read (fp32: no warm-up): the
    export is bfloat16, backbone and adapter alike, and gives the logits of the version as the
    actions load it (the backbone cast to the training dtype, loading.py) bit for bit; merged, it
    differs from them by bf16 rounding."""
    import shutil

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from actions.models.loading import load_model
    from actions.store.weights import load_tensors, publish_tensors
    from flows.campaign.state import commit_state, load_state

    shared, keys = lora_store
    store_root = shutil.copytree(shared, tmp_path / "store")  # the module's run stays as the other tests see it
    store = LocalStore(store_root)
    adapter = {k: v.to(torch.bfloat16) for k, v in load_tensors(store, keys["ref"].policy_key)[0].items()}
    v2 = publish_tensors(store, "runs/lx/steps/000001/train/policy/manifest.json", adapter)
    state = load_state(store, "lx")
    commit_state(store, state.model_copy(update={"step": 2, "policy_key": v2.manifest_key, "policy_version": 2,
                                                 "weights_sha256": v2.weights_sha256}))
    ref = keys["ref"].model_copy(update={"store_uri": str(store_root), "policy_key": v2.manifest_key,
                                         "policy_version": 2, "dtype": "bfloat16", "weights_sha256": v2.weights_sha256})
    ids = torch.tensor([[5, 9, 14, 3, 22, 7]])
    with torch.no_grad():
        want = load_model(ref, fresh=True)[0](ids).logits

    assert main(["export", "lx", "--store", str(store_root), "--out", str(tmp_path / "bf16")]) == 0
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    assert {p.dtype for p in base.parameters()} == {torch.bfloat16}
    # PEFT's default upcasts a bf16 adapter to fp32 (autocast_adapter_dtype); the run computed it in bf16
    peft_model = PeftModel.from_pretrained(base, tmp_path / "bf16" / "adapter", autocast_adapter_dtype=False).eval()
    with torch.no_grad():
        assert torch.equal(peft_model(ids).logits, want)
    # --merge-lora rounds W + (alpha / r) B A to bf16 once per weight: not the adapter form's logits
    # bit for bit (3.6e-2 apart here), but no farther from the fp32 model's than the run's own
    # bf16 logits are (README, "export")
    assert main(["export", "lx", "--store", str(store_root), "--out", str(tmp_path / "merged"), "--merge-lora"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        fp32 = load_model(ref.model_copy(update={"dtype": "float32"}), fresh=True)[0](ids).logits
        merged_logits = merged(ids).logits.float()
    assert 0 < float((merged_logits - want.float()).abs().max()) <= 0.1
    assert float((merged_logits - fp32).abs().max()) <= float((want.float() - fp32).abs().max())


def test_a_pushed_lora_export_names_the_hub_repo_as_the_adapters_base(tmp_path, lora_store, monkeypatch):
    """--push-to-hub uploads the folder in one commit, its adapter_config.json naming the repo
    (whose root holds the backbone) rather than this machine's folder, which stays as written.
    The hub cannot be reached from the tests: HfApi is replaced by a recorder of its calls."""
    import huggingface_hub

    from flows.commands.export import push

    store, _ = lora_store
    assert main(["export", "lx", "--store", str(store), "--out", str(tmp_path / "ex")]) == 0
    calls = []

    class Recorder:
        def create_repo(self, repo, exist_ok=False):
            calls.append(("create_repo", repo, exist_ok))

        def create_commit(self, repo, operations, commit_message):
            calls.append(("create_commit", repo, {op.path_in_repo: op.path_or_fileobj for op in operations}))
            return "https://hub.example/me/model/commit/1"

    monkeypatch.setattr(huggingface_hub, "HfApi", Recorder)
    assert push(tmp_path / "ex", "me/model", "lx step 1") == "https://hub.example/me/model/commit/1"
    assert calls[0] == ("create_repo", "me/model", True)
    uploaded = calls[1][2]
    local = {p.relative_to(tmp_path / "ex").as_posix() for p in (tmp_path / "ex").rglob("*") if p.is_file()}
    assert set(uploaded) == local and "adapter/adapter_config.json" in local
    config = json.loads(uploaded["adapter/adapter_config.json"])
    assert config["base_model_name_or_path"] == "me/model"
    on_disk = json.loads((tmp_path / "ex" / "adapter" / "adapter_config.json").read_text())
    assert on_disk["base_model_name_or_path"] == str((tmp_path / "ex").resolve())
    assert {k: v for k, v in config.items() if k != "base_model_name_or_path"} == \
        {k: v for k, v in on_disk.items() if k != "base_model_name_or_path"}


HUB_TOKEN = "hf_MARKERtokenNeverEchoed1234"


@contextlib.contextmanager
def hub_at(answer: str) -> Iterator[tuple[str, list[str]]]:
    """(endpoint, requests it received): a loopback hub that answers every request 401, a
    captive portal that answers every request 200 with an HTML page ("portal"), an address
    where nothing listens (a port bound, then closed), or a server that accepts and never
    answers ("silent")."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []
    if answer == "silent":
        silent = SilentServer()
        try:
            yield silent.endpoint, seen
        finally:
            seen.extend(["request"] * silent.requests)
            silent.close()
        return
    if answer == "unreachable":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield f"http://127.0.0.1:{port}", seen
        return

    class Refusing(BaseHTTPRequestHandler):
        def refuse(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            seen.append(f"{self.command} {self.path}")
            portal = answer == "portal"
            body = b"<html>sign in to the network</html>" if portal else b'{"error":"Invalid username or password."}'
            self.send_response(200 if portal else 401)
            self.send_header("content-type", "text/html" if portal else "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = refuse

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("answer, needles", [
    ("401", ("HTTP 401", "Invalid username or password", "HF_TOKEN", "`hf auth login`")),
    ("unreachable", ("could not be reached", "ConnectError", "check the network")),
    ("portal", ("answered what the upload could not use", "check the network")),
    ("silent", ("stopped answering (no reply within the 0.5 s timeout, ReadTimeout)", "check the network")),
])
def test_a_push_the_hub_refuses_or_cannot_take_prints_the_report_then_one_line(tmp_path, run_store, monkeypatch,
                                                                                  capsys, answer, needles):
    """The export succeeded: its report is printed and the folder is complete at --out; the
    failed upload is one line naming --push-to-hub, the reason, and how to upload that folder
    once fixed, never the token."""
    import huggingface_hub.constants

    store, keys = run_store
    out = tmp_path / "v1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # read when huggingface_hub is imported
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setattr("flows.commands.export.HUB_READ_TIMEOUT_S", 0.5)  # a hub that never answers: not forever
    with hub_at(answer) as (endpoint, seen):
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
        rc = main(["export", "ex", "--store", str(store), "--out", str(out), "--push-to-hub", "me/x"])
    stdout, stderr = capsys.readouterr()
    assert rc == 2 and bool(seen) == (answer != "unreachable")
    report = json.loads(stdout)
    assert report["weights_sha256"] == keys["sha1"] and "pushed" not in report
    assert sorted(report["files"]) == sorted(p.name for p in out.iterdir()) and (out / "model.safetensors").is_file()
    assert "Traceback" not in stderr and HUB_TOKEN not in stdout + stderr
    errors = [line for line in stderr.splitlines() if line.startswith("rlhfless")]
    assert len(errors) == 1 and errors[0] == stderr.strip().splitlines()[-1], stderr
    for needle in ("--push-to-hub me/x", f"complete at --out {str(out)!r}", f"`hf upload me/x {out}`", *needles):
        assert needle in errors[0], f"{needle!r} not in: {errors[0]}"


def test_export_names_what_went_wrong_with_the_store_or_the_folder(tmp_path, run_store, capsys, monkeypatch):
    import shutil
    import types

    store, keys = run_store
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    # the latest version, which collection never deletes, gone: the store is damaged, not collected
    shutil.rmtree(copy / Path(keys["v1"]).parent)
    assert main(["export", "ex", "--store", str(copy), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "(its latest) is missing from the store" in err and "garbage collection" not in err
    # ... unless the run committed again meanwhile: its own collection removed the version
    from flows.campaign.state import commit_state, load_state
    from flows.commands import export as export_cmd

    was = load_state(LocalStore(copy), "ex")
    commit_state(LocalStore(copy), was.model_copy(update={"step": 2, "policy_version": 2}))
    monkeypatch.setattr(export_cmd, "_state", lambda args: (LocalStore(copy), was, True))  # read before the commits
    assert main(["export", "ex", "--store", str(copy), "--out", str(tmp_path / "a")]) == 2
    assert "(its latest) is missing" in capsys.readouterr().err  # the previous commit is never collected
    commit_state(LocalStore(copy), was.model_copy(update={"step": 3, "policy_version": 3}))
    assert main(["export", "ex", "--store", str(copy), "--out", str(tmp_path / "a")]) == 2
    assert "committed step 3 while step 1 was being exported" in capsys.readouterr().err
    monkeypatch.undo()
    # without --step, a latest version collected as it was read gives way to the new latest, once
    fresh = tmp_path / "fresh"
    shutil.copytree(store, fresh)
    stale = load_state(LocalStore(fresh), "ex")
    for step in (2, 3):
        commit_state(LocalStore(fresh), stale.model_copy(update={"step": step, "policy_version": step}))
    collected = stale.model_copy(update={"policy_key": stale.policy_key + "-collected"})
    reads, read = [(LocalStore(fresh), collected, True)], export_cmd._state
    monkeypatch.setattr(export_cmd, "_state", lambda args: reads.pop() if reads else read(args))
    assert main(["export", "ex", "--store", str(fresh), "--out", str(tmp_path / "d")]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 3 and not reads
    monkeypatch.undo()
    shutil.rmtree(tmp_path / "d")
    shutil.rmtree(fresh)
    # an earlier version gone is what collection does (store.keep_last)
    shutil.rmtree(copy / Path(keys["v0"]).parent)
    assert main(["export", "ex", "--store", str(copy), "--step", "0", "--out", str(tmp_path / "a")]) == 2
    assert "at step 0 was deleted by garbage collection (store.keep_last)" in capsys.readouterr().err
    # a folder the user cannot write: one line naming --out, nothing left beside it
    def refused(suffix=None, prefix=None, dir=None):  # noqa: A002 -- tempfile's own parameter name
        raise PermissionError(13, "Permission denied", f"{dir}/{prefix}x")

    monkeypatch.setattr("actions.models.export.tempfile", types.SimpleNamespace(mkdtemp=refused))
    assert main(["export", "ex", "--store", str(store), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "export --out" in err and "cannot be written (Permission denied)" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    # an empty --store is refused, never read as the default store
    assert main(["export", "ex", "--store", "", "--out", str(tmp_path / "c")]) == 2
    assert "store.uri is empty" in capsys.readouterr().err
    assert main(["status", "--store", ""]) == 2
    assert "store.uri is empty" in capsys.readouterr().err
