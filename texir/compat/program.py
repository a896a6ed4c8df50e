"""ExecuTorch's `to_edge`, `to_edge_transform_and_lower`, `EdgeProgramManager` and
`ExecutorchProgramManager`, with ExecuTorch's signatures, backed by texir's lowering and emission.

texir's typed objects (`texir.ir.Program` per method, the emitted `PteProgram`) are the source of
truth; what ExecuTorch's callers read as ExecuTorch's own types (the edge `ExportedProgram`, the
`schema.Program`) are views built from them on first use and kept (the same object on each call)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO, cast

import msgspec

from torch.export import ExportedProgram

from texir.adapters.constant_methods import constant_methods as build_constant_methods
from texir.backends import xnnpack
from texir.compat.config import UnsupportedOptionError, emit_options
from texir.compat.passes import edge_transform, quant_fusion_and_const_prop, transform_program
from texir.emit import emit
from texir.errors import ConversionError
from texir.executorch import (
    as_executorch_partitioner,
    import_executorch_program,
    require_executorch,
    to_edge_exported_program,
    to_executorch_exported_program,
)
from texir.ir import Program
from texir.lowering.api import call_partitioner
from texir.lowering.delegate import SharedModules, apply_plan
from texir.lowering.plan import Partitioner
from texir.lowering.report import Lowered
from texir.orchestrate import lower
from texir.serialize.pte.codec import dumps
from texir.serialize.pte.ptd import dump_ptd
from texir.serialize.pte.schema import PteProgram

__all__ = [
    "EdgeProgramManager",
    "ExecutorchProgramManager",
    "to_edge",
    "to_edge_transform_and_lower",
]

CALLS: list[int] = [0]
"""How many facade entry points have run in this process (the conformance plugin records, per
test, whether texir did any of the work)."""

Programs = ExportedProgram | Mapping[str, ExportedProgram]
PartitionerArg = Sequence[Any] | Mapping[str, Sequence[Any]] | None


def _methods(programs: Programs) -> dict[str, ExportedProgram]:
    if isinstance(programs, ExportedProgram):
        return {"forward": programs}
    if isinstance(programs, Mapping) and all(isinstance(p, ExportedProgram) for p in programs.values()):
        return dict(programs)
    raise TypeError(
        f"programs is a {type(programs).__name__}; pass a torch.export.ExportedProgram or a dict of them"
    )


def _check_compile_config(config: Any) -> bool:
    """Whether `config` (ExecuTorch's `EdgeCompileConfig`, or None) asks for `_skip_dim_order`
    (texir's `lower(skip_dim_order=True)`); the other options that change to_edge are refused by name."""
    if config is None:
        return False
    for name in ("preserve_ops", "_core_aten_ops_exception_list"):
        value = getattr(config, name, None)
        if value:
            raise UnsupportedOptionError(
                f"EdgeCompileConfig.{name}={value!r}: texir's to_edge runs ExecuTorch's default edge passes only; "
                "leave it at its default or lower this program with executorch.exir (texir.compat.uninstall())"
            )
    return bool(getattr(config, "_skip_dim_order", False))


def _is_default_xnnpack(partitioner: Any) -> bool:
    """ExecuTorch's `XnnpackPartitioner()` as built with no arguments: texir's native partitioner
    and backend give the same partitions and byte-equal delegates for it."""
    try:  # the XNNPACK backend is an optional part of the executorch wheel
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    except ImportError:
        return False
    if type(partitioner) is not XnnpackPartitioner:
        return False
    default = XnnpackPartitioner()

    def fingerprint(p: Any) -> tuple[Any, ...]:
        configs = tuple(
            (target, type(c).__name__, sorted((k, repr(v)) for k, v in vars(c).items()))
            for target, c in sorted(p.target_partitioner_configs.items())
        )
        return (p.per_op_mode, repr(p.delegation_spec), configs)

    return fingerprint(partitioner) == fingerprint(default)


class _Choice:
    """The texir partitioners for ExecuTorch's, and whether the native XNNPACK backend is used."""

    def __init__(self, partitioners: Sequence[Any]) -> None:
        xnn = [p for p in partitioners if type(p).__name__ == "XnnpackPartitioner"]
        # Native only when every XNNPACK partitioner of the call is a default one: the native
        # backend takes ExecuTorch's id `XnnpackBackend` for the lowering.
        self.native = bool(xnn) and all(_is_default_xnnpack(p) for p in xnn)
        self.partitioners: tuple[Partitioner, ...] = tuple(self._one(p) for p in partitioners)

    def _one(self, partitioner: Any) -> Partitioner:
        if self.native and _is_default_xnnpack(partitioner):
            return xnnpack.partitioner()
        bridged = as_executorch_partitioner(partitioner)
        if bridged is not None:
            return bridged
        if callable(partitioner):
            return cast(Partitioner, partitioner)  # a texir partitioner
        raise TypeError(
            f"partitioner {partitioner!r} is neither an ExecuTorch Partitioner nor a texir partitioner"
        )

    @contextlib.contextmanager
    def backends(self) -> Iterator[None]:
        if self.native:
            with xnnpack.registered():
                yield
        else:
            yield


def _per_method(partitioner: PartitionerArg, methods: Sequence[str]) -> dict[str, list[Any]]:
    if partitioner is None:
        return {m: [] for m in methods}
    if isinstance(partitioner, Mapping):
        unknown = sorted(set(partitioner) - set(methods))
        if unknown:
            raise ValueError(f"partitioner given for methods {unknown} that the program does not have: {sorted(methods)}")
        return {m: list(partitioner.get(m, ())) for m in methods}
    return {m: list(partitioner) for m in methods}


def to_edge(
    programs: Programs,
    constant_methods: dict[str, Any] | None = None,
    compile_config: Any = None,
    generate_etrecord: bool = False,
) -> EdgeProgramManager:
    """ExecuTorch's `to_edge` on texir: each program decomposed to core ATen and through the edge
    rewrites (no partitioner)."""
    CALLS[0] += 1
    skip_dim_order = _check_compile_config(compile_config)
    _refuse_etrecord(generate_etrecord)
    methods = _methods(programs)
    lowered = lower(methods, {m: [] for m in methods}, skip_dim_order=skip_dim_order)
    return EdgeProgramManager({m: r.program for m, r in lowered.items()}, constant_methods, lowered)


def to_edge_transform_and_lower(
    programs: Programs,
    transform_passes: Any = None,
    partitioner: PartitionerArg = None,
    constant_methods: dict[str, Any] | None = None,
    compile_config: Any = None,
    generate_etrecord: bool = False,
) -> EdgeProgramManager:
    """ExecuTorch's `to_edge_transform_and_lower` on texir (`texir.lower`): decomposition keeps the
    ops the partitioners ask to keep, then each partitioner in turn. A default `XnnpackPartitioner()`
    runs as texir's native XNNPACK partitioner and backend; every other ExecuTorch partitioner and
    backend through texir's bridge."""
    CALLS[0] += 1
    skip_dim_order = _check_compile_config(compile_config)
    _refuse_etrecord(generate_etrecord)
    methods = _methods(programs)
    per_method = _per_method(partitioner, list(methods))
    choice = _Choice([p for ps in per_method.values() for p in ps])
    parts = {m: [choice._one(p) for p in ps] for m, ps in per_method.items()}
    with choice.backends():
        lowered = lower(methods, parts, transform=edge_transform(transform_passes), skip_dim_order=skip_dim_order)
    return EdgeProgramManager({m: r.program for m, r in lowered.items()}, constant_methods, lowered,
                              native_xnnpack=choice.native)


def _refuse_etrecord(generate_etrecord: bool) -> None:
    if generate_etrecord:
        raise UnsupportedOptionError(
            "generate_etrecord=True: texir.compat does not build ExecuTorch's ETRecord object; write one with "
            "texir.executorch.write_etrecord, or lower this program with executorch.exir (texir.compat.uninstall())"
        )


class _Methods:
    """The methods both managers hold: texir Programs by name, the constant methods, and the
    edge ExportedProgram view of each method, built on first use and kept.

    `_edge_programs` is the dict of views ExecuTorch's managers keep under that name; a caller
    that puts another ExportedProgram in it (ExecuTorch's own tests put `to_backend`'s result
    there) changes the method: texir imports that program (`import_executorch_program`) and
    carries on from it."""

    def __init__(self, programs: Mapping[str, Program], constant_methods: Mapping[str, Any] | None) -> None:
        self._own = dict(programs)
        self._constant_methods = dict(constant_methods or {})
        self._views: dict[str, ExportedProgram] = {}
        self._built: dict[str, ExportedProgram] = {}
        """The view texir built of each method (a view in `_views` that is not this one is the caller's)."""
        self._imported: dict[str, tuple[ExportedProgram, Program]] = {}
        self._store: Any = None

    @property
    def _programs(self) -> dict[str, Program]:
        """Each method's Program: texir's own, or the import of the program a caller put in `_edge_programs`."""
        programs = {m: p for m, p in self._own.items() if m in self._views or m not in self._built}
        for method, view in self._views.items():
            if view is self._built.get(method):
                continue
            seen = self._imported.get(method)
            if seen is None or seen[0] is not view:
                seen = self._imported[method] = (view, _import_view(method, view))
            programs[method] = seen[1]
        return programs

    @property
    def methods(self) -> set[str]:
        return set(self._programs)

    @property
    def config_methods(self) -> set[str]:
        return set(self._constant_methods)

    def program(self, method_name: str = "forward") -> Program:
        """texir's own Program of `method_name` (the source of truth behind every view)."""
        return self._programs[method_name]

    def exported_program(self, method_name: str = "forward") -> ExportedProgram:
        """The method as ExecuTorch's edge-dialect ExportedProgram (built once, then the same object),
        its delegate calls ExecuTorch's `executorch_call_delegate` on ExecuTorch `LoweredBackendModule`s."""
        view = self._views.get(method_name)
        if view is None:
            view = self._built[method_name] = self._view_of(self._own[method_name])
            self._views[method_name] = view
        return view

    def _view_of(self, program: Program) -> ExportedProgram:
        return to_edge_exported_program(program)

    @property
    def _edge_programs(self) -> dict[str, ExportedProgram]:
        """ExecuTorch's manager's dict of edge programs by method: every method's view (the same
        dict on each call; what a caller puts in it is the method from then on)."""
        for method in self._own:
            if method not in self._built:
                self.exported_program(method)
        return self._views

    @property
    def _named_data_store(self) -> Any:
        """ExecuTorch's `NamedDataStore` holding every delegate's named data, collected from the
        views as ExecuTorch's manager collects it (the same object on each call)."""
        if self._store is None:
            # executorch is this layer's dependency; its program module is a heavy import
            from executorch.exir._serialize._named_data_store import NamedDataStore
            from executorch.exir.program._program import collect_named_data_store_from_exported_program

            store = NamedDataStore()
            for view in self._edge_programs.values():
                collect_named_data_store_from_exported_program(view, store)
            self._store = store
        return self._store


def _import_view(method: str, view: Any) -> Program:
    if not isinstance(view, ExportedProgram):
        raise ConversionError(
            f"_edge_programs[{method!r}] is a {type(view).__name__}; put a torch.export.ExportedProgram there"
        )
    return import_executorch_program(view)


class EdgeProgramManager(_Methods):
    """ExecuTorch's `EdgeProgramManager`: one edge-form texir Program per method."""

    def __init__(
        self,
        programs: Mapping[str, Program],
        constant_methods: Mapping[str, Any] | None = None,
        lowered: Mapping[str, Lowered] | None = None,
        *,
        native_xnnpack: bool = False,
    ) -> None:
        super().__init__(programs, constant_methods)
        self._lowered = dict(lowered or {})
        self.native_xnnpack = native_xnnpack
        """Whether texir's native XNNPACK backend compiled this program's XNNPACK partitions."""

    @property
    def lowered(self) -> Mapping[str, Lowered]:
        """Each method's `texir.lowering.report.Lowered` (its report says what was delegated)."""
        return self._lowered

    def transform(self, passes: Any, compile_config: Any = None) -> EdgeProgramManager:
        """Each method (or each method `passes` maps) after ExecuTorch's passes, run on its edge
        ExportedProgram and imported back (`texir.compat.passes`); a new manager, as ExecuTorch's."""
        CALLS[0] += 1
        _check_compile_config(compile_config)  # only ExecuTorch's verifier reads it here: nothing to do
        programs = {m: transform_program(m, p, passes) for m, p in self._programs.items()}
        return EdgeProgramManager(programs, self._constant_methods, self._lowered,
                                  native_xnnpack=self.native_xnnpack)

    def to_backend(self, partitioner: Any) -> EdgeProgramManager:
        """Each method (or each method `partitioner` maps) through the partitioner."""
        CALLS[0] += 1
        per_method = (
            {m: [p] for m, p in partitioner.items()} if isinstance(partitioner, Mapping)
            else {m: [partitioner] for m in self._programs}
        )
        _per_method(per_method, list(self._programs))
        choice = _Choice([p for ps in per_method.values() for p in ps])
        programs = dict(self._programs)
        # The programs are in the to_edge form already: each partitioner's plan applied as
        # ExecuTorch's multi-method to_backend applies it (no decomposition, no edge rewrites).
        shared: SharedModules = {}  # identical delegates of different methods: one module, as ExecuTorch
        with choice.backends():
            for m, (one,) in per_method.items():
                plan = call_partitioner(choice._one(one), programs[m])
                programs[m] = apply_plan(programs[m], plan, order="executorch", numbering="fused", shared=shared).program
        return EdgeProgramManager(programs, self._constant_methods, self._lowered,
                                  native_xnnpack=self.native_xnnpack or choice.native)

    def to_executorch(self, config: Any = None) -> ExecutorchProgramManager:
        """Every method emitted as one `.pte` (texir's emitter), laid out as `config` asks."""
        CALLS[0] += 1
        options, layout = emit_options(config)
        programs = self._programs
        if getattr(config, "do_quant_fusion_and_const_prop", False):
            programs = {m: quant_fusion_and_const_prop(m, p) for m, p in programs.items()}
        getters = build_constant_methods(self._constant_methods) if self._constant_methods else None
        pte = emit(programs, options, constant_methods=getters)
        return ExecutorchProgramManager(pte, dumps(pte, layout), programs, self._constant_methods)


class EmitterOutputView(msgspec.Struct, frozen=True, kw_only=True):
    """The part of ExecuTorch's `EmitterOutput` its tests read: the program, as ExecuTorch's schema."""

    program: Any


class ExecutorchProgramManager(_Methods):
    """ExecuTorch's `ExecutorchProgramManager`: the emitted `.pte` (texir's `PteProgram` and bytes)."""

    def __init__(
        self, pte: PteProgram, data: bytes, programs: Mapping[str, Program], constant_methods: Mapping[str, Any]
    ) -> None:
        self.pte = pte
        """texir's emitted program (the source of truth)."""
        super().__init__(programs, constant_methods)
        self._buffer = data
        self._schema: Any = None

    def _view_of(self, program: Program) -> ExportedProgram:
        """After to_executorch, as ExecuTorch's manager shows it: the to_executorch rewrites applied."""
        return to_executorch_exported_program(program)

    @property
    def buffer(self) -> bytes:
        return self._buffer

    @property
    def executorch_program(self) -> Any:
        """ExecuTorch's `executorch.exir.schema.Program`, decoded from texir's bytes by ExecuTorch's own
        deserializer (a cross-check of the bytes as much as a view)."""
        if self._schema is None:
            require_executorch("texir.compat ExecutorchProgramManager.executorch_program")
            # executorch is this layer's dependency; its serializer loads flatc bindings on import
            from executorch.exir._serialize._program import deserialize_pte_binary

            self._schema = deserialize_pte_binary(self._buffer).program
        return self._schema

    @property
    def _emitter_output(self) -> EmitterOutputView:
        """What ExecuTorch's manager keeps of its emitter and its own tests read (`.program`)."""
        return EmitterOutputView(program=self.executorch_program)

    def write_to_file(self, open_file: BinaryIO) -> None:
        open_file.write(self._buffer)

    def write_tensor_data_to_file(self, outdir: str | os.PathLike[str]) -> None:
        """Each external-data file (`.ptd`) into `outdir`, named `<tag>.ptd` as ExecuTorch names it;
        none for a program without external data (ExecuTorch's writes none either, and
        optimum-executorch calls this after every export)."""
        for ptd in self.pte.external:
            name = ptd.tag if ptd.tag.endswith(".ptd") else f"{ptd.tag}.ptd"
            dump_ptd(ptd, os.path.join(os.fspath(outdir), name))
