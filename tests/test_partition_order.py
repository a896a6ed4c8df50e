"""`executorch_partition_ids` (the native XNNPACK partitioner's tag numbering and delegate order) gives
every partition the id ExecuTorch's `GroupBasedPartitioner.propose_partitions` gives it (the
partitioner ExecuTorch's XnnpackPartitioner runs), on random DAGs with random supported sets and
node groups (hypothesis): the same graph built as a texir program and as an fx graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from tests.lowering_helpers import TEST_BACKEND
from tests.test_partition_semantics import _fx_dag, _random_dag, _texir_dag
from texir.backends.xnnpack.partition_order import executorch_partition_ids
from texir.lowering import OpSupportPartitioner


class _Support(OperatorSupportBase):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return node.name in self.names


def _theirs(preds: list[list[int]], supported: list[bool], groups: list[list[int]] | None = None) -> dict[str, int]:
    """GroupBasedPartitioner's id for every node it partitions; by default every supported node is a
    group of its own (what XnnpackPartitioner hands it for single-node configs)."""
    gm, nodes = _fx_dag(preds)
    ok = {f"n{i}" for i, s in enumerate(supported) if s}
    if groups is None:
        groups = [[i] for i, s in enumerate(supported) if s]
    partitioner = GroupBasedPartitioner(
        gm, _Support(ok), node_groups=[[nodes[i] for i in g] for g in groups], allows_single_node_partition=True,
    )
    return {n.name: p.id for p in partitioner.propose_partitions() for n in p.nodes if p.id is not None}


def _ours(preds: list[list[int]], tags: dict[str, str], groups: Sequence[Sequence[int]] = ()) -> dict[str, int]:
    ids = executorch_partition_ids(_texir_dag(preds).graph, tags, [[f"n{i}" for i in g] for g in groups])
    return {name: ids[tag] for name, tag in tags.items()}


def _texir_tags(preds: list[list[int]], supported: list[bool]) -> dict[str, str]:
    ok = {f"n{i}" for i, s in enumerate(supported) if s}
    return dict(OpSupportPartitioner(TEST_BACKEND, lambda node, metas: node.name in ok)(_texir_dag(preds)).tags)


def test_the_lower_id_survives_a_merge_not_the_larger_partition() -> None:
    # Backwards, n3 opens id 0, n2 id 1, n0 id 2. n2 and n3 merge (n0 cannot: n1, unsupported, sits
    # between n0 and n2): GroupBasedPartitioner keeps id 0, torch's CapabilityBasedPartitioner id 1.
    preds, supported = [[], [0], [1], [], [2]], [True, False, True, True, False]
    gm, _ = _fx_dag(preds)
    capability = CapabilityBasedPartitioner(gm, _Support({"n0", "n2", "n3"}), allows_single_node_partition=True)
    assert {n.name: p.id for p in capability.propose_partitions() for n in p.nodes} == {"n2": 1, "n3": 1, "n0": 2}
    assert _theirs(preds, supported) == {"n2": 0, "n3": 0, "n0": 2}
    assert _ours(preds, _texir_tags(preds, supported)) == {"n2": 0, "n3": 0, "n0": 2}


def test_a_group_is_numbered_at_its_last_node() -> None:
    # n0 and n3 are one group: it opens id 0 at n3, before n2 (id 1); n1 (unsupported) keeps n2 out.
    # Single-node groups would give n3 id 0, n2 id 1, n0 id 2, and merge n2 with n3 instead.
    preds, supported, groups = [[], [0], [1], []], [True, False, True, True], [[0, 3], [2]]
    theirs = _theirs(preds, supported, groups)
    assert theirs == {"n0": 0, "n3": 0, "n2": 1}
    assert _ours(preds, {"n0": "a", "n3": "a", "n2": "b"}, groups) == theirs
    assert _theirs(preds, supported) == {"n2": 0, "n3": 0, "n0": 2}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_ids_equal_group_based_partitioner(data: Any) -> None:
    # texir's maximal partitions, numbered: the same nodes with the same ids as ExecuTorch's.
    preds, supported = data.draw(st.composite(lambda draw: _random_dag(draw, max_nodes=40))())
    assert _ours(preds, _texir_tags(preds, supported)) == _theirs(preds, supported)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_ids_equal_group_based_partitioner_with_groups(data: Any) -> None:
    # Multi-node groups (a config match with its deps, matches sharing a node) and supported nodes in
    # no group: numbering ExecuTorch's own partitions from its groups gives its ids.
    preds, supported = data.draw(st.composite(lambda draw: _random_dag(draw, max_nodes=40))())
    chosen = [i for i, s in enumerate(supported) if s]
    labels = data.draw(st.lists(st.integers(min_value=-1, max_value=max(1, len(chosen) // 2)),
                                min_size=len(chosen), max_size=len(chosen)))
    by_label: dict[int, list[int]] = {}
    for i, label in zip(chosen, labels):
        if label >= 0:  # -1: a supported node in no group
            by_label.setdefault(label, []).append(i)
    groups = list(by_label.values())
    theirs = _theirs(preds, supported, groups)
    assert _ours(preds, {n: f"p{pid}" for n, pid in theirs.items()}, groups) == theirs
