"""``rlhfless deploy``: make the OpenWhisk actions match the action manifest.

The manifest ships with the package (``flows/commands/openwhisk_actions.yaml``, package data;
``infra/openwhisk/actions.yaml`` in a checkout links to it), so ``rlhfless deploy`` works from an
installed wheel in any directory; ``--manifest FILE`` deploys an operator's own copy.

The manifest is declarative: one package, and per action its runtime image, memory,
time limit, per-container concurrency, log size, annotations and default parameters. A
top-level ``env`` block is bound to every action as *init* parameters, which OpenWhisk hands to
``/init`` only and the runtime server exports as environment variables (S3 endpoint and keys:
credentials never travel in activation payloads). ``${VAR}``, ``${VAR:-default}`` and
``${VAR-default}`` in ``env`` are read from the deploying shell; any other ``$`` is refused.

Action names must be ones the runtime image dispatches to (``ACTION_NAMES`` in
``actions/runtime/server.py``); ``env`` keys must be environment variable names and its values
strings (quote ``off``, ``yes``, ``4``: YAML reads them as booleans and numbers).

Deploying is idempotent: each action's desired ``ActionPut`` is compared with what the
controller has (image, limits, annotations, parameters; the controller's own ``exec`` and
``provide-api-key`` annotations are ignored), and only changed actions are PUT with
``overwrite=true``. A second deploy of the same manifest changes nothing. OpenWhisk merges the
annotations of an update into the stored ones, so an annotation that left the manifest is
named in ``delAnnotations``, which removes it. It also answers an action with its package's
parameters merged in, so those are not compared as the action's (``own_parameters``). The
package is only ever created: parameters an operator binds to it (``wsk package update -p``)
stay, and reach every action that does not set the key itself.

Before any PUT, every changed action's limits are checked against the namespace's
(``GET /namespaces/{ns}/limits``, where the controller serves it; ``deploy_limits.py``), and a
deploy that would be refused is refused whole, naming every offending action and limit. A
failure part-way (a refusal the pre-check could not see, a lost connection) names the changes
already made, which stay: fix the cause and deploy again, or roll them back.

What it does not do: delete actions that left the manifest (remove them with the ``wsk`` CLI),
or create namespaces and keys (an OpenWhisk admin task).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from actions.store.credentials import redact
from flows.commands.deploy_limits import limit_problems
from flows.commands.deploy_manifest import (
    ENV_REF,
    ActionSpec,
    DeploymentManifest,
    ManifestError,
    env_reference_problem,
    load_manifest,
    with_registry,
)
from flows.invokers.base import ActionError
from flows.invokers.openwhisk import OpenWhiskClient, OpenWhiskConfig, OpenWhiskError, OpenWhiskNotFound, RetryPolicy
from flows.invokers.openwhisk.config import credentials_configured

#: Annotations the controller adds by itself; compared only when the manifest sets them.
SYSTEM_ANNOTATIONS = frozenset({"exec", "provide-api-key"})
LIMITS_HINT = "the operator must raise whisk.limits.actions.* (see infra/openwhisk/values-gpu.yaml)"
DEPLOY_RETRY = RetryPolicy(max_attempts=4, request_timeout_s=12.0, backoff_max_s=4.0, retry_after_max_s=10.0)
"""The bounds of ``rlhfless deploy``'s requests: someone waits at the terminal, so a controller
that accepts connections but never answers is given up on within a minute (4 reads of 12 s,
under 4 s of backoff between them), not after the invoker's 8 x 30 s; a 429's ``Retry-After``
is honoured up to 10 s. A refused connection gets ``connect_attempts`` tries, as anywhere."""


class DeployError(RuntimeError):
    """The controller refused a change (or would: the limits pre-check).

    ``applied``: the changes made before the failure, which stay (empty: nothing was changed);
    ``pending``: those not made."""

    def __init__(self, message: str, applied: tuple[Change, ...] = (), pending: tuple[Change, ...] = ()) -> None:
        super().__init__(message)
        self.applied, self.pending = applied, pending

    def report(self) -> list[str]:
        """Lines for the operator after the message: what changed, what did not, what to do."""
        if not self.applied:
            return []
        lines = ["changed before the failure (live now):"] + [f"  {c.describe()}" for c in self.applied]
        lines += ["not changed:"] + [f"  {c.describe()}" for c in self.pending]
        return lines + ["fix the cause and run `rlhfless deploy` again (it changes only what still differs), "
                        "or roll the changed actions back (`wsk action update`)"]


def expand_env(values: Mapping[str, str], environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Substitute ``${VAR}``, ``${VAR:-default}`` and ``${VAR-default}`` as the shell does:
    ``:-`` gives the default when VAR is unset or empty, ``-`` only when it is unset. A plain
    ``${VAR}`` must be set and not empty: an empty binding (an exported but empty
    ``AWS_SECRET_ACCESS_KEY``) would reach every action and fail there, so it counts as unset
    (``${VAR-}`` binds an empty value on purpose). Returns (values, names of the VARs unset or
    empty that have no default). A variable's value is bound as it is, ``$`` included.

    Raises:
        ManifestError: a value holds a ``$`` none of these forms consumes (``$VAR``,
            ``${VAR:=default}``, a nested reference), naming the key, the value and the forms.
    """
    problems = [p for key, value in values.items() if (p := env_reference_problem(key, value))]
    if problems:
        raise ManifestError("env " + "; ".join(problems))
    missing: list[str] = []

    def sub(match: re.Match[str]) -> str:
        name, colon, default = match.groups()
        # ":-", and a plain reference, take an empty value as unset
        if name in environ and not ((colon or default is None) and environ[name] == ""):
            return environ[name]
        if default is not None:
            return default
        missing.append(name)
        return f"<unset ${name}>"

    return {key: ENV_REF.sub(sub, value) for key, value in values.items()}, missing


