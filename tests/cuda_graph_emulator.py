"""CUDA graph capture and replay, emulated on the CPU, for tests of the graph path.

A real capture records kernels without running them; a replay reruns exactly those kernels on
exactly the memory they were recorded with, every Python decision and host value fixed at
capture time. ``EmulatedGraph`` keeps that contract on the CPU: a capture records the aten
operations it dispatches (a ``TorchDispatchMode``), undoes their writes to the memory it found
and leaves the memory it allocated holding garbage (NaN, -7) when it ends (a real capture runs
nothing); a replay runs the same operations on the same tensor objects, each result written
into the tensor the capture produced, and fails if any tensor it reads has moved to other
memory since (``p.data = ...``, ``.to()`` and back: a real graph would read the old, freed
memory). What a CUDA capture refuses raises here too: a device value read on the host
(``.item()``, ``.tolist()``, ``bool(t)``, ``torch.equal``), an operation whose output size
depends on the data (``nonzero``, mask indexing, ``unique``), a host value turned into a tensor
(on a GPU, a host-to-device copy the replay would not repeat), an in-place change of shape;
and, as on a GPU, the capture such an operation ran in fails when it ends, even where the
operation's own error was caught.

So the graph path of the static decode loop, which only a GPU runs for real, runs on the CPU.
Not emulated: the memory pool graphs share (a graph's temporaries stay its own here), streams,
and ``.cpu()`` (a no-op on the CPU, a device-to-host copy on a GPU).

``emulated_cuda_graphs(monkeypatch)`` installs it as ``torch.cuda.CUDAGraph``,
``torch.cuda.graph`` and the stream calls ``DecodeRuntime._capture`` makes, and gives the
CPU the GPU's choices the graph path depends on: the graphs' attention windows
(``WINDOW_STEP``), so that an eager run computes the same shapes as the replayed one, and
verification rounds that draw every column on the device.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

REFUSED = {
    aten._local_scalar_dense.default: "reads a device value on the host (.item(), .tolist(), bool())",
    aten.nonzero.default: "has an output size that depends on the data",
    aten.masked_select.default: "has an output size that depends on the data",
    aten._unique2.default: "has an output size that depends on the data",
    aten.unique_dim.default: "has an output size that depends on the data",
    aten.unique_consecutive.default: "has an output size that depends on the data",
    aten.lift_fresh.default: "turns a host value into a tensor (a copy the replay would not repeat)",
}
"""Operations a CUDA capture cannot hold, and why (the error names the operation)."""

RESHAPED_IN_PLACE = {aten.resize_, aten.set_, aten.unsqueeze_, aten.squeeze_, aten.t_, aten.transpose_,
                     aten.as_strided_, aten.swapdims_, aten.swapaxes_}
"""In-place operations that change a tensor's shape or storage: a replay cannot repeat them."""

METADATA = {aten.is_same_size, aten.sym_size, aten.sym_stride, aten.sym_numel, aten.sym_storage_offset}
"""Operations that return a Python value computed from shapes alone (no device read)."""


class CaptureError(RuntimeError):
    """An operation a CUDA graph capture refuses ran inside one, or a replay found a captured
    tensor's memory moved."""


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _refusal(func, args: tuple, kwargs: dict) -> str | None:
    """Why a CUDA capture would refuse ``func(*args, **kwargs)`` (None: it would not)."""
    if func in REFUSED:
        return REFUSED[func]
    packet = func.overloadpacket
    if packet in RESHAPED_IN_PLACE:
        return "changes a tensor's shape or storage in place"
    if packet not in METADATA and any("Tensor" not in str(r.type) for r in func._schema.returns):
        return "returns a host value (torch.equal, allclose, ...: a device read)"
    if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices):
            return "indexes with a mask (its nonzero has an output size that depends on the data)"
    if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return "has an output size that depends on the data (no output_size)"
    return None


