"""The symbolic sizes and fake tensors of one IR -> FX conversion (texir.adapters.fx_export): range
constraints become ShapeEnv symbols with hints, symbolic expressions SymInts, and value metadata the
FakeTensors torch.export puts in `meta["val"]`."""

from __future__ import annotations

from typing import Any

import sympy  # type: ignore[import-untyped]  # sympy ships no type information
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._sympy import functions as _sympy_functions
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges

from texir.adapters.specs import NEG_INF_MIN
from texir.adapters.tensors import DTYPE_TO_TORCH, LAYOUT_TO_TORCH
from texir.errors import ConversionError, UnsupportedError
from texir.ir import types as ir

__all__ = ["MISSING", "FakeValues"]

MISSING = object()
"""What `FakeValues.val` gives for metadata with no fake value (no `meta["val"]` is set)."""

_SYMPY_LOCALS: dict[str, Any] = {
    name: getattr(_sympy_functions, name)
    for name in (
        "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
        "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv",
        "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
        "RoundToInt", "RoundDecimal", "ToFloat", "Identity",
    )
    if hasattr(_sympy_functions, name)
}

# Hints are the example values symbolic sizes evaluate to while torch traces; the IR keeps only
# ranges, so pick a value inside the range that is unlikely to collide with a static size.
_PREFERRED_HINT = 7