def action_body(spec: ActionSpec, env: Mapping[str, str]) -> dict[str, Any]:
    """The ``ActionPut`` body for one action (kind ``blackbox``: our runtime image)."""
    params = [{"key": k, "value": v} for k, v in sorted(spec.parameters.items())]
    params += [{"key": k, "value": v, "init": True} for k, v in sorted(env.items())]
    return {
        "exec": {"kind": "blackbox", "image": spec.docker},
        "limits": {"timeout": spec.timeout, "memory": spec.memory, "logs": spec.logs, "concurrency": spec.concurrency},
        "annotations": [{"key": k, "value": v} for k, v in sorted(spec.annotations.items())],
        "parameters": params,
    }


def diff_action(desired: Mapping[str, Any], existing: Mapping[str, Any], inherited: Any = ()) -> list[str]:
    """Names of the fields where the stored action differs from the desired ``ActionPut``.

    ``inherited``: the package's parameters (a ``KeyValue`` list), which the controller's GET
    merges under the action's own; only the action's own are compared (:func:`own_parameters`)."""
    changed = []
    exec_now = existing.get("exec") or {}
    if exec_now.get("kind") != "blackbox" or exec_now.get("image") != desired["exec"]["image"]:
        changed.append("exec.image")
    limits_now = existing.get("limits") or {}
    changed += [f"limits.{k}" for k, v in desired["limits"].items() if limits_now.get(k) != v]
    want_ann = _kv(desired["annotations"])
    have_ann = {k: v for k, v in _kv(existing.get("annotations")).items() if k not in SYSTEM_ANNOTATIONS or k in want_ann}
    if have_ann != want_ann:
        changed.append("annotations")
    want = _params(desired["parameters"])
    if own_parameters(_params(existing.get("parameters")), _params(inherited), want) != want:
        changed.append("parameters")
    return changed


def own_parameters(merged: Mapping[str, tuple[Any, bool]], inherited: Mapping[str, tuple[Any, bool]],
                   wanted: Mapping[str, tuple[Any, bool]]) -> dict[str, tuple[Any, bool]]:
    """The action's own parameters, as far as the merged GET tells them: OpenWhisk answers a
    packaged action with the package's parameters under its own (``WhiskAction.
    resolveActionAndMergeParameters``: the action's value wins on a shared key), so a stored
    parameter equal (value and ``init``) to the package's is taken as inherited and dropped,
    unless the manifest sets that key. Then it counts as the action's: the GET cannot tell an
    own parameter equal to the package's from an inherited one, and the action runs with that
    value either way. Should the package's binding change later, the GET shows the difference
    and the next deploy PUTs the action's own value. Likewise an own parameter that left the
    manifest but equals the package's stays until the package's value changes."""
    return {k: v for k, v in merged.items() if k in wanted or inherited.get(k) != v}


