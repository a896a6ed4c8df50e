"""Bundled programs (`.bpte`): texir's codec against ExecuTorch 1.5.1's serializer and runtime.

texir bundles zoo models (portable, XNNPACK-delegated, a two-method program) with the example
inputs, other example inputs and seeded random ones, expected outputs from eager runs; the 1.5.1
pip runtime loads each file and verifies every case, and fails a case whose expected output was
perturbed. ExecuTorch's own `serialize_from_bundled_program_to_flatbuffer`, given the same program
and cases, writes the same bytes; texir decodes its files (also with ExecuTorch's own program) to
the same cases. Cases that do not fit their method are refused with a typed error before writing.
"""

from __future__ import annotations

import copy
import json
import functools
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
import torch.utils._pytree as pytree

from tests.zoo import cached_export, example_argsets, zoo_model
from texir.adapters import from_exported_program
from texir.adapters.bundle import eager_cases, random_inputs, user_case
from texir.executorch import verify_bpte
from texir.emit import emit
from texir.ir.blob import Blob
from texir.serialize import bpte, pte

PORTABLE = ["mlp", "conv_bn", "multi_output", "dtypes", "index_gather", "dynamic_mlp", "running_stats"]
XNNPACK = ["mlp", "convnet"]
TOLERANCE = {"portable": (1e-5, 1e-6), "xnnpack": (1e-4, 1e-5)}
"""(rtol, atol) of the runtime's check; XNNPACK's kernels sum in another order than eager's."""


def _input_sets(name: str) -> list[tuple[Any, ...]]:
    sets = example_argsets(zoo_model(name))
    return [*sets, *random_inputs(sets[0], 2, seed=7)]


@functools.cache
def _pte(name: str, variant: str) -> bytes:
    ep = cached_export(name, decompose=False)
    if variant == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        from texir.executorch import executorch_partitioner
        from texir.orchestrate import lower

        return pte.dumps(emit(lower(ep, [executorch_partitioner(XnnpackPartitioner())]).program))
    return pte.dumps(emit(from_exported_program(cached_export(name), decompose=False)))


@functools.cache
def _cases(name: str) -> tuple[bpte.BundledMethodTestCase, ...]:
    module, _ = zoo_model(name).build()
    return eager_cases(module, _input_sets(name))


@functools.cache
def _bundle(name: str, variant: str) -> bytes:
    return bpte.dumps(bpte.make_bundle(_pte(name, variant), {"forward": _cases(name)}))


@functools.cache
def _two_methods(variant: str = "portable") -> tuple[bytes, bpte.BundledProgram]:
    programs = {"forward": "deep_mlp", "mlp": "mlp"}
    if variant == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        from texir.executorch import executorch_partitioner
        from texir.orchestrate import lower

        eps = {m: cached_export(n, decompose=False) for m, n in programs.items()}
        lowered = lower(eps, [executorch_partitioner(XnnpackPartitioner())])
        program = pte.dumps(emit({m: done.program for m, done in lowered.items()}))
    else:
        methods = {m: from_exported_program(cached_export(n), decompose=False) for m, n in programs.items()}
        program = pte.dumps(emit(methods))
    bundle = bpte.make_bundle(program, {m: _cases(n) for m, n in programs.items()})
    return bpte.dumps(bundle), bundle


PAIRS = [(n, "portable") for n in PORTABLE] + [(n, "xnnpack") for n in XNNPACK]


@pytest.mark.parametrize(("name", "variant"), PAIRS, ids=[f"{n}-{v}" for n, v in PAIRS])
def test_runtime_verifies_every_case(name: str, variant: str) -> None:
    data = _bundle(name, variant)
    rtol, atol = TOLERANCE[variant]
    results = verify_bpte(data, rtol=rtol, atol=atol)
    assert [(r.method, r.case) for r in results] == [("forward", k) for k in range(len(_input_sets(name)))]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    if variant == "xnnpack":
        plan = pte.loads(bpte.loads(data).program.view()).program.execution_plan[0]
        assert [d.id for d in plan.delegates] == ["XnnpackBackend"]


@pytest.mark.parametrize("variant", ["portable", "xnnpack"])
def test_runtime_verifies_two_methods(variant: str) -> None:
    data, bundle = _two_methods(variant)
    assert [s.method_name for s in bundle.method_test_suites] == ["forward", "mlp"]
    rtol, atol = TOLERANCE[variant]
    results = verify_bpte(data, rtol=rtol, atol=atol)
    assert sorted({r.method for r in results}) == ["forward", "mlp"]
    assert len(results) == 2 * 3 and all(r.ok for r in results), [r.error for r in results if not r.ok]
    plans = pte.loads(bundle.program.view()).program.execution_plan
    delegates = [[d.id for d in plan.delegates] for plan in plans]
    assert delegates == ([["XnnpackBackend"]] * 2 if variant == "xnnpack" else [[], []])


