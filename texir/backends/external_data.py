"""Which named data a `.pte`'s method reads from outside the file (so a `.ptd` must give it)."""

from __future__ import annotations

from texir.backends.xnnpack.reader import XnnpackBlobError, decode_blob
from texir.serialize.pte import schema as s

__all__ = ["external_data_keys"]


def external_data_keys(program: s.PteProgram, method: str) -> list[str]:
    """Named data `method` reads that the `.pte` itself does not hold (so a `.ptd` must): its
    EXTERNAL tensors' names, and the weights its XNNPACK delegates name (the backend texir reads).
    Empty for a method the program does not have."""
    plan = next((p for p in program.program.execution_plan if p.name == method), None)
    if plan is None:
        return []
    inside = {b.key for b in program.named_data}
    keys: list[str] = []
    for ev in plan.values:
        t = ev.val
        info = t.extra_tensor_info if isinstance(t, s.Tensor) else None
        if info is not None and info.location == s.TensorDataLocation.EXTERNAL and info.fully_qualified_name:
            keys.append(info.fully_qualified_name)
    for d in plan.delegates:
        if d.id != "XnnpackBackend" or d.processed.location != s.DataLocation.INLINE:
            continue
        try:
            graph = decode_blob(program.program.backend_delegate_data[d.processed.index].data.tobytes())
        except (XnnpackBlobError, IndexError):
            continue  # a blob texir cannot read: the runtime says what is wrong with it
        keys.extend(c.named_key for c in graph.constant_data if c.named_key and c.named_key not in inside)
    return list(dict.fromkeys(keys))