def stale_annotations(desired: Mapping[str, Any], existing: Mapping[str, Any]) -> list[str]:
    """Stored annotation keys the manifest no longer has, for ``delAnnotations``: OpenWhisk's
    update merges the body's annotations into the stored ones (``Actions.scala``,
    ``updateWhiskAction``), so only a named key is ever removed. The controller's own
    (``SYSTEM_ANNOTATIONS``) are kept."""
    want = _kv(desired["annotations"])
    return sorted(k for k in _kv(existing.get("annotations")) if k not in want and k not in SYSTEM_ANNOTATIONS)


def _kv(items: Any) -> dict[str, Any]:
    return {kv["key"]: kv.get("value") for kv in items or [] if isinstance(kv, dict) and "key" in kv}


def _params(items: Any) -> dict[str, tuple[Any, bool]]:
    return {kv["key"]: (kv.get("value"), bool(kv.get("init"))) for kv in items or [] if isinstance(kv, dict)}


@dataclass(frozen=True)
class Change:
    """One entity's planned change. ``fields`` lists what differs (never values: parameters
    may hold secrets)."""

    entity: Literal["package", "action"]
    name: str
    kind: Literal["create", "update", "unchanged"]
    fields: tuple[str, ...] = ()
    body: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def describe(self) -> str:
        detail = f" ({', '.join(self.fields)})" if self.fields else ""
        return f"{self.entity} {self.name}: {self.kind}{detail}"


def plan_deploy(
    manifest: DeploymentManifest,
    existing: Mapping[str, Mapping[str, Any]],
    *,
    package_exists: bool = True,
    environ: Mapping[str, str] | None = None,
    allow_unset_env: bool = False,
    inherited: Any = (),
) -> list[Change]:
    """Compare the manifest with the stored actions (``existing``: action name -> record, as the
    controller's GET answers it; ``inherited``: the package's parameters, merged into those).

    Pure: no network. ``environ`` feeds ``${VAR}`` in ``env`` (default: this process's).

    Raises:
        ManifestError: ``env`` names an unset or empty variable (unless ``allow_unset_env``, as in a dry
            run: the bodies then hold the placeholder ``<unset $VAR>``, compared, never shown).
    """
    env, missing = expand_env(manifest.env, os.environ if environ is None else environ)
    if missing and not allow_unset_env:
        raise ManifestError(f"env refers to unset or empty variable(s) {', '.join(sorted(set(missing)))}; export them "
                            "or give ${VAR:-default} (${VAR-} binds an empty value)")
    changes = [Change("package", manifest.package, "unchanged" if package_exists else "create")]
    for name, spec in manifest.actions.items():
        qualified = f"{manifest.package}/{name}"
        body = action_body(spec, env)
        record = existing.get(name)
        if record is None:
            changes.append(Change("action", qualified, "create", body=body))
            continue
        fields = diff_action(body, record, inherited)
        stale = stale_annotations(body, record)
        if stale:
            body = {**body, "delAnnotations": stale}
        changes.append(Change("action", qualified, "update" if fields else "unchanged", tuple(fields), body))
    return changes


def fetch_existing(client: OpenWhiskClient,
                   manifest: DeploymentManifest) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """(records of the manifest's actions that exist, each with the package's parameters merged
    in as the controller answers it; the package's record, None when it does not exist)."""
    try:
        package = client.get_package(manifest.package)
    except OpenWhiskNotFound:
        return {}, None
    existing = {}
    for name in manifest.actions:
        try:
            existing[name] = client.get_action(f"{manifest.package}/{name}")
        except OpenWhiskNotFound:
            pass
    return existing, package


def deploy(
    client: OpenWhiskClient,
    manifest: DeploymentManifest,
    *,
    dry_run: bool = False,
    environ: Mapping[str, str] | None = None,
) -> list[Change]:
    """Apply the plan: check the changed actions' limits against the namespace's, then create
    the package if missing and PUT (overwrite) created/updated actions. A dry run checks too.

    Raises:
        DeployError: the namespace's limits refuse some actions (nothing was changed), or the
            controller refused a change part-way (``applied`` names what changed before it).
    """
    existing, package = fetch_existing(client, manifest)
    changes = plan_deploy(manifest, existing, package_exists=package is not None, environ=environ,
                          allow_unset_env=dry_run, inherited=(package or {}).get("parameters") or ())
    todo = [c for c in changes if c.kind != "unchanged"]
    check_limits(client, todo)
    if dry_run:
        return changes
    for i, change in enumerate(todo):
        try:
            if change.entity == "package":  # only created: the operator's bindings (`wsk package update -p`) stay
                client.put_package(change.name, {"publish": False}, overwrite=True)
            else:
                client.put_action(change.name, change.body, overwrite=True)
        except OpenWhiskError as exc:
            hint = f"; {LIMITS_HINT}" if exc.status == 400 and "threshold" in str(exc) else ""
            done = f"; {i} change(s) made before it stay (listed below)" if i else "; nothing was changed"
            raise DeployError(f"{change.entity} {change.name}: {exc}{hint}{done}", tuple(todo[:i]),
                              tuple(todo[i:])) from exc
    return changes


