"""An ExecuTorch `Partitioner` as a texir partitioner: tags read back into a texir plan."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from texir.executorch.backend import compile_spec_from_executorch, register_executorch_backend
from texir.executorch.deps import require_executorch
from texir.adapters.conversion_memo import exported_program_of
from texir.executorch.edge_program import graph_modules, to_edge_exported_program
from texir.adapters.fx_export import to_exported_program
from texir.adapters.fx_import import from_exported_program
from texir.adapters.targets import canonical_target
from texir.ir import BackendNodeMeta, CallFunction, Program
from texir.lowering.errors import PartitionerError, TaggedPlaceholderError
from texir.lowering.plan import DelegationSpec, PartitionPlan
from texir.ir.analysis import node_key, walk_keyed_graphs

__all__ = ["ExecutorchPartitioner", "PartitionerModifiedGraphError", "executorch_partitioner"]

TAG_KEY = "delegation_tag"
NO_COPY_KEY = "no_copy"
"""ExecuTorch's per-constant "do not duplicate me" mark (`texir.lowering.plan.PartitionPlan.no_copy`)."""


class PartitionerModifiedGraphError(PartitionerError, AssertionError):
    """An ExecuTorch partitioner changed the graph it was shown instead of only tagging it. Also an
    AssertionError: ExecuTorch's `to_backend` asserts the same, and its callers catch that."""


def _graph_state(ep: Any) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """What a partitioner may not change: each graph's nodes in order (op, name, target, args)."""
    return [
        (path, [(n.op, n.name, n.target, n.args, n.kwargs) for n in gm.graph.nodes])
        for path, gm in graph_modules(ep.graph_module)
    ]


def _names(value: Any) -> Any:
    return torch.fx.node.map_arg(value, lambda n: n.name)


def _first_change(before: list[tuple[str, list[tuple[Any, ...]]]], ep: Any) -> str | None:
    after = _graph_state(ep)
    if [p for p, _ in before] != [p for p, _ in after]:
        return "the set of nested graphs"
    for (path, old), (_, new) in zip(before, after):
        where = f" of nested graph '{path}'" if path else ""
        if len(old) != len(new):
            return f"the number of nodes{where} ({len(old)} -> {len(new)})"
        # Compared by value, not identity: a partitioner may return a copy of the program it was shown.
        for a, b in zip(old, new):
            was, now = a[2], b[2]
            if was is not now:
                was, now = (canonical_target(x) or x for x in (was, now))
            if a[:2] != b[:2] or was != now:
                return f"node '{a[1]}'{where} (now {b[0]} '{b[1]}' of {now}, was {a[0]} of {was})"
            if (a[3] is not b[3] or a[4] is not b[4]) and (_names(a[3]), _names(a[4])) != (_names(b[3]), _names(b[4])):
                return f"the arguments of node '{a[1]}'{where}"
    return None


def _json(value: Any) -> str | None:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return None


class _WhyNotCollector(logging.Handler):
    """Keeps the reasons ExecuTorch partitioners log with `WhyNoPartition` (a DEBUG record whose
    message has `node` and `reason`), and passes every other record on as the logger would have."""

    def __init__(self, passes_from: int) -> None:
        super().__init__(logging.DEBUG)
        self.passes_from = passes_from
        self.reasons: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        node, reason = getattr(record.msg, "node", None), getattr(record.msg, "reason", None)
        if node is not None and isinstance(reason, str):  # read now: the object is reused
            self.reasons.setdefault(str(getattr(node, "name", node)), reason)
        elif record.levelno >= self.passes_from:
            logging.getLogger().handle(record)


@contextlib.contextmanager
def _why_not_partitioned() -> Iterator[dict[str, str]]:
    """While inside, ExecuTorch's loggers collect why-not reasons (node name -> reason)."""
    logger = logging.getLogger("executorch")
    collector = _WhyNotCollector(logger.getEffectiveLevel())
    level, propagate = logger.level, logger.propagate
    logger.addHandler(collector)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield collector.reasons
    finally:
        logger.removeHandler(collector)
        logger.setLevel(level)
        logger.propagate = propagate


