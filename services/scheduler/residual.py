"""Core (pure): the matcher's residual graph, shared by `tpuq.scheduler.plan` (a job's augmenting path) and
`tpuq.scheduler.plan_gangs` (freeing slices of one class for a multislice job).

Nodes are signatures (jobs with the same constraints) and classes (interchangeable idle TPUs). Edges: signature ->
each compatible class (a job may take it); class -> each signature with flow there (that job may move away). A
search ends at a class with a free TPU.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, NamedTuple


class Residual(NamedTuple):
    """The matcher's state during one pass (mutated in place)."""

    compat: list[list[int] | None]  # signature -> its compatible classes, computed when first needed
    compatible_classes: Callable[[int], list[int]]
    free: list[int]  # class -> TPUs not taken
    flow: list[dict[int, int]]  # flow[c][s]: how many jobs of signature s hold a TPU of class c
    class_dead: list[bool]  # no free TPU can be reached from it again in this pass
    sig_dead: list[bool]

    def classes_of(self, s: int) -> list[int]:
        classes = self.compat[s]
        if classes is None:
            classes = self.compat[s] = self.compatible_classes(s)
        return classes


def shortest_path(r: Residual, queue: deque[int], reached_from_class: dict[int, int],
                  avoid: int = -1) -> tuple[int, dict[int, int]]:
    """Breadth-first from the signatures in `queue` (already in `reached_from_class`: signature -> the class its
    moved job leaves), never into class `avoid`: (the class with a free TPU it ends at, or -1; class -> the
    signature whose job would move into it). `reached_from_class` is filled in as it goes."""
    reached_from_sig: dict[int, int] = {}
    free, flow, class_dead, sig_dead = r.free, r.flow, r.class_dead, r.sig_dead
    while queue:
        s = queue.popleft()
        for c in r.classes_of(s):
            if c == avoid or class_dead[c] or c in reached_from_sig:
                continue
            reached_from_sig[c] = s
            if free[c] > 0:
                return c, reached_from_sig
            for holder, count in flow[c].items():
                if count > 0 and holder not in reached_from_class and not sig_dead[holder]:
                    reached_from_class[holder] = c
                    queue.append(holder)
    return -1, reached_from_sig
