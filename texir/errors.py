"""The typed error hierarchy every texir layer raises; callers catch `TexirError`."""

from __future__ import annotations


class TexirError(Exception):
    """Base of every error texir raises on bad input. The message names the offending
    node, tag or field and says how to fix it."""


class IRError(TexirError):
    """A Program breaks an IR invariant (raised by `texir.ir.verify`)."""


class ConversionError(TexirError):
    """A torch object could not be converted to or from the IR."""


class UnsupportedError(ConversionError):
    """The input uses a node, argument or value kind texir does not support."""


class SnapshotError(TexirError):
    """Snapshot bytes are corrupt, truncated or of an unknown schema version."""


class LoweringError(TexirError):
    """Partitioning, delegation or a backend failed."""


class PteError(TexirError):
    """A `.pte` file could not be emitted, encoded or decoded."""


class ModelSpecError(TexirError):
    """A MODEL argument (file.py:callable, module:callable or .pt2 file) could not be loaded."""


class CheckpointError(ModelSpecError):
    """A checkpoint directory (transformers' config.json + safetensors weights) could not be read,
    or holds an architecture texir cannot export."""


class UsageError(TexirError):
    """A command-line mistake texir can tell before doing any work (e.g. an output that would
    overwrite an input)."""


class ParseError(TexirError):
    """IR text (`texir.ir.parse_program`) does not follow the printer's grammar. `line` and
    `column` are 1-based; `expected` says what the parser wanted there."""

    def __init__(self, message: str, *, line: int, column: int, expected: str) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.line = line
        self.column = column
        self.expected = expected


class RecipeError(TexirError):
    """A quantization recipe (`texir.recipes`, `texir lower --recipe/--qlinear/--qembedding`) does not
    fit the model or its options: the message names the option or the module and says what fits."""
