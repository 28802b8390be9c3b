"""The ``rlhfless`` command line: train, status, gc, simulate, deploy, profile, tiny-model,
export (and ``rlhfless --version``).

Bad input (configuration, data, model path, store, credentials, arguments) is answered with
one line on stderr naming what is wrong and how to fix it, and exit code 2; nothing is
written to the store before the input has been validated.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.campaign.preflight import checked  # imports nothing heavy: a refusal stays fast
from flows.commands.resume_command import print_continue, resume_command, resume_hint
from flows.invokers.cores import MKL_REPRODUCIBLE

if TYPE_CHECKING:
    from flows.config import CampaignConfig

# Quiet, offline-friendly defaults for the embedded Prefect server; users may override them.
# HF_HUB_OFFLINE stays the user's: unset or 0 lets `prepare` fetch hub ids (actions/models/hub.py).
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")  # the client's usage notice and its telemetry, as the server's
# MKL's reproducible mode, as the pool's workers run: set before torch's first matrix product,
# so actions run in this process (the in-process invoker) give the workers' bits
os.environ.setdefault("MKL_CBWR", MKL_REPRODUCIBLE)


class UsageError(ValueError):
    """A bad command line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep the one-line format
        where = "" if self.prog == "rlhfless" else f"{self.prog}: "
        raise UsageError(f"{where}{message}; see `{self.prog} --help`")


def _add_train(sub: Any) -> None:
    p = sub.add_parser("train", help="run or resume a training campaign")
    p.add_argument("--config", help="YAML campaign configuration")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set algorithm.name=ppo (repeatable)")
    p.add_argument("--steps", type=int, help="total RL steps (same as --set steps=N)")
    p.add_argument("--run-id", help="name of the run in the store (default: derived from the config)")
    p.add_argument("--out", help="run directory for the summary and report (default runs/<run_id>)")
    p.add_argument("--summary", help="where to write the JSON summary (default <out>/summary.json)")
    p.add_argument("--resume", action="store_true", help="continue an existing run from its last committed step")
    p.add_argument("--break-lease", action="store_true",
                   help="take the run's lease even if another process holds it (only when that process is gone)")


def _add_status(sub: Any) -> None:
    p = sub.add_parser("status", help="print the state of a run")
    p.add_argument("run", nargs="?", help="run id (default: the only run in the store)")
    p.add_argument("--store", default=None, help="store URI (default: store.uri of the default config)")
    p.add_argument("--config", help="YAML configuration whose store.uri to use")


def _add_gc(sub: Any) -> None:
    p = sub.add_parser("gc", help="delete a run's old versions and the blobs nothing kept references")
    p.add_argument("run", nargs="?", help="run id (default: the only run in the store)")
    p.add_argument("--store", default=None, help="store URI (default: store.uri of the default config)")
    p.add_argument("--config", help="YAML configuration whose store settings to use")
    p.add_argument("--keep-last", type=int,
                   help="versions to keep (default: store.keep_last of --config, else the one the run's last "
                        "commit was made with, else the default configuration's)")
    p.add_argument("--checkpoint-every", type=int,
                   help="keep every Nth version so far for good: later collections, training's included, keep "
                        "them too (default: store.checkpoint_every, from the same place as --keep-last's)")
    p.add_argument("--orphan-grace-hours", type=float, default=24.0, metavar="H",
                   help="also delete blobs no manifest lists (a publish that died) last written more than H hours ago "
                        "(default 24; shorten only while nothing writes the store)")
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
    p.add_argument("--break-lease", action="store_true", help="take the run's lease even if another process holds it")


