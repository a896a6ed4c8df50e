"""ExecuTorch's `ExecutorchBackendConfig` as texir's emit and `.pte` layout options, or a typed
error naming the option texir does not carry out."""

from __future__ import annotations

from typing import Any

from texir.emit import EmitOptions
from texir.errors import UnsupportedError
from texir.serialize.pte.codec import PteOptions

__all__ = ["UnsupportedOptionError", "emit_options"]


class UnsupportedOptionError(UnsupportedError, NotImplementedError):
    """An `ExecutorchBackendConfig` (or `EdgeCompileConfig`) option texir does not carry out.

    Also a `NotImplementedError`, the type ExecuTorch's callers catch for a missing feature."""


_IGNORED = ("dynamic_memory_planning_mode", "sym_shape_eval_pass", "to_out_var_pass", "propagate_device_config",
            "enable_non_cpu_memory_planning")
"""Options whose ExecuTorch default is what texir always does; any other value is refused below."""


def emit_options(config: Any) -> tuple[EmitOptions, PteOptions]:
    """`config` (ExecuTorch's `ExecutorchBackendConfig`, or None for its defaults) as texir's options.

    Each option whose value differs from ExecuTorch's default and that texir does not carry out
    raises `UnsupportedOptionError` naming it."""
    # executorch is this layer's dependency; imported here so importing texir.compat stays cheap
    from executorch.exir.capture._config import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    default = ExecutorchBackendConfig()
    config = default if config is None else config
    if not isinstance(config, ExecutorchBackendConfig):
        raise UnsupportedOptionError(
            f"config is a {type(config).__name__}; pass an executorch.exir.ExecutorchBackendConfig"
        )

    def refuse(field: str, why: str) -> UnsupportedOptionError:
        return UnsupportedOptionError(
            f"ExecutorchBackendConfig.{field}={getattr(config, field)!r}: {why}; leave it at its default "
            f"({getattr(default, field)!r}) or lower this program with executorch.exir (texir.compat.uninstall())"
        )

    if config.passes:
        raise refuse("passes", "texir runs no ExecuTorch graph passes before emission")
    if config.emit_stacktrace:
        raise refuse("emit_stacktrace", "texir does not write stack traces into the .pte")
    # do_quant_fusion_and_const_prop is carried out before emission (texir.compat.passes), not here
    for name in ("external_mutable_weights", "run_reinplace_pass"):
        if getattr(config, name) != getattr(default, name):
            raise refuse(name, "texir has no counterpart")
    for name in _IGNORED:
        if type(getattr(config, name)) is not type(getattr(default, name)) or (
            not hasattr(getattr(config, name), "__dict__") and getattr(config, name) != getattr(default, name)
        ):
            raise refuse(name, "texir does what the default does and nothing else")
    planning = config.memory_planning_pass
    if type(planning) is not MemoryPlanningPass:
        raise refuse("memory_planning_pass", "texir plans memory itself (MemoryPlanningPass's options only)")
    algo = getattr(planning.memory_planning_algo, "__class__", type(None)).__name__
    if algo != type(default.memory_planning_pass.memory_planning_algo).__name__:
        raise refuse("memory_planning_pass", f"memory planning algorithm {algo} is not texir's greedy planner")
    if callable(config.external_constants):
        raise refuse("external_constants", "a function of an fx node has no texir counterpart (True or False)")
    emit = EmitOptions(
        alignment=planning.alignment,
        alloc_graph_input=planning.alloc_graph_input,
        alloc_graph_output=planning.alloc_graph_output,
        share_mutable_buffers=bool(getattr(planning, "share_mutable_buffers", False)),
        external_constants=bool(config.external_constants),
        emit_mutable_buffer_names=config.emit_mutable_buffer_names,
        remove_view_copy=bool(config.remove_view_copy),
    )
    layout = PteOptions(
        segment_alignment=config.segment_alignment,
        extract_delegate_segments=config.extract_delegate_segments,
        **{k: v for k in ("constant_tensor_alignment", "delegate_alignment")
           if (v := getattr(config, k)) is not None},
    )
    return emit, layout
