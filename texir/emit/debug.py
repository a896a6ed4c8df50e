"""Debug maps the emitter returns beside the `.pte` program (ExecuTorch's `debug_handle_map`,
`delegate_map` and instruction -> number of outputs), for profiling tools such as ETRecord."""

from __future__ import annotations

import msgspec

from texir.serialize.pte.schema import PteProgram


class DelegateDebug(msgspec.Struct, frozen=True, kw_only=True):
    """A delegate call's debug record: its backend and the backend's identifier -> debug handles
    map (ExecuTorch's `delegate_map` entry: {"name": backend_id, "delegate_map": ...})."""

    backend_id: str
    delegate_map: tuple[tuple[int | str, tuple[int, ...]], ...] = ()


class MethodDebug(msgspec.Struct, frozen=True, kw_only=True):
    """What the emitter knows about one method for profiling, keyed by instruction index in the
    method's (single) chain, as ExecuTorch's emitter reports it: the debug handle of the node each
    instruction runs (a delegate call: the handles of every node it implements, in graph order),
    the number of outputs of each delegate call, and each delegate call's `DelegateDebug`."""

    name: str
    handles: tuple[tuple[int, int | tuple[int, ...]], ...] = ()
    num_outputs: tuple[tuple[int, int], ...] = ()
    delegates: tuple[tuple[int, DelegateDebug], ...] = ()

    def debug_handle_map(self) -> dict[int, int | list[int]]:
        """ExecuTorch's `debug_handle_map[method]` shape."""
        return {i: h if isinstance(h, int) else list(h) for i, h in self.handles}

    def delegate_map(self) -> dict[int, dict[str, object]]:
        """ExecuTorch's `delegate_map[method]` shape."""
        return {
            i: {"name": d.backend_id, "delegate_map": {k: tuple(v) for k, v in d.delegate_map}}
            for i, d in self.delegates
        }


class Emitted(msgspec.Struct, frozen=True, kw_only=True):
    """`emit_with_debug`'s result: the program and, per method in plan order, its `MethodDebug`."""

    program: PteProgram
    debug: tuple[MethodDebug, ...] = ()

    def debug_handle_map(self) -> dict[str, dict[int, int | list[int]]]:
        """ExecuTorch's `ExecutorchProgramManager.debug_handle_map`."""
        return {m.name: m.debug_handle_map() for m in self.debug}

    def delegate_map(self) -> dict[str, dict[int, dict[str, object]]]:
        """ExecuTorch's `ExecutorchProgramManager.delegate_map`."""
        return {m.name: m.delegate_map() for m in self.debug}

    def instruction_id_to_num_outs_map(self) -> dict[str, dict[int, int]]:
        """ExecuTorch's emitter output of the same name."""
        return {m.name: dict(m.num_outputs) for m in self.debug}
