"""ExecuTorch 1.5.1's backends that install from the package index, through texir (issue #28):
OpenVINO (run in ExecuTorch's runtime, whose pip build has OpenvinoBackend compiled in), Arm TOSA
(FP, and INT with Arm's quantizer), Arm Ethos-U55 (int8, Vela), CoreML (fp32, fp16) and WebGPU
(Vulkan's serializer under another partitioner). For each model both sides get their own export;
texir's delegates (backend id, blob, compile specs, named data) must equal those of ExecuTorch's own
`to_edge_transform_and_lower`, and where ExecuTorch fails on a model texir must fail the same way.

Normalized: CoreML's package holds random UUIDs (the model identifier; the manifest's item keys,
which also order the manifest): `_coreml_normalized` names each by what it identifies, and the rest
of the blob is compared byte for byte.
OpenVINO's blob is a compiled model holding process-wide name counters, so two lowerings of one
program in one process differ: each side lowers the models in its own fresh interpreter
(tests/openvino_child.py), in the same order, and the blobs are compared byte for byte."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.delegates_of import Delegate, executorch_delegates, texir_delegates
from tests.real_models import real_model
from tests.vulkan_patterns import vulkan_pattern_graphs_once  # noqa: F401  (a fixture)
from tests.xnnpack_oracle import run_pte
from tests.zoo import zoo_model
from texir.executorch import executorch_partitioner
from texir.orchestrate import lower

pytest.importorskip("executorch.exir")


CNN_MLP = ("mlp", "deep_mlp", "residual_mlp", "conv_bn", "convnet", "resnet_tiny")


def _export(name: str) -> torch.export.ExportedProgram:
    module, args = zoo_model(name).build()
    return torch.export.export(module, args, strict=False)


def _args(name: str) -> tuple[Any, ...]:
    return zoo_model(name).build()[1]


def _executorch(ep: torch.export.ExportedProgram, partitioners: list[Any]) -> tuple[list[Delegate], Any]:
    from executorch.exir import to_edge_transform_and_lower

    manager = to_edge_transform_and_lower(ep, partitioner=partitioners)
    return executorch_delegates(manager.exported_program().graph_module), manager


def _root_cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _compare(
    make_ep: Callable[[], torch.export.ExportedProgram],
    make_partitioners: Callable[[], list[Any]],
    normalize: Callable[[bytes], bytes] = lambda b: b,
) -> list[Delegate]:
    """texir's delegates equal ExecuTorch's (or both fail alike); returns texir's."""
    mine_partitioners, their_partitioners = make_partitioners(), make_partitioners()
    # Built outside the try: a failure to build the inputs is the test's own, never "ExecuTorch's
    # failure that texir must share" (it would fail both sides alike and pass with no delegates).
    mine_ep, their_ep = make_ep(), make_ep()
    try:
        theirs, _ = _executorch(their_ep, their_partitioners)
    except Exception as exc:  # ExecuTorch's own failure: texir must fail on the same root cause
        with pytest.raises(Exception) as caught:
            lower(mine_ep, [executorch_partitioner(p) for p in mine_partitioners], cache=None)
        assert type(_root_cause(caught.value)).__name__ == type(_root_cause(exc)).__name__, (
            f"ExecuTorch failed with {exc!r}; texir with {caught.value!r}"
        )
        return []
    ours = texir_delegates(lower(mine_ep, [executorch_partitioner(p) for p in mine_partitioners], cache=None).program)
    assert len(ours) == len(theirs)
    assert [d[0] for d in ours] == [d[0] for d in theirs]
    for i, (mine, other) in enumerate(zip(ours, theirs)):
        assert mine[2] == other[2], f"compile specs of delegate {i} differ"
        assert normalize(mine[1]) == normalize(other[1]), f"blob of delegate {i} differs"
        assert mine[3] == other[3], f"named data of delegate {i} differ"
    return ours


# --- OpenVINO ------------------------------------------------------------------------------------


# Unit roundoff of each inference precision OpenVINO's CPU plugin may pick for a float model.
_UNIT_ROUNDOFF = {"f32": 2.0**-24, "bf16": 2.0**-8, "f16": 2.0**-11}


