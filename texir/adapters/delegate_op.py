"""The torch side of texir delegate calls: a HigherOrderOperator that runs a lowered module's
original program eagerly (as ExecuTorch's executorch_call_delegate does), and the module wrapper
it is called on."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch._guards import detect_fake_mode
from torch._higher_order_ops.utils import autograd_not_implemented
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import graph_signature as gs
from torch.fx.experimental.proxy_tensor import (
    ProxyTorchDispatchMode,
    disable_proxy_modes_tracing,
    get_proxy_slot,
    track_tensor_tree,
)
from torch.utils import _pytree as pytree

from texir.errors import ConversionError
from texir.ir import types as ir

if TYPE_CHECKING:
    from torch.export import ExportedProgram

__all__ = ["LoweredBackendModule", "TexirCallDelegate", "texir_call_delegate"]


class LoweredBackendModule(torch.nn.Module):
    """A texir lowered module as a torch module. The class name and the fields `backend_id`,
    `processed_bytes`, `compile_specs` and `original_module` are what torch's export verifier
    accepts as a lowered module behind a get_attr node."""

    def __init__(
        self, lowered: ir.LoweredBackendModule, rebuild: Callable[[ir.Program], ExportedProgram]
    ) -> None:
        super().__init__()
        # IR -> FX is passed in (by texir.adapters.fx_export), so this module does not import it.
        self._rebuild = rebuild
        self.texir_module = lowered
        self.backend_id: str = lowered.backend_id
        self.processed_bytes: bytes = lowered.processed_bytes
        self.compile_specs: list[ir.CompileSpec] = list(lowered.compile_specs)
        self._original: ExportedProgram | None = None

    @property
    def original_module(self) -> ExportedProgram:
        """The delegated sub-program as an ExportedProgram (built on first use)."""
        if self._original is None:
            self._original = self._rebuild(self.texir_module.original_program)
        return self._original

    def run(self, *args: Any) -> tuple[Any, ...]:
        """Run the original program on the delegate call's inputs; returns its user outputs."""
        ep = self.original_module
        fake_mode = detect_fake_mode(args)
        state: dict[str, Any] = {**ep.state_dict, **ep.constants}

        def lifted(target: str | None) -> Any:
            value = state[cast(str, target)]
            return fake_mode.from_tensor(value) if fake_mode is not None else value

        user = iter(args)
        flat: list[Any] = []
        n_user = 0
        for spec in ep.graph_signature.input_specs:
            if spec.kind is gs.InputKind.USER_INPUT:
                n_user += 1
                flat.append(next(user, None))
            else:
                flat.append(lifted(spec.target))
        if n_user != len(args):
            raise ConversionError(
                f"delegate call to backend {self.backend_id!r} got {len(args)} inputs, but its "
                f"original program takes {n_user} user inputs"
            )
        results = ep.graph_module(*flat)
        outputs: list[Any] = []
        for spec, value in zip(ep.graph_signature.output_specs, results):
            if spec.kind is gs.OutputKind.USER_OUTPUT:
                outputs.append(value)
            elif spec.kind is gs.OutputKind.BUFFER_MUTATION and fake_mode is None:
                state[cast(str, spec.target)].copy_(value)
        return tuple(outputs)


class TexirCallDelegate(HigherOrderOperator):
    """``texir_call_delegate(lowered_module, *inputs) -> tuple of outputs``."""

    def __init__(self) -> None:
        super().__init__("texir_call_delegate")  # type: ignore[no-untyped-call]  # unannotated in torch

    def __call__(self, lowered_module: LoweredBackendModule, *args: Any) -> Any:
        return super().__call__(lowered_module, *args)  # type: ignore[no-untyped-call]  # unannotated in torch


texir_call_delegate = TexirCallDelegate()
for _key in (
    torch._C.DispatchKey.PythonDispatcher,
    torch._C.DispatchKey.PythonTLSSnapshot,
    torch._C.DispatchKey.ADInplaceOrView,
    torch._C.DispatchKey.AutocastCPU,
):
    texir_call_delegate.fallthrough(_key)  # type: ignore[no-untyped-call]  # unannotated in torch


def _check_module(module: Any) -> LoweredBackendModule:
    if not isinstance(module, LoweredBackendModule):
        raise ConversionError(
            f"texir_call_delegate's first argument must be a texir LoweredBackendModule, got "
            f"{type(module).__name__}"
        )
    return module


@texir_call_delegate.py_impl(torch._C.DispatchKey.CompositeExplicitAutograd)
def _dense(lowered_module: Any, *args: Any) -> tuple[Any, ...]:
    return _check_module(lowered_module).run(*args)


texir_call_delegate.py_impl(torch._C.DispatchKey.Autograd)(
    autograd_not_implemented(texir_call_delegate, deferred_error=True)
)


@texir_call_delegate.py_impl(FakeTensorMode)
def _fake(mode: FakeTensorMode, lowered_module: Any, *args: Any) -> tuple[Any, ...]:
    with mode:
        return _check_module(lowered_module).run(*args)


def _lowered_module_name(root: torch.nn.Module, module: LoweredBackendModule) -> str:
    for name, child in root.named_children():
        if child is module:
            return name
    i = 0
    while hasattr(root, f"lowered_module_{i}"):
        i += 1
    name = f"lowered_module_{i}"
    root.add_module(name, module)
    return name


@texir_call_delegate.py_impl(ProxyTorchDispatchMode)
def _trace(mode: ProxyTorchDispatchMode, lowered_module: Any, *args: Any) -> Any:
    module = _check_module(lowered_module)
    with disable_proxy_modes_tracing():
        out = module.run(*args)
    _lowered_module_name(cast(Any, mode.tracer).root, module)

    def unwrap(e: Any) -> Any:
        if not isinstance(e, (torch.Tensor, torch.SymInt, torch.SymFloat)):
            return e
        return get_proxy_slot(e, mode.tracer, e, lambda x: x.proxy)

    proxy_args = pytree.tree_map(unwrap, (module, *args))
    out_proxy = mode.tracer.create_proxy(
        "call_function", texir_call_delegate, proxy_args, {}, name="texir_call_delegate"
    )
    return track_tensor_tree(out, out_proxy, constant=None, tracer=mode.tracer)


@texir_call_delegate.py_functionalize_impl
def _functionalize(ctx: Any, lowered_module: Any, *args: Any) -> Any:
    unwrapped = tuple(ctx.unwrap_tensors(a) for a in args)
    with ctx.redispatch_to_next():
        return ctx.wrap_tensors(texir_call_delegate(lowered_module, *unwrapped))
