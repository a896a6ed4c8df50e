"""The only places texir changes torch's internals, each small, additive and explained; tests/test_torch_patches.py fails when torch changes what they rely on."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export import exported_program as ep_mod
from torch.fx.experimental import proxy_tensor
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils import _pytree as pytree

from texir._torchvision import make_torchvision_importable

__all__ = ["lazy_graph_module_codegen", "make_torchvision_importable", "name_structseq_types", "run_decompositions"]


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


def run_decompositions(ep: ExportedProgram, table: Mapping[Any, Callable[..., Any]]) -> ExportedProgram:
    """`ep.run_decompositions(table)`, leaving no graph of the retrace behind in torch's globals."""
    with warnings.catch_warnings():
        # torch deep-copies pytree specs inside run_decompositions and trips its own LeafSpec
        # deprecation warning: noise a caller cannot act on.
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                category=FutureWarning)
        out: ExportedProgram = ep.run_decompositions(dict(table))
    # Every make_fx trace for export (each retrace included) refills a module-level map from fake
    # tensor ids to the traced graph's nodes, which only that export's fake-tensor leak check reads.
    # The last trace's graph (every node, its metadata and fake values: ~0.5 MiB a Llama layer)
    # stays alive through it until the next trace: through the rest of `lower` and after it.
    stale = getattr(proxy_tensor, "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT", None)
    if isinstance(stale, dict):
        stale.clear()
    return out
