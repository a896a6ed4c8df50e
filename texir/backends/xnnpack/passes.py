"""The native XNNPACK backend's passes on the working graph, as a named pipeline: ExecuTorch 1.5.1's
default XNNPACK pass list, as far as this backend implements it, in its order. `run_passes` names
the pass in any error one raises and, with TEXIR_VERIFY=1 (the test suite sets it), checks the
graph after every pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec

from texir.backends.xnnpack.batch_norm import decompose_batch_norm, fuse_batch_norm
from texir.backends.xnnpack.channels_last import max_dims_as_amax, remove_redundant_copies, tag_channels_last
from texir.backends.xnnpack.errors import XnnpackPassError, XnnpackUnsupportedError
from texir.backends.xnnpack.graph import (
    XGraph,
    conv1d_as_conv2d,
    fuse_activations,
    remove_clones,
    revert_dim_order_copies,
    split_concatenations,
)
from texir.backends.xnnpack.pad_qdq import insert_pad_qdq
from texir.edge.pipeline import verify_enabled

__all__ = ["PASSES", "XnnpackPass", "run_passes"]


class XnnpackPass(msgspec.Struct, frozen=True):
    """One rewrite of the working graph (in place: the graph never leaves `preprocess`), named, with
    the ExecuTorch pass it mirrors."""

    name: str
    fn: Callable[[XGraph], None]
    mirrors: str


PASSES: Final[tuple[XnnpackPass, ...]] = (
    XnnpackPass("remove_clones", remove_clones, "XNNPACKRemoveCloneOpsTransform"),
    XnnpackPass("revert_dim_order_copies", revert_dim_order_copies, "DimOrderOpsRevertPass"),
    XnnpackPass("fuse_batch_norm", fuse_batch_norm, "FuseBatchNormPass"),
    XnnpackPass("decompose_batch_norm", decompose_batch_norm, "DecomposeBatchNorm"),
    XnnpackPass("fuse_activations", fuse_activations, "FuseActivationPass"),
    XnnpackPass("split_concatenations", split_concatenations, "DecomposeConcatenate"),
    XnnpackPass("max_dims_as_amax", max_dims_as_amax, "RemoveGetItemPass"),
    XnnpackPass("insert_pad_qdq", insert_pad_qdq, "InsertPadQDQPass"),
    XnnpackPass("conv1d_as_conv2d", conv1d_as_conv2d, "Conv1dUnsqueezePass"),
    XnnpackPass("tag_channels_last", tag_channels_last, "ChannelsLastTaggedReshapePass"),
    XnnpackPass("remove_redundant_copies", remove_redundant_copies, "RemoveRedundantCopyPass"),
)
"""ExecuTorch 1.5.1's XNNPACK pass list (those this backend needs), in its order."""


def run_passes(g: XGraph, passes: tuple[XnnpackPass, ...] = PASSES, *, check: bool | None = None) -> XGraph:
    """`g` rewritten by `passes` in order. A node a pass refuses is an `XnnpackUnsupportedError` that
    names the pass (`pass_name`); any other failure, and (with `check`, default TEXIR_VERIFY=1) a graph
    a pass leaves not well formed, is an `XnnpackPassError` naming it."""
    if check is None:
        check = verify_enabled()
    for named in passes:
        try:
            named.fn(g)
        except XnnpackUnsupportedError as exc:
            exc.pass_name = exc.pass_name or named.name
            raise
        except Exception as exc:  # any other failure of a pass is a bug, reported under the pass's name
            raise XnnpackPassError(
                f"XNNPACK backend pass {named.name} (ExecuTorch's {named.mirrors}) failed: {type(exc).__name__}: "
                f"{exc}; this is a texir bug, please report it", pass_name=named.name) from exc
        problem = g.problem() if check else None
        if problem is not None:
            raise XnnpackPassError(
                f"XNNPACK backend pass {named.name} (ExecuTorch's {named.mirrors}) left a graph that is not well "
                f"formed: {problem}; this is a texir bug, please report it", pass_name=named.name)
    return g
