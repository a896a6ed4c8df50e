"""Entry point of the `texir` console script: dispatches to one module per subcommand.

Each command module `texir.cli.cmd_<name>` defines `register(subparsers) -> None`, which adds its
parser and sets `func=run` (a `Callable[[argparse.Namespace], int]`). User mistakes raise
`TexirError`; they are printed as one line and exit with status 2, with no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence

from texir.cli import interrupts
from texir.errors import TexirError

COMMAND_MODULES: tuple[str, ...] = (
    "texir.cli.cmd_snapshot",
    "texir.cli.cmd_show",
    "texir.cli.cmd_lower",
    "texir.cli.cmd_bundle",
    "texir.cli.cmd_run",
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
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show third-party log output (torch's, torchao's, ExecuTorch's runtime's)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]
        register = module.register
        register(sub)
    return parser


_QUIET_LOGGERS: tuple[str, ...] = (
    "torchao",  # "Failed to load .../_C_mxfp8...so": torchao's optional CUDA kernels, on import
    "torch.utils._pytree",  # torchao registers an Enum with register_constant(): torch's deprecation note
)
"""Third-party loggers whose warnings are noise a texir user cannot act on (raised to ERROR while a
command runs)."""


@contextlib.contextmanager
def _quiet_third_parties() -> Iterator[None]:
    """Inside a command only (the caller's process keeps its own settings): known third-party noise
    off. torch 2.13's own run_decompositions() deep-copies pytree specs and trips its own deprecation
    warning; torchao warns about its CUDA kernels and torch about torchao's enums."""
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
        )
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def main(argv: Sequence[str] | None = None, *, process_exit: bool = False) -> int:
    """Run one command; returns its exit status. `process_exit`: the process ends with it (the
    `texir` program): a Ctrl-C after the command's outputs are in place no longer changes the status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        quiet = contextlib.nullcontext() if getattr(args, "verbose", False) else _quiet_third_parties()
        with interrupts.guarded(process_exit=process_exit), quiet:
            code = func(args)
            if interrupts.interrupted():  # a SIGINT swallowed where nothing checked it since
                raise KeyboardInterrupt
            return code
    except TexirError as exc:
        if interrupts.interrupted():  # e.g. --jobs workers killed by the same Ctrl-C
            print(f"texir {args.command}: interrupted", file=sys.stderr)
            return 130
        print(f"texir {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"texir {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def run() -> None:
    """The `texir` program: `main` on the command line, then exit with its status."""
    code = main(process_exit=True)
    interrupts.checkpoint("exiting")
    sys.exit(code)


if __name__ == "__main__":
    run()
