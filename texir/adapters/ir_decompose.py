"""The edge decomposition of a functional program, on its IR: torch only for the nodes that change.

`lower` converts the functional program (what `run_decompositions({})` gives) to IR to ask the
partitioners which ops to keep, then decomposes it for the edge. Most of its nodes are already core
ATen with nothing to decompose (a vision model's batch norms, activations, additions): node by node
(`texir.adapters.local_decompose`), each of them would be copied into a new FX graph, given a new
fake value, converted to IR again. `decompose_functional_ir` copies those as IR nodes instead (the
same op, arguments and metadata, renamed as the decomposition names them) and hands only the others
to `local_decompose`'s recorder, whose new FX nodes are converted alone. The result equals
`from_exported_program(functional, decompose=True, keep=keep, exact_names=False)`;
tests/test_ir_decompose.py checks it on every zoo model it applies to.

Where a node's copy would not be exact, the node goes to the recorder (an input whose metadata
changed, an op the recorder treats specially). Programs outside what this covers give None and the
caller decomposes the FX program as before: dynamic shapes, outputs other than user outputs, nested
graphs, in-place ops, tensor-subclass weights, and whatever makes the recorder ask for torch's
retrace."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any, cast

import msgspec
import torch
from torch._guards import detect_fake_mode
from torch._library.utils import is_impure
from torch._ops import OpOverload
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind, TensorArgument
from torch.fx.graph import _Namespace

from texir.adapters.buffer_writes import NeedsRetrace, retrace_inputs, weight_meta
from texir.adapters.core_aten import check_core_aten_node
from texir.adapters.decompositions import as_the_retrace_decomposes, has_subclass_state, lazy_edge_decomposition_table
from texir.adapters.dispatch_free import _same_meta, plain_op
from texir.adapters.fake_memo import detached
from texir.adapters.fx_import import _FromFx, _MISSING
from texir.adapters.fx_provenance import FxProvenance
from texir.adapters.fx_signature import input_spec
from texir.adapters.local_decompose import _ALIAS, _FUNCTIONALIZED, _LIFT_FRESH_COPY, _NOT_PLAIN, _Recorder
from texir.adapters.local_decompose import _decompose_node
from texir.adapters.op_schemas import recorded_op_schemas
from texir.adapters.targets import canonical_target, dispatch_form
from texir.errors import TexirError
from texir.ir import types as ir
from texir.ir.builder import GraphBuilder
from texir.ir.names import rename_node

__all__ = ["decompose_functional_ir"]

_GETITEM = "_operator::getitem"


class _Copy:
    """An IR node of the functional program kept as it is (renamed, its arguments renamed)."""

    __slots__ = ("node", "source", "base", "meta", "prov", "impure", "inputs", "name")

    def __init__(self, node: ir.CallFunction, source: torch.fx.Node, base: str, meta: ir.ValueMeta | None,
                 prov: ir.Provenance | None, impure: bool, inputs: list[object]) -> None:
        self.node = node
        self.source = source
        self.base = base
        self.meta = meta
        self.prov = prov
        self.impure = impure
        self.inputs = inputs  # the entries (or placeholder names) it reads, for dead-code elimination
        self.name = ""


class _Made:
    """A node the recorder made (a decomposition's), converted once its inputs are named."""

    __slots__ = ("fx", "source", "base", "prov", "impure", "inputs", "name")

    def __init__(self, fx: torch.fx.Node, source: torch.fx.Node, prov: ir.Provenance | None) -> None:
        self.fx = fx
        self.source = source
        target = fx.target
        self.base = "getitem" if target is operator.getitem else fx.graph._target_to_str(
            cast(OpOverload, target).overloadpacket.__name__
        )
        self.prov = prov
        self.impure = fx.is_impure()
        self.inputs: list[object] = []
        self.name = ""


_Entry = _Copy | _Made


class _Placeholder:
    """What `FxProvenance.prov` reads of a placeholder the recorder would make."""

    __slots__ = ("meta", "name", "op", "target")

    def __init__(self, meta: dict[str, Any], name: str) -> None:
        self.meta, self.name, self.op, self.target = meta, name, "placeholder", name


def decompose_functional_ir(
    functional: ExportedProgram, program: ir.Program, keep: Sequence[str], *, allow_non_core: bool = False,
    why: list[str] | None = None,
) -> ir.Program | None:
    """`functional` (whose conversion is `program`) decomposed for the edge keeping the ops in
    `keep`, as IR, or None when this path does not cover it (then `why`, if given, says why)."""
    try:
        with as_the_retrace_decomposes(keep), torch._C.DisableTorchFunctionSubclass():
            return _Pass(functional, program, set(keep)).run(allow_non_core)
    except TexirError:
        raise  # (a non-core op: the same error the FX path gives)
    except Exception as exc:  # noqa: BLE001 - anything unforeseen goes to the FX path, which answers for it
        if why is not None:
            why.append(str(exc) if isinstance(exc, NeedsRetrace) else f"{type(exc).__name__}: {exc}")
        return None


class _Pass:
    def __init__(self, ep: ExportedProgram, program: ir.Program, kept: set[str]) -> None:
        if ep.range_constraints:
            raise NeedsRetrace("dynamic shapes")
        if any(s.kind is not OutputKind.USER_OUTPUT for s in ep.graph_signature.output_specs):
            raise NeedsRetrace("outputs other than user outputs")
        if has_subclass_state(ep):
            raise NeedsRetrace("tensor-subclass weights")
        self.ep = ep
        self.program = program
        self.graph = ep.graph_module.graph
        fx_nodes = list(self.graph.nodes)
        if any(n.op not in ("placeholder", "call_function", "output") for n in fx_nodes):
            raise NeedsRetrace("nested graphs or modules")
        if len(fx_nodes) != len(program.graph.nodes) or any(
            n.op == "call_function" and n.name != m.name for n, m in zip(fx_nodes, program.graph.nodes)
        ):
            raise NeedsRetrace("the IR is not this program's conversion")
        self.ir_index = {n: i for i, n in enumerate(fx_nodes)}
        self.ir_name = {n: m.name for n, m in zip(fx_nodes, program.graph.nodes)}
        self.seen: set[int] = set()  # ids of the values copied (a value stands for one node)
        placeholders = [n for n in fx_nodes if n.op == "placeholder"]
        fake_mode = detect_fake_mode([n.meta.get("val") for n in placeholders])
        if fake_mode is None:
            raise NeedsRetrace("no fake values on the inputs")
        self.fake_mode = fake_mode
        self.table = lazy_edge_decomposition_table(kept)
        self.rec = _Recorder(self.table, kept, fake_mode)
        self.kept = kept
        self.conv = _FromFx(ep, {})
        self.entries: list[_Entry] = []
        self.value: dict[torch.fx.Node, Any] = {}  # a node of `ep` -> its entry, tuple of entries, or placeholder name
        self.env: dict[torch.fx.Node, Any] = {}  # what the recorder's `_decompose_node` reads
        self.of_fx: dict[torch.fx.Node, _Made] = {}  # a node the recorder made -> its entry
        self.stub_value: dict[torch.fx.Node, Any] = {}  # a stub -> the entry or input name it holds

    # -- the nodes --------------------------------------------------------------------------

    def run(self, allow_non_core: bool) -> ir.Program:
        inputs = retrace_inputs(self.ep)
        self.input_names = {node: name for _, node, name in inputs}
        for _, node, name in inputs:
            self.value[node] = name
        ns = _Namespace()
        for i in range(len(inputs)):
            ns.create_name(f"arg{i}_1", None)  # the recorder's placeholders, named so until the end
        try:
            for node in self.graph.nodes:
                if node.op == "call_function":
                    self.rec.source = node
                    self.rec.fresh.clear()
                    self.node(node)
        except NeedsRetrace as exc:
            raise NeedsRetrace(f"node {self.rec.source.name if self.rec.source else '?'!r}: {exc}") from exc
        for entry in self.entries:
            entry.name = ns.create_name(entry.base, None)
        taken = {e.name for e in self.entries}
        if any(name in taken for name in self.input_names.values()):
            raise NeedsRetrace("an input is named like a node the decomposition creates")
        (out,) = (n for n in self.graph.nodes if n.op == "output")
        results = out.args[0]
        items = tuple(results) if isinstance(results, (tuple, list)) else (results,)
        live = self.live(items)
        if not allow_non_core:
            for entry in self.entries:
                if id(entry) in live:
                    target = (entry.fx if isinstance(entry, _Made) else entry.source).target
                    args = entry.fx.args if isinstance(entry, _Made) else entry.source.args
                    if isinstance(target, OpOverload):
                        check_core_aten_node(entry.name, target, tuple(args), self.kept)
        return self.build(inputs, items, live)

    def node(self, node: torch.fx.Node) -> None:
        target = node.target
        if target is operator.getitem:
            parts = self.value.get(cast(torch.fx.Node, node.args[0]))
            if isinstance(parts, tuple):
                self.value[node] = parts[cast(int, node.args[1])]
                return
            raise NeedsRetrace("getitem of a non-tuple")
        if not isinstance(target, OpOverload):
            raise NeedsRetrace(f"{target} is not an ATen op")
        if target._schema.is_mutable:
            raise NeedsRetrace(f"{target} mutates")
        if self.copyable(node, target):
            self.copy(node, target)
        else:
            self.record(node)

    def copyable(self, node: torch.fx.Node, target: OpOverload) -> bool:
        """What the recorder would record as it is, with the node's own value: an op it keeps whole
        (no decomposition), on inputs whose values are the program's own."""
        if target in (_ALIAS, _LIFT_FRESH_COPY) or target in _FUNCTIONALIZED:
            return False
        if not (self.rec.whole(target) or plain_op(target, self.table, _NOT_PLAIN)):
            return False
        if dispatch_form(target, tuple(node.args), dict(node.kwargs)) != (tuple(node.args), dict(node.kwargs)):
            return False
        val = node.meta.get("val")
        parts = val if isinstance(val, (tuple, list)) else (val,)
        if not parts or not all(isinstance(p, torch.Tensor) and not p.requires_grad for p in parts):
            return False
        ids = {id(p) for p in parts}
        if len(ids) != len(parts) or not ids.isdisjoint(self.seen):
            return False
        for arg in node.all_input_nodes:
            got = self.value.get(arg)
            if isinstance(got, (str, _Copy)):  # an input's or a copy's: the program's own value
                continue
            # a decomposition's value, when of the metadata the program's was (`known_value`)
            if not isinstance(got, _Made) or not _same_meta(got.fx.meta.get("val"), arg.meta.get("val")):
                return False
        return True

    def copy(self, node: torch.fx.Node, target: OpOverload) -> None:
        index = self.ir_index[node]
        graph = self.program.graph
        ir_node = cast(ir.CallFunction, graph.nodes[index])
        prov = graph.prov(index)
        base = self.rec.graph._target_to_str(target.overloadpacket.__name__)
        impure = is_impure(target, args=node.args, kwargs=node.kwargs, impure_random=True)
        reads = [self.value[a] for a in node.all_input_nodes]
        val = node.meta.get("val")
        self.seen.update(id(p) for p in (val if isinstance(val, (tuple, list)) else (val,)))
        if isinstance(val, (tuple, list)):
            # The call's own value is the tuple; every result gets its getitem, used or not.
            entry = _Copy(ir_node, node, base, graph.meta(ir_node), prov, impure, reads)
            self.entries.append(entry)
            parts = []
            for i in range(len(val)):
                item = _Copy(
                    ir.CallFunction(name="", target=_GETITEM, args=(ir.Ref(name=""), ir.IntArg(value=i))),
                    node, "getitem", self.conv.meta(val[i], node), prov, False, [entry],
                )
                self.entries.append(item)
                parts.append(item)
            self.value[node] = tuple(parts)
        else:
            entry = _Copy(ir_node, node, base, graph.meta(ir_node), prov, impure, reads)
            self.entries.append(entry)
            self.value[node] = entry

    def record(self, node: torch.fx.Node) -> None:
        """`node` decomposed by the recorder, its inputs given the recorder's nodes first."""
        for arg in node.all_input_nodes:
            self.stub(arg)
        before = self.rec.graph._root.prev
        result = _decompose_node(self.rec, node, self.env)
        self.env[node] = result
        prov = self.program.graph.prov(self.ir_index[node])
        made: list[_Made] = []
        current = before.next
        while current is not self.rec.graph._root:
            if current.op != "placeholder":
                entry = _Made(current, node, prov)
                self.of_fx[current] = entry
                made.append(entry)
            current = current.next
        for entry in made:
            entry.inputs = [self.entry_of(n) for n in entry.fx.all_input_nodes]
        self.entries.extend(made)
        self.value[node] = self.from_recorder(result)

    def from_recorder(self, result: Any) -> Any:
        if isinstance(result, torch.fx.Node):
            return self.entry_of(result)
        if isinstance(result, tuple):
            return tuple(self.from_recorder(r) for r in result)
        if result is None:
            return None
        raise NeedsRetrace(f"a value of type {type(result).__name__}")

    def entry_of(self, fx: torch.fx.Node) -> Any:
        made = self.of_fx.get(fx)
        if made is not None:
            return made
        return self.stub_value[fx]

    def stub(self, node: torch.fx.Node) -> None:
        """A recorder node holding `node`'s value (a placeholder of the recorder's graph)."""
        if node in self.env:
            return
        value = self.value.get(node)
        if isinstance(value, tuple):
            self.env[node] = tuple(self.stub_of(node, part, i) for i, part in enumerate(value))
            return
        if value is None:
            raise NeedsRetrace(f"no value for {node.name}")
        self.env[node] = self.stub_of(node, value, None)

    def stub_of(self, node: torch.fx.Node, value: Any, index: int | None) -> torch.fx.Node:
        if isinstance(value, _Made):
            return value.fx
        rec = self.rec
        p = rec.graph.placeholder(f"__texir_stub_{len(self.stub_value)}")
        self.stub_value[p] = value
        if index is None:
            p.meta = {k: node.meta[k] for k in ("val", "tensor_meta") if k in node.meta}
            val = node.meta.get("val")
        else:
            val = node.meta["val"][index]
            p.meta = {"val": val}
        if isinstance(val, torch.Tensor) and val.requires_grad:
            val = rec.inputs[p] = detached(val, self.fake_mode)
        rec.bind(val, p)
        return p

    # -- the program ------------------------------------------------------------------------

    def live(self, items: Sequence[Any]) -> set[int]:
        """The entries left after dead-code elimination as torch.fx does it (reversed, a node
        without users and without side effects goes, and its inputs lose a user)."""
        users: dict[int, int] = {}
        for entry in self.entries:
            for i in entry.inputs:
                if not isinstance(i, str):
                    users[id(i)] = users.get(id(i), 0) + 1
        for item in items:
            got = self.value.get(item) if isinstance(item, torch.fx.Node) else None
            if got is not None and not isinstance(got, str):
                if isinstance(got, tuple):
                    raise NeedsRetrace("an output is a multi-result value")
                users[id(got)] = users.get(id(got), 0) + 1
        live: set[int] = set()
        for entry in reversed(self.entries):
            if users.get(id(entry), 0) == 0 and not entry.impure:
                for i in entry.inputs:
                    if not isinstance(i, str):
                        users[id(i)] -= 1
                continue
            live.add(id(entry))
        return live

    def name_of(self, value: Any) -> str:
        if isinstance(value, str):
            return value
        return cast(_Entry, value).name

    def build(self, inputs: list[Any], items: Sequence[Any], live: set[int]) -> ir.Program:
        builder = GraphBuilder()
        provenance = FxProvenance()
        metas = self.program.graph
        ir_nodes = self.program.graph.nodes
        for spec, node, name in inputs:
            index = self.ir_index[node]
            meta = {k: node.meta[k] for k in ("val", "tensor_meta") if k in node.meta}
            if spec.kind.name in ("PARAMETER", "BUFFER"):
                meta.update(weight_meta(node))
            prov = provenance.prov(cast(torch.fx.Node, _Placeholder(meta, name)))
            builder.add(ir.Placeholder(name=name), metas.meta(ir_nodes[index]), prov)
        handles: dict[str, int] = {}
        conv = self.conv
        made_names = {e.fx: e.name for e in self.entries if isinstance(e, _Made)}
        stub_names = {p: self.name_of(v) for p, v in self.stub_value.items()}
        names = {**made_names, **stub_names}
        conv.arg_dispatch[torch.fx.Node] = lambda v, n: ir.Ref(name=names[v])
        for entry in self.entries:
            if id(entry) not in live:
                continue
            prov = entry.prov
            if prov is not None and prov.ancestor is not None:
                handle = handles.setdefault(prov.ancestor, len(handles) + 1)
                if handle != prov.debug_handle:
                    prov = msgspec.structs.replace(prov, debug_handle=handle)
            if isinstance(entry, _Copy):
                node = entry.node
                if node.target == _GETITEM and not node.name:
                    (source,) = entry.inputs
                    node = msgspec.structs.replace(node, name=entry.name, args=(
                        ir.Ref(name=cast(_Entry, source).name), node.args[1]))
                else:
                    renames = {self.ir_name[a]: self.name_of(self.value[a]) for a in entry.source.all_input_nodes}
                    renames[node.name] = entry.name
                    node = cast(ir.CallFunction, rename_node(node, renames))
                builder.add(node, entry.meta, prov)
            else:
                fx = entry.fx
                val = fx.meta.get("val", _MISSING)
                target = canonical_target(fx.target)
                if target is None:
                    raise NeedsRetrace(f"{fx.target} has no canonical name")
                builder.add(
                    ir.CallFunction(
                        name=entry.name, target=target,
                        args=tuple([conv.arg(a, fx) for a in fx.args]),
                        kwargs=tuple([(k, conv.arg(v, fx)) for k, v in fx.kwargs.items()]),
                    ),
                    None if val is _MISSING else conv.meta(val, fx),
                    prov,
                )
        results = [
            ir.Ref(name=self.name_of(self.value[i])) if isinstance(i, torch.fx.Node) else conv.arg(i, cast(torch.fx.Node, None))
            for i in items
        ]
        builder.add(ir.Output(name="output", args=tuple(results)))
        signature = ir.GraphSignature(
            inputs=tuple(
                input_spec(dataclasses.replace(spec, arg=TensorArgument(name=name))
                           if isinstance(spec.arg, TensorArgument) else spec)
                for spec, _, name in inputs
            ),
            outputs=tuple(
                ir.UserOutput(arg=r) for r in results
            ),
        )
        program = msgspec.structs.replace(
            self.program, graph=builder.build(), signature=signature, dialect="ATEN", op_schemas=(),
        )
        custom = recorded_op_schemas(program)
        return msgspec.structs.replace(program, op_schemas=custom) if custom else program

