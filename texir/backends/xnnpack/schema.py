"""Frozen msgspec mirror of ExecuTorch 1.5.1's XNNPACK delegate schema (`schema.fbs`, identifier XN01).

One Struct per flatbuffer table, same names and field order as schema.fbs. Union members that share a
table shape in schema.fbs (`XNNAdd: _XNNNode2x1`) are subclasses of that shape here, so a node's
class is its union member. `FIELDS` lists, per table, every flatbuffer slot in id order: the field
name (empty for a deprecated slot), its wire kind and, for tables and unions, what it holds. The
writer and reader in `texir.backends.xnnpack.flatbuffer` walk these tables; nothing else knows the
layout. Ids are value indices into `XNNGraph.xvalues`, as in the file.
"""

from __future__ import annotations

import enum
from typing import Final, Literal, TypeAlias

from msgspec import Struct

__all__ = [
    "ConstantDataOffset", "FIELDS", "FieldSpec", "OutputMinMax", "PerChannelGroupQuant", "PerChannelQuant",
    "PerTensorQuant", "PerTokenDynamicQuant", "QUANT_PARAMS_TYPES", "SCHEMA_FILE_IDENTIFIER", "XNNDatatype",
    "XNNGraph", "XNODE_TYPES", "XNNQuantizedTensorValue", "XNNTensorValue", "XNode", "XNodeUnion",
    "XVALUE_TYPES", "XValue", "XValueUnion", "XNNQuantParams", "INVALID_ID",
]

SCHEMA_FILE_IDENTIFIER: Final = b"XN01"
INVALID_ID: Final = 0xFFFFFFFF
"""An absent id (no bias, an unused concatenate input, a value that is not external)."""


class _Table(Struct, frozen=True, kw_only=True, gc=False):
    """Base of every schema table."""


class XNNDatatype(enum.IntEnum):
    """schema.fbs `XNNDatatype : short`."""

    xnn_datatype_invalid = 0
    xnn_datatype_fp32 = 1
    xnn_datatype_fp16 = 2
    xnn_datatype_qint8 = 3
    xnn_datatype_quint8 = 4
    xnn_datatype_qint32 = 5
    xnn_datatype_qcint8 = 6
    xnn_datatype_qcint32 = 7
    xnn_datatype_qcint4 = 8
    xnn_datatype_qdint8 = 9
    xnn_datatype_qbint4 = 10
    xnn_datatype_qpint8 = 11
    xnn_datatype_int32 = 12
    xnn_datatype_pfp32 = 13
    xnn_datatype_bf16 = 14


# -- quantization parameters ---------------------------------------------------------------------


class PerChannelGroupQuant(_Table, frozen=True, kw_only=True):
    scale: tuple[float, ...] = ()
    channel_dim: int = 0
    group_size: int = 0
    # slot 3 (scale_bf16) is deprecated
    scale_buffer_idx: int = 0
    num_scales: int = 0


class PerChannelQuant(_Table, frozen=True, kw_only=True):
    scale: tuple[float, ...] = ()
    channel_dim: int = 0
    scale_buffer_idx: int = 0
    num_scales: int = 0


class PerTokenDynamicQuant(_Table, frozen=True, kw_only=True):
    num_nonbatch_dims: int = 0


class PerTensorQuant(_Table, frozen=True, kw_only=True):
    scale: float = 0.0
    zero_point: int = 0


XNNQuantParams: TypeAlias = PerChannelQuant | PerTensorQuant | PerTokenDynamicQuant | PerChannelGroupQuant
QUANT_PARAMS_TYPES: Final[tuple[type[_Table], ...]] = (
    PerChannelQuant, PerTensorQuant, PerTokenDynamicQuant, PerChannelGroupQuant,
)
"""Union members in schema order (the union tag is the 1-based position)."""


# -- values --------------------------------------------------------------------------------------


class XNNTensorValue(_Table, frozen=True, kw_only=True):
    """A tensor of the XNNPACK subgraph; `id_out` is its index in `XNNGraph.xvalues`."""

    datatype: XNNDatatype = XNNDatatype.xnn_datatype_invalid
    num_dims: int = 0
    dims: tuple[int, ...] = ()
    constant_buffer_idx: int = 0
    """Index into `XNNGraph.constant_data`; 0 for a non-constant."""
    external_id: int = 0
    flags: int = 0
    """1 for an external input, 2 for an external output."""
    id_out: int = 0


class XNNQuantizedTensorValue(_Table, frozen=True, kw_only=True):
    tensor_value: XNNTensorValue | None = None
    quant_params: XNNQuantParams | None = None


