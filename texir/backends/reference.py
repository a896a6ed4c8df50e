"""The 'texir-reference' backend: processed bytes are the delegated program's msgpack snapshot.

Nothing is compiled, so a delegate can always be decoded back into the Program it was given, less
its stack traces (`decode_reference`; stack traces hold machine paths, which bytes must not) and run through `texir.adapters`. The debug handle map has one entry per
call_function that carries a debug handle, keyed by the node's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from texir.errors import LoweringError, SnapshotError
from texir.ir import CallFunction, CompileSpec, Program
from texir.ir.canonical import drop_stack_traces
from texir.lowering.backend import PreprocessResult, register_backend
from texir.lowering.debug_mapping import DelegateMappingBuilder
from texir.serialize import snapshot

BACKEND_ID: Final = "texir-reference"


def encode_reference(program: Program) -> PreprocessResult:
    graph = program.graph
    builder = DelegateMappingBuilder(graph=graph, generated_identifiers=False)
    for node, handle in zip(graph.nodes, graph.debug_handles()):
        if isinstance(node, CallFunction) and handle is not None:
            builder.insert_delegate_mapping_entry(nodes=node, identifier=node.name)
    # Stack traces hold machine paths: a delegate's bytes must not depend on where the model lives.
    data = snapshot.dumps(drop_stack_traces(program), format="msgpack", include_data=True)
    return PreprocessResult(processed_bytes=data, debug_handle_map=builder.get_delegate_mapping())


def decode_reference(processed_bytes: bytes) -> Program:
    """The Program a 'texir-reference' delegate was built from."""
    try:
        return snapshot.loads(processed_bytes)
    except SnapshotError as exc:
        raise LoweringError(f"{BACKEND_ID} processed bytes do not decode: {exc}") from exc


class ReferenceBackend:
    """Backend protocol implementation; registered under `BACKEND_ID` when texir.backends loads."""

    backend_id: Final = BACKEND_ID

    @staticmethod
    def preprocess(program: Program, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        del compile_specs  # the reference backend takes no options
        return encode_reference(program)


register_backend(BACKEND_ID, ReferenceBackend(), replace=True)
