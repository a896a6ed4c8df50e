"""External data (`.ptd`) and mutable state, against ExecuTorch 1.5.1: the same `.ptd` contents
(decoded with ExecuTorch's own deserializer), the same external references, mutable-buffer names and
initial values in the `.pte`, and the same outputs in ExecuTorch's runtime call after call."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from texir.adapters import from_exported_program
from texir.cli.main import main
from texir.emit import DEFAULT_EXTERNAL_TAG, EmitError, EmitOptions, emit
from texir.errors import PteError
from texir.ir.blob import Blob
from texir.serialize.pte import (
    PtdDecodeError,
    PtdMismatchError,
    ScalarType,
    check_external,
    dump_ptd,
    dumps,
    dumps_ptd,
    loads_ptd,
)
from texir.serialize.pte.schema import PtdEntry, PtdFile, TensorDataLocation, TensorLayout
from texir.executorch.runtime import load_method

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")


class _Stateful(torch.nn.Module):
    """Weights, a constant buffer and a mutated buffer with a meaningful initial value."""

    def __init__(self, out: int = 3) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, out)
        self.register_buffer("scale", torch.full((out,), 2.0))
        self.register_buffer("count", torch.arange(float(out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1.0)
        return self.lin(x) * self.scale + self.count


def _model(out: int = 3) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return _Stateful(out), (torch.randn(2, 4),)


def _export(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> Any:
    # ExecuTorch's pipeline mutates the program it is given: each side gets its own export.
    return torch.export.export(module, args, strict=False)


def _ptd_contents(data: bytes) -> dict[str, tuple[bytes, Any]]:
    """key -> (payload, tensor layout), as ExecuTorch's own deserializer reads the file."""
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(Cord(data))
    out = {}
    for key, entry in payload.named_data.items():
        layout = entry.tensor_layout
        shape = None if layout is None else (int(layout.scalar_type), list(layout.sizes), list(layout.dim_order))
        out[key] = (bytes(payload.buffers[entry.buffer_index]), shape)
    return out


