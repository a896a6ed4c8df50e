"""Plan validation and backend failures: each a typed error naming nodes, tag and backend id,
raised before any backend runs; goldens hold the program and the message."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest
import torch
from torch import nn

from tests.lowering_helpers import TEST_BACKEND, export_program
import texir.backends  # noqa: F401  (registers the demo and reference backends)
from texir.errors import LoweringError
from texir.ir import CompileSpec, Program, format_program
from texir.lowering.errors import MutationAlsoOutputError, NoCopyConstantError
from texir.lowering import (
    BackendPreprocessError,
    BackendRegistrationError,
    DelegateClaimedError,
    DelegationSpec,
    MissingDelegationSpecError,
    MutationOutsidePartitionError,
    NodeGroupPartitioner,
    NonConvexPartitionError,
    OpSupportPartitioner,
    PartitionerError,
    PartitionPlan,
    PreprocessResult,
    SharedConstantError,
    SubgraphAttrError,
    TaggedPlaceholderError,
    UnknownBackendError,
    UnknownNodeError,
    WholeProgramPartitioner,
    register_backend,
    to_backend,
)
from texir.serialize import snapshot
from texir.testing.golden import Golden

X = torch.randn(4)
Y = torch.randn(4)
SPEC = DelegationSpec(backend_id=TEST_BACKEND)


class AddMul(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sin((x + y) * y) + x


class Crossed(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a1 = x + 1.0
        b1 = y * 2.0
        a2 = b1 + 1.0
        b2 = a1 * 2.0
        return a2, b2


class LiftedConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = torch.tensor([1.0, 2.0, 3.0, 4.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x + self.c) * self.c


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x)
        return torch.sin(x) * self.count


class Cond(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x + 1.0, lambda x: x - 1.0, (x,)) * 2.0


class Recording:
    def __init__(self) -> None:
        self.calls = 0

    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        self.calls += 1
        return PreprocessResult(processed_bytes=b"rec")


def _expect(
    golden: Golden, name: str, program: Program, partitioner: object, error: type[LoweringError], match: str
) -> str:
    before = snapshot.dumps(program, format="msgpack", include_data=True)
    with pytest.raises(error, match=match) as info:
        to_backend(program, partitioner)  # type: ignore[call-overload]  # partitioners of every shape
    assert snapshot.dumps(program, format="msgpack", include_data=True) == before
    message = str(info.value)
    stable = re.sub(r"\(known: [^)]*\)", "(known: ...)", message)  # the registry depends on imports
    golden(f"lowering/error_{name}.txt", "# before\n" + format_program(program) + "# error\n" + stable + "\n")
    return message


def test_non_convex_partition_names_the_path(golden: Golden) -> None:
    program = export_program(AddMul(), (X, Y))
    message = _expect(
        golden,
        "non_convex",
        program,
        NodeGroupPartitioner(TEST_BACKEND, {"tagA": ["add", "add_1"]}),
        NonConvexPartitionError,
        "partition 'tagA' is not convex",
    )
    assert "add -> mul -> sin -> add_1" in message


def test_partitions_depending_on_each_other(golden: Golden) -> None:
    program = export_program(Crossed(), (X, Y))
    message = _expect(
        golden,
        "mutual_dependency",
        program,
        NodeGroupPartitioner(TEST_BACKEND, {"p": ["add", "add_1"], "q": ["mul", "mul_1"]}),
        NonConvexPartitionError,
        r"partitions \['p', 'q'\] depend on each other",
    )
    assert "add" in message and "mul" in message


def test_whole_program_over_a_delegate_is_not_convex(golden: Golden) -> None:
    program = to_backend(export_program(AddMul(), (X, Y)), OpSupportPartitioner(TEST_BACKEND, {"aten::mul.Tensor"}))
    _expect(
        golden,
        "whole_over_delegate",
        program,
        WholeProgramPartitioner(TEST_BACKEND),
        NonConvexPartitionError,
        "executorch_call_delegate",
    )


def test_tagged_user_input(golden: Golden) -> None:
    program = export_program(AddMul(), (X, Y))
    _expect(
        golden,
        "tagged_user_input",
        program,
        NodeGroupPartitioner(TEST_BACKEND, {"t": ["x", "add"]}),
        TaggedPlaceholderError,
        "placeholder 'x' is tagged 't' but is a user input",
    )


def test_tagged_output(golden: Golden) -> None:
    program = export_program(AddMul(), (X, Y))
    _expect(
        golden,
        "tagged_output",
        program,
        NodeGroupPartitioner(TEST_BACKEND, {"t": ["output"]}),
        TaggedPlaceholderError,
        "output node 'output' is tagged 't'",
    )


def test_tag_without_spec(golden: Golden) -> None:
    program = export_program(AddMul(), (X, Y))
    _expect(
        golden,
        "tag_without_spec",
        program,
        lambda p: PartitionPlan.build({"add": "orphan"}, {}),
        MissingDelegationSpecError,
        "tag 'orphan' \\(node 'add'\\) has no DelegationSpec",
    )


def test_lowered_call_claimed_again(golden: Golden) -> None:
    program = to_backend(export_program(AddMul(), (X, Y)), OpSupportPartitioner(TEST_BACKEND, {"aten::mul.Tensor"}))
    _expect(
        golden,
        "claimed_again",
        program,
        NodeGroupPartitioner(TEST_BACKEND, {"again": ["executorch_call_delegate"]}),
        DelegateClaimedError,
        "node 'executorch_call_delegate' belongs to an already lowered delegate call",
    )


def test_shared_constant_tagged_for_two_partitions(golden: Golden) -> None:
    program = export_program(LiftedConstant(), (X,))
    const = next(s.name for s in program.signature.inputs if type(s).__name__ == "ConstantTensorInput")
    plan = PartitionPlan.build(
        {const: "a", "add": "a", "mul": "b"}, {"a": SPEC, "b": SPEC}, shared_constants="error"
    )
    message = _expect(
        golden,
        "shared_constant", program, lambda p: plan, SharedConstantError, f"'{const}' is tagged 'a'"
    )
    assert "also used by 'mul' (tag 'b')" in message


def test_consumed_buffer_mutated_outside_partition(golden: Golden) -> None:
    program = export_program(Counter(), (X,))
    plan = PartitionPlan.build({"b_count": "t", "mul": "t"}, {"t": SPEC})
    _expect(
        golden,
        "mutation_outside",
        program,
        lambda p: plan,
        MutationOutsidePartitionError,
        "buffer 'b_count' \\(count\\) is tagged 't' but its mutation 'add' is not delegated",
    )


def test_unknown_node(golden: Golden) -> None:
    program = export_program(AddMul(), (X, Y))
    _expect(
        golden,
        "unknown_node",
        program,
        NodeGroupPartitioner(TEST_BACKEND, {"t": ["add", "nope"]}),
        UnknownNodeError,
        r"\['nope'\] \(tag 't'\)",
    )


def test_subgraph_get_attr_tagged_apart_from_cond(golden: Golden) -> None:
    program = export_program(Cond(), (X,))
    _expect(
        golden,
        "subgraph_attr",
        program,
        NodeGroupPartitioner(TEST_BACKEND, {"t": ["cond"]}),
        SubgraphAttrError,
        "node 'cond' \\(tag 't'\\) uses nested graph get_attr 'true_graph_0'",
    )


def test_unknown_backend(golden: Golden) -> None:
    program = export_program(AddMul(), (X, Y))
    _expect(
        golden,
        "unknown_backend",
        program,
        OpSupportPartitioner("no-such-backend", {"aten::mul.Tensor"}),
        UnknownBackendError,
        "backend 'no-such-backend' \\(partition 'tag0'\\) is not registered",
    )


def test_raising_preprocess(golden: Golden) -> None:
    program = export_program(AddMul(), (X, Y))
    _expect(
        golden,
        "raising_preprocess",
        program,
        OpSupportPartitioner("texir-failing", {"aten::mul.Tensor"}),
        BackendPreprocessError,
        "backend 'texir-failing' preprocess failed for partition 'tag0': RuntimeError: this backend always fails",
    )


def test_validation_runs_before_any_backend() -> None:
    recording = Recording()
    register_backend("texir-recording", recording, replace=True)
    program = export_program(AddMul(), (X, Y))
    spec = DelegationSpec(backend_id="texir-recording")
    plan = PartitionPlan.build({"mul": "ok", "add": "bad", "add_1": "bad"}, {"ok": spec, "bad": spec})
    with pytest.raises(NonConvexPartitionError):
        to_backend(program, lambda p: plan)
    assert recording.calls == 0
    to_backend(program, lambda p: PartitionPlan.build({"mul": "ok"}, {"ok": spec}))
    assert recording.calls == 1


def test_partitioner_options_are_validated() -> None:
    with pytest.raises(PartitionerError, match="backend_id"):
        WholeProgramPartitioner("")
    with pytest.raises(PartitionerError, match="canonical names"):
        OpSupportPartitioner(TEST_BACKEND, {"add"})
    with pytest.raises(PartitionerError, match="node 'add' is in groups 'a' and 'b'"):
        NodeGroupPartitioner(TEST_BACKEND, {"a": ["add"], "b": ["add"]})
    with pytest.raises(PartitionerError, match="returned dict"):
        to_backend(export_program(AddMul(), (X, Y)), lambda p: {})  # type: ignore[arg-type,return-value]  # deliberately wrong


def test_backend_returning_wrong_type() -> None:
    class Bad:
        def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
            return b"raw"  # type: ignore[return-value]  # deliberately wrong

    register_backend("texir-bad", Bad(), replace=True)
    with pytest.raises(BackendPreprocessError, match="backend 'texir-bad' preprocess returned bytes"):
        to_backend(export_program(AddMul(), (X, Y)), OpSupportPartitioner("texir-bad", {"aten::mul.Tensor"}))


def test_register_backend_misuse_is_a_registration_error() -> None:
    class Recording:
        def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
            return PreprocessResult(processed_bytes=b"")

    with pytest.raises(BackendRegistrationError, match="non-empty string"):
        register_backend("", Recording())
    with pytest.raises(BackendRegistrationError, match="an instance of Recording, not the class"):
        register_backend("texir-misuse", Recording)  # type: ignore[arg-type]  # the class, on purpose
    with pytest.raises(BackendRegistrationError, match="object has no preprocess"):
        register_backend("texir-misuse", object())  # type: ignore[arg-type]  # no preprocess, on purpose
    register_backend("texir-misuse", Recording(), replace=True)
    with pytest.raises(BackendRegistrationError, match="'texir-misuse' is already registered.*replace=True"):
        register_backend("texir-misuse", Recording())
    assert not issubclass(BackendRegistrationError, (UnknownBackendError, BackendPreprocessError))


def test_cond_and_its_branch_both_tagged(golden: Golden) -> None:
    program = export_program(Cond(), (X,))
    plan = PartitionPlan.build(
        {"cond": "t", "true_graph_0": "t", "false_graph_0": "t", "true_graph_0/add": "u"}, {"t": SPEC, "u": SPEC}
    )
    _expect(
        golden,
        "cond_and_branch_tagged",
        program,
        lambda p: plan,
        SubgraphAttrError,
        "get_attr 'true_graph_0' is tagged 't', but node 'true_graph_0/add' inside that nested graph is tagged 'u'",
    )


class MaxDim(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, _ = torch.max(x * 2.0, dim=1)
        return torch.sin(values)


def test_multi_output_node_split_from_its_getitem(golden: Golden) -> None:
    from texir.lowering import SplitMultiOutputError

    program = export_program(MaxDim(), (torch.randn(2, 4),))
    _expect(
        golden,
        "split_multi_output",
        program,
        NodeGroupPartitioner(TEST_BACKEND, {"t": ["mul", "max_1"]}),
        SplitMultiOutputError,
        "'max_1' returns several values and is tagged 't', but its result 'getitem' is tagged None",
    )


class CounterRead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        before = torch.sin(self.count)
        self.count.add_(x)
        return before * self.count


def test_consumed_mutated_buffer_read_outside(golden: Golden) -> None:
    program = export_program(CounterRead(), (X,))
    plan = PartitionPlan.build({"b_count": "t", "add": "t"}, {"t": SPEC})
    _expect(
        golden,
        "mutated_buffer_read_outside",
        program,
        lambda p: plan,
        MutationOutsidePartitionError,
        "buffer 'b_count' \\(count\\) is consumed and mutated by partition 't', but 'sin' outside it reads",
    )
    # The helper leaves such a buffer in the parent instead.
    tagged = OpSupportPartitioner(TEST_BACKEND, {"aten::add.Tensor"}, tag_mutated_buffers=True)(program)
    assert "b_count" not in tagged.tag_map()


def test_partitioner_and_predicate_exceptions_are_typed_and_keep_the_cause() -> None:
    """A partitioner function or support predicate that raises comes out as a PartitionerError
    naming the partitioner (and, for a predicate, the node), with the original as its cause."""
    from texir.testing.programs import chain_program

    program = chain_program()

    def broken(p: Program) -> PartitionPlan:
        raise KeyError("no such layer")

    with pytest.raises(PartitionerError, match=r"partitioner .*broken.* raised KeyError: 'no such layer'") as info:
        to_backend(program, broken)
    assert isinstance(info.value.__cause__, KeyError)

    def predicate(node: object, metas: object) -> bool:
        raise ZeroDivisionError("bad predicate")

    with pytest.raises(PartitionerError, match=r"OpSupportPartitioner.*predicate raised ZeroDivisionError on node '") as info2:
        to_backend(program, OpSupportPartitioner("texir-reference", predicate))
    assert isinstance(info2.value.__cause__, PartitionerError)
    assert isinstance(info2.value.__cause__.__cause__, ZeroDivisionError)


class CounterReturned(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.count.add_(x)


def test_consumed_buffer_update_also_returned_is_refused(golden: Golden) -> None:
    """ExecuTorch's to_backend refuses it (AssertionError): a delegate consuming a buffer returns its
    update as that update only, and backends are written for that signature. texir refuses it at
    lowering too, so that no file it writes holds a delegate no backend was built for."""
    program = export_program(CounterReturned(), (X,))
    plan = PartitionPlan.build({"b_count": "t", "add": "t"}, {"t": SPEC})
    message = _expect(
        golden,
        "mutation_also_output",
        program,
        lambda p: plan,
        MutationAlsoOutputError,
        "buffer 'b_count' \\(count\\) is tagged 't' .* its new value 'add' is also returned as a user output",
    )
    assert "leave the buffer untagged" in message
    with pytest.raises(AssertionError):  # what ExecuTorch's callers catch
        to_backend(program, lambda p: plan)
    # Leaving the buffer in the program (the delegate returns the new value) lowers.
    to_backend(program, lambda p: PartitionPlan.build({"add": "t"}, {"t": SPEC}))


def test_no_copy_constant_used_outside_its_partition_is_refused(golden: Golden) -> None:
    """A constant its partitioner marked no_copy (ExecuTorch's node.meta["no_copy"]) and used
    outside its partition is refused whatever `shared_constants` says (ExecuTorch: RuntimeError)."""
    program = export_program(LiftedConstant(), (X,))
    const = next(s.name for s in program.signature.inputs if type(s).__name__ == "ConstantTensorInput")
    tags = {const: "a", "add": "a"}
    plan = PartitionPlan.build(tags, {"a": SPEC}, no_copy=[const])
    message = _expect(
        golden, "no_copy_constant", program, lambda p: plan, NoCopyConstantError,
        f"constant data node \\({const}\\) is tagged with \\(a\\) but has user \\(mul\\) which has tag \\(None\\)",
    )
    assert "no_copy" in message
    with pytest.raises(RuntimeError):
        to_backend(program, lambda p: plan)
    to_backend(program, lambda p: PartitionPlan.build(tags, {"a": SPEC}))  # copies allowed: duplicated
