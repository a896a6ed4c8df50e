"""to_backend on a residual MLP with one partition per add+mul pair: texir vs ExecuTorch 1.5.1.

Each block is ``h = relu(linear(x)); x = (x + h) * h``; every ``add``+``mul`` pair is one partition,
tagged by the same rule on both sides. Only the to_backend step is timed; export and conversion
(ExecuTorch ``to_edge``, texir ``from_exported_program``) are reported separately.

    .venv/bin/python benchmarks/bench_to_backend.py            # texir N=500..5000, ExecuTorch N=50, 200
    .venv/bin/python benchmarks/bench_to_backend.py --quick    # texir N=50..500, ExecuTorch N=20, 50
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

FEATURES = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.linear(x))
        return (x + h) * h


class ResidualMLP(nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.blocks(x)
        return out


def make_model(blocks: int) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return ResidualMLP(blocks).eval(), (torch.randn(2, FEATURES),)


def export(blocks: int) -> tuple[torch.export.ExportedProgram, float]:
    model, inputs = make_model(blocks)
    start = time.perf_counter()
    ep = torch.export.export(model, inputs, strict=False)
    return ep, time.perf_counter() - start


# --------------------------------------------------------------------------------------------------
# ExecuTorch side


def _executorch_partitioner() -> Any:
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
    from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult

    class TexirBenchTrivialBackend(BackendDetails):  # ExecuTorch finds backends by class name
        @staticmethod
        def preprocess(edge_program: Any, compile_specs: Any) -> Any:
            return PreprocessResult(processed_bytes=b"bench")

    class AddMulPairPartitioner(Partitioner):
        """Tags each add node and the mul that consumes it with one tag per pair."""

        def __init__(self) -> None:
            super().__init__()
            self.spec_ = DelegationSpec(TexirBenchTrivialBackend.__name__, [])

        def partition(self, exported_program: Any) -> Any:
            tags: dict[str, Any] = {}
            for node in exported_program.graph.nodes:
                if node.op == "call_function" and "aten.add.Tensor" in str(node.target):
                    (mul,) = [u for u in node.users if "aten.mul.Tensor" in str(u.target)]
                    tag = f"tag{len(tags)}"
                    node.meta["delegation_tag"] = tag
                    mul.meta["delegation_tag"] = tag
                    tags[tag] = self.spec_
            return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    return AddMulPairPartitioner()


def bench_executorch(blocks: int) -> dict[str, float]:
    from executorch.exir import EdgeCompileConfig, to_edge

    ep, export_s = export(blocks)
    start = time.perf_counter()
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    convert_s = time.perf_counter() - start
    partitioner = _executorch_partitioner()
    gc.collect()
    start = time.perf_counter()
    lowered = edge.to_backend(partitioner)
    to_backend_s = time.perf_counter() - start
    delegates = sum(
        1 for n in lowered.exported_program().graph.nodes if n.op == "get_attr" and "lowered" in n.name
    )
    if delegates != blocks:
        raise RuntimeError(f"ExecuTorch made {delegates} delegates for {blocks} blocks")
    nodes = len(edge.exported_program().graph.nodes)
    return {"export": export_s, "convert": convert_s, "to_backend": to_backend_s, "nodes": nodes}


# --------------------------------------------------------------------------------------------------
# texir side


TEXIR_BENCH_BACKEND = "texir-bench-trivial"


class _TrivialBackend:
    """The counterpart of the ExecuTorch bench backend: constant bytes, no work."""

    @staticmethod
    def preprocess(program: Any, compile_specs: Any) -> Any:
        from texir.lowering import PreprocessResult

        return PreprocessResult(processed_bytes=b"bench")


def _texir_groups(program: Any) -> dict[str, list[str]]:
    """Same rule as the ExecuTorch partitioner: each add and the mul consuming it, one tag per pair."""
    from texir.ir import CallFunction, Ref

    groups: dict[str, list[str]] = {}
    add_tag: dict[str, str] = {}
    for node in program.graph.nodes:
        if not isinstance(node, CallFunction):
            continue
        if node.target == "aten::add.Tensor":
            tag = f"tag{len(groups)}"
            groups[tag] = [node.name]
            add_tag[node.name] = tag
        elif node.target == "aten::mul.Tensor":
            for arg in node.args:
                if isinstance(arg, Ref) and arg.name in add_tag:
                    groups[add_tag.pop(arg.name)].append(node.name)
                    break
    return groups


def bench_texir(blocks: int, *, decompose: bool, capability: bool = False) -> dict[str, float]:
    """`capability=True` partitions with OpSupportPartitioner({add, mul}) inside the timed call
    (capability partitioning plus lowering) instead of the explicit per-block groups."""
    from texir.adapters import from_exported_program
    from texir.lowering import (
        NodeGroupPartitioner,
        OpSupportPartitioner,
        Partitioner,
        get_lowered_submodules,
        register_backend,
        to_backend,
    )

    register_backend(TEXIR_BENCH_BACKEND, _TrivialBackend(), replace=True)
    ep, export_s = export(blocks)
    start = time.perf_counter()
    program = from_exported_program(ep, decompose=decompose)
    convert_s = time.perf_counter() - start
    partitioner: Partitioner
    if capability:
        partitioner = OpSupportPartitioner(TEXIR_BENCH_BACKEND, {"aten::add.Tensor", "aten::mul.Tensor"})
    else:
        partitioner = NodeGroupPartitioner(TEXIR_BENCH_BACKEND, _texir_groups(program))
    gc.collect()
    start = time.perf_counter()
    lowered = to_backend(program, partitioner)
    to_backend_s = time.perf_counter() - start
    delegates = len(get_lowered_submodules(lowered))
    if delegates != blocks:
        raise RuntimeError(f"texir made {delegates} delegates for {blocks} blocks")
    return {"export": export_s, "convert": convert_s, "to_backend": to_backend_s, "nodes": len(program.graph.nodes)}


# --------------------------------------------------------------------------------------------------


def _row(side: str, blocks: int, r: dict[str, float]) -> str:
    per = r["to_backend"] / blocks * 1e6
    return (
        f"{side:<18} {blocks:>6} {int(r['nodes']):>7} {r['export']:>8.2f} {r['convert']:>8.2f} "
        f"{r['to_backend']:>11.4f} {per:>13.1f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    args = parser.parse_args(argv)
    texir_sizes = (50, 100, 200, 500) if args.quick else (500, 1000, 2000, 5000)
    et_sizes = (20, 50) if args.quick else (50, 200)
    ratio_at = et_sizes[-1]

    print("to_backend on a residual MLP, one partition per add+mul pair; seconds (us/partition last)")
    print("texir rows: IR from from_exported_program(ep) (aten::linear kept; run_decompositions is")
    print("torch's cost, not texir's); 'texir (core ATen)': from_exported_program(ep, decompose=True),")
    print("the same core-ATen graph ExecuTorch's to_edge lowers, used for the ratio. 'texir (OpSupport)':")
    print("OpSupportPartitioner({add, mul}) finds the same partitions by capability inside the timed call.")
    print(f"{'side':<18} {'N':>6} {'nodes':>7} {'export':>8} {'convert':>8} {'to_backend':>11} {'us/partition':>13}")
    texir_results: dict[int, dict[str, float]] = {}
    for n in texir_sizes:
        texir_results[n] = bench_texir(n, decompose=False)
        print(_row("texir", n, texir_results[n]), flush=True)
    capability: dict[int, dict[str, float]] = {}
    for n in texir_sizes:
        capability[n] = bench_texir(n, decompose=False, capability=True)
        print(_row("texir (OpSupport)", n, capability[n]), flush=True)
    core = bench_texir(ratio_at, decompose=True)
    print(_row("texir (core ATen)", ratio_at, core), flush=True)
    et_results: dict[int, dict[str, float]] = {}
    for n in et_sizes:
        et_results[n] = bench_executorch(n)
        print(_row("executorch", n, et_results[n]), flush=True)

    ratio = et_results[ratio_at]["to_backend"] / core["to_backend"]
    print(f"\nto_backend speed-up over ExecuTorch at N={ratio_at} (same core-ATen graph): {ratio:.0f}x "
          "(goal >= 200x)")
    largest = max(texir_sizes)
    print(f"texir to_backend at N={largest}: {texir_results[largest]['to_backend']:.3f} s (goal < 5 s)")
    per = [texir_results[n]["to_backend"] / n * 1e6 for n in texir_sizes]
    print(f"texir us/partition at N={', '.join(map(str, texir_sizes))}: {', '.join(f'{p:.1f}' for p in per)} "
          f"(max/min {max(per) / min(per):.2f}; ~1 means linear)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
