"""The only places texir changes torch's internals, each small, additive and explained; tests/test_torch_patches.py fails when torch changes what they rely on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
from torch.export import exported_program as ep_mod
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils import _pytree as pytree

__all__ = ["lazy_graph_module_codegen", "name_structseq_types"]


def name_structseq_types() -> None:
    # torch registers its structseq return types (torch.return_types.max, ...) as pytree nodes
    # without a serialization name, so a program returning `x.max(dim=0)` cannot have its
    # out_spec dumped. Give them their import path as name (idempotent, additive).
    for cls, node_def in list(pytree.SUPPORTED_SERIALIZED_TYPES.items()):
        if node_def.serialized_type_name == pytree.NO_SERIALIZED_TYPE_NAME_FOUND and \
                getattr(cls, "__module__", "") == "torch.return_types":
            name = f"torch.return_types.{cls.__name__}"
            pytree.SUPPORTED_SERIALIZED_TYPES[cls] = node_def._replace(serialized_type_name=name)
            pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] = cls


@contextlib.contextmanager
def lazy_graph_module_codegen() -> Iterator[None]:
    # ExportedProgram wraps the graph in a GraphModule, whose constructor generates and compiles
    # Python source for the whole graph: more than half of IR -> FX time on large graphs. torch's
    # own _LazyGraphModule defers that to the first call of forward/code (inductor uses it for
    # the same reason), so have ExportedProgram build one of those while we construct it.
    original = getattr(ep_mod, "_create_graph_module_for_export", None)
    if original is None:
        yield
        return

    def create_lazy(root: Any, graph: torch.fx.Graph) -> torch.fx.GraphModule:
        return _LazyGraphModule(root, graph)

    ep_mod._create_graph_module_for_export = create_lazy
    try:
        yield
    finally:
        ep_mod._create_graph_module_for_export = original
