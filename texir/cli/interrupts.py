"""Ctrl-C (SIGINT) for texir's commands: exit 130 with nothing written, wherever it lands.

`main` runs each command under `guarded()`: SIGINT raises KeyboardInterrupt as usual and is also
remembered, so an interrupt that lands where Python swallows exceptions (a weakref callback, a
``__del__``: "Exception ignored ... KeyboardInterrupt") still stops the command at the next
`checkpoint()`, or before any output is renamed into place (`texir.cli.paths.Outputs`), and the
command exits 130. While outputs are renamed into place, SIGINT is only remembered (`deferred()`);
once they are all in place (`finished()`) it is ignored: the command has done its work, and exits 0.
Run as the `texir` program (`guarded(process_exit=True)`), a finished command keeps ignoring SIGINT
until the process ends: a Ctrl-C during the interpreter's teardown does not turn a finished build into
exit 130.

Testing: `TEXIR_TEST_INTERRUPT_AT=N` sends SIGINT at the N-th checkpoint, or at the one labelled N
when N is not a number (``N:swallow`` swallows
the KeyboardInterrupt there, as a weakref callback would); `set_checkpoint_hook` sees each one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Literal

__all__ = ["checkpoint", "deferred", "finished", "guarded", "interrupted", "set_checkpoint_hook"]

TEST_ENV = "TEXIR_TEST_INTERRUPT_AT"

_Mode = Literal["raise", "defer", "ignore"]
_mode: _Mode = "raise"
_received = False
_count = 0
_hook: Callable[[int, str], None] | None = None
_active = False
"""Inside `guarded()`: only a command's own checkpoints act on the SIGINT it received (a swallowed
one must not stop library code that runs after the command, e.g. in the same test process)."""


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _received
    if _mode == "ignore":
        return
    _received = True
    if _mode == "raise":
        raise KeyboardInterrupt


@contextlib.contextmanager
def guarded(*, process_exit: bool = False) -> Iterator[None]:
    """Run a command under texir's SIGINT handler (main thread only; elsewhere nothing changes).

    `process_exit`: the process ends with this command. If its outputs are finished, SIGINT stays
    ignored afterwards instead of getting the previous handler back (which would raise
    KeyboardInterrupt, exit 130, in the interpreter's teardown)."""
    global _mode, _received, _count, _active
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    _mode, _received, _count, _active = "raise", False, 0, True
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN if process_exit and _outputs_finished() else previous)
        _mode, _active = "raise", False


def _outputs_finished() -> bool:
    return _mode == "ignore"


def interrupted() -> bool:
    """A SIGINT arrived (and the command has not finished its outputs)."""
    return _received and _mode != "ignore"


def checkpoint(label: str) -> None:
    """A place where the command may stop: raises KeyboardInterrupt if a SIGINT was swallowed
    somewhere since; runs the test hooks."""
    global _count
    _count += 1
    if _hook is not None:
        _hook(_count, label)
    at = os.environ.get(TEST_ENV, "")
    if at:
        number, _, how = at.partition(":")
        if (number.isdigit() and int(number) == _count) or number == label:
            if how == "swallow":  # as in a weakref callback: only a later check sees it
                with contextlib.suppress(KeyboardInterrupt):
                    signal.raise_signal(signal.SIGINT)
                return
            else:
                signal.raise_signal(signal.SIGINT)
    if _active and _received and _mode == "raise":
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGINT only remembered inside (outputs being renamed into place)."""
    global _mode
    previous = _mode
    if _mode == "raise":
        _mode = "defer"
    try:
        yield
    finally:
        if _mode == "defer":
            _mode = previous


def finished() -> None:
    """The command's outputs are all in place: from now on SIGINT is ignored."""
    global _mode
    _mode = "ignore"


def set_checkpoint_hook(hook: Callable[[int, str], None] | None) -> None:
    """Call `hook(n, label)` at each checkpoint (tests count them, or interrupt at one)."""
    global _hook
    _hook = hook