def _perturbed(case: bpte.BundledMethodTestCase, delta: float) -> bpte.BundledMethodTestCase:
    first = case.expected_outputs[0].val
    assert isinstance(first, bpte.Tensor) and first.scalar_type == bpte.ScalarType.FLOAT
    values = torch.frombuffer(bytearray(first.data.tobytes()), dtype=torch.float32)
    values[0] += delta
    changed = msgspec.structs.replace(first, data=Blob(values.numpy().tobytes()))
    return msgspec.structs.replace(case, expected_outputs=(bpte.Value(val=changed), *case.expected_outputs[1:]))


@pytest.mark.parametrize("variant", ["portable", "xnnpack"])
def test_perturbed_expected_output_fails(variant: str) -> None:
    cases = list(_cases("mlp"))
    cases[1] = _perturbed(cases[1], 0.01)
    data = bpte.dumps(bpte.make_bundle(_pte("mlp", variant), {"forward": cases}))
    rtol, atol = TOLERANCE[variant]
    results = verify_bpte(data, rtol=rtol, atol=atol)
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].error
    # Within the tolerance, the same change passes: the check compares values, not bytes.
    cases[1] = _perturbed(_cases("mlp")[1], atol / 10)
    data = bpte.dumps(bpte.make_bundle(_pte("mlp", variant), {"forward": cases}))
    assert all(r.ok for r in verify_bpte(data, rtol=rtol, atol=atol))


# --- against ExecuTorch's serializer --------------------------------------------------------------


def _executorch_suites(methods: dict[str, str]) -> list[Any]:
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite

    suites = []
    for method, name in methods.items():
        module, _ = zoo_model(name).build()
        cases = []
        for args in _input_sets(name):
            with torch.no_grad():
                out = copy.deepcopy(module)(*copy.deepcopy(args))
            cases.append(MethodTestCase(inputs=pytree.tree_leaves(args), expected_outputs=pytree.tree_leaves(out)))
        suites.append(MethodTestSuite(method_name=method, test_cases=cases))
    return suites


def _executorch_bpte(program: bytes | Any, methods: dict[str, str], tmp_path: Path) -> bytes:
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    suites = _executorch_suites(methods)
    if isinstance(program, bytes):
        path = tmp_path / "program.pte"
        path.write_bytes(program)
        bundled = BundledProgram(None, suites, pte_file_path=str(path))
    else:
        bundled = BundledProgram(program, suites)
    return bytes(serialize_from_bundled_program_to_flatbuffer(bundled))


@pytest.mark.parametrize(("name", "variant"), [("mlp", "portable"), ("multi_output", "portable"),
                                               ("dtypes", "portable"), ("convnet", "xnnpack")])
def test_same_bytes_as_executorch(name: str, variant: str, tmp_path: Path) -> None:
    ours = _bundle(name, variant)
    theirs = _executorch_bpte(_pte(name, variant), {"forward": name}, tmp_path)
    assert bpte.loads(theirs) == bpte.loads(ours)
    assert theirs == ours


def test_two_methods_same_bytes_as_executorch(tmp_path: Path) -> None:
    ours, bundle = _two_methods()
    theirs = _executorch_bpte(bpte.loads(ours).program.tobytes(), {"mlp": "mlp", "forward": "deep_mlp"}, tmp_path)
    assert bpte.loads(theirs) == bundle
    assert theirs == ours


def test_reads_executorch_program_and_cases(tmp_path: Path) -> None:
    """ExecuTorch's own program (to_edge().to_executorch()) bundled by ExecuTorch: texir finds the
    same cases it bundles itself, the program bytes as ExecuTorch wrote them, and the runtime
    verifies texir's and ExecuTorch's files alike."""
    from executorch import exir

    module, args = zoo_model("mlp").build()
    manager = exir.to_edge(torch.export.export(module, args, strict=False)).to_executorch()
    theirs = bpte.loads(_executorch_bpte(manager, {"forward": "mlp"}, tmp_path))
    assert theirs.method_test_suites == bpte.loads(_bundle("mlp", "portable")).method_test_suites
    assert theirs.program.tobytes() == bytes(manager.buffer)
    assert [p.name for p in pte.loads(theirs.program.view()).program.execution_plan] == ["forward"]
    assert all(r.ok for r in verify_bpte(bpte.dumps(theirs)))


