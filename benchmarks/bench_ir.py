"""IR benchmark: FX -> IR, IR -> FX and snapshot encode/decode on a generated 100k-node program,
side by side with torch.export.save/load (measured on ~5k nodes, where it is still bearable).

    .venv/bin/python benchmarks/bench_ir.py           # 100k nodes, baseline at 5k
    .venv/bin/python benchmarks/bench_ir.py --quick   # 5k nodes, baseline at 1k, one repetition
    .venv/bin/python benchmarks/bench_ir.py --profile # also print cProfile hotspots per step
    .venv/bin/python benchmarks/bench_ir.py --cpu-time  # CPU time instead of wall clock (busy machine)

The big program is a residual chain of cheap elementwise ops on a 2x4 tensor. Exporting 100k nodes
with torch.export takes minutes, so a ~100-op block is exported once and its nodes are replicated
with torch.fx into one long graph, wrapped as an ExportedProgram. Each copy gets the provenance a
real model's repeated layer has: its own module path (``blocks.<k>``), its own torch_fn call names
and, with ``from_node`` dropped, one debug handle and ancestor per node (the worst case: decomposed
ops would share them); value metadata and stack traces repeat, as they do across real layers.
Each figure is the best of several repetitions (the machine is shared; the best is the least noisy).
"""

from __future__ import annotations

import argparse
import copy
import gc
import io
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, TypeVar

import msgspec
import torch
from torch import nn
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, OutputKind, OutputSpec, TensorArgument

from texir.adapters import from_exported_program, to_exported_program
from texir.ir import Output, Program
from texir.serialize.snapshot import ProgramSnapshot, dumps, loads

T = TypeVar("T")

GOALS = {
    "fx_to_ir": 100_000.0,
    "ir_to_fx": 30_000.0,
    "snapshot": 1_000_000.0,
    "vs_torch": 20.0,
    "import_ms": 150.0,
}