XValueUnion: TypeAlias = XNNTensorValue | XNNQuantizedTensorValue
XVALUE_TYPES: Final[tuple[type[_Table], ...]] = (XNNTensorValue, XNNQuantizedTensorValue)


class XValue(_Table, frozen=True, kw_only=True):
    xvalue_union: XValueUnion | None = None


# -- node shapes shared by several union members -------------------------------------------------


class _XNNNode2x1(_Table, frozen=True, kw_only=True):
    input1_id: int = 0
    input2_id: int = 0
    output_id: int = 0
    flags: int = 0


class _XNNNode1x1(_Table, frozen=True, kw_only=True):
    input_id: int = 0
    output_id: int = 0
    flags: int = 0


class _XNNCat(_Table, frozen=True, kw_only=True):
    axis: int = 0
    input1_id: int = 0
    input2_id: int = 0
    input3_id: int = 0
    input4_id: int = 0
    output_id: int = 0
    flags: int = 0
    input5_id: int = 0


class _XNNNodeConv(_Table, frozen=True, kw_only=True):
    padding_top: int = 0
    padding_right: int = 0
    padding_bottom: int = 0
    padding_left: int = 0
    kernel_height: int = 0
    kernel_width: int = 0
    subsampling_height: int = 0
    subsampling_width: int = 0
    dilation_height: int = 0
    dilation_width: int = 0
    group_input_channels: int = 0
    group_output_channels: int = 0
    groups: int = 0
    adjustment_height: int = 0
    adjustment_width: int = 0
    input1_id: int = 0
    filter_id: int = 0
    bias_id: int = 0
    output_id: int = 0
    flags: int = 0


class _XNNPooling2D(_Table, frozen=True, kw_only=True):
    padding_top: int = 0
    padding_right: int = 0
    padding_bottom: int = 0
    padding_left: int = 0
    pooling_height: int = 0
    pooling_width: int = 0
    stride_height: int = 0
    stride_width: int = 0
    dilation_height: int = 0
    dilation_width: int = 0
    input_id: int = 0
    output_id: int = 0
    flags: int = 0


# -- node tables of their own --------------------------------------------------------------------


class XNNStaticTranspose(_Table, frozen=True, kw_only=True):
    num_dims: int = 0
    perm: tuple[int, ...] = ()
    input_id: int = 0
    output_id: int = 0
    flags: int = 0


class XNNStaticResizeBilinear2D(_Table, frozen=True, kw_only=True):
    new_height: int = 0
    new_width: int = 0
    input_id: int = 0
    output_id: int = 0
    flags: int = 0


class XNNStaticConstantPad(_Table, frozen=True, kw_only=True):
    pre_paddings: tuple[int, ...] = ()
    post_paddings: tuple[int, ...] = ()
    padding_value: float = 0.0
    input_id: int = 0
    output_id: int = 0
    flags: int = 0


class XNNELU(_Table, frozen=True, kw_only=True):
    alpha: float = 0.0
    input_id: int = 0
    output_id: int = 0
    flags: int = 0


class XNNFullyConnected(_Table, frozen=True, kw_only=True):
    input1_id: int = 0
    filter_id: int = 0
    bias_id: int = 0
    output_id: int = 0
    flags: int = 0


class XNNStaticReshape(_Table, frozen=True, kw_only=True):
    num_dims: int = 0
    new_shape: tuple[int, ...] = ()
    input_id: int = 0
    output_id: int = 0
    flags: int = 0


class XNNStaticSlice(_Table, frozen=True, kw_only=True):
    num_dims: int = 0
    offsets: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    input_id: int = 0
    output_id: int = 0
    flags: int = 0


class XNNScaledDotProductAttention(_Table, frozen=True, kw_only=True):
    query_id: int = 0
    key_id: int = 0
    value_id: int = 0
    scale_id: int = 0
    mask_id: int = 0
    output_id: int = 0
    flags: int = 0


class XNNArgMaxPooling2d(_Table, frozen=True, kw_only=True):
    padding_top: int = 0
    padding_right: int = 0
    padding_bottom: int = 0
    padding_left: int = 0
    pooling_height: int = 0
    pooling_width: int = 0
    input_id: int = 0
    output_value_id: int = 0
    output_index_id: int = 0
    flags: int = 0


class XNNLeakyReLU(_Table, frozen=True, kw_only=True):
    negative_slope: float = 0.0
    input_id: int = 0
    output_id: int = 0
    flags: int = 0


# -- union members that reuse a shape ------------------------------------------------------------

