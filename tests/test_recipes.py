"""Quantization recipes (`texir lower --recipe/--qlinear`, `texir.recipes`) against ExecuTorch 1.5.1's own
recipe pipeline, `executorch.export.export(model, [args], export_recipe=ExportRecipe.get_recipe(...))`.

For each recipe the `.pte` the CLI writes and the one ExecuTorch writes decode (with ExecuTorch's own
deserializer) to equal programs, hold byte-equal segments (delegate blobs) and equal named data, and
run in ExecuTorch's runtime to bitwise-equal outputs. The files are not byte-equal as a whole: texir's
flatbuffer writer lays the program table out differently from flatc (docs/compat.md, "The .pte
against ExecuTorch's"), which the comparison asserts and nothing else."""

from __future__ import annotations

import copy
import functools
import re
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.test_compat import differences
from texir.cli.main import main
from texir.errors import RecipeError

pytest.importorskip("executorch")


class TwoLinears(torch.nn.Module):
    """64 -> hidden -> 16: with hidden 64 groups of 32 or 64 divide both linears' input features; with
    48, groups of 32 do not divide fc2's."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, hidden), torch.nn.Linear(hidden, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Embedder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc = torch.nn.Embedding(16, 64), torch.nn.Linear(64, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(tokens))


def mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return TwoLinears(64).eval(), (torch.randn(2, 64),)


def odd() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return TwoLinears(48).eval(), (torch.randn(2, 64),)


def mlp_any_batch() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], Any]:
    module, args = mlp()
    return module, args, ({0: torch.export.Dim("batch", min=1, max=8)},)


class LlamaLogits(torch.nn.Module):
    """A tiny transformers Llama (1 layer, hidden 64, vocab 128, no KV cache): the logits of a prompt."""

    def __init__(self) -> None:
        super().__init__()
        from texir.adapters.torch_patches import make_torchvision_importable

        make_torchvision_importable()  # transformers imports torchvision
        import transformers

        config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        self.model = transformers.LlamaForCausalLM(config).eval()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(input_ids=ids, use_cache=False).logits
        return logits


def llama() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return LlamaLogits().eval(), (torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1)),)


def embedder() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Embedder().eval(), (torch.tensor([[1, 2, 3]]),)


RECIPES = [
    # (texir's flags, ExecuTorch's XNNPackRecipeType member, its kwargs)
    (["--recipe", "xnnpack"], "FP32", {}),
    (["--recipe", "xnnpack-int8-static"], "PT2E_INT8_STATIC_PER_CHANNEL", {}),
    (["--recipe", "xnnpack-int8-static-per-tensor"], "PT2E_INT8_STATIC_PER_TENSOR", {}),
    (["--recipe", "xnnpack-int8-dynamic"], "PT2E_INT8_DYNAMIC_PER_CHANNEL", {}),
    (["--recipe", "xnnpack-8da4w"], "TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR", {}),
    (["--recipe", "xnnpack-8da4w", "--group-size", "64"], "TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR",
     {"group_size": 64}),
    (["--recipe", "xnnpack-8da4w", "--group-size", "0"], "TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL", {}),
]


def executorch_pte(member: str, kwargs: dict[str, Any], calibration: list[tuple[torch.Tensor, ...]] | None = None) -> bytes:
    """What ExecuTorch's `executorch.export` writes for the MLP with this recipe."""
    from executorch.backends.xnnpack.recipes import XNNPackRecipeType
    from executorch.export import ExportRecipe, export

    recipe = ExportRecipe.get_recipe(getattr(XNNPackRecipeType, member), **kwargs)
    if calibration is not None:
        assert recipe.quantization_recipe is not None
        recipe.quantization_recipe.calibration_inputs_fn = lambda: calibration
    module, args = mlp()
    session = export(copy.deepcopy(module), [args], export_recipe=recipe)
    return bytes(session.get_executorch_program_manager().buffer)


REQUIRES_GRAD = re.compile(r"\.execution_plan\[0\]\.values\[\d+\]\.val\.requires_grad")
"""Where ExecuTorch's edge program leaves `requires_grad` True and texir's does not."""


