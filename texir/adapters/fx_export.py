"""texir IR -> a runnable torch.export.ExportedProgram (fake-tensor metadata, provenance, state)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch._export.verifier import TrainingIRVerifier, Verifier
from torch.export import ExportedProgram
from torch.export import exported_program as ep_mod
from torch.export import graph_signature as gs
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.traceback import NodeSource
from torch.utils import _pytree as pytree

from texir._io import gc_paused
from texir.adapters import delegate_op
from texir.adapters.fx_fake import MISSING, FakeValues
from texir.adapters.specs import load_spec
from texir.adapters.targets import resolve_target
from texir.adapters.tensors import (
    DTYPE_TO_TORCH,
    LAYOUT_TO_TORCH,
    MEMORY_FORMAT_TO_TORCH,
    float_to_python,
    tensor_from_data,
)
from texir.adapters.torch_patches import lazy_graph_module_codegen
from texir.errors import ConversionError, UnsupportedError
from texir.ir import types as ir

__all__ = ["rebuilt_exported", "to_exported_program"]

_MODULE_SELF = "self"
"""The one name FX cannot give a node: its generated forward() binds it to the module."""


def _no_prov(index: int) -> None:
    """`Graph.prov` of a graph without provenance."""
    return None

# --------------------------------------------------------------------------------------------------
# IR -> FX


class _ToFx(FakeValues):
    """One conversion: one ShapeEnv and FakeTensorMode (`FakeValues`), shared by the whole program."""

    def __init__(self, program: ir.Program) -> None:
        super().__init__(program)
        self.program = program
        self.node_sources: dict[str, NodeSource] = {}
        self.lowered = {entry.name: entry.module for entry in program.lowered_modules}
        self.lowered_torch: dict[str, delegate_op.LoweredBackendModule] = {}
        self.arg_dispatch: dict[type, Callable[[Any, dict[str, torch.fx.Node]], Any]] = {
            ir.Ref: self._ref,
            ir.IntArg: lambda a, env: a.value,
            ir.FloatArg: lambda a, env: float_to_python(a.value),
            ir.BoolArg: lambda a, env: a.value,
            ir.StrArg: lambda a, env: a.value,
            ir.NoneArg: lambda a, env: None,
            ir.ListArg: lambda a, env: [self.arg(x, env) for x in a.items],
            ir.TupleArg: lambda a, env: tuple(self.arg(x, env) for x in a.items),
            ir.DTypeArg: lambda a, env: DTYPE_TO_TORCH[a.value],
            ir.DeviceArg: lambda a, env: torch.device(a.value),
            ir.LayoutArg: lambda a, env: LAYOUT_TO_TORCH[a.value],
            ir.MemoryFormatArg: lambda a, env: MEMORY_FORMAT_TO_TORCH[a.value],
            ir.SymExprArg: lambda a, env: self.sym_value(a.expr, a.type),
        }

    def set_prov(self, fx_node: torch.fx.Node, prov: ir.Provenance | None) -> None:
        if prov is None:
            return
        meta = fx_node.meta
        if prov.stack_trace is not None:
            meta["stack_trace"] = prov.stack_trace
        if prov.nn_module_stack:
            meta["nn_module_stack"] = {f.key: (f.path, f.type) for f in prov.nn_module_stack}
        if prov.source_fn_stack:
            meta["source_fn_stack"] = [(s.name, s.target) for s in prov.source_fn_stack]
        if prov.torch_fn is not None:
            meta["torch_fn"] = prov.torch_fn
        if prov.custom is not None:
            meta["custom"] = json.loads(prov.custom)
        if prov.debug_handle is not None:
            meta["debug_handle"] = prov.debug_handle
        if prov.ancestor is not None:
            source = self.node_sources.get(prov.ancestor)
            if source is None:
                name, _, graph_id = prov.ancestor.rpartition(".")
                source = NodeSource(None, pass_name="texir")
                source.node_info = NodeSource.NodeInfo(
                    name=name, target="", graph_id=int(graph_id) if graph_id.isdigit() else -1
                )
                self.node_sources[prov.ancestor] = source
            meta["from_node"] = [source]

    # -- arguments ---------------------------------------------------------------------------

    def _ref(self, a: ir.Ref, env: dict[str, torch.fx.Node]) -> torch.fx.Node:
        node = env.get(a.name)
        if node is None:
            raise ConversionError(f"reference to {a.name!r} before its definition; run texir.ir.verify")
        return node

    def arg(self, a: ir.Argument, env: dict[str, torch.fx.Node]) -> Any:
        conv = self.arg_dispatch.get(type(a))
        if conv is None:
            raise ConversionError(
                f"argument {a!r} is not a texir.ir Argument ({type(a).__name__}); build arguments "
                "from the texir.ir argument types"
            )
        return conv(a, env)

    # -- graphs ------------------------------------------------------------------------------

    def graph_module(self, graph: ir.Graph, path: str) -> torch.fx.GraphModule:
        root, fx_graph = self.build_graph(graph, path)
        return torch.fx.GraphModule(root, fx_graph)

    def build_graph(self, graph: ir.Graph, path: str) -> tuple[torch.nn.Module, torch.fx.Graph]:
        fx_graph = torch.fx.Graph()
        root = torch.nn.Module()
        subgraphs = {s.name: s.graph for s in graph.subgraphs}
        env: dict[str, torch.fx.Node] = {}
        arg = self.arg
        val_of = self.val
        metas = graph.metas
        # Provenance is read only where it is written back, from the graph's columns.
        prov_of = graph.prov if graph.provenance is not None else _no_prov
        set_prov = self.set_prov
        create = fx_graph.create_node
        for i, node in enumerate(graph.nodes):
            kind = type(node)
            if node.name == _MODULE_SELF:
                # FX's generated forward() binds `self` to the module (a first placeholder of that
                # name is taken for it), so no FX node can carry the name; torch.export never
                # gives a value this name (it refuses `forward(this, self)`).
                raise ConversionError(
                    f"{kind.__name__.lower()} node {node.name!r} in {path or 'the program graph'}: an FX graph "
                    "cannot hold a value named 'self' (its generated forward() binds self to the module); "
                    "rename the value, and the signature entries that name it"
                )
            if kind is ir.CallFunction:
                assert isinstance(node, ir.CallFunction)
                fx_node = create(
                    "call_function",
                    resolve_target(node.target),
                    tuple([arg(a, env) for a in node.args]),
                    {k: arg(v, env) for k, v in node.kwargs},
                    name=node.name,
                )
                meta_id = node.meta_id
                if meta_id is not None:
                    val = val_of(metas[meta_id])
                    if val is not MISSING:
                        fx_node.meta["val"] = val
                set_prov(fx_node, prov_of(i))
            elif kind is ir.Placeholder:
                assert isinstance(node, ir.Placeholder)
                fx_node = create("placeholder", node.name, name=node.name)
                meta_id = node.meta_id
                if meta_id is not None:
                    val = val_of(metas[meta_id], False)
                    if val is not MISSING:
                        fx_node.meta["val"] = val
                set_prov(fx_node, prov_of(i))
            elif kind is ir.GetAttr:
                assert isinstance(node, ir.GetAttr)
                target = node.target
                if not hasattr(root, target):
                    meta = graph.meta(node)
                    if isinstance(meta, ir.DelegateMeta):
                        root.add_module(target, self.lowered_module(meta.module, node.name))
                    else:
                        sub = subgraphs.get(target)
                        if sub is None:
                            raise ConversionError(
                                f"get_attr node {node.name!r} names {target!r}, which is neither a "
                                f"subgraph of {path or 'the program graph'} nor a lowered module"
                            )
                        root.add_module(target, self.graph_module(sub, f"{path}.{target}" if path else target))
                fx_node = create("get_attr", target, name=node.name)
                set_prov(fx_node, prov_of(i))
            elif kind is ir.Output:
                assert isinstance(node, ir.Output)
                fx_node = create(
                    "output", "output", (tuple([arg(a, env) for a in node.args]),), name=node.name
                )
            else:
                raise UnsupportedError(f"node kind {type(node).__name__} is not supported")
            if fx_node.name != node.name:
                # FX steers new names away from Python builtins and keywords (`input` becomes
                # `input_1`); torch.export renames its nodes after creating them, so a user input
                # called `input` keeps its name. Do the same; only a true duplicate is an error.
                if node.name in env:
                    raise ConversionError(
                        f"node name {node.name!r} is used twice in {path or 'the program graph'}; "
                        "run texir.ir.verify"
                    )
                # Only the name: a placeholder's target is the generated forward()'s parameter
                # name, which must stay a legal, unshadowing identifier (FX's choice).
                if fx_node.op == "placeholder":
                    fx_node.target = fx_node.name
                fx_node.name = node.name
            env[node.name] = fx_node
        return root, fx_graph

    def lowered_module(self, name: str, node_name: str) -> delegate_op.LoweredBackendModule:
        module = self.lowered_torch.get(name)
        if module is None:
            lowered = self.lowered.get(name)
            if lowered is None:
                raise ConversionError(
                    f"get_attr node {node_name!r} names lowered module {name!r}, which is not in "
                    "Program.lowered_modules"
                )
            module = self.lowered_torch[name] = delegate_op.LoweredBackendModule(lowered, to_exported_program)
        return module

    # -- signature ---------------------------------------------------------------------------

    def argument_spec(self, a: ir.Argument, metas: dict[str, ir.ValueMeta | None], name: str = "") -> Any:
        if isinstance(a, ir.Ref):
            meta = metas.get(a.name)
            spec_type = _ARG_SPEC_BY_META.get(type(meta), gs.TensorArgument)
            if spec_type is gs.CustomObjArgument:
                assert isinstance(meta, ir.CustomObjMeta)
                return gs.CustomObjArgument(name=a.name, class_fqn=meta.class_fqn)
            return spec_type(name=a.name)
        return gs.ConstantArgument(name=name, value=self.arg(a, {}))

    def signature(self, metas: dict[str, ir.ValueMeta | None], placeholder_names: list[str],
                  output_args: Sequence[ir.Argument]) -> gs.ExportGraphSignature:
        sig = self.program.signature
        if len(sig.inputs) != len(placeholder_names) or len(sig.outputs) != len(output_args):
            raise ConversionError(
                f"signature has {len(sig.inputs)} inputs and {len(sig.outputs)} outputs but the graph "
                f"has {len(placeholder_names)} placeholders and {len(output_args)} outputs; run texir.ir.verify"
            )
        inputs = []
        for spec, ph in zip(sig.inputs, placeholder_names):
            if isinstance(spec, ir.UserInput):
                inputs.append(gs.InputSpec(gs.InputKind.USER_INPUT, self.argument_spec(spec.arg, metas, ph), None))
            elif isinstance(spec, ir.ParameterInput):
                inputs.append(gs.InputSpec(gs.InputKind.PARAMETER, gs.TensorArgument(name=spec.name), spec.target))
            elif isinstance(spec, ir.BufferInput):
                inputs.append(gs.InputSpec(
                    gs.InputKind.BUFFER, gs.TensorArgument(name=spec.name), spec.target, spec.persistent
                ))
            elif isinstance(spec, ir.ConstantTensorInput):
                inputs.append(gs.InputSpec(
                    gs.InputKind.CONSTANT_TENSOR, gs.TensorArgument(name=spec.name), spec.target
                ))
            elif isinstance(spec, ir.CustomObjInput):
                meta = metas.get(spec.name)
                fqn = meta.class_fqn if isinstance(meta, ir.CustomObjMeta) else ""
                inputs.append(gs.InputSpec(
                    gs.InputKind.CUSTOM_OBJ, gs.CustomObjArgument(name=spec.name, class_fqn=fqn), spec.target
                ))
            else:
                inputs.append(gs.InputSpec(gs.InputKind.TOKEN, gs.TokenArgument(name=spec.name), None))
        outputs = []
        for out, oarg in zip(sig.outputs, output_args):
            if isinstance(out, ir.UserOutput):
                outputs.append(gs.OutputSpec(gs.OutputKind.USER_OUTPUT, self.argument_spec(out.arg, metas), None))
                continue
            kind, target = _OUTPUT_KINDS[type(out)], getattr(out, "target", None)
            arg_type = gs.TokenArgument if kind is gs.OutputKind.TOKEN else gs.TensorArgument
            outputs.append(gs.OutputSpec(kind, arg_type(name=out.name), target))
        return gs.ExportGraphSignature(input_specs=inputs, output_specs=outputs)

    def module_call_graph(self, metas: dict[str, ir.ValueMeta | None], n_user_inputs: int,
                          n_user_outputs: int) -> list[ep_mod.ModuleCallEntry]:
        entries = []
        for entry in self.program.module_call_graph:
            signature = None
            s = entry.signature
            if s is not None:
                signature = ep_mod.ModuleCallSignature(
                    inputs=[self.argument_spec(a, metas) for a in s.inputs],
                    outputs=[self.argument_spec(a, metas) for a in s.outputs],
                    in_spec=load_spec(s.in_spec, f"module_call_graph entry {entry.fqn!r}"),
                    out_spec=load_spec(s.out_spec, f"module_call_graph entry {entry.fqn!r}"),
                    forward_arg_names=list(s.forward_arg_names) if s.forward_arg_names is not None else None,
                )
            entries.append(ep_mod.ModuleCallEntry(fqn=entry.fqn, signature=signature))
        if not entries:
            # A Program built by hand has no call graph; give ep.module() the flat calling
            # convention: positional user inputs in, a tuple of user outputs out.
            in_spec = pytree.tree_flatten(((0,) * n_user_inputs, {}))[1]
            out_spec = pytree.tree_flatten((0,) * n_user_outputs)[1]
            entries.append(ep_mod.ModuleCallEntry(fqn="", signature=ep_mod.ModuleCallSignature(
                inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec
            )))
        return entries

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        sig = self.program.signature
        params = {s.target for s in sig.inputs if isinstance(s, ir.ParameterInput)}
        mutable = {s.target for s in sig.outputs if isinstance(s, (ir.BufferMutation, ir.UserInputMutation))}
        buffers = {s.target: s.persistent for s in sig.inputs if isinstance(s, ir.BufferInput)}
        constants = {s.target for s in sig.inputs if isinstance(s, ir.ConstantTensorInput)}
        state_dict: dict[str, Any] = {}
        constant_table: dict[str, Any] = {}
        for entry in self.program.state:
            target = entry.target
            where = f"state entry {target!r}"
            if target in params:
                t = tensor_from_data(entry.value, where=where)
                state_dict[target] = torch.nn.Parameter(t, requires_grad=entry.value.meta.requires_grad)
            elif target in buffers:
                # Buffers may be written by the running program: never alias the IR's payload.
                t = tensor_from_data(entry.value, where=where, copy=True)
                (state_dict if buffers[target] else constant_table)[target] = t
            elif target in constants:
                constant_table[target] = tensor_from_data(entry.value, where=where, copy=target in mutable)
            else:
                state_dict[target] = tensor_from_data(entry.value, where=where)
        return state_dict, constant_table

    def exported_program(self) -> ExportedProgram:
        program = self.program
        verifier = _VERIFIERS.get(program.dialect)
        if verifier is None:
            raise UnsupportedError(
                f"program dialect {program.dialect!r} cannot be rebuilt as a torch ExportedProgram; "
                f"only {sorted(_VERIFIERS)} programs can"
            )
        state_dict, constants = self.state()
        # ExportedProgram builds the GraphModule itself: handing it the graph saves a codegen pass.
        root, fx_graph = self.build_graph(program.graph, "")
        table = program.graph.metas
        metas: dict[str, ir.ValueMeta | None] = {}
        placeholder_names: list[str] = []
        for node in program.graph.nodes:
            if not isinstance(node, ir.Output):
                metas[node.name] = None if node.meta_id is None else table[node.meta_id]
                if isinstance(node, ir.Placeholder):
                    placeholder_names.append(node.name)
        out = program.graph.nodes[-1]
        if not isinstance(out, ir.Output):
            raise ConversionError("the program graph does not end in an Output node; run texir.ir.verify")
        signature = self.signature(metas, placeholder_names, out.args)
        n_user_in = sum(isinstance(s, ir.UserInput) for s in program.signature.inputs)
        n_user_out = sum(isinstance(s, ir.UserOutput) for s in program.signature.outputs)
        call_graph = self.module_call_graph(metas, n_user_in, n_user_out)
        range_constraints = {sym: self.ranges[sym] for sym in self.symbols.values()}
        try:
            return ExportedProgram(
                root=root,
                graph=fx_graph,
                graph_signature=signature,
                state_dict=state_dict,
                range_constraints=range_constraints,
                module_call_graph=call_graph,
                constants=constants,
                verifiers=[verifier],
            )
        except Exception as exc:  # torch raises many types; report them as one texir error
            raise ConversionError(f"torch rejected the rebuilt ExportedProgram: {exc}") from exc


# EDGE_PARTITIONABLE: texir.edge.pipeline's to_edge rewrites applied (still ATen operators, which is
# how partitioners and backends read it; texir.executorch swaps in edge operators).
_VERIFIERS: dict[str, type[Verifier]] = {
    "ATEN": Verifier, "TRAINING": TrainingIRVerifier, "EDGE_PARTITIONABLE": Verifier,
}

_ARG_SPEC_BY_META: dict[type, Any] = {
    ir.TensorMeta: gs.TensorArgument,
    ir.SymIntMeta: gs.SymIntArgument,
    ir.SymFloatMeta: gs.SymFloatArgument,
    ir.SymBoolMeta: gs.SymBoolArgument,
    ir.CustomObjMeta: gs.CustomObjArgument,
    ir.TokenMeta: gs.TokenArgument,
}

_OUTPUT_KINDS: dict[type, gs.OutputKind] = {
    ir.BufferMutation: gs.OutputKind.BUFFER_MUTATION,
    ir.UserInputMutation: gs.OutputKind.USER_INPUT_MUTATION,
    ir.LossOutput: gs.OutputKind.LOSS_OUTPUT,
    ir.GradientToParameter: gs.OutputKind.GRADIENT_TO_PARAMETER,
    ir.GradientToUserInput: gs.OutputKind.GRADIENT_TO_USER_INPUT,
    ir.TokenOutput: gs.OutputKind.TOKEN,
}




def to_exported_program(program: ir.Program) -> ExportedProgram:
    """Rebuild a runnable ExportedProgram (fake-tensor metadata, provenance, state) from a Program."""
    if not isinstance(program, ir.Program):
        raise ConversionError(f"expected a texir.ir.Program, got {type(program).__name__}")
    with gc_paused(), lazy_graph_module_codegen():
        return _ToFx(program).exported_program()


def rebuilt_exported(
    ep: ExportedProgram,
    *,
    graph_module: torch.fx.GraphModule | None = None,
    graph_signature: gs.ExportGraphSignature | None = None,
    state_dict: dict[str, Any] | None = None,
    verifiers: list[type[Verifier]] | None = None,
    graph: torch.fx.Graph | None = None,
) -> ExportedProgram:
    """A new ExportedProgram of `ep` with the given parts replaced (its graph is `graph_module`'s)
    and every other field `ep`'s own: range constraints, module call graph, example inputs,
    constants, and its verifiers unless `verifiers` is given. Building it runs the verifiers.

    `graph`, instead of `graph_module`: a new graph on `ep`'s module whose Python code (and that
    of the module ExportedProgram wraps it in) is generated when first asked for, not twice here:
    the programs texir decomposes are converted and shown to partitioners, seldom run."""
    if graph is not None:
        graph_module = _LazyGraphModule(ep.graph_module, graph)
    gm = ep.graph_module if graph_module is None else graph_module
    with lazy_graph_module_codegen() if graph is not None else contextlib.nullcontext():
        return ExportedProgram(
            root=gm,
            graph=gm.graph,
            graph_signature=ep.graph_signature if graph_signature is None else graph_signature,
            state_dict=ep.state_dict if state_dict is None else state_dict,
            range_constraints=ep.range_constraints,
            module_call_graph=ep.module_call_graph,
            example_inputs=ep.example_inputs,
            constants=ep.constants,
            verifiers=list(ep.verifiers) if verifiers is None else verifiers,
        )
