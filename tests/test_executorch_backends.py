"""ExecuTorch's XNNPACK partitioner and backend through texir, against ExecuTorch 1.5.1 itself.

For every model of the zoo, ten torchvision and seven transformers architectures (random weights
from small configs: LR-ASPP, Phi-3 and a Whisper encoder with sdpa among them), a hand-written attention
block, five pt2e int8 models (static and dynamic) and torchao's 8da4w: texir's `lower(ep, [executorch_partitioner(
XnnpackPartitioner())])` + `emit` against ExecuTorch's `to_edge_transform_and_lower(ep,
[XnnpackPartitioner()]).to_executorch()`. Both `.pte` files run in the ExecuTorch runtime; outputs
must equal each other and eager; delegate count, named data, kernels and the XNNPACK blobs must be
byte-equal (texir's `lower` places nodes as ExecuTorch's to_backend leaves them, re-sorts included:
`texir.lowering.fx_order`). Where ExecuTorch fails, `EXECUTORCH_FAILS` pins its failure and what
texir does instead. XnnpackPartitioner's options and a sequence of two partitioners are compared the
same way on one model."""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import torch
from torch.utils import _pytree as pytree

from tests.real_models import QUANTIZED, REAL_MODELS, real_export
from tests.xnnpack_oracle import Lowered, executorch_xnnpack, native_xnnpack, pte_view, run_pte, texir_xnnpack
from tests.zoo import STATEFUL_CALLS, ZOO, cached_export, example_argsets, fresh_module, zoo_model

@dataclass(frozen=True)
class Failure:
    executorch: str
    """A regex ExecuTorch's error (or its runtime's load error) matches."""
    texir: str | None
    """A regex texir's typed error matches, or None when texir lowers the model and it runs as eager."""
    why: str


EXECUTORCH_FAILS: dict[str, Failure] = {
    "accumulate": Failure(
        r"a leaf Variable that requires grad is being used in an in-place operation", None,
        "ExecuTorch's to_edge retraces the training-mode batch norm's in-place stats update on parameters "
        "that require grad; texir converts the exported graph without retracing"),
    "norms": Failure(
        r"aten\.var_mean\.correction is not in Core ATen opset",
        r"NonCoreOperatorError.*node 'var_mean': aten::var_mean\.correction is not a core ATen operator",
        "var_mean is outside core ATen and no decomposition removes it: ExecuTorch's verifier rejects it, "
        "and texir refuses it too, naming the node (allow_non_core=True emits it)"),
    "cond_closure_nested": Failure(
        r"aten_linear_default", r"KeptOpNotDelegatedError.*true_graph_0/true_graph_0/aten_linear_default",
        "linear inside a cond branch is kept undecomposed for XNNPACK but the partitioner does not enter "
        "branches; both refuse, texir naming the node"),
    "topk": Failure(
        r"OperatorMissing|0x14|Failed to load method", r"MissingKernelError.*'aten_sort_default'",
        "sort has no portable kernel in the 1.5.1 runtime: ExecuTorch writes a .pte that fails to load, "
        "texir refuses to write it and names the node"),
}

NATIVE_FAILS: dict[str, Failure] = {
    "cond_closure_nested": Failure(
        EXECUTORCH_FAILS["cond_closure_nested"].executorch, None,
        "texir's native partitioner keeps an op from decomposition only for nodes of the graph it "
        "partitions (ExecuTorch's keeps linear everywhere, then cannot delegate the one inside the cond "
        "branch): the branch's linear decomposes, runs as portable kernels, and the .pte equals eager"),
}
"""Where texir's native XNNPACK deliberately differs from ExecuTorch's failure (and from the bridge's)."""

NATIVE_BOUNDS: dict[str, str] = {
    "dynamic_conv": (
        "ExecuTorch's XNNPACK preprocess retraces the partition with fake tensors, and torch's fake "
        "convolution picks a conv backend by asking `batch < 16` of the example (batch 2): the guard "
        "narrows batch's range [2, 64] to [2, 15], so ExecuTorch's blob records 15 as the batch's upper "
        "bound and its .pte refuses batch 16..64 (error 0x10 at set_inputs). texir's native backend "
        "records the exported bound, 64"),
}
"""Models whose native blob differs from ExecuTorch's only in a symbolic size's recorded upper bound."""

