"""Snapshots: exact round trips in both formats, payload stripping, deterministic bytes across
processes and hash seeds, and only `SnapshotError` (with the bad field's path) on bad input."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from texir.ir.canonical import drop_stack_traces
from texir.errors import SnapshotError
from texir.ir import (
    Blob,
    BoolArg,
    BufferInput,
    BufferMutation,
    CallFunction,
    CompileSpec,
    ConstantTensorInput,
    CustomObjInput,
    CustomObjMeta,
    DebugHandleEntry,
    DelegateMeta,
    DeviceArg,
    DType,
    DTypeArg,
    FloatArg,
    GetAttr,
    GradientToParameter,
    GradientToUserInput,
    GraphSignature,
    IntArg,
    Layout,
    LayoutArg,
    ListArg,
    LossOutput,
    LoweredBackendModule,
    MemoryFormat,
    MemoryFormatArg,
    ModuleCallEntry,
    ModuleCallSignature,
    ModuleFrame,
    NamedLoweredModule,
    Node,
    NoneArg,
    NoneMeta,
    Output,
    ParameterInput,
    Placeholder,
    Program,
    Provenance,
    RangeConstraint,
    Ref,
    ScalarMeta,
    SourceFn,
    StateEntry,
    StrArg,
    Subgraph,
    SubgraphMeta,
    SymBoolMeta,
    SymExprArg,
    SymFloatMeta,
    SymIntMeta,
    TensorData,
    TensorMeta,
    TokenInput,
    TokenMeta,
    TokenOutput,
    TupleArg,
    TupleMeta,
    UserInput,
    UserInputMutation,
    UserOutput,
    ValueMeta,
    build_graph,
    verify,
)
from texir.serialize import snapshot
from texir.serialize.snapshot import SCHEMA_VERSION, SnapshotVersionError, dumps, loads

REPO = Path(__file__).resolve().parent.parent
FORMATS: tuple[snapshot.SnapshotFormat, ...] = ("json", "msgpack")


def _meta(*shape: int | str, dtype: DType = DType.float32) -> TensorMeta:
    strides: list[int | str] = []
    acc: int | str = 1
    for size in reversed(shape):
        strides.append(acc)
        acc = acc * size if isinstance(acc, int) and isinstance(size, int) else f"({acc})*({size})"
    return TensorMeta(dtype=dtype, shape=tuple(shape), strides=tuple(reversed(strides)))


def _data(meta: TensorMeta, payload: bytes) -> TensorData:
    return TensorData(
        meta=meta, sha256=hashlib.sha256(payload).hexdigest(), nbytes=len(payload), data=Blob(payload)
    )


def _leaf_program(payload: bytes = b"\x00\x00\x80?" * 6) -> Program:
    """x + w -> relu: a parameter with a payload."""
    m = _meta(2, 3)
    return Program(
        graph=build_graph([
            (Placeholder(name="p_w"), m, None),
            (Placeholder(name="x"), m, None),
            (CallFunction(name="add", target="aten::add.Tensor", args=(Ref(name="x"), Ref(name="p_w"))),
             m, Provenance(debug_handle=1)),
            (CallFunction(name="relu", target="aten::relu.default", args=(Ref(name="add"),)), m,
             Provenance(debug_handle=2)),
            (Output(args=(Ref(name="relu"),)), None, None),
        ]),
        signature=GraphSignature(
            inputs=(ParameterInput(name="p_w", target="w"), UserInput(arg=Ref(name="x"))),
            outputs=(UserOutput(arg=Ref(name="relu")),),
        ),
        state=(StateEntry(target="w", value=_data(m, payload)),),
    )


def kitchen_sink() -> Program:
    """A Program holding every node, argument, metadata, signature and table kind at least once."""
    m = _meta("s0", 4)
    m_i = _meta(3, dtype=DType.int64)
    branch = build_graph([
        (Placeholder(name="a"), m, None),
        (CallFunction(name="neg", target="aten::neg.default", args=(Ref(name="a"),)), m, None),
        (Output(args=(Ref(name="neg"),)), None, None),
    ])
    every_arg = (
        Ref(name="x"), NoneArg(), IntArg(value=-(2**62)), FloatArg(value=0.1), FloatArg(value="inf"),
        FloatArg(value="-inf"), FloatArg(value="nan"), BoolArg(value=True), StrArg(value="ünïcode \"q\""),
        ListArg(items=(IntArg(value=1), ListArg(items=(Ref(name="y"),)))), TupleArg(items=()),
        DTypeArg(value=DType.bfloat16), DeviceArg(value="cpu"), LayoutArg(value=Layout.sparse_coo),
        MemoryFormatArg(value=MemoryFormat.channels_last), SymExprArg(expr="2*s0 + 1"),
        SymExprArg(expr="s0 > 2", type="bool"),
    )
    prov = Provenance(
        debug_handle=7, ancestor="add#0", stack_trace='File "m.py", line 3\n    x + y',
        nn_module_stack=(ModuleFrame(key="L__self__", path="", type="M"),
                         ModuleFrame(key="L__self___lin", path="lin", type="torch.nn.Linear")),
        source_fn_stack=(SourceFn(name="add", target="<built-in function add>"),),
        torch_fn=("add_1", "method_descriptor.add"),
    )
    entries: list[tuple[Node, ValueMeta | None, Provenance | None]] = [
        (Placeholder(name="p_w"), m, None),
        (Placeholder(name="b_buf"), m, None),
        (Placeholder(name="c_k"), m_i, None),
        (Placeholder(name="obj"), CustomObjMeta(class_fqn="__torch__.torch.classes.x.Y"), None),
        (Placeholder(name="token"), TokenMeta(), None),
        (Placeholder(name="x"), m, None),
        (Placeholder(name="y"), m, None),
        (Placeholder(name="n"), SymIntMeta(expr="s0"), None),
        (GetAttr(name="true_graph_0", target="true_graph_0"), SubgraphMeta(graph="true_graph_0"), None),
        (GetAttr(name="lowered_module_0", target="lowered_module_0"), DelegateMeta(module="lowered_module_0"), None),
        (CallFunction(name="every", target="test::every.default", args=every_arg,
                      kwargs=(("alpha", IntArg(value=2)), ("out", NoneArg()))), NoneMeta(), prov),
        (CallFunction(name="sf", target="test::sf.default"), SymFloatMeta(expr="s0/2"), None),
        (CallFunction(name="sb", target="test::sb.default"), SymBoolMeta(expr="Eq(s0, 4)"), None),
        (CallFunction(name="sc", target="test::sc.default"), ScalarMeta(value="x"), None),
        (CallFunction(name="cond", target="higher_order::cond",
                      args=(BoolArg(value=True), Ref(name="true_graph_0"), Ref(name="true_graph_0"),
                            TupleArg(items=(Ref(name="x"),)))),
         TupleMeta(items=(m,)), None),
        (CallFunction(name="call", target="texir::call_delegate", args=(Ref(name="lowered_module_0"), Ref(name="x"))),
         TupleMeta(items=(m, TupleMeta(items=(m_i,), is_list=True))), None),
        (CallFunction(name="getitem", target="_operator::getitem", args=(Ref(name="call"), IntArg(value=0))),
         m, None),
        (Output(args=(Ref(name="getitem"), Ref(name="getitem"), Ref(name="x"), Ref(name="getitem"),
                      Ref(name="getitem"), Ref(name="getitem"), Ref(name="token"))), None, None),
    ]
    lowered = LoweredBackendModule(
        backend_id="BackendWithCompilerDemo",
        processed_bytes=b"\x00\xffprocessed",
        compile_specs=(CompileSpec(key="max_value", value=b"\x04"), CompileSpec(key="", value=b"")),
        original_program=_leaf_program(),
        debug_handle_map=(DebugHandleEntry(identifier=1, debug_handles=(1, 2)),
                          DebugHandleEntry(identifier="fused", debug_handles=())),
    )
    return Program(
        graph=build_graph(entries, (Subgraph(name="true_graph_0", graph=branch),)),
        signature=GraphSignature(
            inputs=(
                ParameterInput(name="p_w", target="w"),
                BufferInput(name="b_buf", target="buf", persistent=False),
                ConstantTensorInput(name="c_k", target="k"),
                CustomObjInput(name="obj", target="obj"),
                TokenInput(name="token"),
                UserInput(arg=Ref(name="x")),
                UserInput(arg=Ref(name="y")),
                UserInput(arg=IntArg(value=3)),
            ),
            outputs=(
                UserOutput(arg=Ref(name="getitem")),
                BufferMutation(name="getitem", target="buf"),
                UserInputMutation(name="x", target="x"),
                LossOutput(name="getitem"),
                GradientToParameter(name="getitem", target="w"),
                GradientToUserInput(name="getitem", target="x"),
                TokenOutput(name="token"),
            ),
        ),
        state=(
            StateEntry(target="buf", value=_data(_meta(2), b"\x01" * 8)),
            StateEntry(target="k", value=_data(m_i, bytes(range(24)))),
            StateEntry(target="w", value=TensorData(meta=m, sha256="0" * 64, nbytes=0)),
            StateEntry(target="z_empty", value=_data(_meta(0), b"")),
        ),
        range_constraints=(RangeConstraint(symbol="s0", min=2, max=64), RangeConstraint(symbol="s1", min=0)),
        module_call_graph=(
            ModuleCallEntry(fqn="", signature=ModuleCallSignature(
                inputs=(Ref(name="x"),), outputs=(Ref(name="getitem"),), in_spec='[1, {"type": null}]',
                out_spec="[1]", forward_arg_names=("x", "y"))),
            ModuleCallEntry(fqn="lin"),
        ),
        lowered_modules=(NamedLoweredModule(name="lowered_module_0", module=lowered),),
        dialect="EDGE",
    )


# --------------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_with_data_is_exact(fmt: snapshot.SnapshotFormat) -> None:
    for program in (_leaf_program(), kitchen_sink()):
        data = dumps(program, format=fmt, include_data=True, include_stack_traces=True)
        back = loads(data)
        assert back == program
        assert dumps(back, format=fmt, include_data=True, include_stack_traces=True) == data
        # The payload bytes themselves came back.
        for a, b in zip(back.state, program.state):
            if b.value.data is None:
                assert a.value.data is None
            else:
                assert a.value.data is not None and a.value.data.tobytes() == b.value.data.tobytes()


@pytest.mark.parametrize("fmt", FORMATS)
def test_without_data_keeps_meta_hash_and_size_everywhere(fmt: snapshot.SnapshotFormat) -> None:
    program = kitchen_sink()
    back = loads(dumps(program, format=fmt))
    assert back == snapshot.strip_data(drop_stack_traces(program))
    assert back != program  # the payloads are gone...
    for a, b in zip(back.state, program.state):
        assert a.value.data is None
        assert (a.target, a.value.meta, a.value.sha256, a.value.nbytes) == (
            b.target, b.value.meta, b.value.sha256, b.value.nbytes)
    inner = back.lowered_modules[0].module
    assert inner.original_program.state[0].value.data is None  # ...also in lowered modules
    assert inner.original_program.state[0].value.sha256 == program.lowered_modules[0].module.original_program.state[0].value.sha256
    assert inner.processed_bytes == b"\x00\xffprocessed"  # the backend's output is not state


def test_strip_data_is_pure_and_cheap_when_nothing_to_strip() -> None:
    program = kitchen_sink()
    before = dumps(program, format="msgpack", include_data=True, include_stack_traces=True)
    stripped = snapshot.strip_data(program)
    assert dumps(program, format="msgpack", include_data=True, include_stack_traces=True) == before  # input untouched
    assert snapshot.strip_data(stripped) is stripped
    # Payload-free parts are shared, not copied.
    assert stripped.graph is program.graph and stripped.signature is program.signature


def test_json_snapshot_is_readable_json_with_envelope() -> None:
    data = dumps(_leaf_program(), include_data=True, include_stack_traces=True)
    doc = json.loads(data)
    assert doc["format"] == "texir-snapshot"
    assert doc["schema_version"] == list(SCHEMA_VERSION)
    assert doc["kind"] == "program"
    assert list(doc) == ["format", "schema_version", "kind", "program"]
    assert doc["program"]["state"][0]["value"]["data"] == base64.b64encode(b"\x00\x00\x80?" * 6).decode()
    assert snapshot.detect_format(b"  \n" + data) == "json"
    assert loads(b"\n  " + data + b"\n") == _leaf_program()


def test_msgpack_payloads_alias_immutable_input_and_copy_writable_input() -> None:
    payload = bytes(range(256)) * 4
    program = _leaf_program(payload)
    data = dumps(program, format="msgpack", include_data=True, include_stack_traces=True)
    blob = loads(data).state[0].value.data
    assert blob is not None and blob.tobytes() == payload
    # Zero-copy: the payload is a view into the (larger) input buffer.
    assert len(memoryview(blob.view().obj)) > len(payload)
    mutable = bytearray(data)
    blob2 = loads(mutable).state[0].value.data
    mutable[:] = b"\x00" * len(mutable)
    assert blob2 is not None and blob2.tobytes() == payload


@pytest.mark.parametrize("fmt", FORMATS)
def test_lowered_module_snapshots(fmt: snapshot.SnapshotFormat) -> None:
    module = kitchen_sink().lowered_modules[0].module
    data = snapshot.dumps_lowered_module(module, format=fmt, include_data=True, include_stack_traces=True)
    assert snapshot.loads_lowered_module(data) == module
    assert snapshot.dumps_value(module, format=fmt, include_data=True, include_stack_traces=True) == data
    assert snapshot.loads_value(data) == module
    with pytest.raises(SnapshotError, match="lowered backend module, not a program"):
        loads(data)
    with pytest.raises(SnapshotError, match="holds a program"):
        snapshot.loads_lowered_module(dumps(_leaf_program(), format=fmt))
    stripped = snapshot.loads_lowered_module(snapshot.dumps_lowered_module(module, format=fmt))
    assert stripped.original_program.state[0].value.data is None


def test_reference_backend_style_nested_snapshot_round_trips() -> None:
    # A delegate whose processed bytes are the msgpack snapshot of its program (texir-reference).
    inner = _leaf_program()
    blob = dumps(inner, format="msgpack", include_data=True, include_stack_traces=True)
    module = LoweredBackendModule(backend_id="texir-reference", processed_bytes=blob, compile_specs=(),
                                  original_program=inner)
    outer = msgspec.structs.replace(kitchen_sink(), lowered_modules=(NamedLoweredModule(name="lowered_module_0",
                                                                                        module=module),))
    for fmt in FORMATS:
        back = loads(dumps(outer, format=fmt, include_data=True, include_stack_traces=True))
        assert back == outer
        assert loads(back.lowered_modules[0].module.processed_bytes) == inner


def test_dump_and_load_files_atomically(tmp_path: Path) -> None:
    program = _leaf_program()
    for name, fmt in (("p.json", "json"), ("p.msgpack", "msgpack"), ("p.texir", "msgpack")):
        path = snapshot.dump(program, tmp_path / name, include_data=True, include_stack_traces=True)
        assert snapshot.detect_format(path.read_bytes()) == fmt
        assert snapshot.load(path) == program
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "p.msgpack", "p.texir"]  # no temp files
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    with pytest.raises(SnapshotError, match="cannot write"):
        snapshot.dump(program, tmp_path / "missing_dir" / "p.json")
    assert not (tmp_path / "missing_dir").exists()
    (tmp_path / "bad.json").write_bytes(b'{"format": "texir-snapshot"')
    with pytest.raises(SnapshotError, match="bad.json"):
        snapshot.load(tmp_path / "bad.json")
    with pytest.raises(SnapshotError, match="cannot read"):
        snapshot.load(tmp_path / "nope.json")


def test_exported_models_round_trip() -> None:
    from tests.zoo import cached_export
    from texir.adapters import from_exported_program

    for name in ("conv_relu_tan", "cond_simple"):
        program = from_exported_program(cached_export(name, True))
        verify(program)
        for fmt in FORMATS:
            back = loads(dumps(program, format=fmt, include_data=True, include_stack_traces=True))
            assert back == program, f"{name} ({fmt})"
            verify(back)
            assert loads(dumps(program, format=fmt)) == snapshot.strip_data(drop_stack_traces(program))


# --------------------------------------------------------------------------------------------------
# Determinism across processes and hash seeds

_DETERMINISM_SCRIPT = textwrap.dedent(
    """
    import hashlib, sys
    sys.path.insert(0, {repo!r})
    from tests.zoo import cached_export
    from tests.test_snapshot import kitchen_sink
    from texir.adapters import from_exported_program
    from texir.serialize.snapshot import dumps
    program = from_exported_program(cached_export("running_stats", True))
    for p in (program, kitchen_sink()):
        for fmt in ("json", "msgpack"):
            for data in (False, True):
                print(fmt, data, hashlib.sha256(dumps(p, format=fmt, include_data=data)).hexdigest())
    """
)


def test_bytes_identical_across_processes_and_hash_seeds() -> None:
    script = _DETERMINISM_SCRIPT.format(repo=str(REPO))
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONHASHSEED=seed), cwd=REPO)
        for seed in ("0", "4242")
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        outputs.append(out)
    assert outputs[0].count("\n") == 8
    assert outputs[0] == outputs[1]
    # And the same as this process for the torch-free program.
    program = kitchen_sink()
    here = hashlib.sha256(dumps(program, format="msgpack", include_data=True)).hexdigest()
    assert f"msgpack True {here}" in outputs[0]


# --------------------------------------------------------------------------------------------------
# Bad input: only SnapshotError, naming the field


def test_wrong_version_says_found_supported_and_how_to_fix() -> None:
    data = dumps(_leaf_program())
    current = b'"schema_version":[%d,%d]' % SCHEMA_VERSION
    assert current in data
    major = SCHEMA_VERSION[0]
    data = data.replace(current, b'"schema_version":[%d,0]' % major, 1)
    assert loads(data) == loads(dumps(_leaf_program()))
    newer = data.replace(b'"schema_version":[%d,0]' % major, b'"schema_version":[%d,0]' % (major + 1), 1)
    with pytest.raises(SnapshotVersionError) as info:
        loads(newer)
    message = str(info.value)
    assert f"{major + 1}.0" in message and "newer" in message
    assert f"{major}.0" in message and "texir snapshot" in message and "upgrade" in message
    older = data.replace(b'"schema_version":[%d,0]' % major, b'"schema_version":[0,3]', 1)
    with pytest.raises(SnapshotVersionError, match=r"0\.3 is older than this texir can read \(this texir reads 1\.0, 1\.1, 2\.0 to 2\.3 and 3\.0\).*re-create"):
        loads(older)
    newer_minor = data.replace(
        b'"schema_version":[%d,0]' % major, b'"schema_version":[%d,%d]' % (major, SCHEMA_VERSION[1] + 1), 1
    )
    with pytest.raises(SnapshotVersionError, match="newer"):
        loads(newer_minor)
    with pytest.raises(SnapshotError, match=r"\$\.schema_version"):
        loads(data.replace(b'"schema_version":[%d,0]' % major, b'"schema_version":"2.0"', 1))
    # The same check on msgpack.
    packed = msgspec.msgpack.encode({"format": "texir-snapshot", "schema_version": [99, 0], "program": {}})
    with pytest.raises(SnapshotVersionError, match="99.0"):
        loads(packed)


def test_foreign_and_empty_input() -> None:
    for data, pattern in (
        (b"", "empty input"),
        (b"   ", "corrupt or truncated"),
        (b'{"hello": 1}', "not a texir snapshot"),
        (b'[1, 2]', "not a texir snapshot"),
        (b'{"format": "other"}', "format marker 'other'"),
        (msgspec.msgpack.encode([1, 2, 3]), "not a texir snapshot"),
        (b"\x00\x01\x02", "not a texir snapshot"),
        (b"PK\x03\x04 a zip file", "not a texir snapshot"),
        (b"\xc1", "corrupt"),
        (b'{"format":"texir-snapshot","schema_version":[2,0],"kind":"program"}', r"no `\$\.program`"),
        (b'{"format":"texir-snapshot","schema_version":[2,0],"kind":"graph","program":{}}', "unknown `\\$.kind`"),
    ):
        with pytest.raises(SnapshotError, match=pattern):
            loads(data)


def test_invalid_field_is_named_by_path() -> None:
    data = dumps(kitchen_sink())
    doc = json.loads(data)
    doc["program"]["graph"]["nodes"][10]["args"][2]["value"] = "three"
    with pytest.raises(SnapshotError, match=r"\$\.program\.graph\.nodes\[10\]\.args\[2\]\.value"):
        loads(json.dumps(doc).encode())
    doc = json.loads(data)
    doc["program"]["graph"]["nodes"][0]["kind"] = "placeholdr"
    with pytest.raises(SnapshotError, match=r"\$\.program\.graph\.nodes\[0\]\.kind"):
        loads(json.dumps(doc).encode())
    doc = json.loads(data)
    del doc["program"]["signature"]
    with pytest.raises(SnapshotError, match=r"missing required field `signature`.*\$\.program"):
        loads(json.dumps(doc).encode())


def test_bad_payloads_are_reported() -> None:
    doc = json.loads(dumps(_leaf_program(), include_data=True, include_stack_traces=True))
    doc["program"]["state"][0]["value"]["data"] = "not base64!!"
    with pytest.raises(SnapshotError, match=r"base64.*\$\.program\.state\[0\]\.value\.data"):
        loads(json.dumps(doc).encode())
    doc["program"]["state"][0]["value"]["data"] = "AAAA"
    with pytest.raises(SnapshotError, match=r"state\[0\]\.value\.data.*'w'.*3 bytes but nbytes says 24"):
        loads(json.dumps(doc).encode())
    # An unknown msgpack extension type.
    packed = dumps(_leaf_program(), format="msgpack", include_data=True, include_stack_traces=True)
    header = b"\xc7\x18\x01"  # ext8, 24 bytes, type 1
    assert packed.count(header) == 1
    with pytest.raises(SnapshotError, match="unknown msgpack extension type 9"):
        loads(packed.replace(header, b"\xc7\x18\x09"))


def test_deep_nesting_does_not_crash() -> None:
    deep_json = b'{"format":"texir-snapshot","schema_version":[2,0],"program":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(SnapshotError, match="nested too deeply"):
        loads(deep_json)
    nested = b'{"kind":"list","items":[' * 50_000 + b'{"kind":"none"}' + b"]}" * 50_000
    doc = dumps(_leaf_program()).replace(b'{"kind":"ref","name":"x"}', nested, 1)
    with pytest.raises(SnapshotError, match="nested too deeply"):
        loads(doc)
    deep_pack = b"\x83\xa6format\xaetexir-snapshot\xaeschema_version\x92\x02\x00\xa7program" + b"\x91" * 200_000
    with pytest.raises(SnapshotError):
        loads(deep_pack)


def test_absurd_lengths_fail_fast_without_allocating() -> None:
    prefix = b"\x83\xa6format\xaetexir-snapshot\xaeschema_version\x92\x02\x00\xa7program"
    for body in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
                 b"\xdb\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01"):
        with pytest.raises(SnapshotError, match="truncated"):
            loads(prefix + body + b"\x00" * 16)


def _assert_only_snapshot_errors(data: bytes) -> None:
    try:
        result = loads(data)
    except SnapshotError:
        return
    assert isinstance(result, Program)


_SAMPLES = {fmt: dumps(kitchen_sink(), format=fmt, include_data=True, include_stack_traces=True) for fmt in FORMATS}


@settings(max_examples=int(os.environ.get("TEXIR_FUZZ_EXAMPLES", "150")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(FORMATS),
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_mutated_bytes_raise_only_snapshot_errors(fmt: snapshot.SnapshotFormat, edits: list[tuple[float, int]]) -> None:
    data = bytearray(_SAMPLES[fmt])
    for where, value in edits:
        data[int(where * len(data))] = value
    _assert_only_snapshot_errors(bytes(data))


@settings(max_examples=int(os.environ.get("TEXIR_FUZZ_EXAMPLES", "100")), deadline=None)
@given(fmt=st.sampled_from(FORMATS), cut=st.floats(0, 1, exclude_max=True),
       insert=st.binary(max_size=16))
def test_truncated_and_spliced_bytes_raise_only_snapshot_errors(fmt: snapshot.SnapshotFormat, cut: float, insert: bytes) -> None:
    data = _SAMPLES[fmt]
    at = int(cut * len(data))
    with pytest.raises(SnapshotError):
        loads(data[:at])
    _assert_only_snapshot_errors(data[:at] + insert + data[at:])


@settings(max_examples=int(os.environ.get("TEXIR_FUZZ_EXAMPLES", "100")), deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_raise_only_snapshot_errors(data: bytes) -> None:
    _assert_only_snapshot_errors(data)
    _assert_only_snapshot_errors(b"{" + data)
    _assert_only_snapshot_errors(_SAMPLES["msgpack"][:80] + data)


def test_unencodable_program_is_a_snapshot_error() -> None:
    bad = msgspec.structs.replace(_leaf_program(), dialect=object())  # type: ignore[arg-type]  # deliberately wrong
    with pytest.raises(SnapshotError, match="cannot encode"):
        dumps(bad)
    with pytest.raises(SnapshotError, match="unknown snapshot format"):
        dumps(_leaf_program(), format="yaml")  # type: ignore[arg-type]  # deliberately wrong
    with pytest.raises(SnapshotError, match="cannot snapshot a str"):
        snapshot.dumps_value("program")  # type: ignore[arg-type]  # deliberately wrong


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (b'"name":"add"}],"meta_id":0', b'"name":"add"}],"meta_id":5', r"\$\.program\.graph: node #3 'relu' has meta_id 5, which is out of range \(1 metas\)"),
        (b'"name":"add"}],"meta_id":0', b'"name":"add"}],"meta_id":-1', r"Expected `int` >= 0 - at `\$\.program\.graph\.nodes\[3\]\.meta_id`"),
        (b'"debug_handle":[null,null,1,2,null]', b'"debug_handle":[null,1,2,null]', r"provenance\.debug_handle: 4 entries for 5 nodes"),
        (b'"location":[null,null,null,null,null]', b'"location":[null,null,3,null,null]', r"provenance\.location\[2\] \(node 'add'\): 3 is out of range \(0 locations\)"),
    ],
)
def test_bad_table_indices_are_snapshot_errors(old: bytes, new: bytes, message: str) -> None:
    data = dumps(_leaf_program())
    assert old in data, data
    with pytest.raises(SnapshotError, match=message):
        loads(data.replace(old, new, 1))


def test_metadata_and_locations_are_stored_once_per_graph() -> None:
    program = _leaf_program()
    graph = program.graph
    assert len(graph.metas) == 1 and [getattr(n, "meta_id", None) for n in graph.nodes] == [0, 0, 0, 0, None]
    assert graph.provenance is not None and graph.provenance.debug_handle == (None, None, 1, 2, None)
    assert graph.prov(2) == Provenance(debug_handle=1) and graph.prov(0) is None
    doc = json.loads(dumps(program))
    assert len(doc["program"]["graph"]["metas"]) == 1


@pytest.mark.parametrize("suffix", ["json", "msgpack"])
def test_schema_1_1_snapshots_load_and_are_upgraded(suffix: str) -> None:
    # Written by texir at schema 1.1 (metadata and provenance inline on nodes) from kitchen_sink().
    data = (Path(__file__).parent / "data" / f"snapshot_v1.1_kitchen_sink.{suffix}").read_bytes()
    assert b"1,1" in data[:80] or b"\x92\x01\x01" in data[:80]
    upgraded = loads(data)
    assert upgraded == kitchen_sink()
    verify(upgraded)
    # A lowered-module snapshot of schema 1.1 upgrades too (its original program included).
    doc = msgspec.json.decode(data) if suffix == "json" else msgspec.msgpack.decode(data)
    lowered_doc = {"format": "texir-snapshot", "schema_version": [1, 1], "kind": "lowered_module",
                   "module": doc["program"]["lowered_modules"][0]["module"]}
    encoded = msgspec.json.encode(lowered_doc) if suffix == "json" else msgspec.msgpack.encode(lowered_doc)
    module = snapshot.loads_lowered_module(encoded)
    assert module == kitchen_sink().lowered_modules[0].module
