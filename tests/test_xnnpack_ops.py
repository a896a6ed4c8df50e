"""`texir.backends.xnnpack.ops.OPS` is the native XNNPACK backend's one per-op table: no other module of
the backend spells an op, and every op the partitioner takes reaches a node visitor after the
backend's passes (an op a pass rewrites says which op it becomes, and that op has a visitor)."""

from __future__ import annotations

import io
import pathlib
import re
import tokenize

import pytest

from texir.backends.xnnpack import ops
from texir.backends.xnnpack.graph import XGraph, WorkNode
from texir.backends.xnnpack.visitors import VISITORS

_BACKEND = pathlib.Path(ops.__file__).parent
_OP_STRING = re.compile(r"\b(aten|quantized_decomposed|dim_order_ops|torchao|_operator|prims)::\w")
"""An op string of a namespace the backend handles, wherever it sits in a string literal."""


def _op_strings(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string literal of `source` that holds an op string."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and _OP_STRING.search(tok.string):
            found.append((tok.start[0], tok.string))
    return found


def test_the_op_string_finder_finds_op_strings() -> None:
    source = 'A = "aten::add.Tensor"\nB = f"x {y} _operator::getitem"\n# aten::mul.Tensor in a comment\nC = "aten"\n'
    assert [line for line, _ in _op_strings(source)] == [1, 2]


def test_no_xnnpack_module_but_ops_spells_an_op() -> None:
    modules = sorted(p for p in _BACKEND.glob("*.py") if p.name != "ops.py")
    assert len(modules) > 10
    spelled = {p.name: _op_strings(p.read_text()) for p in modules}
    assert {name: found for name, found in spelled.items() if found} == {}
    assert _op_strings((_BACKEND / "ops.py").read_text())  # the table does spell them


def test_each_op_has_one_entry() -> None:
    assert len(ops.SPECS) == len(ops.OPS)


def test_every_op_has_a_visitor_or_is_rewritten_to_one_that_has() -> None:
    for spec in ops.OPS:
        assert (spec.visitor is None) == (spec.lowered_to is not None), spec.target
        if spec.lowered_to is not None:
            assert spec.lowered_to in VISITORS, f"{spec.target} is rewritten to {spec.lowered_to}, which has no visitor"
        else:
            assert spec.target in VISITORS
        if spec.visitor in ("unary", "binary"):
            assert spec.xnn is not None, spec.target
    assert set(VISITORS) == {spec.target for spec in ops.OPS if spec.visitor is not None}


def test_every_op_the_partitioner_takes_is_in_ops() -> None:
    """The partitioner takes ops by a check, with their getitems, or as an int8 pattern (the q/dq
    nodes around the op included): every one is an OPS entry, so the test above covers it."""
    taken = {*ops.CHECKS, *ops.TUPLE_OPS, *ops.INT8_GEMMS, *ops.INT8_GENERIC, *ops.QUANTIZE, *ops.DEQUANTIZE,
             *ops.DYNAMIC_Q, *ops.DYNAMIC_DQ, *ops.CHOOSE_QPARAMS, ops.GETITEM}
    assert taken <= set(ops.SPECS)
    fused = {act for acts in ops.FUSES.values() for act in acts} | {
        act for spec in ops.OPS for act in spec.config_acts}
    assert fused <= set(ops.CHECKS) and fused <= set(ops.ACTIVATION_BOUNDS)


def test_a_generic_visitor_without_its_node_is_a_typed_error() -> None:
    from texir.backends.xnnpack.errors import XnnpackUnsupportedError
    from texir.backends.xnnpack.visitors import _xnn

    with pytest.raises(XnnpackUnsupportedError, match="aten::sigmoid.default.*xnn="):
        _xnn(ops.OpSpec(target="aten::sigmoid.default", visitor="unary"))


def test_rewritten_ops_reach_their_visitors_in_a_real_lowering() -> None:
    """A batch norm (decomposed to a depthwise convolution), a dim-order copy (a memory-format copy)
    and a max.dim (an amax), taken by the partitioner, are what the passes say they become."""
    import torch
    from torch import nn

    from texir.backends.xnnpack import partitioner, registered
    from texir.backends.xnnpack.passes import run_passes
    from texir.orchestrate import lower

    class Rewritten(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.bn(x + 1).to(memory_format=torch.channels_last)
            return torch.max(y, dim=2, keepdim=True)[0]

    x = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(5))
    with registered():
        program = lower(torch.export.export(Rewritten().eval(), (x,), strict=False), [partitioner()]).program
    before: set[str] = set()
    after: set[str] = set()
    for lowered in program.lowered_modules:
        g = XGraph.from_program(lowered.module.original_program)
        before |= {n.target for n in g.nodes if n.is_call}
        run_passes(g)
        after |= {n.target for n in g.nodes if n.is_call}
    rewritten = {t for t in before if ops.SPECS[t].lowered_to is not None}
    assert rewritten == {ops.BN, ops.TO_DIM_ORDER_COPY, ops.MAX_DIM}
    assert not rewritten & after
    assert {ops.SPECS[t].lowered_to for t in rewritten} <= after
    assert after <= set(VISITORS)


# -- the backend's passes as a named pipeline --------------------------------------------------------


def _graph(*calls: tuple[str, str, dict[str, object]]) -> XGraph:
    """A working graph: input x, then each (name, target, kwargs) call on the previous node, output."""
    nodes = [WorkNode("x", "placeholder", user_input=True)]
    for name, target, kwargs in calls:
        nodes.append(WorkNode(name, target, [nodes[-1]], dict(kwargs)))
    nodes.append(WorkNode("output", "output", [[nodes[-1]]]))
    return XGraph(nodes, {}, {})


def test_a_node_a_pass_refuses_names_the_pass() -> None:
    from texir.backends.xnnpack.errors import XnnpackUnsupportedError
    from texir.backends.xnnpack.passes import run_passes

    g = _graph(("copy", ops.TO_DIM_ORDER_COPY, {"dim_order": [0, 2, 1, 3]}))
    with pytest.raises(XnnpackUnsupportedError, match=r"no memory format \[XNNPACK backend pass revert_dim_order_copies\]"
                       ) as info:
        run_passes(g)
    assert info.value.pass_name == "revert_dim_order_copies" and info.value.node == "copy"


def test_a_failing_or_graph_breaking_pass_is_named() -> None:
    from texir.backends.xnnpack.errors import XnnpackPassError
    from texir.backends.xnnpack.passes import PASSES, XnnpackPass, run_passes

    assert len({p.name for p in PASSES}) == len(PASSES)

    def crash(g: XGraph) -> None:
        raise KeyError("boom")

    def reverse(g: XGraph) -> None:
        g.nodes.reverse()

    g = _graph(("r", ops.RELU, {}))
    with pytest.raises(XnnpackPassError, match="pass crash .*Stand-in.*KeyError: 'boom'") as info:
        run_passes(g, (XnnpackPass("crash", crash, "Stand-in"),))
    assert info.value.pass_name == "crash"
    with pytest.raises(XnnpackPassError, match="pass reverse .*not well formed: .*output node must be last"):
        run_passes(g, (XnnpackPass("reverse", reverse, "Stand-in"),), check=True)
    run_passes(g, (XnnpackPass("reverse", reverse, "Stand-in"),), check=False)
