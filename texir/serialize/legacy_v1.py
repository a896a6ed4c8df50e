"""Reading schema 1.x snapshots (1.0, 1.1), which kept value metadata and provenance inline on each
node. Schema 2.0 moved both into per-graph tables (see `texir.ir.types`); these structs mirror the
1.x layout of the types that changed, and `upgrade_*` rebuild the 2.0 objects with `GraphBuilder`.
Every type that did not change is shared with `texir.ir.types`."""

from __future__ import annotations

from typing import Literal, Union

import msgspec

from texir.ir.builder import GraphBuilder
from texir.ir import types as ir
from texir.ir.types import Argument, Provenance, ValueMeta

__all__ = ["LEGACY_VERSIONS", "LoweredModuleSnapshotV1", "ProgramSnapshotV1", "upgrade_module", "upgrade_program"]

LEGACY_VERSIONS = ((1, 0), (1, 1))


class _Tagged(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", gc=False):
    pass


class _Frozen(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    pass


class PlaceholderV1(_Tagged, frozen=True, kw_only=True, tag="placeholder"):
    name: str
    meta: ValueMeta | None = None
    prov: Provenance | None = None


class CallFunctionV1(_Tagged, frozen=True, kw_only=True, tag="call_function"):
    name: str
    target: str
    args: tuple[Argument, ...] = ()
    kwargs: tuple[tuple[str, Argument], ...] = ()
    meta: ValueMeta | None = None
    prov: Provenance | None = None


class GetAttrV1(_Tagged, frozen=True, kw_only=True, tag="get_attr"):
    name: str
    target: str
    meta: ValueMeta | None = None
    prov: Provenance | None = None


class OutputV1(_Tagged, frozen=True, kw_only=True, tag="output"):
    name: str = "output"
    args: tuple[Argument, ...] = ()
    prov: Provenance | None = None


class SubgraphV1(_Frozen, frozen=True, kw_only=True):
    name: str
    graph: GraphV1


class GraphV1(_Frozen, frozen=True, kw_only=True):
    nodes: tuple[Union[PlaceholderV1, CallFunctionV1, GetAttrV1, OutputV1], ...]
    subgraphs: tuple[SubgraphV1, ...] = ()


class LoweredBackendModuleV1(_Frozen, frozen=True, kw_only=True):
    backend_id: str
    processed_bytes: bytes
    compile_specs: tuple[ir.CompileSpec, ...]
    original_program: ProgramV1
    debug_handle_map: tuple[ir.DebugHandleEntry, ...] | None = None


class NamedLoweredModuleV1(_Frozen, frozen=True, kw_only=True):
    name: str
    module: LoweredBackendModuleV1


class ProgramV1(_Frozen, frozen=True, kw_only=True):
    graph: GraphV1
    signature: ir.GraphSignature
    state: tuple[ir.StateEntry, ...] = ()
    range_constraints: tuple[ir.RangeConstraint, ...] = ()
    module_call_graph: tuple[ir.ModuleCallEntry, ...] = ()
    lowered_modules: tuple[NamedLoweredModuleV1, ...] = ()
    dialect: ir.Dialect = "ATEN"  # a 1.x dialect outside texir's set is refused on decode, naming the field


class ProgramSnapshotV1(msgspec.Struct, frozen=True, kw_only=True):
    format: Literal["texir-snapshot"] = "texir-snapshot"
    schema_version: tuple[int, int]
    kind: Literal["program"] = "program"
    program: ProgramV1


class LoweredModuleSnapshotV1(msgspec.Struct, frozen=True, kw_only=True):
    format: Literal["texir-snapshot"] = "texir-snapshot"
    schema_version: tuple[int, int]
    kind: Literal["lowered_module"] = "lowered_module"
    module: LoweredBackendModuleV1


def _upgrade_graph(graph: GraphV1) -> ir.Graph:
    builder = GraphBuilder()
    for node in graph.nodes:
        if isinstance(node, PlaceholderV1):
            builder.add(ir.Placeholder(name=node.name), node.meta, node.prov)
        elif isinstance(node, CallFunctionV1):
            call = ir.CallFunction(name=node.name, target=node.target, args=node.args, kwargs=node.kwargs)
            builder.add(call, node.meta, node.prov)
        elif isinstance(node, GetAttrV1):
            builder.add(ir.GetAttr(name=node.name, target=node.target), node.meta, node.prov)
        else:
            builder.add(ir.Output(name=node.name, args=node.args), None, node.prov)
    return builder.build(ir.Subgraph(name=s.name, graph=_upgrade_graph(s.graph)) for s in graph.subgraphs)


def upgrade_module(module: LoweredBackendModuleV1) -> ir.LoweredBackendModule:
    return ir.LoweredBackendModule(
        backend_id=module.backend_id,
        processed_bytes=module.processed_bytes,
        compile_specs=module.compile_specs,
        original_program=upgrade_program(module.original_program),
        debug_handle_map=module.debug_handle_map,
    )


def upgrade_program(program: ProgramV1) -> ir.Program:
    """The schema 2.0 Program of a 1.x one: same nodes, metadata and provenance, now in tables."""
    return ir.Program(
        graph=_upgrade_graph(program.graph),
        signature=program.signature,
        state=program.state,
        range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph,
        lowered_modules=tuple(
            ir.NamedLoweredModule(name=m.name, module=upgrade_module(m.module)) for m in program.lowered_modules
        ),
        dialect=program.dialect,
    )
