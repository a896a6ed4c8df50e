"""ETRecord for texir programs: ExecuTorch's devtools Inspector, given a texir `.pte`'s ETDump and the
ETRecord texir writes, attributes every event to the same debug handles, ops and nodes as it does
for ExecuTorch's own `.pte` + ETRecord of the same model (XNNPACK delegates and portable kernels)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.zoo import zoo_model
from texir.emit import emit_with_debug
from texir.ir import CallFunction
from texir.serialize.pte import dumps

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")


def _attribution(pte: bytes, etrecord: Path, args: tuple[Any, ...], tmp: Path) -> list[tuple[Any, ...]]:
    from executorch.devtools import Inspector
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=1 << 24)
    program.load_method("forward").execute(list(args))
    program.write_etdump_result_to_file(str(tmp / "run.etdp"), str(tmp / "run.debug"))
    inspector = Inspector(etdump_path=str(tmp / "run.etdp"), etrecord=str(etrecord))
    return [
        (block.name, event.name, event.debug_handles, event.op_types, sorted(event.stack_traces or {}),
         event.delegate_debug_identifier)
        for block in inspector.event_blocks for event in block.events
    ]


@pytest.mark.parametrize("name", ["conv_relu_tan", "convnet"])
def test_inspector_attributes_a_texir_pte_like_executorchs_own(name: str, tmp_path: Path) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from texir.executorch import executorch_partitioner, write_etrecord
    from texir.orchestrate import lower

    module, args = zoo_model(name).build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        manager = to_edge_transform_and_lower(
            torch.export.export(module, args), partitioner=[XnnpackPartitioner()], generate_etrecord=True
        ).to_executorch()
    manager.get_etrecord().save(str(tmp_path / "theirs.etrecord"))
    (tmp_path / "theirs").mkdir()
    theirs = _attribution(bytes(manager.buffer), tmp_path / "theirs.etrecord", args, tmp_path / "theirs")

    done = lower(torch.export.export(module, args), [executorch_partitioner(XnnpackPartitioner())])
    program, edge = done.program, done.edge
    assert [d.backend for d in done.report.delegates] == ["XnnpackBackend"] * len(program.lowered_modules)
    emitted = emit_with_debug(program)
    write_etrecord(tmp_path / "ours.etrecord", edge, emitted)
    (tmp_path / "ours").mkdir()
    ours = _attribution(dumps(emitted.program), tmp_path / "ours.etrecord", args, tmp_path / "ours")

    assert ours == theirs
    delegated = [e for e in ours if e[1] == "DELEGATE_CALL"]
    assert delegated and all(e[2] and e[3] for e in delegated)  # handles and the ops inside the delegate


def test_a_lowered_program_still_gives_every_event_its_handles(tmp_path: Path) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner, write_etrecord
    from texir.orchestrate import lower

    module, args = zoo_model("conv_relu_tan").build()
    program = lower(torch.export.export(module, args), [executorch_partitioner(XnnpackPartitioner())]).program
    emitted = emit_with_debug(program)
    write_etrecord(tmp_path / "lowered.etrecord", program, emitted)
    events = _attribution(dumps(emitted.program), tmp_path / "lowered.etrecord", args, tmp_path)
    (call,) = [e for e in events if e[1] == "DELEGATE_CALL"]
    assert call[2] == emitted.debug_handle_map()["forward"][0]  # the handles, without op names
    assert [e[3] for e in events if e[1] == "OPERATOR_CALL"] == [["aten.tan.default"]]


def test_the_wrong_program_for_the_maps_is_a_typed_error_and_writes_nothing(tmp_path: Path) -> None:
    from texir.adapters import from_exported_program
    from texir.executorch import EtrecordError, write_etrecord

    module, args = zoo_model("mlp").build()
    program = from_exported_program(torch.export.export(module, args), decompose=True)
    emitted = emit_with_debug({"forward": program, "other": program})
    with pytest.raises(EtrecordError, match=r"emitter output has methods \['forward', 'other'\] but the program has \['forward'\]"):
        write_etrecord(tmp_path / "x.etrecord", program, emitted)
    assert list(tmp_path.iterdir()) == []


def test_two_methods_lowered_with_their_edge_programs_give_one_record(tmp_path: Path) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.etrecord import parse_etrecord

    from texir.executorch import executorch_partitioner, write_etrecord
    from texir.orchestrate import lower

    module, args = zoo_model("conv_relu_tan").build()
    other, other_args = zoo_model("mlp").build()
    done = lower(
        {"forward": torch.export.export(module, args), "mlp": torch.export.export(other, other_args)},
        {"forward": [executorch_partitioner(XnnpackPartitioner())]},
    )
    programs = {name: d.program for name, d in done.items()}
    edges = {name: d.edge for name, d in done.items()}
    assert sorted(programs) == sorted(edges) == ["forward", "mlp"]
    assert programs["forward"].lowered_modules and not programs["mlp"].lowered_modules  # partitioners per method
    emitted = emit_with_debug(programs)
    write_etrecord(tmp_path / "two.etrecord", edges, emitted)
    record = parse_etrecord(str(tmp_path / "two.etrecord"))
    assert sorted(record.edge_dialect_program) == ["forward", "mlp"]
    stored = {m: {int(k): v for k, v in handles.items()} for m, handles in record._debug_handle_map.items()}
    assert stored == emitted.debug_handle_map()  # (the record keeps JSON's string keys)
    # each method's edge program, as ExecuTorch's own multi-method records hold them
    for name, program in edges.items():
        names = {n.name for n in record.edge_dialect_program[name].graph.nodes if n.op == "call_function"}
        assert names == {n.name for n in program.graph.nodes if isinstance(n, CallFunction)}