# --- codec ----------------------------------------------------------------------------------------


def test_schema_mirrors_executorch_fbs() -> None:
    """Every table of ExecuTorch's bundled_program_schema.fbs is a struct here with the same fields
    in the same order (field order is the slot id), the union's members in the same order."""
    import re
    from importlib import resources

    fbs = resources.files("executorch.devtools.bundled_program.serialize").joinpath(
        "bundled_program_schema.fbs").read_text()
    text = re.sub(r"//[^\n]*", "", fbs)
    tables = {name: [f.split(":")[0].strip() for f in body.split(";") if ":" in f]
              for name, body in re.findall(r"table\s+(\w+)\s*\{([^}]*)\}", text)}
    assert list(tables) == ["Int", "Bool", "Double", "Tensor", "Value", "BundledMethodTestCase",
                            "BundledMethodTestSuite", "BundledProgram"]
    for name, fields in tables.items():
        assert list(getattr(bpte, name).__struct_fields__) == fields, name
    (members,) = re.findall(r"union\s+ValueUnion\s*\{([^}]*)\}", text)
    assert [m.strip() for m in members.split(",") if m.strip()] == [c.__name__ for c in bpte.VALUE_TYPES]
    assert f'file_identifier "{bpte.BUNDLED_FILE_IDENTIFIER.decode()}"' in text
    from executorch.devtools.bundled_program.version import BUNDLED_PROGRAM_SCHEMA_VERSION

    assert bpte.BUNDLED_SCHEMA_VERSION == BUNDLED_PROGRAM_SCHEMA_VERSION


def test_round_trip_and_values() -> None:
    data, bundle = _two_methods()
    assert bpte.loads(data) == bundle
    assert bpte.dumps(bpte.loads(data)) == data
    case = _cases("dtypes")[0]
    kinds = [(v.val.scalar_type.name, v.val.sizes) for v in case.inputs if isinstance(v.val, bpte.Tensor)]
    assert kinds == [("FLOAT", (3, 4)), ("LONG", (3,))]
    index = case.inputs[1].val
    assert isinstance(index, bpte.Tensor)
    x = torch.frombuffer(bytearray(index.data.tobytes()), dtype=torch.int64)
    assert torch.equal(x, example_argsets(zoo_model("dtypes"))[0][1])


def test_scalar_values_round_trip() -> None:
    # A method taking no inputs still takes cases; scalar values are encoded as ExecuTorch does.
    values = (bpte.Int(int_val=-(2**40)), bpte.Bool(bool_val=True), bpte.Double(double_val=2.5), bpte.Int())
    case = bpte.BundledMethodTestCase(inputs=tuple(bpte.Value(val=v) for v in values))
    bundle = bpte.BundledProgram(
        method_test_suites=(bpte.BundledMethodTestSuite(method_name="forward", test_cases=(case,)),),
        program=Blob(_pte("mlp", "portable")),
    )
    assert bpte.read_bundle(bpte.codec._encode(bundle)) == bundle


def test_random_inputs_are_seeded_and_shaped() -> None:
    example = example_argsets(zoo_model("index_gather"))[0]
    a, b = random_inputs(example, 2, seed=3), random_inputs(example, 2, seed=3)
    assert all(torch.equal(x, y) for s, t in zip(a, b) for x, y in zip(s, t))
    assert not torch.equal(a[0][0], a[1][0])
    for args in a:
        assert [(t.shape, t.dtype) for t in args] == [(t.shape, t.dtype) for t in example]
        assert int(args[1].min()) >= int(example[1].min()) and int(args[1].max()) <= int(example[1].max())


# --- bad input ------------------------------------------------------------------------------------


def _bad(inputs: tuple[Any, ...], expected: Any = None, method: str = "forward") -> bpte.BundledProgram:
    return bpte.BundledProgram(
        method_test_suites=(bpte.BundledMethodTestSuite(method_name=method, test_cases=(user_case(inputs, expected),)),),
        program=Blob(_pte("multi_output", "portable")),
    )


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ((torch.zeros(3, 2),), r"method 'forward' case 0: 1 inputs given, the method takes 2"),
        ((torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.float64)), r"case 0 input 1: .*expects dtype float32"),
        ((torch.zeros(3, 2), torch.zeros(2, 3)), r"case 0 input 1: given Tensor float32\[2, 3\].*static shape"),
        ((torch.zeros(3, 2), 3), r"case 0 input 1: given Int 3, the method expects Tensor float32\[3, 2\]"),
    ],
    ids=["count", "dtype", "shape", "kind"],
)
def test_case_that_does_not_fit_is_refused_before_writing(inputs: Any, message: str, tmp_path: Path) -> None:
    out = tmp_path / "bad.bpte"
    with pytest.raises(bpte.BundleCaseError, match=message):
        bpte.dump(_bad(inputs), out)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(bpte.BundleCaseError, match=message):
        bpte.make_bundle(_pte("multi_output", "portable"), {"forward": _bad(inputs).method_test_suites[0].test_cases})


