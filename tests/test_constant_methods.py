"""`constant_methods` (ExecuTorch's `to_edge(..., constant_methods=...)`): texir writes the same
execution plans and constants as ExecuTorch 1.5.1, and the runtime answers them the same way."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from texir.adapters import constant_method, constant_methods, from_exported_program
from texir.emit import EmitError, emit
from texir.errors import UnsupportedError
from texir.serialize import pte

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")


class _AddOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


VALUES: dict[str, Any] = {
    "get_max_seq_len": 128,
    "get_temperature": 0.75,
    "use_kv_cache": True,
    "get_name": "tiny-llama",
    "get_dtype": torch.float16,
    "get_layout": torch.strided,
    "get_eos_ids": [2, 32000],
    "get_rope": torch.arange(6, dtype=torch.float32).reshape(2, 3),
    "get_pair": (torch.ones(2, dtype=torch.int64), 3),
    "get_config": {"heads": 4, "scale": [0.5, torch.zeros(1, dtype=torch.bfloat16)]},
}


@pytest.fixture(scope="module")
def files() -> tuple[bytes, bytes]:
    from executorch.exir import to_edge

    args = (torch.ones(2),)
    theirs = to_edge(torch.export.export(_AddOne(), args), constant_methods=VALUES).to_executorch().buffer
    ours = pte.dumps(emit(from_exported_program(torch.export.export(_AddOne(), args)),
                          constant_methods=constant_methods(VALUES)))
    return ours, theirs


def test_plans_and_constants_equal_executorchs(files: tuple[bytes, bytes]) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    ours, theirs = (deserialize_pte_binary(f).program for f in files)
    names = [p.name for p in theirs.execution_plan]
    assert names == ["forward", *VALUES]  # forward first, then the getters in the order given
    assert [p.name for p in ours.execution_plan] == names
    for mine, their in zip(ours.execution_plan[1:], theirs.execution_plan[1:]):
        assert mine == their, mine.name
    assert ours.constant_buffer == theirs.constant_buffer


def test_the_runtime_answers_like_executorchs_file(files: tuple[bytes, bytes]) -> None:
    from executorch.runtime import Runtime

    ours, theirs = (Runtime.get().load_program(f) for f in files)
    for name in VALUES:
        got = ours.load_method(name).execute([])
        want = theirs.load_method(name).execute([])
        assert len(got) == len(want) > 0, name
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                assert isinstance(g, torch.Tensor) and g.dtype == w.dtype and torch.equal(g, w), name
            else:
                assert g == w, name
    assert ours.load_method("get_max_seq_len").execute([]) == [128]
    assert ours.load_method("get_dtype").execute([]) == [5]  # ExecuTorch's code for Half
    (x,) = ours.load_method("forward").execute([torch.ones(2)])
    assert torch.equal(x, torch.full((2,), 2.0))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, r"constant method 'm', value 0: a NoneType is not a constant ExecuTorch can return"),
        ({"a": object()}, r"constant method 'm', value 0: a object is not a constant"),
        # (complex64/128 have ExecuTorch codes since ScalarType 9/10 were added; complex32 has none)
        (torch.zeros(2, dtype=torch.complex32), r"value 0: dtype torch.complex32 has no ExecuTorch scalar type.*view_as_real"),
        ([1, torch.sparse_csr], r"value 1: layout torch.sparse_csr has no ExecuTorch code"),
        (torch.empty(2, device="meta"), r"value 0: holds a fake/meta tensor"),
    ],
)
def test_unsupported_values_are_typed_errors_naming_the_method_and_leaf(value: object, message: str) -> None:
    with pytest.raises(UnsupportedError, match=message):
        constant_method("m", value)


def test_a_getter_named_like_a_method_or_not_built_by_the_adapter_is_refused() -> None:
    program = from_exported_program(torch.export.export(_AddOne(), (torch.ones(2),)))
    with pytest.raises(EmitError, match=r"constant method 'forward' has the name of a program method"):
        emit(program, constant_methods=constant_methods({"forward": 1}))
    with pytest.raises(EmitError, match=r"constant method 'n' is a int; build it with texir.adapters.constant_methods"):
        emit(program, constant_methods={"n": 3})  # type: ignore[dict-item]  # the mistake under test
