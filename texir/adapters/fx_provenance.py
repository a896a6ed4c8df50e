"""A converted node's provenance (texir.adapters.fx_import): ExecuTorch's debug handles, numbered as
its DebugHandleGeneratorPass numbers them, module and source-function stacks with stable keys, and
`meta["custom"]` as JSON."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import torch
import torch.fx
from torch._ops import HigherOrderOperator, OpOverload
from torch.fx.traceback import NodeSource, NodeSourceAction

from texir.adapters import delegate_op
from texir.adapters.targets import canonical_target
from texir.errors import ConversionError
from texir.ir import types as ir

__all__ = ["CustomMetaError", "FxProvenance", "created_from", "getattr_path"]


class CustomMetaError(ConversionError):
    """A node's ``meta["custom"]`` holds a value that is not JSON data."""


def created_from(source: torch.fx.Node, pass_name: str) -> NodeSource:
    """What torch's `NodeSource(source, pass_name, CREATE)` records, without deep-copying
    `source`'s own origins (a chain as long as the passes behind it, for every node made): they are
    shared, as nothing changes a recorded origin."""
    made = NodeSource(None, pass_name, NodeSourceAction.CREATE)
    made.node_info = NodeSource.NodeInfo(name=source.name, target=str(source.target), graph_id=id(source.graph))
    made.from_node = list(source.meta.get("from_node", ()))
    return made


def getattr_path(module: torch.nn.Module, target: str) -> Any:
    obj: Any = module
    for part in target.split("."):
        if not hasattr(obj, part):
            raise ConversionError(f"get_attr target {target!r} does not exist on the graph module")
        obj = getattr(obj, part)
    return obj


_STR_OF_CACHE: dict[Any, str] = {}


def _str_of(value: Any) -> str:
    """A stable string for a source_fn / nn_module_stack target (a class, function or string)."""
    if isinstance(value, str):
        return value
    try:
        return _STR_OF_CACHE[value]
    except (KeyError, TypeError):
        pass
    text = _str_of_uncached(value)
    try:
        _STR_OF_CACHE[value] = text
    except TypeError:
        pass
    return text


def _stable_frame_key(key: str, path: str) -> str:
    """Strict export keys nn_module_stack frames by the module's id(), which changes every run:
    such a key becomes the one non-strict export would give the same module (from its path), so
    the same model gives the same bytes."""
    if not key.isdigit():
        return key
    return "L__self__" if not path else "L__self___" + path.replace(".", "_")


def _str_of_uncached(value: Any) -> str:
    if isinstance(value, OpOverload):
        return canonical_target(value) or str(value)
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if module is not None and qualname is not None:
        return f"{module}.{qualname}"
    return str(value)


_TORCH_MARKERS = "_torchdynamo_disable"
"""Keys torch's retrace adds to `meta["custom"]` depending on what the process ran before: dropped."""


def _custom_json(value: Any, node: torch.fx.Node) -> str | None:
    """`meta["custom"]` as JSON text, as torch.export serializes it (json.dumps; None when empty)."""
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if not (isinstance(k, str) and k.startswith(_TORCH_MARKERS))}
        if not value:
            return None
    try:
        return json.dumps(value, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise CustomMetaError(
            f"node {node.name!r} ({node.op} {node.target}): meta['custom'] is not JSON data ({exc}); texir "
            "carries it as JSON, as torch.export's serializer does: store only dicts, lists, strings, numbers, "
            "booleans and None there"
        ) from None


class FxProvenance:
    """The provenance of one conversion's nodes: debug handles numbered once over the whole program
    (nested graphs included), and the caches that make equal module stacks one tuple."""

    def __init__(self) -> None:
        self.handles: dict[torch.fx.Node, tuple[int, str]] = {}
        self.graph_ordinals: dict[int, int] = {}
        self.module_stack_cache: dict[Any, tuple[ir.ModuleFrame, ...]] = {}

    # -- debug handles, numbered as ExecuTorch's DebugHandleGeneratorPass numbers them ---------

    def _ordinal(self, graph_id: int) -> int:
        # torch's graph ids are id() values; renumber them in first-seen order so that the stored
        # ancestor identifiers are the same in every process.
        k = self.graph_ordinals.get(graph_id)
        if k is None:
            k = self.graph_ordinals[graph_id] = len(self.graph_ordinals)
        return k

    def number_debug_handles(self, gm: torch.fx.GraphModule) -> None:
        seen: dict[str, int] = {}
        queue: deque[torch.fx.GraphModule] = deque([gm])
        while queue:
            current = queue.popleft()
            graph_id = id(current.graph)
            for node in current.graph.nodes:
                op = node.op
                if op == "placeholder" or op == "output":
                    continue
                sources = node.meta.get("from_node")
                if sources:
                    source = sources[-1]
                    while source.from_node:
                        source = source.from_node[-1]
                    ancestor = f"{source.name}.{self._ordinal(source.graph_id)}"
                else:
                    ancestor = f"{node.name}.{self._ordinal(graph_id)}"
                handle = seen.get(ancestor)
                if handle is None:
                    handle = seen[ancestor] = len(seen) + 1
                self.handles[node] = (handle, ancestor)
            # Nested graphs follow the graph, in the order their HOP calls name them (for cond:
            # true then false branch), as ExecuTorch's bfs_trace_with_node_process visits them.
            for node in current.graph.nodes:
                if node.op == "call_function" and isinstance(node.target, HigherOrderOperator) \
                        and node.target is not delegate_op.texir_call_delegate:
                    for a in node.args:
                        if isinstance(a, torch.fx.Node) and a.op == "get_attr":
                            sub = getattr_path(current, str(a.target))
                            if isinstance(sub, torch.fx.GraphModule):
                                queue.append(sub)

    # -- provenance --------------------------------------------------------------------------

    def prov(self, node: torch.fx.Node) -> ir.Provenance | None:
        meta = node.meta
        handle = self.handles.get(node)
        stack = meta.get("nn_module_stack")
        frames: tuple[ir.ModuleFrame, ...] = ()
        if stack:
            # torch gives every node its own dict, but a layer's nodes repeat its contents: cache
            # by content (which also makes equal stacks one tuple, cheap for GraphBuilder to intern).
            try:
                key: Any = tuple(stack.items())
                cached = self.module_stack_cache.get(key)
            except TypeError:  # an unhashable entry: convert without caching
                key = cached = None
            if cached is not None:
                frames = cached
            else:
                frames = tuple(
                    ir.ModuleFrame(key=_stable_frame_key(k, v[0]), path=v[0], type=_str_of(v[1]))
                    for k, v in stack.items()
                )
                if key is not None:
                    self.module_stack_cache[key] = frames
        source_fn = meta.get("source_fn_stack")
        sources: tuple[ir.SourceFn, ...] = ()
        if source_fn:
            sources = tuple(ir.SourceFn(name=s[0], target=_str_of(s[1])) for s in source_fn)
        torch_fn = meta.get("torch_fn")
        stack_trace = meta.get("stack_trace")
        custom_text = None if (custom := meta.get("custom")) is None else _custom_json(custom, node)
        if handle is None and not frames and not sources and torch_fn is None and stack_trace is None \
                and custom_text is None:
            return None
        return ir.Provenance(
            debug_handle=handle[0] if handle else None,
            ancestor=handle[1] if handle else None,
            stack_trace=stack_trace,
            nn_module_stack=frames,
            source_fn_stack=sources,
            torch_fn=(str(torch_fn[0]), str(torch_fn[1])) if torch_fn else None,
            custom=custom_text,
        )
