"""The floor of a flow run per step: what Prefect alone costs per nested flow run on the CLI's server.

Starts the same temporary local Prefect API the CLI starts (``flows.commands.local_api``: SQLite,
no event persister) and, inside one parent flow (heartbeats off for the nested runs and the
campaign's client, as the campaign runs its steps: ``flows.campaign.overhead.quiet_step_flows``,
``flows.campaign.api_client.steps_client``), times per iteration:

* ``call`` -- a plain function call (the baseline: no Prefect at all);
* ``flow`` -- an empty nested flow run;
* ``flow+task`` -- a nested flow run that submits one task and waits for it;
* ``precreated`` -- the same as ``flow+task``, run against a flow run created beforehand in the
  background (``flows.campaign.prestart.FlowRunStarter``), as the campaign runs its steps:
  what is left on the caller's critical path.

The modes alternate within each iteration, so machine noise falls on all of them alike; the
background creation of the next ``precreated`` run finishes, untimed, before the next mode (the
case of a control plane with a free core while the step runs). Prints the median and quartiles
in ms per iteration and the API requests each one waited for (counted at httpx's ``send``,
except the background thread's; the events websocket is not a request); ``--trace`` lists every
request. ``--iterations`` (30) after ``--warmup`` (3) untimed ones.

Usage::

    PREFECT_HOME=/tmp/floor-home python benchmarks/bench_prefect_floor.py --iterations 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

MODES = ("call", "flow", "flow+task", "precreated")


class RequestCounter:
    """Counts HTTP requests sent by this process's httpx clients (sync and async), and keeps
    (start, seconds, method, path, status) of each for ``--trace``."""

    def __init__(self) -> None:
        self.count = 0
        self.log: list[tuple[float, float, str, str, int, str]] = []
        self._lock = threading.Lock()
        for cls in (httpx.Client, httpx.AsyncClient):
            send = cls.send
            if cls is httpx.Client:
                def counted(client: Any, request: Any, *a: Any, _send: Callable = send, **kw: Any) -> Any:
                    t0 = self._bump()
                    response = _send(client, request, *a, **kw)
                    self._record(t0, request, response)
                    return response
            else:
                async def counted(client: Any, request: Any, *a: Any, _send: Callable = send, **kw: Any) -> Any:
                    t0 = self._bump()
                    response = await _send(client, request, *a, **kw)
                    self._record(t0, request, response)
                    return response
            cls.send = counted  # type: ignore[method-assign]

    def _bump(self) -> float:
        if not threading.current_thread().name.startswith("publish"):  # the background's are off the path
            with self._lock:
                self.count += 1
        return time.perf_counter()

    def _record(self, t0: float, request: Any, response: Any) -> None:
        self.log.append((t0, time.perf_counter() - t0, request.method, request.url.path, response.status_code,
                         threading.current_thread().name))


def _payload(x: int) -> int:
    return x + 1


def build(iterations: int, warmup: int, counter: RequestCounter) -> Callable[[], dict[str, list[tuple[float, int]]]]:
    """The parent flow; returns per mode a list of (seconds, requests) per timed iteration."""
    from prefect import flow, task

    from flows.campaign.overhead import Background, open_gate_when_running, quiet_step_flows
    from flows.campaign.prestart import FlowRunStarter

    @task(name="one-task", log_prints=False)
    def one_task(x: int) -> int:
        return _payload(x)

    @flow(name="floor-empty", log_prints=False, validate_parameters=False)
    def empty(x: int) -> int:
        return _payload(x)

    @flow(name="floor-one-task", log_prints=False, validate_parameters=False)
    def with_task(x: int) -> int:
        return one_task.submit(x).result()

    @flow(name="floor-parent", log_prints=False)
    def parent() -> dict[str, list[tuple[float, int]]]:
        out: dict[str, list[tuple[float, int]]] = {m: [] for m in MODES}
        with quiet_step_flows():
            # as the campaign does: background writes wait until the next run is Running
            quiet = threading.Event()
            background = Background(quiet)
            starter = FlowRunStarter(open_gate_when_running(with_task, quiet), background)
            quiet.set()
            starter.prepare()
            for i in range(warmup + iterations):
                for mode in MODES:
                    before, t0 = counter.count, time.perf_counter()
                    if mode == "call":
                        _payload(i)
                    elif mode == "flow":
                        empty(i)
                    elif mode == "flow+task":
                        with_task(i)
                    else:
                        quiet.clear()
                        starter.run(x=i)
                        t1, n1 = time.perf_counter(), counter.count
                        starter.prepare()  # the next one, in the background: not timed, and
                        background.submit(lambda: None, gated=False).result()  # done before the next mode
                        if i >= warmup:
                            out[mode].append((t1 - t0, n1 - before))
                        continue
                    if i >= warmup:
                        out[mode].append((time.perf_counter() - t0, counter.count - before))
            starter.close()
            background.wait()
        return out

    return parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--trace", action="store_true", help="print every API request (ms since start)")
    args = parser.parse_args()
    from flows.commands.local_api import start_local_api

    url = start_local_api()
    counter = RequestCounter()
    t_start = time.perf_counter()
    samples = build(args.iterations, args.warmup, counter)()
    if args.trace:
        for t0, dt, method, path, status, thread in counter.log:
            print(f"{1000 * (t0 - t_start):10.1f} {1000 * dt:8.1f} {status} {method} {path} [{thread}]")
    print(f"Prefect API {url or os.environ.get('PREFECT_API_URL')}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.iterations} iterations")
    print(f"{'mode':<12} {'median ms':>10} {'p25 ms':>8} {'p75 ms':>8} {'requests':>9}")
    for mode, rows in samples.items():
        ms = sorted(1000 * s for s, _ in rows)
        q = statistics.quantiles(ms, n=4)
        print(f"{mode:<12} {statistics.median(ms):>10.2f} {q[0]:>8.2f} {q[2]:>8.2f} "
              f"{statistics.median(n for _, n in rows):>9.0f}")


if __name__ == "__main__":
    main()
