"""The name a Hugging Face forward gives its key/value cache, argument and output alike.

transformers renamed ``past_key_values`` to ``cache`` during 5.x: the old name still works in
the releases that renamed it, but warns in every process that uses it (a FutureWarning per
model class and a logged line, in every action's log) and is announced removed in 5.40. The
supported range (``pyproject.toml``) spans both names, so the engines pass and read the cache
by the name the installed release uses, read once from its output class.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers.modeling_outputs import CausalLMOutputWithPast

CACHE = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"
"""The keyword and output field of the cache in the installed transformers."""


def with_cache(cache: Any) -> dict[str, Any]:
    """The forward's keyword argument passing ``cache``: ``model(..., **with_cache(cache))``."""
    return {CACHE: cache}


def cache_of(output: Any) -> Any:
    """The cache a forward returned (``use_cache=True``)."""
    return getattr(output, CACHE)
