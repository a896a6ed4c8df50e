"""Demo backends: BackendWithDelegateMappingDemo against ExecuTorch 1.5.1's, and 'texir-reference'."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import texir.lowering
from texir.adapters import from_exported_program, to_exported_program
from texir.errors import LoweringError
from texir.ir import (
    CallFunction,
    DebugHandleEntry,
    GraphSignature,
    Output,
    Placeholder,
    Program,
    Provenance,
    Ref,
    UserInput,
    UserOutput,
    build_graph,
    verify,
)
from texir.ir.canonical import drop_stack_traces
from texir.lowering.api import to_backend
from texir.lowering.backend import registered_backends
from texir.backends.demo import BACKEND_ID as DEMO_ID
from texir.backends.demo import decode_demo_bytes, encode_demo_program
from texir.lowering.lowered_modules import get_lowered_submodules
from texir.lowering.plan import DelegationSpec, PartitionPlan
from texir.backends.reference import BACKEND_ID as REFERENCE_ID
from texir.backends.reference import decode_reference
from texir.models import conv_relu_tan
from texir.serialize import snapshot

# The partition of the second conv+relu block and tan: call_function nodes from index 2 on.
SECOND_BLOCK_AND_TAN = 2


def _as_dict(entries: tuple[DebugHandleEntry, ...] | None) -> dict[int | str, tuple[int, ...]]:
    assert entries is not None
    return {e.identifier: e.debug_handles for e in entries}


@pytest.fixture(scope="module")
def model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return conv_relu_tan()


@pytest.fixture(scope="module")
def exported(model: tuple[torch.nn.Module, tuple[torch.Tensor, ...]]) -> torch.export.ExportedProgram:
    module, inputs = model
    return torch.export.export(module, inputs, strict=True)


@pytest.fixture(scope="module")
def program(exported: torch.export.ExportedProgram) -> Program:
    return from_exported_program(exported, decompose=True)


@pytest.fixture(scope="module")
def executorch_edge(exported: torch.export.ExportedProgram) -> Any:
    from executorch import exir

    # ExecuTorch's own test of this backend lowers with IR validity checks off; do the same.
    return exir.to_edge(exported, compile_config=exir.EdgeCompileConfig(_check_ir_validity=False))


def _executorch_demo_module() -> Any:
    # Importing the demo defines its BackendDetails subclass, which is how ExecuTorch finds it.
    from executorch.exir.backend.test import backend_with_delegate_mapping_demo

    return backend_with_delegate_mapping_demo


def test_builtin_backends_register_on_import() -> None:
    assert texir.lowering is not None
    assert {DEMO_ID, REFERENCE_ID} <= set(registered_backends())


def test_whole_program_matches_executorch(program: Program, executorch_edge: Any) -> None:
    from executorch.exir.backend.backend_api import to_backend as et_to_backend

    _executorch_demo_module()
    et_lowered = et_to_backend(DEMO_ID, executorch_edge.exported_program(), [])
    ours = to_backend(DEMO_ID, program, ())

    assert ours.processed_bytes == et_lowered.processed_bytes
    assert _as_dict(ours.debug_handle_map) == et_lowered.meta["debug_handle_map"]
    # Pin the expected values too, so a change on both sides cannot pass unnoticed.
    assert ours.processed_bytes == (
        b"5#conv_relu_op,0,conv_relu_op,1,sin_decomp_from_tan,2,cos_decomp_from_tan,3,"
        b"div_decomp_from_tan,4,"
    )
    assert _as_dict(ours.debug_handle_map) == {0: (1, 2), 1: (3, 4), 2: (5,), 3: (5,), 4: (5,)}


def test_executorch_reference_model_matches() -> None:
    """ExecuTorch's own ConvReLUTan instance, exported once, through both pipelines."""
    from executorch import exir
    from executorch.exir.backend.backend_api import to_backend as et_to_backend

    demo = _executorch_demo_module()
    torch.manual_seed(0)
    module, inputs = demo.BackendWithDelegateMappingDemo.get_test_model_and_inputs()
    ep = torch.export.export(module, inputs, strict=True)
    ours = to_backend(DEMO_ID, from_exported_program(ep, decompose=True), ())
    edge = exir.to_edge(ep, compile_config=exir.EdgeCompileConfig(_check_ir_validity=False))
    theirs = et_to_backend(DEMO_ID, edge.exported_program(), [])
    assert ours.processed_bytes == theirs.processed_bytes
    assert _as_dict(ours.debug_handle_map) == theirs.meta["debug_handle_map"]


