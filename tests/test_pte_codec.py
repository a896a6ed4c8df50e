"""The .pte codec against ExecuTorch 1.5.1: decode its files, re-encode them, run them in its runtime."""

from __future__ import annotations

import hashlib
import math
import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pydantic
import pytest
import torch

from texir.errors import PteError
from texir.ir.blob import Blob
from texir.serialize import pte
from texir.serialize.pte import (
    AllocationDetails,
    BackendDelegate,
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Bool,
    BoolList,
    Buffer,
    Chain,
    CompileSpec,
    ContainerMetadata,
    DataLocation,
    DelegateCall,
    Double,
    DoubleList,
    EValue,
    ExecutionPlan,
    ExtraTensorInfo,
    Frame,
    FrameList,
    FreeCall,
    Instruction,
    Int,
    IntList,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    NamedBlob,
    NonConstBufferDevice,
    Null,
    Operator,
    OptionalTensorList,
    Program,
    PteDecodeError,
    PteOptions,
    PteProgram,
    ScalarType,
    String,
    Tensor,
    TensorList,
    TensorShapeDynamism,
)
from texir.executorch.runtime import load_method

# --- ExecuTorch-written files -----------------------------------------------------------------


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.lin(x) + y
        return b, torch.sin(b)


class _Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))


class _Probe(torch.nn.Module):
    """Multi-output op, view, None and float scalar arguments, lists, index with a tensor."""

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        m, i = torch.max(x, dim=1)
        s = torch.clamp(x, min=0.0).reshape(3, 2) * 2.5
        c = torch.cat([x, s.reshape(2, 3)], dim=0)
        return m, i, c[idx], torch.sum(c, dim=0, keepdim=True)


class _MutBuf(torch.nn.Module):
    acc: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.acc.add_(x)
        return self.acc * 2


class _Dyn(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cos(x).reshape(-1) + 1.0


@dataclass(frozen=True)
class EtCase:
    name: str
    data: bytes
    make_inputs: Callable[[], list[tuple[torch.Tensor, ...]]]
    """Input tuples for successive calls (stateful models are called several times)."""
    eager: Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]] | None
    runnable: bool
    """The 1.5.1 pip runtime has every backend the file uses."""


