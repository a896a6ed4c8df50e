"""`texir lower MODEL --recipe NAME [--group-size N] [--qlinear C [--qlinear-group-size N]]
[--qembedding C [--qembedding-group-size N]] [--calibration FILE]`: quantize MODEL's eager module as ExecuTorch's recipe (or optimum-executorch's
flags) does, then lower it with XNNPACK (`texir.recipes`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from texir.cli.model_spec import ExportRecipe, load_model_source
from texir.errors import UsageError

if TYPE_CHECKING:
    from texir.ir import Program
    from texir.lowering.report import LowerReport
    from texir.recipes import Recipe

__all__ = ["RECIPE_PARTITIONERS", "add_recipe_arguments", "lower_with_recipe", "recipe_from_args"]

RECIPE_NAMES: Final = ("xnnpack", "xnnpack-int8-static", "xnnpack-int8-static-per-tensor", "xnnpack-int8-dynamic",
                       "xnnpack-8da4w")
"""texir.recipes.RECIPES' keys, spelled here so --help needs no torch (tests/test_recipes.py checks they agree)."""
RECIPE_PARTITIONERS: Final = ("xnnpack", "executorch:xnnpack")
"""What a recipe lowers with: texir's native XNNPACK (the default) or ExecuTorch's through the bridge."""

EPILOG: Final = """\
recipes (ExecuTorch 1.5.1's executorch.export XNNPackRecipeType, applied with the same libraries):
  --recipe xnnpack                         FP32
  --recipe xnnpack-int8-static             PT2E_INT8_STATIC_PER_CHANNEL (XNNPACKQuantizer, calibrated)
  --recipe xnnpack-int8-static-per-tensor  PT2E_INT8_STATIC_PER_TENSOR
  --recipe xnnpack-int8-dynamic            PT2E_INT8_DYNAMIC_PER_CHANNEL
  --recipe xnnpack-8da4w [--group-size N]  TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR (groups of N,
                                           default 32; --group-size 0: ..._PER_CHANNEL)
  --qlinear 8da4w|8da8w|8da4w,8da8w [--qlinear-group-size N]  optimum-executorch's torchao linears
                                           (--group-size N spells --qlinear-group-size N too)
  --qembedding 4w|8w [--qembedding-group-size N]  with hf:DIR: optimum-executorch's weight-only
                                           embeddings (per row, or groups of N columns), run by
                                           ExecuTorch's embedding_4bit / embedding_byte kernels
  --calibration FILE   the pt2e recipes calibrate on torch.save([(x1,), (x2,), ...], FILE) instead of
                       the MODEL's example inputs
"""


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("quantization recipes (docs/quantization.md)", EPILOG)
    group.add_argument("--recipe", metavar="NAME", default=None,
                       help=f"quantize and lower as ExecuTorch's recipe does: {', '.join(RECIPE_NAMES)}")
    group.add_argument("--group-size", type=int, default=None, metavar="N",
                       help="xnnpack-8da4w (or --qlinear 8da4w): weight columns per group (a multiple of 32; "
                       "0: per output channel)")
    group.add_argument("--qlinear", metavar="CONFIG", default=None,
                       help="optimum-executorch's linear quantization: 8da4w, 8da8w or 8da4w,8da8w (4w, 8w refused)")
    group.add_argument("--qlinear-group-size", type=int, default=None, metavar="N",
                       help="--qlinear 8da4w: weight columns per group (default 32; 0: per output channel)")
    group.add_argument("--qembedding", metavar="CONFIG", default=None,
                       help="with hf:DIR: optimum-executorch's embedding quantization, 4w or 8w (weights only)")
    group.add_argument("--qembedding-group-size", type=int, default=None, metavar="N",
                       help="--qembedding: columns per group (an even divisor of the embedding dimension; "
                       "default 0: per row)")
    group.add_argument("--calibration", type=Path, default=None, metavar="FILE",
                       help="pt2e recipes: calibrate on the input tuples of FILE (torch.save of a list of tuples)")


def recipe_from_args(args: argparse.Namespace) -> Recipe | None:
    """The recipe --recipe/--qlinear/--qembedding ask for (None without them), after refusing flags it
    cannot go with. Sets `args.partitioner` to `xnnpack` when none was given."""
    given = args.recipe is not None or args.qlinear is not None or args.qembedding is not None
    if not given:
        for flag, value in (("--group-size", args.group_size), ("--qlinear-group-size", args.qlinear_group_size),
                            ("--qembedding-group-size", args.qembedding_group_size),
                            ("--calibration", args.calibration)):
            if value is not None:
                fix = "--qembedding 4w|8w" if flag == "--qembedding-group-size" else "--recipe NAME (or --qlinear)"
                raise UsageError(f"{flag} goes with a quantization recipe: add {fix}")
        return None
    if args.backend is not None or args.whole or args.ops is not None:
        raise UsageError("a recipe lowers with XNNPACK: drop --backend/--whole/--ops "
                         f"(--partitioner may be {' or '.join(RECIPE_PARTITIONERS)})")
    if args.partitioner is None:
        args.partitioner = "xnnpack"
    if args.partitioner not in RECIPE_PARTITIONERS:
        raise UsageError(f"--partitioner {args.partitioner}: a recipe lowers with {' or '.join(RECIPE_PARTITIONERS)}")
    if args.calibration is not None and not args.calibration.is_file():
        raise UsageError(f"--calibration {str(args.calibration)!r} does not exist")
    # texir.recipes imports torch and torchao: only a recipe pays for it
    from texir.recipes import Recipe

    return Recipe(name=args.recipe or "xnnpack", group_size=args.group_size, qlinear=args.qlinear,
                  qlinear_group_size=args.qlinear_group_size, qembedding=args.qembedding,
                  qembedding_group_size=args.qembedding_group_size)


def lower_with_recipe(
    args: argparse.Namespace, recipe: Recipe, partitioner: Any, progress: Any, *, jobs: int, cache: bool
) -> tuple[Program, LowerReport, Program]:
    """Load MODEL's eager module, quantize and export it with `recipe`, lower it with `partitioner`:
    (lowered program, report, programs the partitioner was shown, edge program)."""
    # the recipe's libraries (torch, torchao, pt2e) load only when a recipe runs
    from texir import recipes

    with progress.phase(f"loading {args.model}"):
        source = load_model_source(args.model)
    choice: Literal["default"] | None = "default" if cache else None
    if isinstance(source, ExportRecipe):
        if source.kwargs:
            raise UsageError(f"{args.model} gives keyword inputs; a recipe (as ExecuTorch's) exports positional "
                             "inputs only: return (module, example_args)")
        calibration = None
        if args.calibration is not None:
            calibration = recipes.load_calibration(args.calibration, len(source.args))
        with progress.phase(f"quantizing with recipe {recipe.describe()}"):
            model: Any = recipes.export(source.module, source.args, recipe, calibration=calibration,
                                        dynamic_shapes=source.dynamic_shapes)
        recipe = recipes.Recipe()  # quantized and exported: what is left is the xnnpack recipe's lowering
    else:
        model = source
    with progress.phase(f"lowering with {partitioner!r}"):
        done = recipes.lower(model, (), recipe, partitioner=partitioner, cache=choice, jobs=jobs)
    return done.program, done.report, done.edge
