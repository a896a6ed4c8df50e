"""Running backends' `preprocess`: a content-addressed cache (in memory, optionally in a directory
or at an fsspec URL that machines share) and independent partitions compiled on a
`concurrent.futures` executor (a process pool for `jobs` > 1, or any executor the caller gives:
Dask's, Ray's), with the same results as a serial run.

A cache key hashes the backend id, the backend's `cache_version` (its code: for ExecuTorch backends
the executorch version and class), the compile specs and the sub-program's snapshot (its nodes,
metadata, debug handles and tensor hashes). So re-lowering a model after a local change recompiles
only the partitions that changed. Backends without `cache_version` are cached in memory only (for
the backend object at hand), never on disk: their code could change between processes unseen."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path

import msgspec

from texir.ir import CompileSpec, DebugHandleEntry, LoweredBackendModule, Program
from texir.lowering.backend import Backend, PreprocessResult, check_result, get_backend, named_data_entry
from texir.lowering.cache_store import Store, open_store
from texir.lowering.errors import BackendPreprocessError
from texir.serialize import snapshot

__all__ = [
    "CACHE_DIR_ENV",
    "Compiled",
    "PreprocessCache",
    "PreprocessRequest",
    "default_cache",
    "run_preprocess",
    "run_preprocess_timed",
]

CACHE_DIR_ENV = "TEXIR_CACHE_DIR"
_KEY_VERSION = b"texir-preprocess-cache-2"  # 2: results carry delegate_info


class PreprocessRequest(msgspec.Struct, frozen=True):
    backend_id: str
    program: Program
    compile_specs: tuple[CompileSpec, ...]
    tag: str | None = None


class Compiled(msgspec.Struct, frozen=True):
    """One request's lowered module, whether it came from the cache, and the seconds its backend
    took (a cache lookup's for a hit; the worker's own with `jobs` > 1 or an executor)."""

    module: LoweredBackendModule
    cache_hit: bool
    seconds: float


class _Stored(msgspec.Struct, frozen=True, array_like=True):
    processed: bytes
    handles: list[tuple[int | str, list[int]]] | None
    named: list[tuple[str, int, bytes]]
    info: str | None = None


def _encode(result: PreprocessResult) -> bytes:
    handles = None if result.debug_handle_map is None else [
        (e.identifier, list(e.debug_handles)) for e in result.debug_handle_map
    ]
    named = []
    for entry in result.named_data:
        if entry.data is None:
            raise BackendPreprocessError(f"named data {entry.key!r} has no payload; backends must return payloads")
        named.append((entry.key, entry.alignment, entry.data.tobytes()))
    return msgspec.msgpack.encode(_Stored(processed=bytes(result.processed_bytes), handles=handles, named=named,
                                         info=result.delegate_info))


def _decode(data: bytes) -> PreprocessResult:
    stored = msgspec.msgpack.decode(data, type=_Stored)
    handles = None if stored.handles is None else tuple(
        DebugHandleEntry(identifier=i, debug_handles=tuple(h)) for i, h in stored.handles
    )
    return PreprocessResult(
        processed_bytes=stored.processed,
        debug_handle_map=handles,
        named_data=tuple(named_data_entry(k, d, alignment=a) for k, a, d in stored.named),
        delegate_info=stored.info,
    )


class PreprocessCache:
    """Preprocess results by content. In memory (least recently used first out past
    `memory_bytes`) and, with `directory`, durably as one file per key: `directory` is a local
    path (`~` and `$VARS` expanded) or an fsspec URL (`memory://...`, `s3://bucket/texir`, ...)
    that several machines may share. Entries are written atomically (a reader never sees part of
    one; writers racing on a key are safe) and an unreadable one counts as a miss. `hits` and
    `misses` count lookups. `directory` is the local directory (None for a URL elsewhere),
    `location` what was given.

    It also keeps, in memory, the last `decompositions_kept` decomposed programs `lower` made, as
    templates without weights (`texir.lowering.decompose_memo`): re-lowering a model whose weights
    changed skips torch's decomposition retrace. `decompositions_reused` counts those."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        memory_bytes: int = 256 << 20,
        decompositions_kept: int = 8,
    ) -> None:
        self.location = None if directory is None else os.fspath(directory)
        self._store: Store | None = None
        self.directory: Path | None = None
        if directory is not None:
            self._store, self.directory = open_store(directory)
        self.memory_bytes = memory_bytes
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self.hits = 0
        self.misses = 0
        self.decompositions_kept = decompositions_kept
        self._decompositions: OrderedDict[str, Program] = OrderedDict()
        self.decompositions_reused = 0

    def decomposition(self, key: str) -> Program | None:
        """The template stored under `key` (`decompose_memo.decomposition_key`), if any."""
        template = self._decompositions.get(key)
        if template is not None:
            self._decompositions.move_to_end(key)
            self.decompositions_reused += 1
        return template

    def store_decomposition(self, key: str, template: Program) -> None:
        self._decompositions[key] = template
        self._decompositions.move_to_end(key)
        while len(self._decompositions) > max(self.decompositions_kept, 0):
            self._decompositions.popitem(last=False)

    def key(self, backend_id: str, backend: Backend, program: Program, specs: Sequence[CompileSpec]) -> tuple[str, bool]:
        """The cache key of one preprocess call, and whether it may be stored on disk."""
        version = getattr(backend, "cache_version", None)
        durable = isinstance(version, str)
        who = version if durable else f"{type(backend).__module__}.{type(backend).__qualname__}@{id(backend)}"
        h = hashlib.sha256(_KEY_VERSION)
        for part in (backend_id.encode(), str(who).encode(),
                     msgspec.msgpack.encode([(s.key, s.value) for s in specs]),
                     snapshot.dumps(program, format="msgpack")):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
        # A deferred digest (a memory-mapped checkpoint's weight) is a stand-in, not the bytes' name:
        # such a key holds only in this process, for these very payloads.
        deferred = [e.value.data for e in program.state if e.value.data is not None and e.value.data.deferred]
        if deferred:
            durable = False
            h.update(",".join(str(id(blob)) for blob in deferred).encode())
        return h.hexdigest(), durable

    def lookup(self, key: str, durable: bool) -> PreprocessResult | None:
        data = self._memory.get(key)
        if data is not None:
            self._memory.move_to_end(key)
        elif durable and self._store is not None:
            data = self._store.read(key)
        if data is not None:
            try:
                result = _decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError, BackendPreprocessError):
                data = None  # a damaged cache file: compile again (and overwrite it)
            else:
                self.hits += 1
                self._remember(key, data)
                return result
        self.misses += 1
        return None

    def store(self, key: str, durable: bool, result: PreprocessResult) -> None:
        data = _encode(result)
        self._remember(key, data)
        if durable and self._store is not None:
            self._store.write(key, data)

    def _remember(self, key: str, data: bytes) -> None:
        if len(data) > self.memory_bytes:
            return
        old = self._memory.pop(key, None)
        if old is not None:
            self._size -= len(old)
        self._memory[key] = data
        self._size += len(data)
        while self._size > self.memory_bytes:
            _, dropped = self._memory.popitem(last=False)
            self._size -= len(dropped)