def _flat(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def _build_cases() -> dict[str, EtCase]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower
    from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

    torch.manual_seed(0)
    cases: dict[str, EtCase] = {}

    def add(
        name: str,
        module: torch.nn.Module,
        args: tuple[torch.Tensor, ...],
        *,
        calls: list[tuple[torch.Tensor, ...]] | None = None,
        lower: str | None = None,
        dynamic_shapes: Any = None,
        config: ExecutorchBackendConfig | None = None,
    ) -> None:
        module = module.eval()
        ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
        if lower == "xnnpack":
            edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        else:
            edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
            if lower == "addmul":
                edge = edge.to_backend(AddMulPartitionerDemo())
        data = edge.to_executorch(config or ExecutorchBackendConfig()).buffer
        inputs = calls or [args]
        fresh = torch.nn.Module.state_dict(module)
        snapshot = {k: v.clone() for k, v in fresh.items()}

        def eager(call: tuple[torch.Tensor, ...], _m: torch.nn.Module = module) -> tuple[torch.Tensor, ...]:
            with torch.no_grad():
                return _flat(_m(*call))

        module.load_state_dict(snapshot)
        cases[name] = EtCase(name, data, lambda: inputs, eager, lower != "addmul")

    add("linear", _Linear(), (torch.randn(2, 4), torch.randn(2, 3)))
    add("linear_addmul", _Linear(), (torch.randn(2, 4), torch.randn(2, 3)), lower="addmul")
    add("linear_xnnpack", _Linear(), (torch.randn(2, 4), torch.randn(2, 3)), lower="xnnpack")
    add(
        "linear_xnnpack_inline",
        _Linear(),
        (torch.randn(2, 4), torch.randn(2, 3)),
        lower="xnnpack",
        config=ExecutorchBackendConfig(extract_delegate_segments=False),
    )
    add("conv_bn", _Conv(), (torch.randn(1, 3, 8, 8),))
    add("probe", _Probe(), (torch.randn(2, 3), torch.tensor([1, 0, 3])))
    x = torch.randn(2, 2)
    add("mutbuf", _MutBuf(), (x,), calls=[(x,), (x + 1,), (x * 3,)])
    dim = torch.export.Dim("n", min=1, max=10)
    add(
        "dynamic",
        _Dyn(),
        (torch.randn(4, 2),),
        calls=[(torch.randn(3, 2),), (torch.randn(7, 2),)],
        dynamic_shapes=({0: dim},),
    )
    return cases


@pytest.fixture(scope="module")
def et_cases() -> dict[str, EtCase]:
    return _build_cases()


CASE_NAMES = [
    "linear",
    "linear_addmul",
    "linear_xnnpack",
    "linear_xnnpack_inline",
    "conv_bn",
    "probe",
    "mutbuf",
    "dynamic",
]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_decodes_executorch_file_and_round_trips(et_cases: dict[str, EtCase], name: str) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    data = et_cases[name].data
    x = pte.loads(data)
    et_program = deserialize_pte_binary(data).program
    # Structure matches what ExecuTorch's own deserializer sees.
    assert [p.name for p in x.program.execution_plan] == [p.name for p in et_program.execution_plan]
    for ours, theirs in zip(x.program.execution_plan, et_program.execution_plan, strict=True):
        assert len(ours.values) == len(theirs.values)
        assert ours.inputs == tuple(theirs.inputs) and ours.outputs == tuple(theirs.outputs)
        assert [(o.name, o.overload) for o in ours.operators] == [(o.name, o.overload) for o in theirs.operators]
        assert [d.id for d in ours.delegates] == [d.id for d in theirs.delegates]
        assert ours.non_const_buffer_sizes == tuple(theirs.non_const_buffer_sizes)
        assert len(ours.chains[0].instructions) == len(theirs.chains[0].instructions)
    # texir writes ExecuTorch's bytes: its flatbuffer writer lays every table, vector and string
    # out as ExecuTorch's (flatc's generated `Pack`) does, its segments as ExecuTorch places them.
    options = pte.PteOptions(extract_delegate_segments=name != "linear_xnnpack_inline")
    assert pte.dumps(x, options) == data
    # texir's re-encoding is a fixed point.
    b = pte.dumps(x)
    assert pte.loads(b) == x
    assert pte.dumps(pte.loads(b)) == b
    # ExecuTorch's deserializer reads texir's bytes into the same program.
    again = deserialize_pte_binary(b).program
    assert len(again.execution_plan[0].values) == len(et_program.execution_plan[0].values)
    assert [c.storage for c in again.constant_buffer] == [c.storage for c in et_program.constant_buffer]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_runtime_executes_texir_reencoding(et_cases: dict[str, EtCase], name: str) -> None:
    from executorch.runtime import Runtime

    case = et_cases[name]
    if not case.runnable:
        # BackendWithCompilerDemo is not in the pip runtime: check the blob survives instead.
        x = pte.loads(pte.dumps(pte.loads(case.data)))
        (delegate,) = x.program.execution_plan[0].delegates
        assert delegate.id == "BackendWithCompilerDemo"
        assert x.program.backend_delegate_data[0].data.tobytes().startswith(b"1version:0#op:demo::aten.add")
        return
    runtime = Runtime.get()
    # The runtime reads constants from the caller's buffer without copying: keep `data` alive.
    data = pte.dumps(pte.loads(case.data))
    ours = load_method(data)
    theirs = load_method(case.data)
    for call in case.make_inputs():
        got = ours.execute(list(call))
        want = theirs.execute(list(call))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
        if name != "mutbuf":  # the eager module's buffer was reset; compare stateless models to eager
            assert case.eager is not None
            for g, e in zip(got, case.eager(call), strict=True):
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    del data


def test_stateful_model_keeps_state_across_calls(et_cases: dict[str, EtCase]) -> None:
    from executorch.runtime import Runtime

    data = pte.dumps(pte.loads(et_cases["mutbuf"].data))
    method = load_method(data)
    x = torch.ones(2, 2)
    first = method.execute([x])[0]
    second = method.execute([x])[0]
    assert torch.equal(first, torch.full((2, 2), 2.0))
    assert torch.equal(second, torch.full((2, 2), 4.0))


def test_layout_matches_fact_sheet_for_linear(et_cases: dict[str, EtCase]) -> None:
    data = pte.dumps(pte.loads(et_cases["linear"].data))
    raw = pte.read_pte(data)
    assert data[4:8] == b"ET12" and data[8:12] == b"eh00"
    assert raw.header is not None
    assert raw.header.segment_base_offset % 128 == 0
    assert raw.header.segment_base_offset >= raw.header.program_size
    assert raw.program.constant_segment is not None
    assert raw.program.constant_segment.offsets == (0, 0, 48)  # placeholder, 3x4 f32, then bias
    assert raw.program.segments[0].size == 60
    assert raw.program.constant_buffer == ()
    assert len(data) == raw.header.segment_base_offset + raw.header.segment_data_size


def test_delegate_segments_and_inline_option(et_cases: dict[str, EtCase]) -> None:
    from executorch.runtime import Runtime

    x = pte.loads(et_cases["linear_xnnpack"].data)
    et_inline = pte.read_pte(et_cases["linear_xnnpack_inline"].data)
    assert et_inline.program.execution_plan[0].delegates[0].processed.location == DataLocation.INLINE
    assert len(et_inline.program.backend_delegate_data) == 1
    xi = pte.loads(et_cases["linear_xnnpack_inline"].data)
    assert pte.loads(pte.dumps(xi)) == xi  # segment and inline files share one logical form
    seg = pte.read_pte(pte.dumps(x))
    (delegate,) = seg.program.execution_plan[0].delegates
    assert delegate.processed.location == DataLocation.SEGMENT and delegate.processed.index == 1
    assert seg.program.backend_delegate_data == ()
    assert seg.program.named_data is not None and len(seg.program.named_data) == 2
    options = PteOptions(extract_delegate_segments=False, delegate_alignment=64)
    inline_bytes = pte.dumps(x, options)
    inline = pte.read_pte(inline_bytes)
    (delegate,) = inline.program.execution_plan[0].delegates
    assert delegate.processed.location == DataLocation.INLINE
    blob = inline.program.backend_delegate_data[0].data
    assert _offset_in(inline_bytes, blob) % 64 == 0  # force_align honoured
    assert inline.header is not None
    assert inline_bytes[8 + 32 : 8 + 64] == bytes(32)  # header padded to the largest force_align
    assert pte.dumps(pte.loads(inline_bytes), options) == inline_bytes
    assert pte.loads(inline_bytes) == x
    method = load_method(inline_bytes)
    a, b = torch.randn(2, 4), torch.randn(2, 3)
    want = load_method(et_cases["linear_xnnpack"].data).execute([a, b])
    for g, w in zip(method.execute([a, b]), want, strict=True):
        assert torch.equal(g, w)


def _offset_in(data: bytes, blob: Blob) -> int:
    """File offset of a Blob decoded from `data` (it is a zero-copy view of it)."""
    import numpy as np

    def address(view: memoryview) -> int:
        return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])

    assert blob.view().obj is data
    return address(blob.view()) - address(memoryview(data))


