"""What each experiment tracker needs from its environment, checked before anything is written,
and the one-line error of a tracker that fails all the same.

Trackers are configured by their environment (``MLFLOW_TRACKING_URI``, ``WANDB_API_KEY`` or
``WANDB_MODE``...). One that cannot start would otherwise fail inside the flow, after the lease
was taken, with the library's own traceback (an MLflow URI of no known scheme, wandb without a
key), or hang for minutes first (an MLflow server that does not answer: its client retries a
refused connection for about four minutes). The checks read the environment and the library's
own tables, with no network, except one probe of an MLflow HTTP server: one request, no retry,
at most ``PROBE_TIMEOUT_S`` to connect and as long to answer.

Whatever these checks cannot see (a database that refuses, a W&B key the server rejects) still
fails as one line: ``Trackers.open`` turns the library's exception into :func:`tracker_error`.
"""

from __future__ import annotations

import os
import re

from actions.store.credentials import redact

PROBE_TIMEOUT_S = 3.0
"""Seconds the MLflow server probe waits to connect, and again for the answer."""
HINTS = {
    "mlflow": "check MLFLOW_TRACKING_URI",
    "wandb": "check WANDB_API_KEY (`wandb login`), WANDB_BASE_URL and WANDB_DIR (a folder wandb can write), or set "
             "WANDB_MODE=offline",
    "trackio": "check TRACKIO_PROJECT and TRACKIO_DIR",
    "tensorboard": "check observability.tensorboard_dir",
}
"""Tracker -> what to look at when it fails."""


def tracker_error(tracker: str, exc: BaseException) -> ValueError:
    """``observability.report_to 'mlflow': <what the library said>; check MLFLOW_TRACKING_URI``:
    one line, secrets removed (a URL's password, an API key), at most 400 characters of the
    library's message."""
    what = redact(" ".join(str(exc).split())) or type(exc).__name__  # redacted whole: a cut could split a secret
    what = what if len(what) <= 400 else f"{what[:300]} ... {what[-100:]}"
    return ValueError(f"observability.report_to {tracker!r}: {type(exc).__name__}: {what}; {HINTS[tracker]}")


def check_mlflow() -> None:
    """MLflow's tracking URI names a store MLflow can open here: its scheme has a store builder
    in MLflow's own registry (a database scheme needs sqlalchemy, which mlflow-skinny leaves
    out), a database's driver is installed (``check_database_driver``), a ``file:`` store is
    allowed (``MLFLOW_ALLOW_FILE_STORE``), and an ``http(s)`` server answers (one request,
    ``PROBE_TIMEOUT_S``). Nothing is created: a database or a file store is only opened by the
    tracker.

    Raises:
        ValueError: one line naming MLFLOW_TRACKING_URI, its value (without credentials) and the fix.
    """
    import mlflow
    from mlflow.store.db.db_types import DATABASE_ENGINES
    from mlflow.utils.uri import get_uri_scheme

    uri = mlflow.get_tracking_uri()
    named = (f"MLFLOW_TRACKING_URI {redact(uri)!r}" if os.environ.get("MLFLOW_TRACKING_URI")
             else f"MLflow's default tracking URI {redact(uri)!r} (MLFLOW_TRACKING_URI is unset)")
    scheme = uri if uri in ("databricks", "databricks-uc", "uc") else get_uri_scheme(uri)
    field = "observability.report_to 'mlflow'"
    schemes = _mlflow_store_schemes()
    if schemes is not None and scheme not in schemes:
        fix = ("install sqlalchemy (mlflow-skinny leaves it out) for a database store"
               if scheme in DATABASE_ENGINES else
               "set it to a database (sqlite:///mlflow.db), an http(s):// tracking server or a file: store")
        raise ValueError(f"{field}: {named} names no tracking store MLflow can open here (scheme {scheme!r}; "
                         f"known: {', '.join(sorted(s for s in schemes if s))}); {fix}")
    if scheme in DATABASE_ENGINES:
        check_database_driver(uri, f"{field}: {named}")
    if scheme in ("", "file") and not _file_store_allowed():
        raise ValueError(f"{field}: {named} is a file store, which MLflow 3 opens only with "
                         "MLFLOW_ALLOW_FILE_STORE=true; set that, or MLFLOW_TRACKING_URI to a database "
                         "such as sqlite:///mlflow.db")
    if scheme in ("http", "https"):
        _probe_mlflow_server(uri, f"{field}: {named}")


DRIVER_PACKAGES = {"psycopg2": "psycopg2-binary", "psycopg": "psycopg[binary]", "MySQLdb": "mysqlclient",
                   "pymysql": "PyMySQL", "pyodbc": "pyodbc", "pymssql": "pymssql"}
"""A database driver's module -> the package that installs it, where the names differ or are
unclear (any other module is named as its own package)."""


