"""The strides of values downstream of re-laid-out ones, without torch.

When `replace_view_ops` turns a view into its contiguous `*_copy` variant, the ops that read it keep
the strides torch gave them for the view: an add of two permuted views is permuted, of their copies
not. ExecuTorch recomputes them by retracing. texir recomputes them where shape and the inputs'
layouts determine them: an op whose tensor inputs are all contiguous (row-major, dim order 0..n-1)
and that takes no layout argument writes contiguous results, as every ATen kernel does. Where
they do not (an input still non-contiguous, a `memory_format` argument, a strided factory), the
node keeps the metadata it came with. Only nodes that (transitively) read a changed value are
visited; shapes and dtypes are never changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import msgspec

from texir.ir.analysis import iter_refs
from texir.ir.builder import GraphBuilder
from texir.ir.names import GETITEM
from texir.ir.types import CallFunction, Dim, Graph, IntArg, NoneArg, Program, Ref, TensorMeta, TupleMeta, ValueMeta

__all__ = ["contiguous_strides", "refresh_strides"]

# Ops whose result layout an argument or the op itself chooses, whatever the inputs' layouts.
_LAYOUT_CHOOSERS = frozenset({
    "aten::empty_strided.default", "aten::new_empty_strided.default", "aten::as_strided.default",
    "aten::as_strided_copy.default", "aten::as_strided_scatter.default",
})
_LAYOUT_ARGS = frozenset({"memory_format", "dim_order"})


def contiguous_strides(shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Row-major strides of `shape`; symbolic sizes give sympy-printed products, as torch writes them."""
    if all(isinstance(d, int) for d in shape):
        out: list[Dim] = []
        step = 1
        for d in reversed(shape):
            out.append(step)
            step *= max(int(d), 1)
        return tuple(reversed(out))
    return _symbolic_strides(shape)


@lru_cache(maxsize=4096)  # sympy is slow, and a model repeats its few symbolic shapes in every layer
def _symbolic_strides(shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    import sympy  # type: ignore[import-untyped]  # sympy ships no type information; imported only for symbolic shapes

    sym_out: list[Dim] = []
    acc = sympy.Integer(1)
    for d in reversed(shape):
        sym_out.append(int(acc) if acc.is_Integer else str(acc))
        acc = acc * (sympy.Integer(d) if isinstance(d, int) else sympy.sympify(d))
    return tuple(reversed(sym_out))


def refresh_strides(program: Program, changed: Iterable[str]) -> Program:
    """`program` with strides recomputed (see the module docstring) for the nodes that read, directly
    or through others, a value named in `changed`, in any graph. Pure."""
    seeds = frozenset(changed)
    if not seeds:
        return program
    graph = _refresh_graph(program.graph, seeds)
    return program if graph is program.graph else msgspec.structs.replace(program, graph=graph)


def _refresh_graph(graph: Graph, seeds: frozenset[str]) -> Graph:
    subgraphs = tuple(
        s if (g := _refresh_graph(s.graph, seeds)) is s.graph else msgspec.structs.replace(s, graph=g)
        for s in graph.subgraphs
    )
    dirty = {n.name for n in graph.nodes if n.name in seeds}
    entries = graph.entries()
    metas: dict[str, ValueMeta | None] = {n.name: m for n, m, _ in entries}
    changed = False
    out = []
    for node, meta, prov in entries:
        if isinstance(node, CallFunction) and node.name not in seeds and any(
            r in dirty for a in (*node.args, *(v for _, v in node.kwargs)) for r in iter_refs(a)
        ):
            new_meta = _recompute(node, meta, metas)
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


def _is_contiguous(meta: TensorMeta) -> bool:
    return meta.storage_offset == 0 and meta.strides == contiguous_strides(meta.shape)


def _recompute(node: CallFunction, meta: ValueMeta | None, metas: dict[str, ValueMeta | None]) -> ValueMeta | None:
    if node.target == GETITEM:
        source = node.args[0] if node.args else None
        index = node.args[1] if len(node.args) > 1 else None
        parent = metas.get(source.name) if isinstance(source, Ref) else None
        if isinstance(parent, TupleMeta) and isinstance(index, IntArg) and 0 <= index.value < len(parent.items):
            return _strides_from(meta, parent.items[index.value])
        return meta
    if "::" not in node.target or node.target.startswith(("higher_order::", "texir::")):
        return meta
    if node.target in _LAYOUT_CHOOSERS or any(k in _LAYOUT_ARGS and not isinstance(v, NoneArg) for k, v in node.kwargs):
        return meta
    for a in (*node.args, *(v for _, v in node.kwargs)):
        for name in iter_refs(a):
            m = metas.get(name)
            if not isinstance(m, TensorMeta) or not _is_contiguous(m):
                return meta  # a non-contiguous or non-tensor input: the layout is not ours to tell
    return _contiguous(meta)


def _contiguous(meta: ValueMeta | None) -> ValueMeta | None:
    if isinstance(meta, TensorMeta):
        strides = contiguous_strides(meta.shape)
        if meta.storage_offset == 0 and _same_strides(meta.strides, strides):
            return meta  # already contiguous, maybe spelled as torch wrote it ('5*Max(1, s0)')
        return msgspec.structs.replace(meta, strides=strides, storage_offset=0)
    if isinstance(meta, TupleMeta):
        items = tuple(_contiguous(m) or m for m in meta.items)
        return meta if items == meta.items else msgspec.structs.replace(meta, items=items)
    return meta


def _same_strides(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> bool:
    """Whether two stride tuples are equal, symbolic ones for every size >= 1."""
    return len(a) == len(b) and all(x == y or (isinstance(x, str) or isinstance(y, str)) and _sym_equal(x, y)
                                    for x, y in zip(a, b))


@lru_cache(maxsize=4096)  # as _symbolic_strides: the same few pairs in every layer
def _sym_equal(x: Dim, y: Dim) -> bool:
    import sympy  # imported only for symbolic shapes

    def expr(d: Dim) -> Any:
        e = sympy.sympify(d)
        if not isinstance(e, sympy.Basic):
            raise TypeError(f"{d!r} is not a size expression")
        return e.subs({s: sympy.Symbol(s.name, integer=True, positive=True) for s in e.free_symbols})

    try:
        return bool(sympy.simplify(expr(x) - expr(y)) == 0)
    except (sympy.SympifyError, TypeError):
        return False


def _strides_from(old: ValueMeta | None, new: ValueMeta | None) -> ValueMeta | None:
    """`old` with the strides (and storage offset) of `new`, where both describe the same tensors."""
    if isinstance(old, TensorMeta) and isinstance(new, TensorMeta):
        if len(old.shape) != len(new.strides) or (old.strides, old.storage_offset) == (new.strides, new.storage_offset):
            return old
        return msgspec.structs.replace(old, strides=new.strides, storage_offset=new.storage_offset)
    if isinstance(old, TupleMeta) and isinstance(new, TupleMeta) and len(old.items) == len(new.items):
        items = tuple(_strides_from(o, n) or o for o, n in zip(old.items, new.items))
        return old if items == old.items else msgspec.structs.replace(old, items=items)
    return old
