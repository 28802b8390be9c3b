"""Drafting strategies for speculative decoding (``actions/engines/speculative.py``).

Each strategy proposes, per batch row, up to k tokens that might follow the row's context.
A draft is only a guess: the engine keeps a drafted token only where it equals the token the
target model itself draws at that position, so a strategy changes speed, never outputs.

* ``prompt_lookup`` -- n-gram matches in the row's own prompt and response so far;
* ``history`` -- the same prompt's responses from earlier epochs (``flows/campaign/drafts.py`` keeps
  them in the store, bounded);
* ``draft_model`` -- not provided: on the tiny CPU models a second model's forward costs about
  as much as the target's, and on GPU vLLM brings its own (``docs/vllm.md``).
"""

from __future__ import annotations

from actions.engines.drafters.base import Drafter
from actions.engines.drafters.history import HistoryDrafter
from actions.engines.drafters.prompt_lookup import PromptLookupDrafter

STRATEGIES = ("history", "prompt_lookup")
"""Every strategy name ``generation.draft_strategies`` accepts."""

__all__ = ["Drafter", "HistoryDrafter", "PromptLookupDrafter", "STRATEGIES"]
