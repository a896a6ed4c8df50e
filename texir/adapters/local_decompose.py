"""Decomposing an ExportedProgram without torch's retrace, where nothing needs functionalizing.

torch's `run_decompositions` retraces the whole program (functionalization, and fake-tensor
propagation twice over, into a new graph): 2-7 ms a node, the largest share of texir's own time
when lowering a small model. Most programs a partitioner is shown mutate nothing but in-place
activations on values nothing else reads. For those, this module runs each node's decomposition
itself: the same table entries (or the op's C++ composite kernel) on the program's fake tensors,
under a dispatch mode that records every op reaching it as a new node, named and annotated as the
retrace names them (the op's name, numbered in one namespace; every result of a multi-result op
given a `getitem`, used or not; the decomposed node's stack, module path and origin copied on).
The program converted to texir's IR equals the retraced one: tests/test_local_decompose.py checks
it on every zoo model where this applies, against torch's own result.

Where the retrace and a direct run would part, this follows the retrace: a functional composite op
the table does not name (`upsample_nearest2d.vec`) is kept whole, as export keeps it, not run
through its composite kernel; an `alias` a decomposition makes of an earlier value (`t` of a 1-D
tensor, `detach`) stays a node, and only one of a tensor the same decomposition made disappears; an
in-place `detach_` leaves no node; a kept node export wrote with keywords (`_assert_tensor_metadata`)
gets the dispatcher's positional form.

A functional program whose signature updates buffers (a static KV cache after
`run_decompositions({})`) is rewritten too, and one with dynamic shapes when other node names are
fine (`exact_names=False`; `texir.adapters.symbolic_sizes`: the retrace numbers the SymInt
arithmetic of its tracing and drops it, so its names skip numbers these do not). Making a language
model's export functional (`functional_only`) is done the same way (`texir.adapters.buffer_writes`):
a `wrap_with_set_grad_enabled(False)` region inlined, each in-place write of a whole buffer
(`index_copy_`, `copy_`, `add_`) its functional twin and a `BUFFER_MUTATION` output, a view of a
written buffer made where it is read, as its reader's node.

Anything it cannot do that way answers None (saying why) and the caller retraces: an in-place
write of an input, of a view of a buffer (`cache[:, :n].copy_(x)`: a `slice_scatter` there) or,
outside `functional_only`, of a buffer; a buffer's value (or a view of it) read after a write
replaced it; an in-place op on a value something else reads or on a view, a view of a value such an
op wrote (functionalization replays it where it is read: a node named and attributed to its
reader), in-place ops that functionalization rewrites specially (`resize_`), nested graphs other
than no-grad regions, SymInt arithmetic, tensor-subclass weights, tensor constants made inside a
decomposition, `lift_fresh_copy` inside a decomposition, ops returning neither tensors nor nothing.
tests/test_opinfo_differential.py checks the result against ExecuTorch's `to_edge` over torch's
operator database; tests/test_llm_local_decompose.py the Llama's `.pte` and `.ptd` bytes against the
retrace's, both steps."""

from __future__ import annotations

import dataclasses
import keyword
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._export.verifier import Verifier
from torch._guards import detect_fake_mode
from torch._ops import OpOverload
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, OutputKind, OutputSpec, TensorArgument
from torch.utils._python_dispatch import TorchDispatchMode, autograd_would_have_decomposed

from texir.adapters.buffer_writes import BufferWrites, LazyView, NeedsRetrace as _Retrace, in_place_twin, inline_region
from texir.adapters.buffer_writes import invisible_twin, retrace_inputs, weight_meta
from texir.adapters.dispatch_free import known_value, passes_again, plain_op
from texir.adapters.fake_memo import detached, fake_result
from texir.adapters.fx_export import rebuilt_exported
from texir.adapters.op_args import leaves, map_leaves
from texir.adapters.decompositions import KeptWhole, as_the_retrace_decomposes, has_subclass_state
from texir.adapters.decompositions import lazy_edge_decomposition_table
from texir.adapters.fx_provenance import created_from
from texir.adapters.node_replay import _SHAPE_FREE, Tape, decomposed as _decomposed
from texir.adapters.fx_signature import output_items, signature_outputs
from texir.adapters.symbolic_sizes import SYM_SIZE, SizeNodes, SizeOf
from texir.adapters.targets import canonical_target, dispatch_form, resolve_target
from texir.adapters.torch_patches import run_decompositions