@pytest.mark.parametrize(
    ("options", "header_pad"),
    [
        (PteOptions(constant_tensor_alignment=64), 64),
        (PteOptions(segment_alignment=4096), 32),
        (PteOptions(constant_tensor_alignment=4, segment_alignment=16), 32),
    ],
)
def test_alignment_options(et_cases: dict[str, EtCase], options: PteOptions, header_pad: int) -> None:
    from executorch.runtime import Runtime

    x = pte.loads(et_cases["conv_bn"].data)
    data = pte.dumps(x, options)
    raw = pte.read_pte(data)
    assert raw.header is not None
    assert raw.header.segment_base_offset % options.segment_alignment == 0
    assert data[8 + 32 : 8 + header_pad] == bytes(header_pad - 32)
    cs = raw.program.constant_segment
    assert cs is not None
    assert all(off % options.constant_tensor_alignment == 0 for off in cs.offsets)
    assert pte.loads(data) == x
    assert pte.dumps(pte.loads(data), options) == data
    inp = torch.randn(1, 3, 8, 8)
    got = load_method(data).execute([inp])
    want = load_method(et_cases["conv_bn"].data).execute([inp])
    assert torch.equal(got[0], want[0])


def test_options_are_validated() -> None:
    with pytest.raises(pydantic.ValidationError):
        PteOptions(segment_alignment=100)
    with pytest.raises(pydantic.ValidationError):
        PteOptions(constant_tensor_alignment=0)
    with pytest.raises(pydantic.ValidationError):
        PteOptions(extra_field=1)  # type: ignore[call-arg]  # extra fields are forbidden


