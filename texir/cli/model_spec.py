"""MODEL specs (``file.py:callable``, ``package.module:callable``, ``file.pt2``) to ExportedPrograms and Programs.

A MODEL spec names one of:

- ``path/to/file.py:NAME`` or ``package.module:NAME``: ``NAME`` (dotted attributes allowed) is an
  `ExportedProgram`, or a callable taking no arguments that returns one of

  * an `ExportedProgram`;
  * ``(module, example_inputs)`` or ``(module, example_inputs, dynamic_shapes)``, where
    ``example_inputs`` is the tuple of positional arguments and ``dynamic_shapes`` is passed to
    `torch.export.export` unchanged;
  * a dict with keys ``module`` and ``args`` and optionally ``kwargs``, ``dynamic_shapes`` and
    ``strict`` (default False), validated by `ExportRecipe`.

  The module is exported as it is (call ``.eval()`` in the callable if that is what you want).
- ``path/to/file.pt2``: a program written by `torch.export.save`.

`load_program` additionally accepts a snapshot file (``.json``, ``.msgpack``, ``.mpk``, ``.texir``).
Every mistake raises `ModelSpecError` with one line saying what to fix. torch is imported only when a
model (not a snapshot) is loaded.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import pydantic

from texir.errors import ModelSpecError
from texir.ir.types import LoweredBackendModule, Program
from texir.serialize import snapshot
from texir.serialize.bpte.codec import loads as loads_bpte
from texir.serialize.bpte.schema import BundledProgram
from texir.serialize.pte.codec import loads as loads_pte
from texir.serialize.pte.schema import PteProgram

if TYPE_CHECKING:
    from torch.export import ExportedProgram

__all__ = [
    "SNAPSHOT_SUFFIXES",
    "ExportRecipe",
    "check_model_path",
    "is_snapshot_path",
    "load_input",
    "load_model",
    "load_model_eager",
    "load_model_source",
    "load_program",
    "load_value",
    "split_spec",
]

SNAPSHOT_SUFFIXES: Final = (".json", ".msgpack", ".mpk", ".texir")

_FORMS: Final = (
    "(nn.Module, example_inputs), (nn.Module, example_inputs, dynamic_shapes), "
    "a dict with keys 'module' and 'args', or a torch.export.ExportedProgram"
)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0].strip() if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class ExportRecipe(pydantic.BaseModel):
    """What a MODEL callable may return as a dict: the arguments of `torch.export.export`."""

    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True, extra="forbid", frozen=True)

    module: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = pydantic.Field(default_factory=dict)
    dynamic_shapes: Any = None
    strict: bool = False

    @pydantic.field_validator("module")
    @classmethod
    def _is_module(cls, value: Any) -> Any:
        import torch  # the value is a module a MODEL built: torch is loaded already

        if not isinstance(value, torch.nn.Module):
            raise ValueError(f"expected a torch.nn.Module, got {type(value).__name__}")
        return value

    @pydantic.field_validator("args", mode="before")
    @classmethod
    def _is_tuple(cls, value: Any) -> Any:
        if isinstance(value, list):
            return tuple(value)
        if not isinstance(value, tuple):
            raise ValueError(
                f"example inputs must be a tuple of positional arguments, got {type(value).__name__} "
                "(write (x,) for a single input)"
            )
        return value


def split_spec(spec: str) -> tuple[str, str]:
    """``'a/b.py:build'`` -> ``('a/b.py', 'build')``; the last colon separates the attribute."""
    source, sep, attr = spec.rpartition(":")
    if not sep or not source or not attr:
        raise ModelSpecError(
            f"MODEL {spec!r} is not FILE.py:CALLABLE, PACKAGE.MODULE:CALLABLE or FILE.pt2 "
            "(example: texir.models:conv_relu_tan)"
        )
    return source, attr


@contextmanager
def _on_sys_path(directory: str) -> Iterator[None]:
    # Model files import their neighbours; packages given as MODULE:CALLABLE live in the cwd.
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)
    try:
        yield
    finally:
        if added:
            try:
                sys.path.remove(directory)
            except ValueError:
                pass


def _import_file(path: Path, spec: str) -> ModuleType:
    if not path.is_file():
        raise ModelSpecError(f"MODEL file {str(path)!r} does not exist (in {spec!r})")
    resolved = path.resolve()
    # Named by content, not location: the name shows up in module types (nn_module_stack), and
    # the same model file must give the same bytes wherever it lives.
    digest = hashlib.sha256(resolved.read_bytes()).hexdigest()[:16]
    name = f"_texir_model_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise ModelSpecError(f"cannot load {str(path)!r} as a Python file; MODEL files end in .py")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # so dataclasses, pickling and relative lookups see the module
    try:
        with _on_sys_path(str(resolved.parent)):
            module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # a model script calling sys.exit() is a user mistake too
        del sys.modules[name]
        raise ModelSpecError(f"running {str(path)!r} failed: {_one_line(exc)}") from exc
    return module


def _import_module(name: str) -> ModuleType:
    try:
        with _on_sys_path(os.getcwd()):
            return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise ModelSpecError(
                f"no module named {exc.name!r} (from MODEL {name!r}); give a FILE.py:CALLABLE path or "
                "an importable PACKAGE.MODULE"
            ) from exc
        raise ModelSpecError(f"importing {name!r} failed: {_one_line(exc)}") from exc
    except (Exception, SystemExit) as exc:
        raise ModelSpecError(f"importing {name!r} failed: {_one_line(exc)}") from exc


def _resolve_attr(module: ModuleType, attr: str, source: str) -> Any:
    value: Any = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
            hint = f" (it defines: {', '.join(public[:12])})" if public else ""
            raise ModelSpecError(f"{source!r} has no attribute {attr!r}{hint}") from None
    return value


def _export(recipe: ExportRecipe, where: str) -> ExportedProgram:
    import torch  # torch loads in ~2 s: only commands given a MODEL pay (texir show/diff of files never do)

    try:
        return torch.export.export(
            recipe.module,
            recipe.args,
            kwargs=recipe.kwargs or None,
            dynamic_shapes=recipe.dynamic_shapes,
            strict=recipe.strict,
        )
    except Exception as exc:
        raise ModelSpecError(f"torch.export.export failed for {where}: {_one_line(exc)}") from exc


def _recipe(value: Any, where: str) -> ExportRecipe:
    fields: dict[str, Any]
    if isinstance(value, dict):
        fields = value
    elif isinstance(value, tuple) and len(value) in (2, 3):
        fields = {"module": value[0], "args": value[1]}
        if len(value) == 3:
            fields["dynamic_shapes"] = value[2]
    else:
        got = f"a {len(value)}-tuple" if isinstance(value, tuple) else type(value).__name__
        raise ModelSpecError(f"{where} returned {got}; return {_FORMS}")
    try:
        return ExportRecipe.model_validate(fields)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']}" for err in exc.errors()
        )
        raise ModelSpecError(f"{where} returned an invalid model: {problems}") from None


def _load_pt2(path: Path) -> ExportedProgram:
    if not path.is_file():
        raise ModelSpecError(f"MODEL file {str(path)!r} does not exist")
    import torch  # torch loads in ~2 s: only commands given a MODEL pay (texir show/diff of files never do)

    # torch logs its own traceback (a warning) before raising on a bad archive: texir says it once.
    quiet = [logging.getLogger(name) for name in ("torch.export", "torch._export")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        return torch.export.load(str(path))
    except Exception as exc:
        raise ModelSpecError(
            f"cannot load {str(path)!r} with torch.export.load (is it a file written by "
            f"torch.export.save?): {_one_line(exc)}"
        ) from exc
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)


def load_model(spec: str) -> ExportedProgram:
    """The ExportedProgram a MODEL spec names (see the module docstring). Raises `ModelSpecError`."""
    return _load_model(spec)[0]


def load_model_eager(spec: str) -> tuple[ExportedProgram, Any, tuple[Any, ...], dict[str, Any]]:
    """The ExportedProgram a MODEL spec names, what runs it eagerly (the module it was exported
    from, or else the program's own `module()`) and its example args and kwargs."""
    ep, recipe = _load_model(spec)
    if recipe is not None:
        return ep, recipe.module, recipe.args, dict(recipe.kwargs)
    if ep.example_inputs is None:
        raise ModelSpecError(f"{spec} holds no example inputs; export it with example args (torch.export.export does)")
    args, kwargs = ep.example_inputs
    return ep, ep.module(), tuple(args), dict(kwargs)


def _load_model(spec: str) -> tuple[ExportedProgram, ExportRecipe | None]:
    source = load_model_source(spec)
    if isinstance(source, ExportRecipe):
        return _export(source, spec.strip()), source
    return source, None


def load_model_source(spec: str) -> ExportedProgram | ExportRecipe:
    """What a MODEL spec names before any export: an ExportedProgram (a `.pt2`, or a callable
    returning one) or the module and example inputs a callable returns (for `texir lower --recipe`,
    which quantizes the eager module). Raises `ModelSpecError`."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError("MODEL is empty; give FILE.py:CALLABLE, PACKAGE.MODULE:CALLABLE or FILE.pt2")
    spec = spec.strip()
    check_model_path(spec)
    # the adapters import torch, which loads in ~2 s: only commands given a MODEL pay
    from texir.adapters.torch_patches import make_torchvision_importable

    make_torchvision_importable()  # a model module (or transformers) may import torchvision
    if spec.endswith(".pt2"):
        return _load_pt2(Path(spec))
    if is_snapshot_path(spec):
        raise ModelSpecError(
            f"{spec!r} is a snapshot, not a model; commands that read snapshots accept it directly"
        )
    source, attr = split_spec(spec)
    if source.endswith(".py") or os.sep in source or "/" in source:
        module = _import_file(Path(source), spec)
    else:
        module = _import_module(source)
    target = _resolve_attr(module, attr, source)

    import torch  # torch loads in ~2 s: only commands given a MODEL pay (texir show/diff of files never do)

    if isinstance(target, torch.export.ExportedProgram):
        return target
    if not callable(target):
        raise ModelSpecError(
            f"{spec} is {_a(type(target).__name__)}, not a callable; point MODEL at a function returning {_FORMS}"
        )
    if isinstance(target, torch.nn.Module):
        raise ModelSpecError(
            f"{spec} is an nn.Module without example inputs; point MODEL at a function returning "
            "(module, example_inputs)"
        )
    try:
        value = target()
    except (Exception, SystemExit) as exc:
        raise ModelSpecError(f"calling {spec}() failed: {_one_line(exc)}") from exc
    if isinstance(value, torch.export.ExportedProgram):
        return value
    return _recipe(value, spec)


def check_model_path(spec: str) -> None:
    """Refuse a MODEL whose file or top-level package does not exist, before torch is imported
    (a typo is reported at once, not after the seconds torch takes to load). Raises `ModelSpecError`."""
    spec = spec.strip()
    if spec.endswith(".pt2") or is_snapshot_path(spec):
        if not Path(spec).is_file():
            raise ModelSpecError(f"MODEL file {spec!r} does not exist")
        return
    source, _ = split_spec(spec)
    if source.endswith(".py") or os.sep in source or "/" in source:
        if not Path(source).is_file():
            raise ModelSpecError(f"MODEL file {source!r} does not exist (in {spec!r})")
        return
    top = source.split(".")[0]
    if top in sys.modules:
        return
    with _on_sys_path(os.getcwd()):
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            found = None
    if found is None:
        raise ModelSpecError(
            f"no module named {top!r} (from MODEL {source!r}); give a FILE.py:CALLABLE path or "
            "an importable PACKAGE.MODULE"
        )


def is_snapshot_path(spec: str) -> bool:
    """True if `spec` names a snapshot file by its suffix."""
    return Path(spec).suffix.lower() in SNAPSHOT_SUFFIXES and ":" not in Path(spec).name


def load_value(
    spec: str, *, decompose: bool = False, allow_non_core: bool = False
) -> Program | LoweredBackendModule:
    """A snapshot file (Program or lowered module) or a MODEL spec converted to a Program
    (after `run_decompositions()` to core ATen when `decompose`; `allow_non_core`: keep ops outside
    core ATen instead of refusing them, see `from_exported_program`)."""
    if is_snapshot_path(spec):
        return snapshot.load(Path(spec))
    ep = load_model(spec)
    from texir.adapters import from_exported_program  # imports torch (~2 s): only a MODEL pays

    return from_exported_program(ep, decompose=decompose, allow_non_core=allow_non_core)


def load_input(
    spec: str, *, decompose: bool = False
) -> Program | LoweredBackendModule | PteProgram | BundledProgram:
    """What `texir show` and `texir diff` accept: a ``.pte`` or ``.bpte`` file (decoded, without
    torch), a snapshot file, or a MODEL spec converted to a Program."""
    suffix = Path(spec).suffix.lower()
    if suffix in (".pte", ".bpte"):
        try:
            data = Path(spec).read_bytes()
        except OSError as exc:
            raise ModelSpecError(f"cannot read {spec!r}: {exc.strerror or exc}") from None
        return loads_pte(data) if suffix == ".pte" else loads_bpte(data)
    return load_value(spec, decompose=decompose)


def load_program(spec: str, *, decompose: bool = False, allow_non_core: bool = False) -> Program:
    """Like `load_value`, but the result must be a Program."""
    value = load_value(spec, decompose=decompose, allow_non_core=allow_non_core)
    if isinstance(value, LoweredBackendModule):
        raise ModelSpecError(
            f"{spec!r} holds a lowered backend module, not a program; use its original program "
            "(texir show prints it)"
        )
    return value


def _a(noun: str) -> str:
    """'an int', 'a str': the article a type name takes."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
