"""ExecuTorch's XNNPACK partitioner and backend through texir, against ExecuTorch 1.5.1 itself.

For every model of the zoo (the real models: tests/test_executorch_backends_real.py; the quantized
ones: tests/test_executorch_backends_quant.py; the oracle: tests/xnnpack_conformance.py): texir's `lower(ep, [executorch_partitioner(
XnnpackPartitioner())])` + `emit` against ExecuTorch's `to_edge_transform_and_lower(ep,
[XnnpackPartitioner()]).to_executorch()`. Both `.pte` files run in the ExecuTorch runtime; outputs
must equal each other and eager; delegate count, named data, kernels and the XNNPACK blobs must be
byte-equal (texir's `lower` places nodes as ExecuTorch's to_backend leaves them, re-sorts included:
`texir.lowering.fx_order`). Where ExecuTorch fails, `EXECUTORCH_FAILS` pins its failure and what
texir does instead. XnnpackPartitioner's options and a sequence of two partitioners are compared the
same way on one model."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.text_round_trip import assert_text_round_trip
from tests.xnnpack_conformance import EXECUTORCH_FAILS, ZOO_NAMES, _check_same, _close, _lowered, _native
from tests.xnnpack_oracle import pte_view, run_pte
from tests.zoo import cached_export, example_argsets, zoo_model


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_model_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_native_xnnpack_matches_executorch_xnnpack(name: str) -> None:
    # texir's own partitioner and backend (issue #29): the same partitions, byte-equal blobs, the same
    # named data and kernels, outputs equal to ExecuTorch's own .pte's
    _check_same(name, native=True)
    # and its IR text parses back to it (issue #38: named-data digests)
    lowered = _native(name)
    if lowered.program is None:
        assert name in EXECUTORCH_FAILS, f"{name}: texir's native lowering failed: {lowered.error!r}"
    else:
        assert_text_round_trip(lowered.program, name)


def _xnnpack_variants() -> dict[str, Any]:
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return {
        "per_op_mode": lambda: [XnnpackPartitioner(per_op_mode=True)],
        "fp32_configs_only": lambda: [XnnpackPartitioner(config_precisions=ConfigPrecisionType.FP32)],
        "dynamic_quant_then_default": lambda: [
            XnnpackPartitioner(config_precisions=ConfigPrecisionType.DYNAMIC_QUANT), XnnpackPartitioner()
        ],
    }


@pytest.mark.parametrize("name", [n for n in ZOO_NAMES if n not in EXECUTORCH_FAILS])
def test_xnnpack_programs_map_instructions_and_delegates_like_executorch(name: str) -> None:
    """Debug maps (instruction -> debug handles, delegate map, instruction -> delegate outputs) of
    texir's .pte through ExecuTorch's XNNPACK equal ExecuTorch's `ExecutorchProgramManager`'s, exactly:
    texir's lower places nodes as ExecuTorch's to_backend leaves them (texir.lowering.fx_order)."""
    _, et, tx = _lowered(name)
    assert et.debug_maps is not None and tx.debug_maps is not None, (et.error, tx.error)
    assert tx.debug_maps == et.debug_maps
    delegates = tx.debug_maps[1]["forward"]
    assert all(d["name"] == "XnnpackBackend" for d in delegates.values())
    assert set(tx.debug_maps[2]["forward"]) == set(delegates)  # every delegate call has an output count


@pytest.mark.parametrize("variant", ["per_op_mode", "fp32_configs_only", "dynamic_quant_then_default"])
def test_partitioner_options_and_two_partitioners_match_executorch(variant: str) -> None:
    """XnnpackPartitioner's options (one partition per op, one precision's configs) and a sequence of
    two partitioners: the same delegates, blobs, named data, kernels and outputs as ExecuTorch's."""
    from executorch.exir import to_edge_transform_and_lower

    from texir.executorch import executorch_partitioner
    from texir.emit import emit
    from texir.orchestrate import lower
    from texir.serialize.pte.codec import dumps

    make = _xnnpack_variants()[variant]
    ep = cached_export("transformer_block", decompose=False)
    ours = dumps(emit(lower(ep, [executorch_partitioner(p) for p in make()], cache=None).program))
    theirs = bytes(to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=make()).to_executorch().buffer)
    a, b = pte_view(ours), pte_view(theirs)
    assert len(a.delegates) == len(b.delegates) > 1
    assert a.delegates == b.delegates and a.named == b.named and a.kernels == b.kernels
    (args,) = example_argsets(zoo_model("transformer_block"))[:1]
    _close(run_pte(ours, args), run_pte(theirs, args), f"{variant}: texir vs ExecuTorch .pte", rtol=0, atol=0)
