"""The `.ptd` a transformers text-generation export lowered with texir's native XNNPACK is expected
to hold, predicted from the module before `torch.export` runs, so that a `PtdDraft` writes the
weights while the export traces (issue 42: on a 2-core machine the export keeps one core busy in
Python and the disk idle; an 8B model's 16 GB take the disk ~8 s).

The prediction (`predicted_ptd`) is what the lowering does to such a model as far as the module
shows it: the weights of `torch.nn.Linear` modules become XNNPACK's named data (keyed by digest, in
module order); every other parameter and buffer is an external constant under its fully qualified
name (parameters in module order, then buffers), but for the KV cache, which the program mutates
(transformers' exportable wrappers register their `static_cache` tensors as buffers of their
own), and for buffers the forward does not read (`_UNREAD`). A wrong guess costs time, never bytes:
`dump_ptd` writes what the draft did not put in place, and a draft whose header differs is dropped."""

from __future__ import annotations

import torch

from texir.adapters.tensors import DTYPE_FROM_TORCH, _byte_view
from texir.backends.xnnpack.backend import NAMED_DATA_ALIGNMENT
from texir.ir.blob import Blob
from texir.serialize.pte import PtdEntry, PtdFile, TensorLayout
from texir.serialize.pte.dtypes import DTYPE_TO_SCALAR_TYPE

__all__ = ["predicted_ptd"]

_DIGEST_LENGTH = 64
_UNREAD = ("original_inv_freq",)
"""Buffers transformers' rotary embeddings keep for dynamic RoPE scaling, which a static-cache export
does not read (torch.export leaves unread buffers out of the program)."""


def predicted_ptd(module: torch.nn.Module) -> PtdFile:
    """The predicted `.ptd` of `module`, the module `torch.export` is given (its real weights, by
    reference: nothing is copied; call it before `weightless`), for `texir.serialize.pte.PtdDraft`.
    Named-data keys are placeholders of a digest's length."""
    external: dict[int, tuple[str, torch.Tensor]] = {}
    linear: dict[int, torch.Tensor] = {}
    for path, sub in module.named_modules(remove_duplicate=False):
        for name, param in sub._parameters.items():
            if param is None or type(param.data) is not torch.Tensor or param.device.type != "cpu":
                continue  # a tensor subclass (torchao's packed weights) or no data: not predicted
            if isinstance(sub, torch.nn.Linear):
                linear.setdefault(id(param), param)
            else:
                external.setdefault(id(param), (f"{path}.{name}" if path else name, param))
    cache = {id(b) for sub in module.modules() if hasattr(sub, "static_cache") for b in sub.buffers(recurse=False)}
    for fqn, buffer in module.named_buffers():
        if id(buffer) not in cache and fqn.rpartition(".")[2] not in _UNREAD:
            external.setdefault(id(buffer), (fqn, buffer))
    entries = [PtdEntry(key=fqn, data=_blob(t, fqn), layout=_layout(t, fqn)) for fqn, t in external.values()]
    entries += [PtdEntry(key=f"{k:0{_DIGEST_LENGTH}x}", data=_blob(t, "linear weight"), alignment=NAMED_DATA_ALIGNMENT)
                for k, t in enumerate(linear.values())]
    return PtdFile(entries=tuple(entries))


def _blob(t: torch.Tensor, where: str) -> Blob:
    return Blob(_byte_view(t, where)[1])


def _layout(t: torch.Tensor, where: str) -> TensorLayout | None:
    dtype = DTYPE_FROM_TORCH.get(t.dtype)
    scalar = DTYPE_TO_SCALAR_TYPE.get(dtype) if dtype is not None else None
    if scalar is None:
        return None  # the program cannot hold it as a constant: the prediction is wrong there, harmlessly
    return TensorLayout(scalar_type=scalar, sizes=tuple(t.shape), dim_order=tuple(range(t.dim())))
