"""Bad input to the ExecuTorch bridge and to named data: each a typed texir error naming the
partitioner, backend, node or key, and how to fix it. Plus named data's round trip through the
emitter, the codec (alignment) and ExecuTorch's own deserializer."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
import torch
from torch import nn

from tests.lowering_helpers import export_program
from texir.adapters import to_exported_program
from texir.executorch import ExecutorchUnavailableError, executorch_partitioner
from texir.emit import EmitError, emit
from texir.ir import CallFunction, CompileSpec, Program, verify
from texir.lowering import (
    BackendPreprocessError,
    KeptOpNotDelegatedError,
    OpSupportPartitioner,
    PartitionerError,
    PreprocessResult,
    named_data_entry,
    register_backend,
    to_backend,
)
from texir.orchestrate import lower
from texir.executorch.partitioner import PartitionerModifiedGraphError
from texir.lowering.errors import TaggedPlaceholderError, UnknownNodeError
from texir.lowering.plan import DelegationSpec, PartitionPlan
from texir.serialize import snapshot
from texir.serialize.pte.codec import dumps


class _LinearReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)).tanh()).relu()


def _ep() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(_LinearReLU().eval(), (torch.rand(2, 4),), strict=False)


# ------------------------------------------------------------------------------------------------
# ExecuTorch partitioners and backends that misbehave


def _et_partitioner(tagger: Any, backend_id: str = "XnnpackBackend") -> Any:
    from executorch.exir.backend.partitioner import DelegationSpec as EtSpec
    from executorch.exir.backend.partitioner import Partitioner, PartitionResult

    class Tagging(Partitioner):
        def __init__(self) -> None:
            super().__init__()
            self.texir_test_spec = EtSpec(backend_id, [])

        def partition(self, ep: torch.export.ExportedProgram) -> PartitionResult:
            tags = tagger(ep.graph_module.graph)
            return PartitionResult(tagged_exported_program=ep, partition_tags={t: self.texir_test_spec for t in tags})

    return Tagging()


def _tag_relus(graph: torch.fx.Graph) -> list[str]:
    tags = []
    for node in graph.nodes:
        if node.op == "call_function" and "relu" in str(node.target):
            node.meta["delegation_tag"] = f"tag{len(tags)}"
            tags.append(node.meta["delegation_tag"])
    return tags


def test_raising_partitioner_is_a_partitioner_error_naming_it() -> None:
    def boom(graph: torch.fx.Graph) -> list[str]:
        raise ValueError("cannot partition today")

    with pytest.raises(PartitionerError, match=r"ExecuTorch partitioner Tagging raised ValueError: cannot partition today"):
        lower(_ep(), [executorch_partitioner(_et_partitioner(boom))])


def test_partitioner_tagging_the_output_is_refused_naming_the_node() -> None:
    def tag_output(graph: torch.fx.Graph) -> list[str]:
        tags = _tag_relus(graph)
        graph.output_node().meta["delegation_tag"] = "tag0"
        return tags

    with pytest.raises(TaggedPlaceholderError, match=r"Tagging tagged the output node 'output' with 'tag0'.*only operator nodes"):
        lower(_ep(), [executorch_partitioner(_et_partitioner(tag_output))])


def test_partitioner_tagging_a_user_input_is_refused_as_executorch_refuses_it() -> None:
    def tag_input(graph: torch.fx.Graph) -> list[str]:
        tags = _tag_relus(graph)
        next(n for n in graph.nodes if n.op == "placeholder" and n.name == "x").meta["delegation_tag"] = "tag0"
        return tags

    with pytest.raises(TaggedPlaceholderError, match=r"tagged placeholder 'x' \(a user input\) with 'tag0'") as caught:
        lower(_ep(), [executorch_partitioner(_et_partitioner(tag_input))])
    assert isinstance(caught.value, RuntimeError)  # ExecuTorch's to_backend raises a RuntimeError for it
    assert "placeholder node for non-params, non-buffer, and non-tensor constants should not be tagged" in str(caught.value)


def test_no_copy_mark_reaches_the_plan() -> None:
    """ExecuTorch's node.meta["no_copy"] on a tagged weight: the plan forbids copying it."""

    def tag_first_linear(graph: torch.fx.Graph) -> list[str]:
        for node in graph.nodes:
            if node.op == "placeholder" and node.name in ("p_a_weight", "p_a_bias"):
                node.meta["delegation_tag"] = "tag0"
                node.meta["no_copy"] = True
            if node.op == "call_function" and "addmm" in node.name and "a" in str(node.args):
                node.meta["delegation_tag"] = "tag0"
                break
        return ["tag0"]

    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend  # noqa: F401  (registers the id)

    partitioner = executorch_partitioner(_et_partitioner(tag_first_linear))
    plan = partitioner(lower(_ep(), []).edge)
    assert plan.no_copy == ("p_a_bias", "p_a_weight")