class ExecutorchPartitioner:
    """Runs an ExecuTorch partitioner on the edge form of a texir program and returns its tags as
    a texir `PartitionPlan`; the backends it names are registered with texir lowering. Metadata the
    partitioner writes on tagged nodes for its backend (JSON-able values, e.g. XNNPACK's implicit
    q/dq tag) becomes the plan's `backend_meta`, so the sub-program carries it to `preprocess`."""

    def __init__(self, partitioner: Any) -> None:
        if not callable(getattr(partitioner, "partition", None)):
            raise PartitionerError(
                f"{type(partitioner).__name__} is not an ExecuTorch partitioner (it has no partition(ep) method)"
            )
        self.partitioner = partitioner
        self.name = type(partitioner).__name__
        self._why_not: dict[str, str] = {}
        self.transform_for_pre_decomposition: Callable[[Program], Program] | None = None
        """ExecuTorch's `transform_for_pre_decomposition` hook on texir programs, when the partitioner
        overrides it (`lower` runs it before any decomposition, as ExecuTorch does); else None."""
        if _overrides_pre_decomposition(partitioner):
            self.transform_for_pre_decomposition = self._pre_decomposition

    def __repr__(self) -> str:
        return f"executorch_partitioner({self.name})"

    def explain(self, node: CallFunction) -> str | None:
        """The reason the partitioner logged for leaving `node` out in its last run (ExecuTorch's
        `WhyNoPartition`), or None when it gave none."""
        reason = self._why_not.get(node.name)
        return f"{self.name}: {reason}" if reason else None

    def supports_op(self, node: CallFunction) -> bool:
        """Whether the partitioner supports `node`'s op: for a `ConfigerationBasedPartitioner`
        (XNNPACK's), whether it has a config for the op; for any other, whether it logged a
        `WhyNoPartition` reason for the node in its last run (it looked at the op and refused it)."""
        configs = getattr(self.partitioner, "target_partitioner_configs", None)
        if isinstance(configs, dict):
            # its configs are keyed by the op's name without namespace ('linear.default')
            return node.target.partition("::")[2] in configs
        return node.name in self._why_not

    def _pre_decomposition(self, program: Program) -> Program:
        """`program` after the partitioner's `transform_for_pre_decomposition` (on its ATen
        ExportedProgram); `program` itself when the hook left it as it was."""
        ep = to_exported_program(program)  # a fresh one: the hook may change what it is given
        try:
            out = self.partitioner.transform_for_pre_decomposition(ep)
        except Exception as exc:  # any failure of foreign code becomes one typed error
            raise PartitionerError(
                f"ExecuTorch partitioner {self.name}.transform_for_pre_decomposition raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(out, torch.export.ExportedProgram):
            raise PartitionerError(
                f"ExecuTorch partitioner {self.name}.transform_for_pre_decomposition returned "
                f"{type(out).__name__}, not an ExportedProgram"
            )
        changed = from_exported_program(out)
        return program if changed == program else changed

    def _asked(self, program: Program) -> tuple[torch.export.ExportedProgram, set[Any], Any] | None:
        """`program` as an ExportedProgram and the partitioner's `ops_to_not_decompose` of it: the op
        overloads it keeps and its node filter. None when the partitioner has no such method."""
        method = getattr(self.partitioner, "ops_to_not_decompose", None)
        if method is None:
            return None
        ep = exported_program_of(program)  # shared with the other hooks, and with lower's decomposition
        try:
            ops, node_filter = method(ep)
        except Exception as exc:  # any failure of foreign code becomes one typed error
            raise PartitionerError(
                f"ExecuTorch partitioner {self.name}.ops_to_not_decompose raised {type(exc).__name__}: {exc}"
            ) from exc
        return ep, {op for op in ops if isinstance(op, torch._ops.OpOverload)}, node_filter

    def _filtered(self, ep: torch.export.ExportedProgram, wanted: set[Any], node_filter: Any) -> list[tuple[str, Any, bool]]:
        """(node key, op, accepted) for each node of a kept op, by the partitioner's node filter."""
        verdicts = []
        for path, gm in graph_modules(ep.graph_module):
            for node in gm.graph.nodes:
                if node.op != "call_function" or node.target not in wanted:
                    continue
                key = f"{path}/{node.name}" if path else node.name
                try:
                    accepted = bool(node_filter(node))
                except Exception as exc:  # foreign code again
                    raise PartitionerError(
                        f"ExecuTorch partitioner {self.name}: its ops_to_not_decompose node filter raised "
                        f"{type(exc).__name__} on node {key!r}: {exc}"
                    ) from exc
                verdicts.append((key, node.target, accepted))
        return verdicts

    def ops_to_not_decompose(self, program: Program) -> tuple[str, ...]:
        """The ops the partitioner asks to keep whole, as canonical names. With a node filter, an op
        is kept when the filter accepts one of its nodes (`nodes_to_decompose` then names the nodes
        it turns down) or `program` holds none: a decomposition may make them (lstm's, gru's and
        rnn's cells call linear), and ExecuTorch keeps them through it, filtering the nodes it
        made afterwards."""
        asked = self._asked(program)
        if asked is None:
            return ()
        ep, wanted, node_filter = asked
        if node_filter is not None:
            verdicts = self._filtered(ep, wanted, node_filter)
            wanted = {op for _, op, ok in verdicts if ok} | (wanted - {op for _, op, _ in verdicts})
        return tuple(sorted(name for op in wanted if (name := canonical_target(op)) is not None))

    def nodes_to_decompose(self, program: Program) -> tuple[str, ...]:
        """The nodes of kept ops that the partitioner's node filter turns down, by node key: lower
        decomposes them after all, as ExecuTorch does (its check_op_support), so a linear the
        partitioner cannot take becomes ops the runtime or another partition can run."""
        asked = self._asked(program)
        if asked is None or asked[2] is None:
            return ()
        ep, wanted, node_filter = asked
        return tuple(key for key, _, ok in self._filtered(ep, wanted, node_filter) if not ok)

    def __call__(self, program: Program) -> PartitionPlan:
        require_executorch(f"the ExecuTorch partitioner {self.name}")
        ep = to_edge_exported_program(program)
        before = {
            (path, node.name): set(node.meta) for path, gm in graph_modules(ep.graph_module) for node in gm.graph.nodes
        }
        state = _graph_state(ep)
        try:
            with _why_not_partitioned() as reasons:
                result = self.partitioner.partition(ep)
            self._why_not = dict(reasons)
        except Exception as exc:  # any failure of foreign code becomes one typed error
            raise PartitionerError(
                f"ExecuTorch partitioner {self.name} raised {type(exc).__name__}: {exc}"
            ) from exc
        tagged = getattr(result, "tagged_exported_program", None)
        partition_tags = getattr(result, "partition_tags", None)
        if tagged is None or not isinstance(partition_tags, dict):
            raise PartitionerError(
                f"ExecuTorch partitioner {self.name} returned {type(result).__name__}, not a PartitionResult"
            )
        changed = _first_change(state, tagged)
        if changed is not None:
            raise PartitionerModifiedGraphError(
                f"ExecuTorch partitioner {self.name} changed {changed} of the program it was shown; a "
                "partitioner should not modify the graph module, only tag nodes (node.meta['delegation_tag']): "
                "rewrite the graph before lowering (transform_passes, or the model) instead"
            )
        user_inputs = {
            s.arg.name for s in tagged.graph_signature.input_specs if s.kind.name == "USER_INPUT"
        }
        no_copy: list[str] = []
        known = {node_key(path, n.name) for path, g in walk_keyed_graphs(program.graph) for n in g.nodes}
        tags: dict[str, str] = {}
        notes: list[BackendNodeMeta] = []
        for path, gm in graph_modules(tagged.graph_module):
            for node in gm.graph.nodes:
                tag = node.meta.get(TAG_KEY)
                if tag is None:
                    continue
                key = f"{path}/{node.name}" if path else node.name
                if node.op == "output":
                    raise TaggedPlaceholderError(
                        f"ExecuTorch partitioner {self.name} tagged the output node {key!r} with {tag!r} (output "
                        f"node {node.name} should not be tagged); only operator nodes and the parameters/buffers "
                        "they read can be delegated: untag it"
                    )
                if node.op == "placeholder" and (path or node.name in user_inputs):
                    raise TaggedPlaceholderError(
                        f"ExecuTorch partitioner {self.name} tagged placeholder {key!r} "
                        f"({'of a nested graph' if path else 'a user input'}) with {tag!r}: a placeholder node for "
                        "non-params, non-buffer, and non-tensor constants should not be tagged; tag only the "
                        "parameters, buffers and constants the delegated nodes read"
                    )
                if node.op == "placeholder" and node.meta.get(NO_COPY_KEY):
                    no_copy.append(key)
                if key not in known:
                    raise PartitionerError(
                        f"ExecuTorch partitioner {self.name} tagged node {key!r}, which is not in the program "
                        "(the partitioner added it); texir takes tags only, not graph changes"
                    )
                if tag not in partition_tags:
                    raise PartitionerError(
                        f"ExecuTorch partitioner {self.name} tagged node {key!r} with {tag!r}, which is not in "
                        f"its partition_tags ({', '.join(sorted(partition_tags)) or 'none'})"
                    )
                tags[key] = str(tag)
                for meta_key in sorted(set(node.meta) - before.get((path, node.name), set()) - {TAG_KEY}):
                    text = _json(node.meta[meta_key])
                    if text is not None:
                        notes.append(BackendNodeMeta(node=key, key=meta_key, value=text))
        specs: dict[str, DelegationSpec] = {}
        for tag, spec in partition_tags.items():
            backend_id = getattr(spec, "backend_id", None)
            if not isinstance(backend_id, str):
                raise PartitionerError(f"ExecuTorch partitioner {self.name}: partition {tag!r} has no backend_id")
            try:
                register_executorch_backend(backend_id)
            except Exception as exc:
                raise PartitionerError(
                    f"ExecuTorch partitioner {self.name}: partition {tag!r} names backend {backend_id!r}: {exc}"
                ) from exc
            specs[str(tag)] = DelegationSpec(
                backend_id=backend_id,
                compile_specs=tuple(
                    compile_spec_from_executorch(f"ExecuTorch partitioner {self.name}: partition {tag!r}", c)
                    for c in spec.compile_specs
                ),
            )
        # Partitions are lowered in the partitioner's order of partition_tags, as ExecuTorch does.
        used_tags = set(tags.values())
        used = [(tag, spec) for tag, spec in specs.items() if tag in used_tags]
        return PartitionPlan.build(tags, used, backend_meta=notes, no_copy=no_copy)


def _overrides_pre_decomposition(partitioner: Any) -> bool:
    try:  # executorch is an optional extra: imported on use
        from executorch.exir.backend.partitioner import Partitioner
    except ImportError:
        return False
    base = getattr(Partitioner, "transform_for_pre_decomposition", None)
    own = getattr(type(partitioner), "transform_for_pre_decomposition", None)
    return own is not None and own is not base


def executorch_partitioner(partitioner: Any) -> ExecutorchPartitioner:
    """A texir partitioner running the ExecuTorch partitioner `partitioner` (e.g. XnnpackPartitioner())."""
    require_executorch("executorch_partitioner")
    return ExecutorchPartitioner(partitioner)