ZOO_NAMES = [m.name for m in ZOO]
REAL_NAMES = [m.name for m in REAL_MODELS]
QUANT_NAMES = [m.name for m in QUANTIZED]


@functools.lru_cache(maxsize=None)
def _lowered(name: str) -> tuple[torch.export.ExportedProgram, Lowered, Lowered]:
    if name in ZOO_NAMES:
        ep = cached_export(name, decompose=False)
    else:
        ep = real_export(name)[0]
    return ep, executorch_xnnpack(copy.deepcopy(ep)), texir_xnnpack(ep)


@functools.lru_cache(maxsize=None)
def _native(name: str) -> Lowered:
    """texir's own XNNPACK (no ExecuTorch code) on the same export `_lowered` gives both other sides."""
    return native_xnnpack(_lowered(name)[0])


def _argsets(name: str) -> tuple[list[tuple[Any, ...]], int]:
    if name in ZOO_NAMES:
        model = zoo_model(name)
        return example_argsets(model), STATEFUL_CALLS if model.stateful else 1
    return [real_export(name)[1]], 1


def _eager(name: str, ep: torch.export.ExportedProgram, args: tuple[Any, ...], calls: int) -> list[list[torch.Tensor]]:
    module = fresh_module(ep)
    return [pytree.tree_leaves(module(*copy.deepcopy(args))) for _ in range(calls)]


def _close(actual: list[list[torch.Tensor]], expected: list[list[torch.Tensor]], what: str, *,
           rtol: float = 1e-4, atol: float = 1e-5) -> None:
    assert len(actual) == len(expected), what
    for call, (a_out, e_out) in enumerate(zip(actual, expected)):
        assert len(a_out) == len(e_out), f"{what} call {call}: {len(a_out)} outputs != {len(e_out)}"
        for i, (a, e) in enumerate(zip(a_out, e_out)):
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, msg=lambda m: f"{what} call {call} output {i}: {m}")


def _check_failure(name: str, et: Lowered, tx: Lowered, expected: Failure | None = None) -> None:
    expected = expected or EXECUTORCH_FAILS[name]
    et_error = et.error
    if et_error is None:  # the oracle wrote a file: its failure is at load
        assert et.pte is not None
        args, _ = _argsets(name)
        with pytest.raises(RuntimeError) as info:
            run_pte(et.pte, args[0])
        et_error = info.value
    assert re.search(expected.executorch, f"{type(et_error).__name__}: {et_error}"), (
        f"{name}: ExecuTorch no longer fails as pinned ({et_error!r}); update EXECUTORCH_FAILS")
    if expected.texir is None:
        assert tx.error is None, f"{name}: texir failed: {tx.error!r}"
        assert tx.pte is not None
        ep = _lowered(name)[0]
        args_list, calls = _argsets(name)
        for args in args_list:
            _close(run_pte(tx.pte, args, calls), _eager(name, ep, args, calls), f"{name}: texir vs eager", atol=1e-4)
    else:
        assert tx.error is not None, f"{name}: texir lowered a model ExecuTorch cannot ({expected.why})"
        assert re.search(expected.texir, f"{type(tx.error).__name__}: {tx.error}", re.S), repr(tx.error)


def _check_same(name: str, *, quantized: bool = False, native: bool = False) -> None:
    """texir's .pte (through ExecuTorch's partitioner and backend; with `native`, texir's own XNNPACK)
    against ExecuTorch's own: delegates, blobs, named data, kernels, partitions, outputs."""
    ep, et, tx = _lowered(name)
    if native:
        tx = _native(name)
    if native and name in NATIVE_FAILS:
        _check_failure(name, et, tx, NATIVE_FAILS[name])
        return
    if name in EXECUTORCH_FAILS:
        _check_failure(name, et, tx)
        return
    assert et.error is None, f"{name}: ExecuTorch failed: {et.error!r}"
    assert tx.error is None, f"{name}: texir failed: {tx.error!r}"
    assert et.pte is not None and tx.pte is not None
    a, b = pte_view(et.pte), pte_view(tx.pte)
    assert [d[0] for d in b.delegates] == [d[0] for d in a.delegates], f"{name}: delegate backends differ"
    assert b.named == a.named, f"{name}: named data differs (keys {sorted(a.named)} vs {sorted(b.named)})"
    assert b.kernels == a.kernels, f"{name}: kernels {b.kernels} != ExecuTorch's {a.kernels}"
    assert tx.partitions == et.partitions, f"{name}: delegated sub-programs differ in their ops"
    for i, ((_, blob_a), (_, blob_b)) in enumerate(zip(a.delegates, b.delegates)):
        if native and name in NATIVE_BOUNDS:
            _check_only_bounds_differ(name, blob_a, blob_b)
            continue
        assert blob_b == blob_a, f"{name}: delegate {i} blob differs ({len(blob_b)} vs {len(blob_a)} bytes)"
    args_list, calls = _argsets(name)
    for args in args_list:
        theirs = run_pte(et.pte, args, calls)
        ours = run_pte(tx.pte, args, calls)
        _close(ours, theirs, f"{name}: texir vs ExecuTorch .pte")
        if quantized:
            # The int8 kernels round differently from the float simulation of q/dq in eager.
            _close(ours, _eager(name, ep, args, calls), f"{name}: texir vs eager", rtol=0.05, atol=0.05)
        else:
            # XNNPACK's kernels sum in another order than eager's: rtol 1e-4 with an absolute floor.
            _close(ours, _eager(name, ep, args, calls), f"{name}: texir vs eager", atol=1e-4)


