"""Memory planning for .pte methods: lifetime intervals packed into one arena (greedy or naive)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from texir.errors import PteError

__all__ = [
    "Interval",
    "MemoryPlan",
    "MemoryPlanError",
    "PlannerName",
    "align_up",
    "check_plan",
    "plan_greedy",
    "plan_memory",
    "plan_naive",
]

PlannerName = Literal["greedy", "naive"]


class MemoryPlanError(PteError):
    """A memory plan is invalid (two live tensors overlap, or a tensor leaves the arena)."""


class Interval(msgspec.Struct, frozen=True):
    """A tensor to place: `size` bytes, live from node index `start` to `end` inclusive."""

    size: int
    start: int
    end: int


class MemoryPlan(msgspec.Struct, frozen=True):
    """`offsets[i]` is where `intervals[i]` lives; `total` is the arena size in bytes."""

    offsets: tuple[int, ...]
    total: int


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def plan_naive(intervals: Sequence[Interval], *, alignment: int = 16) -> MemoryPlan:
    """One slot per tensor, no reuse."""
    offsets = []
    total = 0
    for interval in intervals:
        offsets.append(total)
        total += align_up(interval.size, alignment)
    return MemoryPlan(offsets=tuple(offsets), total=total)


class _SharedObject:
    """A region whose tensors are stacked: `tops[t]` is the highest byte used at time t, `live[t]`
    how many of its tensors (empty ones included) are live at time t."""

    __slots__ = ("size", "tops", "live", "lo")

    def __init__(self, lo: int, hi: int) -> None:
        self.size = 0
        self.lo = lo
        self.tops = [0] * (hi - lo + 1)
        self.live = [0] * (hi - lo + 1)

    def free(self, start: int, end: int) -> bool:
        return not any(self.live[start - self.lo:end - self.lo + 1])

    def highest(self, start: int, end: int) -> int:
        return max(self.tops[start - self.lo:end - self.lo + 1])

    def place(self, start: int, end: int, top: int) -> None:
        a, b = start - self.lo, end - self.lo + 1
        self.tops[a:b] = [t if t > top else top for t in self.tops[a:b]]
        self.live[a:b] = [n + 1 for n in self.live[a:b]]


def plan_greedy(intervals: Sequence[Interval], *, alignment: int = 16) -> MemoryPlan:
    """ExecuTorch's default strategy (`memory_planning.greedy`), decision for decision: tensors by
    aligned size, largest first, equal sizes last-created first (ExecuTorch sorts its spec list
    ascending with `bisect.insort`, which keeps creation order among equals, then reverses it);
    each goes into the first shared object with no tensor live at the same time (at offset 0),
    else stacked above the tensors it overlaps inside the first object where it still fits, else
    into a new object of its size. Objects are then laid out one after another."""
    if not intervals:
        return MemoryPlan(offsets=(), total=0)
    lo = min(i.start for i in intervals)
    hi = max(i.end for i in intervals)
    sizes = [align_up(i.size, alignment) for i in intervals]
    order = sorted(range(len(intervals)), key=lambda k: (-sizes[k], -k))
    objects: list[_SharedObject] = []
    placed: list[tuple[int, int]] = [(0, 0)] * len(intervals)  # (object index, offset in object)
    for k in order:
        iv, size = intervals[k], sizes[k]
        choice: tuple[int, int] | None = None
        for index, obj in enumerate(objects):
            if obj.free(iv.start, iv.end):
                choice = (index, 0)
                break
        if choice is None:
            for index, obj in enumerate(objects):
                offset = obj.highest(iv.start, iv.end)
                if offset > 0 and offset + size <= obj.size:
                    choice = (index, offset)
                    break
        if choice is None:
            objects.append(_SharedObject(lo, hi))
            objects[-1].size = size
            choice = (len(objects) - 1, 0)
        objects[choice[0]].place(iv.start, iv.end, choice[1] + size)
        placed[k] = choice
    bases = []
    base = 0
    for obj in objects:
        bases.append(base)
        base += obj.size
    offsets = tuple(bases[index] + offset for index, offset in placed)
    return MemoryPlan(offsets=offsets, total=base)


def plan_memory(
    intervals: Sequence[Interval], *, planner: PlannerName = "greedy", alignment: int = 16
) -> MemoryPlan:
    if planner == "greedy":
        return plan_greedy(intervals, alignment=alignment)
    if planner == "naive":
        return plan_naive(intervals, alignment=alignment)
    raise MemoryPlanError(f"unknown memory planner {planner!r}; use 'greedy' or 'naive'")


def check_plan(intervals: Sequence[Interval], plan: MemoryPlan) -> None:
    """Raise `MemoryPlanError` if two tensors live at the same time share bytes, or a tensor
    ends past the arena."""
    if len(plan.offsets) != len(intervals):
        raise MemoryPlanError(
            f"memory plan has {len(plan.offsets)} offsets for {len(intervals)} tensors"
        )
    for k, (iv, off) in enumerate(zip(intervals, plan.offsets)):
        if off < 0 or off + iv.size > plan.total:
            raise MemoryPlanError(
                f"tensor {k} at [{off}, {off + iv.size}) leaves the arena of {plan.total} bytes"
            )
    # Sweep over time: a tensor only needs checking against those live when it starts.
    order = sorted(range(len(intervals)), key=lambda k: (intervals[k].start, k))
    active: list[int] = []
    for k in order:
        iv = intervals[k]
        active = [j for j in active if intervals[j].end >= iv.start]
        a0, a1 = plan.offsets[k], plan.offsets[k] + iv.size
        for j in active:
            b0, b1 = plan.offsets[j], plan.offsets[j] + intervals[j].size
            if iv.size and intervals[j].size and a0 < b1 and b0 < a1:
                raise MemoryPlanError(
                    f"tensors {j} (live {intervals[j].start}..{intervals[j].end}, bytes [{b0}, {b1})) "
                    f"and {k} (live {iv.start}..{iv.end}, bytes [{a0}, {a1})) overlap"
                )
        active.append(k)
