"""Export a model without its weights: inside `weightless(module)` the module's parameters are fake
tensors (same shapes, strides, dtypes, devices and tying, no storage), so `torch.export` traces
without reading, copying or holding a second copy of them; `attach_weights` then gives the exported
program the real parameters back, by reference. The result is the program a plain export returns
(the graph records the same values: torch's export fakes every parameter anyway), at the memory cost
of the model alone. What a large model needs: torch's strict export otherwise peaks at about twice
its weights.

    with weightless(model) as weights:
        ep = torch.export.export(model, args, strict=True)
    ep = attach_weights(ep, weights)       # lower(ep, ...) as any exported program

Buffers and constants are traced for real (mutable state such as a KV cache is small and its
values may be read while tracing)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.export import ExportedProgram
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from texir.adapters.fx_export import rebuilt_exported
from texir.adapters.fx_signature import SignatureMismatchError, placeholder_renames
from texir.errors import ConversionError

__all__ = ["Weights", "attach_weights", "weightless"]


class Weights:
    """The parameters a `weightless` block took out of its module: each fake stand-in (by identity)
    and the real tensor it stands for."""

    __slots__ = ("_real",)

    def __init__(self) -> None:
        self._real: dict[int, tuple[torch.nn.Parameter, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self._real)

    def _add(self, fake: torch.nn.Parameter, real: torch.Tensor) -> None:
        self._real[id(fake)] = (fake, real)  # the stand-in is kept alive, so its id stays its own

    def real(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The real parameter `tensor` stands for, or None when it is not one of this block's."""
        entry = self._real.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None


@contextlib.contextmanager
def weightless(module: torch.nn.Module) -> Iterator[Weights]:
    """Within the block every parameter of `module` (and its submodules) is a fake tensor; tied
    parameters stay tied. The real ones are put back on exit, whatever happens inside. A parameter
    that is a tensor subclass (torchao's quantized weights) is a ConversionError: quantize after
    attaching, or export those with their weights."""
    mode = FakeTensorMode()
    weights = Weights()
    stand_ins: dict[int, torch.nn.Parameter] = {}
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
    try:
        for path, sub in module.named_modules(remove_duplicate=True):
            for name, param in list(sub._parameters.items()):
                if param is None:
                    continue
                where = f"{path}.{name}" if path else name
                if is_traceable_wrapper_subclass(param) or type(param.data) is not torch.Tensor:
                    raise ConversionError(
                        f"parameter {where!r} is a {type(param.data).__name__}, not a plain tensor: weightless "
                        "export fakes plain parameters only; export a model with tensor-subclass weights "
                        "(torchao quantization) with its weights"
                    )
                fake = stand_ins.get(id(param))
                if fake is None:
                    fake = torch.nn.Parameter(mode.from_tensor(param), requires_grad=param.requires_grad)
                    stand_ins[id(param)] = fake
                    weights._add(fake, param)
                sub._parameters[name] = fake
                swapped.append((sub, name, param))
        yield weights
    finally:
        for sub, name, param in reversed(swapped):
            sub._parameters[name] = param


def attach_weights(ep: ExportedProgram, weights: Weights) -> ExportedProgram:
    """`ep` (exported inside `weightless`) with the real parameters in its state dict, by reference:
    nothing is copied. `ep` itself is not modified (the new program shares its graph). A fake tensor
    `weights` does not know, or a real parameter whose shape, strides or dtype changed since the
    export, is a ConversionError naming the state-dict entry."""
    renamed = placeholder_renames(ep)
    if renamed:
        # torch's ExportedProgram (built below, sharing `ep`'s graph) refuses such a graph by name
        node, name = next(iter(renamed.items()))
        raise SignatureMismatchError(
            f"placeholder {node.name!r} is the graph signature's input {name!r}: FX renamed it (a "
            "copy.deepcopy of an ExportedProgram renames placeholders named like Python builtins or "
            "keywords); attach the weights to the program torch.export returned"
        )
    state: dict[str, torch.Tensor] = {}
    for name, tensor in ep.state_dict.items():
        real = weights.real(tensor)
        if real is None:
            if isinstance(tensor, FakeTensor):
                raise ConversionError(
                    f"state_dict entry {name!r} is a fake tensor these weights do not hold: attach the "
                    "Weights of the weightless block the program was exported in"
                )
            state[name] = tensor
            continue
        if (real.shape, real.stride(), real.dtype) != (tensor.shape, tensor.stride(), tensor.dtype):
            raise ConversionError(
                f"state_dict entry {name!r}: the real parameter is {real.dtype}{list(real.shape)} strides "
                f"{list(real.stride())}, it was exported as {tensor.dtype}{list(tensor.shape)} strides "
                f"{list(tensor.stride())}; export again after changing the model"
            )
        state[name] = real
    return rebuilt_exported(ep, state_dict=state)
