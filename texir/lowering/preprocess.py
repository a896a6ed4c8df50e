"""Running backends' `preprocess`: a content-addressed cache (in memory, optionally on disk) and
independent partitions compiled in parallel worker processes, with the same results as a serial run.

A cache key hashes the backend id, the backend's `cache_version` (its code: for ExecuTorch backends
the executorch version and class), the compile specs and the sub-program's snapshot (its nodes,
metadata, debug handles and tensor hashes). So re-lowering a model after a local change recompiles
only the partitions that changed. Backends without `cache_version` are cached in memory only (for
the backend object at hand), never on disk: their code could change between processes unseen."""

from __future__ import annotations

import atexit
import hashlib
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from texir.ir import CompileSpec, DebugHandleEntry, LoweredBackendModule, Program
from texir.lowering.backend import Backend, PreprocessResult, check_result, get_backend, named_data_entry
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
_KEY_VERSION = b"texir-preprocess-cache-1"


@dataclass(frozen=True)
class PreprocessRequest:
    backend_id: str
    program: Program
    compile_specs: tuple[CompileSpec, ...]
    tag: str | None = None


@dataclass(frozen=True)
class Compiled:
    """One request's lowered module, whether it came from the cache, and the seconds its backend
    took (a cache lookup's for a hit; a worker's round trip with `jobs` > 1)."""

    module: LoweredBackendModule
    cache_hit: bool
    seconds: float


class _Stored(msgspec.Struct, frozen=True, array_like=True):
    processed: bytes
    handles: list[tuple[int | str, list[int]]] | None
    named: list[tuple[str, int, bytes]]


def _encode(result: PreprocessResult) -> bytes:
    handles = None if result.debug_handle_map is None else [
        (e.identifier, list(e.debug_handles)) for e in result.debug_handle_map
    ]
    named = []
    for entry in result.named_data:
        if entry.data is None:
            raise BackendPreprocessError(f"named data {entry.key!r} has no payload; backends must return payloads")
        named.append((entry.key, entry.alignment, entry.data.tobytes()))
    return msgspec.msgpack.encode(_Stored(processed=bytes(result.processed_bytes), handles=handles, named=named))


def _decode(data: bytes) -> PreprocessResult:
    stored = msgspec.msgpack.decode(data, type=_Stored)
    handles = None if stored.handles is None else tuple(
        DebugHandleEntry(identifier=i, debug_handles=tuple(h)) for i, h in stored.handles
    )
    return PreprocessResult(
        processed_bytes=stored.processed,
        debug_handle_map=handles,
        named_data=tuple(named_data_entry(k, d, alignment=a) for k, a, d in stored.named),
    )


