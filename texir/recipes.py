"""Quantization recipes: ExecuTorch 1.5.1's XNNPACK recipes (`executorch.export`'s `XNNPackRecipeType`)
and optimum-executorch's `--qlinear` / `--qembedding`, applied with the libraries they name (pt2e with
ExecuTorch's `XNNPACKQuantizer`, torchao's `quantize_`), then lowered with texir's native XNNPACK.

    from texir import recipes
    lowered = recipes.lower(model, (x,), recipes.Recipe(name="xnnpack-int8-static"))
    # lowered.program -> texir.emit.emit -> .pte, what executorch.export writes for the same recipe

Each step is the one ExecuTorch's `ExportSession` runs for the recipe: a torchao recipe deep-copies the
module, `quantize_`s it and unwraps the tensor subclasses (SourceTransformStage); a pt2e recipe exports
the module (strict), prepares it with the quantizer, runs it on every calibration input and converts it
(QuantizeStage); then `torch.export.export(..., strict=True)` under `torch.no_grad()` (TorchExportStage)
and `texir.lower` with the XNNPACK partitioner (EdgeTransformAndLowerStage; the recipe's
`XnnpackPartitioner(precision_type=...)` passes the precision as an option no config reads, so it is
the default partitioner, as here). The orchestration layer: above the bridge, which holds the quantizer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec
import pydantic
import torch
from torch.export import ExportedProgram

from texir.backends import xnnpack
from texir.errors import RecipeError
from texir.executorch.passes import fuse_quantized_embeddings
from texir.executorch.quantizer import xnnpack_quantizer
from texir.lowering.lower import CacheChoice
from texir.lowering.plan import Partitioner
from texir.lowering.report import Lowered
from texir.orchestrate import lower as lower_program

__all__ = ["QEMBEDDING", "QLINEAR", "RECIPES", "Recipe", "RecipeKind", "check_in_place", "export",
           "fuse_quantized_embeddings", "load_calibration", "lower", "quantize", "quantize_in_place"]


class RecipeKind(msgspec.Struct, frozen=True):
    """One recipe: ExecuTorch's name for it and how it quantizes."""

    executorch: str
    """`XNNPackRecipeType` member (the grouped 8da4w one; `group_size=0` picks the per-channel one)."""
    pt2e: tuple[bool, bool] | None = None
    """(per_channel, dynamic) of the XNNPACKQuantizer config; None for no pt2e quantization."""
    int4_weights: bool = False
    """torchao's Int8DynamicActivationIntxWeightConfig with int4 weights."""


RECIPES: Final[dict[str, RecipeKind]] = {
    "xnnpack": RecipeKind("FP32"),
    "xnnpack-int8-static": RecipeKind("PT2E_INT8_STATIC_PER_CHANNEL", pt2e=(True, False)),
    "xnnpack-int8-static-per-tensor": RecipeKind("PT2E_INT8_STATIC_PER_TENSOR", pt2e=(False, False)),
    "xnnpack-int8-dynamic": RecipeKind("PT2E_INT8_DYNAMIC_PER_CHANNEL", pt2e=(True, True)),
    "xnnpack-8da4w": RecipeKind("TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR", int4_weights=True),
}
"""texir's recipe names -> ExecuTorch's. (ExecuTorch calls the grouped int4 recipe PER_TENSOR; its
weights are quantized per group of `group_size` columns, 32 by default.)"""

