"""The walk's state, from the rewritten graph to an `XNNGraph`: values in ExecuTorch's definition
order and constants as named data (the node visitors that drive it are in `visitors`)."""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.checks import refuse
from texir.backends.xnnpack.errors import XnnpackUnsupportedError
from texir.backends.xnnpack.graph import XGraph, WorkNode
from texir.backends.xnnpack.int4 import check_groups, pack_int4
from texir.backends.xnnpack.quant import QuantParams, from_inputs, from_outputs, quantize, schema_params, swapped_axis
from texir.ir import DType
from texir.ir.blob import Blob, digest_all

__all__ = ["KEEP_DIMS", "NCHW_TO_NHWC", "NHWC_TO_NCHW", "Serializer"]

UINT64_MAX: Final = 2**64 - 1
NO_HANDLE: Final = 65535
"""The debug handle of nodes preprocess creates (ExecuTorch's DEFAULT_DEBUG_HANDLE)."""
KEEP_DIMS: Final = 0x40
NCHW_TO_NHWC: Final = (0, 2, 3, 1)
NHWC_TO_NCHW: Final = (0, 3, 1, 2)
_DATATYPES: Final = {
    DType.float32: s.XNNDatatype.xnn_datatype_fp32,
    DType.float16: s.XNNDatatype.xnn_datatype_fp16,
    DType.bfloat16: s.XNNDatatype.xnn_datatype_bf16,
}