def check_database_driver(uri: str, named: str) -> None:
    """The database URI ``uri`` can be opened here: SQLAlchemy knows its dialect and imports
    its driver (``create_engine`` loads both and connects to nothing; MLflow opens its store
    the same way, after the run started). ``named``: how the message names the URI (its
    credentials already removed).

    Raises:
        ValueError: one line with ``named``, the driver's module and the package to install.
    """
    try:
        import sqlalchemy
    except ImportError:
        raise ValueError(f"{named} is a database, which MLflow opens with sqlalchemy; install sqlalchemy "
                         "(mlflow-skinny leaves it out)") from None
    try:
        sqlalchemy.create_engine(uri).dispose()
    except ImportError as exc:  # the dialect's driver (ModuleNotFoundError: a missing module)
        module = (exc.name or "").split(".")[0] or "the database driver"
        package = DRIVER_PACKAGES.get(module, module)
        raise ValueError(f"{named} needs the database driver {module!r}, which is not installed; "
                         f"install it (pip install '{package}') or use a database whose driver is, such as "
                         "sqlite:///mlflow.db") from None
    except Exception as exc:  # an unknown dialect (postgresql+nosuch), a malformed URL
        raise ValueError(f"{named}: SQLAlchemy cannot open it ({type(exc).__name__}: "
                         f"{redact(' '.join(str(exc).split()))[:200]}); fix MLFLOW_TRACKING_URI") from None


def _mlflow_store_schemes() -> set[str] | None:
    """The URI schemes MLflow's tracking store registry has a builder for (None: this MLflow
    keeps its registry elsewhere, and only ``Trackers.open`` will tell)."""
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry
    except ImportError:
        return None
    registry = getattr(_tracking_store_registry, "_registry", None)
    return set(registry) if isinstance(registry, dict) else None


def _file_store_allowed() -> bool:
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:  # an MLflow from before the switch opens file stores freely
        return True
    return bool(MLFLOW_ALLOW_FILE_STORE.get())


def _probe_mlflow_server(uri: str, named: str) -> None:
    """One read of the experiment the tracker will use, with no retry (MLflow's client would
    retry a refused connection for minutes): any HTTP answer but a refusal of the credentials
    means the tracker can start."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    try:
        response = http_request(get_default_host_creds(uri), "/api/2.0/mlflow/experiments/get-by-name", "GET",
                                max_retries=0, backoff_factor=0, timeout=PROBE_TIMEOUT_S, raise_on_status=False,
                                params={"experiment_name": os.environ.get("MLFLOW_EXPERIMENT_NAME", "rlhfless")})
    except Exception as exc:  # MLflow wraps requests' connection errors and timeouts in MlflowException
        raise ValueError(f"{named}: the tracking server did not answer within {PROBE_TIMEOUT_S:g} s "
                         f"({_network_reason(exc)}); start it or fix MLFLOW_TRACKING_URI") from None
    if response.status_code in (401, 403):
        raise ValueError(f"{named}: the tracking server refused the credentials (HTTP {response.status_code}); "
                         "check MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")


def _network_reason(exc: BaseException) -> str:
    """The part of a connection error that says why (``[Errno 111] Connection refused``,
    ``timed out``), without the URL it quotes."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\][^'\")]*", text) or re.search(r"[Tt]imed out|timeout", text)
    return found.group(0).strip() if found else type(exc).__name__


def check_wandb() -> None:
    """wandb can start without a prompt: its settings (``WANDB_MODE``, or ``wandb offline``'s
    settings file) keep the run on this machine, or an API key is configured for the W&B host
    (``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE``, ``wandb login``'s netrc entry). Both are
    read as ``wandb.init`` reads them (its process-wide settings, made from the environment when
    wandb is first set up), without asking the server whether the key is valid.

    Raises:
        ValueError: one line naming the settings to make.
    """
    try:
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib.wbauth.authenticate import authenticate_session
    except ImportError:  # another wandb layout: Trackers.open reports what wandb.init raises
        return
    try:
        settings = wandb_setup.singleton().settings
        if settings._offline or settings._noop:  # WANDB_MODE offline or disabled
            return
        auth = authenticate_session(host=settings.base_url, source="rlhfless", prompt=False, update_session=False)
    except Exception as exc:  # a WANDB_MODE wandb rejects; a key of the wrong form, or two sources of one
        raise tracker_error("wandb", exc) from None
    if auth is None:
        raise ValueError(f"observability.report_to 'wandb': no W&B API key is configured for "
                         f"{redact(str(settings.base_url))} and WANDB_MODE is not offline; set WANDB_API_KEY (or run "
                         "`wandb login`), or WANDB_MODE=offline to keep the run on this machine (`wandb sync` "
                         "uploads it later)")