def version() -> str:
    """The installed distribution's version, or the source tree's ``pyproject.toml`` version
    when the package runs from a checkout that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("rlhfless")
    except PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, ValueError):
            return "unknown"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser. With ``command`` (the subcommand about to run) the other plugin subcommands
    are listed without importing their modules: a refusal of ``train`` stays fast."""
    parser = _Parser(prog="rlhfless", description="Serverless RLHF: Prefect flows of OpenWhisk-style actions")
    parser.add_argument("--version", action="version", version=f"rlhfless {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)
    _add_status(sub)
    _add_gc(sub)
    for name, module, helptext in (("simulate", "flows.simulate.cli", "replay a length trace on a modelled cluster"),
                                   ("deploy", "flows.commands.deploy", "create or update the OpenWhisk actions"),
                                   ("profile", "flows.commands.measure", "measure the engine's time per output token"),
                                   ("tiny-model", "flows.commands.tiny_model", "write a tiny Hugging Face model folder"),
                                   ("export", "flows.commands.export", "write a committed policy as a model folder"),
                                   ("config", "flows.commands.config_show",
                                    "print the resolved configuration, or the reference of every key")):
        if command is not None and command != name:
            sub.add_parser(name, help=helptext)
            continue
        try:
            mod = __import__(module, fromlist=["add_arguments"])
        except ImportError:
            continue
        p = sub.add_parser(name, help=helptext)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _preflight(cfg: CampaignConfig, out: Path, summary_path: Path, resume: bool, break_lease: bool) -> Any:
    """Every check that needs no campaign: the run's lease first (a second ``train`` of a
    held run is refused in about a second, before any input is read or any code the config
    names is imported), then output paths, the existing run, and the checks the flow makes
    too (``flows/campaign/preflight.py``: inputs, engine, trackers, invoker). Reads only;
    before Prefect or any worker starts, so a refusal is one line (a failure inside the flow
    would log a traceback). Then takes the run's lease (the first write) and returns it."""
    from actions.store import open_store
    from flows.campaign.lease import RunLease, check_not_held

    store = open_store(cfg.store.uri)  # an unreachable endpoint, bad credentials or a missing bucket fail here
    run_id = cfg.resolved_run_id()
    check_not_held(store, run_id, break_lease=break_lease)
    checks = [("--out", out, None), ("--summary", summary_path.parent, summary_path)]
    if cfg.invoker.kind != "inprocess" and cfg.invoker.log_dir:  # the pool's logs; OpenWhisk: prepare's
        checks.append(("invoker.log_dir", Path(cfg.invoker.log_dir), None))
    from flows.campaign.preflight import check_campaign, check_directory

    for flag, path, file in checks:  # a file, or a directory that cannot be written or created
        try:
            check_directory(path, flag, file)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if summary_path.is_dir():
        raise UsageError(f"--summary {str(summary_path)!r} is a directory; pass a file path")
    from flows.campaign.state import check_resume, load_state  # no Prefect import: a refusal stays fast

    existing = load_state(store, run_id)
    check_resume(existing, cfg, resume, store)  # its warnings are the flow's to print, once
    if resume and existing is None:  # not an error (a scheduled run's first night), but worth a line
        from flows.campaign.status import same_task_runs_hint

        print(f"note: --resume: the store holds no committed step of run {run_id!r}; starting it"
              f"{same_task_runs_hint(store, run_id, explicit=cfg.run_id is not None)}", file=sys.stderr)
    # the flow's own checks, the same list (the invoker's last: OpenWhisk is one request)
    check_campaign(cfg, resumed=existing is not None)
    return RunLease.acquire(store, run_id, ttl_s=cfg.store.lease_ttl_s, break_lease=break_lease)


def _earlier_run(cfg: Any) -> None:
    """Resume a run whose id was derived before its settings' identity gained two keys
    (``flows/campaign/earlier_ids.py``): name it in ``cfg`` and say so."""
    from actions.store import open_store
    from flows.campaign.earlier_ids import resumed_run_id

    earlier = resumed_run_id(cfg, open_store(cfg.store.uri))
    if earlier is not None:
        print(f"note: --resume: run {earlier!r} is the one these settings named before model.lora and "
              f"reward.models were part of a run's identity (now {cfg.resolved_run_id()!r}); resuming it",
              file=sys.stderr)
        cfg.run_id = earlier


def _train(args: argparse.Namespace) -> int:
    from flows.config import load_config
    from flows.planning.objective import knobs_off_default, unread_knob_warnings

    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps {args.steps}: a campaign runs at least one RL step; pass --steps N with N >= 1")
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"steps={args.steps}")
    if args.run_id is not None:  # "" is refused by the validator, not silently replaced by the default
        overrides.append(f"run_id={json.dumps(args.run_id)}")  # a JSON string is a YAML string: "007" stays text
    cfg = load_config(args.config, overrides)
    sys.stderr.writelines(f"{w}\n" for w in unread_knob_warnings(cfg.scaling.objective, knobs_off_default(cfg.scaling)))
    if args.resume:
        _earlier_run(cfg)
    out = Path(args.out or f"runs/{cfg.resolved_run_id()}")
    summary_path = Path(args.summary) if args.summary else out / "summary.json"
    if cfg.invoker.log_dir is None:  # worker logs live in the run directory
        cfg.invoker.log_dir = str(out / "logs")
    if cfg.observability.tensorboard_dir is None:  # and so do the event files, and wandb's folder beside them
        cfg.observability.tensorboard_dir = str(out / "tensorboard")
    if args.resume:
        from flows.campaign.finished import finished_run_line

        finished = finished_run_line(cfg, summary_path)
        if finished is not None:  # nothing to do: the summary stays as the run left it
            print(finished[0])
            try:  # but a stop between the summary's write and the report's left no report
                from flows.commands.report import redraw_missing_report

                if (drawn := redraw_missing_report(summary_path, out)) is not None:
                    print(f"{drawn} was missing: drawn again from the summary")
            except ImportError:
                pass
            print_continue(args, cfg, finished[1], finished[2])
            return 0
        # complete but without the summary of its last commit (stopped while writing it, or failed
        # after committing): the resume below trains nothing and writes it
    lease = _preflight(cfg, out, summary_path, args.resume, args.break_lease)
    try:
        summary = _campaign(cfg, args.resume, lease)
    except (KeyboardInterrupt, Terminated) as exc:  # the flow recorded its crash; the run resumes from its last commit
        return stopped(exc, cfg.resolved_run_id(), resume_command(args, cfg.resolved_run_id()))
    except Exception as exc:
        from flows.commands.reported_errors import reported_in_one_line

        if not reported_in_one_line(exc):
            raise
        return _failed(exc, resume_hint(cfg, resume_command(args, cfg.resolved_run_id())))
    try:
        with sigterm_unwinds():  # a stop now ends in one line; the summary is whole or absent
            _write_outputs(summary, out, summary_path)
    except (KeyboardInterrupt, Terminated) as exc:
        return stopped(exc, cfg.resolved_run_id(), resume_command(args, cfg.resolved_run_id()))
    _print_summary(summary, summary_path, cfg.scaling.gpus_per_actor)
    print_continue(args, cfg, summary.get("stopped_reason"), summary)
    return 0


