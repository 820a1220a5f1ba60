"""Billed Firestore operations by the subscription whose handling made them (`tpuq simulate`'s
`firestore.by_subscription`): where a run's reads and writes go.

The in-memory store counts what Firestore would bill (`MemoryFirestore.billed`); this splits that count by
handling. A handling is entered and left around each push (`SimBus`'s observer), and a handler that waits
(`simulate.waits`: the claimer's fast watch) leaves its handling while it waits and enters it again when it
wakes, so the pushes that run meanwhile count their own operations. Operations made outside any handling (the
simulator's own setup: the fleet file saved at the start) count under `OUTSIDE`.

Given a CPU clock (`time.process_time`; benchmarks/bench_sim_handlings.py), the CPU seconds between the same
boundaries are counted the same way (`cpu`): what each subscription's handlings cost the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tpuq_dev.inmemory.firestore import BilledOps

OUTSIDE = "(simulator)"


class OpsBySubscription:
    def __init__(self, billed: BilledOps, cpu_clock: Callable[[], float] | None = None) -> None:
        self._billed = billed  # the store's own counter, read at each boundary
        self._mark = (billed.reads, billed.writes, billed.deletes)  # its counts at the last boundary
        self._handling: list[str] = []  # the subscriptions being handled, innermost last
        self.by: dict[str, BilledOps] = {}
        self._cpu_clock = cpu_clock
        self._cpu_mark = cpu_clock() if cpu_clock is not None else 0.0
        self.cpu: dict[str, float] = {}  # subscription -> CPU seconds of its handlings (with a cpu_clock)

    def _flush(self) -> None:
        """Count what the store billed since the last boundary to the handling in progress (called twice a push:
        plain integers, and nothing counted when nothing was billed)."""
        if self._cpu_clock is not None:
            now, label = self._cpu_clock(), self._handling[-1] if self._handling else OUTSIDE
            self.cpu[label] = self.cpu.get(label, 0.0) + now - self._cpu_mark
            self._cpu_mark = now
        billed, (reads, writes, deletes) = self._billed, self._mark
        if billed.reads != reads or billed.writes != writes or billed.deletes != deletes:
            label = self._handling[-1] if self._handling else OUTSIDE
            ops = self.by.get(label)
            if ops is None:
                ops = self.by[label] = BilledOps()
            ops.reads += billed.reads - reads
            ops.writes += billed.writes - writes
            ops.deletes += billed.deletes - deletes
            self._mark = (billed.reads, billed.writes, billed.deletes)

    @contextmanager
    def handling(self, subscription: str) -> Iterator[None]:
        self._flush()
        self._handling.append(subscription)
        try:
            yield
        finally:
            self._flush()
            self._handling.pop()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The handler in progress waits: what runs meanwhile is not its."""
        self._flush()
        label = self._handling.pop() if self._handling else None
        try:
            yield
        finally:
            self._flush()
            if label is not None:
                self._handling.append(label)

    def add(self, subscription: str, ops: BilledOps) -> None:
        """Operations counted without running (a quiet tick skipped, counted as its last handling's)."""
        self.by.setdefault(subscription, BilledOps()).add(ops)

    def per_day(self, days: float, extra_writes: dict[str, int] | None = None) -> dict[str, dict[str, float]]:
        """subscription -> reads, writes, deletes and reads/writes a day, the largest reader first.
        `extra_writes`: writes estimated rather than run (the executor's probes), by subscription."""
        self._flush()
        extra = extra_writes or {}
        totals = {name: (ops.reads, ops.writes + extra.get(name, 0), ops.deletes)
                  for name, ops in self.by.items()}
        for name, writes in extra.items():
            totals.setdefault(name, (0, writes, 0))
        rows = sorted(totals.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
        return {name: {"reads": reads, "writes": writes, "deletes": deletes, "reads_per_day": round(reads / days, 1),
                       "writes_per_day": round(writes / days, 1)}
                for name, (reads, writes, deletes) in rows if reads or writes or deletes}


def top_readers_text(by_subscription: dict[str, dict[str, float]], count: int = 4) -> str:
    """The largest readers, as one line of the text report: `scheduler-ticks 95k, claimer-ticks 30k, ...`."""
    def short(n: float) -> str:
        return f"{n / 1000:.0f}k" if n >= 10_000 else f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"

    rows = list(by_subscription.items())[:count]
    return ", ".join(f"{name} {short(row['reads_per_day'])}" for name, row in rows) or "–"
