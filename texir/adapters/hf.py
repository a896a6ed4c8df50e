"""A local transformers checkpoint directory (config.json + safetensors) as the program ExecuTorch's
LLM runner expects: a decoder-only language model with a static KV cache, exported as transformers
exports it for ExecuTorch (`TorchExportableModuleForDecoderOnlyLM`, a dynamic sequence length so
prefill and decode share one method), its weights memory-mapped from the checkpoint and exported
weightless (`texir.adapters.weights`), and the constant methods the runner reads (max sequence
length, vocabulary size, BOS/EOS ids, ...).

    model = export_text_generation(Path("my-llama"), max_seq_len=128)
    lowered = lower(model.program, [...])
    emit(lowered.program, ..., constant_methods=constant_methods(model.metadata))"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import msgspec
import torch
from torch.export import ExportedProgram

from texir.adapters.checkpoints import checkpoint_files, mapped_tensors
from texir.adapters.ptd_prediction import predicted_ptd
from texir.adapters.weights import attach_weights, weightless
from texir.serialize.pte import PtdDraft
from texir.errors import CheckpointError, TexirError

__all__ = ["ARCHITECTURES", "DEFAULT_MAX_SEQ_LEN", "TextGeneration", "export_text_generation", "load_causal_lm",
           "text_generation_metadata"]

ARCHITECTURES: Final[dict[str, str]] = {"llama": "LlamaForCausalLM"}
"""config.json's `model_type` -> the transformers class texir exports it with (the ones its tests
run in ExecuTorch's runtime against transformers' logits)."""
DEFAULT_MAX_SEQ_LEN: Final = 128
"""The KV cache's length when none is given (ExecuTorch's Llama export's default), at most the
model's `max_position_embeddings`."""
_MEMINFO: Final = "/proc/meminfo"
_PROMPT: Final = (1, 2, 3, 4)
"""Token ids export traces the prefill with (any ids: the sequence length is dynamic)."""


class TextGeneration(msgspec.Struct, frozen=True):
    """A checkpoint exported for text generation: `program` (forward(input_ids, cache_position) ->
    logits, the weights attached by reference to the checkpoint's mapping) and `metadata`, the
    constant methods ExecuTorch's LLM runner reads."""

    program: ExportedProgram
    metadata: dict[str, object]
    max_seq_len: int
    draft: PtdDraft | None = None
    """With `export_text_generation(..., ptd=PATH)`: the `.ptd` drafted while the model exported,
    for `dump_ptd(..., draft=...)`; its owner closes it (`close()`, or `with`)."""