def _tensor_names(pte: bytes) -> list[tuple[str, int, bool]]:
    """(fully qualified name, location, planned) of every named tensor, as ExecuTorch decodes them."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte).program
    names = []
    for plan in program.execution_plan:
        for value in plan.values:
            info = getattr(value.val, "extra_tensor_info", None)
            if info is not None and info.fully_qualified_name:
                names.append((info.fully_qualified_name, int(info.location), value.val.allocation_info is not None))
    return sorted(names)


def _mutable_data(pte: bytes) -> list[bytes]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    return [bytes(b.storage) for b in deserialize_pte_binary(pte).mutable_data or ()]


def _run(tmp: Path, name: str, pte: bytes, ptd: bytes | None, args: tuple[torch.Tensor, ...], calls: int) -> list[torch.Tensor]:
    from executorch.runtime import Runtime

    (tmp / f"{name}.pte").write_bytes(pte)
    data_path = None
    if ptd is not None:
        data_path = tmp / f"{name}.ptd"
        data_path.write_bytes(ptd)
    method = load_method(tmp / f"{name}.pte", data_path=data_path)
    return [method.execute(list(args))[0].clone() for _ in range(calls)]


def test_external_constants_and_mutable_state_match_executorch(tmp_path: Path) -> None:
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    module, args = _model()
    config = ExecutorchBackendConfig(
        external_constants=True, emit_mutable_buffer_names=True, passes=[InitializedMutableBufferPass(["count"])]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = to_edge(_export(module, args)).to_executorch(config)
    their_pte, their_ptd = theirs.buffer, bytes(theirs._tensor_data[DEFAULT_EXTERNAL_TAG])

    options = EmitOptions(external_constants=True, emit_mutable_buffer_names=True, init_mutable_buffers=("count",))
    program = emit(from_exported_program(_export(module, args), decompose=True), options)
    assert [f.tag for f in program.external] == [DEFAULT_EXTERNAL_TAG]
    our_pte, our_ptd = dumps(program), dumps_ptd(program.external[0])

    assert _ptd_contents(our_ptd) == _ptd_contents(their_ptd)
    assert set(_ptd_contents(our_ptd)) == {"lin.weight", "lin.bias", "scale"}
    assert _tensor_names(our_pte) == _tensor_names(their_pte)
    assert ("count", int(TensorDataLocation.SEGMENT), True) in _tensor_names(our_pte)
    assert _mutable_data(our_pte) == _mutable_data(their_pte)
    assert _mutable_data(our_pte)[1] == torch.arange(3.0).numpy().tobytes()  # the buffer's initial value

    ours = _run(tmp_path, "ours", our_pte, our_ptd, args, 3)
    reference = _run(tmp_path, "theirs", their_pte, their_ptd, args, 3)
    with torch.no_grad():
        eager = [module(*args) for _ in range(3)]
    for got, ref, want in zip(ours, reference, eager):  # the state survives across calls
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert not torch.equal(ours[0], ours[2])


class _TwoLayer(torch.nn.Module):
    # Named attributes: ExecuTorch's delegate tags do not survive re-export of an nn.Sequential
    # (its get_attr targets are "0.weight", ...), so the reference needs this form.
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_xnnpack_weights_in_a_ptd_match_executorch(tmp_path: Path) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted

    from texir.executorch import executorch_partitioner
    from texir.orchestrate import lower

    torch.manual_seed(0)
    module, args = _TwoLayer().eval(), (torch.randn(2, 4),)
    # ExecuTorch's way: tag the constants for the delegate, re-export, lower, write constants outside.
    tagged = _export(module, args).module()
    delegate_external_constants_pass_unlifted(tagged, gen_tag_fn=lambda node: DEFAULT_EXTERNAL_TAG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = to_edge_transform_and_lower(
            _export(tagged, args), partitioner=[XnnpackPartitioner()]
        ).to_executorch(ExecutorchBackendConfig(external_constants=True))
    their_pte, their_ptd = theirs.buffer, bytes(theirs._tensor_data[DEFAULT_EXTERNAL_TAG])

    lowered = lower(_export(module, args), [executorch_partitioner(XnnpackPartitioner())], cache=None).program
    program = emit(lowered, EmitOptions(external_constants=True, external_named_data=DEFAULT_EXTERNAL_TAG))
    our_pte, our_ptd = dumps(program), dumps_ptd(program.external[0])
    assert program.named_data == ()  # every weight went to the .ptd
    assert _ptd_contents(our_ptd) == _ptd_contents(their_ptd)
    assert len(our_pte) == len(their_pte)
    (ours,) = _run(tmp_path, "ours", our_pte, our_ptd, args, 1)
    (reference,) = _run(tmp_path, "theirs", their_pte, their_ptd, args, 1)
    torch.testing.assert_close(ours, reference, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(ours, module(*args), rtol=1e-4, atol=1e-5)


def test_external_constants_by_tag_function() -> None:
    module, args = _model()
    program = from_exported_program(_export(module, args), decompose=True)
    pte = emit(program, EmitOptions(external_constants=lambda fqn: "weights" if fqn == "lin.weight" else None))
    ((tag, keys),) = [(f.tag, [e.key for e in f.entries]) for f in pte.external]
    assert (tag, keys) == ("weights", ["lin.weight"])
    inside = {b.storage.tobytes() for b in pte.program.constant_buffer}
    assert {module.lin.bias.detach().numpy().tobytes(), module.scale.numpy().tobytes()} <= inside  # stay inside
    assert module.lin.weight.detach().numpy().tobytes() not in inside

    def broken(fqn: str) -> str | None:
        raise ValueError("no tags today")

    with pytest.raises(EmitError, match=r"external_constants\('lin.weight'\) raised ValueError: no tags today"):
        emit(program, EmitOptions(external_constants=broken))
    with pytest.raises(EmitError, match=r"returned '\.\./up'.*file name"):
        emit(program, EmitOptions(external_constants=lambda fqn: "../up"))


def test_duplicate_external_keys_are_refused_naming_the_key() -> None:
    first = from_exported_program(_export(*_model()), decompose=True)
    torch.manual_seed(1)
    other_module = _Stateful()
    second = from_exported_program(_export(other_module, (torch.randn(2, 4),)), decompose=True)
    with pytest.raises(EmitError, match=r"external data key 'lin.weight' is stored twice.*method 'a'.*method 'b'"):
        emit({"a": first, "b": second}, EmitOptions(external_constants=True))
    # Equal payloads under one key (two methods sharing weights) are written once.
    shared = emit({"a": first, "b": first}, EmitOptions(external_constants=True))
    assert [e.key for e in shared.external[0].entries] == ["lin.weight", "lin.bias", "scale"]
    entry = PtdEntry(key="w", data=Blob(b"1234"))
    with pytest.raises(PteError, match=r"\.ptd entry 'w' appears twice"):
        dumps_ptd(PtdFile(tag="t", entries=(entry, entry)))


def test_missing_or_mismatched_ptd_is_a_typed_error_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module, args = _model()
    program = emit(from_exported_program(_export(module, args), decompose=True), EmitOptions(external_constants=True))
    (data,) = program.external
    check_external(program.program, [data])  # the pair written together agrees
    with pytest.raises(PtdMismatchError, match=r"external tensor 'lin.weight' is in none of the .ptd files given \(none\)"):
        check_external(program.program, [])
    wider, _ = _model(out=5)
    other = emit(from_exported_program(_export(wider, args), decompose=True), EmitOptions(external_constants=True))
    with pytest.raises(PtdMismatchError, match=r"'lin.weight' is FLOAT\[3, 4\].*FLOAT\[5, 4\]"):
        check_external(program.program, [other.external[0]])
    raw = dumps_ptd(data)
    with pytest.raises(PtdDecodeError, match=r"truncated or corrupt"):
        loads_ptd(raw[: len(raw) - 8])
    with pytest.raises(PtdDecodeError, match=r"not a .ptd file"):
        loads_ptd(dumps(program))
    # On the command line: `texir inspect MODEL.pte --data FILE.ptd` checks the pair (exit 2 on a mismatch).
    pte_path, good, bad = tmp_path / "m.pte", tmp_path / "good.ptd", tmp_path / "bad.ptd"
    pte_path.write_bytes(dumps(program))
    dump_ptd(data, good)
    dump_ptd(other.external[0], bad)
    assert main(["inspect", str(pte_path), "--brief", "--data", str(good)]) == 0
    assert "EXTERNAL tensors found" in capsys.readouterr().out
    assert main(["inspect", str(pte_path), "--data", str(bad)]) == 2
    assert "'lin.weight' is FLOAT[3, 4]" in capsys.readouterr().err
    assert main(["inspect", str(good)]) == 0
    assert "lin.weight: 48 bytes" in capsys.readouterr().out


def test_ptd_segments_honour_entry_alignment_and_round_trip() -> None:
    layout = TensorLayout(scalar_type=ScalarType.FLOAT, sizes=(2,), dim_order=(0,))
    entries = (
        PtdEntry(key="a", data=Blob(b"\x01" * 8), layout=layout),
        PtdEntry(key="b", data=Blob(b"\x02" * 3), alignment=512),
        PtdEntry(key="c", data=Blob(b"\x01" * 8)),  # same payload as "a": one segment
    )
    raw = dumps_ptd(PtdFile(tag="t", entries=entries))
    back = loads_ptd(raw)
    assert [(e.key, e.data, e.layout) for e in back.entries] == [(e.key, e.data, e.layout) for e in entries]
    base = int.from_bytes(raw[32:40], "little")
    offset_b = raw.index(b"\x02" * 3)
    assert base % 128 == 0 and (offset_b - base) % 512 == 0
    contents = _ptd_contents(raw)
    assert contents["a"] == (b"\x01" * 8, (int(ScalarType.FLOAT), [2], [0])) and contents["c"][0] == b"\x01" * 8


def test_init_mutable_buffers_without_a_payload_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import msgspec

    from texir.errors import IRError

    program = from_exported_program(_export(*_model()), decompose=True)
    hollow = msgspec.structs.replace(
        program, state=tuple(e for e in program.state if e.target != "count")
    )
    # With verification on (the test suite's default) the input itself is refused before any pass runs.
    with pytest.raises(IRError, match=r"BufferInput 'b_count'.*'count' missing from program.state"):
        emit(hollow, EmitOptions(init_mutable_buffers=True))
    monkeypatch.delenv("TEXIR_VERIFY", raising=False)
    with pytest.raises(EmitError, match=r"mutable buffer 'count' should get its initial value"):
        emit(hollow, EmitOptions(init_mutable_buffers=True))