def test_partitioner_naming_an_unknown_backend_is_refused_naming_it() -> None:
    partitioner = executorch_partitioner(_et_partitioner(_tag_relus, backend_id="NoSuchBackend"))
    with pytest.raises(PartitionerError, match=r"partition 'tag0' names backend 'NoSuchBackend'.*import the module"):
        lower(_ep(), [partitioner])


def test_partitioner_tag_missing_from_partition_tags_is_refused() -> None:
    def stray(graph: torch.fx.Graph) -> list[str]:
        _tag_relus(graph)
        return []

    with pytest.raises(PartitionerError, match=r"tagged node 'aten_relu_default' with 'tag0', which is not in its partition_tags"):
        lower(_ep(), [executorch_partitioner(_et_partitioner(stray))])


def test_partitioner_adding_nodes_is_refused() -> None:
    def grow(graph: torch.fx.Graph) -> list[str]:
        x = next(n for n in graph.nodes if n.op == "placeholder" and n.name == "x")
        with graph.inserting_after(x):
            extra = graph.call_function(torch.ops.aten.relu.default, (x,))
        extra.meta["delegation_tag"] = "tag0"
        return ["tag0"]

    with pytest.raises(PartitionerModifiedGraphError, match=r"changed the number of nodes \(\d+ -> \d+\)") as caught:
        lower(_ep(), [executorch_partitioner(_et_partitioner(grow))])
    assert isinstance(caught.value, AssertionError)  # what ExecuTorch's to_backend raises for it


def test_partitioner_changing_a_node_is_refused_naming_it() -> None:
    """ExecuTorch asserts that a partitioner only tags; texir would drop the change silently (it
    reads tags only), so it refuses too, naming the node and both targets."""

    def retarget(graph: torch.fx.Graph) -> list[str]:
        relu = next(n for n in graph.nodes if n.op == "call_function" and "relu" in n.name)
        relu.target = torch.ops.aten.sigmoid.default
        return []

    with pytest.raises(
        PartitionerModifiedGraphError, match=r"changed node '\w*relu\w*' \(now call_function '\w+' of aten::sigmoid"
    ):
        lower(_ep(), [executorch_partitioner(_et_partitioner(retarget))])


def test_not_a_partitioner_is_refused() -> None:
    with pytest.raises(PartitionerError, match=r"int is not an ExecuTorch partitioner"):
        executorch_partitioner(42)


def test_raising_executorch_backend_is_a_preprocess_error_naming_backend_and_partition() -> None:
    from executorch.exir.backend.backend_details import BackendDetails

    class TexirTestRaisingBackend(BackendDetails):
        @staticmethod
        def preprocess(edge_program: Any, compile_specs: Any) -> Any:
            raise RuntimeError("no kernels for you")

    partitioner = executorch_partitioner(_et_partitioner(_tag_relus, backend_id="TexirTestRaisingBackend"))
    with pytest.raises(BackendPreprocessError,
                       match=r"backend 'TexirTestRaisingBackend' preprocess failed for partition 'tag0': RuntimeError: no kernels"):
        lower(_ep(), [partitioner])


