"""`texir lower hf:DIR --task text-generation [--max-seq-len N] [--qlinear 8da4w|8da8w [--group-size N]]
[--qembedding 4w|8w [--qembedding-group-size N]] [-o X.pte]`: a local transformers checkpoint directory (config.json + safetensors) lowered with
texir's native XNNPACK for ExecuTorch's LLM runner: static KV cache, weights memory-mapped from the
checkpoint (a model larger than RAM lowers), `X.pte` + its weights in `X.ptd`, and the runner's
constant methods. A torchao recipe (--qlinear, --recipe xnnpack-8da4w) quantizes the loaded model in
place before the export: the quantized weights are held in memory (once), the others stay mapped.
--qembedding's weight-only embeddings are then fused by ExecuTorch's own quant-fusion pass into the
`quantized_decomposed::embedding_4bit`/`embedding_byte` kernels its runtime has, after lowering, as
optimum-executorch's `to_executorch(do_quant_fusion_and_const_prop=True)` does."""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from pathlib import Path
from typing import Any, Final

from texir.cli.lower_output import explain_rows, print_json, print_report
from texir.cli.lower_recipe import recipe_from_args
from texir.cli.paths import Outputs, refuse_clobbering
from texir.cli.progress import Progress
from texir.errors import CheckpointError, UsageError

__all__ = ["HF_PREFIX", "TASKS", "add_checkpoint_arguments", "is_checkpoint", "run_checkpoint"]

HF_PREFIX: Final = "hf:"
TASKS: Final = ("text-generation",)
_PARTITIONERS: Final = (None, "xnnpack")
"""What `--partitioner` may be with hf:DIR: texir's native XNNPACK (the default)."""


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """`texir lower`'s options for an hf:DIR MODEL."""
    parser.add_argument("--task", choices=TASKS, default=None,
                        help="with hf:DIR: what to export the checkpoint for (default text-generation)")
    parser.add_argument("--max-seq-len", type=int, default=None, metavar="N",
                        help="with hf:DIR: positions of the static KV cache (default 128, at most the model's "
                        "max_position_embeddings)")


def is_checkpoint(model: str) -> bool:
    """True when MODEL names a checkpoint directory (`hf:DIR`)."""
    return model.strip().startswith(HF_PREFIX)


def check_checkpoint_arguments(args: argparse.Namespace) -> None:
    """--task/--max-seq-len only with hf:DIR, and hf:DIR only with the options it honours."""
    if not is_checkpoint(args.model):
        given = [flag for flag, value in (("--task", args.task), ("--max-seq-len", args.max_seq_len)) if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)} is for a checkpoint directory MODEL (hf:DIR)")
        return
    refused = [flag for flag, value in (
        ("--backend", args.backend), ("--whole", args.whole), ("--ops", args.ops), ("--tag-constants", args.tag_constants),
        ("--tag-mutated-buffers", args.tag_mutated_buffers), ("--snapshot", args.snapshot), ("--etrecord", args.etrecord),
    ) if value]
    if refused:
        raise UsageError(f"{', '.join(refused)}: not with hf:DIR, which lowers with texir's native XNNPACK")
    if args.calibration is not None:
        raise UsageError("--calibration: hf:DIR is quantized with torchao (--qlinear, --recipe xnnpack-8da4w), "
                         "which does not calibrate; drop it")
    if args.partitioner not in _PARTITIONERS:
        raise UsageError(f"--partitioner {args.partitioner}: hf:DIR lowers with texir's native XNNPACK (--partitioner xnnpack)")
    if args.max_seq_len is not None and args.max_seq_len < 1:
        raise UsageError(f"--max-seq-len {args.max_seq_len}: give a positive number of positions")


def run_checkpoint(args: argparse.Namespace) -> int:
    """Export, lower and write the checkpoint `args.model` names; print the lowering report."""
    check_checkpoint_arguments(args)
    recipe = recipe_from_args(args)  # None without --recipe/--qlinear/--qembedding
    if recipe is not None:
        # texir.recipes imports torch and torchao: only a recipe pays for it
        from texir.recipes import check_in_place

        check_in_place(recipe)
    directory = Path(args.model.strip()[len(HF_PREFIX):]).expanduser()
    if not str(directory) or not directory.is_dir():
        raise CheckpointError(f"MODEL {args.model!r}: checkpoint directory {str(directory)!r} does not exist")
    ptd = args.output.with_suffix(".ptd") if args.output is not None else None
    declared = [("--external-data", ptd), ("-o", args.output)]
    refuse_clobbering("texir lower", [], declared)
    with Outputs() as outputs, Progress("texir lower") as progress, contextlib.ExitStack() as drafts:
        for flag, path in declared:  # every output checked before any work
            outputs.add(flag, path)
        done, metadata, draft = _lower(directory, args, recipe, progress, ptd)
        if draft is not None:
            drafts.callback(draft.close)
        written = (_write(args.output, done.program, metadata, outputs, progress, draft)
                   if args.output is not None else [])
        outputs.commit()
    if draft is not None:
        _say_drafted(draft.outcome)
    explained = explain_rows(done.report) if args.explain else None
    if args.json:
        print_json(sys.stdout, done.report, explained, written)
    else:
        print_report(sys.stdout, done.report, explained)
    for name, kind, size in written:
        print(f"wrote {name} ({size:,} bytes, {kind})", file=sys.stderr)
    return 0