@functools.lru_cache(maxsize=None)
def _openvino_cpu_precision() -> str:
    """The precision OpenVINO's CPU plugin runs float models in on this CPU: `bf16` where the CPU has
    AVX512-BF16 or AMX, else `f32` (the blob is compiled at preprocess on this machine and keeps it)."""
    import openvino

    hint = openvino.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
    name = str(hint.get_type_name())
    assert name in _UNIT_ROUNDOFF, f"OpenVINO picked an inference precision this test has no bound for: {name}"
    return name


def assert_close_to_eager_on_openvino(got: torch.Tensor, eager: torch.Tensor) -> None:
    """`got` (an OpenVINO delegate's output) is eager's within what the CPU plugin's inference precision
    allows. In f32, the plugin's usual 1e-3. In a reduced precision every layer rounds to it, so the
    bound scales with the precision's unit roundoff and with the output's magnitude (measured on this
    zoo in bf16: at most 2.6 roundoffs of the largest output; allowed: 16)."""
    precision = _openvino_cpu_precision()
    if precision == "f32":
        torch.testing.assert_close(got, eager, rtol=1e-3, atol=1e-3)
        return
    bound = 16 * _UNIT_ROUNDOFF[precision]
    scale = float(eager.abs().max())
    torch.testing.assert_close(got, eager, rtol=bound, atol=bound * scale, msg=lambda m: f"{m}\n(OpenVINO ran in {precision})")

def _openvino() -> list[Any]:
    # (texir's CLI builder: imports the partitioner without the package __init__'s quantizer when
    # nncf is missing, as in an install without the test extra)
    from texir.executorch.names import openvino_partitioner

    return [openvino_partitioner()]


OPENVINO_MODELS = ("mlp", "deep_mlp", "conv_bn", "convnet", "resnet18", "mobilenet_v2")