def test_executorch_backend_sees_edge_ops_and_its_blob_lands_in_the_pte() -> None:
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult as EtResult

    seen: list[str] = []

    class TexirTestEchoBackend(BackendDetails):
        @staticmethod
        def preprocess(edge_program: Any, compile_specs: Any) -> Any:
            seen.extend(str(n.target) for n in edge_program.graph.nodes if n.op == "call_function")
            return EtResult(processed_bytes=b"echo:" + bytes(compile_specs[0].value) if compile_specs else b"echo")

    program = lower(_ep(), [executorch_partitioner(_et_partitioner(_tag_relus, backend_id="TexirTestEchoBackend"))]).program
    verify(program)
    assert seen and all("edge" in t or "EdgeOpOverload" in t or "relu" in t for t in seen)
    assert [m.module.backend_id for m in program.lowered_modules] == ["TexirTestEchoBackend"] * len(program.lowered_modules)
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(dumps(emit(program))).program
    blobs = {bytes(d.data) for d in pte.backend_delegate_data}
    assert blobs == {b"echo"}


def test_missing_executorch_extra_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_executorch(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "executorch" or name.startswith("executorch."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_executorch)
    import importlib

    real_import_module = importlib.import_module

    def no_executorch_module(name: str, package: str | None = None) -> Any:
        if name.startswith("executorch"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import_module(name, package)

    monkeypatch.setattr(importlib, "import_module", no_executorch_module)
    with pytest.raises(ExecutorchUnavailableError, match=r"executorch_partitioner needs ExecuTorch.*pip install 'texir\[executorch\]'"):
        executorch_partitioner(object())


# ------------------------------------------------------------------------------------------------
# lower() on its own


class _KeepLinear:
    """Asks to keep linear whole but delegates only relu: the kept linear is left undelegated."""

    def ops_to_not_decompose(self, program: Program) -> tuple[str, ...]:
        return ("aten::linear.default",)

    def __call__(self, program: Program) -> PartitionPlan:
        return OpSupportPartitioner("texir-test", {"aten::relu.default"})(program)


def test_kept_op_left_undelegated_is_an_error_naming_the_node() -> None:
    import tests.lowering_helpers  # noqa: F401  # registers texir-test

    with pytest.raises(KeptOpNotDelegatedError, match=r"node 'aten_linear_default'.*aten::linear.default was kept.*_KeepLinear"):
        lower(_ep(), [_KeepLinear()])


class _SeesOps:
    """Records the ops `lower` shows it when asking what to keep; keeps hardtanh, delegates it."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def ops_to_not_decompose(self, program: Program) -> tuple[str, ...]:
        self.seen |= {n.target for n in program.graph.nodes if isinstance(n, CallFunction)}
        return ("aten::hardtanh.default",)

    def __call__(self, program: Program) -> PartitionPlan:
        return OpSupportPartitioner("texir-test", {"aten::hardtanh.default"})(program)


def test_partitioners_are_asked_about_the_functional_program_without_a_retrace() -> None:
    import tests.lowering_helpers  # noqa: F401  # registers texir-test
    from texir.adapters.decompositions import functional_names

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU6(inplace=True)).eval()
    ep = torch.export.export(model, (torch.rand(2, 4),), strict=False)
    assert functional_names(ep) == {"aten::hardtanh_.default": "aten::hardtanh.default"}
    partitioner = _SeesOps()
    lowered = lower(ep, [partitioner]).program
    assert "aten::hardtanh.default" in partitioner.seen
    assert not any(t.split("::")[-1].split(".")[0].endswith("_") for t in partitioner.seen), partitioner.seen
    (module,) = lowered.lowered_modules
    kept = [n.target for n in module.module.original_program.graph.nodes if isinstance(n, CallFunction)]
    assert kept == ["aten::hardtanh.default"]  # kept whole (not decomposed to clamp) and delegated
    x = torch.rand(2, 4) * 10
    assert torch.allclose(to_exported_program(lowered).module()(x), model(x))


def test_lower_takes_a_program_and_a_mapping_of_methods() -> None:
    import tests.lowering_helpers  # noqa: F401  # registers texir-test

    ep = _ep()
    relu = OpSupportPartitioner("texir-test", {"aten::relu.default"})
    from_ep = lower(ep, [relu]).program
    from texir.adapters import from_exported_program

    from_program = lower(from_exported_program(ep), [relu]).program
    assert len(from_ep.lowered_modules) == len(from_program.lowered_modules) == 2
    both = lower({"forward": ep, "other": ep}, {"forward": [relu]})
    assert len(both["forward"].program.lowered_modules) == 2 and both["other"].program.lowered_modules == ()
    with pytest.raises(PartitionerError, match=r"partitioners given for methods \['nope'\]"):
        lower({"forward": ep}, {"nope": [relu]})
    with pytest.raises(PartitionerError, match=r"not str"):
        lower("model.pt", [relu])  # type: ignore[call-overload]  # the wrong type is the point


# ------------------------------------------------------------------------------------------------
# Named data: plans, snapshots, emitter, codec


class _NamedDataBackend:
    """Stores the partition's op list as named data under a fixed or per-partition key."""

    def __init__(self, key: str | None, alignment: int = 1) -> None:
        self.key, self.alignment = key, alignment

    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec], /) -> PreprocessResult:
        ops = ",".join(n.name for n in program.graph.nodes if isinstance(n, CallFunction)).encode()
        own = named_data_entry(self.key or f"ops:{ops.decode()}", ops, alignment=self.alignment)
        if self.key is not None:
            return PreprocessResult(processed_bytes=b"blob:" + ops, named_data=(own,))
        shared = named_data_entry("shared", b"the same for every partition", alignment=self.alignment)
        return PreprocessResult(processed_bytes=b"blob:" + ops, named_data=(own, shared))