def _config(directory: Path) -> Any:
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {str(directory)!r} does not exist")
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(
            f"{directory}: no config.json; give the directory save_pretrained wrote (config.json + safetensors)"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a JSON file ({exc})") from None
    kind = raw.get("model_type") if isinstance(raw, dict) else None
    if kind not in ARCHITECTURES:
        raise CheckpointError(
            f"{path}: model_type {kind!r} is not supported for text-generation; supported: "
            f"{', '.join(f'{k} ({v})' for k, v in ARCHITECTURES.items())}"
        )
    # transformers loads in seconds: only a checkpoint directory that passed the checks above pays for it
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(str(directory))
    except Exception as exc:  # transformers' own validation of the config's fields
        raise CheckpointError(f"{path}: transformers cannot read it: {type(exc).__name__}: {exc}") from None


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Modules built inside put their parameters on the meta device as they register them (so a
    constructor's initialisation costs nothing) and keep their buffers real: buffers such as
    rotary frequencies are computed in the constructor and are not in the checkpoint."""
    register = torch.nn.Module.register_parameter

    def on_meta(self: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(self, name, param)
        if param is not None:
            self._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]  # restored below
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]  # the original


def load_causal_lm(directory: Path) -> Any:
    """The checkpoint's transformers model in eval mode, its parameters the checkpoint's tensors
    memory-mapped (tied ones tied as config.json says). A parameter the checkpoint lacks, or a
    shape that differs from the config's, is a CheckpointError."""
    # transformers loads in seconds: only a checkpoint directory pays for it
    import transformers

    config = _config(directory)
    tensors = mapped_tensors(checkpoint_files(directory))
    with _parameters_on_meta():
        model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]  # transformers leaves it untyped
    try:
        result = model.load_state_dict(tensors, strict=False, assign=True)
    except RuntimeError as exc:  # shapes that do not match the config
        raise CheckpointError(f"{directory}: the weights do not fit config.json: {str(exc).strip()[:400]}") from None
    model.tie_weights()
    missing = [name for name, p in model.named_parameters(remove_duplicate=False) if p.is_meta]
    if missing:
        raise CheckpointError(f"{directory}: the checkpoint lacks {len(missing)} parameters, e.g. {', '.join(missing[:3])}")
    if result.unexpected_keys:
        raise CheckpointError(
            f"{directory}: the checkpoint holds tensors the {type(model).__name__} of config.json does not have, "
            f"e.g. {', '.join(sorted(result.unexpected_keys)[:3])}"
        )
    return model.eval()  # parameters keep requires_grad as built, as from_pretrained leaves them


def export_text_generation(directory: Path, *, max_seq_len: int | None = None,
                           prepare: Callable[[torch.nn.Module], None] | None = None,
                           ptd: Path | None = None) -> TextGeneration:
    """The checkpoint in `directory` exported for text generation with a static KV cache of
    `max_seq_len` positions (default `DEFAULT_MAX_SEQ_LEN`, at most the model's
    `max_position_embeddings`). `prepare` changes the loaded model in place before the export
    (`texir.recipes.quantize_in_place`): the weights it replaces are no longer memory-mapped but
    held in memory; their originals are dropped. With `ptd`, the path the lowered program's weights
    will be written to, the `.ptd` is drafted during the export (`texir.adapters.ptd_prediction`):
    the result's `draft`, which the caller passes to `dump_ptd` and closes; None when the checkpoint
    takes more than half the available memory (`_draft_fits`)."""
    # transformers loads in seconds: only a checkpoint directory pays for it
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = load_causal_lm(directory)
    config = model.config
    limit = int(getattr(config, "max_position_embeddings", 0) or 0)
    length = max_seq_len if max_seq_len is not None else min(DEFAULT_MAX_SEQ_LEN, limit or DEFAULT_MAX_SEQ_LEN)
    if length <= len(_PROMPT) or (limit and length > limit):
        raise CheckpointError(
            f"max_seq_len (--max-seq-len) {length}: give more than {len(_PROMPT)} positions"
            + (f" and at most the model's max_position_embeddings, {limit}" if limit else "")
        )
    if prepare is not None:
        prepare(model)
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    config._attn_implementation = "sdpa"
    exportable = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=length).eval()
    seq = torch.export.Dim("seq", min=1, max=length - 1)
    # the weights go to disk while torch traces (the module torch.export is given: the wrapper's)
    draft = _draft(ptd, exportable.model) if ptd is not None and _draft_fits(directory) else None
    try:
        with weightless(exportable) as weights:
            # strict: torch's non-strict export lifts the cache tensors a second time as constants
            ep = exportable.export(
                input_ids=torch.tensor([list(_PROMPT)]), cache_position=torch.arange(len(_PROMPT)), strict=True,
                dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            )
        program = attach_weights(ep, weights)
    except BaseException:
        if draft is not None:
            draft.close()
        raise
    return TextGeneration(program=program, metadata=text_generation_metadata(config, length), max_seq_len=length,
                          draft=draft)


def _draft(ptd: Path, module: torch.nn.Module) -> PtdDraft | None:
    """The draft of `ptd`, or None when it cannot start (a destination it cannot write: the write
    after lowering then says why, as without a draft)."""
    try:
        return PtdDraft(ptd, predicted_ptd(module))
    except TexirError:
        return None


def _draft_fits(directory: Path) -> bool:
    """Whether the checkpoint's files take at most half the memory the system has available: a
    draft reads every weight during the export, and a checkpoint the page cache cannot keep is then
    read from disk twice over while the export competes for the memory (a 24 GiB checkpoint on a
    23.5 GiB machine: its export took twice as long)."""
    try:
        with open(_MEMINFO, encoding="ascii") as fh:
            available = next((int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")), None)
    except (OSError, ValueError, IndexError):
        available = None
    if available is None:
        return True  # not Linux: nothing says it does not fit
    return sum(p.stat().st_size for p in checkpoint_files(directory)) <= available // 2


def text_generation_metadata(config: Any, length: int) -> dict[str, object]:
    """The constant methods ExecuTorch's LLM runner reads (the names its Llama export writes) for a
    transformers `config` with a KV cache of `length` positions."""
    metadata: dict[str, object] = {
        "get_max_seq_len": length, "get_max_context_len": length, "get_vocab_size": int(config.vocab_size),
        "use_kv_cache": True, "enable_dynamic_shape": True,
    }
    if getattr(config, "bos_token_id", None) is not None:
        metadata["get_bos_id"] = int(config.bos_token_id)
    eos = getattr(config, "eos_token_id", None)
    if eos is not None:
        metadata["get_eos_ids"] = [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])]
    return metadata
