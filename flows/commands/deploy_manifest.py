"""The OpenWhisk action manifest of ``rlhfless deploy``: its schema, reading and checks.

``load_manifest`` reads a manifest (the shipped one by default: package data of
``flows.commands``, ``infra/openwhisk/actions.yaml`` in a checkout) with the project's YAML
loader (aliases bounded, keys unique) and validates it, naming the file and each offending
field; ``with_registry`` puts every image under a registry. What deploying does with a manifest
is ``flows/commands/deploy.py``'s.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flows.config_yaml import AliasBomb, load_yaml, yaml_problem

DEFAULT_MANIFEST = "openwhisk_actions.yaml"
"""The shipped manifest: package data of ``flows.commands`` (read with importlib.resources)."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_SECRET_KEY = re.compile("SECRET|PASSWORD|TOKEN|KEY", re.IGNORECASE)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""An ``env`` key: a name the shell can export (the runtime refuses others at ``/init``)."""
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)-([^}$]*))?\}")
"""A reference in an ``env`` value to the deploying shell's environment: ``${VAR}``,
``${VAR:-default}`` or ``${VAR-default}`` (a default holds no ``}`` and no ``$``)."""
ENV_FORMS = "${VAR}, ${VAR:-default} or ${VAR-default}"


class ManifestError(ValueError):
    """The manifest is missing, unreadable or invalid; the message names the field."""


INT32_MAX = 2**31 - 1
"""The largest limit the API's ``ActionLimits`` holds (int32 fields)."""


class ActionSpec(BaseModel):
    """One action. Units follow OpenWhisk's ``ActionLimits``; limits are whole numbers (strict:
    ``true`` or ``"256"`` is refused, not read as 1 or 256)."""

    model_config = ConfigDict(extra="forbid")

    docker: str = Field(min_length=1)
    """Runtime image, ``registry/name:tag`` (an explicit tag: ``latest`` forces a pull check
    on every cold start)."""
    memory: int = Field(256, ge=128, le=INT32_MAX, strict=True)
    """Memory limit, MB. Also the invoker's scheduling currency (see docs/openwhisk.md)."""
    timeout: int = Field(60_000, ge=100, le=INT32_MAX, strict=True)
    """Time limit, milliseconds."""
    concurrency: int = Field(1, ge=1, le=INT32_MAX, strict=True)
    """Activations one container serves at once."""
    logs: int = Field(10, ge=0, le=INT32_MAX, strict=True)
    """Log size limit, MB."""
    annotations: dict[str, Any] = {}
    """E.g. ``invoker-resources: [gpu]`` (tag-based scheduling) and ``gpus: 1`` (accounting)."""
    parameters: dict[str, Any] = {}
    """Default parameters, merged under every payload."""

    @field_validator("docker")
    @classmethod
    def _check_image(cls, v: str) -> str:
        if any(c.isspace() for c in v):
            raise ValueError(f"image {v!r} contains whitespace")
        return v

    @field_validator("parameters")
    @classmethod
    def _check_parameters(cls, v: dict[str, Any]) -> dict[str, Any]:
        """Default parameters are payload fields (lower case). An environment variable's name here
        would be merged into every payload, refused by every activation and echoed in its
        record: a secret would be stored where anyone with the namespace reads it."""
        envlike = [k for k in v if re.fullmatch(r"[A-Z][A-Z0-9_]*", str(k))]
        if envlike:
            raise ValueError(f"{', '.join(envlike)}: an environment variable is not a parameter (parameters are "
                             "merged into every payload); put it under the manifest's top-level env:")
        return v

    @field_validator("annotations")
    @classmethod
    def _check_gpus(cls, v: dict[str, Any]) -> dict[str, Any]:
        gpus = v.get("gpus", 0)
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
            raise ValueError(f"annotation gpus must be a non-negative integer, got {gpus!r}")
        return v


class DeploymentManifest(BaseModel):
    """``infra/openwhisk/actions.yaml``. Top-level keys starting with ``x-`` are YAML anchors
    for reuse and are ignored."""

    model_config = ConfigDict(extra="forbid")

    package: str = Field("rlhfless", pattern=NAME_PATTERN)
    env: dict[str, str] = {}
    """Bound to every action as init parameters (container environment)."""
    actions: dict[str, ActionSpec] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _drop_extensions(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not str(k).startswith("x-")}
        return data

    @field_validator("actions")
    @classmethod
    def _check_names(cls, v: dict[str, ActionSpec]) -> dict[str, ActionSpec]:
        from actions.runtime import server  # read now, not at import: tests register test actions

        for name in v:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"action name {name!r} may use letters, digits, '_', '.', '-' only")
        unknown = [name for name in v if name not in server.ACTION_NAMES]
        if unknown:
            raise ValueError(f"action name(s) {', '.join(map(repr, unknown))} unknown to the runtime image, which "
                             f"runs {', '.join(sorted(server.ACTION_NAMES))}; rename or remove them")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _check_env(cls, v: Any) -> Any:
        """Keys are environment variable names (``ENV_NAME``): the runtime exports them at
        ``/init`` and refuses others, which would fail every activation. Values are strings
        (an empty ``KEY:`` is ""): ``off`` unquoted is YAML's False and would reach the actions
        as 'False'. A ``$`` in a value must belong to one of ``ENV_FORMS``
        (:func:`env_reference_problem`)."""
        if not isinstance(v, dict):
            return v
        names = [_not_a_name(key) for key in v if not (isinstance(key, str) and ENV_NAME.fullmatch(key))]
        if names:
            raise ValueError("; ".join(names))
        bad = [f"{key}: {_unquoted(key, val)}" for key, val in v.items()
               if val is not None and not isinstance(val, str)]
        if bad:
            raise ValueError("values must be strings; " + "; ".join(bad))
        refs = [problem for key, val in v.items() if val and (problem := env_reference_problem(key, val))]
        if refs:
            raise ValueError("; ".join(refs))
        return {k: "" if val is None else val for k, val in v.items()}


