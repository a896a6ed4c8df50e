"""The IR's naming vocabulary: reserved targets, reference renaming and fresh-name allocation."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from texir.ir.types import (
    Argument,
    CallFunction,
    GetAttr,
    InputSpec,
    ListArg,
    Node,
    OutputSpec,
    Placeholder,
    Ref,
    TupleArg,
    UserInput,
    UserOutput,
)

__all__ = [
    "CALL_DELEGATE",
    "GETITEM",
    "INLINE_CONSTANT",
    "MEMORY_VIEW",
    "NameAllocator",
    "rename_arg",
    "rename_input_spec",
    "rename_node",
    "rename_output_spec",
]

CALL_DELEGATE = "texir::call_delegate"
"""Target of a node that runs a lowered module: args are (get_attr of the module, *inputs)."""
GETITEM = "_operator::getitem"
"""Target of a node that reads item `i` of a multi-output value: args are (value, IntArg(i))."""
MEMORY_VIEW = "texir::memory_view"
"""Target of a reshape that may share its base's memory (exir's `memory.view`, which
ReplaceViewCopyWithViewPass makes of a `view_copy` no output reads): args are view_copy's (base, size).
Only `EDGE` programs hold it; the emitter aliases the base where its memory allows, else copies."""
INLINE_CONSTANT = "texir::inline_constant"
"""Target of a 0-dim constant tensor written where its one user is emitted, not lifted to a
placeholder: args are (the bool/int/float literal,); the node's `TensorMeta` dtype is the dtype the
user computes in (the literal's own dtype -- bool, int64, float32 as torch.tensor makes it -- is
cast to it there). `texir.edge.inline_mixed_scalars` makes it; only `EDGE` programs hold it."""


def rename_arg(arg: Argument, names: Mapping[str, str]) -> Argument:
    """`arg` with every reference renamed through `names` (unmapped names kept); unchanged args are
    returned as they are, so renaming with an empty map allocates nothing."""
    if isinstance(arg, Ref):
        new = names.get(arg.name)
        return arg if new is None else Ref(name=new)
    if isinstance(arg, (ListArg, TupleArg)):
        items = tuple(rename_arg(a, names) for a in arg.items)
        if all(a is b for a, b in zip(items, arg.items)):
            return arg
        return type(arg)(items=items)
    return arg


def rename_node(node: Node, names: Mapping[str, str], *, rename_self: bool = True) -> Node:
    """`node` with its references, and its own name when `rename_self`, renamed through `names`."""
    own = names.get(node.name, node.name) if rename_self else node.name
    if isinstance(node, (Placeholder, GetAttr)):
        return node if own == node.name else msgspec.structs.replace(node, name=own)
    args = tuple(rename_arg(a, names) for a in node.args)
    if isinstance(node, CallFunction):
        kwargs = tuple((k, rename_arg(v, names)) for k, v in node.kwargs)
        if own == node.name and all(a is b for a, b in zip(args, node.args)) and all(
            a[1] is b[1] for a, b in zip(kwargs, node.kwargs)
        ):
            return node
        return msgspec.structs.replace(node, name=own, args=args, kwargs=kwargs)
    if all(a is b for a, b in zip(args, node.args)):
        return node
    return msgspec.structs.replace(node, args=args)


def rename_input_spec(spec: InputSpec, names: Mapping[str, str]) -> InputSpec:
    """An input spec whose placeholder reference follows `names`."""
    if isinstance(spec, UserInput):
        return UserInput(arg=rename_arg(spec.arg, names))
    new = names.get(spec.name)
    return spec if new is None else msgspec.structs.replace(spec, name=new)


def rename_output_spec(spec: OutputSpec, names: Mapping[str, str]) -> OutputSpec:
    """An output spec whose value reference follows `names`."""
    if isinstance(spec, UserOutput):
        return UserOutput(arg=rename_arg(spec.arg, names))
    new = names.get(spec.name)
    return spec if new is None else msgspec.structs.replace(spec, name=new)


class NameAllocator:
    """FX-like unique naming over a set of names in use: ``base``, ``base_1``, ``base_2``, ..."""

    def __init__(self, used: set[str] | None = None) -> None:
        self.used: set[str] = used if used is not None else set()
        # One counter per base, shared by both spellings (as FX's namer keeps one per base).
        self._counters: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        """`base` if free, else the first free ``base_N`` (N from 1); the name is then in use."""
        count = self._counters.get(base, 0)
        while True:
            name = base if count == 0 else f"{base}_{count}"
            count += 1
            if name not in self.used:
                self._counters[base] = count
                self.used.add(name)
                return name

    def fresh_indexed(self, base: str) -> str:
        """The first free ``base_N`` with N from 0 (ExecuTorch's lowered-module names)."""
        count = self._counters.get(base, 0)
        while f"{base}_{count}" in self.used:
            count += 1
        self._counters[base] = count + 1
        self.used.add(f"{base}_{count}")
        return f"{base}_{count}"