def _texir_tail_partitioner(program: Program) -> PartitionPlan:
    calls = [n.name for n in program.graph.nodes if isinstance(n, CallFunction)]
    return PartitionPlan.build(
        {name: "tail" for name in calls[SECOND_BLOCK_AND_TAN:]},
        {"tail": DelegationSpec(backend_id=DEMO_ID)},
    )


def _executorch_tail_partitioner() -> Any:
    from executorch.exir.backend.partitioner import DelegationSpec as EtSpec
    from executorch.exir.backend.partitioner import Partitioner, PartitionResult

    class TailPartitioner(Partitioner):  # type: ignore[misc]  # executorch is untyped
        def partition(self, exported_program: Any) -> Any:
            calls = [n for n in exported_program.graph.nodes if n.op == "call_function"]
            for node in calls[SECOND_BLOCK_AND_TAN:]:
                node.meta["delegation_tag"] = "tail"
            return PartitionResult(
                tagged_exported_program=exported_program,
                partition_tags={"tail": EtSpec(DEMO_ID, [])},
            )

    return TailPartitioner()


def test_partition_matches_executorch(
    program: Program,
    executorch_edge: Any,
    model: tuple[torch.nn.Module, tuple[torch.Tensor, ...]],
) -> None:
    """Debug handles survive partitioning: the sub-program keeps handles 3, 4, 5 on both sides."""
    from executorch.exir.lowered_backend_module import (
        get_lowered_submodules as et_lowered,
    )

    _executorch_demo_module()
    before = snapshot.dumps(program, format="msgpack", include_data=True)
    lowered = to_backend(program, _texir_tail_partitioner)
    verify(lowered)
    assert snapshot.dumps(program, format="msgpack", include_data=True) == before

    et_program = executorch_edge.to_backend(_executorch_tail_partitioner()).exported_program()
    (( _, et_module, _),) = et_lowered(et_program.graph_module)
    ((_, ours, _),) = get_lowered_submodules(lowered)
    assert ours.processed_bytes == et_module.processed_bytes
    assert ours.processed_bytes == (
        b"4#conv_relu_op,0,sin_decomp_from_tan,1,cos_decomp_from_tan,2,div_decomp_from_tan,3,"
    )
    assert _as_dict(ours.debug_handle_map) == et_module.meta["debug_handle_map"]
    assert _as_dict(ours.debug_handle_map) == {0: (3, 4), 1: (5,), 2: (5,), 3: (5,)}

    # The lowered program still runs (each delegate runs its original program).
    module, inputs = model
    got = to_exported_program(lowered).module()(*inputs)
    torch.testing.assert_close(got, module(*inputs))


def _handmade(targets: list[tuple[str, str, str | None]], handles: bool = True) -> Program:
    """A program of unary calls: (name, target, input name or None for the user input)."""
    graph = build_graph([
        (Placeholder(name="x"), None, None),
        *(
            (
                CallFunction(name=name, target=target, args=(Ref(name=source or "x"),)),
                None,
                Provenance(debug_handle=10 + i) if handles else None,
            )
            for i, (name, target, source) in enumerate(targets)
        ),
        (Output(args=(Ref(name=targets[-1][0]),)), None, None),
    ])
    return Program(
        graph=graph,
        signature=GraphSignature(
            inputs=(UserInput(arg=Ref(name="x")),),
            outputs=(UserOutput(arg=Ref(name=targets[-1][0])),),
        ),
    )