def _two_relu_partitions(backend_id: str) -> Program:
    return to_backend(export_program(_LinearReLU().eval(), (torch.rand(2, 4),)),
                      OpSupportPartitioner(backend_id, {"aten::relu.default", "aten::linear.default"}))


def test_conflicting_named_data_key_is_an_emit_error_naming_both_delegates() -> None:
    register_backend("texir-named-fixed", _NamedDataBackend("weights"), replace=True)
    program = _two_relu_partitions("texir-named-fixed")
    assert len(program.lowered_modules) == 2
    payloads = {bytes(m.module.named_data[0].data.view()) for m in program.lowered_modules}  # type: ignore[union-attr]  # payloads kept
    assert len(payloads) == 2, "the case needs two different payloads under one key"
    with pytest.raises(EmitError, match=r"named data key 'weights' has two payloads: .* from delegate 'lowered_module_\d' \(texir-named-fixed\).* from delegate 'lowered_module_\d'"):
        emit(program)


def test_same_named_data_is_written_once_aligned_and_read_by_executorch() -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    register_backend("texir-named-own", _NamedDataBackend(None, alignment=48), replace=True)
    program = _two_relu_partitions("texir-named-own")
    data = dumps(emit(program))
    pte = deserialize_pte_binary(data)
    assert pte.named_data is not None
    stored = {k: bytes(pte.named_data.buffers[e.buffer_index]) for k, e in pte.named_data.pte_data.items()}
    expected = {e.key: e.data.tobytes() for m in program.lowered_modules for e in m.module.named_data if e.data}
    assert len(program.lowered_modules) == 2 and len(expected) == 3  # two own entries, one shared
    assert stored == expected
    assert len(pte.named_data.buffers) == 3
    # Each named segment starts at a multiple of lcm(128, 48) = 384 from the segment base.
    from texir.serialize.pte.codec import read_pte

    raw = read_pte(data).program
    assert raw.named_data
    for nd in raw.named_data:
        offset = raw.segments[nd.segment_index].offset
        assert offset % 384 == 0, (nd.key, offset)


