"""Policy versions in the object store: one safetensors blob per tensor plus a manifest.

Layout (all keys relative to the store root):

* ``blobs/sha256/<2>/<sha256>`` -- one tensor serialised with ``safetensors`` (never pickle).
  Content-addressed, so a tensor that did not change between versions (frozen parameters,
  the reference model shared by every run) is stored and uploaded once.
* ``<prefix>/manifest.json`` -- the file table (tensor name -> blob sha256) written last;
  a version exists exactly when its manifest exists.

``weights_sha256`` is the campaign's reproducibility fingerprint: the sha256 of the lines
``"<name>|<blob sha256>\n"`` in name order, where the blob is the tensor's canonical
one-tensor safetensors encoding (name, dtype, shape, raw bytes). It does not depend on the
backend, equals a hash of the manifest's file table, and costs publishing no extra pass over
the bytes.

Loading does not copy a blob after it arrives: each tensor is a view of the downloaded buffer
(S3) or of a private copy-on-write memory map of the blob file (local store), after the blob's
sha256 has been verified.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from actions.store import (
    IntegrityError,
    ObjectStore,
    PutStats,
    get_artifact,
    get_blob,
    put_artifact,
    read_manifest,
    sha256_hex,
    transfer_threads,
)
from actions.store.safe_paths import shown

# safetensors dtype tags (https://github.com/huggingface/safetensors, format spec).
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "U16": torch.uint16, "U32": torch.uint32,
    "U64": torch.uint64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
}  # fmt: skip
_TAGS = {dtype: tag for tag, dtype in _DTYPES.items()}
STORED_DTYPES = tuple(_DTYPES.values())
"""Every dtype a stored tensor may have (the safetensors tags above)."""


@dataclass(frozen=True)
class PublishedWeights:
    """Where a published tensor set lives and what publishing it cost."""

    manifest_key: str
    weights_sha256: str
    stats: PutStats


def weights_sha256(tensors: Mapping[str, torch.Tensor]) -> str:
    """Deterministic fingerprint of a state dict (names, dtypes, shapes, bytes)."""
    return _fingerprint({name: sha256_hex(tensor_blob_parts(name, t)) for name, t in tensors.items()})


def _fingerprint(blob_digests: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(blob_digests):
        h.update(f"{name}|{blob_digests[name]}\n".encode())
    return h.hexdigest()


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    t = tensor.detach().cpu().contiguous()
    # reshape(-1) lets 0-d tensors be viewed as bytes; numpy exposes the memory without a copy.
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def tensor_blob_parts(name: str, tensor: torch.Tensor) -> tuple[bytes, memoryview]:
    """The safetensors file for one tensor as (header, tensor memory), without copying the
    tensor. Byte-identical to ``safetensors.torch.save({name: tensor})``: an 8-byte
    little-endian header length, the compact JSON header padded with spaces to a multiple of
    8, then the raw little-endian data."""
    dtype = tensor.dtype
    if dtype not in _TAGS:
        try:
            return (serialize_tensor(name, tensor), memoryview(b""))
        except (KeyError, ValueError, TypeError) as exc:  # safetensors' own message is the bare dtype
            raise ValueError(f"tensor {shown(name)} has dtype {str(dtype).removeprefix('torch.')}, which safetensors "
                             "cannot store; convert it to a stored dtype first (e.g. .to(torch.float32))") from exc
    data = _tensor_bytes(tensor)
    entry = {"dtype": _TAGS[dtype], "shape": list(tensor.shape), "data_offsets": [0, data.nbytes]}
    header = json.dumps({name: entry}, separators=(",", ":"), ensure_ascii=False).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header, data


def serialize_tensor(name: str, tensor: torch.Tensor) -> bytes:
    """One tensor as a safetensors file (one tensor per file keeps blobs content-addressable
    per parameter)."""
    return st_save({name: tensor.detach().cpu().contiguous()})


def publish_tensors(
    store: ObjectStore,
    manifest_key: str,
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any] | None = None,
    *,
    scalars_in_meta: bool = False,
) -> PublishedWeights:
    """Upload ``tensors`` (only the ones whose bytes are new) and write the manifest last.

    Blobs are built from the tensors' own memory (no serialisation copy; a tensor on another
    device is copied to the host by the thread that uploads it, so host memory holds at most
    ``store.max_concurrency`` such copies at once, not the whole set: the tensors must be ready
    on their device's default stream, which those threads copy on) and uploaded in parallel;
    the fingerprint is derived from their digests. The tensors must not be modified
    while this runs (the bytes are read twice: hashed, then sent).

    ``scalars_in_meta``: 0-dim tensors go in the manifest's meta (``SCALARS``), not in blobs.
    For optimizer state: AdamW's per-parameter ``step`` counts are the same bytes in every run
    at the same step, and a blob another run's collection deletes between this publish finding
    it present and this manifest appearing would be lost (``flows/campaign/collect.py``).
    """
    scalars = {n: t for n, t in tensors.items() if scalars_in_meta and t.dim() == 0}
    odd = sorted(n for n, t in scalars.items() if str(t.dtype).removeprefix("torch.") not in _SCALAR_DTYPES)
    if odd:  # load_tensors would refuse them
        raise ValueError(f"{manifest_key}: scalars {odd} have a dtype outside {sorted(_SCALAR_DTYPES)}")
    if scalars:
        meta = {**(meta or {}), SCALARS: {n: [str(t.dtype).removeprefix("torch."), t.item()]
                                          for n, t in scalars.items()}}
    # each blob made by the thread that uploads it: a GPU tensor's host copy is made there, beside
    # the other threads' hashing and writing, and at most one per thread is alive at a time. A
    # dtype without a tag is serialised here, first: one safetensors cannot store fails before
    # any blob is uploaded.
    files = {name: functools.partial(tensor_blob_parts, name, t) if t.dtype in _TAGS else tensor_blob_parts(name, t)
             for name, t in tensors.items() if name not in scalars}
    fingerprint: list[str] = []

    def manifest_meta(table: dict[str, dict[str, Any]]) -> dict[str, Any]:
        fingerprint.append(_fingerprint({name: entry["sha256"] for name, entry in table.items()}))
        return {**(meta or {}), "weights_sha256": fingerprint[0]}

    stats = put_artifact(store, manifest_key, files, manifest_meta)
    return PublishedWeights(manifest_key, fingerprint[0], stats)


def _view_tensor(buf: Any, name: str, manifest_key: str) -> torch.Tensor:
    """Parse a one-tensor safetensors buffer and return the tensor as a view of ``buf``.

    ``buf`` must be writable (bytearray or a copy-on-write mmap) for a zero-copy view;
    immutable ``bytes`` and unusual dtypes go through ``safetensors.torch.load`` (one copy).

    Raises:
        IntegrityError: the blob is not one well-formed tensor named ``name`` (a blob's digest
            proves it unchanged, not well formed: whoever wrote the store chose the bytes).
    """
    try:
        return _parse_tensor(buf, name, manifest_key)
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError, struct.error, SafetensorError) as exc:
        if isinstance(exc, IntegrityError):
            raise
        detail = (str(exc).splitlines() or [""])[0][:200]
        raise IntegrityError(f"blob for tensor {shown(name)} in manifest {manifest_key!r} is not a valid one-tensor "
                             f"safetensors file ({type(exc).__name__}: {detail}); re-publish it") from None


def _parse_tensor(buf: Any, name: str, manifest_key: str) -> torch.Tensor:
    if isinstance(buf, bytes):
        loaded = st_load(buf)
    else:
        (header_len,) = struct.unpack_from("<Q", buf, 0)
        header = json.loads(bytes(memoryview(buf)[8 : 8 + header_len]))
        header.pop("__metadata__", None)
        entry = header.get(name) if set(header) == {name} else None
        if entry is not None and entry["dtype"] in _DTYPES:
            dtype = _DTYPES[entry["dtype"]]
            begin, end = entry["data_offsets"]
            shape = entry["shape"]
            count = (end - begin) // dtype.itemsize
            if not 0 <= begin <= end <= len(buf) - 8 - header_len or count != math.prod(shape):
                raise ValueError(f"data_offsets {[begin, end]} do not hold a {entry['dtype']}{shape} tensor")
            if count == 0:
                return torch.empty(shape, dtype=dtype)
            flat = torch.frombuffer(buf, dtype=dtype, offset=8 + header_len + begin, count=count)
            return flat.view(shape)
        loaded = st_load(bytes(buf))
    if set(loaded) != {name}:
        raise IntegrityError(f"blob for tensor {shown(name)} in manifest {manifest_key!r} holds "
                             f"{shown(sorted(loaded))}; re-publish it")
    return loaded[name]


def check_fingerprint(manifest: Mapping[str, Any], manifest_key: str, expected: str | None = None) -> str:
    """The tensor set's ``weights_sha256``, after checking it against the manifest and ``expected``.

    The fingerprint is recomputed from the file table (whose blob digests the fetch then
    verifies), so a table edited without its fingerprint, or a manifest replaced by another
    tensor set, is caught before any blob is downloaded.

    Args:
        manifest: a manifest as ``storage.read_manifest`` returns it.
        manifest_key: its key, for the error.
        expected: the fingerprint the caller was promised (a campaign commit's
            ``weights_sha256``), or None to check only the manifest's own.

    Raises:
        IntegrityError: one line naming the key, the expected and the found digest.
    """
    found = _fingerprint({name: entry["sha256"] for name, entry in manifest["files"].items()})
    recorded = manifest.get("meta", {}).get("weights_sha256")
    if not isinstance(recorded, str):
        raise IntegrityError(f"tensor manifest {manifest_key!r} carries no weights_sha256; "
                             "re-publish it with publish_tensors")
    if recorded != found:
        raise IntegrityError(f"tensor manifest {manifest_key!r} does not match its weights_sha256: expected "
                             f"{shown(recorded)}, found {found} from its file table; re-publish it")
    if expected is not None and expected != found:
        raise IntegrityError(f"policy {manifest_key!r} is not the committed one: expected weights_sha256 "
                             f"{expected}, found {found}; the manifest was overwritten after its commit")
    return found


def manifest_fingerprint(store: ObjectStore, manifest_key: str) -> str | None:
    """The ``weights_sha256`` a tensor manifest records, checked against its file table
    (:func:`check_fingerprint`); None for a manifest that records none (an adapter's)."""
    manifest = read_manifest(store, manifest_key)
    return check_fingerprint(manifest, manifest_key) if "weights_sha256" in manifest.get("meta", {}) else None


def load_tensors(
    store: ObjectStore, manifest_key: str, *, expected_sha256: str | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load every tensor listed in a manifest (size- and sha256-verified, fetched in parallel).

    Args:
        expected_sha256: the ``weights_sha256`` the tensor set must have (see
            :func:`check_fingerprint`); None checks the manifest against itself only.

    Returns:
        (tensors by name, the manifest's meta). Tensors are CPU views of the fetched blobs;
        writing to them never changes the store.
    """
    manifest = read_manifest(store, manifest_key)
    check_fingerprint(manifest, manifest_key, expected_sha256)
    buffers, meta = get_artifact(store, manifest_key, manifest=manifest, zero_copy=True)
    tensors = {name: _view_tensor(buf, name, manifest_key) for name, buf in buffers.items()}
    tensors.update(_meta_scalars(meta, set(tensors), manifest_key))
    return tensors, meta


STREAM_BYTES = 1 << 30
"""``StoredTensors.stream`` keeps at most about this many bytes of blobs fetched ahead of the
caller (always at least the next one)."""


class StoredTensors(Mapping):
    """A published tensor set read one tensor at a time: what :func:`load_tensors` returns,
    without holding every tensor at once.

    Opening reads the manifest and checks its fingerprint; each tensor is fetched (size- and
    sha256-verified) when it is looked up, and nothing is cached, so a caller that keeps only
    what it cuts from each tensor (a rank's shard) holds one whole tensor at a time, not the
    set (a 7B model's AdamW state is 91 GB). :meth:`stream` fetches ahead in parallel within
    ``STREAM_BYTES``. Names may be given other names (:meth:`renamed`) without fetching.
    ``fingerprint`` is the set's checked ``weights_sha256``; :attr:`bytes_fetched` counts what
    was fetched.
    """

    def __init__(self, store: ObjectStore, manifest_key: str, *, expected_sha256: str | None = None) -> None:
        self.store, self.manifest_key = store, manifest_key
        self.manifest = read_manifest(store, manifest_key)
        self.fingerprint = check_fingerprint(self.manifest, manifest_key, expected_sha256)
        self._fetched, self._fetched_lock = [0], threading.Lock()  # shared with renamed views
        self.meta: dict[str, Any] = self.manifest.get("meta", {})
        self._files: dict[str, dict[str, Any]] = self.manifest["files"]
        self._scalars = _meta_scalars(self.meta, set(self._files), manifest_key)
        self._names: dict[str, str] = {n: n for n in sorted([*self._files, *self._scalars])}  # name -> stored name

    def renamed(self, names: Mapping[str, str]) -> "StoredTensors":
        """The same set under new names: ``names`` maps each new name to a name of this set
        (names left out are dropped). Nothing is fetched."""
        out = object.__new__(StoredTensors)
        out.__dict__.update(self.__dict__)
        out._names = {new: self._names[old] for new, old in names.items()}
        return out

    def __getitem__(self, name: str) -> torch.Tensor:
        stored = self._names[name]
        if stored in self._scalars:
            return self._scalars[stored].clone()
        return self._fetch(stored)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def is_scalar(self, name: str) -> bool:
        """Whether ``name`` is a scalar kept in the manifest's meta (read without a fetch)."""
        return self._names[name] in self._scalars

    def __len__(self) -> int:
        return len(self._names)

    @property
    def bytes_fetched(self) -> int:
        """Blob bytes fetched from the store so far through this set and its renamed views."""
        return self._fetched[0]

    def _fetch(self, stored: str) -> torch.Tensor:
        entry = self._files[stored]
        buf = get_blob(self.store, entry["sha256"], name=stored, size=entry["size"], manifest_key=self.manifest_key,
                       zero_copy=True)
        with self._fetched_lock:  # stream() fetches on several threads
            self._fetched[0] += int(entry["size"])
        return _view_tensor(buf, stored, self.manifest_key)

    def stream(self, budget: int | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` in the set's order (name order, unless :meth:`renamed` gave
        another), fetched ahead on the store's transfer threads while the blobs in flight or
        waiting stay within ``budget`` bytes (default ``STREAM_BYTES``; at least one blob); a
        tensor the caller has passed is no longer referenced here. A failed fetch raises when
        its turn comes; a caller that stops early (or raises) cancels the fetches not started."""
        budget = STREAM_BYTES if budget is None else budget
        names = list(self._names)
        pool = ThreadPoolExecutor(max_workers=transfer_threads(self.store, len(names)), thread_name_prefix="stream")
        try:
            ahead: deque = deque()
            ahead_bytes, nxt = 0, 0
            while nxt < len(names) or ahead:
                while nxt < len(names) and (not ahead or ahead_bytes + self.size(names[nxt]) <= budget):
                    name = names[nxt]
                    ahead.append((name, self.size(name), pool.submit(self.__getitem__, name)))
                    ahead_bytes += self.size(name)
                    nxt += 1
                name, size, future = ahead.popleft()
                ahead_bytes -= size
                yield name, future.result()
                del future
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def size(self, name: str) -> int:
        """The bytes of ``name``'s stored blob (0 for a scalar kept in the meta)."""
        stored = self._names[name]
        return int(self._files[stored]["size"]) if stored in self._files else 0


SCALARS = "scalars"
"""Manifest meta key of the 0-dim tensors published in it: name -> [dtype name, value]."""
_SCALAR_DTYPES = {"float32", "float64", "float16", "bfloat16", "int64", "int32"}


def _meta_scalars(meta: Mapping[str, Any], files: set[str], manifest_key: str) -> dict[str, torch.Tensor]:
    """The 0-dim tensors ``publish_tensors(scalars_in_meta=True)`` put in ``meta``; IntegrityError
    for an entry that is not one, or names a tensor the manifest also holds as a blob."""
    out: dict[str, torch.Tensor] = {}
    table = meta.get(SCALARS) or {}
    if not isinstance(table, dict):
        raise IntegrityError(f"manifest {manifest_key!r}: its scalars are not a table of name -> [dtype, number]; "
                             "re-publish it")
    for name, entry in table.items():
        ok = (isinstance(entry, list) and len(entry) == 2 and entry[0] in _SCALAR_DTYPES
              and isinstance(entry[1], (int, float)) and not isinstance(entry[1], bool) and name not in files)
        if not ok:
            raise IntegrityError(f"manifest {manifest_key!r}: scalar {shown(str(name))} is not [dtype, number] of a "
                                 "tensor of its own; re-publish it")
        out[name] = torch.tensor(entry[1], dtype=getattr(torch, entry[0]))
    return out
