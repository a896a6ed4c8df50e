"""Recompute the strides of values downstream of changed ones, as ExecuTorch gets them by retracing.

A rewrite that changes a value's layout (a view becoming its contiguous `*_copy` variant) leaves
stale strides on the ops that read it: an elementwise op on a permuted view has permuted strides,
on its copy contiguous ones. Backends and the emitter read the layout, so this runs each affected
op on fake tensors built from the new metadata and keeps the strides torch computes. Only nodes
that (transitively) read a changed value are run; shapes and dtypes are kept as they are."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import torch

from texir import ir
from texir.adapters.fx_export import _ToFx
from texir.adapters.targets import resolve_target
from texir.adapters.tensors import tensor_meta_from_tensor
from texir.ir.builder import GraphBuilder
from texir.ir.analysis import iter_refs
from texir.ir.names import GETITEM

__all__ = ["refresh_strides"]


def refresh_strides(program: ir.Program, changed: Iterable[str]) -> ir.Program:
    """`program` with strides recomputed for the nodes that read, directly or through others, a
    value named in `changed` (in any graph; nested graphs are refreshed from their own changed
    values). A node whose op cannot run on fake tensors keeps its metadata. Pure."""
    seeds = frozenset(changed)
    if not seeds:
        return program
    conv = _ToFx(program)
    graph = _refresh_graph(conv, program.graph, seeds)
    return program if graph is program.graph else msgspec.structs.replace(program, graph=graph)


def _refresh_graph(conv: _ToFx, graph: ir.Graph, seeds: frozenset[str]) -> ir.Graph:
    subgraphs = tuple(
        s if (g := _refresh_graph(conv, s.graph, seeds)) is s.graph else msgspec.structs.replace(s, graph=g)
        for s in graph.subgraphs
    )
    dirty = {n.name for n in graph.nodes if n.name in seeds}
    entries = graph.entries()
    metas: dict[str, ir.ValueMeta | None] = {n.name: m for n, m, _ in entries}
    changed = False
    out = []
    for node, meta, prov in entries:
        if isinstance(node, ir.CallFunction) and node.name not in seeds and any(
            r in dirty for a in (*node.args, *(v for _, v in node.kwargs)) for r in iter_refs(a)
        ):
            new_meta = _recompute(conv, node, meta, metas)
            if new_meta != meta:
                dirty.add(node.name)
                metas[node.name] = new_meta
                meta = new_meta
                changed = True
        out.append((node, meta, prov))
    if not changed and subgraphs == graph.subgraphs:
        return graph
    builder = GraphBuilder()
    builder.extend(out)
    return builder.build(subgraphs)


def _recompute(
    conv: _ToFx, node: ir.CallFunction, meta: ir.ValueMeta | None, metas: dict[str, ir.ValueMeta | None]
) -> ir.ValueMeta | None:
    if node.target == GETITEM:
        source = node.args[0] if node.args else None
        index = node.args[1] if len(node.args) > 1 else None
        parent = metas.get(source.name) if isinstance(source, ir.Ref) else None
        if isinstance(parent, ir.TupleMeta) and isinstance(index, ir.IntArg) and 0 <= index.value < len(parent.items):
            return _strides_from(meta, parent.items[index.value])
        return meta
    if "::" not in node.target or node.target.startswith(("higher_order::", "texir::")):
        return meta
    env: dict[str, object] = {}
    for a in (*node.args, *(v for _, v in node.kwargs)):
        for name in iter_refs(a):
            m = metas.get(name)
            if isinstance(m, ir.TensorMeta):
                env[name] = conv.fake(m)
            elif isinstance(m, ir.TupleMeta) and all(isinstance(i, ir.TensorMeta) for i in m.items):
                env[name] = [conv.fake(i) for i in m.items]  # type: ignore[arg-type]  # checked just above
            else:
                return meta  # a symbolic scalar or an opaque value: leave the node as it is
    try:
        with conv.fake_mode:
            args = [conv.arg(a, env) for a in node.args]  # type: ignore[arg-type]  # fakes stand in for fx nodes
            kwargs = {k: conv.arg(v, env) for k, v in node.kwargs}  # type: ignore[arg-type]  # as above
            result = resolve_target(node.target)(*args, **kwargs)
    except Exception:  # an op with no fake kernel keeps the metadata it came with
        return meta
    return _strides_from(meta, _meta_of(result, meta))


def _meta_of(value: object, old: ir.ValueMeta | None) -> ir.ValueMeta | None:
    if isinstance(value, torch.Tensor):
        return tensor_meta_from_tensor(value)
    if isinstance(value, (tuple, list)) and isinstance(old, ir.TupleMeta) and len(value) == len(old.items):
        return msgspec.structs.replace(old, items=tuple(_meta_of(v, o) or o for v, o in zip(value, old.items)))
    return old


def _strides_from(old: ir.ValueMeta | None, new: ir.ValueMeta | None) -> ir.ValueMeta | None:
    """`old` with the strides (and storage offset) of `new`, where both describe the same tensors."""
    if isinstance(old, ir.TensorMeta) and isinstance(new, ir.TensorMeta):
        if len(old.shape) != len(new.strides) or (old.strides, old.storage_offset) == (new.strides, new.storage_offset):
            return old
        return msgspec.structs.replace(old, strides=new.strides, storage_offset=new.storage_offset)
    if isinstance(old, ir.TupleMeta) and isinstance(new, ir.TupleMeta) and len(old.items) == len(new.items):
        items = tuple(_strides_from(o, n) or o for o, n in zip(old.items, new.items))
        return old if items == old.items else msgspec.structs.replace(old, items=items)
    return old