def _campaign(cfg: CampaignConfig, resume: bool, lease: Any) -> dict[str, Any]:
    """The campaign flow's summary, run holding ``lease`` (``_preflight``'s), which is released
    before this returns or raises, on SIGTERM and Ctrl-C too: a warning of the release (a store
    that would not delete it) is printed before the line that ends the command, never after
    the error it would hide."""
    try:
        # the flow skips the checks _preflight made
        with sigterm_unwinds(), checked(cfg):
            from flows.campaign.run import rlhf_campaign
            from flows.commands.local_api import start_local_api
            from flows.commands.reported_errors import one_line_console

            start_local_api()  # under a lock in PREFECT_HOME: concurrent first runs set its database up once
            with one_line_console():  # the error line the caller prints, not Prefect's traceback of it
                return rlhf_campaign(config=cfg.model_dump(mode="json"), resume=resume)
    finally:
        lease.release()


def _write_outputs(summary: dict[str, Any], out: Path, summary_path: Path) -> None:
    """The summary first, whole or not at all (written beside and renamed over, so a stop
    mid-write leaves none: ``train --resume`` then writes it again, training nothing), then
    the report, which can always be drawn again from the summary."""
    from flows.commands.measure import write_whole

    out.mkdir(parents=True, exist_ok=True)
    summary["run_dir"] = str(out)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(summary_path, json.dumps(summary, indent=2, sort_keys=True, allow_nan=False))  # NaN is null
    try:
        from flows.commands.report import write_report

        write_report(summary, out)
    except ImportError:
        pass