class _ChainBlock(nn.Module):
    """25 steps of 4 cheap ops each: mul by a parameter, relu, scaled residual add, sub."""

    def __init__(self, steps: int = 25) -> None:
        super().__init__()
        self.steps = steps
        self.w = nn.Parameter(torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            y = torch.relu(x * self.w)
            x = (x + y * 0.5) - 0.25
        return x


def _block_program() -> ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(_ChainBlock().eval(), (torch.randn(2, 4),)).run_decompositions()


def build_chain_program(target_nodes: int, block: ExportedProgram | None = None) -> ExportedProgram:
    """An ExportedProgram of about `target_nodes` nodes: the block's body repeated, each copy
    fed by the previous one's result."""
    block = block if block is not None else _block_program()
    nodes = list(block.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    body = [n for n in nodes if n.op == "call_function"]
    out_node = nodes[-1]
    (result,) = out_node.args[0]
    user_input = next(
        n for n, s in zip(placeholders, block.graph_signature.input_specs) if s.kind.name == "USER_INPUT"
    )
    repeats = max(1, round((target_nodes - len(placeholders) - 1) / len(body)))

    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for p in placeholders:
        env[p] = graph.node_copy(p)
    current = env[user_input]
    for k in range(repeats):
        env[user_input] = current
        for n in body:
            copy_ = env[n] = graph.node_copy(n, lambda a: env[a])
            copy_.meta.pop("from_node", None)
            copy_.meta["nn_module_stack"] = {
                "L__self__": ("", "bench_ir._Chain"),
                f"L__self___blocks_{k}": (f"blocks.{k}", "bench_ir._ChainBlock"),
            }
            fn = n.meta.get("torch_fn")
            if fn is not None:
                copy_.meta["torch_fn"] = (f"{fn[0]}_{k}", fn[1])
        current = env[result]
    env[user_input] = env[placeholders[placeholders.index(user_input)]]
    out = graph.output((current,))
    out.meta = copy.copy(out_node.meta)

    gm = torch.fx.GraphModule(nn.Module(), graph)
    signature = ExportGraphSignature(
        input_specs=list(block.graph_signature.input_specs),
        output_specs=[OutputSpec(kind=OutputKind.USER_OUTPUT, arg=TensorArgument(name=current.name), target=None)],
    )
    module_call_graph = copy.deepcopy(block.module_call_graph)
    for entry in module_call_graph:
        if entry.fqn == "" and entry.signature is not None:
            entry.signature.outputs = [TensorArgument(name=current.name)]
    return ExportedProgram(
        root=gm,
        graph=graph,
        graph_signature=signature,
        state_dict=dict(block.state_dict),
        range_constraints={},
        module_call_graph=module_call_graph,
        constants=dict(block.constants),
    )


# Wall-clock by default; `--cpu-time` switches to this process's CPU time, which a machine shared
# with other jobs inflates far less.
_clock: Callable[[], float] = time.perf_counter


def _best(fn: Callable[[], T], reps: int, budget_s: float = 20.0) -> tuple[float, T]:
    """Best time of up to `reps` runs; stops repeating once `budget_s` has been spent."""
    times: list[float] = []
    result: Any = None
    for _ in range(reps):
        gc.collect()
        t0 = _clock()
        result = fn()
        times.append(_clock() - t0)
        if sum(times) > budget_s:
            break
    return min(times), result


def _import_time_ms(reps: int) -> tuple[float, float]:
    """(median, best) milliseconds to `import texir.ir` in a fresh interpreter (startup excluded);
    also checks that the import does not pull in torch."""
    code = (
        "import sys, time; t = time.perf_counter(); import texir.ir; "
        "print(time.perf_counter() - t, 'torch' in sys.modules)"
    )
    samples = []
    for _ in range(reps):
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
        seconds, torch_loaded = out.stdout.split()
        if torch_loaded != "False":
            raise SystemExit("import texir.ir imported torch")
        samples.append(float(seconds) * 1000)
    return statistics.median(samples), min(samples)


def _profile(title: str, fn: Callable[[], object], top: int = 12) -> None:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    print(f"\n--- profile: {title} (by own time) ---")
    print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))


def _row(name: str, nodes: int, seconds: float, nbytes: int | None = None, goal: str = "") -> str:
    rate = nodes / seconds
    mb = f"{nbytes / seconds / 1e6:9.1f}" if nbytes is not None else f"{'':>9}"
    return f"{name:<34} {nodes:>8} {seconds * 1000:>10.1f} {rate:>13,.0f} {mb} {goal}"


def _without(program: Program, *, meta: bool) -> Program:
    """`program` with provenance dropped (and value metadata too when `meta`): what decoding
    costs without them shows where the decode time goes."""
    graph = msgspec.structs.replace(program.graph, provenance=None)
    if meta:
        nodes = tuple(n if isinstance(n, Output) else msgspec.structs.replace(n, meta_id=None) for n in graph.nodes)
        graph = msgspec.structs.replace(graph, nodes=nodes, metas=())
    return msgspec.structs.replace(program, graph=graph)


