"""The preprocess cache (memory, disk, fsspec URLs) and parallel preprocessing (jobs=N's process pool,
any concurrent.futures executor, a Dask cluster): same bytes and errors as a cold serial run; after
changing one layer only that partition compiles again."""

from __future__ import annotations

import functools
import os
import pickle
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import msgspec
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


def _native(**how: object) -> bytes:
    """The .pte of `_model()` lowered by texir's own XNNPACK partitioner and backend (safe to run in
    threads: ExecuTorch's preprocess is not) with `how` (cache=None and the executor)."""
    from texir.backends.xnnpack import partitioner, registered

    with registered():  # texir's backend behind XnnpackBackend, for this call only
        return _pte(lower(_model(), [partitioner()], cache=None, **how).program)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=None)
def _native_cold() -> bytes:
    return _native()


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


class _Failing:
    """A backend that always fails (importable by workers: defined at module level)."""

    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec], /) -> PreprocessResult:
        raise ValueError("nope")


def test_worker_task_reports_a_failing_backend_as_the_serial_run_does() -> None:
    from texir.serialize import snapshot

    program = lower(_model(), [], cache=None).program
    task = pickle.dumps((_Failing(), "texir-failing-x", snapshot.dumps(program, include_data=True), (), "tag1"))
    ok, message = run_task(task)
    assert not ok and message == "backend 'texir-failing-x' preprocess failed for partition 'tag1': ValueError: nope"
    register_backend("texir-failing-x", _Failing(), replace=True)
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


# --------------------------------------------------------------------------------------------------
# Executors: the process pool behind jobs=N, any concurrent.futures.Executor, a Dask cluster


class _KillsItsWorker(_Failing):
    """A backend whose worker process dies as it loads the task (before importing anything)."""

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return (os._exit, (3,))


def _cannot_load() -> object:
    raise ImportError("No module named 'only_on_the_laptop'")


class _Unloadable(_Failing):
    """Pickles, but cannot be loaded again (as a backend whose package a worker lacks)."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_cannot_load, ())


def _on(backend_id: str) -> list[Partitioner]:
    return [OpSupportPartitioner(backend_id, {"aten::addmm.default"})]


def _error(**how: object) -> str:
    with pytest.raises(BackendPreprocessError) as caught:
        lower(_model(), _on("texir-failing-x"), cache=None, **how)  # type: ignore[arg-type]
    return str(caught.value)


def test_a_failing_backend_is_the_serial_error_on_any_executor() -> None:
    register_backend("texir-failing-x", _Failing(), replace=True)
    serial = _error()
    assert "for partition '" in serial and serial.endswith("ValueError: nope")
    assert _error(jobs=2) == serial
    with ThreadPoolExecutor(2) as pool:
        assert _error(executor=pool) == serial


def test_any_executor_gives_the_serial_bytes() -> None:
    with ThreadPoolExecutor(2) as pool:
        assert _native(executor=pool) == _native_cold()


def test_a_worker_dying_is_a_typed_error_naming_the_partition_and_the_pool_recovers() -> None:
    register_backend("texir-dying", _KillsItsWorker(), replace=True)
    with pytest.raises(BackendPreprocessError, match=r"^the preprocess worker failed while compiling partition '[^']+' "
                       r"of backend 'texir-dying' \(BrokenProcessPool: .*run with jobs=1"):
        lower(_model(), _on("texir-dying"), cache=None, jobs=2)
    assert _native(jobs=2) == _native_cold()  # a fresh pool


def test_a_backend_a_worker_cannot_load_is_a_typed_error_naming_the_partition() -> None:
    register_backend("texir-unloadable", _Unloadable(), replace=True)
    with ThreadPoolExecutor(1) as pool, pytest.raises(
        BackendPreprocessError,
        match=r"^partition '[^']+' of backend 'texir-unloadable': the worker could not load the task: "
        r"ImportError: No module named 'only_on_the_laptop'; make the backend importable on the workers",
    ):
        lower(_model(), _on("texir-unloadable"), cache=None, executor=pool)


def test_jobs_and_executor_are_checked() -> None:
    with ThreadPoolExecutor(1) as pool, pytest.raises(BackendPreprocessError, match=r"jobs=2 and an executor were both given"):
        lower(_model(), [], jobs=2, executor=pool)
    with pytest.raises(BackendPreprocessError, match=r"executor=object is not a concurrent.futures.Executor"):
        lower(_model(), [], executor=object())  # type: ignore[arg-type]
    with pytest.raises(BackendPreprocessError, match=r"jobs must be at least 1, got 0"):
        lower(_model(), [], jobs=0)


@pytest.fixture(scope="module")
def dask_executor() -> Iterator[Executor]:
    """A Dask LocalCluster of two single-threaded worker processes: the tasks travel pickled, as to
    a remote cluster, and each worker imports only what its tasks' backends need (texir's own
    XNNPACK needs no torch: the cluster is up and compiling in seconds)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            yield client.get_executor()


