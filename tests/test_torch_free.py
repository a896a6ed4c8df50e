"""Below the adapters texir runs without torch: importing texir.ir, serialize, lowering, edge, emit
and backends (every submodule) in a fresh interpreter loads neither torch nor executorch, the edge
passes and the emitter take a program from IR text to `.pte` bytes without loading them either
(operator schemas come from texir.ir.op_facts, strides from texir.edge.strides), and
`texir.lowering.lower_decomposed` lowers a texir Program with texir's own backends without them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from texir.emit import emit
from texir.ir import parse_program
from texir.serialize.pte import dumps

ROOT = Path(__file__).resolve().parent.parent

# x.permute(1, 0) + y as from_exported_program gives it: the view copy makes the add contiguous.
PROGRAM = """\
program dialect=ATEN
  inputs:
    %x: user_input
    %y: user_input
  outputs:
    %add: user_output
graph():
  %x : f32[2, 3] = placeholder
  %y : f32[3, 2] = placeholder
  %permute : f32[3, 2]{strides=(1, 3)} = aten::permute.default(%x, [1, 0])
  %add : f32[3, 2]{strides=(1, 3)} = aten::add.Tensor(%permute, %y)
  return (%add,)
"""

SCRIPT = """
import importlib, pkgutil, sys
for pkg in ("texir.ir", "texir.serialize", "texir.lowering", "texir.edge", "texir.emit", "texir.backends"):
    module = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(module.__path__, pkg + "."):
        importlib.import_module(info.name)
from texir.emit import emit
from texir.ir import parse_program
from texir.serialize.pte import dumps
pte = dumps(emit(parse_program(sys.stdin.read())))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "executorch"))
sys.stdout.write(repr(loaded) + "\\n" + pte.hex())
"""


def test_pure_layers_neither_import_nor_run_torch() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], input=PROGRAM, capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded, pte = done.stdout.split("\n", 1)
    assert loaded == "[]", f"torch/executorch loaded below the adapters: {loaded}"
    # the same bytes as emitted here, where torch is loaded
    assert bytes.fromhex(pte) == dumps(emit(parse_program(PROGRAM)))


LOWER_SCRIPT = """
import sys
import texir.backends  # registers texir-reference and the demo backend
from texir.emit import emit
from texir.ir import parse_program
from texir.lowering import OpSupportPartitioner, lower_decomposed
from texir.serialize.pte import dumps
done = lower_decomposed(parse_program(sys.stdin.read()), [OpSupportPartitioner("texir-reference", {"aten::sin.default"})],
                        cache=None)
pte = dumps(emit(done.program))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "executorch"))
sys.stdout.write(repr(loaded) + "\\n" + repr([d.backend for d in done.report.delegates]) + "\\n" + pte.hex())
"""

# sin(x) delegated to texir-reference, relu left to the portable kernels.
SIN_RELU = """\
program dialect=ATEN
  inputs:
    %x: user_input
  outputs:
    %relu: user_output
graph():
  %x : f32[2, 3] = placeholder
  %sin : f32[2, 3] = aten::sin.default(%x)
  %relu : f32[2, 3] = aten::relu.default(%sin)
  return (%relu,)