def test_bad_outputs_and_methods() -> None:
    x = torch.zeros(3, 2)
    with pytest.raises(bpte.BundleCaseError, match=r"case 0: 1 expected outputs given, the method returns 4"):
        bpte.dumps(_bad((x, x), (x,)))
    with pytest.raises(bpte.BundleCaseError, match=r"case 0 output 1: given Tensor int64\[3, 2\]"):
        bpte.dumps(_bad((x, x), (x, x.long(), x, x)))
    with pytest.raises(bpte.BundleCaseError, match=r"method 'other', which the program lacks; its methods: forward"):
        bpte.dumps(_bad((x, x), method="other"))
    dynamic = _pte("dynamic_mlp", "portable")
    with pytest.raises(bpte.BundleCaseError, match=r"input 0: given Tensor float32\[65, 6\], a dimension above"):
        bpte.make_bundle(dynamic, {"forward": [user_case((torch.zeros(65, 6),))]})


def test_truncated_and_corrupt_files_raise_typed_errors() -> None:
    data = _bundle("mlp", "portable")
    for cut in sorted({0, 4, 7, 8, 100, len(data) // 2, len(data) - 4, len(data) - 1}):
        with pytest.raises(bpte.BpteDecodeError):
            bpte.loads(data[:cut])
    with pytest.raises(bpte.BpteDecodeError, match="not a .bpte file"):
        bpte.loads(_pte("mlp", "portable"))
    wrong_version = bytearray(data)
    bundle = bpte.read_bundle(data)
    assert bundle.version == bpte.BUNDLED_SCHEMA_VERSION
    root = int.from_bytes(data[:4], "little")
    vtable = root - int.from_bytes(data[root : root + 4], "little", signed=True)
    at = root + int.from_bytes(data[vtable + 4 : vtable + 6], "little")  # slot 0: version (u32)
    assert wrong_version[at : at + 4] == (2).to_bytes(4, "little")
    wrong_version[at : at + 4] = (3).to_bytes(4, "little")
    with pytest.raises(bpte.BpteDecodeError, match="version is 3"):
        bpte.loads(bytes(wrong_version))


def test_flipped_bytes_load_or_raise_typed_errors() -> None:
    import random

    from texir.errors import TexirError

    data = _bundle("mlp", "portable")
    rng = random.Random(31)
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(400):
        corrupt = bytearray(data)
        at = rng.randrange(len(corrupt))
        corrupt[at] ^= 1 << rng.randrange(8)
        try:
            bpte.loads(bytes(corrupt))
        except TexirError:
            outcomes["refused"] += 1
        else:
            outcomes["loaded"] += 1  # e.g. a flipped bit in a tensor's data: still a valid file
    assert outcomes["refused"] > 0 and outcomes["loaded"] > 0


def test_user_cases_with_and_without_expected_outputs() -> None:
    module, args = zoo_model("multi_output").build()
    with torch.no_grad():
        given = module(*args)
    cases = [user_case(args, given), user_case(args)]
    data = bpte.dumps(bpte.make_bundle(_pte("multi_output", "portable"), {"forward": cases}))
    assert bpte.loads(data).method_test_suites[0].test_cases[1].expected_outputs == ()
    results = verify_bpte(data)  # a case with nothing to compare is not run
    assert [(r.case, r.ok, r.outputs) for r in results] == [(0, True, 4)]


# --- the command line -----------------------------------------------------------------------------

TINY = """\
import torch

def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval(), (torch.randn(2, 4),)
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bundle") / "tiny.py"
    path.write_text(TINY)
    return path


def _one_line_error(capsys: pytest.CaptureFixture[str], *parts: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for part in parts:
        assert part in err, err


def test_cli_bundle_inspect_diff(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from texir.cli.main import main

    out = tmp_path / "m.bpte"
    assert main(["bundle", f"{tiny}:build", "-o", str(out), "--cases", "2", "--verify"]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and "3 cases" in text
    assert "forward[0] example: inputs float32[2, 4] -> expected float32[2, 3]  ok" in text
    assert "forward[2] random #1 (seed 0)" in text and "3 of 3 cases pass" in text
    bundle = bpte.load(out)
    assert [len(s.test_cases) for s in bundle.method_test_suites] == [3]

    assert main(["inspect", str(out), "--brief", "--case", "forward:2"]) == 0
    text = capsys.readouterr().out
    assert "BP08, version 2" in text and "method 'forward'" in text and "cases (3):" in text
    assert "forward[1]  inputs: float32[2, 4]  expected: float32[2, 3]" in text
    assert "    input [0] float32[2, 4] 32 bytes sha256:" in text  # case 2 in full
    assert main(["inspect", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["program"]["methods"][0]["name"] == "forward"
    assert [c["expected_outputs"][0]["shape"] for c in report["cases"][0]["cases"]] == [[2, 3]] * 3

    other = tmp_path / "other.bpte"
    assert main(["bundle", f"{tiny}:build", "-o", str(other), "--cases", "2", "--seed", "1"]) == 0
    capsys.readouterr()
    assert main(["diff", str(out), str(out)]) == 0
    capsys.readouterr()
    assert main(["diff", str(out), str(other)]) == 1
    assert "cases forward" in capsys.readouterr().out
    program = tmp_path / "m.pte"
    program.write_bytes(bundle.program.tobytes())
    assert main(["diff", str(out), str(program)]) == 0  # a .bpte against a .pte: its program


def test_cli_bundle_xnnpack(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from texir.cli.main import main

    out = tmp_path / "x.bpte"
    argv = ["bundle", f"{tiny}:build", "-o", str(out), "--partitioner", "xnnpack", "--cases", "1", "--verify",
            "--rtol", "1e-4", "--atol", "1e-5", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["cases"]
    assert [(r["source"], r["verified"]) for r in rows] == [("example", True), ("random #0 (seed 0)", True)]
    plan = pte.loads(bpte.load(out).program.view()).program.execution_plan[0]
    assert [d.id for d in plan.delegates] == ["XnnpackBackend"]


def _case_entry(data: bytes) -> tuple[int, int]:
    """(position of the first suite's test_cases vector, of its first entry) in a .bpte."""
    def u32(at: int) -> int:
        return int.from_bytes(data[at : at + 4], "little")

    def field(table: int, slot: int) -> int:
        vtable = table - int.from_bytes(data[table : table + 4], "little", signed=True)
        at = table + int.from_bytes(data[vtable + 4 + 2 * slot : vtable + 6 + 2 * slot], "little")
        return at + u32(at)

    suites = field(u32(0), 1)
    cases = field(suites + 4 + u32(suites + 4), 1)
    return cases, cases + 4


def test_cli_bad_files_are_one_line_errors(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from texir.cli.main import main

    good = tmp_path / "good.bpte"
    assert main(["bundle", f"{tiny}:build", "-o", str(good)]) == 0
    capsys.readouterr()
    data = good.read_bytes()
    vector, entry = _case_entry(data)
    assert int.from_bytes(data[vector : vector + 4], "little") == 1  # one case
    bad = {
        "truncated": data[: len(data) // 2],
        "case offset out of range": data[:entry] + (1 << 30).to_bytes(4, "little") + data[entry + 4 :],
        "case count out of range": data[:vector] + (1 << 20).to_bytes(4, "little") + data[vector + 4 :],
    }
    for what, content in bad.items():
        path = tmp_path / f"{what.replace(' ', '_')}.bpte"
        path.write_bytes(content)
        assert main(["inspect", str(path)]) == 2, what
        _one_line_error(capsys, "texir inspect: error: malformed .bpte flatbuffer")
        assert main(["diff", str(path), str(good)]) == 2, what
        _one_line_error(capsys, "texir diff: error: malformed .bpte flatbuffer")
    assert main(["inspect", str(good), "--case", "forward:1"]) == 2
    _one_line_error(capsys, "method 'forward' has 1 cases (0..0); case 1 is out of range")
    assert main(["inspect", str(good), "--case", "other:0"]) == 2
    _one_line_error(capsys, "no cases for method 'other'")
    assert main(["bundle", f"{tiny}:build", "--cases", "-1", "-o", str(tmp_path / "n.bpte")]) == 2
    _one_line_error(capsys, "--cases -1")
    assert main(["bundle", f"{tiny}:build", "-o", str(tmp_path / "n.pte")]) == 2
    _one_line_error(capsys, "a bundled program is a .bpte")
    assert not (tmp_path / "n.bpte").exists() and not (tmp_path / "n.pte").exists()
