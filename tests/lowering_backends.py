"""The lowering tests' backends, registered on import, without torch: `texir-test` (its processed
bytes list the delegated ops and compile specs) and `texir-failing` (its preprocess raises)."""

from __future__ import annotations

from collections.abc import Sequence

from texir.ir import CallFunction, CompileSpec, DebugHandleEntry, Program
from texir.lowering import PreprocessResult, register_backend

TEST_BACKEND = "texir-test"


class _TestBackend:
    """Processed bytes list the delegated ops and compile specs; one debug entry per call node."""

    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        graph = program.graph
        calls = [(n, graph.prov(i)) for i, n in enumerate(graph.nodes) if isinstance(n, CallFunction)]
        text = ",".join(n.target for n, _ in calls) + "|" + ",".join(f"{s.key}={s.value.hex()}" for s in compile_specs)
        entries = tuple(
            DebugHandleEntry(identifier=n.name, debug_handles=(prov.debug_handle,))
            for n, prov in calls
            if prov is not None and prov.debug_handle is not None
        )
        return PreprocessResult(processed_bytes=text.encode(), debug_handle_map=entries)


class FailingBackend:
    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        raise RuntimeError("this backend always fails")


register_backend(TEST_BACKEND, _TestBackend(), replace=True)
register_backend("texir-failing", FailingBackend(), replace=True)
