"""Operator schemas at the torch edge: what `from_exported_program` records in `Program.op_schemas`.

Everything below the adapters reads operator schemas from `texir.ir.op_facts` (texir's packaged
table of torch's registry, plus a program's own `op_schemas`) and never asks torch. This module
fills the second source: at import, the schema strings of the operators a program calls that the
packaged table does not hold (custom ops, ops of namespaces texir does not ship), as torch prints
them.
"""

from __future__ import annotations

import torch

from texir.ir.analysis import walk_graphs
from texir.ir.op_facts import op_table
from texir.ir.op_schema import split_target
from texir.ir.types import CallFunction, Program

__all__ = ["recorded_op_schemas"]

_NOT_OPERATORS = ("higher_order::", "texir::")


def recorded_op_schemas(program: Program) -> tuple[str, ...]:
    """The schema strings (every overload, as torch prints them, sorted) of the operators `program`
    calls that texir's packaged table lacks and torch's registry knows; what `Program.op_schemas`
    holds so the edge passes and the emitter can read them without torch."""
    table = op_table()
    names: set[str] = set()
    for _, graph in walk_graphs(program.graph):
        for node in graph.nodes:
            if isinstance(node, CallFunction) and "::" in node.target and not node.target.startswith(_NOT_OPERATORS):
                name = split_target(node.target)[0]
                if not table.knows(name):
                    names.add(name)
    texts = {str(s) for name in names for s in torch._C._jit_get_schemas_for_operator(name)}
    return tuple(sorted(texts))