def test_a_dask_cluster_gives_the_serial_bytes_and_errors(dask_executor: Executor) -> None:
    assert _native(executor=dask_executor) == _native_cold()
    register_backend("texir-failing-x", _Failing(), replace=True)
    assert _error(executor=dask_executor) == _error()


# --------------------------------------------------------------------------------------------------
# Where the cache lives: local paths (~ and $VARS expanded) and fsspec URLs


def _result(size: int = 1 << 20) -> PreprocessResult:
    return PreprocessResult(processed_bytes=bytes(range(256)) * (size // 256))


_KEY = "ab" + "0" * 62


def test_a_local_path_expands_home_and_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TEXIR_TEST_SUB", "sub")
    monkeypatch.chdir(tmp_path)
    cache = PreprocessCache("~/$TEXIR_TEST_SUB/cache")
    assert cache.directory == tmp_path / "sub" / "cache"
    cache.store(_KEY, True, _result(256))
    assert (tmp_path / "sub" / "cache" / "ab" / _KEY).is_file() and not (tmp_path / "~").exists()
    assert PreprocessCache(f"file://{tmp_path}/sub/cache").lookup(_KEY, True) is not None


def test_a_memory_url_is_shared_by_new_cache_objects_and_survives_damage() -> None:
    import fsspec

    url = f"memory://texir-test-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    lower(_model(), _xnnpack(), cache=PreprocessCache(url))
    files = sorted(fs.find(url))
    assert len(files) == 3 and not any(f.rsplit("/", 1)[1].startswith(".") for f in files)  # no temporary files
    fresh = PreprocessCache(url)
    assert _pte(lower(_model(), _xnnpack(), cache=fresh).program) == _cold()
    assert (fresh.hits, fresh.misses) == (3, 0)
    fs.pipe_file(files[0], b"\x00garbage")
    damaged = PreprocessCache(url)
    assert _pte(lower(_model(), _xnnpack(), cache=damaged).program) == _cold()
    assert (damaged.hits, damaged.misses) == (2, 1)
    assert fs.cat_file(files[0]) != b"\x00garbage"  # rewritten


def test_an_unknown_url_protocol_is_a_typed_error() -> None:
    with pytest.raises(BackendPreprocessError, match=r"'nosuchfs://x': fsspec cannot open it"):
        PreprocessCache("nosuchfs://x")


def _location(where: str, tmp_path: Path) -> tuple[str, Callable[[str], bytes | None], Callable[[], list[str]]]:
    """A cache location, a raw reader of one entry and a lister of every file under it."""
    if where == "local":
        def read_local(path: str) -> bytes | None:
            try:
                return (tmp_path / path).read_bytes()
            except OSError:
                return None
        return str(tmp_path), read_local, lambda: sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    import fsspec

    fs, root = fsspec.filesystem("memory"), f"/texir-race-{uuid.uuid4().hex}"

    def read_memory(path: str) -> bytes | None:
        try:
            data = fs.cat_file(f"{root}/{path}")
        except FileNotFoundError:
            return None
        return bytes(data)
    return f"memory://{root}", read_memory, lambda: sorted(f[len(root) + 1:] for f in fs.find(root))


@pytest.mark.parametrize("where", ["local", "memory"])
def test_concurrent_writers_leave_readers_whole_entries(where: str, tmp_path: Path) -> None:
    location, read, listed = _location(where, tmp_path)
    writers = [PreprocessCache(location) for _ in range(3)]
    seen: list[bytes | None] = []

    def write(cache: PreprocessCache) -> None:
        for _ in range(10):
            cache.store(_KEY, True, _result())

    def watch() -> None:
        for _ in range(300):
            seen.append(read(f"ab/{_KEY}"))

    threads = [threading.Thread(target=write, args=(c,)) for c in writers] + [threading.Thread(target=watch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = read(f"ab/{_KEY}")
    assert expected is not None and len(expected) > 1 << 20
    assert all(s is None or s == expected for s in seen)  # never a part of an entry
    assert listed() == [f"ab/{_KEY}"]  # no temporary files left
    found = PreprocessCache(location).lookup(_KEY, True)
    assert found is not None and bytes(found.processed_bytes) == bytes(_result().processed_bytes)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_write_failing_before_its_entry_is_in_place_leaves_nothing(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    location, read, listed = _location(where, tmp_path)

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    if where == "local":
        monkeypatch.setattr(os, "replace", fail)
    else:
        from fsspec.implementations.memory import MemoryFileSystem

        monkeypatch.setattr(MemoryFileSystem, "mv", fail)
    PreprocessCache(location).store(_KEY, True, _result())  # a cache that cannot be written is only slower
    assert read(f"ab/{_KEY}") is None and [f for f in listed() if not f.endswith("/")] == []
    assert PreprocessCache(location).lookup(_KEY, True) is None


class _Informing:
    """A backend attaching `delegate_info` (importable by workers, durable: it has a cache_version)."""

    cache_version = "informing-1"

    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec], /) -> PreprocessResult:
        return PreprocessResult(processed_bytes=b"i", delegate_info=f'{{"nodes":{len(program.graph.nodes)}}}')


def test_delegate_info_survives_the_disk_cache_workers_text_and_snapshots(tmp_path: Path) -> None:
    from texir.ir import payloads_of
    from texir.ir.parser import parse_program
    from texir.ir.printer import format_program
    from texir.serialize import snapshot

    register_backend("texir-informing", _Informing(), replace=True)
    part = [OpSupportPartitioner("texir-informing", {"aten::addmm.default"})]
    cold = lower(_model(), part, cache=PreprocessCache(tmp_path)).program
    infos = [m.module.delegate_info for m in cold.lowered_modules]
    assert len(infos) == 3 and all(i is not None and i.startswith('{"nodes":') for i in infos)
    fresh = PreprocessCache(tmp_path)  # a new process's cache: the results come from disk
    from_disk = lower(_model(), part, cache=fresh).program
    assert fresh.hits == 3 and [m.module.delegate_info for m in from_disk.lowered_modules] == infos
    in_workers = lower(_model(), part, cache=None, jobs=2).program
    assert [m.module.delegate_info for m in in_workers.lowered_modules] == infos
    text = format_program(cold)
    assert "delegate_info '{\"nodes\":" in text
    parsed = parse_program(text, payloads=payloads_of(cold))
    assert [m.module.delegate_info for m in parsed.lowered_modules] == infos
    assert [m.module.delegate_info for m in snapshot.loads(snapshot.dumps(cold)).lowered_modules] == infos
    assert _pte(cold) == _pte(msgspec.structs.replace(cold, lowered_modules=tuple(
        msgspec.structs.replace(m, module=msgspec.structs.replace(m.module, delegate_info=None))
        for m in cold.lowered_modules)))  # never written to the .pte
