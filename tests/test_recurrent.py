"""torch.nn's LSTM, GRU and RNN (tests/recurrent_models.py: 8 variants covering every pair of kind,
layers, bidirectional, batch_first and initial state) lowered with no partitioner, with texir's
native XNNPACK and through ExecuTorch's XNNPACK (the bridge), against ExecuTorch 1.5.1.

torch's lstm decomposition calls `mkldnn_rnn_layer` (no kernel in ExecuTorch's runtime) whenever
oneDNN is enabled in the process, which it is by default on every CPU; torch's export and its retrace
turn oneDNN off while they decompose, and texir's local decomposition must too. Each cell calls
`F.linear`, which ExecuTorch keeps whole for XNNPACK although the exported program holds no linear."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from tests.opinfo_diff import _without_asserts, multiset
from tests.recurrent_models import RECURRENT, recurrent_args, recurrent_export
from tests.xnnpack_conformance import _check_same, _close, _eager, _executorch
from tests.xnnpack_oracle import run_pte
from texir.adapters.decompositions import edge_decomposition_table
from texir.adapters.local_decompose import decompose_locally
from texir.emit import emit
from texir.orchestrate import lower
from texir.serialize.pte import dumps

NAMES = list(RECURRENT)


@pytest.mark.parametrize("name", NAMES)
def test_without_a_partitioner_as_to_edge_decomposes_and_runs(name: str) -> None:
    """The same operators as ExecuTorch's `to_edge` (no oneDNN op); the .pte runs as eager and as
    ExecuTorch's XNNPACK .pte do, to rounding. (The zoo's lstm, gru and rnn_relu also compare kernel
    calls with `to_edge(...).to_executorch()`: tests/test_pte_conformance.py.)"""
    from executorch.exir import to_edge

    ep, args = recurrent_export(name), recurrent_args(name)
    program = lower(ep, [], cache=None).program
    ops = multiset(program)
    assert not [op for op in ops if "mkldnn" in op], ops
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = to_edge(copy.deepcopy(ep)).exported_program().graph_module
    assert ops == multiset(_without_asserts(theirs))
    got = run_pte(dumps(emit(program)), args)
    _close(got, _eager(name, ep, args, 1), f"{name}: texir vs eager")
    xnnpack = _executorch(name).pte
    assert xnnpack is not None, _executorch(name).error
    _close(got, run_pte(xnnpack, args), f"{name}: texir vs ExecuTorch's XNNPACK .pte")


@pytest.mark.parametrize("name", NAMES)
def test_native_xnnpack_equals_executorch(name: str) -> None:
    """Delegates byte-equal to ExecuTorch's, same named data, kernels and partitions, same outputs."""
    _check_same(name, native=True)


@pytest.mark.parametrize("name", NAMES)
def test_bridge_equals_executorch(name: str) -> None:
    _check_same(name)


@pytest.mark.parametrize("onednn", [True, False])
def test_local_decomposition_does_not_depend_on_the_process_onednn_setting(onednn: bool) -> None:
    """Whatever oneDNN's flag (the one thing torch's lstm decomposition asks, never the CPU's
    instruction set), the direct rewrite equals torch's retrace, keeping linear or not."""
    ep = recurrent_export("lstm_l2_bi_bf_h0")
    with torch.backends.mkldnn.flags(enabled=onednn):
        for keep in ((), ("aten::linear.default",)):
            why: list[str] = []
            local = decompose_locally(ep, keep, why=why)
            assert local is not None, why
            retraced = ep.run_decompositions(edge_decomposition_table(keep))
            assert str(local.graph) == str(retraced.graph)
            assert torch.backends.mkldnn.is_available() is False or torch._C._get_mkldnn_enabled() is onednn


_FRESH_PROCESS = r"""
import torch
from tests.recurrent_models import recurrent_export
from texir.adapters.decompositions import edge_decomposition_table
from texir.adapters.local_decompose import decompose_locally

ep = recurrent_export("gru_l2_bf")
assert decompose_locally(ep, ("aten::linear.default",)) is not None
retraced = ep.run_decompositions(edge_decomposition_table())
print(sum(n.target is torch.ops.aten.linear.default for n in retraced.graph.nodes))
"""


def test_keeping_linear_leaves_the_edge_table_decomposing_it() -> None:
    """In a fresh process, a first decomposition keeping linear inside gru's cells must not leave
    the process-wide edge table keeping linear afterwards (it is built from the ops' kernels of the
    moment it is first asked for)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "0", done.stdout
