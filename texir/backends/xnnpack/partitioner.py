"""`partitioner(**options)`: ExecuTorch 1.5.1's XnnpackPartitioner (float, static-int8 and
dynamic-int8 configs) computed on the IR.

Each supported op has a check (`ops.CHECKS`, from `ops.OPS`) that returns None when XNNPACK takes the node, or
the reason it does not; int8 patterns (`quant_partition`) add the q/dq nodes and quantized weights
around their op and tag the q/dq implicit. Partitions are then the maximal ones torch's
CapabilityBasedPartitioner proposes (`OpSupportPartitioner`), with the constants they read, as
ExecuTorch tags them, numbered and ordered as its GroupBasedPartitioner numbers them (`partition_order`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import pydantic

from texir.backends.xnnpack.backend import BACKEND_ID
from texir.backends.xnnpack.op_checks import NodeView, common_check, refs
from texir.backends.xnnpack.ops import BN, CHECKS, CLAIMS, CONV, INT8_IO, KEPT_OPS, LINEAR, MAX_DIM, TUPLE_OPS
from texir.backends.xnnpack.partition_order import executorch_partition_ids
from texir.backends.xnnpack.per_op import per_op_groups
from texir.backends.xnnpack.quant_partition import IMPLICIT_KEY, QuantPlan, quant_patterns
from texir.ir import (
    BackendNodeMeta,
    BufferInput,
    CallFunction,
    ConstantTensorInput,
    DType,
    NoneArg,
    ParameterInput,
    Placeholder,
    Program,
    Ref,
    TensorMeta,
    TupleMeta,
    ValueMeta,
)
from texir.ir.analysis import value_metas, walk_graphs
from texir.ir.names import GETITEM
from texir.lowering.errors import PartitionerError
from texir.lowering.partitioners import OpSupportPartitioner
from texir.lowering.plan import DelegationSpec, PartitionPlan

__all__ = ["CHECKS", "KEPT_OPS", "XnnpackNativePartitioner", "partitioner"]


_PRECISIONS: Final = ("fp32", "static_int8", "dynamic_int8")


class _Options(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    per_op_mode: bool = False
    """One partition per supported node (ExecuTorch's `per_op_mode`)."""
    config_precisions: tuple[str, ...] = ("fp32", "static_int8", "dynamic_int8")
    """ExecuTorch's precisions the partitioner takes: 'fp32' (always), 'static_int8' (pt2e static
    int8, XNNPACKQuantizer's per-tensor or per-channel scheme) and 'dynamic_int8' (activations
    quantized at run time, per-channel int8 weights). A quantized GEMM whose precision is left out
    stays with portable kernels (ExecuTorch may still take it as fp32 or in its own precision)."""


class XnnpackNativePartitioner:
    """ExecuTorch's XnnpackPartitioner for float and int8 programs, as a texir partitioner;
    `reasons(program)` says why each call node is turned down, `explain(node)` (lower's report) why
    a node of the program it last partitioned was, and `supports_op(node)` whether its op has an
    XNNPACK config at all (turned down by a check, not kept by no partitioner)."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self._turned_down: dict[str, str] = {}
        """The reasons of the last call (node name -> why), for `explain`."""
        self._checked: set[str] = set()
        """The nodes of the last call its op checks saw, whose op has an XNNPACK config, for `supports_op`."""

    def __repr__(self) -> str:
        return f"texir.backends.xnnpack.partitioner(per_op_mode={self.options.per_op_mode})"

    def _quant(self, program: Program, constants: frozenset[str]) -> QuantPlan:
        static = "static_int8" in self.options.config_precisions
        dynamic = "dynamic_int8" in self.options.config_precisions
        metas = value_metas(program.graph)

        def accepts(node: CallFunction) -> bool:
            return _verdict(node, metas, constants, QuantPlan()) is None

        return quant_patterns(program, constants, accepts, static=static, dynamic=dynamic)

    def reasons(self, program: Program) -> dict[str, str]:
        """Every top-level call node the partitioner turns down, with the reason."""
        metas = value_metas(program.graph)
        constants = _constants(program)
        quant = self._quant(program, constants)
        found = {}
        for node in program.graph.nodes:
            if isinstance(node, CallFunction):
                why = _verdict(node, metas, constants, quant)
                if why is not None:
                    found[node.name] = why
        return found

    def ops_to_not_decompose(self, program: Program) -> tuple[str, ...]:
        """The KEPT_OPS the partitioner takes a node of, and those `program` holds no node of in any
        graph: a decomposition may make them (lstm's, gru's and rnn's cells call linear), and
        ExecuTorch keeps them through it, judging the nodes it made afterwards (`nodes_to_decompose`).
        An op with nodes only in nested graphs (cond branches), which this partitioner does not
        enter, is not kept: nothing would take them."""
        metas = value_metas(program.graph)
        constants = _constants(program)
        quant = self._quant(program, constants)
        calls = [n for n in program.graph.nodes if isinstance(n, CallFunction) and n.target in KEPT_OPS]
        kept = {n.target for n in calls if _verdict(n, metas, constants, quant) is None}
        present = {n.target for _, graph in walk_graphs(program.graph) for n in graph.nodes
                   if isinstance(n, CallFunction) and n.target in KEPT_OPS}
        return tuple(sorted(kept | (set(KEPT_OPS) - present)))

    def nodes_to_decompose(self, program: Program) -> tuple[str, ...]:
        metas = value_metas(program.graph)
        constants = _constants(program)
        quant = self._quant(program, constants)
        return tuple(
            node.name for node in program.graph.nodes
            if isinstance(node, CallFunction) and node.target in KEPT_OPS
            and _verdict(node, metas, constants, quant) is not None
        )

    def explain(self, node: CallFunction) -> str:
        """Why the last call left `node` out (for lower's report and `texir lower --explain`)."""
        why = self._turned_down.get(node.name)
        if why is not None:
            return why
        if node.name in self._checked:
            return f"{node.target} is supported but was left in no XNNPACK partition"
        return f"the partitioner does not check {node.target} nodes (a getitem goes with the node it reads)"

    def supports_op(self, node: CallFunction) -> bool:
        """Whether XNNPACK has a config for `node`'s op (so a node of it left out was turned down by
        its check), as of the last call."""
        return node.name in self._checked

    def __call__(self, program: Program) -> PartitionPlan:
        constants = _constants(program)
        quant = self._quant(program, constants)
        fused_bn = _batch_norms(program, constants) | _max_dims(program)
        if self.options.per_op_mode:
            return self._per_op(program, constants, quant, fused_bn)

        turned_down: dict[str, str] = {}
        checked: set[str] = set()

        def supported(node: CallFunction, metas: Mapping[str, ValueMeta]) -> bool:
            checked.add(node.name)
            if node.name in fused_bn:
                return True
            why = _verdict(node, metas, constants, quant)
            if why is not None:
                turned_down[node.name] = why
                if why == _no_config(node.target):
                    checked.discard(node.name)
            return why is None

        plan = OpSupportPartitioner(BACKEND_ID, supported)(program)
        self._turned_down, self._checked = turned_down, checked
        # Like ExecuTorch's partitioner, only the top-level graph (never inside a cond or map branch).
        tags = {key: tag for key, tag in plan.tags if "/" not in key}
        # Only the GEMM, batch-norm and prelu configs claim constants (their weights); any other constant
        # a partition reads becomes a delegate input, as with ExecuTorch's partitioner.
        for node in program.graph.nodes:
            tag = tags.get(node.name)
            if tag is None or not isinstance(node, CallFunction) or node.target not in CLAIMS:
                continue
            for i in CLAIMS[node.target]:
                a = node.args[i] if len(node.args) > i else None
                if isinstance(a, Ref) and a.name in constants:
                    tags.setdefault(a.name, tag)
        # The constants of static-int8 patterns (quantized weights, their scales and zero points).
        for dep, anchor in quant.deps.items():
            if dep in constants and anchor in tags:
                tags.setdefault(dep, tags[anchor])
        # Tags named and ordered as ExecuTorch's GroupBasedPartitioner numbers its partitions, from the
        # groups of config matches it is handed (the groups per_op_mode makes partitions of).
        groups = per_op_groups(program, constants, quant, lambda node: node.name in tags)
        first = executorch_partition_ids(program.graph, tags, groups)
        rename = {tag: f"tag{pid}" for tag, pid in first.items()}
        renamed = {key: rename.get(tag, tag) for key, tag in tags.items()}
        spec = {tag: s for tag, s in plan.specs if tag in first}
        ordered = sorted(spec, key=lambda tag: first[tag])
        notes = [
            BackendNodeMeta(node=name, key=IMPLICIT_KEY, value="true")
            for name in sorted(quant.implicit) if name in renamed
        ]
        return PartitionPlan.build(
            renamed, [(rename.get(tag, tag), spec[tag]) for tag in ordered],
            shared_constants=plan.shared_constants, backend_meta=notes,
        )


    def _per_op(self, program: Program, constants: frozenset[str], quant: QuantPlan,
                tuple_ops: set[str]) -> PartitionPlan:
        """per_op_mode: one partition per group of config matches (`per_op.per_op_groups`), tagged
        tag0, tag1, ... in ExecuTorch's order."""
        metas = value_metas(program.graph)
        turned_down: dict[str, str] = {}
        checked: set[str] = set()

        def taken(node: CallFunction) -> bool:
            if node.name in tuple_ops:
                checked.add(node.name)
                return True
            has_config = node.target in CHECKS or node.target in TUPLE_OPS
            why = _verdict(node, metas, constants, quant) if has_config else _no_config(node.target)
            if has_config:
                checked.add(node.name)
            if why is not None:
                turned_down[node.name] = why
            return why is None

        groups = per_op_groups(program, constants, quant, taken)
        self._turned_down, self._checked = turned_down, checked
        tags = {name: f"tag{i}" for i, group in enumerate(groups) for name in group}
        spec = DelegationSpec(backend_id=BACKEND_ID)
        notes = [BackendNodeMeta(node=name, key=IMPLICIT_KEY, value="true") for name in sorted(quant.implicit)
                 if name in tags]
        return PartitionPlan.build(tags, [(f"tag{i}", spec) for i in range(len(groups))], backend_meta=notes)


def _verdict(node: CallFunction, metas: Mapping[str, ValueMeta], constants: frozenset[str],
             quant: QuantPlan) -> str | None:
    refused = quant.refused.get(node.name)
    if refused is not None:
        return refused
    if node.name in quant.gemms:
        return common_check(NodeView(node, metas, constants), int8=node.target in INT8_IO)
    if node.name in quant.deps:
        return None  # part of a static-int8 pattern its anchor op takes
    if not quant.static and node.target in INT8_IO:
        return "static_int8 is not in config_precisions"
    check = CHECKS.get(node.target)
    if check is None:
        return TUPLE_OPS.get(node.target, _no_config(node.target))
    n = NodeView(node, metas, constants)
    return common_check(n, int8=node.target in INT8_IO) or check(n)


def _no_config(target: str) -> str:
    return f"op {target} has no XNNPACK config in the native backend"


def _constants(program: Program) -> frozenset[str]:
    names = [n.name for n in program.graph.nodes if isinstance(n, Placeholder)]
    return frozenset(
        name for name, spec in zip(names, program.signature.inputs)
        if isinstance(spec, (ParameterInput, BufferInput, ConstantTensorInput))
    )


def _batch_norms(program: Program, constants: frozenset[str]) -> set[str]:
    """Batch norms (and their getitems) ExecuTorch's BatchNormConfig takes: the preprocess can fold
    each into the convolution or linear before it (FuseBatchNormPass.can_fuse) or turn it into a
    depthwise convolution (DecomposeBatchNorm); only getitems of its output read it."""
    metas = value_metas(program.graph)
    nodes = {n.name: n for n in program.graph.nodes if isinstance(n, CallFunction)}
    users: dict[str, list[CallFunction]] = {}
    for n in nodes.values():
        for ref in refs(n):
            users.setdefault(ref, []).append(n)

    def static(a: object, optional: bool) -> bool:
        return (optional and (a is None or isinstance(a, NoneArg))) or (isinstance(a, Ref) and a.name in constants)

    found: set[str] = set()
    for n in nodes.values():
        if n.target != BN or common_check(NodeView(n, metas, constants)) is not None:
            continue
        getitems = users.get(n.name, [])
        if not all(u.target == GETITEM and getattr(u.args[1], "value", None) == 0 for u in getitems):
            continue
        src = n.args[0]
        x = metas.get(src.name) if isinstance(src, Ref) else None
        rank = len(x.shape) if isinstance(x, TensorMeta) else 0
        before = nodes.get(src.name) if isinstance(src, Ref) else None
        fusable = (
            before is not None and before.target in (CONV, LINEAR)
            and static(before.args[1], False) and static(n.args[1], False)
            and (before.target != CONV or rank in (3, 4))
        )
        decomposable = (
            rank in (2, 3, 4) and isinstance(x, TensorMeta) and isinstance(x.shape[1], int)
            and all(static(a, True) for a in n.args[1:3]) and all(static(a, False) for a in n.args[3:5])
            and not isinstance(n.args[-1], Ref)
        )
        if fusable or decomposable:
            found.add(n.name)
            found.update(u.name for u in getitems)
    return found


def _max_dims(program: Program) -> set[str]:
    """max.dim nodes (with their getitems) ExecuTorch's MaxDimConfig takes: a 4-D float input and
    only the values read (the preprocess makes each an amax)."""
    metas = value_metas(program.graph)
    calls = [n for n in program.graph.nodes if isinstance(n, CallFunction)]
    found: set[str] = set()
    for n in calls:
        if n.target != MAX_DIM or not isinstance(n.args[0], Ref):
            continue
        x, out = metas.get(n.args[0].name), metas.get(n.name)
        values = out.items[0] if isinstance(out, TupleMeta) and out.items else None
        if not isinstance(x, TensorMeta) or len(x.shape) != 4 or x.dtype not in (DType.float32, DType.float16):
            continue
        if not isinstance(values, TensorMeta) or values.dtype != x.dtype:
            continue
        getitems = [u for u in calls if n.name in refs(u)]
        if all(u.target == GETITEM and getattr(u.args[1], "value", None) == 0 for u in getitems):
            found.add(n.name)
            found.update(u.name for u in getitems)
    return found


def partitioner(**options: object) -> XnnpackNativePartitioner:
    """The native XNNPACK partitioner; options as XnnpackPartitioner's (`per_op_mode`,
    `config_precisions`), validated."""
    try:
        opts = _Options(**options)  # type: ignore[arg-type]  # pydantic validates each option
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        raise PartitionerError(
            f"invalid XNNPACK partitioner option '{'.'.join(str(p) for p in first['loc'])}': {first['msg']}"
        ) from None
    if set(opts.config_precisions) - set(_PRECISIONS) or "fp32" not in opts.config_precisions:
        raise PartitionerError(
            f"config_precisions {list(opts.config_precisions)}: the native XNNPACK partitioner takes 'fp32' with "
            "optionally 'static_int8' and 'dynamic_int8' (4-bit weights: --partitioner executorch:xnnpack)"
        )
    return XnnpackNativePartitioner(opts)