__all__ = ["decompose_locally", "functional_program"]

_COPIED_META = ("stack_trace", "nn_module_stack", "torch_fn", "source_fn_stack", "custom")
"""What texir's IR reads of a node's metadata besides its value and origin (`from_node`); the
retrace copies these from the node it decomposes onto every node it creates for it."""

_METADATA_OPS = frozenset({torch.ops.aten.size.default, torch.ops.aten.stride.default, torch.ops.aten.storage_offset.default})

_ALIAS, _LIFT_FRESH_COPY, _COPY = torch.ops.aten.alias.default, torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.copy.default

_FUNCTIONALIZED = frozenset({_ALIAS, torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default})
"""Ops the retrace's functionalization drops or rewrites depending on where they come from."""
_NOT_PLAIN = _FUNCTIONALIZED | _METADATA_OPS

_SPECIAL_FUNCTIONALIZATION = frozenset({"resize_", "resize_as_", "set_", "_resize_output_"})
"""In-place ops functionalization does not replace by their functional twins (`resize_` becomes
`as_strided` there, not `resize`, which ExecuTorch's runtime has no kernel for)."""

_DETACH_ = torch.ops.aten.detach_.default
"""An in-place detach: functionalization drops it (the value is its input's), whereas its functional
twin `detach` stays a node (or becomes `alias` in the edge decomposition)."""

_SET_GRAD = torch.ops.higher_order.wrap_with_set_grad_enabled
"""A no-grad region (a rotary embedding's): the retrace inlines it."""