def assert_executorchs_program(ours: bytes, theirs: bytes, *known: re.Pattern[str]) -> list[tuple[str, Any, Any]]:
    """Equal as ExecuTorch decodes them but for fields matching `known` (each explained in
    docs/compat.md), equal from the first segment on; the flatbuffer head (texir's table layout) may
    differ. Returns the known differences."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    a, b = deserialize_pte_binary(ours), deserialize_pte_binary(theirs)
    found = differences(a.program, b.program)
    assert [d for d in found if not any(k.fullmatch(d[0]) for k in known)] == []
    assert a.named_data == b.named_data and a.mutable_data == b.mutable_data
    base_a, base_b = struct.unpack_from("<Q", ours, 24)[0], struct.unpack_from("<Q", theirs, 24)[0]
    assert ours[base_a:] == theirs[base_b:]
    delegates = [d.id for plan in a.program.execution_plan for d in plan.delegates]
    assert delegates == ["XnnpackBackend"] * len(delegates) and delegates
    return found


def run(data: bytes, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    from texir.executorch.runtime import run_pte

    return run_pte(data, list(args))


def lower_cli(tmp_path: Path, model: str, flags: list[str], capsys: pytest.CaptureFixture[str]) -> bytes:
    out = tmp_path / "model.pte"
    assert main(["lower", model, *flags, "--no-cache", "-o", str(out)]) == 0
    assert "XnnpackBackend" in capsys.readouterr().out
    return out.read_bytes()


@pytest.mark.parametrize("flags,member,kwargs", RECIPES, ids=[" ".join(f[1:]) for f, _, _ in RECIPES])
def test_a_recipe_writes_executorchs_program_and_it_runs(
    flags: list[str], member: str, kwargs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = lower_cli(tmp_path, "tests.test_recipes:mlp", flags, capsys)
    theirs = executorch_pte(member, kwargs)
    assert_executorchs_program(ours, theirs)
    module, args = mlp()
    mine, reference = run(ours, args), run(theirs, args)
    assert len(mine) == len(reference) == 1 and torch.equal(mine[0], reference[0])
    with torch.no_grad():
        expected = module(*args)
    # quantized kernels are close to the float module, not equal (int4 weights the loosest)
    assert (mine[0] - expected).abs().max() <= 0.1 * expected.abs().max()


def test_calibration_file_is_what_the_pt2e_recipes_calibrate_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--calibration FILE: ExecuTorch's `calibration_inputs_fn` giving the same inputs writes the same
    program, and its scales are not those of the example inputs'."""
    generator = torch.Generator().manual_seed(3)
    inputs = [(4 * torch.randn(2, 64, generator=generator),) for _ in range(3)]
    path = tmp_path / "calibration.pt"
    torch.save(inputs, path)
    flags = ["--recipe", "xnnpack-int8-static", "--calibration", str(path)]
    ours = lower_cli(tmp_path, "tests.test_recipes:mlp", flags, capsys)
    assert_executorchs_program(ours, executorch_pte("PT2E_INT8_STATIC_PER_CHANNEL", {}, inputs))
    assert ours != lower_cli(tmp_path, "tests.test_recipes:mlp", flags[:2], capsys)


