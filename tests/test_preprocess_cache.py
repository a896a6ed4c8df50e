"""The preprocess cache (memory and disk) and parallel preprocessing: same bytes as a cold serial run;
after changing one layer only that partition compiles again."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

from texir.emit import emit
from texir.ir import CompileSpec, Program
from texir.lowering import (
    BackendPreprocessError,
    Partitioner,
    OpSupportPartitioner,
    PreprocessCache,
    PreprocessResult,
    register_backend,
)
from texir.orchestrate import lower
from texir.lowering.preprocess import PreprocessRequest, run_preprocess, run_task
from texir.serialize.pte.codec import dumps


class _ThreeLayers(nn.Module):
    """Three linears separated by cumsum (which XNNPACK does not take): three partitions."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x).cumsum(-1)
        return x


def _model(changed: bool = False) -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    module = _ThreeLayers().eval()
    if changed:
        with torch.no_grad():
            module.layers[1].weight.mul_(2)  # a local change: one layer's weights
    return torch.export.export(module, (torch.rand(2, 8),), strict=False)


@functools.lru_cache(maxsize=None)
def _xnnpack() -> list[Partitioner]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner

    return [executorch_partitioner(XnnpackPartitioner())]


def _pte(program: Program) -> bytes:
    return dumps(emit(program))


@functools.lru_cache(maxsize=None)
def _cold() -> bytes:
    return _pte(lower(_model(), _xnnpack(), cache=None).program)


def test_warm_cache_gives_the_same_bytes_without_compiling() -> None:
    cache = PreprocessCache()
    first = _pte(lower(_model(), _xnnpack(), cache=cache).program)
    assert (cache.hits, cache.misses) == (0, 3)
    second = _pte(lower(_model(), _xnnpack(), cache=cache).program)
    assert (cache.hits, cache.misses) == (3, 3)
    assert first == second == _cold()


def test_changing_one_layer_recompiles_only_its_partition() -> None:
    cache = PreprocessCache()
    lower(_model(), _xnnpack(), cache=cache)
    changed = lower(_model(changed=True), _xnnpack(), cache=cache).program
    assert (cache.hits, cache.misses) == (2, 4)
    assert _pte(changed) == _pte(lower(_model(changed=True), _xnnpack(), cache=None).program)


def test_disk_cache_survives_a_new_cache_object_and_damage(tmp_path: Path) -> None:
    lower(_model(), _xnnpack(), cache=PreprocessCache(tmp_path))
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert len(files) == 3 and not any(p.name.startswith(".") for p in files)  # no temporary files left
    fresh = PreprocessCache(tmp_path)
    assert _pte(lower(_model(), _xnnpack(), cache=fresh).program) == _cold()
    assert (fresh.hits, fresh.misses) == (3, 0)
    files[0].write_bytes(b"\x00garbage")
    damaged = PreprocessCache(tmp_path)
    assert _pte(lower(_model(), _xnnpack(), cache=damaged).program) == _cold()
    assert (damaged.hits, damaged.misses) == (2, 1)
    assert files[0].read_bytes() != b"\x00garbage"  # rewritten


def test_parallel_workers_give_the_serial_bytes() -> None:
    assert _pte(lower(_model(), _xnnpack(), cache=None, jobs=2).program) == _cold()


class _Counting:
    """A backend without cache_version, defined in a function's reach only (cannot be pickled)."""

    def __init__(self) -> None:
        self.calls = 0

    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec], /) -> PreprocessResult:
        self.calls += 1
        return PreprocessResult(processed_bytes=str(len(program.graph.nodes)).encode())


def test_backend_without_cache_version_is_cached_in_memory_only(tmp_path: Path) -> None:
    backend = _Counting()
    register_backend("texir-counting", backend, replace=True)
    relu = OpSupportPartitioner("texir-counting", {"aten::addmm.default"})
    cache = PreprocessCache(tmp_path)
    lower(_model(), [relu], cache=cache)
    lower(_model(), [relu], cache=cache, jobs=2)  # all hits: nothing to send to workers
    assert backend.calls == 3 and cache.hits == 3
    assert not any(tmp_path.rglob("*"))  # nothing durable without a cache_version
    serial = lower(_model(), [relu], cache=None).program  # no cache: compiled again, here
    assert backend.calls == 6
    parallel = lower(_model(), [relu], cache=None, jobs=2).program  # picklable: compiled in workers
    assert backend.calls == 6
    assert _pte(parallel) == _pte(serial)


def test_worker_task_reports_a_failing_backend_as_the_serial_run_does() -> None:
    from texir.serialize import snapshot

    class Failing:
        def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec], /) -> PreprocessResult:
            raise ValueError("nope")

    program = lower(_model(), [], cache=None).program
    ok, message = run_task((Failing(), "texir-failing-x", snapshot.dumps(program, include_data=True), (), "tag1"))
    assert not ok and message == "backend 'texir-failing-x' preprocess failed for partition 'tag1': ValueError: nope"
    register_backend("texir-failing-x", Failing(), replace=True)
    with pytest.raises(BackendPreprocessError, match=r"^backend 'texir-failing-x' preprocess failed for partition 'tag1': ValueError: nope$"):
        run_preprocess([PreprocessRequest("texir-failing-x", program, (), "tag1")])
    with pytest.raises(BackendPreprocessError, match=r"jobs must be at least 1"):
        run_preprocess([], jobs=0)


def _aliases_its_weights(program: Program) -> bool:
    """Every named-data payload is the sub-program's own weight payload (the same Blob object)."""
    found = []
    for named in program.lowered_modules:
        own = {id(e.value.data) for e in named.module.original_program.state}
        found += [id(e.data) in own for e in named.module.named_data]
    return bool(found) and all(found)


@pytest.mark.parametrize("how", ["serial", "jobs=2", "disk cache"])
def test_weights_stored_as_they_are_share_the_programs_payload(how: str, tmp_path: Path) -> None:
    """XNNPACK stores fp32 linear weights unchanged: lowering keeps one copy of them, not two."""
    if how == "disk cache":
        lower(_model(), _xnnpack(), cache=PreprocessCache(tmp_path))
        program = lower(_model(), _xnnpack(), cache=PreprocessCache(tmp_path)).program  # every result read back
    else:
        program = lower(_model(), _xnnpack(), cache=None, jobs=2 if how == "jobs=2" else 1).program
    assert _aliases_its_weights(program)
    assert _pte(program) == _cold()