_DEFAULT: dict[str | None, PreprocessCache] = {}


def default_cache() -> PreprocessCache:
    """The process-wide cache: in memory, and under `$TEXIR_CACHE_DIR` (a directory or an fsspec
    URL) when it is set."""
    directory = os.environ.get(CACHE_DIR_ENV) or None
    cache = _DEFAULT.get(directory)
    if cache is None:
        cache = _DEFAULT[directory] = PreprocessCache(directory)
    return cache


# --------------------------------------------------------------------------------------------------
# Running


def _where(request: PreprocessRequest) -> str:
    return f" for partition '{request.tag}'" if request.tag is not None else ""


def _what(request: PreprocessRequest) -> str:
    return f"partition '{request.tag}'" if request.tag is not None else "an untagged partition"


def _preprocess(backend: Backend, request: PreprocessRequest) -> PreprocessResult:
    try:
        result = backend.preprocess(request.program, request.compile_specs)
    except Exception as exc:  # a backend's failure of any kind becomes one typed error
        raise BackendPreprocessError(
            f"backend '{request.backend_id}' preprocess failed{_where(request)}: {type(exc).__name__}: {exc}"
        ) from exc
    return check_result(request.backend_id, result, request.tag)


def share_state_payloads(result: PreprocessResult, program: Program) -> PreprocessResult:
    """`result` with each named-data payload that holds exactly the bytes of one of `program`'s
    state tensors (a backend storing a weight as it is) replaced by that tensor's own payload, so
    the backend's copy can be freed: lowering then needs no second copy of such weights."""
    if not result.named_data or not program.state:
        return result
    by_hash = {e.value.sha256: e.value.data for e in program.state if e.value.data is not None}
    shared = []
    for entry in result.named_data:
        own = by_hash.get(entry.sha256)
        shared.append(entry if own is None or own.nbytes != entry.nbytes else msgspec.structs.replace(entry, data=own))
    return msgspec.structs.replace(result, named_data=tuple(shared))


