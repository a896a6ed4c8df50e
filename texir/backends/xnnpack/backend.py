"""`XnnpackNativeBackend`: ExecuTorch 1.5.1's XnnpackBackend.preprocess, as a pure function of the
sub-program (float and static-int8 programs; see `visitors.VISITORS` for the ops)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Final

from texir.backends.xnnpack.errors import XnnpackCompileSpecError, XnnpackUnsupportedError
from texir.backends.xnnpack.flatbuffer import encode_blob
from texir.backends.xnnpack.passes import run_passes
from texir.backends.xnnpack.graph import XGraph
from texir.backends.xnnpack.schema import XNNGraph
from texir.backends.xnnpack.serialize import Serializer
from texir.backends.xnnpack.visitors import VISITORS
from texir.ir import CompileSpec, NamedDataEntry, Program
from texir.lowering.backend import Backend, PreprocessResult, backend_registered, register_backend

__all__ = ["BACKEND_ID", "XnnpackNativeBackend", "build_graph", "register", "registered"]

BACKEND_ID: Final = "XnnpackBackend"
"""ExecuTorch's id: the runtime's XNNPACK delegate loads these blobs."""
NAMED_DATA_ALIGNMENT: Final = 16
KNOWN_COMPILE_SPECS: Final[frozenset[str]] = frozenset()
"""ExecuTorch's XnnpackPartitioner passes none; `dqlinear_partitioner` (a legacy pass list) is not
implemented, so every key is refused."""
_SKIPPED: Final = frozenset({"placeholder", "output"})


def check_supported(g: XGraph) -> None:
    """Every call node has a visitor: otherwise a typed error naming the first one, before any bytes."""
    for n in g.nodes:
        if n.target not in _SKIPPED and n.target not in VISITORS:
            raise XnnpackUnsupportedError(
                f"node '{n.name}' calls {n.target}, which the native XNNPACK backend cannot serialize; "
                "leave it out of the partition (texir.backends.xnnpack.partitioner does) or use "
                "--partitioner executorch:xnnpack",
                node=n.name, op=n.target,
            )


def build_graph(program: Program, compile_specs: Sequence[CompileSpec] = ()) -> tuple[XNNGraph, Serializer]:
    """The XNNGraph of a partition and the walk's state (its named data)."""
    for spec in compile_specs:
        if spec.key not in KNOWN_COMPILE_SPECS:
            raise XnnpackCompileSpecError(
                f"compile spec {spec.key!r} is not known to the native XNNPACK backend (it takes none); "
                "drop it, or lower with ExecuTorch's backend (--partitioner executorch:xnnpack)"
            )
    g = XGraph.from_program(program)
    run_passes(g)
    check_supported(g)
    ser = Serializer(g)
    for n in g.nodes:
        if n.target not in _SKIPPED:
            VISITORS[n.target](ser, n)
    return ser.graph(), ser


class XnnpackNativeBackend:
    """texir's XNNPACK backend: the same blob and named data as ExecuTorch's, without torch."""

    backend_id: Final = BACKEND_ID
    cache_version: Final = "texir-xnnpack-native 2 (executorch 1.5.1 format)"
    """Part of the preprocess cache key: bump it whenever the bytes this backend writes change."""

    def __repr__(self) -> str:
        return "XnnpackNativeBackend()"

    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec], /) -> PreprocessResult:
        graph, ser = build_graph(program, compile_specs)
        blob = encode_blob(graph)
        # Each entry's sha256 is its payload's (the IR's own for unchanged weights, nothing hashed
        # twice); the key is that digest too, but `scale_<sha256>` for per-channel scales.
        named = tuple(
            NamedDataEntry(key=key, sha256=sha, nbytes=data.nbytes, alignment=NAMED_DATA_ALIGNMENT, data=data)
            for key, (data, sha) in ser.named.items()
        )
        return PreprocessResult(processed_bytes=blob, debug_handle_map=None, named_data=named)


def registered() -> contextlib.AbstractContextManager[Backend]:
    """The native backend registered as `XnnpackBackend` for a `with` block only (the backend
    registered there before, ExecuTorch's bridge or none, is back afterwards):
    `with registered(): lower(ep, [partitioner()])`."""
    return backend_registered(BACKEND_ID, XnnpackNativeBackend())


def register(*, replace: bool = True) -> XnnpackNativeBackend:
    """Register the native backend under ExecuTorch's id `XnnpackBackend` (replacing ExecuTorch's
    bridge backend when one is registered) and return it."""
    backend = XnnpackNativeBackend()
    register_backend(BACKEND_ID, backend, replace=replace)
    return backend