def check_limits(client: OpenWhiskClient, changes: list[Change]) -> None:
    """Refuse, before any PUT, the actions the namespace's limits would refuse (all named in
    one message); no check where the controller does not serve ``/limits``."""
    actions = {c.name: c.body["limits"] for c in changes if c.entity == "action"}
    limits = client.get_limits() if actions else None
    problems = limit_problems(actions, limits) if limits is not None else []
    if problems:
        raise DeployError(f"the limits of namespace {client.config.namespace} refuse this deploy, so nothing was "
                          f"changed: {'; '.join(problems)}; {LIMITS_HINT}, or ask for less in the manifest")


def format_plan(changes: list[Change], *, dry_run: bool) -> str:
    counts = {k: sum(c.kind == k for c in changes) for k in ("create", "update", "unchanged")}
    summary = f"{counts['create']} to create, {counts['update']} to update, {counts['unchanged']} unchanged"
    if dry_run:
        summary += " (dry run: nothing was changed)"
    return "\n".join([_with_image(c) for c in changes] + [summary])


def _with_image(change: Change) -> str:
    """A plan line, naming the image an action is created or updated with (what ``--registry``
    and the manifest's ``docker`` make of it)."""
    image = (change.body.get("exec") or {}).get("image") if change.kind != "unchanged" else None
    return f"{change.describe()} [image {image}]" if image else change.describe()


# ---------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rlhfless deploy``."""
    parser.add_argument("--manifest", default=None,
                        help="action manifest (default: the one shipped with the package, "
                             "infra/openwhisk/actions.yaml in a checkout)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing (needs no credentials)")
    parser.add_argument("--registry", default=None, metavar="REGISTRY",
                        help="the registry the images were pushed to: every action's image becomes "
                             "REGISTRY/<the manifest's image> (e.g. registry.example.org:5000)")
    parser.add_argument(
        "--secret-block",
        default=None,
        help="Prefect Secret block with the OpenWhisk connection (default: $RLHFLESS_OPENWHISK_SECRET, "
        "else WSK_APIHOST/WSK_AUTH/__OW_NAMESPACE or ~/.wskprops)",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``rlhfless deploy``; returns the exit code (2 with a one-line message on error)."""
    try:
        manifest = with_registry(load_manifest(args.manifest), args.registry)
        if args.dry_run:
            for name in sorted(set(expand_env(manifest.env, os.environ)[1])):
                print(f"warning: env refers to unset or empty ${name}; a real deploy would stop here", file=sys.stderr)
        config = _config_or_none(args) if args.dry_run else OpenWhiskConfig.resolve(secret_block=args.secret_block)
        if config is None:
            print("no OpenWhisk credentials: planning against an empty namespace", file=sys.stderr)
            changes = plan_deploy(manifest, {}, package_exists=False, allow_unset_env=True)
        else:
            with OpenWhiskClient(config, retry=DEPLOY_RETRY) as client:
                changes = deploy(client, manifest, dry_run=args.dry_run)
    except (ValueError, OpenWhiskError, DeployError, ActionError) as exc:
        print(f"rlhfless deploy: {redact(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__}",
              file=sys.stderr)
        for line in exc.report() if isinstance(exc, DeployError) else []:
            print(line, file=sys.stderr)
        return 2
    print(format_plan(changes, dry_run=args.dry_run))
    return 0


def _config_or_none(args: argparse.Namespace) -> OpenWhiskConfig | None:
    """A dry run's connection: None when no source is configured at all (it plans against an
    empty namespace); a configured one that fails (a Secret block that does not load, a
    malformed host) is reported as a real deploy reports it."""
    if not credentials_configured(args.secret_block):
        return None
    return OpenWhiskConfig.resolve(secret_block=args.secret_block)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlhfless deploy", description="Deploy the RLHFless actions to OpenWhisk")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
