"""The delegate-mapping demo backend ("BackendWithDelegateMappingDemo"), byte-compatible with ExecuTorch's.

It compiles nothing. It walks the delegated program and emits a toy instruction stream that shows the
two ways a backend's ops relate to IR nodes: fusion (conv+relu -> one ``conv_relu_op`` whose identifier
maps to both nodes' debug handles) and decomposition (tan -> sin, cos, div, three identifiers mapped to
tan's one handle). Processed bytes are ``"<count>#op,id,op,id,...,"``, as ExecuTorch 1.5.1 writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from texir.errors import LoweringError
from texir.ir import (
    CallFunction,
    CompileSpec,
    GetAttr,
    Node,
    Output,
    Placeholder,
    Program,
    Ref,
)
from texir.lowering.backend import PreprocessResult, register_backend
from texir.lowering.debug_mapping import DelegateMappingBuilder

BACKEND_ID: Final = "BackendWithDelegateMappingDemo"

# Convolutions the demo fuses with a following relu. Core ATen (what ExecuTorch's edge dialect holds)
# only has `convolution`; `conv2d` is accepted so the demo also runs on an un-decomposed export.
_CONV_TARGETS: Final = frozenset({"aten::convolution.default", "aten::conv2d.default"})
_RELU: Final = "aten::relu.default"
_TAN: Final = "aten::tan.default"
_TAN_DECOMPOSITION: Final = ("sin_decomp_from_tan", "cos_decomp_from_tan", "div_decomp_from_tan")


class UnsupportedDemoNodeError(LoweringError):
    """The demo backend was handed a node kind it cannot take."""


_Emit = Callable[[str, "int | str"], None]
_Rule = Callable[[CallFunction, dict[str, Node], DelegateMappingBuilder, _Emit], None]


def _relu_rule(node: CallFunction, nodes: dict[str, Node], builder: DelegateMappingBuilder, emit: _Emit) -> None:
    # Only a relu fed directly by a convolution fuses; a lone relu emits nothing (as in ExecuTorch).
    first = node.args[0] if node.args else None
    producer = nodes.get(first.name) if isinstance(first, Ref) else None
    if isinstance(producer, CallFunction) and producer.target in _CONV_TARGETS:
        emit("conv_relu_op", builder.insert_delegate_mapping_entry(nodes=[producer, node]))


def _tan_rule(node: CallFunction, nodes: dict[str, Node], builder: DelegateMappingBuilder, emit: _Emit) -> None:
    for op in _TAN_DECOMPOSITION:
        emit(op, builder.insert_delegate_mapping_entry(nodes=node))


# Per-op behaviour; every other call_function (a conv without relu, getitem, ...) emits nothing.
_RULES: Final[dict[str, _Rule]] = {_RELU: _relu_rule, _TAN: _tan_rule}


def encode_demo_program(program: Program) -> PreprocessResult:
    """Processed bytes and debug handle map of the demo backend for `program`'s top-level graph."""
    builder = DelegateMappingBuilder(graph=program.graph, generated_identifiers=True)
    nodes: dict[str, Node] = {}
    ops: list[str] = []

    def emit(op: str, identifier: int | str) -> None:
        ops.append(f"{op},{identifier},")

    for node in program.graph.nodes:
        nodes[node.name] = node
        if isinstance(node, CallFunction):
            rule = _RULES.get(node.target)
            if rule is not None:
                rule(node, nodes, builder, emit)
        elif not isinstance(node, (Placeholder, Output, GetAttr)):
            raise UnsupportedDemoNodeError(
                f"node {node.name!r} is not supported by backend {BACKEND_ID!r}"
            )
    processed = f"{len(ops)}#{''.join(ops)}".encode()
    return PreprocessResult(processed_bytes=processed, debug_handle_map=builder.get_delegate_mapping())


def decode_demo_bytes(processed_bytes: bytes) -> tuple[tuple[str, str], ...]:
    """Parse demo processed bytes back into (op, identifier) pairs; raises on malformed input."""
    try:
        text = processed_bytes.decode()
        count_text, _, body = text.partition("#")
        count = int(count_text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise LoweringError(f"not {BACKEND_ID} processed bytes: {exc}") from exc
    fields = body.split(",")
    if fields[-1] != "" or (len(fields) - 1) != 2 * count:
        raise LoweringError(
            f"{BACKEND_ID} processed bytes declare {count} ops but hold {(len(fields) - 1) / 2:g}"
        )
    return tuple((fields[2 * i], fields[2 * i + 1]) for i in range(count))


class DelegateMappingDemoBackend:
    """Backend protocol implementation; registered under `BACKEND_ID` when texir.backends loads."""

    backend_id: Final = BACKEND_ID

    @staticmethod
    def preprocess(program: Program, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        del compile_specs  # the demo takes no options, as in ExecuTorch
        return encode_demo_program(program)


register_backend(BACKEND_ID, DelegateMappingDemoBackend(), replace=True)