def test_only_conv_fed_relu_fuses_and_other_ops_emit_nothing() -> None:
    program = _handmade([
        ("relu_alone", "aten::relu.default", None),
        ("sigmoid", "aten::sigmoid.default", "relu_alone"),
        ("relu_after_sigmoid", "aten::relu.default", "sigmoid"),
        ("conv", "aten::convolution.default", "relu_after_sigmoid"),
        ("tan", "aten::tan.default", "conv"),
        ("conv2d", "aten::conv2d.default", "tan"),
        ("relu_fused", "aten::relu.default", "conv2d"),
    ])
    result = encode_demo_program(program)
    assert result.processed_bytes == (
        b"4#sin_decomp_from_tan,0,cos_decomp_from_tan,1,div_decomp_from_tan,2,conv_relu_op,3,"
    )
    assert _as_dict(result.debug_handle_map) == {0: (14,), 1: (14,), 2: (14,), 3: (15, 16)}
    assert decode_demo_bytes(result.processed_bytes) == (
        ("sin_decomp_from_tan", "0"),
        ("cos_decomp_from_tan", "1"),
        ("div_decomp_from_tan", "2"),
        ("conv_relu_op", "3"),
    )


def test_empty_program_gives_zero_ops() -> None:
    program = _handmade([("sigmoid", "aten::sigmoid.default", None)])
    result = encode_demo_program(program)
    assert result.processed_bytes == b"0#"
    assert result.debug_handle_map == ()
    assert decode_demo_bytes(b"0#") == ()


def test_demo_backend_names_node_without_debug_handle() -> None:
    program = _handmade([("tan_nohandle", "aten::tan.default", None)], handles=False)
    with pytest.raises(LoweringError, match="'tan_nohandle'.*no debug handle"):
        to_backend(DEMO_ID, program, ())


@pytest.mark.parametrize("bad", [b"x#", b"2#a,0,", b"1#a,0", b"\xff#", b"1#a,0,b,1,"])
def test_decode_demo_bytes_rejects_malformed(bad: bytes) -> None:
    with pytest.raises(LoweringError):
        decode_demo_bytes(bad)


def test_reference_backend_roundtrips_and_runs(
    program: Program, model: tuple[torch.nn.Module, tuple[torch.Tensor, ...]]
) -> None:
    lowered = to_backend(REFERENCE_ID, program, ())
    decoded = decode_reference(lowered.processed_bytes)
    # Everything but the stack traces (machine paths) comes back.
    assert decoded == drop_stack_traces(program)
    assert decoded != program and any(
        loc.stack_trace for loc in (program.graph.provenance.locations if program.graph.provenance else ())
    )
    assert _as_dict(lowered.debug_handle_map) == {
        "convolution": (1,), "relu": (2,), "convolution_1": (3,), "relu_1": (4,), "tan": (5,),
    }
    module, inputs = model
    got = to_exported_program(decoded).module()(*inputs)
    torch.testing.assert_close(got, module(*inputs), rtol=0, atol=0)


def test_reference_backend_partition_bytes_decode_to_the_partition(program: Program) -> None:
    lowered = to_backend(
        program,
        lambda p: PartitionPlan.build(
            {"relu": "a", "relu_1": "b", "tan": "b"},
            {"a": DelegationSpec(backend_id=REFERENCE_ID), "b": DelegationSpec(backend_id=REFERENCE_ID)},
        ),
    )
    verify(lowered)
    modules = get_lowered_submodules(lowered)
    assert len(modules) == 2
    for _, module, _ in modules:
        assert decode_reference(module.processed_bytes) == drop_stack_traces(module.original_program)


def test_reference_backend_rejects_garbage() -> None:
    with pytest.raises(LoweringError, match="texir-reference"):
        decode_reference(b"\x00not a snapshot")