@pytest.fixture(scope="module")
def openvino_sides(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], Path]]:
    """Both sides' OpenVINO lowerings of OPENVINO_MODELS, each in its own fresh interpreter (two at
    once): side -> (model -> delegates as tests/openvino_child.py reports them, the folder of .pte files).

    OpenVINO's blob is its compiled model, whose node names come from process-wide counters: lowered
    in one process, the second lowering of a program differs from the first. Each side lowering the
    same models in the same order in a fresh process starts from the same counters, so the blobs are
    compared byte for byte, with no normalization."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    runs = {}
    for side in ("texir", "executorch"):
        out = tmp_path_factory.mktemp(f"openvino-{side}")
        command = [sys.executable, str(root / "tests" / "openvino_child.py"), side, str(out), *OPENVINO_MODELS]
        runs[side] = (subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out)
    sides = {}
    for side, (process, out) in runs.items():
        stdout, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, f"{side}'s OpenVINO lowering failed:\n{stderr[-4000:]}"
        sides[side] = (json.loads(stdout.strip().splitlines()[-1]), out)
    return sides


@pytest.mark.parametrize("name", OPENVINO_MODELS)
def test_openvino_blobs_equal_and_runs_as_executorch_lowers_it(
    name: str, openvino_sides: dict[str, tuple[dict[str, Any], Path]]
) -> None:
    (mine, my_dir), (theirs, their_dir) = openvino_sides["texir"], openvino_sides["executorch"]
    assert mine[name] and {d["backend"] for d in mine[name]} == {"OpenvinoBackend"}
    assert mine[name] == theirs[name], f"{name}: texir's OpenVINO delegates differ from ExecuTorch's"
    if name in ("resnet18", "mobilenet_v2"):
        module, args = real_model(name).build()
    else:
        module, args = zoo_model(name).build()
    eager = module(*args)
    (ours,) = run_pte((my_dir / f"{name}.pte").read_bytes(), args)
    (other,) = run_pte((their_dir / f"{name}.pte").read_bytes(), args)
    assert len(ours) == len(other) == 1
    assert torch.equal(ours[0], other[0]), f"{name}: texir's .pte and ExecuTorch's differ"
    assert_close_to_eager_on_openvino(ours[0], eager.detach())


def _openvino_quantized(name: str) -> torch.export.ExportedProgram:
    """The zoo model quantized with OpenVINO's own quantizer (nncf), as ExecuTorch's OpenVINO docs do."""
    from executorch.backends.openvino.quantizer import OpenVINOQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    module, args = zoo_model(name).build()
    prepared = prepare_pt2e(torch.export.export(module.eval(), args, strict=False).module(), OpenVINOQuantizer())  # type: ignore[arg-type]  # export's module() is a GraphModule
    prepared(*args)
    return torch.export.export(convert_pt2e(prepared), args, strict=False)


def test_openvino_quantized_fails_as_executorch_does() -> None:
    # ExecuTorch 1.5.1 with openvino 2025.x (its extra's pin) cannot lower a program OpenVINO's own
    # quantizer made: OpenVINO's torch frontend fails to convert the q/dq-wrapped addmm/convolution.
    # texir must fail on the same root cause.
    from executorch.exir import to_edge_transform_and_lower

    with pytest.raises(Exception) as theirs:
        to_edge_transform_and_lower(_openvino_quantized("conv_bn"), partitioner=_openvino())
    assert type(_root_cause(theirs.value)).__name__ == "OpConversionFailure"
    with pytest.raises(Exception) as ours:
        lower(_openvino_quantized("conv_bn"), [executorch_partitioner(p) for p in _openvino()], cache=None)
    assert type(_root_cause(ours.value)).__name__ == "OpConversionFailure", repr(ours.value)


# --- Arm TOSA and Ethos-U ------------------------------------------------------------------------


def _tosa_fp() -> list[Any]:
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

    return [TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))]


def _arm_quantized(name: str, spec_cls: Any, target: str, quantizer_cls: Any) -> torch.export.ExportedProgram:
    """The model quantized with Arm's quantizer and exported; quantized once per model, target and
    quantizer, each caller given its own copy (ExecuTorch's lowering changes the program it gets)."""
    return copy.deepcopy(_arm_quantized_once(name, spec_cls, target, quantizer_cls))


@functools.cache
def _arm_quantized_once(name: str, spec_cls: Any, target: str, quantizer_cls: Any) -> torch.export.ExportedProgram:
    # keyed by the target string, not the compile spec: Arm's compile specs are dataclasses with
    # eq=True, hence unhashable
    from executorch.backends.arm.quantizer import get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    module, args = zoo_model(name).build()
    quantizer = quantizer_cls(_spec(spec_cls, target))
    quantizer.set_global(get_symmetric_quantization_config())
    graph = torch.export.export(module, args, strict=False).module()
    prepared = prepare_pt2e(graph, quantizer)
    prepared(*args)
    return torch.export.export(convert_pt2e(prepared), args, strict=False)


@functools.cache
def _spec(cls: Any, target: str) -> Any:
    """One compile spec object per target, so the quantized exports are cached per target."""
    return cls(target)


ARM_MODELS = ("mlp", "deep_mlp", "residual_mlp", "conv_bn", "convnet")

ARM_INT_MODELS = ARM_MODELS
"""The quantized runs (each quantizes, then lowers twice, Vela compiling twice for Ethos-U): the same
five models as the FP runs (deep_mlp's GELU/sigmoid/tanh are table lookups in INT)."""


@pytest.mark.parametrize("name", ARM_MODELS)
def test_tosa_fp_blobs_equal_executorch(name: str) -> None:
    ours = _compare(lambda: _export(name), _tosa_fp)
    assert ours and {d[0] for d in ours} == {"TOSABackend"}


@pytest.mark.parametrize("name", ARM_INT_MODELS)
def test_tosa_int_blobs_equal_executorch(name: str) -> None:
    from executorch.backends.arm.quantizer import TOSAQuantizer
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

    spec = _spec(TosaCompileSpec, "TOSA-1.0+INT")
    ours = _compare(
        lambda: _arm_quantized(name, TosaCompileSpec, "TOSA-1.0+INT", TOSAQuantizer), lambda: [TOSAPartitioner(spec)]
    )
    assert ours and {d[0] for d in ours} == {"TOSABackend"}


@pytest.mark.parametrize("name", ARM_INT_MODELS)
def test_ethos_u55_blobs_equal_executorch(name: str) -> None:
    from executorch.backends.arm.ethosu.compile_spec import EthosUCompileSpec
    from executorch.backends.arm.ethosu.partitioner import EthosUPartitioner
    from executorch.backends.arm.quantizer import EthosUQuantizer

    spec = _spec(EthosUCompileSpec, "ethos-u55-128")
    ours = _compare(
        lambda: _arm_quantized(name, EthosUCompileSpec, "ethos-u55-128", EthosUQuantizer),
        lambda: [EthosUPartitioner(spec)],
    )
    assert ours and {d[0] for d in ours} == {"EthosUBackend"}


# --- CoreML --------------------------------------------------------------------------------------

_UUID = re.compile(rb"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")


_MANIFEST = b'{\n    "fileFormatVersion"'


def _coreml_normalized(blob: bytes) -> bytes:
    """The blob with its random UUIDs named by what they identify, and nothing else changed. CoreML's
    package holds two kinds: the model's identifier (`executorch_<uuid4>`, drawn by ExecuTorch's
    preprocess) and, in each package manifest, the items' keys and the root model's key (drawn by
    coremltools' C++ package writer), by which the manifest's entries are also ordered. Identifiers
    become `executorch_<uuid>`; each manifest is rewritten with its entries keyed, and ordered, by
    their `path`. A UUID anywhere else fails the comparison."""
    blob = re.sub(rb"executorch_" + _UUID.pattern, b"executorch_<uuid>", blob)
    text = blob.decode("latin-1")  # one character per byte: offsets stay byte offsets
    out, start = [], 0
    while (at := blob.find(_MANIFEST, start)) >= 0:
        manifest, end = json.JSONDecoder().raw_decode(text, at)
        entries = manifest["itemInfoEntries"]
        manifest["rootModelIdentifier"] = entries[manifest["rootModelIdentifier"]]["path"]
        manifest["itemInfoEntries"] = {e["path"]: e for e in sorted(entries.values(), key=lambda e: e["path"])}
        out += [blob[start:at], json.dumps(manifest, indent=4, sort_keys=True).encode()]
        start = end
    out.append(blob[start:])
    normalized = b"".join(out)
    left = _UUID.search(normalized)
    assert left is None, f"a UUID outside the identifier and the manifests: {left.group(0)!r}"
    return normalized


def _coreml(precision: str) -> Callable[[], list[Any]]:
    def make() -> list[Any]:
        import coremltools as ct
        from executorch.backends.apple.coreml.compiler import CoreMLBackend
        from executorch.backends.apple.coreml.partition import CoreMLPartitioner

        specs = CoreMLBackend.generate_compile_specs(
            compute_precision=ct.precision.FLOAT16 if precision == "fp16" else ct.precision.FLOAT32
        )
        return [CoreMLPartitioner(compile_specs=specs)]

    return make


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", ARM_MODELS)
def test_coreml_blobs_equal_executorch(name: str, precision: str) -> None:
    ours = _compare(lambda: _export(name), _coreml(precision), normalize=_coreml_normalized)
    # convnet: ExecuTorch's CoreML lowering gives no delegate or fails, and texir does the same
    assert {d[0] for d in ours} <= {"CoreMLBackend"} and (ours or name == "convnet")


# --- WebGPU --------------------------------------------------------------------------------------


def _webgpu() -> list[Any]:
    from executorch.backends.webgpu.partitioner.partitioner import WebGPUPartitioner

    return [WebGPUPartitioner()]


@pytest.mark.usefixtures("vulkan_pattern_graphs_once")
@pytest.mark.parametrize("name", ARM_MODELS)
def test_webgpu_blobs_equal_executorch(name: str) -> None:
    ours = _compare(lambda: _export(name), _webgpu)
    assert ours and {d[0] for d in ours} == {"VulkanBackend"}  # WebGPU lowers through Vulkan's serializer


# --- the CLI's short names -----------------------------------------------------------------------


def test_cli_lower_with_openvino_lists_its_delegates_and_runs(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from texir.cli.main import main
    from texir.models import conv_relu_tan

    out = tmp_path / "m.pte"
    assert main(["lower", "texir.models:conv_relu_tan", "--partitioner", "openvino", "--no-cache", "-o", str(out)]) == 0
    table = capsys.readouterr().out
    assert "OpenvinoBackend" in table and "lowered_module_0" in table
    module, args = conv_relu_tan()
    (got,) = run_pte(out.read_bytes(), args)[0]
    with torch.no_grad():
        assert_close_to_eager_on_openvino(got, module(*args))


def test_cli_knows_every_backend_from_the_index() -> None:
    from texir.executorch import PARTITIONERS, partitioner_by_name

    assert {"xnnpack", "openvino", "tosa", "ethos-u", "coreml", "vulkan", "webgpu"} <= set(PARTITIONERS)
    for name in ("openvino", "tosa", "ethos-u", "coreml", "webgpu"):
        assert partitioner_by_name(name).name.lower().replace("_", "").startswith(
            {"openvino": "openvino", "tosa": "tosa", "ethos-u": "ethosu", "coreml": "coreml", "webgpu": "webgpu"}[name]
        )
