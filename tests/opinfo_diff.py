"""torch's operator database (OpInfo) as a differential corpus: each op with float32 CPU samples,
exported one sample at a time as a tiny module, decomposed by texir and by ExecuTorch's `to_edge`.

Used by tests/test_opinfo_differential.py (a seeded subset in `make test`, every op under
`make fuzz`), and runnable alone (`python -m tests.opinfo_diff`) to print the full-set numbers."""

from __future__ import annotations

import collections
import random
import warnings

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Case", "Outcome", "cases", "compare", "compare_exported", "differential", "exported", "run_outcomes", "summary"]


@dataclass(frozen=True)
class Case:
    """One OpInfo sample: `op` (name.variant), its index among the op's samples."""

    key: str
    opinfo: Any
    sample: Any


class _OneOp(torch.nn.Module):
    def __init__(self, fn: Any, spec: Any, consts: list[Any]) -> None:
        super().__init__()
        self.fn, self.spec, self.consts = fn, spec, consts

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        leaves = [next(it) if c is _TENSOR else c for c in self.consts]
        inp, args, kwargs = torch.utils._pytree.tree_unflatten(leaves, self.spec)
        return self.fn(inp, *args, **kwargs)


_TENSOR = object()


def cases(per_op: int = 1, *, sample: int | None = None, seed: int = 0) -> list[Case]:
    """The first `per_op` float32 CPU samples of every op of torch's OpInfo database (all of
    them, or a seeded `sample` of the ops)."""
    from torch.testing._internal.common_methods_invocations import op_db

    ops = [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")]
    if sample is not None:
        ops = random.Random(seed).sample(ops, min(sample, len(ops)))
    found = []
    for o in ops:
        key = f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name
        try:
            samples = o.sample_inputs("cpu", torch.float32, requires_grad=False)
            for i, s in zip(range(per_op), samples):
                found.append(Case(f"{key}#{i}", o, s))
        except Exception:  # noqa: BLE001 - an op whose sample generator fails on this build
            continue
    return found


def exported(case: Case) -> tuple[torch.export.ExportedProgram, tuple[torch.Tensor, ...]] | None:
    """The case as an ExportedProgram of a module taking its tensors, and those tensors; None when
    torch's export does not take it."""
    s = case.sample
    leaves, spec = torch.utils._pytree.tree_flatten((s.input, tuple(s.args), dict(s.kwargs)))
    tensors = tuple(x for x in leaves if isinstance(x, torch.Tensor))
    consts = [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves]
    module = _OneOp(case.opinfo.op, spec, consts)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, tensors)
    except Exception:  # noqa: BLE001 - export refuses many ops (data-dependent, non-tensor outputs)
        return None
    return ep, tensors


def multiset(gm_or_program: Any) -> collections.Counter[str]:
    """Operator names of a graph (torch.fx GraphModule or texir Program, top graph), as
    `aten::add.Tensor`; getitem and delegate calls left out."""
    from texir.ir.types import CallFunction, Program

    got: collections.Counter[str] = collections.Counter()
    if isinstance(gm_or_program, Program):
        for n in gm_or_program.graph.nodes:
            if isinstance(n, CallFunction) and "getitem" not in n.target:
                got[n.target] += 1
        return got
    for n in gm_or_program.graph.nodes:
        if n.op != "call_function":
            continue
        t = n.target
        schema = getattr(t, "_schema", None)
        if schema is None:
            continue
        got[f"{schema.name}.{schema.overload_name or 'default'}"] += 1
    return got


def _without_asserts(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `gm` after ExecuTorch's RemoveGraphAssertsPass (asserts erased, then the dead code
    they leave): texir removes them when it makes a program partitionable, ExecuTorch only in
    to_executorch, and neither .pte has them."""
    import copy

    from executorch.exir.passes.remove_graph_asserts_pass import RemoveGraphAssertsPass

    copied = copy.deepcopy(gm)
    RemoveGraphAssertsPass()(copied)
    return copied


@dataclass
class Outcome:
    """What both pipelines made of one case."""

    key: str
    status: str
    """"no-export", "both-refuse", "texir-refuses" (ExecuTorch converts), "texir-only" (ExecuTorch
    refuses), "texir-error", "compared"."""
    texir: dict[str, int] | None = None
    executorch: dict[str, int] | None = None
    transform_and_lower: dict[str, int] | None = None
    """ExecuTorch's `to_edge_transform_and_lower(ep)` (no partitioner), when its `to_edge` differs
    from texir: texir decomposes as that pipeline does (`run_decompositions({})` first, then the
    edge table), which in a few programs leaves other nodes than `to_edge`'s decomposition at once."""
    detail: str = ""
    texir_pte: bytes | None = None
    executorch_pte: bytes | None = None
    inputs: tuple[torch.Tensor, ...] = ()
    expected: list[torch.Tensor] | None = None

    @property
    def same_ops(self) -> bool:
        return self.texir == self.executorch


