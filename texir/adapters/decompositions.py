"""The decomposition table ExecuTorch's edge lowering uses: torch's core-ATen table, plus the ops
to_edge also decomposes, minus the quantization primitives it keeps (exir.tracer's
_default_decomposition_table in ExecuTorch 1.5.1)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

import torch
from torch._decomp import _core_aten_decompositions_post_autograd, get_decompositions
from torch._export.utils import _get_decomp_for_cia, _is_preservable_cia_op, _special_op_to_preserve_cia
from torch._ops import OpOverload, OpOverloadPacket
from torch.export._trace import _ignore_backend_decomps
from torch.export.decomp_utils import PRESERVED_ATEN_CIA_OPS
from torch.export.exported_program import _override_composite_implicit_decomp
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from texir.adapters.targets import canonical_target, resolve_target
from texir.adapters.torch_patches import run_decompositions
from texir.errors import UnsupportedError
from texir.ir import CallFunction, Program

__all__ = [
    "KeptWhole",
    "EXTRA_EDGE_DECOMPOSITIONS",
    "KEPT_NAMESPACES",
    "as_the_retrace_decomposes",
    "decompose_nodes",
    "edge_decomposition_table",
    "functional_names",
    "functional_overload",
    "functionalize",
    "lazy_edge_decomposition_table",
    "functionally_decomposed_ops",
    "graph_modules",
    "has_subclass_state",
    "must_decompose_functionally",
    "preservable_composite",
]

EXTRA_EDGE_DECOMPOSITIONS: tuple[str, ...] = ("aten::linalg_vector_norm.default",)
"""Ops torch's core-ATen table keeps but ExecuTorch's runtime has no kernel for, which to_edge
decomposes (ExecuTorch 1.5.1: linalg_vector_norm)."""

KEPT_NAMESPACES: frozenset[str] = frozenset({"quantized_decomposed", "torchao"})
"""Quantize/dequantize primitives stay whole: backends match them as patterns."""


def _op(name: str) -> OpOverload:
    found = resolve_target(name)  # raises UnsupportedError naming an unknown op
    if not isinstance(found, OpOverload):
        raise UnsupportedError(f"{name!r} is not an ATen operator overload; spell it like 'aten::linear.default'")
    return found


@functools.cache
def _table() -> dict[OpOverload | OpOverloadPacket, Callable[..., Any]]:
    table: dict[Any, Callable[..., Any]] = dict(torch.export.default_decompositions())
    table.update(get_decompositions([_op(n) for n in EXTRA_EDGE_DECOMPOSITIONS]))
    for op in list(table):
        if getattr(op, "namespace", None) in KEPT_NAMESPACES:
            del table[op]
    return table


def edge_decomposition_table(keep: Iterable[str] = ()) -> dict[OpOverload | OpOverloadPacket, Callable[..., Any]]:
    """A fresh copy of the table, without the ops named in `keep` (canonical names such as
    ``aten::linear.default``: what a partitioner asks not to decompose)."""
    table = dict(_table())
    for name in keep:
        table.pop(_op(name), None)
    return table


class _LazyEdgeTable(Mapping[Any, Callable[..., Any]]):
    """The entries of `edge_decomposition_table(keep)` one op at a time, for lookups (`get`, `in`)
    only: torch's table lists every composite op of every namespace, which costs a fresh process
    about 0.1 s to collect; an op here is looked up when a program asks for it (and remembered)."""

    def __init__(self, keep: Iterable[str]) -> None:
        self._kept = frozenset(_op(name) for name in keep)

    def __getitem__(self, op: Any) -> Callable[..., Any]:
        found = None if op in self._kept else _edge_entry(op)
        if found is None:
            raise KeyError(op)
        return found

    def __iter__(self) -> Iterator[Any]:
        return (op for op in edge_decomposition_table() if op not in self._kept)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@functools.cache
def _core_and_extra() -> dict[Any, Callable[..., Any]]:
    table: dict[Any, Callable[..., Any]] = dict(_core_aten_decompositions_post_autograd())
    table.update(get_decompositions([_op(n) for n in EXTRA_EDGE_DECOMPOSITIONS]))
    return table


_entries: dict[Any, Callable[..., Any] | None] = {}


def _edge_entry(op: Any) -> Callable[..., Any] | None:
    """`op`'s entry in the edge table, decided as torch's `default_decompositions` decides it: the
    core-ATen table's, else a composite op's own kernel (any namespace) unless torch preserves it,
    none for the quantization namespaces; remembered per process, as `_table` is."""
    if op in _entries:
        return _entries[op]
    found: Callable[..., Any] | None = None
    if getattr(op, "namespace", None) not in KEPT_NAMESPACES:
        found = _core_and_extra().get(op)
        if found is None and isinstance(op, OpOverload) and op not in PRESERVED_ATEN_CIA_OPS and _is_preservable_cia_op(op):
            found = _get_decomp_for_cia(op)
    _entries[op] = found
    return found


def lazy_edge_decomposition_table(keep: Iterable[str] = ()) -> Mapping[Any, Callable[..., Any]]:
    """`edge_decomposition_table(keep)` for lookups, without collecting every composite op first."""
    return _LazyEdgeTable(keep)


def preservable_composite(op: OpOverload) -> bool:
    """A CompositeImplicitAutograd op torch's retrace keeps whole (a functional one)."""
    return bool(_is_preservable_cia_op(op))


