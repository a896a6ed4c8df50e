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
from texir.adapters.executorch import verify_bpte
from texir.emit import emit
from texir.ir.blob import Blob
from texir.serialize import bpte, pte

PORTABLE = ["mlp", "conv_bn", "multi_output", "dtypes", "index_gather", "dynamic_mlp"]
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

        from texir.adapters.executorch import executorch_partitioner
        from texir.lowering import lower

        return pte.dumps(emit(lower(ep, [executorch_partitioner(XnnpackPartitioner())])))
    return pte.dumps(emit(from_exported_program(cached_export(name), decompose=False)))


@functools.cache
def _cases(name: str) -> tuple[bpte.BundledMethodTestCase, ...]:
    module, _ = zoo_model(name).build()
    return eager_cases(module, _input_sets(name))


@functools.cache
def _bundle(name: str, variant: str) -> bytes:
    return bpte.dumps(bpte.make_bundle(_pte(name, variant), {"forward": _cases(name)}))


@functools.cache
def _two_methods() -> tuple[bytes, bpte.BundledProgram]:
    programs = {"forward": "deep_mlp", "mlp": "mlp"}
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


def test_runtime_verifies_two_methods() -> None:
    data, bundle = _two_methods()
    assert [s.method_name for s in bundle.method_test_suites] == ["forward", "mlp"]
    results = verify_bpte(data)
    assert sorted({r.method for r in results}) == ["forward", "mlp"]
    assert len(results) == 2 * 3 and all(r.ok for r in results), [r.error for r in results if not r.ok]


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
