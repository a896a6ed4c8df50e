"""Small hand-built Programs (no torch) for tests, demos and benchmarks of the debugging tools."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from texir.ir.blob import Blob
from texir.ir.builder import GraphBuilder
from texir.ir.names import CALL_DELEGATE, GETITEM
from texir.ir.types import (
    BufferInput,
    BufferMutation,
    CallFunction,
    CompileSpec,
    DebugHandleEntry,
    DelegateMeta,
    DType,
    GetAttr,
    GraphSignature,
    InputSpec,
    IntArg,
    LoweredBackendModule,
    NamedLoweredModule,
    Output,
    OutputSpec,
    ParameterInput,
    Placeholder,
    Program,
    Provenance,
    Ref,
    StateEntry,
    TensorData,
    TensorMeta,
    TupleMeta,
    UserInput,
    UserOutput,
)

__all__ = ["chain_program", "delegated_program", "tensor_meta", "wide_program"]


def tensor_meta(*shape: int, dtype: DType = DType.float32) -> TensorMeta:
    strides: list[int] = []
    acc = 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    return TensorMeta(dtype=dtype, shape=tuple(shape), strides=tuple(reversed(strides)))


def _state(target: str, meta: TensorMeta, seed: str) -> StateEntry:
    """A float32 tensor whose bytes are derived from `seed` (so different seeds differ)."""
    numel = 1
    for size in meta.shape:
        numel *= int(size)
    base = hashlib.sha256(seed.encode()).digest()
    data = (base * (numel * 4 // len(base) + 1))[: numel * 4]
    # Clear each float's exponent high bits so the payload holds small finite numbers, not NaNs.
    data = bytes(b & 0x3F if i % 4 == 3 else b for i, b in enumerate(data))
    return StateEntry(target=target, value=TensorData(
        meta=meta, sha256=hashlib.sha256(data).hexdigest(), nbytes=len(data), data=Blob(data)))


def chain_program(ops: Sequence[str] = ("aten::relu.default",), *, with_param: bool = True,
                  with_buffer: bool = False, names: Sequence[str] | None = None) -> Program:
    """x (+ parameter w) -> ops applied in a chain -> output; optional buffer mutated by add_."""
    meta = tensor_meta(2, 3)
    b = GraphBuilder()
    inputs: list[InputSpec] = []
    state: list[StateEntry] = []
    if with_param:
        b.add(Placeholder(name="p_w"), meta)
        inputs.append(ParameterInput(name="p_w", target="w"))
        state.append(_state("w", meta, "w"))
    if with_buffer:
        b.add(Placeholder(name="b_count"), meta)
        inputs.append(BufferInput(name="b_count", target="count"))
        state.append(_state("count", meta, "count"))
    b.add(Placeholder(name="x"), meta)
    inputs.append(UserInput(arg=Ref(name="x")))
    prev = "x"
    if with_param:
        b.add(CallFunction(name="add", target="aten::add.Tensor", args=(Ref(name="x"), Ref(name="p_w"))),
              meta, Provenance(debug_handle=1))
        prev = "add"
    for i, op in enumerate(ops):
        name = names[i] if names is not None else f"{op.split('::')[1].split('.')[0]}_{i}"
        b.add(CallFunction(name=name, target=op, args=(Ref(name=prev),)), meta, Provenance(debug_handle=i + 2))
        prev = name
    outputs: list[OutputSpec] = []
    out_args = []
    if with_buffer:
        b.add(CallFunction(name="add_1", target="aten::add.Tensor", args=(Ref(name="b_count"), Ref(name=prev))),
              meta)
        outputs.append(BufferMutation(name="add_1", target="count"))
        out_args.append(Ref(name="add_1"))
    outputs.append(UserOutput(arg=Ref(name=prev)))
    out_args.append(Ref(name=prev))
    b.add(Output(args=tuple(out_args)))
    return Program(
        graph=b.build(),
        signature=GraphSignature(inputs=tuple(inputs), outputs=tuple(outputs)),
        state=tuple(state),
    )


def delegated_program(backend_id: str = "DemoBackend", processed: bytes = b"1#relu,0",
                      partitions: int = 1) -> Program:
    """x -> [delegate call -> getitem] * partitions -> sin -> output, each delegate running relu."""
    meta = tensor_meta(2, 3)
    inner = chain_program(("aten::relu.default",), with_param=False)
    b = GraphBuilder()
    b.add(Placeholder(name="x"), meta)
    lowered: list[NamedLoweredModule] = []
    prev = "x"
    for k in range(partitions):
        mod = f"lowered_module_{k}"
        module = LoweredBackendModule(
            backend_id=backend_id, processed_bytes=processed + str(k).encode(),
            compile_specs=(CompileSpec(key="level", value=b"\x01"),), original_program=inner,
            debug_handle_map=(DebugHandleEntry(identifier=0, debug_handles=(2,)),),
        )
        lowered.append(NamedLoweredModule(name=mod, module=module))
        b.add(GetAttr(name=mod, target=mod), DelegateMeta(module=mod))
        call = f"executorch_call_delegate_{k}" if k else "executorch_call_delegate"
        b.add(CallFunction(name=call, target=CALL_DELEGATE, args=(Ref(name=mod), Ref(name=prev))),
              TupleMeta(items=(meta,)))
        item = f"getitem_{k}" if k else "getitem"
        b.add(CallFunction(name=item, target=GETITEM, args=(Ref(name=call), IntArg(value=0))), meta)
        prev = item
    b.add(CallFunction(name="sin", target="aten::sin.default", args=(Ref(name=prev),)),
          meta, Provenance(debug_handle=9))
    b.add(Output(args=(Ref(name="sin"),)))
    return Program(
        graph=b.build(),
        signature=GraphSignature(inputs=(UserInput(arg=Ref(name="x")),),
                                 outputs=(UserOutput(arg=Ref(name="sin")),)),
        lowered_modules=tuple(lowered),
    )


def wide_program(n: int, *, width: int = 8, partitions: int = 4) -> Program:
    """A generated DAG of about `n` nodes (elementwise ops reading the two previous values of a
    lane, lanes mixing every few layers) with `partitions` delegate calls spread through it."""
    meta = tensor_meta(4, 4)
    ops = ("aten::add.Tensor", "aten::mul.Tensor", "aten::sub.Tensor")
    b = GraphBuilder()
    b.add(Placeholder(name="w"), meta)
    b.add(Placeholder(name="x"), meta)
    lanes = ["x"] * width
    lowered: list[NamedLoweredModule] = []
    inner = chain_program(("aten::relu.default",), with_param=False)
    every = max(1, (n // width) // (partitions + 1))
    count, layer = 2, 0
    while count < n - 1:
        layer += 1
        for lane in range(width):
            name = f"n{layer}_{lane}"
            other = lanes[(lane + 1) % width] if layer % 3 == 0 else "w"
            b.add(CallFunction(name=name, target=ops[(layer + lane) % 3],
                               args=(Ref(name=lanes[lane]), Ref(name=other))), meta, Provenance(debug_handle=count))
            lanes[lane] = name
            count += 1
        if layer % every == 0 and len(lowered) < partitions:
            mod = f"lowered_module_{len(lowered)}"
            lowered.append(NamedLoweredModule(name=mod, module=LoweredBackendModule(
                backend_id="DemoBackend", processed_bytes=mod.encode(), compile_specs=(),
                original_program=inner)))
            call = f"call_{mod}"
            b.add(GetAttr(name=mod, target=mod), DelegateMeta(module=mod))
            b.add(CallFunction(name=call, target=CALL_DELEGATE, args=(Ref(name=mod), Ref(name=lanes[0]))),
                  TupleMeta(items=(meta,)))
            b.add(CallFunction(name=f"{call}_0", target=GETITEM, args=(Ref(name=call), IntArg(value=0))),
                  meta)
            lanes[0] = f"{call}_0"
            count += 3
    b.add(Output(args=tuple(Ref(name=lane) for lane in lanes)))
    return Program(
        graph=b.build(),
        signature=GraphSignature(
            inputs=(ParameterInput(name="w", target="w"), UserInput(arg=Ref(name="x"))),
            outputs=tuple(UserOutput(arg=Ref(name=lane)) for lane in lanes),
        ),
        state=(_state("w", meta, "w"),),
        lowered_modules=tuple(lowered),
    )