@contextlib.contextmanager
def as_the_retrace_decomposes(keep: Iterable[str]) -> Iterator[None]:
    """What torch's retrace sets around its trace that changes which ops a decomposition calls:
    oneDNN, NNPACK and cuDNN off (lstm's decomposition asks whether oneDNN is on, not what the CPU
    can do, and then calls `mkldnn_rnn_layer`, which ExecuTorch's runtime has no kernel for, where
    the retrace unrolls the cells), and the composite ops in `keep` kept from their C++ composite
    kernel wherever they are called (each cell of lstm's decomposition calls `F.linear`): they
    reach the recorder, which records them whole, as the retrace's tracer does."""
    shielded: dict[Any, Callable[..., Any]] = {}
    for name in keep:
        op = resolve_target(name)
        if isinstance(op, OpOverload) and preservable_composite(op):
            shielded[op] = _special_op_to_preserve_cia
    with _ignore_backend_decomps():
        if not shielded:
            yield
            return
        # An entry of the edge table is made once per process, from the composite op's kernel at
        # that time: made under the shield, it would keep `shielded` whole for good (torch's
        # retrace too). Nothing inside looks a shielded op up (it is kept), so making theirs first
        # is enough.
        for op in shielded:
            _edge_entry(op)
        with _override_composite_implicit_decomp(shielded):
            yield


def must_decompose_functionally(op: Any) -> bool:
    """Whether `ep.run_decompositions({})` decomposes `op`: a CompositeImplicitAutograd op that torch
    will not preserve (it may alias or mutate, like batch_norm, or is a metadata function); every
    other op it keeps."""
    if not isinstance(op, OpOverload) or op.namespace != "aten":
        return False
    if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):  # type: ignore[no-untyped-call]  # OpOverload.name is untyped
        return False
    return not _is_preservable_cia_op(op)


def functionally_decomposed_ops(program: Program) -> list[str]:
    """The ops of `program` (a texir Program, nested graphs included) that `run_decompositions({})`
    decomposes (`must_decompose_functionally`), by canonical name, sorted."""
    found: set[str] = set()
    pending = [program.graph]
    while pending:
        graph = pending.pop()
        pending.extend(s.graph for s in graph.subgraphs)
        for node in graph.nodes:
            if not isinstance(node, CallFunction) or node.target in found:
                continue
            target = node.target
            try:
                op = resolve_target(target)
            except UnsupportedError:
                continue
            if must_decompose_functionally(op):
                found.add(target)
    return sorted(found)