_NOT_LOADED = "the worker could not load the task: "


def run_task(task: bytes) -> tuple[bool, bytes | str]:
    """On an executor's worker: the pickled (backend, backend id, program snapshot, compile specs,
    tag) compiled. (True, the encoded result) or (False, the error's message: the serial run's for
    a failing backend). Errors come back as values, so every executor hands them over alike."""
    try:
        backend, backend_id, program_bytes, specs, tag = pickle.loads(task)
        request = PreprocessRequest(backend_id, snapshot.loads(program_bytes), specs, tag)
    except Exception as exc:  # e.g. the backend's class cannot be imported on this worker
        return False, f"{_NOT_LOADED}{type(exc).__name__}: {exc}"
    try:
        return True, _encode(_preprocess(backend, request))
    except BackendPreprocessError as exc:
        return False, str(exc)


def _timed_task(task: bytes) -> tuple[bool, bytes | str, float]:
    start = time.perf_counter()
    ok, payload = run_task(task)
    return ok, payload, time.perf_counter() - start


_POOL: list[tuple[int, ProcessPoolExecutor]] = []
_POOL_LOCK = threading.Lock()


def _pool(jobs: int) -> ProcessPoolExecutor:
    """The process-wide pool of `jobs` workers, kept between calls (its workers have imported the
    backends already). Workers are spawned, not forked: a fresh interpreter imports only this
    module and what unpickling a task's backend needs (torch only for backends that use it); as
    with any spawned `multiprocessing` worker, a calling script's top level must sit under
    `if __name__ == "__main__":`."""
    with _POOL_LOCK:
        if _POOL and _POOL[0][0] == jobs:
            return _POOL[0][1]
        while _POOL:
            _POOL.pop()[1].shutdown(wait=False, cancel_futures=True)
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
        _POOL.append((jobs, pool))
        return pool


def _forget_pool(pool: Executor) -> None:
    with _POOL_LOCK:
        for i, (_, kept) in enumerate(_POOL):
            if kept is pool:
                del _POOL[i]
                pool.shutdown(wait=False, cancel_futures=True)
                return


def _collect(
    executor: Executor, futures: list[Future[tuple[bool, bytes | str, float]]], what: list[str], own: bool
) -> list[tuple[bool, bytes | str, float]]:
    """The answers of `futures` (with each task's seconds) in order. A worker or the executor
    failing is a `BackendPreprocessError` naming the task (`own`: texir's pool, dropped once broken)."""
    answers = []
    for future, name in zip(futures, what):
        try:
            answers.append(future.result())
        except Exception as exc:  # a worker died, the cluster went away, ...
            if own:
                _forget_pool(executor)
            raise BackendPreprocessError(
                f"the preprocess worker failed while compiling {name} ({type(exc).__name__}: {exc}); "
                "run with jobs=1 and no executor to see the backend's own error"
            ) from exc
    return answers


def run_preprocess(
    requests: Sequence[PreprocessRequest],
    *,
    cache: PreprocessCache | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
) -> list[LoweredBackendModule]:
    """Every request through its backend, in order: from `cache` where it has the result, else
    compiled: on `executor` (any `concurrent.futures.Executor`: Dask's `Client.get_executor()`,
    Ray's, a pool of the caller's) when one is given, else in a pool of `jobs` spawned worker
    processes when `jobs` > 1 and more than one partition needs compiling. A backend that cannot be
    pickled compiles here. The results are the same as a serial run's, and so are the errors."""
    return [c.module for c in run_preprocess_timed(requests, cache=cache, jobs=jobs, executor=executor)]


