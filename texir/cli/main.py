"""Entry point of the `texir` console script: dispatches to one module per subcommand.

Each command module `texir.cli.cmd_<name>` defines `register(subparsers) -> None`, which adds its
parser and sets `func=run` (a `Callable[[argparse.Namespace], int]`). User mistakes raise
`TexirError`; they are printed as one line and exit with status 2, with no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Callable, Sequence

from texir.errors import TexirError

COMMAND_MODULES: tuple[str, ...] = (
    "texir.cli.cmd_snapshot",
    "texir.cli.cmd_show",
    "texir.cli.cmd_lower",
    "texir.cli.cmd_bundle",
    "texir.cli.cmd_inspect",
    "texir.cli.cmd_diff",
    "texir.cli.cmd_demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="texir",
        description="Typed, immutable ExecuTorch delegation: export, partition, delegate, write .pte.",
        epilog="example: texir show texir.models:conv_relu_tan",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]
        register = module.register
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # torch 2.13's own run_decompositions() deep-copies pytree specs and trips its own deprecation
    # warning; it is torch-internal noise a CLI user cannot act on. The library leaves warnings alone.
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return func(args)
    except TexirError as exc:
        print(f"texir {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"texir {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