def functional_overload(op: OpOverload) -> OpOverload | None:
    """The functional twin of an in-place op (`aten::hardtanh_.default` -> `aten::hardtanh.default`):
    same overload, same arguments but for the alias annotations, no mutation. None when there is none."""
    schema = op._schema
    base = schema.name.split("::", 1)[-1]
    if not base.endswith("_") or base.endswith("__"):
        return None
    packet = getattr(getattr(torch.ops, op.namespace, None), base[:-1], None)
    twin = getattr(packet, op._overloadname, None) if packet is not None else None
    if not isinstance(twin, OpOverload) or twin._schema.is_mutable:
        return None
    mine = [(a.name, str(a.type)) for a in schema.arguments]
    theirs = [(a.name, str(a.type)) for a in twin._schema.arguments]
    return twin if mine == theirs else None


def has_subclass_state(ep: torch.export.ExportedProgram) -> bool:
    """Some weight or constant of `ep` is a tensor subclass that wraps other tensors (torchao's
    quantized weights, e.g. IntxUnpackedToInt8Tensor): a retrace (`functionalize`) unwraps it
    into the plain tensors ExecuTorch's programs hold."""
    return any(
        is_traceable_wrapper_subclass(value)
        for table in (ep.state_dict, ep.constants) for value in table.values()
        if isinstance(value, torch.Tensor)
    )


def functional_names(ep: torch.export.ExportedProgram) -> dict[str, str] | None:
    """The in-place ops of `ep` mapped to their functional twins, by canonical name (empty when
    `ep` mutates nothing); None when some mutating op has no plain twin (an out= variant, a
    custom op), so only retracing (`functionalize`) shows the functional program.

    What a partitioner's `ops_to_not_decompose` sees is a question of op names: a program with
    `hardswish_` renamed to `hardswish` answers it as the functionalized program would, without
    the retrace ExecuTorch pays for it."""
    if has_subclass_state(ep):
        return None
    names: dict[str, str] = {}
    for module in ep.graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            target = node.target
            if node.op != "call_function" or not isinstance(target, OpOverload) or not target._schema.is_mutable:
                continue
            twin = functional_overload(target)
            if twin is None:
                return None
            names[f"{target._schema.name}.{target._overloadname}"] = f"{twin._schema.name}.{twin._overloadname}"
    return names


