"""The live campaign's handles (config, store, invoker, fault injector), shared by flow tasks.

Prefect runs tasks in threads of the flow's process; handles such as the invoker's HTTP pool
are not parameters (they are not serialisable), so tasks read them from here. Set once by the
campaign before any flow runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from actions.store import ObjectStore, get_json
from flows.config import CampaignConfig
from flows.invokers.base import Invoker
from flows.step.faults import FaultInjector
from flows.step.live_inputs import LiveInputs
from flows.step.token_table import TokenTable


@dataclass
class RunContext:
    config: CampaignConfig
    store: ObjectStore
    invoker: Invoker
    run_id: str
    live: LiveInputs | None = None
    """The planner's measured inputs (``flows/campaign/live_profile.py``), set at campaign start."""
    faults: FaultInjector = field(default=None)  # type: ignore[assignment]
    """Fault injection (``faults.*``, resilience tests); None: built from ``config.faults``."""
    before_train: Callable[[], None] = field(default=lambda: None)
    """Called by the step flow just before it invokes training. The campaign holds its
    background control-plane jobs there (``flows/campaign/run.py``): training runs one thread
    per core, and a job beside it costs the whole team (``flows/invokers/cores.py``)."""

    _tokens: tuple[str, TokenTable] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.faults is None:
            self.faults = FaultInjector(self.config.faults)

    def token_table(self, key: str) -> TokenTable:
        """The prepared token table at ``key`` (``Prepared.tokens_key``), read once: the set-up
        and the step loop share it (200,000 prompts are ~50 MB of JSON, seconds to parse)."""
        if self._tokens is None or self._tokens[0] != key:
            self._tokens = (key, TokenTable(get_json(self.store, key), key))
        return self._tokens[1]

    @property
    def prefix(self) -> str:
        return f"runs/{self.run_id}"


_current: RunContext | None = None


def set_context(ctx: RunContext | None) -> None:
    global _current
    _current = ctx


def current() -> RunContext:
    if _current is None:
        raise RuntimeError("no campaign context: flows must run inside rlhf_campaign or with set_context()")
    return _current
