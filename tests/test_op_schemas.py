"""texir.ir's torch-free operator schemas agree with torch: the packaged table is torch's registry,
the parser reads every string as torch does, and the facts follow from it.

`pytest tests/test_op_schemas.py --snapshot-update` rewrites texir/ir/op_schemas.json from the
running torch (the same as `python tools/gen_op_schemas.py`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from texir.ir import literal_arg
from texir.ir.op_facts import op_facts, op_schema, op_table, out_variant, packaged_schemas, view_copy_target
from texir.ir.op_schema import OpSchemaError, parse_schema
from texir.ir.types import Argument, IntArg, ListArg, NoneArg, Program, StrArg
from texir.testing.golden import updating_goldens

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "texir" / "ir" / "op_schemas.json"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_op_schemas", ROOT / "tools" / "gen_op_schemas.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_packaged_table_is_torchs_registry(request: pytest.FixtureRequest) -> None:
    tool = _tool()
    version, schemas = tool.torch_schemas()
    rendered = tool.render(version, schemas)
    if updating_goldens(request.config) and TABLE.read_bytes() != rendered:
        TABLE.write_bytes(rendered)
    assert TABLE.read_bytes() == rendered, (
        f"texir/ir/op_schemas.json differs from torch {version}'s registry; run "
        "`pytest tests/test_op_schemas.py --snapshot-update` (or tools/gen_op_schemas.py)"
    )
    assert any(s.startswith("aten::add.Tensor(") for s in schemas)
    assert any(s.startswith("quantized_decomposed::") for s in schemas)
    assert any(s.startswith("dim_order_ops::_to_dim_order_copy.out(") for s in schemas)


# -- the parser against torch's own reading ------------------------------------------------------


def _torch_kind(type_: Any) -> tuple[str, bool]:
    optional = isinstance(type_, torch.OptionalType)
    if optional:
        type_ = type_.getElementType()
    if isinstance(type_, torch.TensorType):
        return ("optional_tensor" if optional else "tensor"), optional
    if isinstance(type_, torch.ListType):
        elem = type_.getElementType()
        if isinstance(elem, torch.OptionalType) and isinstance(elem.getElementType(), torch.TensorType):
            return "optional_tensor_list", optional
        for cls, kind in ((torch.TensorType, "tensor_list"), ((torch.IntType, torch.SymIntType), "int_list"),
                          (torch.FloatType, "float_list"), (torch.BoolType, "bool_list")):
            if isinstance(elem, cls):  # type: ignore[arg-type]  # a class or a tuple of classes
                return kind, optional
        return "other", optional
    for cls, kind in (((torch.IntType, torch.SymIntType), "int"), (torch.FloatType, "float"),
                      (torch.BoolType, "bool"), (torch.NumberType, "scalar"), (torch.StringType, "str")):
        if isinstance(type_, cls):  # type: ignore[arg-type]  # a class or a tuple of classes
            return kind, optional
    return "other", optional


def _torch_default(value: Any) -> Argument:
    if isinstance(value, (list, tuple)):
        return ListArg(items=tuple(_torch_default(v) for v in value))
    try:
        return literal_arg(value)
    except TypeError:
        return IntArg(value=int(value))


def _torch_view(s: Any) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in s.returns) and not any(
        a.alias_info is not None and a.alias_info.is_write for a in s.arguments
    )


def test_parser_reads_every_packaged_schema_as_torch_does() -> None:
    texts = packaged_schemas()
    assert len(texts) > 3000
    for text in texts:
        ts = torch._C.parse_schema(text)
        ours = parse_schema(text)
        assert (ours.name, ours.overload) == (ts.name, ts.overload_name), text
        assert ours.num_returns == len(ts.returns) and ours.is_mutable == ts.is_mutable, text
        theirs = [
            (a.name, *_torch_kind(a.type), a.kwarg_only, a.is_out, a.has_default_value(),
             _torch_default(a.default_value) if a.has_default_value() else None)
            for a in ts.arguments
        ]
        mine = [(a.name, a.kind, a.optional, a.kwarg_only, a.is_out, a.has_default, a.default) for a in ours.arguments]
        assert mine == theirs, text
        if not text.startswith(("dim_order_ops::", "executorch_prim::")):
            assert op_table().is_view(ours.target) == (_torch_view(ts) or ours.target in (
                "aten::_unsafe_view.default", "aten::t.default", "aten::reshape.default")), text


def test_parser_reads_defaults_and_annotations() -> None:
    s = parse_schema("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor")
    assert [a.name for a in s.in_args] == ["self", "other", "alpha"] and s.arguments[2].kwarg_only
    assert s.arguments[2].default == IntArg(value=1) and s.target == "aten::add.Tensor"
    s = parse_schema("aten::max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0) -> Tensor")
    assert s.arguments[3].default == ListArg(items=(IntArg(value=0), IntArg(value=0)))
    s = parse_schema('my::op(Tensor(a!) x, str mode="a\\"b", int[]? dims=None) -> (Tensor(a!) y, Tensor)')
    assert s.arguments[0].writes and not s.arguments[0].is_out and s.is_mutable and s.num_returns == 2
    assert s.arguments[1].default == StrArg(value='a"b') and s.arguments[2].default == NoneArg()
    assert s.overload == "" and s.target == "my::op.default"


@pytest.mark.parametrize("text", ["aten::add", "add(Tensor x) -> Tensor", "aten::f(Tensor x -> Tensor",
                                  "aten::f(Tensor x=[1, 2) -> Tensor", "aten::f(Tensor) -> Tensor"])
def test_malformed_schema_is_a_typed_error(text: str) -> None:
    with pytest.raises(OpSchemaError):
        parse_schema(text)


# -- facts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("target", "out"), [
    ("aten::add.Tensor", "aten::add.out"), ("aten::max.dim", "aten::max.dim_max"),
    ("aten::full.default", "aten::full.out"), ("aten::_to_copy.default", "aten::_to_copy.out"),
    ("dim_order_ops::_to_dim_order_copy.default", "dim_order_ops::_to_dim_order_copy.out"),
])
def test_out_variants(target: str, out: str) -> None:
    found = out_variant(target)
    assert found is not None and found.target == out


def test_view_facts() -> None:
    assert view_copy_target("aten::view.default") == "aten::view_copy.default"
    assert view_copy_target("aten::t.default") == "aten::permute_copy.default"
    facts = op_facts("aten::split_with_sizes.default")
    assert facts is not None and facts.is_view and facts.view_copy == "aten::split_with_sizes_copy.default"
    assert op_facts("aten::add.Tensor") is not None and op_facts("aten::copy_.default") is not None
    assert op_facts("aten::no_such_op.default") is None


def test_custom_op_schemas_come_from_the_program() -> None:
    extra = ("mylib::scale(Tensor x, float factor=2.) -> Tensor",
             "mylib::scale.out(Tensor x, float factor=2., *, Tensor(a!) out) -> Tensor(a!)")
    with pytest.raises(OpSchemaError, match="Program.op_schemas"):
        op_schema("mylib::scale.default")
    table = op_table(extra)
    out = table.out_variant("mylib::scale.default")
    assert out is not None and out.target == "mylib::scale.out"
    assert table.op_schema("mylib::scale.default").arguments[1].default is not None
    # a program cannot replace a packaged operator's schema
    assert op_table(("aten::add.Tensor(Tensor self) -> Tensor",)).op_schema("aten::add.Tensor").num_returns == 1
    assert len(op_table(("aten::add.Tensor(Tensor self) -> Tensor",)).op_schema("aten::add.Tensor").arguments) == 3


def test_verify_checks_recorded_schemas() -> None:
    import msgspec

    from texir.errors import IRError
    from texir.ir import verify
    from texir.testing.programs import chain_program

    program = chain_program()
    verify(msgspec.structs.replace(program, op_schemas=("mylib::f(Tensor x) -> Tensor",)))
    with pytest.raises(IRError, match=r"op_schemas\[0\]"):
        verify(msgspec.structs.replace(program, op_schemas=("mylib::f(Tensor x -> Tensor",)))
    with pytest.raises(IRError, match="sorted and unique"):
        verify(msgspec.structs.replace(program, op_schemas=("b::f(Tensor x) -> Tensor", "a::f(Tensor x) -> Tensor")))


def test_import_records_custom_op_schemas() -> None:
    from texir.adapters import from_exported_program

    lib = torch.library.Library("texir_optest", "DEF")  # noqa: TOR901  (a test-only namespace)
    lib.define("twice(Tensor x, *, float factor=2.) -> Tensor")
    lib.define("twice.out(Tensor x, *, float factor=2., Tensor(a!) out) -> Tensor(a!)")
    lib.impl("twice", lambda x, factor=2.0: x * factor, "CompositeExplicitAutograd")
    torch.library.register_fake("texir_optest::twice", lambda x, factor=2.0: torch.empty_like(x), lib=lib)

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.texir_optest.twice(x).relu()

    program = from_exported_program(torch.export.export(M(), (torch.ones(2),)))
    assert program.op_schemas == (
        "texir_optest::twice(Tensor x, *, float factor=2.) -> Tensor",
        "texir_optest::twice.out(Tensor x, *, float factor=2., Tensor(a!) out) -> Tensor(a!)",
    )
    facts = op_table(program.op_schemas).op_facts("texir_optest::twice.default")
    assert facts is not None and facts.out is not None and facts.out.target == "texir_optest::twice.out"
    assert op_facts("texir_optest::twice.default") is None  # not in the packaged table


@pytest.mark.parametrize("decl", ["MemoryFormat m=contiguous_format", "Layout l=strided", "int r=Mean",
                                  *(f"ScalarType d={n}" for n in ("long", "float", "int", "bool", "half", "double",
                                                                   "bfloat16", "uint8", "int8", "float32", "cfloat"))])
def test_enum_defaults_read_as_torch_reports_them(decl: str) -> None:
    text = f"mylib::f({decl}) -> Tensor"
    expected = torch._C.parse_schema(text).arguments[0].default_value
    assert parse_schema(text).arguments[0].default == IntArg(value=expected)
    # and torch's printed form (the int) reads the same
    assert parse_schema(str(torch._C.parse_schema(text))).arguments[0].default == IntArg(value=expected)


def test_partitions_keep_the_schemas_of_the_ops_they_call() -> None:
    import msgspec

    from texir.lowering import OpSupportPartitioner, to_backend
    from texir.backends import reference as _reference_backend  # noqa: F401  (registers it)
    from texir.serialize import snapshot
    from texir.testing.programs import chain_program

    relu = "aten::relu.default(Tensor self) -> Tensor"  # (a stand-in: any recorded string naming a called op)
    other = "mylib::unused(Tensor x) -> Tensor"
    program = msgspec.structs.replace(chain_program(), op_schemas=(relu, other))
    lowered = to_backend(program, OpSupportPartitioner("texir-reference", {"aten::relu.default"}))
    assert lowered.op_schemas == (relu, other)
    (module,) = lowered.lowered_modules
    assert module.module.original_program.op_schemas == (relu,)
    decoded = snapshot.loads(module.module.processed_bytes)  # the reference backend's blob is the sub-program
    assert isinstance(decoded, Program) and decoded.op_schemas == (relu,)