"""


def test_a_texir_program_lowers_with_a_texir_backend_and_emits_without_torch() -> None:
    import texir.backends  # noqa: F401  (registers texir-reference)
    from texir.lowering import OpSupportPartitioner, lower_decomposed

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-c", LOWER_SCRIPT], input=SIN_RELU, capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded, backends, pte = done.stdout.split("\n", 2)
    assert loaded == "[]", f"torch/executorch loaded while lowering a texir Program: {loaded}"
    assert backends == "['texir-reference']"
    here = lower_decomposed(parse_program(SIN_RELU), [OpSupportPartitioner("texir-reference", {"aten::sin.default"})],
                            cache=None)
    targets = [getattr(n, "target", None) for n in here.program.graph.nodes]
    assert "aten::relu.default" in targets and "aten::sin.default" not in targets  # sin went to the delegate
    assert len(here.program.lowered_modules) == 1
    assert bytes.fromhex(pte) == dumps(emit(here.program))


def test_lower_decomposed_refuses_what_is_not_a_program() -> None:
    import pytest

    from texir.lowering import PartitionerError, lower_decomposed

    with pytest.raises(PartitionerError, match="method 'forward': lower_decomposed takes a texir.ir.Program, not str.*texir.lower"):
        lower_decomposed("not a program", [], cache=None)  # type: ignore[call-overload]  # the wrong type on purpose
    with pytest.raises(PartitionerError, match="a mapping of partitioners needs a mapping of methods"):
        lower_decomposed(parse_program(SIN_RELU), {"forward": []}, cache=None)  # type: ignore[call-overload]  # ditto


def test_view_copies_relayout_their_readers_without_torch() -> None:
    from texir.edge import to_emittable
    from texir.ir import TensorMeta

    edge = to_emittable(parse_program(PROGRAM))
    metas = {n.name: edge.graph.meta(n) for n in edge.graph.nodes}
    assert [n.target for n in edge.graph.nodes if n.name == "permute"] == ["aten::permute_copy.default"]
    add = metas["add"]
    assert isinstance(add, TensorMeta) and add.strides == (2, 1)  # was (1, 3): it read the permuted view


def _refreshed(text: str, changed: tuple[str, ...]) -> dict[str, tuple[object, ...]]:
    from texir.edge.strides import refresh_strides
    from texir.ir import TensorMeta

    program = refresh_strides(parse_program(text), changed)
    return {n.name: m.strides for n in program.graph.nodes if isinstance(m := program.graph.meta(n), TensorMeta)}


def _program(body: str, inputs: str = "%x: user_input", shapes: str = "  %x : f32[3, 2] = placeholder\n") -> str:
    return (f"program dialect=ATEN\n  inputs:\n    {inputs}\n  outputs:\n    %out: user_output\ngraph():\n"
            f"{shapes}{body}  return (%out,)\n")


def test_strides_are_recomputed_only_where_inputs_determine_them() -> None:
    # contiguous inputs: the reader becomes contiguous, and so does its reader
    text = _program("  %c : f32[3, 2] = aten::permute_copy.default(%x, [0, 1])\n"
                    "  %r : f32[3, 2]{strides=(1, 3)} = aten::relu.default(%c)\n"
                    "  %out : f32[3, 2]{strides=(1, 3)} = aten::neg.default(%r)\n")
    assert _refreshed(text, ("c",)) == {"x": (2, 1), "c": (2, 1), "r": (2, 1), "out": (2, 1)}
    # an input that is still permuted: torch's layout rules would decide; the node keeps its strides
    text = _program("  %c : f32[3, 2] = aten::permute_copy.default(%x, [0, 1])\n"
                    "  %out : f32[3, 2]{strides=(1, 3)} = aten::add.Tensor(%c, %y)\n",
                    inputs="%x: user_input\n    %y: user_input",
                    shapes="  %x : f32[3, 2] = placeholder\n  %y : f32[3, 2]{strides=(1, 3)} = placeholder\n")
    assert _refreshed(text, ("c",))["out"] == (1, 3)
    # a layout argument chooses the result's layout
    text = _program("  %c : f32[1, 3, 2, 2] = aten::view_copy.default(%x, [1, 3, 2, 2])\n"
                    "  %out : f32[1, 3, 2, 2]{strides=(12, 1, 6, 3)} = "
                    "aten::clone.default(%c, memory_format=torch.channels_last)\n",
                    shapes="  %x : f32[12] = placeholder\n")
    assert _refreshed(text, ("c",))["out"] == (12, 1, 6, 3)


def test_contiguous_symbolic_strides_keep_their_spelling() -> None:
    text = _program("  %c : f32[2, s0, 5] = aten::permute_copy.default(%x, [0, 1, 2])\n"
                    "  %out : f32[2, s0, 5]{strides=(5*Max(1, s0), 5, 1)} = aten::relu.default(%c)\n",
                    shapes="  %x : f32[2, s0, 5] = placeholder\n")
    assert _refreshed(text, ("c",))["out"] == ("5*Max(1, s0)", 5, 1)


PROBE_BACKEND = """
import multiprocessing, sys
from texir.lowering import PreprocessResult

class Probe:
    '''Says where it ran and which torch/executorch modules that process had loaded.'''

    def preprocess(self, program, compile_specs, /):
        where = "worker" if multiprocessing.parent_process() is not None else "caller"
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "executorch"))
        return PreprocessResult(processed_bytes=f"{where}:{loaded}".encode())
"""

JOBS_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
from probe_backend import Probe
from texir.ir import parse_program
from texir.lowering import OpSupportPartitioner, lower_decomposed, register_backend
register_backend("texir-probe", Probe())
done = lower_decomposed(parse_program(sys.stdin.read()), [OpSupportPartitioner("texir-probe", {"aten::sin.default"})],
                        cache=None, jobs=2)
for named in done.program.lowered_modules:
    sys.stdout.write(named.module.processed_bytes.decode() + "\\n")
"""

# sin, relu, sin: two partitions for the probe, so jobs=2 sends them to the process pool.
SIN_RELU_SIN = SIN_RELU.replace("    %relu: user_output", "    %sin2: user_output").replace(
    "  return (%relu,)", "  %sin2 : f32[2, 3] = aten::sin.default(%relu)\n  return (%sin2,)")


def test_pool_workers_import_no_torch_for_a_backend_without_it(tmp_path: Path) -> None:
    (tmp_path / "probe_backend.py").write_text(PROBE_BACKEND)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-c", JOBS_SCRIPT, str(tmp_path)], input=SIN_RELU_SIN, capture_output=True, text=True,
        env=env, cwd=ROOT, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["worker:[]", "worker:[]"]
