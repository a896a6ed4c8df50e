"""What ExecuTorch's `to_edge` accepts after decomposition, as a check texir runs by default.

ExecuTorch 1.5.1 verifies every decomposed program (exir's ATen dialect verifier) and refuses an
ATen operator that is neither in core ATen (torch's `core` tag) nor a `*_copy` view variant
(`view_copy` tag) nor on its short exception list (symbolic-size ops, the graph asserts it removes
and a few ops it has no decomposition for). Ops of other namespaces (quantization primitives,
custom ops) and ops a partitioner asked to keep pass. texir converts more than that, and some of
those programs run, but nothing tests that they do: one (`unfold` of a 0-d tensor) aborts the
runtime process that loads it. So `from_exported_program(ep, decompose=True)` and `lower` refuse
them too, naming the op and the node, unless the caller opts in with `allow_non_core=True`."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch._ops import OpOverload

from texir.adapters.decompositions import graph_modules
from texir.adapters.targets import canonical_target
from texir.errors import UnsupportedError

__all__ = ["EXCEPTIONS", "TRAINING_ONLY", "NonCoreOperatorError", "TrainingModeError", "check_core_aten", "check_core_aten_node",
           "is_edge_allowed"]

EXCEPTIONS: frozenset[str] = frozenset({
    # exir's ATen verifier lets these through although torch does not tag them core
    "aten::mkldnn_rnn_layer.default", "aten::_upsample_bilinear2d_aa.default",
    "aten::quantize_per_tensor.default", "aten::dequantize.self", "aten::max.default",
    "aten::min.default", "aten::full_like.default",
    # symbolic-size ops (ExecuTorch's own prim ops at emission)
    "aten::sym_stride.int", "aten::sym_size.int", "aten::sym_numel.default",
    "aten::_local_scalar_dense.default", "aten::sym_constrain_range_for_size.default",
    "aten::sym_constrain_range.default",
    # to_edge's disallow list: removed or lowered specially
    "aten::_assert_scalar.default", "aten::_assert_async.msg", "aten::scalar_tensor.default",
    # graph asserts texir's edge passes remove before emission, as ExecuTorch's do
    "aten::_assert_tensor_metadata.default", "aten::_assert_async.default",
    "aten::_functional_assert_async.msg", "aten::_functional_sym_constrain_range.default",
    "aten::_functional_sym_constrain_range_for_size.default",
})
"""ATen ops accepted without the `core` or `view_copy` tag (ExecuTorch 1.5.1's
`_get_core_aten_ops_exception_list` and `DISALLOW_LIST`, and the asserts texir drops)."""


class NonCoreOperatorError(UnsupportedError):
    """A decomposed program holds an ATen operator outside core ATen, which ExecuTorch's `to_edge`
    refuses."""


class TrainingModeError(NonCoreOperatorError):
    """The program was exported from a module in training mode: it holds a batch norm updating its
    running statistics, outside core ATen. (Dropout in training mode is `native_dropout`, a core op
    ExecuTorch's `to_edge` accepts: texir accepts it too.)"""


TRAINING_ONLY: dict[str, int] = {
    "aten::_native_batch_norm_legit_functional.default": 5,
    "aten::_native_batch_norm_legit.default": 5,
    "aten::_native_batch_norm_legit.no_stats": 3,
    "aten::native_batch_norm.default": 5,
}
"""Non-core ops of a module exported in training mode, with the position of their `training`
argument (True there means training)."""


def _in_training(name: str | None, args: tuple[object, ...]) -> bool:
    position = TRAINING_ONLY.get(name or "")
    return position is not None and len(args) > position and args[position] is True


@functools.cache
def is_edge_allowed(op: OpOverload) -> bool:
    """`op` passes ExecuTorch's ATen dialect verifier (see the module docstring)."""
    if op.namespace != "aten":
        return True
    if canonical_target(op) in EXCEPTIONS:
        return True
    return torch.Tag.core in op.tags or torch.Tag.view_copy in op.tags


def check_core_aten(ep: torch.export.ExportedProgram, keep: Iterable[str] = ()) -> None:
    """Raise `NonCoreOperatorError` for the first node of `ep` (nested graphs included) whose ATen
    op ExecuTorch's `to_edge` would refuse; ops named in `keep` (what partitioners keep whole)
    pass."""
    kept = set(keep)
    for path, gm in graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            target = node.target
            if node.op == "call_function" and isinstance(target, OpOverload):
                check_core_aten_node(f"{path}/{node.name}" if path else node.name, target, tuple(node.args), kept)


def check_core_aten_node(where: str, target: OpOverload, args: tuple[object, ...], kept: set[str]) -> None:
    """`check_core_aten` for one node (`where` names it), with its ATen op and arguments."""
    if is_edge_allowed(target):
        return
    name = canonical_target(target)
    if name in kept:
        return
    if _in_training(name, args):
        raise TrainingModeError(
            f"node {where!r}: {name} updates batch norm's running statistics, which only a module in "
            "training mode does; call model.eval() before torch.export.export"
        )
    raise NonCoreOperatorError(
        f"node {where!r}: {name} is not a core ATen operator after decomposition, and ExecuTorch's "
        "to_edge refuses it (its runtime has no tested kernel for it); rewrite the model to avoid it, "
        "have a partitioner keep and delegate it, or pass allow_non_core=True (`texir lower "
        "--allow-non-core`) to emit it anyway, at the risk of a program that fails or aborts at run time"
    )
