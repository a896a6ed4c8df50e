"""ExecuTorch 1.5.1's InsertPadQDQPass on the working graph: a zero padding of a per-tensor
dequantized value that no quantize follows gets an implicit quantize/dequantize pair with the
dequantize's params after it, so that XNNPACK pads the int8 values (a quantized convolution reads
the pad its config took into its pattern as a quantized input)."""

from __future__ import annotations

from texir.backends.xnnpack.graph import XGraph, WorkNode
from texir.backends.xnnpack.quant import QUANTS
from texir.backends.xnnpack.ops import DQ_PER_TENSOR, PAD, Q_PER_TENSOR

__all__ = ["insert_pad_qdq"]


def insert_pad_qdq(g: XGraph) -> None:
    for pad in list(g.nodes):
        if pad.target != PAD or not isinstance(pad.args[0], WorkNode) or pad.args[0].target != DQ_PER_TENSOR:
            continue
        value = pad.args[2] if len(pad.args) > 2 else 0.0
        if value != 0.0 or any(p < 0 for p in pad.args[1]) or any(u.target in QUANTS for u in g.users(pad)):
            continue
        params = pad.args[0].args[1:]
        q = WorkNode(f"{pad.name}_q", Q_PER_TENSOR, [pad, *params], {}, pad.meta, pad.handle, implicit=True)
        g.insert_after(pad, q)
        dq = WorkNode(f"{pad.name}_dq", DQ_PER_TENSOR, [q, *params], {}, pad.meta, pad.handle, implicit=True)
        g.insert_after(q, dq)
        g.replace_all_uses(pad, dq)
        g.replace_input(q, dq, pad)
