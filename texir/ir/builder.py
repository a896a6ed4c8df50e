"""`GraphBuilder`: the way to make a `Graph`. It interns value metadata and locations in order of
first use and lays provenance out column-wise, so the same nodes give the same (equal) graph."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from texir.ir.types import Graph, Location, Node, Output, Provenance, ProvenanceTable, Subgraph, ValueMeta

__all__ = ["GraphBuilder", "build_graph"]

_replace = msgspec.structs.replace


class GraphBuilder:
    """Collects nodes in order, each with its metadata and provenance, then `build`s the Graph.

    The metadata passed to `add` is what the node's value is: the node's own `meta_id` (say, from
    the graph it was copied out of) is ignored and rewritten.
    """

    __slots__ = ("_nodes", "_metas", "_locations", "_handles", "_ancestors", "_fn_names", "_locs", "_any_prov")

    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._metas: dict[ValueMeta, int] = {}
        self._locations: dict[Location, int] = {}
        self._handles: list[int | None] = []
        self._ancestors: list[str | None] = []
        self._fn_names: list[str | None] = []
        self._locs: list[int | None] = []
        self._any_prov = False

    def __len__(self) -> int:
        return len(self._nodes)

    def add(self, node: Node, meta: ValueMeta | None = None, prov: Provenance | None = None) -> Node:
        """Append `node` (with `meta` and `prov`); returns the node as stored (its `meta_id` set)."""
        if isinstance(node, Output):
            if meta is not None:
                raise ValueError(f"output node {node.name!r} cannot carry value metadata")
        else:
            index = None if meta is None else self._metas.setdefault(meta, len(self._metas))
            if node.meta_id != index:
                node = _replace(node, meta_id=index)
        self._nodes.append(node)
        if prov is None:
            self._handles.append(None)
            self._ancestors.append(None)
            self._fn_names.append(None)
            self._locs.append(None)
            return node
        handle, ancestor, fn = prov.debug_handle, prov.ancestor, prov.torch_fn
        self._handles.append(handle)
        self._ancestors.append(ancestor)
        self._fn_names.append(None if fn is None else fn[0])
        if prov.stack_trace is None and not prov.nn_module_stack and not prov.source_fn_stack and fn is None \
                and prov.custom is None:
            self._locs.append(None)
            # An empty Provenance records nothing: the graph keeps no table for it alone.
            if handle is not None or ancestor is not None:
                self._any_prov = True
        else:
            where = Location(
                stack_trace=prov.stack_trace,
                nn_module_stack=prov.nn_module_stack,
                source_fn_stack=prov.source_fn_stack,
                torch_fn_type=None if fn is None else fn[1],
                custom=prov.custom,
            )
            self._locs.append(self._locations.setdefault(where, len(self._locations)))
            self._any_prov = True
        return node

    def extend(self, entries: Iterable[tuple[Node, ValueMeta | None, Provenance | None]]) -> None:
        """`add` each ``(node, meta, prov)``, e.g. from `Graph.entries`."""
        for node, meta, prov in entries:
            self.add(node, meta, prov)

    def build(self, subgraphs: Iterable[Subgraph] = ()) -> Graph:
        """The Graph of the nodes added so far (provenance None when no node has any)."""
        provenance = None
        if self._any_prov:
            provenance = ProvenanceTable(
                debug_handle=tuple(self._handles),
                ancestor=tuple(self._ancestors),
                torch_fn_name=tuple(self._fn_names),
                location=tuple(self._locs),
                locations=tuple(self._locations),
            )
        return Graph(
            nodes=tuple(self._nodes), metas=tuple(self._metas), provenance=provenance, subgraphs=tuple(subgraphs)
        )


def build_graph(
    entries: Iterable[tuple[Node, ValueMeta | None, Provenance | None]], subgraphs: Iterable[Subgraph] = ()
) -> Graph:
    """A Graph of ``(node, meta, prov)`` entries (see `GraphBuilder`)."""
    builder = GraphBuilder()
    builder.extend(entries)
    return builder.build(subgraphs)