def _written(func, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors ``func`` writes in place (its schema's mutable arguments, ``out=`` included)."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        out.extend(_tensors(args[i] if i < len(args) else kwargs.get(arg.name)))
    return out


def _address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: "EmulatedGraph") -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = _refusal(func, args, kwargs)
        if why:
            self.graph._invalid = self.graph._invalid or f"{func}: the operation {why}"
            raise CaptureError(f"{func} inside a CUDA graph capture: the operation {why}")
        g = self.graph
        inputs = _tensors((args, kwargs))
        for t in inputs:
            if _address(t) not in g._made:
                g._existing.add(_address(t))
        for t in _written(func, args, kwargs):
            g._saved.append((t, t.clone()))  # undone in reverse when the capture ends
        out = func(*args, **kwargs)
        # a graph reads and writes fixed addresses: the replay checks that none has moved
        g.ops.append((func, args, kwargs, out, [(t, _address(t)) for t in inputs]))
        g._made.update(_address(t) for t in _tensors(out) if _address(t) not in g._existing)
        return out


class EmulatedGraph:
    """What ``torch.cuda.CUDAGraph`` does, on the CPU (module docstring)."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self.replays = 0
        self._saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._existing: set[int] = set()  # storages the capture found
        self._made: set[int] = set()  # storages the capture allocated (the graph's own memory)
        self._invalid: str | None = None  # a refused operation ran: the capture cannot end well

    def replay(self) -> None:
        with torch.no_grad():
            for func, args, kwargs, out, addresses in self.ops:
                for t, at in addresses:
                    if _address(t) != at:
                        raise CaptureError(f"replay of {func}: a tensor it read at capture has moved to other "
                                           "memory (a real graph would read the old, freed memory)")
                result = func(*args, **kwargs)
                for kept, new in zip(tree_flatten(out)[0], tree_flatten(result)[0]):
                    # a view or an in-place result is the memory it aliases, already written
                    if isinstance(kept, torch.Tensor) and not _same_memory(kept, new):
                        kept.copy_(new)
        self.replays += 1

    def _end_capture(self) -> None:
        """Undo the capture's writes to memory it found, and leave its own memory holding
        garbage, as a real capture does (nothing ran): a read of it before the first replay
        shows."""
        for t, before in reversed(self._saved):  # an element written twice ends at its first value
            t.copy_(before)
        self._saved.clear()
        with torch.no_grad():
            for *_, out, _ in self.ops:
                for t in _tensors(out):
                    if _address(t) in self._made:
                        t.fill_(True if t.dtype == torch.bool else float("nan") if t.is_floating_point() else -7)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return _address(a) == _address(b) and a.storage_offset() == b.storage_offset()


@contextlib.contextmanager
def capture(graph: EmulatedGraph, pool=None, **_):
    """``torch.cuda.graph``: record what runs inside; nothing it writes stays written."""
    recorder = _Recorder(graph)
    # reads that bypass the dispatcher: each is a device-to-host copy on a GPU
    reads = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

    def refuse(name):
        def read(*_, **__):
            graph._invalid = graph._invalid or f"Tensor.{name}: reads device values on the host"
            raise CaptureError(f"Tensor.{name} inside a CUDA graph capture: the operation reads device values "
                               "on the host")
        return read

    try:
        for name in reads:
            setattr(torch.Tensor, name, refuse(name))
        with recorder:
            yield graph
    finally:
        for name, method in reads.items():
            setattr(torch.Tensor, name, method)
        graph._end_capture()
    if graph._invalid:  # as CUDA ends a capture an operation failed in, even where the error was caught
        raise CaptureError(f"the capture was invalidated by {graph._invalid}")


class _Stream:
    def __init__(self, *_, **__) -> None:
        pass

    def wait_stream(self, _other) -> None:
        pass


def emulated_cuda_graphs(monkeypatch) -> list[EmulatedGraph]:
    """Install the emulation for one test; returns the list every new graph is appended to."""
    from actions.engines import static_decode, static_speculative

    made: list[EmulatedGraph] = []

    def new_graph() -> EmulatedGraph:
        made.append(EmulatedGraph())
        return made[-1]

    monkeypatch.setattr(torch.cuda, "CUDAGraph", new_graph)
    monkeypatch.setattr(torch.cuda, "graph", capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_, **__: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda _s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_, **__: None)
    # the windows a GPU uses, for replayed and eager steps alike (static_decode.window_step)
    monkeypatch.setattr(static_decode, "CPU_WINDOW_STEP", static_decode.WINDOW_STEP)
    # verification rounds that draw every column inside the round, as on a GPU
    monkeypatch.setattr(static_speculative, "_draws_in_round", lambda _device: True)
    return made