QLINEAR: Final[dict[str, str]] = {
    "8da4w": "int8 dynamic activations, int4 weights per group (Int8DynamicActivationIntxWeightConfig)",
    "8da8w": "int8 dynamic activations, int8 weights per output channel (Int8DynamicActivationIntxWeightConfig)",
    "4w": "int4 weights only (IntxWeightOnlyConfig)",
    "8w": "int8 weights only (IntxWeightOnlyConfig)",
}
"""optimum-executorch's --qlinear choices (a primary, optionally ',8da8w' for linears the group size does not divide)."""
QEMBEDDING: Final[dict[str, str]] = {
    "4w": "int4 weights only, run by ExecuTorch's quantized_decomposed::embedding_4bit (IntxWeightOnlyConfig)",
    "8w": "int8 weights only, run by ExecuTorch's quantized_decomposed::embedding_byte (IntxWeightOnlyConfig)",
}
"""optimum-executorch's --qembedding choices: weight-only quantization of every nn.Embedding, per row
(--qembedding-group-size 0, optimum's default) or in groups of columns."""
WEIGHT_ONLY_REFUSAL: Final = (
    "weight-only quantization is not supported: ExecuTorch 1.5.1's runtime has no kernel for the "
    "torchao::dequantize_affine it leaves outside XNNPACK (ExecuTorch's own to_executorch fails the same "
    "way, 'Missing out variants'), and texir has no counterpart of ExecuTorch's quant-fusion pass; use "
    "--qlinear 8da4w or 8da8w"
)
QEMBEDDING_NEEDS_CHECKPOINT: Final = (
    "is for a checkpoint directory (texir lower hf:DIR --task text-generation): there texir runs "
    "ExecuTorch's quant-fusion pass, which turns the weight-only embedding into the embedding_4bit/"
    "embedding_byte kernels its runtime has; a MODEL's program would keep torchao::dequantize_affine, "
    "which the runtime cannot run"
)
QPARAMS_ALGORITHM: Final = "hqq_scale_only"
"""optimum-executorch's choice of qparams for its torchao configs."""
XNNPACK_GROUP_MULTIPLE: Final = 32
INT4: Final[torch.dtype] = getattr(torch, "int4")  # a torch dtype at run time that torch's stubs do not declare