def test_snapshot_hashes_named_data_unless_asked_for_data() -> None:
    register_backend("texir-named-snap", _NamedDataBackend("w"), replace=True)
    program = to_backend(export_program(_LinearReLU().eval(), (torch.rand(2, 4),)),
                         OpSupportPartitioner("texir-named-snap", {"aten::tanh.default"}))
    entry = program.lowered_modules[0].module.named_data[0]
    assert entry.data is not None
    slim = snapshot.loads(snapshot.dumps(program))
    full = snapshot.loads(snapshot.dumps(program, include_data=True))
    slim_entry = slim.lowered_modules[0].module.named_data[0]
    assert slim_entry.data is None and (slim_entry.sha256, slim_entry.nbytes) == (entry.sha256, entry.nbytes)
    assert full.lowered_modules[0].module.named_data == (entry,)
    import msgspec

    module = program.lowered_modules[0]
    hollow = msgspec.structs.replace(module.module, named_data=(msgspec.structs.replace(entry, data=None),))
    broken = msgspec.structs.replace(program, lowered_modules=(msgspec.structs.replace(module, module=hollow),))
    with pytest.raises(EmitError, match=r"named data 'w' has no payload.*include_data=True"):
        emit(broken)


def test_duplicate_named_data_key_in_one_result_is_refused() -> None:
    class Twice:
        def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec], /) -> PreprocessResult:
            return PreprocessResult(processed_bytes=b"x", named_data=(named_data_entry("k", b"1"), named_data_entry("k", b"2")))

    register_backend("texir-named-twice", Twice(), replace=True)
    with pytest.raises(BackendPreprocessError, match=r"named data key 'k' twice for partition 'tag0'"):
        _two_relu_partitions("texir-named-twice")


def test_named_data_whose_sha256_is_not_a_digest_is_refused() -> None:
    """The IR names every payload by its SHA-256 (the text form prints and parses it as one); a
    backend that puts its key there (texir's native XNNPACK did, for `scale_<sha256>`) is stopped at
    the backend boundary, naming the entry."""

    class KeyAsDigest:
        def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec], /) -> PreprocessResult:
            entry = named_data_entry("scale_" + "ab" * 32, b"1234")
            return PreprocessResult(processed_bytes=b"x", named_data=(msgspec.structs.replace(entry, sha256=entry.key),))

    register_backend("texir-named-key-as-digest", KeyAsDigest(), replace=True)
    with pytest.raises(BackendPreprocessError, match=r"named data 'scale_abab.*' for partition 'tag0' with "
                       r"sha256='scale_abab.*', not a SHA-256 in lowercase hex; set it to the payload's digest"):
        _two_relu_partitions("texir-named-key-as-digest")


def test_backend_note_on_an_untagged_node_is_refused() -> None:
    from texir.ir import BackendNodeMeta
    from texir.lowering.plan import validate_plan

    program = export_program(_LinearReLU().eval(), (torch.rand(2, 4),))
    plan = PartitionPlan.build({"relu": "tag0"}, [("tag0", DelegationSpec(backend_id="texir-test"))],
                               backend_meta=[BackendNodeMeta(node="tanh", key="k", value="1")])
    with pytest.raises(UnknownNodeError, match=r"tanh"):
        validate_plan(program, plan)


def test_tensor_subclass_weights_refused_by_plain_conversion_unwrapped_by_lower() -> None:
    from tests.real_models import QUANTIZED
    from texir.adapters import from_exported_program
    from texir.errors import UnsupportedError

    module, args = next(m for m in QUANTIZED if m.name == "q_mlp_8da4w").build()
    ep = torch.export.export(module, args, strict=False)
    with pytest.raises(UnsupportedError, match=r"state entry '0.weight' is a tensor subclass \(IntxUnpackedToInt8Tensor.*run_decompositions"):
        from_exported_program(ep)
    import tests.lowering_helpers  # noqa: F401  # registers texir-test

    lowered = lower(ep, [OpSupportPartitioner("texir-test", {"aten::relu.default"})], cache=None).program
    verify(lowered)
    assert {e.value.meta.dtype for e in lowered.state} >= {"int8"}  # the int4 payloads, unwrapped
    torch.testing.assert_close(to_exported_program(lowered).module()(*args), module(*args))