class PreprocessCache:
    """Preprocess results by content. In memory (least recently used first out past
    `memory_bytes`) and, with `directory`, on disk as one file per key (written atomically; an
    unreadable file counts as a miss). `hits` and `misses` count lookups.

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
        self.directory = None if directory is None else Path(directory)
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
        return h.hexdigest(), durable

    def lookup(self, key: str, durable: bool) -> PreprocessResult | None:
        data = self._memory.get(key)
        if data is not None:
            self._memory.move_to_end(key)
        elif durable and self.directory is not None:
            try:
                data = (self.directory / key[:2] / key).read_bytes()
            except OSError:
                data = None
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
        if durable and self.directory is not None:
            folder = self.directory / key[:2]
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.")
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, folder / key)
            except OSError:
                pass  # a cache that cannot be written is only slower

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
    """The process-wide cache: in memory, and on disk under `$TEXIR_CACHE_DIR` when it is set."""
    directory = os.environ.get(CACHE_DIR_ENV) or None
    cache = _DEFAULT.get(directory)
    if cache is None:
        cache = _DEFAULT[directory] = PreprocessCache(directory)
    return cache


# --------------------------------------------------------------------------------------------------
# Running


def _where(request: PreprocessRequest) -> str:
    return f" for partition '{request.tag}'" if request.tag is not None else ""


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


def run_task(task: tuple[Backend, str, bytes, tuple[CompileSpec, ...], str | None]) -> tuple[bool, bytes | str]:
    """In a worker process: (True, encoded result) or (False, the typed error's message)."""
    backend, backend_id, program_bytes, specs, tag = task
    request = PreprocessRequest(backend_id, snapshot.loads(program_bytes), specs, tag)
    try:
        return True, _encode(_preprocess(backend, request))
    except BackendPreprocessError as exc:
        return False, str(exc)


class _Worker:
    """One `python -m texir.lowering._worker` process, kept for the life of this one."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "texir.lowering._worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def call(self, task: bytes, what: str) -> tuple[bool, bytes | str]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None  # both are pipes
        try:
            stdin.write(len(task).to_bytes(8, "little") + task)
            stdin.flush()
            header = stdout.read(8)
            body = stdout.read(int.from_bytes(header, "little")) if len(header) == 8 else b""
            answer = pickle.loads(body)
        except (OSError, EOFError, pickle.UnpicklingError):
            code = self.proc.poll()
            raise BackendPreprocessError(
                f"the preprocess worker process died (exit code {code}) while compiling {what}; run with "
                "jobs=1 to see the backend's own error"
            ) from None
        ok, payload = answer
        return bool(ok), payload

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


_WORKERS: list[_Worker] = []


def _close_workers() -> None:
    for worker in _WORKERS:
        try:
            worker.close()
        except Exception:  # at exit: a worker that will not stop is killed
            worker.proc.kill()


atexit.register(_close_workers)


def _in_workers(tasks: list[tuple[bytes, str]], jobs: int) -> list[tuple[bool, bytes | str, float]]:
    """Run pickled tasks on up to `jobs` workers (started on first use); answers (with each task's
    seconds) in task order."""
    while len(_WORKERS) < min(jobs, len(tasks)):
        _WORKERS.append(_Worker())
    answers: list[tuple[bool, bytes | str, float] | None] = [None] * len(tasks)
    errors: list[BaseException] = []
    queue = list(range(len(tasks)))
    lock = threading.Lock()

    def drive(worker: _Worker) -> None:
        while True:
            with lock:
                if not queue or errors:
                    return
                i = queue.pop(0)
            try:
                start = time.perf_counter()
                ok, payload = worker.call(*tasks[i])
                answers[i] = (ok, payload, time.perf_counter() - start)
            except BaseException as exc:  # handed to the caller's thread below
                with lock:
                    errors.append(exc)
                return

    threads = [threading.Thread(target=drive, args=(w,)) for w in _WORKERS[: min(jobs, len(tasks))]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [a for a in answers if a is not None]


def run_preprocess(
    requests: Sequence[PreprocessRequest], *, cache: PreprocessCache | None = None, jobs: int = 1
) -> list[LoweredBackendModule]:
    """Every request through its backend, in order: from `cache` where it has the result, else
    compiled (in up to `jobs` worker processes when more than one partition needs compiling and
    the backend can be sent to one; the results are the same as a serial run's)."""
    return [c.module for c in run_preprocess_timed(requests, cache=cache, jobs=jobs)]


def run_preprocess_timed(
    requests: Sequence[PreprocessRequest], *, cache: PreprocessCache | None = None, jobs: int = 1
) -> list[Compiled]:
    """`run_preprocess`, also saying for each request whether the cache had it and how long it took."""
    if jobs < 1:
        raise BackendPreprocessError(f"jobs must be at least 1, got {jobs}")
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
    if jobs > 1 and len(todo) > 1:
        for i in todo:
            r = requests[i]
            data = snapshot.dumps(r.program, format="msgpack", include_data=True, include_stack_traces=True)
            try:
                task = pickle.dumps((backends[i], r.backend_id, data, r.compile_specs, r.tag),
                                    protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # a backend defined in a function cannot travel: it runs here
                continue
            parallel.append((i, (task, f"partition '{r.tag}' ({r.backend_id})")))
    sent = {i for i, _ in parallel}
    for i in todo:
        if i not in sent:
            start = time.perf_counter()
            results[i] = share_state_payloads(_preprocess(backends[i], requests[i]), requests[i].program)
            seconds[i] = time.perf_counter() - start
    if parallel:
        for (i, _), (ok, payload, took) in zip(parallel, _in_workers([t for _, t in parallel], jobs)):
            seconds[i] = took
            if not ok:
                raise BackendPreprocessError(str(payload))
            assert isinstance(payload, bytes)
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
        )
        modules.append(Compiled(module=module, cache_hit=i not in todo, seconds=seconds[i]))
    return modules