def compare(case: Case, *, allow_non_core: bool = False) -> Outcome:
    """`case` through texir's `lower(ep, [])` and ExecuTorch's `to_edge(ep)` (`compare_exported`)."""
    got = exported(case)
    if got is None:
        return Outcome(case.key, "no-export")
    return compare_exported(case.key, *got, allow_non_core=allow_non_core)


def compare_exported(key: str, ep: torch.export.ExportedProgram, tensors: tuple[torch.Tensor, ...], *,
                     allow_non_core: bool = False) -> Outcome:
    """`ep` through texir's `lower(ep, [])` and ExecuTorch's `to_edge(ep)`: op multisets of both
    edge programs and, where each emits, the .pte bytes (run them with `run_in_subprocess`)."""
    from executorch.exir import to_edge, to_edge_transform_and_lower

    from texir.adapters.core_aten import NonCoreOperatorError
    from texir.emit import emit
    from texir.errors import TexirError
    from texir.orchestrate import lower
    from texir.serialize import pte

    outcome = Outcome(key, "compared", inputs=tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            edge = to_edge(ep)
            outcome.executorch = dict(multiset(_without_asserts(edge.exported_program().graph_module)))
        except Exception as exc:  # noqa: BLE001 - to_edge refuses with many error types
            edge = None
            outcome.detail = f"executorch: {type(exc).__name__}"
        try:
            program = lower(ep, [], cache=None, allow_non_core=allow_non_core).program
            outcome.texir = dict(multiset(program))
        except NonCoreOperatorError as exc:
            program = None
            outcome.detail += f" texir: {exc}"[:300]
        except TexirError as exc:
            program = None
            outcome.detail += f" texir {type(exc).__name__}: {exc}"[:300]
        if edge is None:
            outcome.status = "both-refuse" if program is None else "texir-only"
        elif program is None:
            outcome.status = "texir-refuses"
        if edge is not None and program is not None and outcome.texir != outcome.executorch:
            try:
                staged = to_edge_transform_and_lower(ep).exported_program().graph_module
                outcome.transform_and_lower = dict(multiset(staged))
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                outcome.detail += f" executorch to_edge_transform_and_lower: {type(exc).__name__}"
        if edge is not None:
            try:
                outcome.executorch_pte = bytes(edge.to_executorch().buffer)
            except Exception as exc:  # noqa: BLE001 - ExecuTorch's emitter fails on some
                outcome.detail += f" executorch emit: {type(exc).__name__}"
        if program is not None:
            try:
                outcome.texir_pte = pte.dumps(emit(program))
            except TexirError as exc:
                outcome.detail += f" texir emit {type(exc).__name__}: {exc}"[:300]
        try:
            eager = ep.module()(*tensors)
            outcome.expected = [t for t in torch.utils._pytree.tree_leaves(eager) if isinstance(t, torch.Tensor)]
        except Exception:  # noqa: BLE001 - nothing to compare against
            outcome.expected = None
    return outcome


_RUNNER = r"""
import sys, torch, json
from executorch.runtime import Runtime
jobs = torch.load(sys.argv[1], weights_only=False)
rt = Runtime.get()
with open(sys.argv[2], "a") as log:
    for i, (data, inputs) in enumerate(jobs):
        if data is None:
            continue
        print(json.dumps({"i": i, "start": True}), file=log, flush=True)
        try:
            outs = rt.load_program(data).load_method("forward").execute(list(inputs))
            torch.save([o for o in outs if isinstance(o, torch.Tensor)], sys.argv[3] + f".{i}")
            print(json.dumps({"i": i, "ok": True}), file=log, flush=True)
        except Exception as exc:
            print(json.dumps({"i": i, "ok": False, "error": str(exc)[:200]}), file=log, flush=True)
"""


def run_in_subprocess(jobs: list[tuple[bytes | None, tuple[torch.Tensor, ...]]], workdir: str) -> list[Any]:
    """Run each (.pte bytes, inputs) job in ExecuTorch's runtime in a child process (a .pte can
    abort the process that loads it): per job its output tensors, an error string, "abort", or
    None for a job without bytes. A child that dies is restarted after the job it died on."""
    import json
    import os
    import subprocess
    import sys

    results: list[Any] = [None] * len(jobs)
    pending = [i for i, (data, _) in enumerate(jobs) if data is not None]
    round_ = 0
    while pending:
        round_ += 1
        spec, log, out = (os.path.join(workdir, f"{name}{round_}") for name in ("jobs", "log", "out"))
        torch.save([jobs[i] if i in set(pending) else (None, ()) for i in range(len(jobs))], spec)
        subprocess.run([sys.executable, "-c", _RUNNER, spec, log, out], env=dict(os.environ),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        started: int | None = None
        done: set[int] = set()
        if os.path.exists(log):
            for line in open(log):
                entry = json.loads(line)
                if entry.get("start"):
                    started = entry["i"]
                    continue
                done.add(entry["i"])
                results[entry["i"]] = torch.load(f"{out}.{entry['i']}", weights_only=False) if entry["ok"] else entry["error"]
        if started is not None and started not in done:
            results[started] = "abort"
            done.add(started)
        if not done:  # the child died before any job: nothing more can be learnt
            for i in pending:
                results[i] = "abort"
            break
        pending = [i for i in pending if i not in done]
    return results


def agrees(got: Any, expected: list[torch.Tensor] | None, tolerance: float = 1e-4) -> bool:
    if not isinstance(got, list) or expected is None or len(got) != len(expected):
        return False
    try:
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, equal_nan=True, check_dtype=False, atol=tolerance, rtol=tolerance)
    except AssertionError:
        return False
    return True


def differential(selected: list[Case], workdir: str, *, allow_non_core: bool = False) -> dict[str, Any]:
    """Every case compared and both .pte files run: a JSON-ready report (per case: status, ops
    that differ, what each runtime run gave)."""
    return run_outcomes([compare(c, allow_non_core=allow_non_core) for c in selected], workdir)


def run_outcomes(outcomes: list[Outcome], workdir: str, *, tolerance: float = 1e-4) -> dict[str, Any]:
    """Both .pte files of every outcome run (in a child process) and checked against eager within
    `tolerance` (absolute and relative): the JSON-ready report of `differential`."""
    jobs: list[tuple[bytes | None, tuple[torch.Tensor, ...]]] = []
    for o in outcomes:
        jobs += [(o.texir_pte, o.inputs), (o.executorch_pte, o.inputs)]
    runs = run_in_subprocess(jobs, workdir)
    report: dict[str, Any] = {}
    for i, o in enumerate(outcomes):
        tx, et = runs[2 * i], runs[2 * i + 1]

        def verdict(run: Any) -> str | None:
            if run is None:
                return None
            if run == "abort":
                return "abort"
            if isinstance(run, str):
                return "error"
            return "agrees" if agrees(run, o.expected, tolerance) else "differs"

        entry: dict[str, Any] = {"status": o.status, "texir_run": verdict(tx), "executorch_run": verdict(et)}
        if o.status == "compared" and not o.same_ops:
            a, b = collections.Counter(o.texir or {}), collections.Counter(o.executorch or {})
            entry["only_texir"], entry["only_executorch"] = dict(a - b), dict(b - a)
            entry["same_as_transform_and_lower"] = o.texir == o.transform_and_lower
        if o.detail:
            entry["detail"] = o.detail.strip()
        report[o.key] = entry
    return report


def summary(report: dict[str, Any]) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for entry in report.values():
        counts[entry["status"]] += 1
        if entry["status"] == "compared":
            counts["compared, same ops" if "only_texir" not in entry else "compared, ops differ"] += 1
        if entry["texir_run"] == "abort":
            counts["texir .pte aborts"] += 1
        if entry["executorch_run"] == "agrees" and entry["texir_run"] != "agrees":
            counts["ExecuTorch runs, texir does not"] += 1
        if entry["texir_run"] is not None:
            counts["texir .pte written"] += 1
    return dict(sorted(counts.items()))


def main() -> None:
    import argparse
    import json
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sample", type=int, default=None, help="a seeded sample of this many ops")
    parser.add_argument("--per-op", type=int, default=1)
    parser.add_argument("--allow-non-core", action="store_true")
    parser.add_argument("--out", default="opinfo_report.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        report = differential(cases(args.per_op, sample=args.sample), workdir, allow_non_core=args.allow_non_core)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    print(json.dumps(summary(report), indent=1))


if __name__ == "__main__":
    main()