# fmt: off
class XNNAdd(_XNNNode2x1, frozen=True, kw_only=True): ...
class XNNSoftmax(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNSigmoid(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNClamp(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNConv2d(_XNNNodeConv, frozen=True, kw_only=True): ...
class XNNDiv(_XNNNode2x1, frozen=True, kw_only=True): ...
class XNNAvgPooling2d(_XNNPooling2D, frozen=True, kw_only=True): ...
class XNNMinimum(_XNNNode2x1, frozen=True, kw_only=True): ...
class XNNDepthwiseConv2d(_XNNNodeConv, frozen=True, kw_only=True): ...
class XNNMaxPooling2d(_XNNPooling2D, frozen=True, kw_only=True): ...
class XNNMultiply(_XNNNode2x1, frozen=True, kw_only=True): ...
class XNNSubtract(_XNNNode2x1, frozen=True, kw_only=True): ...
class XNNFloor(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNConvert(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNGlobalAvgPooling2d(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNSquareRoot(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNCeiling(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNHardswish(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNMaximum(_XNNNode2x1, frozen=True, kw_only=True): ...
class XNNNegate(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNSquare(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNAbs(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNPReLU(_XNNNode2x1, frozen=True, kw_only=True): ...
class XNNConcatenate2(_XNNCat, frozen=True, kw_only=True): ...
class XNNConcatenate3(_XNNCat, frozen=True, kw_only=True): ...
class XNNConcatenate4(_XNNCat, frozen=True, kw_only=True): ...
class XNNBatchMatrixMultiply(_XNNNode2x1, frozen=True, kw_only=True): ...
class XNNConcatenate5(_XNNCat, frozen=True, kw_only=True): ...
class XNNConvTranspose2d(_XNNNodeConv, frozen=True, kw_only=True): ...
class XNNReciprocalSquareRoot(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNLog(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNGelu(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNTanh(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNExp(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNSin(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNCopy(_XNNNode1x1, frozen=True, kw_only=True): ...
class XNNCos(_XNNNode1x1, frozen=True, kw_only=True): ...
# fmt: on

XNODE_TYPES: Final[tuple[type[_Table], ...]] = (
    XNNAdd, XNNFullyConnected, XNNSoftmax, XNNSigmoid, XNNStaticTranspose, XNNClamp, XNNConv2d, XNNDiv,
    XNNStaticResizeBilinear2D, XNNStaticConstantPad, XNNAvgPooling2d, XNNMinimum, XNNDepthwiseConv2d,
    XNNMaxPooling2d, XNNMultiply, XNNSubtract, XNNFloor, XNNConvert, XNNGlobalAvgPooling2d, XNNStaticReshape,
    XNNArgMaxPooling2d, XNNSquareRoot, XNNCeiling, XNNHardswish, XNNLeakyReLU, XNNMaximum, XNNNegate,
    XNNSquare, XNNELU, XNNAbs, XNNPReLU, XNNConcatenate2, XNNConcatenate3, XNNConcatenate4, XNNStaticSlice,
    XNNScaledDotProductAttention, XNNBatchMatrixMultiply, XNNConcatenate5, XNNConvTranspose2d,
    XNNReciprocalSquareRoot, XNNLog, XNNGelu, XNNTanh, XNNExp, XNNSin, XNNCopy, XNNCos,
)
"""`XNodeUnion` members in schema order (the union tag is the 1-based position)."""

XNodeUnion: TypeAlias = _Table
"""Any member of `XNODE_TYPES`."""


class OutputMinMax(_Table, frozen=True, kw_only=True):
    """A fused activation's clamp bounds."""

    output_min: float = 0.0
    output_max: float = 0.0


class XNode(_Table, frozen=True, kw_only=True):
    xnode_union: XNodeUnion | None = None
    debug_handle: int = 0
    output_min_max: OutputMinMax | None = None


class ConstantDataOffset(_Table, frozen=True, kw_only=True):
    """Where a constant lives: (UINT64_MAX, size, key) for named data, (0, 0, "") for entry 0."""

    offset: int = 0
    size: int = 0
    named_key: str = ""


class XNNGraph(_Table, frozen=True, kw_only=True):
    """The root table."""

    version: str = "0"
    xnodes: tuple[XNode, ...] = ()
    xvalues: tuple[XValue, ...] = ()
    num_externs: int = 0
    input_ids: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    # slots 6 (constant_buffer) and 7 (mem_buffer_sizes) are deprecated
    constant_data: tuple[ConstantDataOffset, ...] = ()


# -- wire layout ---------------------------------------------------------------------------------

Kind: TypeAlias = Literal["u32", "i32", "i16", "f32", "u64", "str", "[u32]", "[f32]", "table", "[table]", "union", "-"]


class FieldSpec(Struct, frozen=True):
    """One schema field: its Struct attribute ("" for a deprecated slot), wire kind and, for a
    table or union, the table class or the union's members. A union takes two slots."""

    name: str
    kind: Kind
    ref: tuple[type[_Table], ...] = ()


def _f(name: str, kind: Kind, *ref: type[_Table]) -> FieldSpec:
    return FieldSpec(name, kind, ref)


_2X1 = (_f("input1_id", "u32"), _f("input2_id", "u32"), _f("output_id", "u32"), _f("flags", "u32"))
_1X1 = (_f("input_id", "u32"), _f("output_id", "u32"), _f("flags", "u32"))
_CAT = tuple(_f(n, "u32") for n in (
    "axis", "input1_id", "input2_id", "input3_id", "input4_id", "output_id", "flags", "input5_id"))
_CONV = tuple(_f(n, "u32") for n in _XNNNodeConv.__struct_fields__)
_POOL = tuple(_f(n, "u32") for n in _XNNPooling2D.__struct_fields__)
_SHAPES: dict[type[_Table], tuple[FieldSpec, ...]] = {
    _XNNNode2x1: _2X1, _XNNNode1x1: _1X1, _XNNCat: _CAT, _XNNNodeConv: _CONV, _XNNPooling2D: _POOL,
}

FIELDS: dict[type[_Table], tuple[FieldSpec, ...]] = {
    PerChannelGroupQuant: (
        _f("scale", "[f32]"), _f("channel_dim", "i32"), _f("group_size", "i32"), _f("", "-"),
        _f("scale_buffer_idx", "u32"), _f("num_scales", "u32"),
    ),
    PerChannelQuant: (
        _f("scale", "[f32]"), _f("channel_dim", "i32"), _f("scale_buffer_idx", "u32"), _f("num_scales", "u32"),
    ),
    PerTokenDynamicQuant: (_f("num_nonbatch_dims", "i32"),),
    PerTensorQuant: (_f("scale", "f32"), _f("zero_point", "i32")),
    XNNTensorValue: (
        _f("datatype", "i16"), _f("num_dims", "u32"), _f("dims", "[u32]"), _f("constant_buffer_idx", "u32"),
        _f("external_id", "u32"), _f("flags", "u32"), _f("id_out", "u32"),
    ),
    XNNQuantizedTensorValue: (
        _f("tensor_value", "table", XNNTensorValue), _f("quant_params", "union", *QUANT_PARAMS_TYPES),
    ),
    XValue: (_f("xvalue_union", "union", *XVALUE_TYPES),),
    XNNStaticTranspose: (_f("num_dims", "u32"), _f("perm", "[u32]"), *_1X1),
    XNNStaticResizeBilinear2D: (_f("new_height", "u32"), _f("new_width", "u32"), *_1X1),
    XNNStaticConstantPad: (
        _f("pre_paddings", "[u32]"), _f("post_paddings", "[u32]"), _f("padding_value", "f32"), *_1X1,
    ),
    XNNELU: (_f("alpha", "f32"), *_1X1),
    XNNFullyConnected: tuple(_f(n, "u32") for n in ("input1_id", "filter_id", "bias_id", "output_id", "flags")),
    XNNStaticReshape: (_f("num_dims", "u32"), _f("new_shape", "[u32]"), *_1X1),
    XNNStaticSlice: (_f("num_dims", "u32"), _f("offsets", "[u32]"), _f("sizes", "[u32]"), *_1X1),
    XNNScaledDotProductAttention: tuple(_f(n, "u32") for n in XNNScaledDotProductAttention.__struct_fields__),
    XNNArgMaxPooling2d: tuple(_f(n, "u32") for n in XNNArgMaxPooling2d.__struct_fields__),
    XNNLeakyReLU: (_f("negative_slope", "f32"), *_1X1),
    OutputMinMax: (_f("output_min", "f32"), _f("output_max", "f32")),
    XNode: (
        _f("xnode_union", "union", *XNODE_TYPES), _f("debug_handle", "u32"),
        _f("output_min_max", "table", OutputMinMax),
    ),
    ConstantDataOffset: (_f("offset", "u64"), _f("size", "u64"), _f("named_key", "str")),
    XNNGraph: (
        _f("version", "str"), _f("xnodes", "[table]", XNode), _f("xvalues", "[table]", XValue),
        _f("num_externs", "u32"), _f("input_ids", "[u32]"), _f("output_ids", "[u32]"), _f("", "-"), _f("", "-"),
        _f("constant_data", "[table]", ConstantDataOffset),
    ),
}
for _member in XNODE_TYPES:
    if _member not in FIELDS:
        FIELDS[_member] = _SHAPES[_member.__mro__[1]]