# --- hand-built programs ------------------------------------------------------------------------


def _every_kind() -> PteProgram:
    t_const = Tensor(scalar_type=ScalarType.FLOAT, sizes=(2,), dim_order=(0,), data_buffer_idx=1)
    t_planned = Tensor(
        scalar_type=ScalarType.LONG,
        sizes=(3, 1),
        dim_order=(0, 1),
        requires_grad=True,
        allocation_info=AllocationDetails(memory_id=1, memory_offset_low=16, memory_offset_high=1),
        shape_dynamism=TensorShapeDynamism.DYNAMIC_BOUND,
        extra_tensor_info=ExtraTensorInfo(mutable_data_segments_idx=0, fully_qualified_name="acc"),
    )
    values = (
        EValue(val=t_const),
        EValue(val=t_planned),
        EValue(val=Null()),
        EValue(val=Int(int_val=-(2**63))),
        EValue(val=Int(int_val=0)),
        EValue(val=Bool(bool_val=True)),
        EValue(val=Bool(bool_val=False)),
        EValue(val=Double(double_val=-0.0)),
        EValue(val=Double(double_val=math.inf)),
        EValue(val=String(string_val="héllo")),
        EValue(val=IntList(items=(3, 4))),
        EValue(val=DoubleList(items=(1.5, -math.inf))),
        EValue(val=BoolList(items=(True, False, True))),
        EValue(val=TensorList(items=(0, 1))),
        EValue(val=OptionalTensorList(items=(0, -1))),
    )
    instrs = (
        Instruction(instr_args=KernelCall(op_index=0, args=(0, 1, 1))),
        Instruction(instr_args=DelegateCall(delegate_index=1, args=(0, 1))),
        Instruction(instr_args=MoveCall(move_from=1, move_to=0)),
        Instruction(instr_args=JumpFalseCall(cond_value_index=5, destination_instruction=0)),
        Instruction(instr_args=FreeCall(value_index=1)),
    )
    frames = (FrameList(items=(Frame(filename="m.py", lineno=3, name="forward", context="x + 1"),)),)
    plan = ExecutionPlan(
        name="forward",
        container_meta_type=ContainerMetadata(encoded_inp_str="T1#1($)", encoded_out_str="$"),
        values=values,
        inputs=(1,),
        outputs=(1,),
        chains=(Chain(inputs=(1,), outputs=(1,), instructions=instrs, stacktrace=frames),),
        operators=(Operator(name="aten::add", overload="out"),),
        delegates=(
            BackendDelegate(
                id="XnnpackBackend",
                processed=BackendDelegateDataReference(location=DataLocation.INLINE, index=0),
                compile_specs=(CompileSpec(key="k", value=b"\x00\x01"),),
            ),
            BackendDelegate(id="Empty", processed=BackendDelegateDataReference(index=1)),
        ),
        non_const_buffer_sizes=(0, 2**33),
        non_const_buffer_device=(NonConstBufferDevice(buffer_idx=1),),
    )
    # (Index references stay in range: loads checks them as the runtime does.)
    other_instrs = tuple(
        Instruction(instr_args=DelegateCall(delegate_index=0, args=(0, 1))) if isinstance(i.instr_args, DelegateCall) else i
        for i in instrs
    )
    other = msgspec.structs.replace(
        plan, name="other", delegates=plan.delegates[:1], non_const_buffer_device=None,
        chains=(Chain(inputs=(1,), outputs=(1,), instructions=other_instrs, stacktrace=frames),),
    )
    program = Program(
        execution_plan=(plan, other),
        constant_buffer=(Buffer(storage=Blob(b"")), Buffer(storage=Blob(struct.pack("<2f", 1.0, 2.0)))),
        backend_delegate_data=(
            BackendDelegateInlineData(data=Blob(b"delegate-blob" * 7)),
            BackendDelegateInlineData(data=Blob(b"")),
        ),
    )
    return PteProgram(
        program=program,
        mutable_data=(Buffer(storage=Blob(b"")), Buffer(storage=Blob(bytes(range(24))))),
        named_data=(NamedBlob(key="w", data=Blob(b"\x07" * 10)), NamedBlob(key="w2", data=Blob(b"\x07" * 10))),
    )