def check_workers(jobs: object, executor: object) -> None:
    """A typed error unless `jobs` is a count of workers and `executor` None or an Executor."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise BackendPreprocessError(f"jobs must be at least 1, got {jobs!r}")
    if executor is not None and not isinstance(executor, Executor):
        raise BackendPreprocessError(
            f"executor={type(executor).__name__} is not a concurrent.futures.Executor; give one "
            "(e.g. ProcessPoolExecutor, distributed.Client().get_executor()) or None"
        )
    if executor is not None and jobs != 1:
        raise BackendPreprocessError(
            f"jobs={jobs} and an executor were both given; the executor decides how many workers run: drop jobs"
        )


def run_preprocess_timed(
    requests: Sequence[PreprocessRequest],
    *,
    cache: PreprocessCache | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
) -> list[Compiled]:
    """`run_preprocess`, also saying for each request whether the cache had it and how long it took."""
    check_workers(jobs, executor)
    backends = [get_backend(r.backend_id, tag=r.tag) for r in requests]
    results: list[PreprocessResult | None] = [None] * len(requests)
    keys: list[tuple[str, bool] | None] = [None] * len(requests)
    todo: list[int] = []
    seconds = [0.0] * len(requests)
    for i, (request, backend) in enumerate(zip(requests, backends)):
        if cache is not None:
            start = time.perf_counter()
            keys[i] = key = cache.key(request.backend_id, backend, request.program, request.compile_specs)
            results[i] = cache.lookup(*key)
            seconds[i] = time.perf_counter() - start
        if results[i] is None:
            todo.append(i)
    parallel: list[tuple[int, tuple[bytes, str]]] = []
    if executor is not None or (jobs > 1 and len(todo) > 1):
        for i in todo:
            r = requests[i]
            data = snapshot.dumps(r.program, format="msgpack", include_data=True, include_stack_traces=True)
            try:
                task = pickle.dumps((backends[i], r.backend_id, data, r.compile_specs, r.tag),
                                    protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # a backend defined in a function cannot travel: it runs here
                continue
            parallel.append((i, (task, f"{_what(r)} of backend '{r.backend_id}'")))
    sent = {i for i, _ in parallel}
    pool = (executor if executor is not None else _pool(jobs)) if parallel else None
    futures: list[Future[tuple[bool, bytes | str, float]]] = []
    try:
        if pool is not None:  # sent first: the backends that cannot travel compile here meanwhile
            futures = [pool.submit(_timed_task, task) for _, (task, _) in parallel]
        for i in todo:
            if i not in sent:
                start = time.perf_counter()
                results[i] = share_state_payloads(_preprocess(backends[i], requests[i]), requests[i].program)
                seconds[i] = time.perf_counter() - start
        answers = [] if pool is None else _collect(pool, futures, [w for _, (_, w) in parallel], executor is None)
    finally:
        for future in futures:
            future.cancel()  # after an error: what has not started need not run
    for (i, (_, what)), (ok, payload, took) in zip(parallel, answers):
        seconds[i] = took
        if not ok:
            message = str(payload)
            if message.startswith(_NOT_LOADED):
                message = f"{what}: {message}; make the backend importable on the workers, or compile without them"
            raise BackendPreprocessError(message)
        assert isinstance(payload, bytes)  # ok: the encoded result
        results[i] = share_state_payloads(_decode(payload), requests[i].program)
    for i, found in enumerate(results):
        if found is not None and i not in todo:  # from the cache: its copies can go too
            results[i] = share_state_payloads(found, requests[i].program)
    modules: list[Compiled] = []
    for i, (request, result) in enumerate(zip(requests, results)):
        assert result is not None  # every index was looked up or compiled above
        stored_key = keys[i]
        if cache is not None and stored_key is not None and i in todo:
            cache.store(*stored_key, result)
        module = LoweredBackendModule(
            backend_id=request.backend_id,
            processed_bytes=bytes(result.processed_bytes),
            compile_specs=request.compile_specs,
            original_program=request.program,
            debug_handle_map=result.debug_handle_map,
            named_data=tuple(result.named_data),
            delegate_info=result.delegate_info,
        )
        modules.append(Compiled(module=module, cache_hit=i not in todo, seconds=seconds[i]))
    return modules
