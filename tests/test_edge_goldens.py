"""Edge-pass goldens, text in and text out, with no model export: each
tests/golden/edge/<pass>/before.txt is parsed (`texir.ir.parse_program`), run through its pass and
printed; the result must be after.txt. tests/test_edge_passes.py writes both files from torch
exports (`pytest --snapshot-update`), so the two agree exactly when parsing loses nothing a pass reads.
(texir.edge reads operator schemas from texir.ir.op_facts, never torch: tests/test_torch_free.py.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import GOLDEN_DIR
from texir.edge import (
    cast_mixed_operands,
    compact_debug_handles,
    inline_mixed_scalars,
    insert_write_back,
    prune_empty_tensors,
    remove_graph_asserts,
    remove_noop_ops,
    remove_unused_state,
    replace_view_copies_with_views,
    replace_view_ops,
    sym_operands_to_tensors,
    to_dim_order_ops,
)
from texir.ir import Program, format_program, parse_program, verify
from texir.testing.golden import Golden

PASSES: dict[str, Callable[[Program], Program]] = {
    f.__name__: f
    for f in (
        remove_graph_asserts, cast_mixed_operands, remove_noop_ops, replace_view_ops, to_dim_order_ops,
        insert_write_back, remove_unused_state, sym_operands_to_tensors, compact_debug_handles, prune_empty_tensors,
        replace_view_copies_with_views, inline_mixed_scalars,
    )
}


def test_every_pass_has_a_golden_and_every_golden_a_pass() -> None:
    assert sorted(p.name for p in (GOLDEN_DIR / "edge").iterdir() if p.is_dir()) == sorted(PASSES)


@pytest.mark.parametrize("pass_name", sorted(PASSES))
def test_pass_turns_golden_before_into_golden_after(pass_name: str, golden: Golden) -> None:
    before_text = (GOLDEN_DIR / "edge" / pass_name / "before.txt").read_text(encoding="utf-8")
    before = parse_program(before_text)
    assert format_program(before) == before_text  # the text is the whole program
    verify(before)
    after = PASSES[pass_name](before)
    verify(after)
    assert after != before, f"{pass_name} did nothing on its golden input"
    golden(f"edge/{pass_name}/after.txt", format_program(after))
