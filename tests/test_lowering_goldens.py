"""Lowering goldens, text in and text out, with no model export. Each tests/golden/lowering/<name>.txt
holds a program ("# before", written from a torch export by tests/test_lowering_scenarios.py or
tests/test_lowering_errors.py) and what lowering it with the partitioner below gives: the lowered
program ("# after") or the error's message ("# error"). Here the before text is parsed
(`texir.ir.parse_program`), lowered with texir's test backend, and compared with the after text as
IR structs (`texir diff`'s comparison; a parsed program has tensors by hash only, so the text says
"(no data)" where the export had bytes), or with the error text exactly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GOLDEN_DIR
from tests.lowering_backends import TEST_BACKEND
from texir.errors import LoweringError
from texir.ir import CompileSpec, ConstantTensorInput, Program, parse_program, verify
from texir.ir.parser import payloads_of
from texir.lowering.errors import MutationAlsoOutputError, NoCopyConstantError
from texir.lowering import (
    BackendPreprocessError,
    DelegateClaimedError,
    DelegationSpec,
    MissingDelegationSpecError,
    MutationOutsidePartitionError,
    NodeGroupPartitioner,
    NonConvexPartitionError,
    OpSupportPartitioner,
    PartitionPlan,
    SharedConstantError,
    SplitMultiOutputError,
    SubgraphAttrError,
    TaggedPlaceholderError,
    UnknownBackendError,
    UnknownNodeError,
    WholeProgramPartitioner,
    to_backend,
)
from texir.viz.diff import diff_programs, format_diff

T = TEST_BACKEND
ADD, MUL = "aten::add.Tensor", "aten::mul.Tensor"
ADD_MUL = {ADD, MUL}
SPEC = DelegationSpec(backend_id=T)
LOWERING = GOLDEN_DIR / "lowering"

# name -> the partitioner its scenario in tests/test_lowering_scenarios.py lowers with
LOWERED: dict[str, Any] = {
    "add_mul": OpSupportPartitioner(T, ADD_MUL),
    "buffer_mutation_consumed": WholeProgramPartitioner(T, tag_mutated_buffers=True),
    "buffer_mutation_not_consumed": OpSupportPartitioner(T, {ADD}),
    "buffers_consumed": OpSupportPartitioner(T, ADD_MUL, tag_constants=True),
    "buffers_not_consumed": OpSupportPartitioner(T, ADD_MUL),
    "compile_specs": OpSupportPartitioner(T, {MUL}, (CompileSpec(key="max_value", value=b"\x04"),)),
    "cond_branches": OpSupportPartitioner(T, ADD_MUL),
    "cond_whole": WholeProgramPartitioner(T),
    "conv_bn": OpSupportPartitioner(T, {"aten::convolution.default"}, tag_constants=True),
    "diamond": OpSupportPartitioner(T, ADD_MUL),
    "dynamic": OpSupportPartitioner(T, ADD_MUL),
    "lifted_constant_consumed": WholeProgramPartitioner(T, tag_constants=True),
    "lifted_constant_two_partitions": OpSupportPartitioner(T, ADD_MUL, tag_constants=True),
    "lifted_constant_two_partitions_pass_in": OpSupportPartitioner(
        T, ADD_MUL, tag_constants=True, shared_constants="pass_in"
    ),
    "lower_twice": OpSupportPartitioner(T, {ADD}),  # its input already has a mul delegate
    "map_body": OpSupportPartitioner(T, ADD_MUL),
    "max_dim": OpSupportPartitioner(T, {MUL, "aten::max.dim"}),
    "multi_output": OpSupportPartitioner(T, ADD_MUL),
    "node_groups": NodeGroupPartitioner(T, {"first": ["add", "mul"], "second": ["mul_2", "add_2"]}),
    "output_is_program_output": OpSupportPartitioner(T, ADD_MUL),
    "param_shared_with_parent": OpSupportPartitioner(T, {MUL}, tag_constants=True),
    "param_through_parent": OpSupportPartitioner(T, {MUL}, tag_constants=True),
    "params_consumed": OpSupportPartitioner(T, {"aten::addmm.default", "aten::permute.default"}, tag_constants=True),
    "passthrough": OpSupportPartitioner(T, {ADD}),
    "placeholder_order": WholeProgramPartitioner(T, tag_constants=True),
    "predicate": OpSupportPartitioner(T, lambda node, metas: node.target.startswith("aten::") and "sin" not in node.target),
    "reindex_consumed_mutation": OpSupportPartitioner(T, ADD_MUL, tag_mutated_buffers=True),
    "residual": OpSupportPartitioner(T, {ADD, MUL, "aten::relu.default"}),
    "several": OpSupportPartitioner(T, ADD_MUL),
    "user_input_mutation": WholeProgramPartitioner(T),
    "whole_mlp": WholeProgramPartitioner(T),
    "whole_mlp_tag_constants": WholeProgramPartitioner(T, tag_constants=True),
}


def _constant(program: Program) -> str:
    return next(s.name for s in program.signature.inputs if isinstance(s, ConstantTensorInput))


def _plan(tags: dict[str, str], specs: dict[str, DelegationSpec], **options: Any) -> Callable[[Program], PartitionPlan]:
    return lambda program: PartitionPlan.build(tags, specs, **options)


# error_<name> -> (partitioner, error) as in tests/test_lowering_errors.py
REFUSED: dict[str, tuple[Any, type[LoweringError]]] = {
    "claimed_again": (NodeGroupPartitioner(T, {"again": ["executorch_call_delegate"]}), DelegateClaimedError),
    "cond_and_branch_tagged": (
        _plan({"cond": "t", "true_graph_0": "t", "false_graph_0": "t", "true_graph_0/add": "u"}, {"t": SPEC, "u": SPEC}),
        SubgraphAttrError,
    ),
    "mutated_buffer_read_outside": (_plan({"b_count": "t", "add": "t"}, {"t": SPEC}), MutationOutsidePartitionError),
    "mutation_also_output": (_plan({"b_count": "t", "add": "t"}, {"t": SPEC}), MutationAlsoOutputError),
    "mutation_outside": (_plan({"b_count": "t", "mul": "t"}, {"t": SPEC}), MutationOutsidePartitionError),
    "mutual_dependency": (NodeGroupPartitioner(T, {"p": ["add", "add_1"], "q": ["mul", "mul_1"]}), NonConvexPartitionError),
    "non_convex": (NodeGroupPartitioner(T, {"tagA": ["add", "add_1"]}), NonConvexPartitionError),
    "no_copy_constant": (
        lambda p: PartitionPlan.build({_constant(p): "a", "add": "a"}, {"a": SPEC}, no_copy=[_constant(p)]),
        NoCopyConstantError,
    ),
    "raising_preprocess": (OpSupportPartitioner("texir-failing", {MUL}), BackendPreprocessError),
    "shared_constant": (
        lambda p: PartitionPlan.build(
            {_constant(p): "a", "add": "a", "mul": "b"}, {"a": SPEC, "b": SPEC}, shared_constants="error"
        ),
        SharedConstantError,
    ),
    "split_multi_output": (NodeGroupPartitioner(T, {"t": ["mul", "max_1"]}), SplitMultiOutputError),
    "subgraph_attr": (NodeGroupPartitioner(T, {"t": ["cond"]}), SubgraphAttrError),
    "tag_without_spec": (_plan({"add": "orphan"}, {}), MissingDelegationSpecError),
    "tagged_output": (NodeGroupPartitioner(T, {"t": ["output"]}), TaggedPlaceholderError),
    "tagged_user_input": (NodeGroupPartitioner(T, {"t": ["x", "add"]}), TaggedPlaceholderError),
    "unknown_backend": (OpSupportPartitioner("no-such-backend", {MUL}), UnknownBackendError),
    "unknown_node": (NodeGroupPartitioner(T, {"t": ["add", "nope"]}), UnknownNodeError),
    "whole_over_delegate": (WholeProgramPartitioner(T), NonConvexPartitionError),
}


def _blob(sha: str, nbytes: int) -> bytes:
    """A delegate blob a text names only by hash: the same bytes for the same hash in both texts."""
    return f"<blob {nbytes}B sha256={sha}>".encode()


def _sections(name: str, second: str) -> tuple[str, str]:
    text = (LOWERING / f"{name}.txt").read_text(encoding="utf-8")
    before, sep, rest = text.removeprefix("# before\n").partition(f"# {second}\n")
    assert text.startswith("# before\n") and sep, f"{name}.txt: expected '# before' then '# {second}'"
    return before, rest


def test_every_lowering_golden_has_a_case() -> None:
    files = sorted(p.stem for p in LOWERING.glob("*.txt"))
    assert files == sorted([*LOWERED, *(f"error_{name}" for name in REFUSED)])


@pytest.mark.parametrize("name", sorted(LOWERED))
def test_before_text_lowers_to_after_text(name: str) -> None:
    before_text, after_text = _sections(name, "after")
    before = parse_program(before_text, missing_blob=_blob)
    verify(before)
    lowered = to_backend(before, LOWERED[name])
    verify(lowered)
    expected = parse_program(after_text, payloads=payloads_of(lowered), missing_blob=_blob)
    if lowered != expected:
        diff = diff_programs(expected, lowered, a_label=f"golden/lowering/{name}.txt", b_label="lowered")
        pytest.fail(format_diff(diff, limit=60), pytrace=False)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_before_text_is_refused_with_the_golden_error(name: str) -> None:
    before_text, error_text = _sections(f"error_{name}", "error")
    partitioner, error = REFUSED[name]
    with pytest.raises(error) as info:
        to_backend(parse_program(before_text, missing_blob=_blob), partitioner)
    stable = re.sub(r"\(known: [^)]*\)", "(known: ...)", str(info.value))  # the registry depends on imports
    assert stable + "\n" == error_text


def test_text_goldens_run_without_torch() -> None:
    """This file's goldens and tests/test_edge_goldens.py's, in a pytest where importing torch fails."""
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    script = (
        "import sys; sys.modules['torch'] = None; sys.modules['executorch'] = None\n"  # `import torch` raises
        "import pytest; sys.exit(pytest.main(sys.argv[1:]))"
    )
    files = [str(root / "tests" / "test_lowering_goldens.py"), str(root / "tests" / "test_edge_goldens.py")]
    done = subprocess.run(
        [sys.executable, "-c", script, "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-k", "not without_torch", *files],
        cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