class _Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's TorchDispatchMode is untyped
    """Records the ATen ops a decomposition calls as nodes of `graph`, values as fake tensors."""

    def __init__(
        self, table: Mapping[Any, Callable[..., Any]], kept: set[str], fake_mode: Any, *, functional_only: bool = False
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's TorchDispatchMode is untyped
        self.table = table
        self.functional_only = functional_only
        self.whole = KeptWhole(table, kept, functional_only=functional_only)  # ops recorded as they are
        self.fake_mode = fake_mode
        self.graph = torch.fx.Graph()
        self.nodes: dict[int, torch.fx.Node] = {}  # id(fake tensor) -> the node it is the value of
        self.alive: list[Any] = []  # keeps those tensors alive, so their ids stay theirs
        self.source: torch.fx.Node | None = None
        self.fresh: set[int] = set()  # ids of the tensors the current node's decomposition made
        self.inputs: dict[torch.fx.Node, Any] = {}  # weights' values without autograd state
        self.written: set[int] = set()  # ids of the values in-place ops (made functional) wrote
        self.sizes = SizeNodes(self.graph, self.annotate)  # which node gives each symbolic size
        self.buffers = BufferWrites(())  # each buffer's value so far (in-place writes made functional)
        self.lazy: dict[int, LazyView] = {}  # views of buffers' new values, made where read
        self.tape: Tape | None = None  # the ops the node being decomposed makes, while recorded
        self.memo: dict[Any, Tape] | None = {}  # node_key -> a decomposition's recording; None: none kept
        self.context = (functional_only, frozenset(kept))  # what else a recording depends on (node_replay)
        self.replayed: list[str] = []  # the program's nodes whose decomposition was replayed
        self.elide_dead = False  # replays only name the nodes nothing reads (the graph's dead code is removed)

    def bind(self, value: Any, node: torch.fx.Node) -> None:
        self.nodes[id(value)] = node
        self.alive.append(value)

    def sym_node_of(self, size: torch.SymInt) -> torch.fx.Node | int:
        found = self.sizes.node_of(size)
        if found is None:
            raise _Retrace(f"a size computed inside the program or a decomposition ({size})")
        return found

    def node_of(self, value: Any) -> torch.fx.Node:
        node = self.nodes.get(id(value))
        lazy = self.lazy.pop(id(value), None) if node is None else None
        if lazy is not None:
            if self.tape is not None:
                self.tape.ok = False
            # Read at last: functionalization replays the view here, as its reader's node (the
            # views it first made are dead code)
            self.buffers.check_read(lazy)
            node = self.node_for(lazy.func, lazy.args, lazy.kwargs)
            self.annotate(node, value)
            self.bind(value, node)
        if node is None:
            raise _Retrace("a tensor made inside a decomposition (a constant)")
        return node

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # What torch's tracer (proxy_call) does with an op reaching it, minus functionalization.
        kwargs = kwargs or {}
        if func is torch.ops.prim.device.default:
            return func(*args, **kwargs)
        if not self.whole(func):
            decomposition = self.table.get(func)
            if decomposition is not None:
                with self:
                    return decomposition(*args, **kwargs)
            if func not in _METADATA_OPS and autograd_would_have_decomposed(func, leaves(tuple(args), kwargs)):
                with self:
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
        return self.record(func, args, kwargs)

    def in_place_source(self) -> bool:
        target = self.source.target if self.source is not None else None
        return isinstance(target, OpOverload) and target._schema.is_mutable

    def record(
        self, func: OpOverload, args: Any, kwargs: Any, *, whole: bool = False, known: object = None,
        given: bool = False, live: tuple[bool, ...] | None = None,
    ) -> Any:
        """A node for `func`; `whole` when it is the program's own node, not one of a decomposition;
        `known` its value when the program's node holds it or, with `given`, whatever it is, None too
        (a remembered decomposition's op, an assertion that passes again): no fake-tensor dispatch.
        `live`: which results of a multi-result op anything reads (the others' getitems, which dead
        code elimination would remove, are only named: `elide_dead`)."""
        if self.written and any(r.alias_info is not None for r in func._schema.returns) and any(
            id(a) in self.written for a in leaves(tuple(args), kwargs)
        ):
            # The retrace's functionalization replays such a view where it is read (a new node,
            # named and attributed to its reader: other names and debug handles downstream).
            raise _Retrace(f"{func} views a value an in-place op wrote")
        if func is _ALIAS and not whole and (id(args[0]) in self.fresh or self.in_place_source()):
            # An alias of a tensor the same decomposition made (factories' new_ones, zeros_like),
            # or one an in-place op's decomposition makes (detach_), leaves no node after the
            # retrace's functionalization: the value is the aliased tensor's. (Nothing here
            # mutates, so sharing the node is exact.) An alias of an earlier value (`t` of a 1-D
            # tensor, detach, alias_copy) stays a node, as there.
            with self.fake_mode, torch.no_grad():
                val = func(*args)
            if self.tape is not None:  # (a replay drops it the same way: its input is fresh there too)
                self.tape.note(func, args, kwargs, val, dispatch=True)
            self.bind(val, self.node_of(args[0]))
            self.fresh.add(id(val))  # (an alias of it is dropped too)
            return val
        if func is _LIFT_FRESH_COPY and whole:  # a tensor constant's copy: the retrace gives clone
            func = torch.ops.aten.clone.default
        if func._schema.is_mutable or (func in _FUNCTIONALIZED and func is not _ALIAS and not whole):
            raise _Retrace(f"{func} mutates, or is one functionalization rewrites")
        viewed = self.buffers.viewed(func, args, self.nodes, self.lazy)
        if viewed is not None and self.tape is not None:
            self.tape.ok = False
        if viewed is not None and viewed[1]:  # a view of a buffer's new value: made where it is read
            with self.fake_mode, torch.no_grad():
                val = func(*args, **kwargs)
            self.lazy[id(val)] = LazyView(val, func, args, kwargs)
            self.alive.append(val)
            self.fresh.add(id(val))
            self.buffers.note_view(viewed[0], self.lazy[id(val)])
            return val
        node = self.node_for(func, args, kwargs)
        val = known if known is not None or given else fake_result(func, args, kwargs, self.fake_mode)
        if self.tape is not None:
            self.tape.note(func, args, kwargs, val)
        self.annotate(node, val)
        if viewed is not None:  # a view of a buffer's value: out of date once the buffer is written
            self.buffers.note_view(viewed[0], node)
        if isinstance(val, torch.Tensor):
            self.bind(val, node)
            self.fresh.add(id(val))
        elif isinstance(val, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in val):
            for i, item in enumerate(val):  # tracing gives every result its getitem
                if live is not None and not live[i]:
                    self.graph._graph_namespace.create_name("getitem", None)
                    continue
                got = self.graph.create_node("call_function", operator.getitem, (node, i), {}, name="getitem")
                self.annotate(got, item)
                self.bind(item, got)
                self.fresh.add(id(item))
        elif val is not None or func._schema.returns:
            raise _Retrace(f"{func} returns {type(val).__name__}")
        return val

    def node_for(self, func: OpOverload, args: Any, kwargs: Any) -> torch.fx.Node:
        flat = leaves(args, kwargs)  # (walks of its own over an op's lists and tuples: pytree's costs more)
        node_args, node_kwargs = map_leaves(torch.Tensor, self.node_of, (args, kwargs))
        if any(isinstance(a, (torch.SymFloat, torch.SymBool)) for a in flat):
            raise _Retrace(f"{func} takes a symbolic float or bool")
        if any(isinstance(a, torch.SymInt) for a in flat):  # (after every tensor's node, as before)
            node_args, node_kwargs = map_leaves(torch.SymInt, self.sym_node_of, (node_args, node_kwargs))
        name = self.graph._target_to_str(func.overloadpacket.__name__)
        return self.graph.create_node("call_function", func, tuple(node_args), dict(node_kwargs), name=name)

    def value_of(self, value: Any) -> torch.fx.Node | LazyView:
        """The node giving `value`, or the view of a buffer's new value not made yet."""
        return self.lazy.get(id(value)) or self.node_of(value)

    def annotate(self, node: torch.fx.Node, val: Any) -> None:
        source = self.source
        if source is None:  # pragma: no cover - decompose_locally sets it before each node
            raise _Retrace("no source node")
        meta = source.meta
        for key in _COPIED_META:
            if key in meta:
                node.meta[key] = meta[key]
        node.meta["from_node"] = [created_from(source, "texir.local_decompose")]
        if val is not None:  # an assertion has no value, and no entry
            node.meta["val"] = val


def _decompose_node(rec: _Recorder, node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
    target = node.target
    if target is operator.getitem:
        parts, index = env[cast(torch.fx.Node, node.args[0])], node.args[1]
        if not isinstance(parts, tuple) or not isinstance(index, int):
            raise _Retrace("getitem of a non-tuple")
        return parts[index]
    if target is _SET_GRAD and rec.functional_only:
        return _inlined(rec, node, env)
    if not isinstance(target, OpOverload):
        raise _Retrace(f"{target} is not an ATen op")
    if target is SYM_SIZE:  # a node of the program reading a size: kept where it is
        tensor, dim = node.args
        source = env[cast(torch.fx.Node, tensor)]
        if not isinstance(source, torch.fx.Node) or not isinstance(dim, int):
            raise _Retrace("a size of a multi-result value")
        val = source.meta["val"].shape[dim]
        if not isinstance(val, torch.SymInt) or val.node.maybe_as_int() is not None:
            raise _Retrace("sym_size of a static dimension")
        rec.sizes.record(target, (source, dim), val)
        return SizeOf(val)
    if target._schema.is_mutable and not torch._C._dispatch_has_kernel_for_dispatch_key(
        target.name(), "CompositeImplicitAutograd"  # type: ignore[no-untyped-call]  # OpOverload.name is untyped
    ):
        # (A composite in-place op, like dropout_, is decomposed as it is: in eval mode it is the
        # identity, and anything it mutates reaches the recorder, which refuses it.)
        if target.overloadpacket.__name__ in _SPECIAL_FUNCTIONALIZATION:
            raise _Retrace(f"{target} is functionalized specially (not as its functional twin)")
        written = node.args[0] if node.args else None
        buffer = rec.buffers.buffer_of(env.get(written)) if isinstance(written, torch.fx.Node) else None
        if buffer is not None and not rec.functional_only:
            raise _Retrace(f"{target} writes buffer {buffer!r} (made functional in a step of its own)")
        twin = invisible_twin(node) if buffer is None else in_place_twin(target)
        if twin is None:
            raise _Retrace(f"{target} mutates a value something else can see")
        if target is _DETACH_:  # no node, as after the retrace's functionalization
            return env[cast(torch.fx.Node, node.args[0])]
        target = twin
        in_place = True
    else:
        in_place, buffer = False, None

    def fake(v: Any) -> Any:
        got = env[v]
        rec.buffers.check_read(got)
        if isinstance(got, tuple):
            raise _Retrace("a multi-result value used whole")
        if isinstance(got, (SizeOf, LazyView)):
            return got.value
        return rec.inputs.get(got, got.meta["val"])

    args, kwargs = torch.fx.node.map_aggregate((node.args, dict(node.kwargs)), lambda a: fake(a) if isinstance(a, torch.fx.Node) else a)
    whole = rec.whole(target) or plain_op(target, rec.table, _NOT_PLAIN)
    if whole or target in (_ALIAS, _LIFT_FRESH_COPY):  # kept whole (an alias or constant copy: the program's own)
        known = known_value(node, env, rec.nodes) if whole and not in_place and target not in _FUNCTIONALIZED else None
        given = known is None and whole and not in_place and passes_again(node, env)
        val = rec.record(target, *dispatch_form(target, args, kwargs), whole=True, known=known, given=given)
    else:
        own = known_value(node, env, rec.nodes) if not in_place and target in _SHAPE_FREE else None
        val = _decomposed(rec, target, args, kwargs, in_place, own)
    if isinstance(val, torch.Tensor):
        if buffer is not None:  # the buffer's new value
            rec.buffers.write(buffer, env[cast(torch.fx.Node, written)], rec.node_of(val))
        elif in_place:
            rec.written.add(id(val))
        return rec.value_of(val)
    if isinstance(val, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in val):
        if in_place:
            rec.written.update(id(v) for v in val)
        return tuple(rec.value_of(v) for v in val)
    if val is None and not target._schema.returns:
        return None  # an assertion: recorded, no value
    raise _Retrace(f"{target} returns {type(val).__name__}")


def _inlined(rec: _Recorder, node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
    def run(sub_node: torch.fx.Node, inner: dict[torch.fx.Node, Any]) -> Any:
        rec.source = node  # (the retrace attributes the region's nodes to its call)
        rec.fresh.clear()
        return _decompose_node(rec, sub_node, inner)

    return inline_region(node, env, run)


def decompose_locally(
    ep: ExportedProgram,
    keep: Sequence[str] = (),
    *,
    why: list[str] | None = None,
    functional_only: bool = False,
    exact_names: bool = True,
    replayed: list[str] | None = None,
    replay: bool = True,
) -> ExportedProgram | None:
    """`ep` decomposed for the edge (`edge_decomposition_table`, keeping the ops named in `keep`)
    without torch's retrace, or None when it needs one (see the module docstring); then `why`, if
    given, receives the reason. With `functional_only`, decomposed as `ep.run_decompositions({})`
    decomposes it instead (what ExecuTorch shows partitioners' `ops_to_not_decompose`): only the
    composite ops torch will not preserve, in-place ops made functional.

    Dynamic shapes only without `exact_names`: the retrace's program but for some names (`mul` for
    its `mul_2`), which reach no `.pte` byte. `replayed`, if given, receives the names of the
    program's nodes whose decomposition repeated an earlier node's and was replayed from it;
    without `replay`, every node is decomposed anew (the same program, slower)."""
    try:
        if exact_names and ep.range_constraints:
            raise _Retrace("dynamic shapes (the retrace's node names are asked for)")
        with as_the_retrace_decomposes(() if functional_only else keep):
            return _rewrite(ep, set(keep), functional_only=functional_only, exact_names=exact_names, replayed=replayed, replay=replay)
    except _Retrace as exc:
        if why is not None:
            why.append(str(exc))
        return None


def _rewrite(
    ep: ExportedProgram, kept: set[str], *, functional_only: bool = False, exact_names: bool = True,
    replayed: list[str] | None = None, replay: bool = True,
) -> ExportedProgram:
    sig = ep.graph_signature
    if any(s.kind not in (OutputKind.USER_OUTPUT, OutputKind.BUFFER_MUTATION) for s in sig.output_specs):
        raise _Retrace("the program mutates an input or has outputs other than tensors and buffer updates")
    if any(s.kind is OutputKind.BUFFER_MUTATION for s in sig.output_specs) and any(
        isinstance(n.target, OpOverload) and n.target._schema.is_mutable for n in ep.graph.nodes
    ):
        raise _Retrace("the program both returns buffer updates and writes buffers in place")
    inputs = retrace_inputs(ep)
    if has_subclass_state(ep):
        raise _Retrace("tensor-subclass weights")
    graph = ep.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    regions = {
        n: getattr(ep.graph_module, str(n.target), None) for n in graph.nodes
        if n.op == "get_attr" and functional_only and n.users and all(u.target is _SET_GRAD for u in n.users)
    }
    if any(n.op not in ("placeholder", "output", "call_function") and n not in regions for n in graph.nodes):
        raise _Retrace("nested graphs or modules (get_attr, call_module) other than no-grad regions")
    fake_mode = detect_fake_mode([n.meta.get("val") for n in placeholders])
    if fake_mode is None:
        raise _Retrace("no fake values on the inputs")
    table = {} if functional_only else lazy_edge_decomposition_table(kept)
    rec = _Recorder(table, kept, fake_mode, functional_only=functional_only)
    rec.memo, rec.elide_dead = ({} if replay else None), True  # (eliminate_dead_code below)
    env: dict[torch.fx.Node, Any] = dict(regions)
    # Inputs take their final names after the calls are named, as export renames the retrace's
    # placeholders at the end.
    # The retrace lifts tensor constants right after the parameters, before the buffers.
    # Each spec's placeholder is found by position (the names differ in a graph FX rebuilt), and
    # takes the name the retrace gives it (a weight's from its target).
    input_specs = [
        dataclasses.replace(spec, arg=TensorArgument(name=name)) if isinstance(spec.arg, TensorArgument) else spec
        for spec, _, name in inputs
    ]
    renames: list[tuple[torch.fx.Node, str]] = []
    buffers: list[tuple[torch.fx.Node, str]] = []
    for i, (spec, node, name) in enumerate(inputs):
        p = rec.graph.placeholder(f"arg{i}_1")
        p.meta = {k: node.meta[k] for k in ("val", "tensor_meta") if k in node.meta}
        if spec.kind.name in ("PARAMETER", "BUFFER"):
            p.meta.update(weight_meta(node))
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.requires_grad:
            val = rec.inputs[p] = detached(val, fake_mode)
        rec.bind(val, p)
        if isinstance(val, torch.Tensor):
            rec.sizes.track(val, p)
        env[node] = p
        renames.append((p, name))
        if spec.kind.name == "BUFFER" and spec.target is not None:
            buffers.append((p, spec.target))
    rec.buffers = BufferWrites(buffers)
    try:
        for node in graph.nodes:
            if node.op == "call_function":
                rec.source = node
                rec.fresh.clear()
                env[node] = _decompose_node(rec, node, env)
    except Exception as exc:  # noqa: BLE001 - anything unforeseen goes to the retrace, which answers for it
        where = rec.source.name if rec.source is not None else "?"
        detail = str(exc) if isinstance(exc, _Retrace) else f"{type(exc).__name__}: {exc}"
        raise _Retrace(f"node {where!r}: {detail}") from exc
    (outputs,) = (n for n in graph.nodes if n.op == "output")
    flat = torch.utils._pytree.tree_leaves(outputs.args[0])
    if any(isinstance(n, torch.fx.Node) and not isinstance(env.get(n), torch.fx.Node) for n in flat):
        raise _Retrace("an output is a multi-result value or has no value")
    for n in flat:
        rec.buffers.check_read(env.get(n))
    if exact_names and rec.buffers.views_of_written():
        # (functionalization numbers the views it makes and drops before replaying them)
        raise _Retrace("views of buffers written in place (the retrace's node names are asked for)")
    if replayed is not None:
        replayed.extend(rec.replayed)
    mutations = rec.buffers.mutations()
    results = outputs.args[0]
    if mutations:  # the retrace returns the buffers' new values first
        if not isinstance(results, (tuple, list)):
            raise _Retrace("the program's outputs are not a tuple")
        results = (*(n for _, n in mutations), *results)
    out = rec.graph.output(torch.fx.node.map_arg(results, lambda n: n if n.graph is rec.graph else env[n]))
    specs = [o for o, _ in mutations] + [o for o, _ in signature_outputs(ep)]
    for o, value in zip(specs, output_items(out.args[0])):
        if o.kind is OutputKind.BUFFER_MUTATION and isinstance(value, torch.fx.Node) and value.target is _COPY:
            # (torch's _remove_unnecessary_copy_op_pass: a buffer overwritten whole takes the value)
            value.replace_all_uses_with(cast(torch.fx.Node, value.args[1]))
            rec.graph.erase_node(value)
    taken = {n.name for n in rec.graph.nodes if n.op != "placeholder"}
    for p, name in renames:
        if name in taken:
            raise _Retrace(f"input {name!r} is named like a node the decomposition creates")
        p.name = name  # export's naming: inputs keep the user's names, builtins included
        if name.isidentifier() and not keyword.iskeyword(name):
            p.target = name  # (forward()'s parameter: a keyword or `x.1` keeps FX's legal one)
    rec.graph.eliminate_dead_code()
    output_specs = [
        OutputSpec(kind=o.kind, arg=TensorArgument(name=value.name), target=o.target)
        if isinstance(o.arg, TensorArgument) else o
        for o, value in zip(specs, output_items(out.args[0]))
    ]
    return rebuilt_exported(
        ep,
        graph=rec.graph,  # (nothing runs it as Python: code generated only when asked for)
        graph_signature=ExportGraphSignature(input_specs=input_specs, output_specs=output_specs),
        verifiers=[Verifier],  # ATen, what run_decompositions gives back, whatever `ep`'s dialect
    )


def functional_program(ep: ExportedProgram, *, why: list[str] | None = None) -> ExportedProgram:
    """`ep.run_decompositions({})`, what ExecuTorch shows partitioners' `ops_to_not_decompose`:
    without the retrace where `decompose_locally(functional_only=True)` can (the same program);
    `why`, if given, receives the reason when it cannot."""
    local = decompose_locally(ep, functional_only=True, exact_names=False, why=why)
    if local is not None:
        return local
    return run_decompositions(ep, {})
