"""How texir presents programs to ExecuTorch's partitioners and backends, against how ExecuTorch
1.5.1's `to_edge_transform_and_lower` presents them (issue #28):

1. the edge program's dialect and verifier ("EDGE", `EXIREdgeDialectVerifier` with the kept ops as
   `preserve_ops`, so `ep.validate()` passes where ExecuTorch's does);
2. when partitioners are asked what to keep: after `transform_for_pre_decomposition` and on the
   program `run_decompositions({})` leaves (batch_norm already decomposed);
3. `node.meta["custom"]` (where quantizers record annotations) carried through texir's IR.

Each check records what a partitioner sees on both sides with the same recording partitioner."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch import nn

from tests.zoo import zoo_model
from texir.executorch import executorch_partitioner, to_edge_exported_program
from texir.adapters.fx_export import to_exported_program
from texir.adapters.fx_import import CustomMetaError, from_exported_program
from texir.adapters.local_decompose import decompose_locally
from texir.orchestrate import lower

pytest.importorskip("executorch.exir")

from executorch.exir import to_edge_transform_and_lower  # noqa: E402
from executorch.exir.backend.partitioner import Partitioner, PartitionResult  # noqa: E402


def _op_names(ep: torch.export.ExportedProgram) -> list[str]:
    def name(target: Any) -> str:
        return str(target._op if type(target).__name__ == "EdgeOpOverload" else target)

    return sorted({name(n.target) for n in ep.graph.nodes if n.op == "call_function"})


def _nodes(ep: torch.export.ExportedProgram) -> list[tuple[str, str, str]]:
    """Each operator node in order: name, operator, and its arguments as text."""
    def name(target: Any) -> str:
        return str(target._op if type(target).__name__ == "EdgeOpOverload" else target)

    return [(n.name, name(n.target), str((n.args, n.kwargs))) for n in ep.graph.nodes if n.op == "call_function"]


class _Recording(Partitioner):  # type: ignore[misc]  # ExecuTorch's Partitioner is untyped
    """Tags nothing; records what it is shown. `keep` is returned from ops_to_not_decompose."""

    def __init__(self, keep: tuple[Any, ...] = (), rewrite: tuple[Any, Any] | None = None, inner: Any = None) -> None:
        super().__init__()
        self.keep = list(keep)
        self.rewrite = rewrite
        self.inner = inner
        self.seen: dict[str, Any] = {}

    def ops_to_not_decompose(self, ep: torch.export.ExportedProgram) -> tuple[list[Any], Any]:
        # the first question only (ExecuTorch asks again at the end, on the lowered program)
        self.seen.setdefault("asked_ops", _op_names(ep))
        self.seen.setdefault("asked_dialect", ep.dialect)
        if self.inner is not None:
            return self.inner.ops_to_not_decompose(ep)  # type: ignore[no-any-return]  # ExecuTorch's API
        return self.keep, None

    def transform_for_pre_decomposition(self, ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
        self.seen["pre_decomposition_calls"] = self.seen.get("pre_decomposition_calls", 0) + 1
        if self.rewrite is not None:
            old, new = self.rewrite
            for node in ep.graph.nodes:
                if node.op == "call_function" and node.target is old:
                    node.target = new
            ep.graph_module.recompile()
        return ep

    def partition(self, ep: torch.export.ExportedProgram) -> PartitionResult:
        self.seen["dialect"] = ep.dialect
        ep.validate()  # as Arm's TOSA partitioner does
        self.seen["validated"] = True
        self.seen["ops"] = _op_names(ep)
        self.seen["nodes"] = _nodes(ep)
        self.seen["custom"] = _customs(ep)
        if self.inner is not None:
            return self.inner.partition(ep)
        return PartitionResult(tagged_exported_program=ep, partition_tags={})


def _export(name: str) -> torch.export.ExportedProgram:
    module, args = zoo_model(name).build()
    return torch.export.export(module, args, strict=False)


def _both(make: Any, inner: Any = None, **kw: Any) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
    ours = _Recording(inner=inner() if inner else None, **kw)
    theirs = _Recording(inner=inner() if inner else None, **kw)
    program = lower(make(), [executorch_partitioner(ours)], cache=None).program
    manager = to_edge_transform_and_lower(make(), partitioner=[theirs])
    return ours.seen, theirs.seen, program, manager


# --- 1. dialect and verifier ----------------------------------------------------------------------


def test_partitioners_see_the_edge_dialect_and_it_validates() -> None:
    """A kept non-core op (linear, XNNPACK keeps it) must be in the verifier's preserve_ops or
    validate() fails."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    ours, theirs, _, _ = _both(lambda: _export("mlp"), inner=XnnpackPartitioner)
    assert theirs["dialect"] == "EDGE" and theirs["validated"]
    assert ours["dialect"] == theirs["dialect"]
    assert ours.get("validated")
    assert "aten.linear.default" in ours["ops"] and ours["ops"] == theirs["ops"]
    assert ours["asked_dialect"] == theirs["asked_dialect"] == "ATEN"  # asked on the ATen program


