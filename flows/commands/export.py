"""``rlhfless export``: a committed policy version as a folder ``from_pretrained`` loads.

Reads the run's commit (the latest, or ``--step N``), refuses bad arguments before anything is
written (one line, exit 2), writes the folder (``actions/models/export.py``) and, only when
asked with ``--push-to-hub`` and the hub is reachable (``HF_HUB_OFFLINE`` unset or 0), uploads it.
An upload that fails (no network, a token the hub refuses) leaves the folder complete: the
export's JSON report is printed all the same, then one line (exit 2) names the reason and how to
upload that folder once fixed.
A SIGTERM while the folder is written (``timeout``, a container stop) unwinds like Ctrl-C: the
partial folder beside ``--out`` is removed and the exit code is 143.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from actions.config.quoting import quote

_TRUE = ("1", "true", "yes", "on")
HUB_CONNECT_TIMEOUT_S = 10.0
HUB_READ_TIMEOUT_S = 120.0
"""The upload's timeouts, per connection and per read or write (not for the whole upload)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id")
    parser.add_argument("--step", type=int, default=None,
                        help="the committed step whose policy to export (default: the latest)")
    parser.add_argument("--out", required=True, help="folder to write (new, or empty)")
    parser.add_argument("--store", default=None, help="store URI (default: store.uri of --config or the default)")
    parser.add_argument("--config", help="YAML configuration whose store.uri to use")
    parser.add_argument("--merge-lora", action="store_true", help="merge a LoRA run's adapter into the model")
    parser.add_argument("--push-to-hub", metavar="REPO", default=None,
                        help="also upload the folder to this Hugging Face repo (needs HF_HUB_OFFLINE unset or 0)")


