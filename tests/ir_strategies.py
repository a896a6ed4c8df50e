"""Hypothesis strategies for random IR Programs covering every kind the printer prints: all value
metadata and argument kinds, provenance, state, range constraints, the module call graph, backend
notes, nested graphs and lowered modules. Programs need not be valid (`verify`), only printable."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from hypothesis import strategies as st

from texir.ir import (
    BackendNodeMeta, BoolArg, BufferInput, BufferMutation, CallFunction, CompileSpec, ConstantTensorInput,
    CustomObjInput, CustomObjMeta, DebugHandleEntry, DelegateMeta, DeviceArg, DType, DTypeArg, FloatArg, GetAttr,
    GradientToParameter, GradientToUserInput, Graph, GraphBuilder, GraphSignature, IntArg, Layout, LayoutArg,
    ListArg, LossOutput, LoweredBackendModule, MemoryFormat, MemoryFormatArg, ModuleCallEntry,
    ModuleCallSignature, ModuleFrame, NamedDataEntry, NamedLoweredModule, NoneArg, NoneMeta, Output,
    ParameterInput, Placeholder, Program, Provenance, RangeConstraint, Ref, ScalarMeta, SourceFn, StateEntry,
    StrArg, Subgraph, SubgraphMeta, SymBoolMeta, SymExprArg, SymFloatMeta, SymIntMeta, TensorData, TensorMeta,
    TokenInput, TokenMeta, TokenOutput, TupleArg, TupleMeta, UserInput, UserInputMutation, UserOutput,
)
from texir.ir.blob import Blob
from texir.ir.printer import contiguous_strides
from texir.ir.names import rename_arg, rename_input_spec, rename_output_spec

__all__ = ["programs"]

IDENT = st.sampled_from(["a", "b_1", "fc1", "_x", "weight", "layer2"])
SYMBOLIC = st.sampled_from(["s0", "s1", "2*s0", "s0 + 1", "Max(1, s0)", "s0*s1", "-s0 + 3", "(s0//2)"])
DIMS = st.one_of(st.integers(0, 6), SYMBOLIC)
FLOATS = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["inf", "-inf", "nan"]))
TEXT = st.one_of(st.sampled_from(["", "a b", "it's", 'say "hi"', "tab\there", "nl\n", "é∂", "inf", "nan", "None", "True", "%x", "a, b)"]), st.text(max_size=4))
HEX = st.binary(min_size=32, max_size=32).map(bytes.hex)


@st.composite
def tensor_metas(draw: Any, concrete: bool = False) -> TensorMeta:
    shape = tuple(draw(st.lists(st.integers(0, 5) if concrete else DIMS, max_size=4)))
    strides = None
    if draw(st.booleans()):
        strides = tuple(draw(st.lists(DIMS, min_size=len(shape), max_size=len(shape))))
    return TensorMeta(
        dtype=draw(st.sampled_from(list(DType))), shape=shape,
        strides=strides if strides is not None else contiguous_strides(shape),
        storage_offset=draw(st.one_of(st.just(0), DIMS)), layout=draw(st.sampled_from(list(Layout))),
        device=draw(st.sampled_from(["cpu", "cuda:0", "meta"])), requires_grad=draw(st.booleans()),
    )


LEAF_METAS = st.one_of(
    tensor_metas(),
    st.builds(SymIntMeta, expr=st.one_of(st.integers(-3, 9), SYMBOLIC)),
    st.builds(SymFloatMeta, expr=SYMBOLIC), st.builds(SymBoolMeta, expr=st.sampled_from(["Eq(s0, 2)", "s0 > 1"])),
    st.builds(ScalarMeta, value=st.one_of(st.none(), st.booleans(), st.integers(), FLOATS, TEXT)),
    st.just(NoneMeta()), st.just(TokenMeta()), st.builds(CustomObjMeta, class_fqn=st.just("__torch__.Foo")),
)
METAS = st.recursive(LEAF_METAS, lambda inner: st.builds(
    TupleMeta, items=st.lists(inner, max_size=3).map(tuple), is_list=st.booleans()), max_leaves=3)


_LEAF_ARGS = st.one_of(
    st.just(NoneArg()), st.builds(IntArg, value=st.integers()), st.builds(FloatArg, value=FLOATS),
    st.builds(BoolArg, value=st.booleans()), st.builds(StrArg, value=TEXT),
    st.builds(DTypeArg, value=st.sampled_from(list(DType))), st.builds(DeviceArg, value=st.sampled_from(["cpu", "cuda:1"])),
    st.builds(LayoutArg, value=st.sampled_from(list(Layout))),
    st.builds(MemoryFormatArg, value=st.sampled_from(list(MemoryFormat))),
    st.builds(SymExprArg, expr=SYMBOLIC, type=st.sampled_from(["int", "float", "bool"])),
    st.integers(0, 9).map(lambda k: Ref(name=f"#{k}")),
)
# Built once (hypothesis is slow to build strategies per draw); references are slots "#k", bound
# to the names in scope by `arguments`.
_ARGS = st.recursive(_LEAF_ARGS, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda xs: ListArg(items=tuple(xs))),
    st.lists(inner, max_size=3).map(lambda xs: TupleArg(items=tuple(xs)))), max_leaves=4)


_FN = st.one_of(st.none(), st.tuples(IDENT, st.sampled_from(["builtin.add", "method.relu"])))
PROVENANCES = st.one_of(st.none(), st.builds(
    Provenance, debug_handle=st.one_of(st.none(), st.integers(0, 50)), ancestor=st.one_of(st.none(), IDENT),
    stack_trace=st.one_of(st.none(), TEXT), torch_fn=_FN,
    nn_module_stack=st.lists(st.builds(ModuleFrame, key=IDENT, path=IDENT, type=TEXT), max_size=2).map(tuple),
    source_fn_stack=st.lists(st.builds(SourceFn, name=IDENT, target=TEXT), max_size=1).map(tuple),
    custom=st.one_of(st.none(), st.sampled_from(['{"_arm_annotation_info": {"quantized": true}}', "{}"])),
))
OPTIONAL_METAS = st.one_of(st.none(), METAS)
TARGETS = st.sampled_from(["aten::add.Tensor", "higher_order::cond", "my::op.default"])


_SLOT = st.integers(0, 9).map(lambda k: f"#{k}")
_ARG_LIST = st.lists(_ARGS, max_size=3)
_KWARGS = st.lists(st.tuples(IDENT, _ARGS), max_size=2, unique_by=lambda kv: kv[0])
_INPUTS = st.lists(st.one_of(
    st.builds(UserInput, arg=_ARGS), st.builds(ParameterInput, name=_SLOT, target=IDENT),
    st.builds(BufferInput, name=_SLOT, target=IDENT, persistent=st.booleans()),
    st.builds(ConstantTensorInput, name=_SLOT, target=IDENT), st.builds(CustomObjInput, name=_SLOT, target=IDENT),
    st.builds(TokenInput, name=_SLOT)), max_size=3)
_OUTPUTS = st.lists(st.one_of(
    st.builds(UserOutput, arg=_ARGS), st.builds(BufferMutation, name=_SLOT, target=IDENT),
    st.builds(UserInputMutation, name=_SLOT, target=IDENT), st.builds(LossOutput, name=_SLOT),
    st.builds(GradientToParameter, name=_SLOT, target=IDENT),
    st.builds(GradientToUserInput, name=_SLOT, target=IDENT), st.builds(TokenOutput, name=_SLOT)), max_size=3)
_CONCRETE_METAS = tensor_metas(concrete=True)
_STATE = st.lists(st.tuples(IDENT, _CONCRETE_METAS, st.one_of(st.none(), st.binary(max_size=16)), HEX,
                            st.integers(0, 99)), max_size=2, unique_by=lambda t: t[0])
_RANGES = st.lists(st.builds(RangeConstraint, symbol=st.sampled_from(["s0", "s1", "u0"]), min=st.integers(0, 4),
                             max=st.one_of(st.none(), st.integers(4, 99)), hint=st.one_of(st.none(), st.integers(0, 9))),
                   max_size=2, unique_by=lambda r: r.symbol)
_CALLS = st.lists(st.builds(ModuleCallEntry, fqn=st.one_of(st.just(""), IDENT), signature=st.one_of(
    st.none(), st.builds(ModuleCallSignature, inputs=st.lists(_ARGS, max_size=2).map(tuple),
                         outputs=st.lists(_ARGS, max_size=2).map(tuple), in_spec=TEXT, out_spec=TEXT,
                         forward_arg_names=st.one_of(st.none(), st.lists(IDENT, max_size=2).map(tuple))))),
    max_size=2)
_NOTES = st.lists(st.builds(BackendNodeMeta, node=_SLOT, key=TEXT, value=TEXT), max_size=2)
_NAMED = st.dictionaries(TEXT, st.tuples(st.binary(max_size=8), st.sampled_from([1, 16]), st.booleans()), max_size=2)
_SPECS = st.lists(st.builds(CompileSpec, key=IDENT, value=st.binary(max_size=4)), max_size=2).map(tuple)
_DEBUG_MAP = st.one_of(st.none(), st.lists(st.builds(
    DebugHandleEntry, identifier=st.one_of(st.integers(0, 9), TEXT),
    debug_handles=st.lists(st.integers(0, 9), max_size=3).map(tuple)), max_size=2).map(tuple))


def _slots(names: list[str]) -> dict[str, str]:
    return {f"#{k}": names[k % len(names)] if names else "missing" for k in range(10)}


@st.composite
def graphs(draw: Any, depth: int = 1, delegates: tuple[str, ...] = ()) -> Graph:
    b = GraphBuilder()
    names: list[str] = []
    for i in range(draw(st.integers(0, 3))):
        names.append(f"in_{i}")
        b.add(Placeholder(name=names[-1]), draw(OPTIONAL_METAS), draw(PROVENANCES))
    subs: list[Subgraph] = []
    if depth > 0 and draw(st.booleans()):
        sub = f"graph_{draw(IDENT)}"
        subs.append(Subgraph(name=sub, graph=draw(graphs(depth=depth - 1))))
        names.append(sub)
        b.add(GetAttr(name=sub, target=sub), SubgraphMeta(graph=sub), draw(PROVENANCES))
    for module in delegates:
        names.append(module)
        b.add(GetAttr(name=module, target=module), DelegateMeta(module=module))
    for i in range(draw(st.integers(0, 4))):
        slots = _slots(names)
        node = CallFunction(
            name=f"op_{i}", target=draw(TARGETS), args=tuple(rename_arg(a, slots) for a in draw(_ARG_LIST)),
            kwargs=tuple((k, rename_arg(a, slots)) for k, a in draw(_KWARGS)),
        )
        b.add(node, draw(OPTIONAL_METAS), draw(PROVENANCES))
        names.append(node.name)
    slots = _slots(names)
    b.add(Output(args=tuple(rename_arg(a, slots) for a in draw(_ARG_LIST))), None, draw(PROVENANCES))
    return b.build(subs)


@st.composite
def programs(draw: Any, depth: int = 1) -> Program:
    """A random Program (lowered modules nest `depth` levels)."""
    modules = [f"lowered_module_{i}" for i in range(draw(st.integers(0, 2 if depth else 0)))]
    graph = draw(graphs(delegates=tuple(modules)))
    slots = _slots([n.name for n in graph.nodes if not isinstance(n, Output)])
    inputs = tuple(rename_input_spec(x, slots) for x in draw(_INPUTS))
    outputs = tuple(rename_output_spec(x, slots) for x in draw(_OUTPUTS))
    state = []
    for target, meta, data, digest, nbytes in draw(_STATE):
        value = TensorData(meta=meta, sha256=digest, nbytes=nbytes) if data is None else TensorData(
            meta=meta, sha256=hashlib.sha256(data).hexdigest(), nbytes=len(data), data=Blob(data))
        state.append(StateEntry(target=target, value=value))
    calls = []
    for entry in draw(_CALLS):
        sig = entry.signature
        if sig is not None:
            sig = msgspec.structs.replace(sig, inputs=tuple(rename_arg(a, slots) for a in sig.inputs),
                                          outputs=tuple(rename_arg(a, slots) for a in sig.outputs))
        calls.append(ModuleCallEntry(fqn=entry.fqn, signature=sig))
    notes = tuple(msgspec.structs.replace(n, node=slots[n.node]) for n in draw(_NOTES))
    lowered = []
    for module in modules:
        named = tuple(NamedDataEntry(key=k, sha256=hashlib.sha256(d).hexdigest(), nbytes=len(d), alignment=align,
                                     data=Blob(d) if keep else None) for k, (d, align, keep) in draw(_NAMED).items())
        lowered.append(NamedLoweredModule(name=module, module=LoweredBackendModule(
            backend_id=draw(st.sampled_from(["XnnpackBackend", "DemoBackend"])), processed_bytes=draw(st.binary(max_size=24)),
            compile_specs=draw(_SPECS), original_program=draw(programs(depth=depth - 1)),
            debug_handle_map=draw(_DEBUG_MAP), named_data=named,
        )))
    return Program(
        graph=graph, signature=GraphSignature(inputs=inputs, outputs=outputs), state=tuple(state),
        range_constraints=tuple(draw(_RANGES)), module_call_graph=tuple(calls), lowered_modules=tuple(lowered),
        dialect=draw(st.sampled_from(["ATEN", "EDGE"])), backend_meta=notes,
        op_schemas=tuple(sorted(draw(st.sets(st.sampled_from(_CUSTOM_SCHEMAS), max_size=2)))),
    )


_CUSTOM_SCHEMAS = (
    "mylib::scale(Tensor x, float factor=2.) -> Tensor",
    'mylib::pick(Tensor(a!) x, str mode="it\'s", int[]? dims=None) -> (Tensor(a!) y, Tensor)',
)