class FakeValues:
    """One ShapeEnv and FakeTensorMode for a whole program, with the symbols of its range constraints."""

    def __init__(self, program: ir.Program) -> None:
        self.shape_env = ShapeEnv(assume_static_by_default=True)
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=self.shape_env)
        self.symbols: dict[str, sympy.Symbol] = {}
        self.hints: dict[sympy.Symbol, int] = {}
        self.ranges: dict[sympy.Symbol, ValueRanges[Any]] = {}
        self.sym_cache: dict[tuple[str, str], Any] = {}
        self.fake_cache: dict[ir.TensorMeta, torch.Tensor] = {}
        self.devices: dict[str, torch.device] = {}
        for rc in program.range_constraints:
            self._add_symbol(rc)

    # -- symbols -----------------------------------------------------------------------------

    def _add_symbol(self, rc: ir.RangeConstraint) -> None:
        unbacked = rc.symbol.startswith("u")
        sym = sympy.Symbol(rc.symbol, integer=True) if unbacked or rc.min < 0 else \
            sympy.Symbol(rc.symbol, integer=True, nonnegative=True)
        self.symbols[rc.symbol] = sym
        lo: Any = -int_oo if rc.min <= NEG_INF_MIN else rc.min
        hi: Any = int_oo if rc.max is None else rc.max
        self.ranges[sym] = ValueRanges(lo, hi)
        if unbacked:
            self.shape_env.unbacked_symint_counter += 1
        else:
            if rc.hint is not None:
                if rc.hint < rc.min or (rc.max is not None and rc.hint > rc.max):
                    raise ConversionError(
                        f"range constraint {rc.symbol!r}: hint {rc.hint} is outside "
                        f"[{rc.min}, {'inf' if rc.max is None else rc.max}]; give a hint inside the "
                        "range, or none (texir.ir.verify reports this too)"
                    )
                hint = rc.hint
            else:  # a program built by hand: any value inside the range will do
                top = rc.max if rc.max is not None else max(rc.min, _PREFERRED_HINT)
                hint = min(max(rc.min, _PREFERRED_HINT), top)
            self.hints[sym] = hint
            self.shape_env.add_backed_var_to_val(sym, hint)
        self.shape_env.constrain_symbol_range(
            sym, compiler_min=lo, compiler_max=hi
        )

    def parse_expr(self, text: str) -> sympy.Expr:
        try:
            expr = sympy.sympify(text, locals={**_SYMPY_LOCALS, **self.symbols})
        except (sympy.SympifyError, SyntaxError, TypeError) as exc:
            raise ConversionError(f"symbolic expression {text!r} does not parse: {exc}") from exc
        for free in expr.free_symbols:
            if free.name not in self.symbols:
                raise ConversionError(
                    f"symbolic expression {text!r} uses symbol {free.name!r} that has no range "
                    "constraint; add it to Program.range_constraints"
                )
        return expr

    def sym_value(self, text: str, kind: str) -> Any:
        key = (text, kind)
        value = self.sym_cache.get(key)
        if value is not None:
            return value
        expr = self.parse_expr(text)
        hint: Any = None
        if expr.free_symbols and all(s in self.hints for s in expr.free_symbols):
            hint_expr = expr.xreplace(self.hints)
            if kind == "int":
                hint = int(hint_expr)
            elif kind == "float":
                hint = float(hint_expr)
            else:
                hint = bool(hint_expr)
        if kind == "int":
            value = self.shape_env.create_symintnode(expr, hint=hint)
        elif kind == "float":
            value = self.shape_env.create_symfloatnode(expr, hint=hint)
        else:
            value = self.shape_env.create_symboolnode(expr)
        self.sym_cache[key] = value
        return value

    def dim(self, d: ir.Dim) -> Any:
        return d if isinstance(d, int) else self.sym_value(d, "int")

    # -- metadata ----------------------------------------------------------------------------

    def fake(self, meta: ir.TensorMeta) -> torch.Tensor:
        dtype = DTYPE_TO_TORCH.get(meta.dtype)
        if dtype is None:
            raise UnsupportedError(f"dtype {meta.dtype} is not available in this torch build")
        shape = [self.dim(d) for d in meta.shape]
        layout = LAYOUT_TO_TORCH[meta.layout]
        device = self.devices.get(meta.device)
        if device is None:
            device = self.devices[meta.device] = torch.device(meta.device)
        if layout is not torch.strided:
            with self.fake_mode:
                t = torch.empty(shape, dtype=dtype, device=device, layout=layout)
                if meta.requires_grad:
                    t.requires_grad_(True)
            return t
        # Wrapping a meta tensor is ~10x cheaper than dispatching empty_strided through the
        # fake mode, and gives the same FakeTensor.
        strides = [self.dim(d) for d in meta.strides]
        offset = self.dim(meta.storage_offset)
        if isinstance(offset, int) and offset == 0:
            elem = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
        else:
            extent = offset + 1 + sum((s - 1) * st for s, st in zip(shape, strides))
            elem = torch.empty((extent,), dtype=dtype, device="meta").as_strided(shape, strides, offset)
        if meta.requires_grad:
            elem.requires_grad_(True)
        return FakeTensor(self.fake_mode, elem, device)

    def shared_fake(self, meta: ir.TensorMeta) -> torch.Tensor:
        # Computed values with equal metadata share one FakeTensor: meta["val"] is read-only
        # metadata, and building fake tensors dominates IR -> FX time. Placeholders never share
        # (torch would read shared input fakes as aliased inputs when it retraces).
        t = self.fake_cache.get(meta)
        if t is None:
            t = self.fake_cache[meta] = self.fake(meta)
        return t

    def val(self, meta: ir.ValueMeta | None, share: bool = True) -> Any:
        if isinstance(meta, ir.TensorMeta):
            return self.shared_fake(meta) if share else self.fake(meta)
        if meta is None:
            return MISSING
        if isinstance(meta, ir.TupleMeta):
            items = [self.val(m, share) for m in meta.items]
            return items if meta.is_list else tuple(items)
        if isinstance(meta, ir.NoneMeta):
            return None
        if isinstance(meta, ir.SymIntMeta):
            return meta.expr if isinstance(meta.expr, int) else self.sym_value(meta.expr, "int")
        if isinstance(meta, ir.SymFloatMeta):
            return self.sym_value(meta.expr, "float")
        if isinstance(meta, ir.SymBoolMeta):
            return self.sym_value(meta.expr, "bool")
        if isinstance(meta, ir.ScalarMeta):
            value = meta.value
            return float(value) if value in ("inf", "-inf", "nan") else value
        if isinstance(meta, ir.TokenMeta):
            with self.fake_mode:
                return torch.empty((0,))
        return MISSING
