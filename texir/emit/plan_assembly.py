"""A method's `ExecutionPlan` from its finished value table (memory planning, allocation info, the
arena size, container metadata), and the plans of constant methods."""

from __future__ import annotations

import math

from texir.emit.common import EmitError, PendingTensor, ProgramState
from texir.emit.memory_plan import Interval, align_up, check_plan, plan_memory
from texir.emit.values import ValueTable
from texir.ir.types import DTYPE_ITEMSIZE, ConstantMethod
from texir.serialize.pte.dtypes import DTYPE_TO_SCALAR_TYPE
from texir.serialize.pte.schema import (
    AllocationDetails, Bool, Chain, ContainerMetadata, Double, EValue, ExecutionPlan, Int, String, Tensor,
)

__all__ = ["XNNPACK_EXTRA_PADDING", "assemble_plan", "constant_method_plan"]

XNNPACK_EXTRA_PADDING = 64


def assemble_plan(table: ValueTable) -> ExecutionPlan:
    """The method's ExecutionPlan once every node is emitted: its storages memory-planned, each
    tensor's allocation set, the arena sized (padded for XNNPACK)."""
    offsets: dict[int, int] = {}
    members: dict[int, list[int]] = {}  # group -> its storages, in creation order
    for k, storage in enumerate(table.storages):
        members.setdefault(storage.group, []).append(k)
    arena = _plan_group(table, 0, 0, offsets, members)
    values: list[EValue] = []
    for value in table.values:
        if isinstance(value, PendingTensor):
            allocation = None
            if value.storage is not None:
                offset = offsets[value.storage]
                allocation = AllocationDetails(
                    memory_id=1, memory_offset_low=offset & 0xFFFFFFFF, memory_offset_high=offset >> 32
                )
            elif value.shared_offset is not None:
                offset = value.shared_offset
                allocation = AllocationDetails(
                    memory_id=2, memory_offset_low=offset & 0xFFFFFFFF, memory_offset_high=offset >> 32
                )
            values.append(EValue(val=Tensor(
                scalar_type=value.scalar_type, sizes=value.sizes, dim_order=value.dim_order,
                requires_grad=value.requires_grad, data_buffer_idx=value.data_buffer_idx,
                allocation_info=allocation, shape_dynamism=value.dynamism,
                extra_tensor_info=value.extra,
            )))
        else:
            values.append(EValue(val=value))
    return ExecutionPlan(
        name=table.name,
        container_meta_type=_container_meta(table),
        values=tuple(values),
        inputs=tuple(table.inputs),
        outputs=tuple(table.outputs),
        chains=(Chain(inputs=(), outputs=(), instructions=tuple(table.instructions)),),
        operators=tuple(table.operators),
        delegates=tuple(table.delegates),
        non_const_buffer_sizes=(
            0, align_up(arena, table.options.alignment),
            *(() if table.state.shared_size is None else (table.state.shared_size,)),
        ),
    )