@pytest.mark.parametrize(
    "options",
    [PteOptions(), PteOptions(extract_delegate_segments=False), PteOptions(segment_alignment=16)],
)
def test_every_kind_round_trips(options: PteOptions) -> None:
    x = _every_kind()
    data = pte.dumps(x, options)
    assert pte.loads(data) == x
    assert pte.dumps(pte.loads(data), options) == data
    double = pte.loads(data).program.execution_plan[0].values[7].val
    assert isinstance(double, Double) and math.copysign(1.0, double.double_val) == -1.0
    raw = pte.read_pte(data)
    assert raw.program.named_data is not None
    assert raw.program.named_data[0].segment_index == raw.program.named_data[1].segment_index  # dedup


def test_executorch_deserializer_reads_every_kind() -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte.dumps(_every_kind())).program
    plan = program.execution_plan[0]
    assert [type(v.val).__name__ for v in plan.values][:6] == ["Tensor", "Tensor", "Null", "Int", "Int", "Bool"]
    assert plan.values[10].val.items == [3, 4]
    assert [type(i.instr_args).__name__ for i in plan.chains[0].instructions] == [
        "KernelCall",
        "DelegateCall",
        "MoveCall",
        "JumpFalseCall",
        "FreeCall",
    ]
    assert plan.delegates[0].compile_specs[0].value == b"\x00\x01"


def test_loads_is_zero_copy() -> None:
    data = pte.dumps(_every_kind())
    x = pte.loads(data)
    storage = x.program.constant_buffer[1].storage
    assert storage.view().obj is data
    assert storage.tobytes() == struct.pack("<2f", 1.0, 2.0)


def test_program_without_segments_has_no_header() -> None:
    plan = ExecutionPlan(name="forward", chains=(Chain(),), non_const_buffer_sizes=(0, 0))
    x = PteProgram(program=Program(execution_plan=(plan,), constant_buffer=(Buffer(storage=Blob(b"")),)))
    data = pte.dumps(x)
    assert data[8:12] != b"eh00"
    raw = pte.read_pte(data)
    assert raw.header is None
    assert raw.program.segments[0].size == 0 and raw.program.constant_segment is not None
    assert raw.program.constant_segment.offsets == (0,)
    assert pte.loads(data) == x


def test_raw_program_is_rejected_by_dumps() -> None:
    raw = pte.read_pte(pte.dumps(_every_kind())).program
    with pytest.raises(pte.PteEncodeError, match="logical form"):
        pte.dumps(PteProgram(program=raw))


def test_out_of_range_integer_is_a_pte_error() -> None:
    plan = ExecutionPlan(name="forward", inputs=(2**40,))
    with pytest.raises(pte.PteEncodeError, match="fits"):
        pte.dumps(PteProgram(program=Program(execution_plan=(plan,))))


# --- decoder errors -----------------------------------------------------------------------------