def _not_a_name(key: Any) -> str:
    """Why an env key is refused, with a name that would do."""
    suggestion = re.sub(r"[^A-Za-z0-9_]", "_", str(key))
    suggestion = suggestion if re.match(r"[A-Za-z_]", suggestion) else f"_{suggestion}"
    return (f"key {str(key)!r} is not an environment variable name (letters, digits and '_', not starting with "
            "a digit); the actions' runtime exports env keys as environment variables and refuses this one "
            f"at /init, so every activation would fail; rename it, e.g. {suggestion}")


def env_reference_problem(key: str, value: str) -> str | None:
    """Why the ``env`` value ``value`` of ``key`` holds a ``$`` that none of ``ENV_FORMS``
    consumes (``$VAR``, ``${VAR:=default}``, an unclosed ``${``, a reference nested in a
    default), or None. Such a ``$`` would otherwise be bound as literal text. A value under a
    secret-looking key is not shown.

    >>> env_reference_problem("R", "${R:-us-east-1}") is None
    True
    >>> env_reference_problem("H", "$HOME")[:52]
    "H: '$HOME' holds a '$' that is not part of ${VAR}, $"
    """
    if "$" not in ENV_REF.sub("", value):
        return None
    shown = "(value not shown: the key looks secret)" if _SECRET_KEY.search(key) else repr(value)
    return (f"{key}: {shown} holds a '$' that is not part of {ENV_FORMS}, the only forms read from the "
            "deploying shell ($VAR, ${VAR:=default}, a reference inside a default and an unclosed ${ are not); "
            "write one of those forms, or, for a literal '$', export the value in a variable and write ${VAR}")


def _unquoted(key: Any, value: Any) -> str:
    """Why an env value is refused and how to write it (a number's value hidden under a
    secret-looking key)."""
    if isinstance(value, bool):
        meant = '"off" or "false"' if value is False else '"on" or "true"'
        return (f"YAML read the unquoted value as the boolean {value}, which would reach the actions as "
                f"{str(value)!r}; quote it, e.g. {key}: {meant}")
    kind = type(value).__name__
    if _SECRET_KEY.search(str(key)):
        article = "an" if kind[0] in "aeiou" else "a"
        return f"YAML read the unquoted value as {article} {kind}, not a string; quote it as written"
    return (f"YAML read the unquoted value as the {kind} {value!r}, not a string; quote it as written, "
            f'e.g. {key}: "{value}"')


def load_manifest(path: str | Path | None = None) -> DeploymentManifest:
    """Read and validate a manifest; ``None`` reads the one shipped with the package.

    Raises:
        ManifestError: naming the file and each offending field, e.g.
            ``actions.generate.memory: Input should be greater than or equal to 128 (got 0)``.
    """
    path = shipped_manifest() if path is None else Path(path)
    try:
        data = load_yaml(path.read_text())
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the manifest: {exc.strerror}") from None
    except AliasBomb as exc:
        raise ManifestError(f"{path}: refused: {exc}; write the repeated settings out, or use fewer anchors") from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML{yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a mapping with 'package' and 'actions', got {type(data).__name__}")
    try:
        return DeploymentManifest.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            # value errors are our validators': their messages name the value already
            named = err["type"] in ("missing", "extra_forbidden", "value_error")
            shown = type(err["input"]).__name__ if "env" in err["loc"] else repr(err["input"])  # env: maybe secrets
            got = "" if named else f" (got {shown})"
            problems.append(f"{where}: {err['msg']}{got}")
        raise ManifestError(f"{path}: " + "; ".join(problems)) from None


def shipped_manifest() -> Path:
    """Where the packaged manifest lies (a source checkout or an installed wheel alike)."""
    from importlib.resources import files

    return Path(str(files("flows.commands") / DEFAULT_MANIFEST))


def with_registry(manifest: DeploymentManifest, registry: str | None) -> DeploymentManifest:
    """``manifest`` with every action's image under ``registry`` (``--registry``), or as is.

    >>> m = DeploymentManifest(actions={"noop": {"docker": "rlhfless/runtime-cpu:0.1.0"}})
    >>> with_registry(m, "reg.example.org:5000/").actions["noop"].docker
    'reg.example.org:5000/rlhfless/runtime-cpu:0.1.0'
    """
    if registry is None:
        return manifest
    prefix = registry.strip().rstrip("/")
    if not prefix or any(c.isspace() for c in prefix) or "://" in prefix:
        raise ValueError(f"--registry {registry!r}: give a registry host[:port][/path], e.g. "
                         "registry.example.org:5000, without a scheme")
    actions = {name: spec.model_copy(update={"docker": f"{prefix}/{spec.docker}"})
               for name, spec in manifest.actions.items()}
    return manifest.model_copy(update={"actions": actions})
