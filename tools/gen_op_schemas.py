"""Write texir/ir/op_schemas.json, the operator schemas texir reads instead of asking torch.

Run with the torch texir is pinned to: `PYTHONPATH=. python tools/gen_op_schemas.py`. The table holds
torch's registry for the namespaces texir emits (aten, quantized_decomposed, the latter with the
ops and out variants ExecuTorch 1.5.1 registers, so the generator needs the test extra) plus ExecuTorch's
dim-order and prim ops texir spells out (`EXTRA_SCHEMAS`: torch knows them only once executorch is
imported, and texir's table must not depend on that). tests/test_op_schemas.py checks the file
against the running torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

NAMESPACES = ("aten", "quantized_decomposed")

EXTRA_SCHEMAS: tuple[str, ...] = (
    "dim_order_ops::_to_dim_order_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, "
    "Device? device=None, bool? pin_memory=None, bool non_blocking=False, int[]? dim_order=None) -> Tensor",
    "dim_order_ops::_to_dim_order_copy.out(Tensor self, *, bool non_blocking=False, "
    "int[]? dim_order=None, Tensor(a!) out) -> Tensor(a!)",
    "dim_order_ops::_empty_dim_order(int[] size, *, ScalarType? dtype=None, Layout? layout=None, "
    "Device? device=None, bool? pin_memory=None, int[]? dim_order=None) -> Tensor",
    "dim_order_ops::_empty_dim_order.out(int[] size, *, int[]? dim_order=None, Tensor(a!) out) -> Tensor(a!)",
    "dim_order_ops::_clone_dim_order(Tensor self, *, bool non_blocking=False, int[]? dim_order=None) -> Tensor",
    "dim_order_ops::_clone_dim_order.out(Tensor self, *, bool non_blocking=False, int[]? dim_order=None, "
    "Tensor(a!) out) -> Tensor(a!)",
    "executorch_prim::et_view(Tensor self, int[] size) -> Tensor",
)


def torch_schemas() -> tuple[str, list[str]]:
    """(torch version, the table's schema strings as the running torch prints them, sorted)."""
    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    # ExecuTorch's libraries add to that namespace: the out variants its runtime has kernels for
    # (executorch.kernels.quantized) and the ops of its quantized fusion patterns. Loaded here, so
    # the table is the same whatever the process imported before.
    import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401
    import executorch.kernels.quantized  # noqa: F401

    texts = {
        str(s) for s in torch._C._jit_get_all_schemas() if s.name.split("::", 1)[0] in NAMESPACES
    }
    texts.update(str(torch._C.parse_schema(s)) for s in EXTRA_SCHEMAS)
    return torch.__version__, sorted(texts)


def render(version: str, schemas: list[str]) -> bytes:
    """The file's bytes: JSON with one schema string per line, so diffs read as added/removed ops."""
    import json

    lines = ",\n".join(f"  {json.dumps(s)}" for s in schemas)
    return f'{{"torch": {json.dumps(version)}, "schemas": [\n{lines}\n]}}\n'.encode()


def main() -> int:
    version, schemas = torch_schemas()
    path = Path(__file__).resolve().parent.parent / "texir" / "ir" / "op_schemas.json"
    path.write_bytes(render(version, schemas))
    print(f"{path}: {len(schemas)} schemas from torch {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