class Recipe(pydantic.BaseModel):
    """A validated recipe: one of `RECIPES`, and with `xnnpack` optionally optimum-style torchao
    quantization of linears (`qlinear`) and embeddings (`qembedding`). Bad combinations raise
    `RecipeError` when built."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str = "xnnpack"
    group_size: int | None = None
    """`xnnpack-8da4w`: columns per weight group (a multiple of 32; None: ExecuTorch's 32; 0: one
    group per output channel, ExecuTorch's PER_CHANNEL recipe). With `qlinear`, another spelling of
    `qlinear_group_size`."""
    qlinear: str | None = None
    """'8da4w', '8da8w', '4w', '8w' or '8da4w,8da8w' (optimum-executorch's --qlinear)."""
    qlinear_group_size: int | None = None
    """Columns per group for --qlinear's grouped configs (None: optimum's 32; 0: per output channel)."""
    qembedding: str | None = None
    """'4w' or '8w' (optimum-executorch's --qembedding)."""
    qembedding_group_size: int | None = None
    """Columns per group of --qembedding's weights (None or 0: one group per row, optimum's default;
    else an even number dividing the embedding dimension)."""

    @pydantic.model_validator(mode="wrap")
    @classmethod
    def _typed_errors(cls, data: Any, handler: pydantic.ModelWrapValidatorHandler[Recipe]) -> Recipe:
        """A field of the wrong type or name is a `RecipeError` naming it, as every recipe mistake."""
        try:
            return handler(data)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise RecipeError(f"Recipe option {field!r}: {first['msg']}") from None

    @pydantic.model_validator(mode="after")
    def _check(self) -> Recipe:
        self._check_combination()
        return self

    def _check_combination(self) -> None:
        kind = RECIPES.get(self.name)
        if kind is None:
            raise RecipeError(f"--recipe {self.name!r} is not a recipe; known: {', '.join(RECIPES)}")
        if self.group_size is not None and not kind.int4_weights and not self.qlinear:
            raise RecipeError(f"--group-size is for --recipe xnnpack-8da4w or --qlinear, not {self.name}")
        if self.group_size is not None and self.qlinear_group_size is not None:
            raise RecipeError("--group-size and --qlinear-group-size both give --qlinear's group size: drop one")
        if self.group_size is not None:
            _check_group_size("--group-size", self.group_size)
        if (self.qlinear or self.qembedding) and self.name != "xnnpack":
            raise RecipeError(f"--qlinear/--qembedding quantize with torchao on top of --recipe xnnpack; "
                              f"--recipe {self.name} quantizes already: drop one of them")
        if self.qlinear_group_size is not None and not self.qlinear:
            raise RecipeError("--qlinear-group-size needs --qlinear")
        if self.qlinear is not None:
            configs = self.qlinear_configs
            if not 1 <= len(configs) <= 2 or any(c not in QLINEAR for c in configs) or (
                    len(configs) == 2 and configs[1] != "8da8w"):
                raise RecipeError(f"--qlinear {self.qlinear!r}: give one of {', '.join(QLINEAR)}, or "
                                  "'8da4w,8da8w' (8da8w for the linears the group size does not divide)")
            if self.qlinear_group_size is not None:
                _check_group_size("--qlinear-group-size", self.qlinear_group_size)
        if self.qembedding is not None and self.qembedding not in QEMBEDDING:
            raise RecipeError(f"--qembedding {self.qembedding!r}: give one of {', '.join(QEMBEDDING)}")
        if self.qembedding_group_size is not None:
            if not self.qembedding:
                raise RecipeError("--qembedding-group-size needs --qembedding")
            if self.qembedding_group_size < 0 or self.qembedding_group_size % 2:
                raise RecipeError(
                    f"--qembedding-group-size {self.qembedding_group_size}: give an even number of columns that "
                    "divides the embedding dimension (ExecuTorch's embedding kernels pack two int4 values a "
                    "byte), or 0 for one group per row"
                )

    @property
    def kind(self) -> RecipeKind:
        return RECIPES[self.name]

    @property
    def qlinear_configs(self) -> tuple[str, ...]:
        return tuple(c.strip() for c in (self.qlinear or "").split(",")) if self.qlinear else ()

    @property
    def executorch_recipe(self) -> str | None:
        """The `XNNPackRecipeType` member ExecuTorch's `executorch.export` has for this recipe (None
        with --qlinear/--qembedding: optimum-executorch's flags, not an ExecuTorch recipe)."""
        if self.qlinear or self.qembedding:
            return None
        if self.kind.int4_weights and self.group_size == 0:
            return "TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL"
        return self.kind.executorch

    @property
    def calibrates(self) -> bool:
        """Whether the recipe runs the module on calibration inputs (the pt2e ones)."""
        return self.kind.pt2e is not None

    def describe(self) -> str:
        parts = [self.name]
        if self.group_size is not None and not self.qlinear:
            parts.append(f"group size {self.group_size}")
        if self.qlinear:
            parts.append(f"qlinear {self.qlinear} (group size {self._linear_group()})")
        if self.qembedding:
            rows = self._embedding_group()
            parts.append(f"qembedding {self.qembedding} ({f'group size {rows}' if rows else 'per row'})")
        return ", ".join(parts)

    def _linear_group(self) -> int:
        given = self.qlinear_group_size if self.qlinear_group_size is not None else self.group_size
        return 32 if given is None else given

    def _embedding_group(self) -> int:
        return self.qembedding_group_size or 0

    def _linear_group_flag(self) -> str:
        """The flag that set --qlinear's group size, for errors about it."""
        return "--group-size" if self.group_size is not None else "--qlinear-group-size"


def _check_group_size(flag: str, size: int) -> None:
    if size < 0 or (size and size % XNNPACK_GROUP_MULTIPLE):
        raise RecipeError(
            f"{flag} {size}: XNNPACK's int4 kernels take groups of a multiple of {XNNPACK_GROUP_MULTIPLE} "
            "columns (ExecuTorch's partitioner leaves other groupings undelegated, and the runtime has no "
            "kernel for them); give 32, 64, ... or 0 for one group per output channel"
        )


def load_calibration(path: Path | str, arity: int | None = None) -> list[tuple[torch.Tensor, ...]]:
    """A calibration file: `torch.save` of a non-empty list of input tuples (each the MODEL's positional
    arguments; `arity` of them when given), loaded with `weights_only=True`. Raises `RecipeError`."""
    where = f"--calibration {str(path)!r}"
    try:
        value = torch.load(str(path), weights_only=True)
    except FileNotFoundError:
        raise RecipeError(f"{where} does not exist") from None
    except Exception as exc:  # any unreadable file is the user's to fix
        raise RecipeError(f"{where}: not a file torch.load(weights_only=True) reads ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); write it with "
                          "torch.save([(x1,), (x2,), ...], FILE)") from None
    if not isinstance(value, (list, tuple)) or not value:
        raise RecipeError(f"{where} holds {type(value).__name__}; save a non-empty list of input tuples: "
                          "torch.save([(x1,), (x2,), ...], FILE)")
    inputs: list[tuple[torch.Tensor, ...]] = []
    for i, item in enumerate(value):
        item = (item,) if isinstance(item, torch.Tensor) else item
        if not isinstance(item, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in item):
            raise RecipeError(f"{where}: item {i} is {type(item).__name__}, not a tuple of tensors")
        if arity is not None and len(item) != arity:
            raise RecipeError(f"{where}: item {i} holds {len(item)} inputs; the MODEL takes {arity}")
        inputs.append(tuple(item))
    return inputs


def quantize(
    module: torch.nn.Module,
    example_args: tuple[Any, ...],
    recipe: Recipe,
    *,
    calibration: Sequence[tuple[Any, ...]] | None = None,
) -> torch.nn.Module:
    """The module the recipe exports, never a changed `module`: `module` itself for `xnnpack`, a
    quantized copy otherwise: torchao's `quantize_` for 8da4w and --qlinear/--qembedding, pt2e's prepare, calibrate on
    `calibration` (default: the example args) and convert for the int8 recipes."""
    if calibration is not None and not recipe.calibrates:
        raise RecipeError(f"--calibration is for the pt2e recipes (xnnpack-int8-*); {recipe.name} "
                          + ("with --qlinear/--qembedding " if recipe.qlinear or recipe.qembedding else "")
                          + "does not calibrate")
    if recipe.kind.pt2e is not None:
        return _pt2e(module, example_args, recipe.kind.pt2e, calibration or [example_args])
    configs = _torchao_configs(module, recipe)
    if not configs:
        return module
    if recipe.qembedding:
        raise RecipeError(f"--qembedding {recipe.qembedding} {QEMBEDDING_NEEDS_CHECKPOINT}")
    copied = copy.deepcopy(module)  # as ExecuTorch's SourceTransformStage: the caller's module stays float
    _torchao(copied, configs)
    return copied


def quantize_in_place(module: torch.nn.Module, recipe: Recipe) -> None:
    """`module` quantized where it stands by a torchao recipe (`xnnpack-8da4w`, --qlinear), for a model
    loaded only to be lowered: each linear's float weight is dropped as its quantized one is made, so
    the model is in memory once (a checkpoint's memory-mapped weights are read, not copied). `xnnpack`
    leaves it as it is; a pt2e recipe (it exports and calibrates a copy) is a RecipeError."""
    check_in_place(recipe)
    configs = _torchao_configs(module, recipe)
    if configs:
        _torchao(module, configs)


def check_in_place(recipe: Recipe) -> None:
    """A RecipeError unless `quantize_in_place` can apply `recipe` (not a pt2e one)."""
    if recipe.kind.pt2e is not None:
        raise RecipeError(f"--recipe {recipe.name} quantizes with pt2e, which exports and calibrates a copy of "
                          "the module; a checkpoint (hf:DIR) is quantized in place before its export: use "
                          "--qlinear 8da8w (int8 weights, dynamic int8 activations) or --qlinear 8da4w")


def _torchao_configs(module: torch.nn.Module, recipe: Recipe) -> list[tuple[Any, Filter]]:
    """The torchao `quantize_` calls (config, filter) of the recipe; none for `xnnpack` alone."""
    if recipe.kind.int4_weights:
        return [(_int4_config(recipe.group_size), _linear_filter("--group-size", recipe.group_size))]
    if recipe.qlinear or recipe.qembedding:
        return _optimum_configs(module, recipe)
    return []


def _pt2e(module: torch.nn.Module, args: tuple[Any, ...], config: tuple[bool, bool],
          calibration: Sequence[tuple[Any, ...]]) -> torch.nn.Module:
    # torchao's pt2e flow is imported only by the pt2e recipes (it loads torchao's quantizer stack)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    per_channel, dynamic = config
    try:
        # No `_guards_fn` call module: torch leaves it out when ExecuTorch's QuantizeStage calls
        # `.module()` (torch's _ok_to_generate_guards_fn reads the caller's file name), and with it
        # the quantized module keeps the example's shapes as guards, so a dynamic batch fails to export.
        captured = torch.export.export(module, args, strict=True).module(check_guards=False)
    except Exception as exc:
        raise RecipeError(f"torch.export.export(strict=True), which pt2e quantization starts from, failed: "
                          f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from exc
    prepared = prepare_pt2e(captured, xnnpack_quantizer(per_channel=per_channel, dynamic=dynamic))
    for i, inputs in enumerate(calibration):
        try:
            prepared(*inputs)
        except Exception as exc:
            raise RecipeError(f"calibration input {i} does not run through the prepared model: "
                              f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}; "
                              "give tuples shaped like the MODEL's example inputs") from exc
    quantized: torch.nn.Module = convert_pt2e(prepared)
    return quantized


Filter = Callable[[torch.nn.Module, str], bool]


def _torchao(module: torch.nn.Module, configs: list[tuple[Any, Filter]]) -> None:
    """`quantize_` with each (config, filter) in order, then the tensor subclasses unwrapped for export."""
    # torchao's quantize_ and its configs: only the torchao recipes pay for the import
    from torchao.quantization import quantize_
    from torchao.utils import unwrap_tensor_subclass

    for config, keep in configs:
        quantize_(module, config, keep)
    unwrap_tensor_subclass(module)


def _int4_config(group_size: int | None) -> Any:
    # torchao's configs load with quantize_: only the torchao recipes import them
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    granularity = PerAxis(axis=0) if group_size == 0 else PerGroup(32 if group_size is None else group_size)
    return Int8DynamicActivationIntxWeightConfig(weight_dtype=INT4, weight_granularity=granularity)


def _linear_filter(flag: str, group_size: int | None, *, fallback: bool = False) -> Filter:
    """Every nn.Linear, after checking that the group size divides its input features (`fallback`:
    the error names --qlinear's per-channel fallback)."""

    def keep(module: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(module, torch.nn.Linear):
            return False
        size = 32 if group_size is None else group_size
        if size and module.in_features % size:
            fits = [g for g in range(XNNPACK_GROUP_MULTIPLE, module.in_features + 1, XNNPACK_GROUP_MULTIPLE)
                    if module.in_features % g == 0]
            raise RecipeError(
                f"{flag} {size} does not divide the {module.in_features} input features of linear {fqn!r}; "
                + (f"sizes that do: {', '.join(map(str, fits[:6]))}; " if fits else "")
                + "0 quantizes per output channel"
                + (", or --qlinear 8da4w,8da8w quantizes such linears per channel" if fallback else "")
            )
        return True

    return keep


def _optimum_configs(module: torch.nn.Module, recipe: Recipe) -> list[tuple[Any, Filter]]:
    """optimum-executorch's `quantize_model_`: embeddings first, then linears (a grouped primary
    config and, with ',8da8w', a per-channel one for the linears the group size does not divide)."""
    if recipe.qembedding and not any(isinstance(m, torch.nn.Embedding) for m in module.modules()):
        raise RecipeError(f"--qembedding {recipe.qembedding}: the MODEL has no torch.nn.Embedding to quantize; drop it")
    if recipe.qlinear and not any(isinstance(m, torch.nn.Linear) for m in module.modules()):
        raise RecipeError(f"--qlinear {recipe.qlinear}: the MODEL has no torch.nn.Linear to quantize; drop it")
    configs = recipe.qlinear_configs
    if configs and configs[0] in ("4w", "8w"):
        raise RecipeError(f"--qlinear {configs[0]}: {WEIGHT_ONLY_REFUSAL}")
    embeddings = [_embedding_config(recipe)] if recipe.qembedding else []
    return embeddings + (_linear_configs(recipe) if configs else [])


def _embedding_config(recipe: Recipe) -> tuple[Any, Filter]:
    """optimum's --qembedding: torchao's IntxWeightOnlyConfig on every nn.Embedding, per row or in
    groups of `qembedding_group_size` columns; a group size that does not divide an embedding's
    dimension names the embedding and the sizes that do."""
    # torchao's configs load with quantize_: only the torchao recipes import them
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig

    group = recipe._embedding_group()
    dtype = INT4 if recipe.qembedding == "4w" else torch.int8
    config = IntxWeightOnlyConfig(weight_dtype=dtype, granularity=PerGroup(group) if group else PerAxis(0),
                                  intx_choose_qparams_algorithm=QPARAMS_ALGORITHM)

    def keep(module: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(module, torch.nn.Embedding):
            return False
        dim = module.embedding_dim
        if dim % 2 and recipe.qembedding == "4w":
            raise RecipeError(f"--qembedding 4w: embedding {fqn!r} has {dim} columns, and ExecuTorch's "
                              "embedding_4bit packs two a byte (an even number); use --qembedding 8w")
        if group and dim % group:
            fits = [g for g in range(2, dim + 1, 2) if dim % g == 0]
            raise RecipeError(
                f"--qembedding-group-size {group} does not divide the {dim} columns of embedding {fqn!r}; "
                + (f"sizes that do: {', '.join(map(str, fits[-6:]))}; " if fits else "")
                + "0 quantizes per row"
            )
        return True

    return config, keep


def _linear_configs(recipe: Recipe) -> list[tuple[Any, Filter]]:
    """optimum's --qlinear (8da4w, 8da8w, 8da4w,8da8w) as torchao configs and filters."""
    # torchao's configs load with quantize_: only the torchao recipes import them
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    configs = recipe.qlinear_configs
    group, flag = recipe._linear_group(), recipe._linear_group_flag()

    def dynamic(weight_dtype: torch.dtype, granularity: Any) -> Any:
        return Int8DynamicActivationIntxWeightConfig(
            weight_dtype=weight_dtype, weight_granularity=granularity, intx_choose_qparams_algorithm=QPARAMS_ALGORITHM)

    if configs[0] == "8da8w":
        return [(dynamic(torch.int8, PerAxis(0)), _linear_filter(flag, 0))]
    primary = dynamic(INT4, PerAxis(0) if group == 0 else PerGroup(group))
    if len(configs) == 1 or group == 0:
        return [(primary, _linear_filter(flag, group, fallback=True))]

    def divisible(m: torch.nn.Module, fqn: str) -> bool:
        return isinstance(m, torch.nn.Linear) and m.in_features % group == 0

    def indivisible(m: torch.nn.Module, fqn: str) -> bool:
        return isinstance(m, torch.nn.Linear) and m.in_features % group != 0

    return [(primary, divisible), (dynamic(torch.int8, PerAxis(0)), indivisible)]


def export(
    module: torch.nn.Module,
    example_args: tuple[Any, ...],
    recipe: Recipe,
    *,
    calibration: Sequence[tuple[Any, ...]] | None = None,
    dynamic_shapes: Any = None,
) -> ExportedProgram:
    """`quantize`, then `torch.export.export(strict=True)` under `torch.no_grad()`, as ExecuTorch's
    TorchExportStage does."""
    quantized = quantize(module, example_args, recipe, calibration=calibration)
    try:
        with torch.no_grad():
            return torch.export.export(quantized, example_args, dynamic_shapes=dynamic_shapes, strict=True)
    except RecipeError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise RecipeError(f"torch.export.export(strict=True) of the {recipe.name} module failed "
                          f"(ExecuTorch's recipes export strictly): {type(exc).__name__}: {first}") from exc


def lower(
    model: torch.nn.Module | ExportedProgram,
    example_args: tuple[Any, ...],
    recipe: Recipe,
    *,
    calibration: Sequence[tuple[Any, ...]] | None = None,
    dynamic_shapes: Any = None,
    partitioner: Partitioner | None = None,
    cache: CacheChoice = "default",
    jobs: int = 1,
) -> Lowered:
    """`export` with the recipe, then `texir.lower` with `partitioner` (default: texir's native
    XNNPACK partitioner, whose delegates are ExecuTorch's bytes). An `ExportedProgram` takes only the
    `xnnpack` recipe: the others quantize the eager module (ExecuTorch's recipes skip quantization
    for one too)."""
    if isinstance(model, ExportedProgram):
        if recipe.name != "xnnpack" or recipe.qlinear or recipe.qembedding:
            raise RecipeError(f"recipe {recipe.describe()} quantizes an eager module, and the MODEL is an "
                              "ExportedProgram; point MODEL at a function returning (module, example_inputs)")
        program = model
    else:
        program = export(model, example_args, recipe, calibration=calibration, dynamic_shapes=dynamic_shapes)
    chosen = xnnpack.partitioner() if partitioner is None else partitioner
    return lower_program(program, [chosen], cache=cache, jobs=jobs)

