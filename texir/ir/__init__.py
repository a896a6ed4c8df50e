"""texir's frozen IR: types, verifier, printer, parser and canonical form. Imports neither torch nor flatbuffers."""

from texir.ir.analysis import (
    call_nodes,
    iter_refs,
    node_inputs,
    output_node,
    users,
    value_metas,
    walk_graphs,
)
from texir.ir.blob import Blob
from texir.ir.builder import GraphBuilder, build_graph
from texir.ir.canonical import canonicalize
from texir.ir.literals import float_value, literal_arg
from texir.ir.names import (
    CALL_DELEGATE,
    GETITEM,
    NameAllocator,
    rename_arg,
    rename_input_spec,
    rename_node,
    rename_output_spec,
)
from texir.ir.parser import parse_program, payloads_of
from texir.ir.printer import format_lowered_module, format_program
from texir.ir.types import *  # noqa: F403  (the IR's public names are exactly types.__all__)
from texir.ir.types import __all__ as _types_all
from texir.ir.verify import verify, verify_graph

__all__ = [
    "CALL_DELEGATE",
    "GETITEM",
    "NameAllocator",
    "rename_arg",
    "rename_input_spec",
    "rename_node",
    "rename_output_spec",
    "Blob",
    "GraphBuilder",
    "build_graph",
    "call_nodes",
    "canonicalize",
    "float_value",
    "literal_arg",
    "format_lowered_module",
    "format_program",
    "parse_program",
    "payloads_of",
    "iter_refs",
    "node_inputs",
    "output_node",
    "users",
    "value_metas",
    "verify",
    "verify_graph",
    "walk_graphs",
    *_types_all,
]