def test_backends_are_given_the_edge_dialect() -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    edge = lower(_export("conv_bn"), [executorch_partitioner(XnnpackPartitioner())], cache=None).edge
    ep = to_edge_exported_program(edge)
    assert ep.dialect == "EDGE"
    ep.validate()


class _SymBuffer(nn.Module):
    """An int64 buffer grown by a dynamic size, as transformers' static cache counts its length
    (`cumulative_length.add_(kv_length)`): add.Tensor(buffer, SymInt) after functionalization."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(x.shape[0])
        return x * 2.0 + self.seen


def _sym_buffer() -> torch.export.ExportedProgram:
    n = torch.export.Dim("n", min=2, max=8)
    return torch.export.export(_SymBuffer(), (torch.randn(3, 4),), dynamic_shapes=({0: n},), strict=False)


def test_a_symint_in_a_tensor_position_is_a_tensor_in_the_edge_program() -> None:
    """ExecuTorch's to_edge makes the SymInt an int32 scalar_tensor (SymToTensorPass) cast to int64
    (RemoveMixedTypeOperators) before partitioners see the program; its edge verifier rejects the
    add.Tensor otherwise. The lowered program runs as eager, the buffer counting across calls."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import load_method
    from texir.emit import emit
    from texir.serialize.pte import dumps

    ours, theirs, program, _ = _both(_sym_buffer, inner=XnnpackPartitioner)
    assert theirs["validated"] and ours.get("validated")
    assert "aten.scalar_tensor.default" in theirs["ops"]
    assert ours["nodes"] == theirs["nodes"]
    assert program.lowered_modules  # x * 2.0 went to XNNPACK
    method, eager = load_method(dumps(emit(program))), _SymBuffer()
    for rows in (3, 5, 2):
        x = torch.randn(rows, 4)
        (got,) = method.execute([x])
        torch.testing.assert_close(got, eager(x))


# --- 2. when partitioners are asked ---------------------------------------------------------------


def test_ops_to_not_decompose_sees_the_functional_program() -> None:
    """ExecuTorch asks after run_decompositions({}): batch_norm is already
    _native_batch_norm_legit_no_training + getitem."""
    ours, theirs, _, _ = _both(lambda: _export("conv_bn"))
    assert "aten._native_batch_norm_legit_no_training.default" in theirs["asked_ops"]
    assert "aten.batch_norm.default" not in theirs["asked_ops"]
    assert ours["asked_ops"] == theirs["asked_ops"]


def test_keeping_an_op_functional_decomposition_removes_keeps_nothing() -> None:
    """A partitioner asking to keep batch_norm gets the program ExecuTorch gives (batch_norm is gone
    before it is asked), not a program that still holds batch_norm (and no KeptOpNotDelegatedError)."""
    keep = (torch.ops.aten.batch_norm.default,)
    ours, theirs, program, manager = _both(lambda: _export("conv_bn"), keep=keep)
    assert ours["ops"] == theirs["ops"]
    assert "batch_norm.default" not in str(ours["ops"])


def test_transform_for_pre_decomposition_runs_before_decomposition() -> None:
    rewrite = (torch.ops.aten.relu.default, torch.ops.aten.sigmoid.default)
    ours, theirs, _, _ = _both(lambda: _export("conv_bn"), rewrite=rewrite)
    assert theirs["pre_decomposition_calls"] == 1
    assert ours.get("pre_decomposition_calls") == 1
    assert "aten.sigmoid.default" in str(theirs["asked_ops"]) and "aten.relu.default" not in str(theirs["asked_ops"])
    assert ours["asked_ops"] == theirs["asked_ops"]
    assert ours["ops"] == theirs["ops"]


def test_local_functional_decomposition_equals_run_decompositions() -> None:
    """texir's run_decompositions({}) without the retrace gives torch's program (the IR compared)."""
    for name in ("conv_bn", "convnet", "resnet_tiny", "mlp", "norms"):
        ep = _export(name)
        local = decompose_locally(ep, functional_only=True)
        assert local is not None, name
        assert from_exported_program(local) == from_exported_program(_export(name).run_decompositions({})), name


