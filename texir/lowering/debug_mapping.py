"""DelegateMappingBuilder: backends record which IR debug handles each backend-side op implements."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Union

from texir.errors import LoweringError
from texir.ir import DebugHandleEntry, Graph, Node

Identifier = Union[int, str]


class DelegateMappingError(LoweringError):
    """A delegate debug mapping entry is malformed (identifier rules, missing debug handles)."""


class MissingDebugHandleError(DelegateMappingError):
    """A node passed to `DelegateMappingBuilder` carries no debug handle."""


def _node_handle(node: Node, handles: Mapping[str, int | None] | None) -> int:
    if handles is None:
        raise DelegateMappingError(
            f"node {node.name!r} given to a builder built without a graph; build it with "
            "DelegateMappingBuilder(graph=program.graph), or pass handles="
        )
    if node.name not in handles:
        raise DelegateMappingError(
            f"node {node.name!r} is not a node of the builder's graph; map nodes of the delegated program's graph"
        )
    handle = handles[node.name]
    if handle is None:
        raise MissingDebugHandleError(
            f"node {node.name!r} ({type(node).__name__}) has no debug handle; map only call_function nodes "
            "converted by texir.adapters (which numbers them as ExecuTorch does), or pass handles="
        )
    return handle


class DelegateMappingBuilder:
    """Builds a delegate's debug handle map: backend identifier -> debug handles of IR nodes.

    With ``generated_identifiers=True`` identifiers are 0, 1, 2, ... in insertion order and may not be
    given; otherwise every entry must name a fresh identifier (int or str). Exactly one of ``nodes``
    and ``handles`` is given per entry; ``nodes`` must be nodes of `graph` (the delegated program's
    graph, which holds their debug handles). As in ExecuTorch, ``None`` among raw ``handles`` is skipped
    and an entry left with no handle is an error; unlike ExecuTorch, a *node* without a debug handle
    is an error naming it (silently dropping it hides a broken adapter).
    """

    def __init__(self, *, graph: Graph | None = None, generated_identifiers: bool = False) -> None:
        self._generated = generated_identifiers
        self._handles: dict[str, int | None] | None = None
        if graph is not None:
            self._handles = {node.name: handle for node, handle in zip(graph.nodes, graph.debug_handles())}
        self._entries: dict[Identifier, frozenset[int]] = {}
        self._next_index = 0

    @property
    def generated_identifiers(self) -> bool:
        return self._generated

    def insert_delegate_mapping_entry(
        self,
        nodes: Node | Sequence[Node] | None = None,
        handles: int | Iterable[int | None] | None = None,
        identifier: Identifier | None = None,
    ) -> Identifier:
        """Add one entry and return its identifier (the generated one, or `identifier`)."""
        if self._generated and identifier is not None:
            raise DelegateMappingError(
                f"identifier {identifier!r} given to a builder with generated identifiers; "
                "omit identifier=, or build with generated_identifiers=False"
            )
        if not self._generated and identifier is None:
            raise DelegateMappingError(
                "no identifier given to a builder with explicit identifiers; pass identifier=, "
                "or build with generated_identifiers=True"
            )
        if isinstance(identifier, bool) or (
            identifier is not None and not isinstance(identifier, (int, str))
        ):
            raise DelegateMappingError(
                f"delegate debug identifier {identifier!r} must be an int or a str"
            )
        if identifier is not None and identifier in self._entries:
            raise DelegateMappingError(
                f"delegate debug identifier {identifier!r} was already inserted; identifiers must be unique"
            )
        if (nodes is None) == (handles is None):
            raise DelegateMappingError(
                "give exactly one of nodes= and handles= per delegate mapping entry"
            )

        collected: set[int] = set()
        if nodes is not None:
            node_list: Sequence[Node] = nodes if isinstance(nodes, (list, tuple)) else (nodes,)
            for node in node_list:
                collected.add(_node_handle(node, self._handles))
        elif handles is not None:
            raw: Iterable[int | None] = (handles,) if isinstance(handles, int) else handles
            for handle in raw:
                if handle is None:
                    continue
                if isinstance(handle, bool) or not isinstance(handle, int):
                    raise DelegateMappingError(f"debug handle {handle!r} must be an int")
                collected.add(handle)
        if not collected:
            raise DelegateMappingError(
                "no valid debug handles for this delegate mapping entry; pass at least one "
                "node or handle"
            )

        if identifier is None:
            identifier = self._next_index
            self._next_index += 1
        self._entries[identifier] = frozenset(collected)
        return identifier

    def get_delegate_mapping(self) -> tuple[DebugHandleEntry, ...]:
        """Entries in insertion order, each with its debug handles sorted ascending."""
        return tuple(
            DebugHandleEntry(identifier=ident, debug_handles=tuple(sorted(handles)))
            for ident, handles in self._entries.items()
        )

    def __len__(self) -> int:
        return len(self._entries)
