"""The one-line entries of a program's text (texir.ir.parser): signature input and output specs,
range constraints, module call signatures, backend node metadata and quoted strings. Each reads one
line through its `Cursor` and returns the IR struct it spells."""

from __future__ import annotations

from texir.ir.parse_expr import NAME, WORD, Cursor
from texir.ir.types import (
    Argument, BackendNodeMeta, BufferInput, BufferMutation, ConstantTensorInput, CustomObjInput,
    GradientToParameter, GradientToUserInput, InputSpec, ListArg, LossOutput, ModuleCallEntry,
    ModuleCallSignature, OutputSpec, ParameterInput, RangeConstraint, Ref, TokenInput, TokenOutput,
    UserInput, UserInputMutation, UserOutput,
)

__all__ = [
    "read_backend_meta", "read_input_spec", "read_module_call", "read_output_spec", "read_quoted",
    "read_range_constraint",
]


def read_input_spec(c: Cursor) -> InputSpec:
    arg = c.arg()
    c.expect(": ")
    kind = c.match(WORD, "an input kind")
    if kind == "user_input":
        c.end()
        return UserInput(arg=arg)
    name = _ref_name(c, arg)
    if kind == "token":
        c.end()
        return TokenInput(name=name)
    kinds = {"parameter": ParameterInput, "buffer": BufferInput, "constant": ConstantTensorInput,
             "custom_obj": CustomObjInput}
    if kind not in kinds:
        c.pos -= len(kind)
        c.fail("user_input, parameter, buffer, constant, custom_obj or token")
    c.expect(" ")
    target = c.rest()
    if kind == "buffer":
        persistent = not target.endswith(" (non-persistent)")
        return BufferInput(name=name, target=target.removesuffix(" (non-persistent)"), persistent=persistent)
    return kinds[kind](name=name, target=target)  # type: ignore[no-any-return]  # an InputSpec class

def read_output_spec(c: Cursor) -> OutputSpec:
    arg = c.arg()
    c.expect(": ")
    kind = c.match(WORD, "an output kind")
    if kind == "user_output":
        c.end()
        return UserOutput(arg=arg)
    name = _ref_name(c, arg)
    if kind in ("loss", "token"):
        c.end()
        return LossOutput(name=name) if kind == "loss" else TokenOutput(name=name)
    kinds: dict[str, type[BufferMutation | UserInputMutation | GradientToParameter | GradientToUserInput]] = {
        "buffer_mutation": BufferMutation, "user_input_mutation": UserInputMutation,
        "gradient_to_parameter": GradientToParameter, "gradient_to_user_input": GradientToUserInput}
    if kind not in kinds:
        c.pos -= len(kind)
        c.fail(", ".join(["user_output", "loss", "token", *kinds]))
    c.expect(" ")
    return kinds[kind](name=name, target=c.rest())

def _ref_name(c: Cursor, arg: Argument) -> str:
    if not isinstance(arg, Ref):
        c.pos = 0
        c.fail("a %name")
    return arg.name

def read_range_constraint(c: Cursor) -> RangeConstraint:
    symbol = c.balanced(": [")
    c.pos += 3
    low = c.integer()
    c.expect(", ")
    high = None if c.eat("inf") else c.integer()
    c.expect("]")
    hint = c.integer() if c.eat(" hint=") else None
    c.end()
    return RangeConstraint(symbol=symbol, min=low, max=high, hint=hint)

def read_module_call(c: Cursor) -> ModuleCallEntry:
    fqn = c.string()
    if not c.eat(": "):
        c.end()
        return ModuleCallEntry(fqn=fqn)
    c.keyed("inputs")
    inputs = c.arg()
    c.expect(" ")
    c.keyed("outputs")
    outputs = c.arg()
    c.expect(" ")
    c.keyed("in_spec")
    in_spec = c.string()
    c.expect(" ")
    c.keyed("out_spec")
    out_spec = c.string()
    names: tuple[str, ...] | None = None
    if c.eat(" forward_arg_names="):
        value = c.literal()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            c.fail("a list of quoted names")
        names = tuple(value)
    c.end()
    if not isinstance(inputs, ListArg) or not isinstance(outputs, ListArg):
        c.fail("inputs=[...] and outputs=[...]")
    return ModuleCallEntry(fqn=fqn, signature=ModuleCallSignature(
        inputs=inputs.items, outputs=outputs.items, in_spec=in_spec, out_spec=out_spec,
        forward_arg_names=names,
    ))

def read_quoted(c: Cursor) -> str:
    text = c.string()
    c.end()
    return text

def read_backend_meta(c: Cursor) -> BackendNodeMeta:
    c.expect("%")
    node = c.match(NAME, "a node name")
    c.expect(" ")
    key = c.string()
    c.expect(": ")
    value = c.string()
    c.end()
    return BackendNodeMeta(node=node, key=key, value=value)