# --- 3. node.meta["custom"] ----------------------------------------------------------------------


class _Annotated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


_NOTES = {
    "linear": {"_arm_annotation_info": {"quantized": True}, "stage": 1},
    "batch_norm": {"tags": ["a", "b"], "scale": 0.5},
    "relu": {"note": None},
}
"""What a quantizer writes in meta["custom"] (Arm's key among them), by node name."""


def _annotated() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    ep = torch.export.export(_Annotated().eval(), (torch.rand(3, 4),), strict=False)
    for node in ep.graph.nodes:
        if node.name in _NOTES:
            node.meta["custom"] = json.loads(json.dumps(_NOTES[node.name]))
    return ep


def _customs(ep: torch.export.ExportedProgram) -> dict[str, Any]:
    """meta["custom"] by node, without the markers torch's retrace adds depending on process history."""
    found = {}
    for n in ep.graph.nodes:
        notes = {k: v for k, v in n.meta.get("custom", {}).items() if not k.startswith("_torchdynamo_disable")}
        if notes:
            found[n.name] = notes
    return found


def test_custom_meta_round_trips_through_the_ir() -> None:
    ep = _annotated()
    expected = _customs(ep)
    assert len(expected) >= 3  # linear, batch_norm, relu
    program = from_exported_program(ep)
    back = to_exported_program(program)
    assert _customs(back) == expected
    assert from_exported_program(back) == program


def test_custom_meta_follows_decomposition_as_torch_does() -> None:
    retraced = from_exported_program(_annotated().run_decompositions({}))
    texir = from_exported_program(decompose_locally(_annotated(), functional_only=True))  # type: ignore[arg-type]  # not None: checked by equality
    assert texir == retraced
    decomposed = to_exported_program(from_exported_program(_annotated(), decompose=True))
    reference = _annotated().run_decompositions()
    assert _customs(decomposed) == _customs(reference) and _customs(decomposed)


def test_custom_meta_reaches_partitioners_as_in_executorch() -> None:
    ours, theirs, _, _ = _both(_annotated)
    assert theirs["custom"] and ours["custom"] == theirs["custom"]


def test_custom_meta_that_is_not_json_is_a_typed_error_naming_the_node() -> None:
    ep = _annotated()
    node = next(n for n in ep.graph.nodes if n.op == "call_function")
    node.meta["custom"] = {"bad": object()}
    with pytest.raises(CustomMetaError, match=node.name):
        from_exported_program(ep)


def test_custom_meta_is_json_text_in_the_ir() -> None:
    program = from_exported_program(_annotated())
    texts = {loc.custom for loc in program.graph.provenance.locations if loc.custom}  # type: ignore[union-attr]  # the graph has provenance
    assert texts and all(isinstance(json.loads(t), dict) for t in texts)


class _ScalarOperands(nn.Module):
    """Scalars in Tensor positions (`add.Tensor(x, 2)`), beside a buffer of the model's own."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offset", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 2) * 0.5 + self.offset


def test_scalar_operands_are_lifted_as_persistent_buffers_as_executorchs_to_edge_lifts_them() -> None:
    """ExecuTorch's lift_constant_tensor_pass makes each scalar ScalarToTensorPass turned into a
    tensor a persistent BUFFER `_lifted_tensor_constant<n>` (numbered on from the buffers); ExecuTorch's
    own tools count on it (`LoweredBackendModule.program()` drops only parameters and buffers)."""
    from executorch.exir import to_edge

    import texir.compat
    from texir.ir import BufferInput

    def specs(ep: torch.export.ExportedProgram) -> list[tuple[str, str, str | None, bool | None]]:
        return [(s.kind.name, s.arg.name, s.target, s.persistent) for s in ep.graph_signature.input_specs]

    inputs = (torch.randn(3),)
    theirs = specs(to_edge(torch.export.export(_ScalarOperands(), inputs, strict=True)).exported_program())
    edge = texir.compat.to_edge(torch.export.export(_ScalarOperands(), inputs, strict=True))
    assert specs(edge.exported_program()) == theirs
    assert [k for k, name, _, _ in theirs if name.startswith("_lifted_tensor_constant")] == ["BUFFER", "BUFFER"]
    lifted = [s for s in edge.program().signature.inputs if isinstance(s, BufferInput) and s.target != "offset"]
    assert lifted == [BufferInput(name=f"_lifted_tensor_constant{i}", target=f"_lifted_tensor_constant{i}") for i in (1, 2)]
    assert edge.to_executorch().buffer == to_edge(torch.export.export(_ScalarOperands(), inputs, strict=True)).to_executorch().buffer
