"""texir's two changes to torch internals (texir.adapters.torch_patches) still fit torch: these
fail when torch renames or reshapes what the patches rely on, before a user meets a bare error."""

from __future__ import annotations

import inspect

import torch
from torch.export import exported_program as ep_mod
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.experimental import proxy_tensor
from torch.utils import _pytree as pytree

from texir.adapters import from_exported_program, to_exported_program
from texir.adapters.torch_patches import lazy_graph_module_codegen, name_structseq_types, run_decompositions


class _Relu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu()


def test_export_still_builds_its_graph_module_through_the_patched_hook() -> None:
    hook = getattr(ep_mod, "_create_graph_module_for_export", None)
    assert callable(hook), "torch.export no longer has _create_graph_module_for_export"
    assert list(inspect.signature(hook).parameters)[:2] == ["root", "graph"]
    with lazy_graph_module_codegen():
        assert ep_mod._create_graph_module_for_export is not hook
        ep = torch.export.export(_Relu(), (torch.randn(2),), strict=False)
        rebuilt = to_exported_program(from_exported_program(ep))
    assert ep_mod._create_graph_module_for_export is hook, "the hook was not restored"
    assert isinstance(rebuilt.graph_module, _LazyGraphModule)
    assert torch.equal(rebuilt.module()(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


def test_structseq_return_types_get_a_serialized_name() -> None:
    assert hasattr(pytree, "SUPPORTED_SERIALIZED_TYPES") and hasattr(pytree, "SERIALIZED_TYPE_TO_PYTHON_TYPE")
    assert hasattr(pytree, "NO_SERIALIZED_TYPE_NAME_FOUND")
    cls = type(torch.randn(2, 3).max(dim=0))
    assert cls.__module__ == "torch.return_types" and cls in pytree.SUPPORTED_SERIALIZED_TYPES
    name_structseq_types()
    name_structseq_types()  # idempotent
    assert pytree.SUPPORTED_SERIALIZED_TYPES[cls].serialized_type_name == f"torch.return_types.{cls.__name__}"
    _, spec = pytree.tree_flatten(torch.randn(2, 3).max(dim=0))
    assert pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec


def test_run_decompositions_leaves_no_traced_graph_in_torchs_globals() -> None:
    """torch keeps the last export trace's graph in a module-level map (read only by that trace's own
    leak check); texir's run_decompositions empties it, so a lowered program's retrace graphs do
    not outlive `lower`."""

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.silu(x) + 1

    ep = torch.export.export(M(), (torch.randn(2, 3),))
    ep.run_decompositions({})
    stale = proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT
    assert stale, "torch no longer keeps the map: the clearing in run_decompositions can go"
    out = run_decompositions(ep, {})
    assert not proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT
    assert torch.equal(out.module()(torch.ones(2, 3)), M()(torch.ones(2, 3)))