def _plan_group(
    table: ValueTable, group: int, base: int, offsets: dict[int, int], members: dict[int, list[int]]
) -> int:
    """Plan `group`'s storages from `base` (filling `offsets`, storage index -> arena offset) and
    return the bytes it needs. As ExecuTorch's `apply_algo`: each torch.cond branch of the group is
    planned on its own from 0, the branches' memory comes first, the group's own tensors after it.
    ExecuTorch lets every cond of a graph share one branch region (the largest); texir plans the
    regions as tensors live from the cond to its results' last read, which is ExecuTorch's layout
    when those lifetimes are disjoint, and keeps apart regions whose results are still read when a
    later cond runs (ExecuTorch's `.pte` then overwrites them: docs/limitations.md)."""
    regions = [r for r in table.cond_regions if r.group == group]
    branch_offsets: list[list[tuple[int, dict[int, int]]]] = []
    region_sizes: list[int] = []
    for region in regions:
        planned = []
        for branch in region.branches:
            inner: dict[int, int] = {}
            planned.append((_plan_group(table, branch, 0, inner, members), inner))
        branch_offsets.append(planned)
        region_sizes.append(max((size for size, _ in planned), default=0))
    region_intervals = [
        Interval(size=size, start=r.step, end=max([r.step, *(table.storages[s].end for s in r.results)]))
        for r, size in zip(regions, region_sizes)
    ]
    region_plan = plan_memory(region_intervals, planner=table.options.planner, alignment=table.options.alignment)
    for region_offset, planned in zip(region_plan.offsets, branch_offsets):
        for _, inner in planned:
            for storage, offset in inner.items():
                offsets[storage] = base + region_offset + offset
    reserved = region_plan.total
    own = members.get(group, [])
    intervals = [Interval(size=table.storages[k].size, start=table.storages[k].start, end=table.storages[k].end)
                 for k in own]
    plan = plan_memory(intervals, planner=table.options.planner, alignment=table.options.alignment)
    if table.options.check_plan:
        check_plan(intervals, plan)
    for k, offset in zip(own, plan.offsets):
        offsets[k] = base + reserved + offset
    if not intervals:
        return reserved
    # XNNPACK may read up to 64 bytes past a planned tensor, so ExecuTorch's planner pads the
    # arena of a graph calling an XNNPACK delegate by 64 bytes (exir memory_planning).
    padding = XNNPACK_EXTRA_PADDING if group in table.xnnpack_groups else 0
    return reserved + plan.total + padding

def _container_meta(table: ValueTable) -> ContainerMetadata:
    for entry in table.program.module_call_graph:
        if entry.fqn == "" and entry.signature is not None:
            return ContainerMetadata(
                encoded_inp_str=entry.signature.in_spec, encoded_out_str=entry.signature.out_spec
            )
    return ContainerMetadata(encoded_inp_str="", encoded_out_str="")


def constant_method_plan(name: str, method: ConstantMethod, state: ProgramState) -> ExecutionPlan:
    """A method without inputs or instructions whose outputs are `method`'s constants; tensors go
    to the constant segment (never to a `.ptd`: they have no fully qualified name)."""
    values: list[EValue] = []
    for i, leaf in enumerate(method.values):
        where = f"constant method {name!r}, value {i}"
        if isinstance(leaf, bool):
            values.append(EValue(val=Bool(bool_val=leaf)))
        elif isinstance(leaf, int):
            values.append(EValue(val=Int(int_val=leaf)))
        elif isinstance(leaf, float):
            values.append(EValue(val=Double(double_val=leaf)))
        elif isinstance(leaf, str):
            values.append(EValue(val=String(string_val=leaf)))
        else:
            meta = leaf.meta
            scalar_type = DTYPE_TO_SCALAR_TYPE.get(meta.dtype)
            if scalar_type is None:
                raise EmitError(f"{where}: tensor dtype {meta.dtype} has no ExecuTorch scalar type; convert it")
            if leaf.data is None:
                raise EmitError(f"{where}: the tensor holds no data (a snapshot written without include_data)")
            if any(isinstance(d, str) for d in meta.shape):
                raise EmitError(f"{where}: a constant tensor cannot have a symbolic shape")
            sizes = tuple(int(d) for d in meta.shape)
            if leaf.data.nbytes != math.prod(sizes) * DTYPE_ITEMSIZE[meta.dtype]:
                raise EmitError(f"{where}: holds {leaf.data.nbytes} bytes but {meta.dtype}{list(sizes)} needs "
                                f"{math.prod(sizes) * DTYPE_ITEMSIZE[meta.dtype]}")
            values.append(EValue(val=Tensor(
                scalar_type=scalar_type, sizes=sizes, dim_order=tuple(range(len(sizes))),
                requires_grad=meta.requires_grad, data_buffer_idx=state.constant(leaf.data, leaf.sha256),
            )))
    return ExecutionPlan(
        name=name,
        container_meta_type=ContainerMetadata(encoded_inp_str="", encoded_out_str=method.out_spec),
        values=tuple(values),
        inputs=(),
        outputs=tuple(range(len(values))),
        chains=(Chain(inputs=(), outputs=(), instructions=()),),
        operators=(),
        delegates=(),
        non_const_buffer_sizes=(0,),
    )
