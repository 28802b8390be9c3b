"""CUDA graph capture and replay, emulated on the CPU, for tests of the graph path.

A real capture records kernels without running them; a replay reruns exactly those kernels on
exactly the memory they were recorded with, every Python decision and host value fixed at
capture time. ``EmulatedGraph`` keeps that contract on the CPU: a capture records the aten
operations it dispatches (a ``TorchDispatchMode``) and undoes their writes when it ends (a
real capture writes nothing); a replay runs the same operations on the same tensor objects,
each result written into the tensor the capture produced. What a CUDA capture refuses raises
here too: a device value read on the host (``.item()``, ``.tolist()``, ``bool(t)``), an
operation whose output size depends on the data, a host value turned into a tensor (on a GPU,
a host-to-device copy that the replay would not repeat).

So the graph path of the static decode loop, which only a GPU runs for real, runs on the CPU:
a state advance left out of the graph, a per-call value baked into a graph, a buffer
reallocated under a captured graph or weights replaced rather than copied in place all change
tokens, and a host read inside the step raises. Not emulated: the memory pool graphs share (a
graph's temporaries stay its own here) and stream ordering.

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
    aten.lift_fresh.default: "turns a host value into a tensor (a copy the replay would not repeat)",
}
"""Operations a CUDA capture cannot hold, and why (the error names the operation)."""


class CaptureError(RuntimeError):
    """An operation a CUDA graph capture refuses ran inside one."""


def _written(func, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors ``func`` writes in place (its schema's mutable arguments, ``out=`` included)."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        out.extend(t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor))
    return out


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: "EmulatedGraph") -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in REFUSED:
            raise CaptureError(f"{func} inside a CUDA graph capture: the operation {REFUSED[func]}")
        for t in _written(func, args, kwargs):
            self.graph._saved.append((t, t.clone()))  # undone in reverse when the capture ends
        out = func(*args, **kwargs)
        self.graph.ops.append((func, args, kwargs, out))
        return out


class EmulatedGraph:
    """What ``torch.cuda.CUDAGraph`` does, on the CPU (module docstring)."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self.replays = 0
        self._saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def replay(self) -> None:
        with torch.no_grad():
            for func, args, kwargs, out in self.ops:
                result = func(*args, **kwargs)
                for kept, new in zip(tree_flatten(out)[0], tree_flatten(result)[0]):
                    # a view or an in-place result is the memory it aliases, already written
                    if isinstance(kept, torch.Tensor) and not _same_memory(kept, new):
                        kept.copy_(new)
        self.replays += 1

    def _undo_writes(self) -> None:
        for t, before in reversed(self._saved):  # an element written twice ends at its first value
            t.copy_(before)
        self._saved.clear()


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() == b.storage_offset())


@contextlib.contextmanager
def capture(graph: EmulatedGraph, pool=None, **_):
    """``torch.cuda.graph``: record what runs inside; nothing it writes stays written."""
    recorder = _Recorder(graph)
    # reads that bypass the dispatcher: each is a device-to-host copy on a GPU
    reads = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

    def refuse(name):
        def read(*_, **__):
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
        graph._undo_writes()


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
