"""`texir.compat`: ExecuTorch scripts run unchanged on texir after `texir.compat.install()`.

The `.pte` texir writes is compared with the one ExecuTorch writes for the same script: decoded by
ExecuTorch's own deserializer into equal `schema.Program`s, every byte from the first segment on
equal, and the whole file byte-equal."""

from __future__ import annotations

import copy
import dataclasses
import io
import struct
from collections.abc import Sequence
from typing import Any

import pytest
import torch

pytest.importorskip("executorch")

import texir.compat  # noqa: E402  (after the importorskip: the facade needs executorch)


class LinearReLU(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class AddMul(torch.nn.Module):
    def forward(self, a: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        z = torch.mm(a, x) + b
        return torch.mm(z - a, x) + b


@pytest.fixture(scope="module")
def linear_ep() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(LinearReLU(), (torch.randn(2, 8),), strict=True)


@pytest.fixture(scope="module")
def addmul_ep() -> torch.export.ExportedProgram:
    return torch.export.export(AddMul(), (torch.randn(2, 2),) * 3, strict=True)


def xnnpack_script(ep: torch.export.ExportedProgram) -> bytes:
    """An ExecuTorch user's script, unchanged."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    f = io.BytesIO()
    to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().write_to_file(f)
    return f.getvalue()


def custom_partitioner_script(ep: torch.export.ExportedProgram) -> bytes:
    from executorch.exir import to_edge
    from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

    return bytes(to_edge(ep).to_backend(AddMulPartitionerDemo()).to_executorch().buffer)


def differences(x: Any, y: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(field path, ours, theirs) for every leaf where two decoded schema dataclasses differ."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [d for f in dataclasses.fields(x) for d in differences(getattr(x, f.name), getattr(y, f.name), f"{path}.{f.name}")]
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        return [d for i, (p, q) in enumerate(zip(x, y)) for d in differences(p, q, f"{path}[{i}]")]
    return [] if x == y else [(path, x, y)]


def assert_same_pte(ours: bytes, theirs: bytes, known: Sequence[tuple[str, Any, Any]] = ()) -> None:
    """Equal as ExecuTorch decodes them (but for the `known` differences, each explained in
    docs/compat.md), equal bytes from the segments on."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    a, b = deserialize_pte_binary(ours), deserialize_pte_binary(theirs)
    assert differences(a.program, b.program) == list(known)
    assert a.named_data == b.named_data and a.mutable_data == b.mutable_data
    # extended header: magic, length, program size, segment base offset; segments equal byte for byte
    base_a, base_b = struct.unpack_from("<Q", ours, 24)[0], struct.unpack_from("<Q", theirs, 24)[0]
    assert ours[base_a:] == theirs[base_b:]
    if not known:  # texir's flatbuffer writer lays tables out as ExecuTorch's does: the whole file is equal
        assert ours == theirs


@pytest.mark.parametrize("script,fixture,known", [
    (xnnpack_script, "linear_ep", []),
    (custom_partitioner_script, "addmul_ep", []),
])
def test_an_executorch_script_runs_unchanged_on_texir_and_writes_executorchs_program(
    script: Any, fixture: str, known: list[tuple[str, Any, Any]], request: pytest.FixtureRequest
) -> None:
    ep = request.getfixturevalue(fixture)
    theirs = script(copy.deepcopy(ep))
    with texir.compat.installed():
        import executorch.exir

        assert executorch.exir.to_edge_transform_and_lower.__texir_facade__ is texir.compat.to_edge_transform_and_lower
        before = texir.compat.program.CALLS[0]
        ours = script(copy.deepcopy(ep))
        assert texir.compat.program.CALLS[0] > before  # texir did the work
    assert_same_pte(ours, theirs, known)


def test_install_rebinds_and_uninstall_restores_executorchs_names() -> None:
    import executorch.exir
    import executorch.exir.program

    original = executorch.exir.to_edge, executorch.exir.program.to_edge_transform_and_lower
    with texir.compat.installed():
        assert texir.compat.is_installed()
        assert executorch.exir.to_edge.__texir_facade__ is texir.compat.to_edge
        facade = executorch.exir.program.to_edge_transform_and_lower.__texir_facade__
        assert facade is texir.compat.to_edge_transform_and_lower
    assert not texir.compat.is_installed()
    assert (executorch.exir.to_edge, executorch.exir.program.to_edge_transform_and_lower) == original


def test_default_xnnpack_runs_natively_and_an_option_goes_through_the_bridge(
    linear_ep: torch.export.ExportedProgram,
) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    native = texir.compat.to_edge_transform_and_lower(copy.deepcopy(linear_ep), partitioner=[XnnpackPartitioner()])
    bridged = texir.compat.to_edge_transform_and_lower(
        copy.deepcopy(linear_ep), partitioner=[XnnpackPartitioner(per_op_mode=True)]
    )
    assert native.native_xnnpack and not bridged.native_xnnpack
    assert native.lowered["forward"].report.delegates and bridged.lowered["forward"].report.delegates


def test_views_are_executorchs_types_and_the_same_object_each_call(addmul_ep: torch.export.ExportedProgram) -> None:
    from executorch.exir import schema
    from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

    edge = texir.compat.to_edge(copy.deepcopy(addmul_ep))
    assert edge.methods == {"forward"}
    view = edge.exported_program()
    assert isinstance(view, torch.export.ExportedProgram) and edge.exported_program() is view
    et = edge.to_backend(AddMulPartitionerDemo()).to_executorch()
    program = et.executorch_program
    assert isinstance(program, schema.Program) and et.executorch_program is program
    assert [d.id for d in program.execution_plan[0].delegates] == ["BackendWithCompilerDemo"] * 2


def test_an_unsupported_backend_config_option_is_refused_by_name(linear_ep: torch.export.ExportedProgram) -> None:
    from executorch.exir import ExecutorchBackendConfig

    edge = texir.compat.to_edge(copy.deepcopy(linear_ep))
    with pytest.raises(texir.compat.UnsupportedOptionError, match="emit_stacktrace") as caught:
        edge.to_executorch(ExecutorchBackendConfig(emit_stacktrace=True))
    assert isinstance(caught.value, NotImplementedError)


def test_backend_config_layout_options_reach_the_file(linear_ep: torch.export.ExportedProgram) -> None:
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir import to_edge as et_to_edge

    config = ExecutorchBackendConfig(extract_delegate_segments=False, segment_alignment=64)
    ours = texir.compat.to_edge(copy.deepcopy(linear_ep)).to_executorch(config).buffer
    theirs = et_to_edge(copy.deepcopy(linear_ep)).to_executorch(config).buffer
    # requires_grad as ExecuTorch's edge program leaves it (the weight's permute_copy, the addmm and
    # the relu computed from parameters require grad): the whole file is ExecuTorch's
    assert_same_pte(ours, theirs)


class Reshapes(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.view(4, 2) * 2.0
        return torch.relu(y.reshape(8)) + x.flatten()


@pytest.mark.parametrize("remove_view_copy", [True, False])
def test_remove_view_copy_keeps_or_leaves_the_reshape_copies_as_executorch(remove_view_copy: bool) -> None:
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir import to_edge as et_to_edge

    from texir.serialize.pte import loads

    ep = torch.export.export(Reshapes(), (torch.randn(2, 4),), strict=True)
    config = ExecutorchBackendConfig(remove_view_copy=remove_view_copy)
    ours = texir.compat.to_edge(copy.deepcopy(ep)).to_executorch(config).buffer
    theirs = et_to_edge(copy.deepcopy(ep)).to_executorch(config).buffer
    assert_same_pte(ours, theirs)
    ops = {op.name for op in loads(ours).program.execution_plan[0].operators}
    # with the option off every reshape stays a view_copy kernel; on, the inner ones become views
    assert ("aten::view_copy" in ops) is not remove_view_copy


def test_executorchs_own_internals_keep_executorchs_entry_points() -> None:
    """XNNPACK's preprocess runs ExecuTorch's to_edge with options texir refuses: ExecuTorch's own
    modules get ExecuTorch's functions; users, ExecuTorch's tests and its recipe pipeline get texir's."""
    from texir.compat.switch import _is_executorch_internal

    assert _is_executorch_internal("executorch.backends.xnnpack.utils.utils")
    assert not _is_executorch_internal("executorch.export.stages")
    assert not _is_executorch_internal("executorch.exir.backend.test.test_partitioner")
    assert not _is_executorch_internal("__main__")


def test_a_str_compile_spec_value_is_written_as_its_utf8_bytes(addmul_ep: torch.export.ExportedProgram) -> None:
    # ExecuTorch 1.5.1 takes a str CompileSpec value at to_backend (its tests pass one) but its
    # serializer crashes on it (flatbuffers' TypeError); texir writes the value's UTF-8 bytes, a
    # deliberate difference listed in docs/compat.md.
    from executorch.exir import to_edge as et_to_edge
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

    class WithStrSpec(AddMulPartitionerDemo):  # type: ignore[misc]  # ExecuTorch's class is untyped
        def __init__(self) -> None:
            super().__init__()
            self.delegation_spec.compile_specs.append(CompileSpec("path", "/a/b/c/d"))

    ours = texir.compat.to_edge(copy.deepcopy(addmul_ep)).to_backend(WithStrSpec()).to_executorch()
    delegates = ours.executorch_program.execution_plan[0].delegates
    assert delegates and all(
        [(c.key, bytes(c.value)) for c in d.compile_specs][-1] == ("path", b"/a/b/c/d") for d in delegates
    )
    with pytest.raises(TypeError):
        et_to_edge(copy.deepcopy(addmul_ep)).to_backend(WithStrSpec()).to_executorch()