def _decode_costs(program: Program, reps: int) -> tuple[float, float, int, float]:
    """Where `loads` time goes (msgpack, no tensor data): (best msgspec decode alone, with the
    collector off and the previous result freed first so memory is reused; best young-generation
    collection right after it, which visits every new tuple once and untracks it; minor page faults
    of one `loads` into fresh memory; seconds per fresh page, from touching a 64 MiB mapping)."""
    import mmap
    import resource

    data = dumps(program, format="msgpack", include_stack_traces=True)
    decoder = msgspec.msgpack.Decoder(ProgramSnapshot)
    best_dec = best_gc = float("inf")
    for _ in range(reps):
        gc.collect()
        gc.disable()
        try:
            t0 = _clock()
            snap = decoder.decode(data)
            t1 = _clock()
            gc.collect(0)
            t2 = _clock()
        finally:
            gc.enable()
        best_dec, best_gc = min(best_dec, t1 - t0), min(best_gc, t2 - t1)
        del snap
    keep = loads(data)  # held, so the next decode cannot reuse its memory
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    again = loads(data)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    del keep, again
    size = 64 << 20
    area = mmap.mmap(-1, size)
    t0 = time.perf_counter()
    for offset in range(0, size, mmap.PAGESIZE):
        area[offset] = 1
    per_page = (time.perf_counter() - t0) / (size // mmap.PAGESIZE)
    area.close()
    return best_dec, best_gc, faults, per_page


def _goal(value: float, goal: float) -> str:
    return f"{value / goal:6.2f}x goal ({'met' if value >= goal else 'MISSED'})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition (smoke run)")
    parser.add_argument("--nodes", type=int, default=None, help="size of the big program (default 100000)")
    parser.add_argument("--baseline-nodes", type=int, default=None, help="size for torch.export.save/load (default 5000)")
    parser.add_argument("--profile", action="store_true", help="also print cProfile hotspots of each texir step")
    parser.add_argument("--cpu-time", action="store_true", help="time with process CPU time instead of wall clock")
    args = parser.parse_args(argv)
    global _clock
    _clock = time.process_time if args.cpu_time else time.perf_counter
    big_n = args.nodes or (5_000 if args.quick else 100_000)
    base_n = args.baseline_nodes or (1_000 if args.quick else 5_000)
    reps = 1 if args.quick else 3

    import_ms, import_best = _import_time_ms(3 if args.quick else 7)

    block = _block_program()
    t0 = time.perf_counter()
    big = build_chain_program(big_n, block)
    build_s = time.perf_counter() - t0
    n_big = len(big.graph.nodes)
    small = build_chain_program(base_n, block)
    n_small = len(small.graph.nodes)
    clock = "process CPU time" if args.cpu_time else "wall clock"
    print(f"clock: {clock}; torch {torch.__version__}; program of {n_big} nodes built in {build_s:.1f}s; baseline program {n_small} nodes")

    # texir on the big program
    t_fx_ir, program = _best(lambda: from_exported_program(big), reps)
    t_ir_fx, back = _best(lambda: to_exported_program(program), reps)
    assert len(back.graph.nodes) == n_big, "IR -> FX changed the node count"
    snaps: dict[str, tuple[float, float, int]] = {}
    for fmt in ("json", "msgpack"):
        t_enc, data = _best(lambda: dumps(program, format=fmt, include_data=True, include_stack_traces=True), reps)  # noqa: B023
        t_dec, restored = _best(lambda: loads(data), reps)  # noqa: B023
        assert restored == program
        snaps[fmt] = (t_enc, t_dec, len(data))
    del back, restored
    # Where decode time goes: the same program without provenance, then also without value metadata.
    breakdown: list[tuple[str, float, int]] = []
    for label, variant in (("no provenance", _without(program, meta=False)),
                           ("no provenance, no value metadata", _without(program, meta=True))):
        data = dumps(variant, format="msgpack", include_stack_traces=True)
        t_dec, _ = _best(lambda: loads(data), reps)  # noqa: B023
        breakdown.append((label, t_dec, len(data)))
    t_msgspec, t_young_gc, faults, per_page = _decode_costs(program, reps)

    # Baseline: torch.export.save/load vs texir on the same small program.
    def save() -> bytes:
        buf = io.BytesIO()
        torch.export.save(small, buf)
        return buf.getvalue()

    t_save, saved = _best(save, max(1, reps - 1))
    t_load, _ = _best(lambda: torch.export.load(io.BytesIO(saved)), max(1, reps - 1))
    small_ir: Program = from_exported_program(small)
    t_s_fx_ir, _ = _best(lambda: from_exported_program(small), reps)
    t_s_ir_fx, _ = _best(lambda: to_exported_program(small_ir), reps)
    small_snap: dict[str, tuple[float, float]] = {}
    for fmt in ("json", "msgpack"):
        t_enc, data = _best(lambda: dumps(small_ir, format=fmt, include_data=True, include_stack_traces=True), reps)  # noqa: B023
        t_dec, _ = _best(lambda: loads(data), reps)  # noqa: B023
        small_snap[fmt] = (t_enc, t_dec)

    print()
    print(f"{'step':<34} {'nodes':>8} {'ms':>10} {'nodes/s':>13} {'MB/s':>9} vs goal")
    print(_row("FX -> IR", n_big, t_fx_ir, goal=_goal(n_big / t_fx_ir, GOALS["fx_to_ir"])))
    print(_row("IR -> FX", n_big, t_ir_fx, goal=_goal(n_big / t_ir_fx, GOALS["ir_to_fx"])))
    for fmt, (t_enc, t_dec, size) in snaps.items():
        print(_row(f"snapshot encode {fmt} ({size / 1e6:.1f} MB)", n_big, t_enc, size,
                   _goal(n_big / t_enc, GOALS["snapshot"])))
        print(_row(f"snapshot decode {fmt}", n_big, t_dec, size, _goal(n_big / t_dec, GOALS["snapshot"])))
    for label, t_dec, size in breakdown:
        print(_row(f"  decode msgpack, {label}", n_big, t_dec, size))
    print(_row("  msgspec decode alone (GC off, memory reused)", n_big, t_msgspec))
    print(f"  + young-generation GC pass over the new objects: {t_young_gc * 1000:.1f} ms; "
          f"one loads into fresh memory: {faults} page faults x {per_page * 1e6:.2f} us = "
          f"{faults * per_page * 1000:.0f} ms")
    print(_row(f"torch.export.save ({len(saved) / 1e6:.1f} MB)", n_small, t_save, len(saved)))
    print(_row("torch.export.load", n_small, t_load, len(saved)))
    print(_row("FX -> IR (baseline program)", n_small, t_s_fx_ir))
    print(_row("IR -> FX (baseline program)", n_small, t_s_ir_fx))
    for fmt, (t_enc, t_dec) in small_snap.items():
        print(_row(f"snapshot encode {fmt} (baseline program)", n_small, t_enc))
        print(_row(f"snapshot decode {fmt} (baseline program)", n_small, t_dec))

    print()
    print(f"ratios vs torch.export.save/load on the same {n_small}-node program (goal >= {GOALS['vs_torch']:.0f}x):")
    for fmt, (t_enc, t_dec) in small_snap.items():
        print(f"  {fmt:<8} encode {t_save / t_enc:8.1f}x   decode {t_load / t_dec:8.1f}x   "
              f"(with FX<->IR: save {t_save / (t_s_fx_ir + t_enc):6.1f}x, load {t_load / (t_dec + t_s_ir_fx):6.1f}x)")
    save_rate, load_rate = n_small / t_save, n_small / t_load
    print(f"ratios of the {n_big}-node snapshot rates to torch's {n_small}-node rates:")
    for fmt, (t_enc, t_dec, _) in snaps.items():
        print(f"  {fmt:<8} encode {n_big / t_enc / save_rate:8.1f}x   decode {n_big / t_dec / load_rate:8.1f}x")
    if args.profile:
        _profile("FX -> IR", lambda: from_exported_program(big))
        _profile("IR -> FX", lambda: to_exported_program(program))
        msgpack_data = dumps(program, format="msgpack", include_data=True, include_stack_traces=True)
        _profile("snapshot encode msgpack", lambda: dumps(program, format="msgpack", include_data=True, include_stack_traces=True))
        _profile("snapshot decode msgpack", lambda: loads(msgpack_data))

    print()
    verdict = "met" if import_ms < GOALS["import_ms"] else "MISSED"
    print(f"import texir.ir in a fresh interpreter: median {import_ms:.1f} ms, best {import_best:.1f} ms "
          f"(goal < {GOALS['import_ms']:.0f} ms: {verdict}; torch not imported)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