def functionalize(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """`ep.run_decompositions({})`, what ExecuTorch's to_edge_transform_and_lower runs before it asks
    partitioners which ops to keep: in-place and out= ops replaced by their functional forms,
    tensor-subclass weights (torchao's quantized tensors) unwrapped into the plain tensors they
    hold, the composites torch does not preserve (contiguous, reshape) run through their kernels.
    `texir.adapters.local_decompose.functional_program` gives the same without the retrace where
    it can."""
    return run_decompositions(ep, {})


def graph_modules(gm: torch.fx.GraphModule, prefix: str = "") -> list[tuple[str, torch.fx.GraphModule]]:
    """`gm` and the graphs nested under it (cond/map branches), keyed like texir node keys
    ('' for the top graph, 'true_graph_0', 'a/b')."""
    found = [(prefix, gm)]
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            sub = getattr(gm, str(node.target), None)
            if isinstance(sub, torch.fx.GraphModule):
                found += graph_modules(sub, f"{prefix}/{node.target}" if prefix else str(node.target))
    return found


_SHIELD_NAMESPACE = "texir_keep"
_shields: dict[OpOverload, OpOverload | None] = {}
_shield_library: list[torch.library.Library] = []


def _shield(op: OpOverload) -> OpOverload | None:
    """A twin of `op` in the ``texir_keep`` namespace, with `op`'s schema and `op` as its kernel
    (CompositeExplicitAutograd), which no decomposition table names: a node retargeted to it
    survives a decomposition retrace unchanged. None for ops whose outputs alias or mutate their
    inputs (a twin could not say so truthfully) and for non-ATen schemas it cannot copy."""
    if op in _shields:
        return _shields[op]
    schema = op._schema
    twin: OpOverload | None = None
    if not schema.is_mutable and all(r.alias_info is None for r in schema.returns) and "::" in schema.name:
        namespace, base = schema.name.split("::", 1)
        name = base if namespace == "aten" else f"{namespace}_{base}"
        if not _shield_library:
            library = torch.library.Library(_SHIELD_NAMESPACE, "DEF")  # type: ignore[no-untyped-call]  # torch.library is unannotated
            _shield_library.append(library)
        library = _shield_library[0]
        signature = str(schema).split("::", 1)[1]
        overload = f"{name}.{schema.overload_name}" if schema.overload_name else name
        try:
            library.define(name + signature[len(base):])  # type: ignore[no-untyped-call]  # unannotated in torch
            library.impl(overload, op, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]  # unannotated in torch
            packet = getattr(getattr(torch.ops, _SHIELD_NAMESPACE), name)
            twin = getattr(packet, schema.overload_name or "default")
        except (RuntimeError, AttributeError):  # a schema torch.library will not copy: keep the op whole
            twin = None
    _shields[op] = twin
    return twin


def decompose_nodes(
    ep: torch.export.ExportedProgram, nodes: Iterable[str], keep: Iterable[str]
) -> torch.export.ExportedProgram:
    """`ep`, already decomposed keeping the ops named in `keep`, with the nodes named in `nodes`
    (node keys, 'sub/name' inside nested graphs) decomposed too, as ExecuTorch does with the nodes a
    partitioner's node filter turns down: every other node of a kept op is shielded (retargeted to
    its `_shield` twin) for one more decomposition retrace and given its op back after it. Kept
    ops that cannot be shielded stay kept as a whole. `ep` is changed while this runs and restored."""
    wanted = set(nodes)
    kept = {_op(name) for name in keep}
    unshielded: set[str] = set()
    shielded: list[tuple[torch.fx.Node, OpOverload]] = []
    for path, gm in graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            target = node.target
            if node.op != "call_function" or target not in kept:
                continue
            if ("/".join((path, node.name)) if path else node.name) in wanted:
                continue
            twin = _shield(cast(OpOverload, target))  # members of `kept` are overloads
            if twin is None:
                unshielded.add(str(canonical_target(target)))
                continue
            node.target = twin
            shielded.append((node, target))
    try:
        decomposed = run_decompositions(ep, edge_decomposition_table(unshielded))
    finally:
        for node, target in shielded:
            node.target = target
    originals = {twin: op for op, twin in _shields.items() if twin is not None}
    for _, gm in graph_modules(decomposed.graph_module):
        changed = False
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in originals:
                node.target = originals[node.target]
                changed = True
        if changed:
            gm.recompile()
    return decomposed


class KeptWhole:
    """Which ops a node-by-node decomposition records as they are (`texir.adapters.local_decompose`),
    remembered per op: those named in `kept` (with `functional_only`, every composite op torch
    may preserve, as `run_decompositions({})` keeps them), and a functional composite op `table`
    does not name, which the retrace keeps whole (`upsample_nearest2d.vec`) wherever it is called
    where running its composite kernel would not."""

    def __init__(self, table: Mapping[Any, Any], kept: set[str], *, functional_only: bool = False) -> None:
        self.table = table
        self.kept = kept
        self.functional_only = functional_only
        self.found: dict[OpOverload, bool] = {}

    def __call__(self, func: OpOverload) -> bool:
        found = self.found.get(func)
        if found is None:
            if self.functional_only:
                found = not must_decompose_functionally(func)
            else:
                found = canonical_target(func) in self.kept
            found = self.found[func] = found or (func not in self.table and preservable_composite(func))
        return found