def _say_drafted(outcome: Any) -> None:
    if outcome.used:
        print(f"texir lower: the .ptd was written during the export: {outcome.kept / 2**20:,.1f} MiB of weights in "
              f"place, {outcome.rewritten / 2**20:,.1f} MiB written after lowering", file=sys.stderr)
    else:
        print(f"texir lower: the .ptd drafted during the export was not used ({outcome.why}); written after "
              "lowering", file=sys.stderr)


def _lower(directory: Path, args: argparse.Namespace, recipe: Any, progress: Progress,
           ptd: Path | None) -> tuple[Any, dict[str, object], Any]:
    # the adapters and transformers import torch (seconds): only a MODEL pays for it
    from texir.adapters.hf import export_text_generation
    from texir.adapters.torch_patches import make_torchvision_importable
    from texir.backends import xnnpack
    from texir.orchestrate import lower

    make_torchvision_importable()  # transformers imports torchvision
    prepare = None if recipe is None else functools.partial(_quantize, recipe)
    what = "weights memory-mapped" if recipe is None else f"quantized in memory with {recipe.describe()}"
    # a recipe's quantized weights are packed by the lowering: the draft predicts float weights only
    draft_to = ptd if recipe is None else None
    with progress.phase(f"exporting {directory} ({what})"):
        model = export_text_generation(directory, max_seq_len=args.max_seq_len, prepare=prepare, ptd=draft_to)
    try:
        # no preprocess cache: its entries would copy every weight (the named data) into it
        with progress.phase("lowering with texir's native XNNPACK"), xnnpack.registered():
            done = lower(model.program, [xnnpack.partitioner()], cache=None, jobs=args.jobs)
        if recipe is not None and recipe.qembedding:
            with progress.phase("fusing the quantized embeddings (ExecuTorch's quant_fusion_and_const_prop_pass)"):
                done = _fuse_embeddings(done)
    except BaseException:
        if model.draft is not None:
            model.draft.close()
        raise
    return done, model.metadata, model.draft


def _fuse_embeddings(done: Any) -> Any:
    """`done` with its program after ExecuTorch's quant_fusion_and_const_prop_pass: the torchao
    `dequantize_affine` + `embedding` --qembedding leaves outside XNNPACK become ExecuTorch's
    `embedding_4bit`/`embedding_byte` (packed weights, folded as constants), which the runtime runs."""
    # the bridge's pass imports executorch: only --qembedding pays for it
    from texir.ir import CallFunction
    from texir.ir.analysis import walk_graphs
    from texir.recipes import fuse_quantized_embeddings

    fused_done = fuse_quantized_embeddings(done)
    program = fused_done.program
    fused = sorted({n.target for _, graph in walk_graphs(program.graph) for n in graph.nodes
                    if isinstance(n, CallFunction) and n.target.startswith("quantized_decomposed::embedding_")})
    # the report (printed next) was made before the fusion: say what replaced its undelegated pair
    print(f"texir lower: --qembedding: ExecuTorch's quant-fusion pass replaced torchao::dequantize_affine + "
          f"aten::embedding with {', '.join(fused) or 'nothing'} (the runtime's kernel)", file=sys.stderr)
    return fused_done


def _quantize(recipe: Any, model: Any) -> None:
    """`recipe` applied to the loaded checkpoint in place; says on stderr what left the mapping."""
    # texir.recipes imports torchao: only a recipe pays for it
    from texir.recipes import quantize_in_place

    quantize_in_place(model, recipe)
    held = [p for name, p in model.named_parameters() if ".parametrizations." in name]
    if held:
        size = sum(p.numel() * p.element_size() for p in held)
        print(f"texir lower: {recipe.describe()}: the quantized weights ({size / 2**20:,.1f} MiB) are held in "
              "memory, not memory-mapped from the checkpoint; the other weights stay mapped", file=sys.stderr)


def _write(output: Path, lowered: Any, metadata: dict[str, object], outputs: Outputs,
           progress: Progress, draft: Any) -> list[tuple[str, str, int]]:
    # the emitter loads only when -o asks for a file
    from texir.adapters import constant_methods
    from texir.emit import DEFAULT_EXTERNAL_TAG, EmitOptions, emit
    from texir.serialize import pte

    options = EmitOptions(external_constants=True, external_named_data=DEFAULT_EXTERNAL_TAG,
                          emit_mutable_buffer_names=True)
    written: list[tuple[str, str, int]] = []
    with progress.phase(f"writing {output}"):
        program = emit(lowered, options, constant_methods=constant_methods(metadata))
        ptd = output.with_suffix(".ptd")  # one tag, DEFAULT_EXTERNAL_TAG: X.ptd beside X.pte
        for data in program.external:
            outputs.write(ptd, functools.partial(_dump_ptd, data, draft))
            written.append((str(ptd), f".ptd: {len(data.entries)} entries", outputs.size(ptd)))
        outputs.write(output, lambda tmp: pte.dump(program, tmp))
        written.append((str(output), ".pte", outputs.size(output)))
    return written


def _dump_ptd(data: Any, draft: Any, path: Path) -> None:
    # the serializer loads only when -o asks for a file
    from texir.serialize import pte

    pte.dump_ptd(data, path, draft=draft)
