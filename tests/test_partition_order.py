"""`torch_partition_order` (the XNNPACK partitioner's tag numbering) gives every node the partition
id torch's `CapabilityBasedPartitioner.propose_partitions` leaves it in, on random DAGs with random
supported sets (hypothesis): the same graph built as a texir program and as an fx graph."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_partition_semantics import _random_dag, _texir_dag, _torch_partitioner
from texir.backends.xnnpack.partition_order import torch_partition_order


def _ours(preds: list[list[int]], supported: list[bool]) -> dict[str, int]:
    graph = _texir_dag(preds).graph
    ok = {f"n{i}": True for i, s in enumerate(supported) if s}
    return {node.name: pid for node, pid in zip(graph.nodes, torch_partition_order(graph, ok)) if pid >= 0}


def _theirs(preds: list[list[int]], supported: list[bool]) -> dict[str, int]:
    parts = _torch_partitioner(preds, supported).propose_partitions()
    return {node.name: p.id for p in parts for node in p.nodes if p.id is not None}


def test_new_partition_is_the_first_merge_candidate() -> None:
    # n3 gets id 0, n2 id 1; n2's new partition is tried first and the tie on size keeps it: both
    # nodes end in partition 1 (a replay trying partitions by order alone would say 0).
    preds, supported = [[], [0], [1], [], [2]], [True, False, True, True, False]
    assert _theirs(preds, supported) == {"n2": 1, "n3": 1, "n0": 2}
    assert _ours(preds, supported) == {"n2": 1, "n3": 1, "n0": 2}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_ids_equal_capability_based_partitioner(data: Any) -> None:
    preds, supported = data.draw(st.composite(lambda draw: _random_dag(draw))())
    assert _ours(preds, supported) == _theirs(preds, supported)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_ids_equal_capability_based_partitioner_larger(data: Any) -> None:
    # Longer merge histories: ids that merged away linger in torch's reachability sets.
    preds, supported = data.draw(st.composite(lambda draw: _random_dag(draw, max_nodes=120))())
    assert _ours(preds, supported) == _theirs(preds, supported)