def test_decoder_rejects_bad_inputs() -> None:
    data = pte.dumps(_every_kind())
    with pytest.raises(PteDecodeError, match="ET13"):
        pte.loads(data[:4] + b"ET13" + data[8:])
    with pytest.raises(PteDecodeError, match="identifier"):
        pte.loads(data[:4] + b"ZZZZ" + data[8:])
    with pytest.raises(PteDecodeError, match="truncated"):
        pte.loads(data[:5])
    with pytest.raises(PteDecodeError):
        pte.loads(data[: len(data) // 2])
    with pytest.raises(PteDecodeError, match="bytes or a memoryview"):
        pte.loads(12)  # type: ignore[arg-type]  # wrong type on purpose


def test_decoder_rejects_newer_schema_version() -> None:
    plan = ExecutionPlan(name="forward")
    data = pte.dumps(PteProgram(program=Program(version=1, execution_plan=(plan,))))
    with pytest.raises(PteDecodeError, match="version is 1"):
        pte.loads(data)


def test_decoder_rejects_huge_vector_length_before_allocating() -> None:
    plan = ExecutionPlan(name="forward", inputs=(7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 9))
    data = bytearray(pte.dumps(PteProgram(program=Program(execution_plan=(plan,)))))
    marker = struct.pack("<12i", 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 9)
    at = bytes(data).index(marker) - 4
    assert struct.unpack_from("<I", data, at)[0] == 12
    struct.pack_into("<I", data, at, 2**31)
    with pytest.raises(PteDecodeError, match="overruns"):
        pte.loads(bytes(data))


# --- dump ---------------------------------------------------------------------------------------


def test_dump_writes_same_bytes_as_dumps(tmp_path: Path) -> None:
    x = _every_kind()
    target = tmp_path / "m.pte"
    pte.dump(x, target)
    assert target.read_bytes() == pte.dumps(x)
    assert pte.load(target) == x
    assert b"".join(bytes(c) for c in pte.iter_chunks(x)) == pte.dumps(x)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pte"]


def test_failed_dump_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from texir.serialize.pte import codec

    x = _every_kind()
    target = tmp_path / "m.pte"

    real_layout = codec._layout

    def broken_layout(*args: Any) -> Any:
        # The real layout, whose payload stream fails part-way (a full disk while writing).
        head, chunks, rest = real_layout(*args)

        def failing() -> Any:
            yield memoryview(b"partial")
            raise OSError(28, "No space left on device")

        return head, failing(), rest

    monkeypatch.setattr(codec, "_layout", broken_layout)
    with pytest.raises(PteError, match="No space left"):
        pte.dump(x, target)
    assert list(tmp_path.iterdir()) == []
    target.write_bytes(b"old")
    with pytest.raises(PteError):
        pte.dump(x, target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["m.pte"]


def test_dump_into_missing_directory_is_a_pte_error(tmp_path: Path) -> None:
    with pytest.raises(PteError, match="cannot write"):
        pte.dump(_every_kind(), tmp_path / "missing" / "m.pte")


# --- determinism --------------------------------------------------------------------------------


def test_bytes_identical_across_hash_seeds(et_cases: dict[str, EtCase], tmp_path: Path) -> None:
    source = tmp_path / "in.pte"
    source.write_bytes(et_cases["linear_xnnpack"].data)
    script = textwrap.dedent(
        f"""
        import hashlib
        from texir.serialize import pte
        x = pte.load({str(source)!r})
        print(hashlib.sha256(pte.dumps(x)).hexdigest())
        """
    )
    digests = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1
    assert digests == {hashlib.sha256(pte.dumps(pte.loads(source.read_bytes()))).hexdigest()}


# --- texir inspect ------------------------------------------------------------------------------


def _size_sum(sizes: dict[str, Any]) -> int:
    return int(
        sizes["flatbuffer"]
        + sizes["extended_header"]
        + sizes["padding_before_segments"]
        + sum(seg["size"] for seg in sizes["segments"])
        + sizes["padding_between_segments"]
        + sizes["trailing"]
    )


@pytest.mark.parametrize("name", ["linear", "linear_addmul", "linear_xnnpack", "probe"])
def test_inspect_reads_executorch_and_texir_files(
    et_cases: dict[str, EtCase], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from texir.cli.main import main

    for label, data in (("et", et_cases[name].data), ("texir", pte.dumps(pte.loads(et_cases[name].data)))):
        path = tmp_path / f"{label}.pte"
        path.write_bytes(data)
        assert main(["inspect", str(path), "--json"]) == 0
        first = capsys.readouterr().out
        assert main(["inspect", str(path), "--json"]) == 0
        assert capsys.readouterr().out == first  # deterministic
        report = json.loads(first)
        assert _size_sum(report["sizes"]) == len(data)
        (method,) = report["methods"]
        assert method["name"] == "forward"
        if name == "linear":
            assert method["operators"] == ["aten::permute_copy.out", "aten::addmm.out", "aten::add.out", "aten::sin.out"]
            assert [i["text"] for i in method["instructions"]][2] == "aten::add.out(%8, %3, 1, %11, %11)"
            assert report["sizes"]["segments"][0] == {
                "index": 0, "kind": "constants", "offset": 0, "size": 60, "padding_before": 0
            }
        if name == "linear_addmul":
            (delegate,) = method["delegates"]
            assert delegate["id"] == "BackendWithCompilerDemo"
            assert delegate["compile_specs"] == [{"key": "max_value", "value": "04"}]
            assert delegate["size"] == 81
            assert any(i["kind"] == "delegate" for i in method["instructions"])
        assert main(["inspect", str(path)]) == 0
        text = capsys.readouterr().out
        assert "method 'forward'" in text
        assert text.splitlines()[-1].split() == ["total", str(len(data))]


def test_inspect_reports_malformed_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from texir.cli.main import main

    path = tmp_path / "bad.pte"
    path.write_bytes(pte.dumps(_every_kind())[:100])
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("texir inspect: error:") and err.count("\n") == 1