def _check_args(args: argparse.Namespace) -> Path:
    if not args.out:  # Path("") is "." (the current folder), which would be refused as not empty
        raise ValueError("export --out '' is empty; pass the folder to write, e.g. --out ./policy")
    out = Path(args.out)
    if out.is_symlink():  # the final rename would fail on it, after all the work
        raise ValueError(f"export --out {str(out)!r} is a symbolic link (to {os.path.realpath(out)!r}); pass the "
                         "new or empty folder itself, not a link to it")
    if out.exists() and not out.is_dir():
        raise ValueError(f"export --out {str(out)!r} is a file; pass a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"export --out {str(out)!r} is not empty; pass a new or empty folder")
    if out.is_dir() and Path.cwd().samefile(out):  # a folder holding the current one is not empty
        # the folder is written beside --out and renamed over it: this shell would be left in a deleted folder
        raise ValueError(f"export --out {str(out)!r} is the current folder; pass a new folder path, e.g. ./policy")
    blocked = next((p for p in out.absolute().parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:  # else a bare "[Errno 17] File exists" after the weights were read
        raise ValueError(f"export --out {str(out)!r} is inside {str(blocked)!r}, which is a file, not a folder; "
                         "pass a folder path whose parents are folders")
    home = next(p for p in out.absolute().parents if p.exists())  # the folder is written beside --out
    if not os.access(home, os.W_OK | os.X_OK):
        raise ValueError(f"export --out {str(out)!r}: {str(home)!r} cannot be written by this user; pass a folder "
                         "path you can write")
    if args.step is not None and args.step < 0:
        raise ValueError(f"export --step {args.step}: steps count from 0 (the initial policy); pass 0 or more")
    if args.push_to_hub is not None and os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in _TRUE:
        raise ValueError(f"export --push-to-hub {args.push_to_hub!r} needs the network, but HF_HUB_OFFLINE="
                         f"{os.environ['HF_HUB_OFFLINE']}; set HF_HUB_OFFLINE=0 or unset it (and log in with "
                         "`hf auth login`) to push, or drop --push-to-hub")
    if args.push_to_hub is not None:  # else refused by the hub only after the folder was written
        from huggingface_hub.utils import validate_repo_id

        try:
            validate_repo_id(args.push_to_hub)
        except ValueError as exc:
            raise ValueError(f"export --push-to-hub {quote(args.push_to_hub)} is not a hub repo id ({exc}); "
                             "pass OWNER/NAME, e.g. me/my-policy") from None
    return out


def _state(args: argparse.Namespace) -> tuple[Any, Any, bool]:
    """(store, the commit to export, whether it is the run's latest)."""
    from actions.store import open_store
    from actions.store.safe_paths import check_run_id
    from flows.campaign.state import load_state_at
    from flows.campaign.status import committed_state
    from flows.config import check_store_uri, load_config

    uri = check_store_uri(args.store) if args.store is not None else load_config(args.config, []).store.uri
    store = open_store(uri)
    run = check_run_id(args.run)
    # none yet: who sets the run up, or that its set-up was interrupted, as `status` judges it
    latest = committed_state(store, run, uri, f"export once `rlhfless status {run} --store {uri}` shows a "
                                              "committed step")
    if args.step is None or args.step == latest.step:
        return store, latest, True
    state = load_state_at(store, run, args.step) if args.step < latest.step else None
    if state is None:
        steps = exportable_steps(store, latest)
        collected = (f" (the versions of the other steps up to {latest.step} were collected, store.keep_last)"
                     if len(steps) <= latest.step else "")
        which = f"steps {compact(steps)}{collected}; pass one of them" if len(steps) > 1 else \
            f"step {compact(steps)} alone{collected}; pass it"
        raise ValueError(f"export --step {args.step}: run {run!r} can export {which}")
    return store, state, False


def exportable_steps(store: Any, latest: Any) -> list[int]:
    """The committed steps of ``latest``'s run whose policy version the store still holds (garbage
    collection deletes the others, ``flows/planning/retention.py``), ascending. One listing of
    the run's objects, and one read of each commit record (never collected) that it lists."""
    from actions.store.commits import commit_key
    from flows.campaign.state import load_state_at, pointer_key

    held = set(store.list(f"runs/{latest.run_id}/"))
    steps = [latest.step]  # its version is never collected
    for step in range(latest.step):
        if commit_key(pointer_key(latest.run_id), step) in held:
            state = load_state_at(store, latest.run_id, step, history=False)
            if state is not None and state.policy_key in held:
                steps.append(step)
    return sorted(steps)


def compact(steps: list[int]) -> str:
    """Ascending ``steps`` as text, three or more in a row as a range.

    >>> compact([0, 3, 4]), compact([0, 1, 2, 3, 7, 9, 10, 11])
    ('0, 3, 4', '0..3, 7, 9..11')
    """
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    return ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def _writing(exc: OSError, out: Path) -> bool:
    """Whether ``exc`` is about writing ``out``: the folder, a parent made for it, or the
    temporary one beside it (``.<name>.*``, ``actions/models/export.py``), not a store read."""
    if exc.filename is None:
        return False
    path, target = Path(os.fsdecode(exc.filename)).absolute(), out.absolute()
    return (path == target or path in target.parents
            or any(p.name.startswith(f".{target.name}.") for p in (path, *path.parents)))


def run(args: argparse.Namespace) -> int:
    out = _check_args(args)
    # torch and transformers load before the commit is read (seconds): a run that trains on
    # meanwhile has that much less time to collect the version read
    from actions.models.export import describe

    for attempt in (1, 2):
        store, state, latest = _state(args)
        try:
            folder, sha = _export(args, out, store, state, latest)
            break
        except _Overtaken as exc:  # the latest version, collected as it was read: take the new latest once
            if attempt == 2 or args.step is not None:
                raise ValueError(str(exc)) from None
    report = describe(folder, run_id=state.run_id, step=state.step, policy_version=state.policy_version,
                      weights_sha256=sha or None)
    if state.critic_key:  # a PPO run's value model: the policy alone is exported, as TRL's PPOTrainer saves it
        report["critic"] = f"not exported: it stays in the store at {state.critic_key}"
    failed: ValueError | None = None
    if args.push_to_hub:
        try:
            report["pushed"] = push(Path(folder.path), args.push_to_hub,
                                    f"{state.run_id} step {state.step} (policy v{state.policy_version})")
        except Exception as exc:  # noqa: BLE001 -- a hub, proxy or portal answering anything: the folder stands
            failed = push_failed(args.push_to_hub, args.out, exc)
    print(json.dumps(report, sort_keys=True))  # the folder is written whatever the hub answered
    if failed is not None:
        raise failed
    return 0


class _Overtaken(Exception):
    """The run committed on while its latest version was exported, and its collection took it."""


def _export(args: argparse.Namespace, out: Path, store: Any, state: Any, latest: bool) -> tuple[Any, str]:
    """Write ``state``'s policy to ``out``; (the folder, the version's fingerprint)."""
    from actions.config.workload import ModelConfig
    from actions.models.export import LoraVersion, export_policy
    from actions.store import ObjectNotFound
    from actions.store.weights import manifest_fingerprint
    from flows.campaign.state import load_state
    from flows.commands.cli import sigterm_unwinds

    # the run's model.lora, as it trained: only the model section is read, so settings that
    # later versions check across sections never stop an older run's export
    model_cfg = ModelConfig.model_validate(state.identity["model"])
    lora_cfg = model_cfg.lora
    # under model.lora the backbone is version 0, which is also the reference (flows/campaign/setup.py)
    lora = LoraVersion(lora_cfg, state.reference_key) if lora_cfg else None
    try:
        # version 0 without warm-up has no fingerprint in the commit: its manifest holds one
        sha = state.weights_sha256 or manifest_fingerprint(store, state.policy_key)
        with sigterm_unwinds():  # a stop part-way removes the partial folder beside --out
            folder = export_policy(store, state.prepared.base_key, state.policy_key, out,
                                   weights_sha256=sha or None, merge_lora=args.merge_lora, run=state.run_id, lora=lora,
                                   settings=_settings(model_cfg.dtype, state.identity.get("generation") or {}))
    except ObjectNotFound:
        now = load_state(store, state.run_id) if latest else None
        # it trained on while this read, far enough for its collection to take this version (it
        # keeps the previous commit whole, and checkpoints for good)
        if now is not None and now.step >= state.step + 2 and state.step not in now.checkpoints:
            raise _Overtaken(f"export: run {state.run_id!r} committed step {now.step} while step {state.step} was "
                             "being exported, and its collection (store.keep_last) removed that version; export "
                             "again, or keep versions for good with store.checkpoint_every") from None
        if latest:  # collection never deletes the latest version: something else did
            raise ValueError(f"export: the policy of run {state.run_id!r} at step {state.step} (its latest) is "
                             "missing from the store, deleted outside rlhfless or the store damaged; restore the "
                             "store from a copy, or export an earlier kept step") from None
        raise ValueError(f"export: the policy of run {state.run_id!r} at step {state.step} was deleted by garbage "
                         "collection (store.keep_last); export a later step, or keep versions with "
                         "store.checkpoint_every (or `rlhfless gc --checkpoint-every N`)") from None
    except OSError as exc:  # a folder the checks could not foresee (read-only file system, immutable)
        if not _writing(exc, out):
            raise
        raise ValueError(f"export --out {str(out)!r} cannot be written ({exc.strerror or exc}); pass a folder path "
                         "you can write") from None
    return folder, sha


def _settings(dtype: str, generation: dict[str, Any]) -> Any:
    """The run's dtype, sampling and response length as its identity records them (``top_k`` /
    ``top_p`` absent when off; 0 and 1.0 are off too, as the configuration reads them)."""
    from actions.models.export import RunSettings

    top_p = generation.get("top_p")
    return RunSettings(dtype=dtype, temperature=float(generation.get("temperature", 1.0)),
                       top_k=generation.get("top_k") or None, top_p=None if top_p in (None, 1.0) else float(top_p),
                       max_new_tokens=generation.get("max_new_tokens"))


def push(folder: Path, repo: str, message: str) -> str:
    """Upload the exported ``folder`` to the hub repo ``repo`` in one commit; returns its URL.

    A LoRA export's ``adapter/adapter_config.json`` names its base by the local folder it was
    written to; the uploaded copy names ``repo`` instead, whose root holds that backbone, so
    ``AutoPeftModelForCausalLM.from_pretrained(repo, subfolder="adapter")`` finds it on any
    machine. The local folder is left as written."""
    import httpx
    from huggingface_hub import CommitOperationAdd, HfApi, get_session

    ops = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        content: Any = path
        if rel == "adapter/adapter_config.json":
            content = json.dumps({**json.loads(path.read_text()), "base_model_name_or_path": repo},
                                 indent=2, sort_keys=True).encode()
        ops.append(CommitOperationAdd(path_in_repo=rel, path_or_fileobj=content))
    api = HfApi()
    # huggingface_hub's shared client waits forever by default: a hub or proxy that accepts the
    # connection and never answers would hang the export with its folder already complete
    get_session().timeout = httpx.Timeout(HUB_READ_TIMEOUT_S, connect=HUB_CONNECT_TIMEOUT_S)
    api.create_repo(repo, exist_ok=True)
    commit = api.create_commit(repo, ops, commit_message=message)
    return str(getattr(commit, "commit_url", commit))


def push_failed(repo: str, out: str, exc: BaseException) -> ValueError:
    """The one line for an upload of the complete folder ``out`` to ``repo`` that raised
    ``exc``: the reason (the hub's status and message, or why it could not be reached; never a
    header, so never a token), that the folder is complete, and how to upload it once fixed.
    The CLI scrubs secrets from it as from every error line."""
    from huggingface_hub import constants

    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    said = " ".join(str(getattr(exc, "server_message", None) or "").split())
    if isinstance(status, int):
        reason = f"the hub ({constants.ENDPOINT}) answered HTTP {status}" + (f": {quote(said)}" if said else "")
        fix = ("set HF_TOKEN to a token with write access to the repo, or log in with `hf auth login`"
               if status in (401, 403) else f"check that {repo} is a repo id your token may create or write to")
    else:
        import httpx

        detail = f"{type(exc).__name__}: {quote(' '.join(str(exc).split()) or 'no detail')}"
        if isinstance(exc, (httpx.ReadTimeout, httpx.WriteTimeout)):  # connected, then silence
            reason = (f"the hub ({constants.ENDPOINT}) stopped answering (no reply within the "
                      f"{HUB_READ_TIMEOUT_S:g} s timeout, {type(exc).__name__})")
        elif isinstance(exc, (httpx.TransportError, ConnectionError, TimeoutError)):
            reason = f"the hub ({constants.ENDPOINT}) could not be reached ({detail})"
        else:  # a proxy or portal answering 200 with a page the hub's client cannot read
            reason = f"the hub ({constants.ENDPOINT}) answered what the upload could not use ({detail})"
        fix = "check the network (and HF_ENDPOINT, if set), and log in (HF_TOKEN or `hf auth login`)"
    return ValueError(f"export --push-to-hub {repo}: {reason}; the export itself is complete at --out {out!r} "
                      f"(its JSON report is printed); {fix}, then upload that folder with "
                      f"{_upload_command(repo, Path(out))}")


def _upload_command(repo: str, out: Path) -> str:
    """How to upload the folder ``out`` with the installed huggingface_hub: its ``hf upload``
    where its ``hf`` CLI has that command (0.34 on), else ``upload_folder``. A LoRA export's
    adapter names the local folder as its base, which ``push`` rewrites to ``repo``: by hand the
    same edit comes first."""
    import importlib.util
    import shlex

    try:
        has_hf_upload = importlib.util.find_spec("huggingface_hub.cli.upload") is not None
    except ImportError:  # no huggingface_hub.cli package: the older `huggingface-cli`
        has_hf_upload = False
    command = (f"`hf upload {shlex.quote(repo)} {shlex.quote(str(out))}`" if has_hf_upload
               else f"`huggingface_hub.upload_folder(repo_id={repo!r}, folder_path={str(out)!r})`")
    adapter = out / "adapter" / "adapter_config.json"
    if adapter.is_file():
        command += f' after setting "base_model_name_or_path" in {str(adapter)!r} to "{repo}"'
    return command