class Serializer:
    """Mutable state of one graph walk (ExecuTorch's `vals_to_ids` and the XNNGraph lists)."""

    def __init__(self, g: XGraph) -> None:
        self.g = g
        self.ids: dict[int, int] = {}
        self.values: list[s.XValue] = []
        self.xnodes: list[s.XNode] = []
        self.input_ids: list[int] = []
        self.output_ids: list[int] = []
        self.constants: list[tuple[Blob, str | None, str]] = []
        """Payload, its sha256 (None: hash the payload) and key prefix of `constant_data` entries
        1, 2, ...: the entry's named-data key is the prefix and the sha256."""
        self.named: dict[str, tuple[Blob, str]] = {}
        """Named data by key: the payload and its sha256 (the IR's content address, whatever the key)."""
        inputs = [n for n in g.nodes if n.user_input]
        outputs = g.outputs()
        self.externals: dict[int, tuple[int, int]] = {id(n): (i, 1) for i, n in enumerate(inputs)}
        for i, n in enumerate(outputs):
            if id(n) in self.externals:
                raise XnnpackUnsupportedError(
                    f"'{n.name}' is both an input and an output of the partition; XNNPACK cannot return an input",
                    node=n.name,
                )
            self.externals[id(n)] = (len(inputs) + i, 2)
        self.num_externs = len(inputs) + len(outputs)

    def id(self, n: WorkNode) -> int:
        return self.ids[id(n)]

    def define(self, n: WorkNode, *, nhwc: bool = False, swap: bool = False, groups: int = 1,
               force_fp32: bool = False, quant: QuantParams | None | str = "auto") -> int:
        """ExecuTorch's `define_tensor`: the first definition of a value fixes its id and layout.
        `quant` "auto" takes the params of an implicit dq producing `n` or an implicit q after it."""
        if id(n) in self.ids:
            return self.ids[id(n)]
        qp = (from_inputs(self, n) or from_outputs(self, n)) if isinstance(quant, str) else quant
        if qp is not None and id(qp.q_input) in self.ids:
            self.ids[id(n)] = self.ids[id(qp.q_input)]
            return self.ids[id(n)]
        nhwc = nhwc or bool(n.nhwc)
        id_out = len(self.values)
        ext_id, flags = self.external(n, qp)
        if flags == 1:
            self.input_ids.append(id_out)
        elif flags == 2:
            self.output_ids.append(id_out)
        dims = self.g.shape(n) or [1]
        if qp is not None and qp.per_channel_group:
            check_groups(n.name, dims, np.shape(qp.scale), qp.group_size, qp.axis)
            if not qp.is_qc4w:
                raise refuse("group_wise_4bit", n, f"a group-wise weight in [{qp.qmin}, {qp.qmax}] (XNNPACK's "
                             "group-wise weights are 4-bit, in [-8, 7])",
                             "quantize 8-bit weights per channel (one group per row) or group-wise weights to 4 bits")
        buffer_idx = self.constant(n, qp, nhwc=nhwc, swap=swap, groups=groups, force_fp32=force_fp32)
        if swap:
            dims = [dims[1] * groups, dims[0] // groups, *dims[2:]]
        if nhwc:
            if len(dims) != 4:
                raise XnnpackUnsupportedError(
                    f"'{n.name}' must be 4-D to be stored channels-last, got dims {dims}", node=n.name)
            dims = [dims[i] for i in NCHW_TO_NHWC]
        dtype = n.tensor.dtype
        datatype = (qp.datatype(n.name) if qp is not None
                    else s.XNNDatatype.xnn_datatype_fp32 if force_fp32 else _DATATYPES.get(dtype))
        if datatype is None:
            raise XnnpackUnsupportedError(
                f"'{n.name}' has dtype {dtype}; the native XNNPACK backend handles float32/float16 values and "
                "static int8 quantized ones only", node=n.name)
        tensor = s.XNNTensorValue(
            datatype=datatype, num_dims=len(dims), dims=tuple(dims), constant_buffer_idx=buffer_idx,
            external_id=ext_id, flags=flags, id_out=id_out,
        )
        value: s.XNNTensorValue | s.XNNQuantizedTensorValue = tensor
        if qp is not None:
            if swap:
                qp = swapped_axis(qp, len(dims))
            value = s.XNNQuantizedTensorValue(tensor_value=tensor, quant_params=schema_params(self, qp, qp.axis))
        self.values.append(s.XValue(xvalue_union=value))
        self.ids[id(n)] = id_out
        if qp is not None:
            self.ids[id(qp.q_input)] = id_out
        return id_out

    def external(self, n: WorkNode, qp: QuantParams | None) -> tuple[int, int]:
        """External id and flags (ExecuTorch's `gen_ids_and_flags`): a quantized value is external
        when the fp32 tensor it quantizes is a graph input, or when its q's only user is the output."""
        if qp is not None and qp.is_dynamic:
            n, qp = qp.q_input, None  # judged by the float tensor it quantizes
        q_in = qp is not None and qp.is_input and qp.q_input.const is None
        key: WorkNode | None = None
        if n.user_input or q_in:
            key = qp.q_input if (q_in and qp is not None and not n.user_input) else n
        elif id(n) in self.externals or (qp is not None and qp.is_output):
            key = n
            if qp is not None and qp.is_output and id(n) not in self.externals:
                key = self.g.users(n)[0]
        if key is None:
            return s.INVALID_ID, 0
        if id(key) not in self.externals:
            raise XnnpackUnsupportedError(f"'{n.name}' should be external but '{key.name}' is neither an input "
                                          "nor an output of the partition", node=n.name)
        return self.externals[id(key)]

    def constant(self, n: WorkNode, qp: QuantParams | None, *, nhwc: bool, swap: bool, groups: int,
                 force_fp32: bool) -> int:
        """The `constant_data` index of a constant's payload (0 for a non-constant). A payload kept
        as it is stays the IR's Blob; a transformed one is made once and hashed once. A quantized
        value's payload is its q input's (pt2e's folded int8 weight, kept; a float bias, quantized)."""
        const = n.const if qp is None else qp.q_input.const
        if const is None:
            if swap:
                raise XnnpackUnsupportedError(
                    f"'{n.name}': a depthwise or transposed convolution needs constant weights", node=n.name)
            return 0
        quantized = qp is not None and const.dtype == qp.dtype
        keep_dtype = quantized or (const.dtype in (DType.float16, DType.bfloat16) and not force_fp32)
        packed = qp is not None and qp.per_channel_group and qp.is_qc4w
        unchanged = const.array is None and not swap and not (nhwc and _moves(const.shape)) and not packed
        sha: str | None = None
        if unchanged and (const.dtype == DType.float32 or keep_dtype) and (qp is None or quantized):
            assert const.blob is not None
            blob, sha = const.blob, const.sha256 or None
        else:
            arr = const.numpy()
            if qp is not None and not quantized:
                arr = quantize(arr, qp, n.name)
            elif not keep_dtype:
                arr = arr.astype(np.float32, copy=False)
            if swap:
                shape = arr.shape
                arr = arr.reshape((groups, shape[0] // groups, *shape[1:]))
                arr = arr.transpose((0, 2, 1, *range(3, arr.ndim)))
                arr = arr.reshape((shape[1] * groups, shape[0] // groups, *shape[2:]))
            if nhwc:
                arr = arr.transpose(NCHW_TO_NHWC)
            if packed:
                arr = pack_int4(arr, n.name)
            arr = np.ascontiguousarray(arr)
            if arr.nbytes == 0:
                raise XnnpackUnsupportedError(f"constant '{n.name}' has no bytes", node=n.name)
            blob = Blob(arr.data.cast("B"))
        return self.add_constant(blob, sha)

    def add_constant(self, blob: Blob, sha256: str | None, prefix: str = "") -> int:
        """The `constant_data` index of a new entry holding `blob` (its sha256, when known, spares
        hashing it), stored as named data keyed `prefix + sha256`."""
        self.constants.append((blob, sha256, prefix))
        return len(self.constants)

    def emit(self, n: WorkNode, node: Any, *, min_max: tuple[float, float] | None = None) -> None:
        bounds = None if min_max is None else s.OutputMinMax(output_min=min_max[0], output_max=min_max[1])
        handle = NO_HANDLE if n.handle is None else n.handle
        self.xnodes.append(s.XNode(xnode_union=node, debug_handle=handle, output_min_max=bounds))

    def io(self, n: WorkNode, *, nhwc: bool = False) -> None:
        """`define_nodes_tensor_inputs_outputs`: the output first, then each input."""
        self.define(n, nhwc=nhwc)
        for i in n.inputs():
            self.define(i, nhwc=nhwc)

    def graph(self) -> s.XNNGraph:
        """The XNNGraph; hashes the new payloads (in parallel) and fills `named` in entry order."""
        digest_all([blob for blob, sha, _ in self.constants if sha is None])
        constant_data = [s.ConstantDataOffset()]
        for blob, sha, prefix in self.constants:
            sha = sha or blob.digest()
            key = prefix + sha
            constant_data.append(s.ConstantDataOffset(offset=UINT64_MAX, size=blob.nbytes, named_key=key))
            self.named.setdefault(key, (blob, sha))
        return s.XNNGraph(
            version="0", xnodes=tuple(self.xnodes), xvalues=tuple(self.values), num_externs=self.num_externs,
            input_ids=tuple(self.input_ids), output_ids=tuple(self.output_ids),
            constant_data=tuple(constant_data),
        )


def _moves(shape: tuple[int, ...]) -> bool:
    """Whether channels-last changes a 4-D tensor's bytes (not when C is 1 or H and W are both 1)."""
    return len(shape) == 4 and shape[1] != 1 and shape[2] * shape[3] != 1