def _check_only_bounds_differ(name: str, theirs: bytes, ours: bytes) -> None:
    """The decoded XNNPACK graphs are equal but for the dims at the program's symbolic sizes, where
    ours records the exported upper bound and ExecuTorch's a narrower one (NATIVE_BOUNDS[name]);
    ours runs every exported batch size that ExecuTorch's refuses."""
    from texir.backends.xnnpack.flatbuffer import decode_blob

    ep = _lowered(name)[0]
    bound = max(int(r.upper) for r in ep.range_constraints.values())
    a, b = msgspec.to_builtins(decode_blob(theirs)), msgspec.to_builtins(decode_blob(ours))
    differences: list[tuple[str, Any, Any]] = []

    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict) and x.keys() == y.keys():
            for k in x:
                walk(x[k], y[k], f"{path}.{k}")
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y):
            for i, (p, q) in enumerate(zip(x, y)):
                walk(p, q, f"{path}[{i}]")
        elif x != y:
            differences.append((path, x, y))

    walk(a, b, "")
    assert differences, f"{name}: the blobs are equal now; drop it from NATIVE_BOUNDS"
    for path, x, y in differences:
        assert re.fullmatch(r"\.xvalues\[\d+\]\.xvalue_union\.dims\[\d+\]", path), (path, x, y)
        assert x < y == bound, (path, x, y)
    module = fresh_module(ep)
    args = tuple(torch.randn(bound, *t.shape[1:]) for t in _argsets(name)[0][0])
    with pytest.raises(RuntimeError, match="0x10"):
        run_pte(_lowered(name)[1].pte or b"", args)
    (ours_out,) = run_pte(_native(name).pte or b"", args)
    _close([ours_out], [pytree.tree_leaves(module(*args))], f"{name}: native at batch {bound} vs eager", atol=1e-4)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_model_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name)


@pytest.mark.parametrize("name", REAL_NAMES)
def test_real_model_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name)


@pytest.mark.parametrize("name", QUANT_NAMES)
def test_pt2e_int8_model_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name, quantized=True)


@pytest.mark.parametrize("name", ZOO_NAMES + REAL_NAMES)
def test_native_xnnpack_matches_executorch_xnnpack(name: str) -> None:
    # texir's own partitioner and backend (issue #29): the same partitions, byte-equal blobs, the same
    # named data and kernels, outputs bitwise equal to ExecuTorch's own .pte's
    _check_same(name, native=True)


@pytest.mark.parametrize("name", QUANT_NAMES)
def test_native_xnnpack_matches_executorch_xnnpack_quantized(name: str) -> None:
    # issue #30: pt2e static and dynamic int8 (torchvision's mobilenet_v2 among them) and torchao 8da4w
    _check_same(name, quantized=True, native=True)


def test_real_model_zoo_is_wide_enough() -> None:
    families = [m.family for m in REAL_MODELS]
    assert families.count("torchvision") >= 8 and families.count("transformers") >= 5 and len(QUANTIZED) >= 3
    delegated = [name for name in REAL_NAMES if len(pte_view(_lowered(name)[2].pte or b"").delegates) > 0]
    assert delegated == REAL_NAMES


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