def _number(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec``; ``nan`` for None (a summary holds a NaN as null)."""
    return format(float("nan") if value is None else value, spec)


def _print_summary(summary: dict[str, Any], summary_path: Path, gpus_per_actor: int = 1) -> None:
    """``train``'s last lines: evaluation, bill, planner and engine figures, the summary's path."""
    from flows.campaign.reporting import evaluation_line

    parts, wall, total = summary["billed_gpu_seconds_by_part"], summary["wall_seconds"], summary["wall_seconds_total"]
    resumed = f" ({total:.0f} s in all)" if round(total) != round(wall) else ""  # a resume: every session's
    unit = summary["billing"]["unit"]  # an action's seconds count once per GPU it holds (cost_metrics): no wall time
    unit += f" x {gpus_per_actor} GPUs per actor" if unit == "action-seconds" and gpus_per_actor != 1 else ""
    print(f"{evaluation_line(summary)}; billed {summary['billed_gpu_seconds']:.1f} {unit} (steps {parts['steps']:.1f}, "
          f"evaluations {parts['evaluations']:.1f}, set-up {parts['setup']:.1f}); wall {wall:.0f} s{resumed}")
    profile, fid = summary.get("profile"), (summary.get("planner_fidelity") or {}).get("generate", {})
    if profile:
        print(f"planner profile: {profile['source']} {profile['name']}")
    if fid.get("steps"):
        print(f"planner predicted vs measured generation actions' phase: median relative error "
              f"{_number(fid['median_relative_error'], '+.1%')} over {fid['steps']} steps")
    engine = summary.get("engine") or {}
    if engine.get("starts") or engine.get("weight_pushes"):
        print(f"generation engine: {engine['starts']:.0f} started ({engine['start_s']:.1f} s), "
              f"{engine['weight_pushes']:.0f} versions pushed in place ({engine['weight_push_s']:.2f} s)")
    print(summary_path)


class Terminated(SystemExit):
    """SIGTERM arrived inside :func:`sigterm_unwinds`; ``code`` is the exit status (143)."""


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM ends a command as Ctrl-C does: by unwinding, so ``train`` releases its lease and
    stops the workers and the Prefect server, and ``export`` removes its partial folder (the
    default action would skip all of that)."""
    raise Terminated(128 + signum)


def stopped(exc: KeyboardInterrupt | Terminated, run_id: str | None = None, command: str | None = None) -> int:
    """Report a command stopped part-way by Ctrl-C or SIGTERM in one line (its clean-ups ran
    while the exception unwound), naming the run to resume and the ``command`` that does;
    returns the exit status, 130 or 143 as a shell reports a process killed by that signal."""
    code = exc.code if isinstance(exc, Terminated) and isinstance(exc.code, int) else 128 + signal.SIGINT
    how = "interrupted" if code == 128 + signal.SIGINT else f"stopped by {signal.Signals(code - 128).name}"
    then = (f"; run {run_id!r} continues from its last committed step (or starts again, where it committed "
            f"none) with `{command or 'rlhfless train --resume'}`" if run_id else "")
    print(f"rlhfless: {how}{then}", file=sys.stderr)
    return code


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Inside the block, SIGTERM (``timeout``, a container stop) raises ``SystemExit(143)`` in
    the main thread, so ``finally`` and ``except BaseException`` clean-ups run; the previous
    handler is restored on leaving."""
    from flows.commands.main_thread_signals import route_stop_signals

    route_stop_signals()  # threads started from now on leave SIGTERM to the main thread
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _only_run(store: Any, uri: str, command: str) -> str:
    """The one run of the store (``committed_runs``; where none committed, ``stored_runs``: a
    first run that failed before its first commit is ``incomplete``, not absent)."""
    from flows.campaign.status import committed_runs, stored_runs

    runs = committed_runs(store) or stored_runs(store)
    if not runs:
        raise ValueError(f"store {uri} holds no runs; check --store (or store.uri of --config)")
    if len(runs) != 1:
        raise ValueError(f"store {uri} holds {len(runs)} runs ({', '.join(runs)}); name one: "
                         f"rlhfless {command} RUN_ID")
    return runs[0]


def _locate_run(args: argparse.Namespace, command: str) -> tuple[Any, Any, str, str]:
    """(config, store, the store's URI, the run id) for ``status`` and ``gc``."""
    from actions.store import open_store
    from actions.store.safe_paths import check_run_id
    from flows.config import check_store_uri, load_config

    cfg = load_config(args.config, [])
    uri = check_store_uri(args.store) if args.store is not None else cfg.store.uri  # '' is refused, not the default
    store = open_store(uri)
    return cfg, store, uri, check_run_id(args.run or _only_run(store, uri, command))


def _open_run(args: argparse.Namespace, command: str) -> tuple[Any, Any, Any]:
    """(config, store, the run's latest state) for ``gc``; a run not committed yet is refused
    as ``status`` judges its lease (set up now, or its set-up interrupted)."""
    from flows.campaign.status import committed_state

    cfg, store, uri, run = _locate_run(args, command)
    return cfg, store, committed_state(store, run, uri, f"{command} has nothing of it to collect yet")


def _status(args: argparse.Namespace) -> int:
    """The run's last commit, its lease (who trains it now) and the state word they make
    (``flows/campaign/status.py``), as JSON; a run set up under its lease, not yet committed, is
    ``running``."""
    from flows.campaign.status import status_report

    _, store, uri, run = _locate_run(args, "status")
    report = status_report(store, run)
    if report is None:
        raise ValueError(f"store {uri} holds nothing of run {run!r}; check the run id and --store")
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


def _gc(args: argparse.Namespace) -> int:
    """Collect a run's garbage under its lease, and the store's leftovers (killed writes'
    temporary files, orphan blobs); the checkpoints its retention keeps are pinned for good
    (``flows/campaign/pins.py``). Prints the retention it applied (a line on stderr) and the report as JSON."""
    for flag, value, least in (("--keep-last", args.keep_last, 1), ("--checkpoint-every", args.checkpoint_every, 0),
                               ("--orphan-grace-hours", args.orphan_grace_hours, 0)):
        if value is not None and not value >= least:  # NaN too
            raise UsageError(f"gc {flag} {value}: use {least} or more")
    cfg, store, state = _open_run(args, "gc")
    from flows.campaign.collect import collect_garbage, gc_retention
    from flows.campaign.lease import RunLease, check_not_held
    from flows.campaign.state import load_state

    retention, applied = gc_retention(args.keep_last, args.checkpoint_every, cfg.store, args.config,
                                      state.retention)
    orphan_grace_s = args.orphan_grace_hours * 3600
    if args.dry_run:
        report = collect_garbage(store, state, retention, dry_run=True, orphan_grace_s=orphan_grace_s, pin=True)
    else:
        check_not_held(store, state.run_id, break_lease=args.break_lease)
        with RunLease.acquire(store, state.run_id, ttl_s=cfg.store.lease_ttl_s, break_lease=args.break_lease,
                              progress=lambda m: print(m, file=sys.stderr)) as lease:
            state = load_state(store, state.run_id) or state  # the newest commit, now that no one writes
            report = collect_garbage(store, state, retention, lease=lease, orphan_grace_s=orphan_grace_s, pin=True)
    # after the collection: a refusal stays one line
    print(f"gc: {'would apply' if args.dry_run else 'applied'} keep_last {applied['keep_last']} "
          f"({applied['keep_last_from']}), checkpoint_every {applied['checkpoint_every']} "
          f"({applied['checkpoint_every_from']})", file=sys.stderr)
    print(json.dumps({**report.to_dict(), "dry_run": args.dry_run, "retention": applied}, sort_keys=True))
    return 0


MAX_ERROR_CHARS = 1200


def _bounded(text: str) -> str:
    """An error line of at most ``MAX_ERROR_CHARS``: messages quote values bounded
    (``actions.config.quoting``); this is the backstop for one that does not. The start (what
    failed) and the end (the fix) are kept."""
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return f"{text[:800]} [... {len(text) - 1100:,} characters ...] {text[-300:]}"


def main(argv: list[str] | None = None) -> int:
    from flows.commands.main_thread_signals import route_stop_signals

    route_stop_signals()  # before any thread starts: Ctrl-C and SIGTERM interrupt the main thread's waits
    from flows.commands.closed_pipe import CLOSED, flushed

    try:
        status = _main(argv)
    except SystemExit:  # argparse's --help and usage errors: their output flushed here too
        if flushed(0, _failed) == CLOSED:
            return CLOSED
        raise
    return flushed(status, _failed)


def _main(argv: list[str] | None) -> int:
    try:
        words = sys.argv[1:] if argv is None else argv
        if words[:1] == ["--version"]:  # before the parser: it would import every subcommand
            print(f"rlhfless {version()}")
            return 0
        command = next((w for w in words if not w.startswith("-")), None)
        args, extra = build_parser(command).parse_known_args(argv)
        if extra:  # argparse would blame the top-level parser; point at the subcommand's help
            raise UsageError(f"rlhfless {args.command}: unrecognized arguments: {' '.join(extra)}; "
                             f"see `rlhfless {args.command} --help`")
        if args.command == "train":
            return _train(args)
        if args.command == "status":
            return _status(args)
        if args.command == "gc":
            return _gc(args)
        return int(args._run(args))
    except (KeyboardInterrupt, Terminated) as exc:  # not a traceback: nothing failed
        return stopped(exc)
    except BrokenPipeError as exc:  # `rlhfless status | head -1`
        from flows.commands.closed_pipe import closed_or

        return closed_or(exc, _failed)
    except (ValueError, OSError) as exc:
        return _failed(exc)
    except Exception as exc:  # infrastructure failures: one line, secrets scrubbed, non-zero
        from flows.commands.reported_errors import reported_in_one_line

        if reported_in_one_line(exc):
            return _failed(exc)
        raise


def _failed(exc: BaseException, hint: str = "") -> int:
    """The one ``rlhfless: error:`` line (bounded, secrets scrubbed) and exit status 2."""
    from actions.store.credentials import redact

    print(f"rlhfless: error: {_bounded(redact(str(exc)))}{hint}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