def test_executorchs_partitioner_lowers_a_recipe_to_the_same_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--partitioner executorch:xnnpack (ExecuTorch's partitioner and backend through the bridge) on the
    quantized program writes the native backend's bytes."""
    flags = ["--recipe", "xnnpack-int8-dynamic"]
    native = lower_cli(tmp_path, "tests.test_recipes:mlp", flags, capsys)
    assert lower_cli(tmp_path, "tests.test_recipes:mlp", [*flags, "--partitioner", "executorch:xnnpack"], capsys) == native


def test_a_dynamic_batch_survives_pt2e_quantization(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A MODEL with a dynamic batch (its third element): the module pt2e quantizes carries no shape
    guards (as in ExecuTorch's QuantizeStage), so the export keeps the batch dynamic; the file is
    ExecuTorch's and runs at other batch sizes."""
    from executorch.backends.xnnpack.recipes import XNNPackRecipeType
    from executorch.export import ExportRecipe, export

    ours = lower_cli(tmp_path, "tests.test_recipes:mlp_any_batch", ["--recipe", "xnnpack-int8-dynamic"], capsys)
    module, args, shapes = mlp_any_batch()
    recipe = ExportRecipe.get_recipe(XNNPackRecipeType.PT2E_INT8_DYNAMIC_PER_CHANNEL)
    theirs = bytes(export(copy.deepcopy(module), [args], export_recipe=recipe, dynamic_shapes=shapes)
                   .get_executorch_program_manager().buffer)
    assert_executorchs_program(ours, theirs)
    for batch in (1, 5):
        x = (torch.randn(batch, 64, generator=torch.Generator().manual_seed(batch)),)
        assert torch.equal(run(ours, x)[0], run(theirs, x)[0]) and run(ours, x)[0].shape == (batch, 16)


@functools.lru_cache(maxsize=None)
def optimum_reference(qlinear: str, model: str = "mlp") -> bytes:
    """optimum-executorch 1.1.0's `--recipe xnnpack --qlinear 8da4w|8da8w` on a MODEL of this file: its
    `quantize_model_` (torchao's Int8DynamicActivationIntxWeightConfig with the hqq_scale_only qparams,
    group size 32 or per channel, then `unwrap_tensor_subclass`) and ExecuTorch's XNNPACK lowering."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig
    from torchao.utils import unwrap_tensor_subclass

    module, args = globals()[model]()
    weights = (getattr(torch, "int4"), PerGroup(32)) if qlinear == "8da4w" else (torch.int8, PerAxis(0))
    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=weights[0], weight_granularity=weights[1],
                                                   intx_choose_qparams_algorithm="hqq_scale_only")
    quantize_(module, config, lambda m, fqn: isinstance(m, torch.nn.Linear))
    unwrap_tensor_subclass(module)
    with torch.no_grad():
        ep = torch.export.export(module, args, strict=True)
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return bytes(edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=True)).buffer)


@pytest.mark.parametrize("qlinear", ["8da4w", "8da8w"])
def test_qlinear_writes_the_program_of_optimums_quantization(
    qlinear: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = lower_cli(tmp_path, "tests.test_recipes:mlp", ["--qlinear", qlinear], capsys)
    theirs = optimum_reference(qlinear)
    assert_executorchs_program(ours, theirs)
    module, args = mlp()
    assert torch.equal(run(ours, args)[0], run(theirs, args)[0])


def test_qlinear_on_a_tiny_llama(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--qlinear 8da4w on a transformers Llama's logits: the linears in XNNPACK with ExecuTorch's blobs and
    named data, bitwise ExecuTorch's logits, close to the float model's. The attention mask's ops stay
    portable kernels, planned where ExecuTorch plans them; the programs differ only in
    `requires_grad` on some of their values (ExecuTorch's edge program marks results derived from
    the quantized model's parameters; the runtime does not read the flag)."""
    ours = lower_cli(tmp_path, "tests.test_recipes:llama", ["--qlinear", "8da4w"], capsys)
    theirs = optimum_reference("8da4w", "llama")
    known = assert_executorchs_program(ours, theirs, REQUIRES_GRAD)
    assert known and all(path.endswith(".requires_grad") for path, _, _ in known)
    module, args = llama()
    got = run(ours, args)[0]
    assert torch.equal(got, run(theirs, args)[0])
    with torch.no_grad():
        expected = module(*args)
    assert (got - expected).abs().max() <= 0.3 * expected.abs().max()


def test_qlinear_fallback_quantizes_the_linears_the_group_size_does_not_divide_per_channel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'8da4w,8da8w' (optimum's fallback): fc2 (48 input features) gets int8 weights per channel, fc1
    int4 in groups of 32; both delegated, and the program runs close to the float module."""
    from tests.xnnpack_oracle import pte_view
    from texir.backends.xnnpack import schema as s
    from texir.backends.xnnpack.flatbuffer import decode_blob

    data = lower_cli(tmp_path, "tests.test_recipes:odd", ["--qlinear", "8da4w,8da8w"], capsys)
    kinds = []
    for _, blob in pte_view(data).delegates:
        graph = decode_blob(blob)
        for node in graph.xnodes:
            if isinstance(node.xnode_union, s.XNNFullyConnected):
                value = graph.xvalues[node.xnode_union.filter_id].xvalue_union
                assert isinstance(value, s.XNNQuantizedTensorValue) and value.tensor_value is not None
                kinds.append(value.tensor_value.datatype)
    assert kinds == [s.XNNDatatype.xnn_datatype_qbint4, s.XNNDatatype.xnn_datatype_qcint8]
    module, args = odd()
    with torch.no_grad():
        expected = module(*args)
    assert (run(data, args)[0] - expected).abs().max() <= 0.1 * expected.abs().max()


def test_the_api_quantizes_a_copy_and_lowers() -> None:
    from texir import recipes
    from texir.emit import emit
    from texir.serialize import pte

    module, args = mlp()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    lowered = recipes.lower(module, args, recipes.Recipe(name="xnnpack-8da4w"), cache=None)
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())  # the caller's module stays float
    assert_executorchs_program(pte.dumps(emit(lowered.program)),
                               executorch_pte("TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR", {}))
    from texir.executorch.passes import TransformPassError

    with pytest.raises(TransformPassError, match=r"takes what texir.lower returns \(a Lowered\), not a Program; pass"):
        recipes.fuse_quantized_embeddings(lowered.program)  # type: ignore[arg-type]  # the mistake under test


def test_the_clis_recipe_names_are_the_apis_and_name_executorchs_recipes() -> None:
    from texir.cli.lower_recipe import RECIPE_NAMES
    from texir.recipes import RECIPES as NAMES, Recipe

    assert RECIPE_NAMES == tuple(NAMES)
    for flags, member, kwargs in RECIPES:
        recipe = Recipe(name=flags[1], group_size=int(flags[3]) if len(flags) > 2 else None)
        assert recipe.executorch_recipe == member
    assert Recipe(qlinear="8da4w").executorch_recipe is None  # optimum's flags, not an ExecuTorch recipe


MISTAKES = [
    ("mlp", ["--recipe", "xnnpack-int4"], "--recipe 'xnnpack-int4' is not a recipe; known: xnnpack, "),
    ("odd", ["--recipe", "xnnpack-8da4w"], "--group-size 32 does not divide the 48 input features of linear 'fc2'"),
    ("odd", ["--qlinear", "8da4w"], "or --qlinear 8da4w,8da8w quantizes such linears per channel"),
    ("mlp", ["--recipe", "xnnpack-8da4w", "--group-size", "16"], "--group-size 16: XNNPACK's int4 kernels take groups of a multiple of 32"),
    ("mlp", ["--recipe", "xnnpack-int8-static", "--group-size", "32"], "--group-size is for --recipe xnnpack-8da4w"),
    ("mlp", ["--qembedding", "8w"], "--qembedding 8w: the MODEL has no torch.nn.Embedding to quantize"),
    ("embedder", ["--qembedding", "8w"], "--qembedding 8w is for a checkpoint directory (texir lower hf:DIR"),
    ("embedder", ["--qembedding-group-size", "4"], "--qembedding-group-size goes with a quantization recipe: add "
                                                   "--qembedding 4w|8w"),
    ("mlp", ["--qlinear", "4w"], "--qlinear 4w: weight-only quantization is not supported"),
    ("mlp", ["--qlinear", "8da4w,4w"], "--qlinear '8da4w,4w': give one of"),
    ("mlp", ["--recipe", "xnnpack-int8-static", "--qlinear", "8da4w"], "drop one of them"),
    ("mlp", ["--recipe", "xnnpack-8da4w", "--calibration", "{calibration}"], "--calibration is for the pt2e recipes"),
    ("mlp", ["--group-size", "32"], "--group-size goes with a quantization recipe"),
    ("mlp", ["--recipe", "xnnpack", "--backend", "texir-reference", "--whole"], "a recipe lowers with XNNPACK"),
    ("mlp", ["--recipe", "xnnpack", "--partitioner", "vulkan"], "a recipe lowers with xnnpack or executorch:xnnpack"),
    ("mlp", ["--recipe", "xnnpack-int8-static", "--calibration", "{bad}"], "holds dict; save a non-empty list of input tuples"),
    ("mlp", ["--recipe", "xnnpack-int8-static", "--calibration", "{wide}"], "item 0 holds 2 inputs; the MODEL takes 1"),
]


@pytest.mark.parametrize("model,flags,message", MISTAKES, ids=[" ".join(f) for _, f, _ in MISTAKES])
def test_a_bad_combination_is_one_line_and_writes_nothing(
    model: str, flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {"calibration": tmp_path / "c.pt", "bad": tmp_path / "bad.pt", "wide": tmp_path / "wide.pt"}
    torch.save([(torch.randn(2, 64),)], files["calibration"])
    torch.save({"x": torch.randn(2, 64)}, files["bad"])
    torch.save([(torch.randn(2, 64), torch.randn(2, 64))], files["wide"])
    out = tmp_path / "model.pte"
    flags = [f.format(**{k: str(v) for k, v in files.items()}) for f in flags]
    assert main(["lower", f"tests.test_recipes:{model}", *flags, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_the_api_raises_recipe_errors() -> None:
    from texir import recipes

    with pytest.raises(RecipeError, match="not a recipe"):
        recipes.Recipe(name="int8")
    with pytest.raises(RecipeError, match="'group_size': Input should be a valid integer"):
        recipes.Recipe(name="xnnpack-8da4w", group_size="64")  # type: ignore[arg-type]  # the mistake under test
    with pytest.raises(RecipeError, match="'qlinaer': Extra inputs are not permitted"):
        recipes.Recipe(qlinaer="8da4w")  # type: ignore[call-arg]  # the mistake under test
    module, args = mlp()
    with pytest.raises(RecipeError, match="quantizes an eager module"):
        recipes.lower(torch.export.export(module, args), args, recipes.Recipe(name="xnnpack-int8-dynamic"))
