"""KV bundles: the prefill action's output, one artifact per (step, policy version).

Each prefix i contributes tensors ``p{i}.k{layer}``, ``p{i}.v{layer}`` ([kv_heads, len,
head_dim]) and ``p{i}.logits`` ([V]); the manifest's meta lists every prefix's token ids and
the policy version the KV was computed with. Tensors are content-addressed blobs like weights.
"""

from __future__ import annotations

import torch

from actions.engines.kv_state import PrefixState
from actions.models import warm
from actions.store import IntegrityError, ObjectStore
from actions.store.weights import load_tensors, publish_tensors


def publish_bundle(store: ObjectStore, key: str, states: list[PrefixState], policy_version: int) -> None:
    tensors = {}
    for i, st in enumerate(states):
        for li, (k, v) in enumerate(st.kv):
            tensors[f"p{i}.k{li}"] = k
            tensors[f"p{i}.v{li}"] = v
        tensors[f"p{i}.logits"] = st.last_logits
    meta = {"policy_version": policy_version, "prefixes": [list(st.tokens) for st in states],
            "num_layers": len(states[0].kv) if states else 0}
    publish_tensors(store, key, tensors, meta)


def load_bundle(store: ObjectStore, key: str, policy_version: int,
                device: torch.device | None = None) -> dict[tuple[int, ...], PrefixState]:
    """Prefix tokens -> state, its tensors on ``device`` (default: the host). Cached while the
    container stays warm, so a GPU action copies a bundle to its device once, not per call.

    Raises:
        ValueError: the bundle was computed with another policy version than
            ``policy_version`` (on every call: the cache is keyed by the version asked for,
            so a hit is a bundle already checked against it).
        IntegrityError: the bundle's meta does not describe its tensors.
    """
    def build():
        tensors, meta = load_tensors(store, key)
        if meta.get("policy_version") != policy_version:
            raise ValueError(
                f"KV bundle {key!r} was computed with policy version {meta.get('policy_version')}, "
                f"not {policy_version}; re-run prefill for this version"
            )
        prefixes, num_layers = _check_meta(key, meta, tensors)
        tensors = {name: t.to(device) for name, t in tensors.items()} if device is not None else tensors
        out = {}
        for i, toks in enumerate(prefixes):
            kv = [(tensors[f"p{i}.k{li}"], tensors[f"p{i}.v{li}"]) for li in range(num_layers)]
            out[tuple(toks)] = PrefixState(tuple(toks), kv, tensors[f"p{i}.logits"])
        return out

    return warm.get_or_build(("kv", store.uri, key, str(device), policy_version), build)[0]


def _check_meta(key: str, meta: dict, tensors: dict[str, torch.Tensor]) -> tuple[list[list[int]], int]:
    """The bundle's (prefixes, num_layers) once they describe exactly the tensors it holds.
    A bundle comes from the store: a malformed one fails here in one line, not as a KeyError."""
    prefixes, num_layers = meta.get("prefixes"), meta.get("num_layers")
    ok = (isinstance(prefixes, list) and isinstance(num_layers, int) and not isinstance(num_layers, bool)
          and num_layers >= 0 and all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prefixes))
    expected = {f"p{i}.{part}" for i in range(len(prefixes)) for part in
                ["logits", *(f"{kv}{li}" for li in range(num_layers) for kv in "kv")]} if ok else set()
    if not ok or expected != set(tensors):
        raise IntegrityError(f"KV bundle {key!r} is malformed: its meta does not describe its tensors "
                             f"({len(tensors)} tensors); re-run prefill")
    return prefixes, num_layers
