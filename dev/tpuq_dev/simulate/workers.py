"""The slices' hosts as a model: each attempt's setup and work, its checkpoints, and what a stop loses.

Both policies start and stop attempts here, so useful work and lost work are counted one way for all of them.
An attempt is keyed by (job, attempt number): starting it again is a no-op (Pub/Sub delivers at least once).
Work ends `setup_seconds + remaining work` after the start; the end is announced through `on_end` unless a stop
(a preemption, a cancel, the node's deletion) came first. A stop keeps the work up to the last checkpoint.
A multislice attempt runs on several nodes at once (`AttemptRun.nodes`): any one of them going stops it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from .events import EventLoop
from .workload import SimJob


class RunEnd(str, Enum):
    finished = "finished"
    preempted = "preempted"  # the node was preempted, or went away
    stopped = "stopped"  # cancelled, or stopped by the policy


@dataclass
class AttemptRun:
    job_id: str
    attempt: int
    node: str  # the node's full name
    chips: int
    started_at: float
    setup_seconds: float
    progress_at_start: float  # work seconds already kept from earlier attempts
    ends_at: float  # when the work would be done
    ended_at: float | None = None
    end: RunEnd | None = None
    kept_seconds: float = 0.0  # work this attempt added to what is kept
    lost_seconds: float = 0.0  # work it did that a stop threw away
    nodes: tuple[str, ...] = ()  # a multislice attempt's nodes, slice order (`node` is slice 0); (): `node` alone

    @property
    def all_nodes(self) -> tuple[str, ...]:
        """Every node the attempt runs on (its chips are `chips`, summed over them)."""
        return self.nodes or (self.node,)

    @property
    def work_start(self) -> float:
        return self.started_at + self.setup_seconds


@dataclass
class SimWorkers:
    loop: EventLoop
    jobs: dict[str, SimJob]
    setup_seconds: float = 30.0
    on_end: Callable[[AttemptRun], None] = lambda run: None
    before_end: Callable[[], None] = lambda: None  # bring the cloud up to date first (a preemption may come first)
    runs: list[AttemptRun] = field(default_factory=list)
    progress: dict[str, float] = field(default_factory=dict)  # job -> work seconds kept
    done: set[str] = field(default_factory=set)
    _running: dict[tuple[str, int], AttemptRun] = field(default_factory=dict)
    _by_node: dict[str, set[tuple[str, int]]] = field(default_factory=dict)

    def start(self, job_id: str, attempt: int, node: str | tuple[str, ...], chips: int) -> AttemptRun:
        """`node`: the node, or a multislice attempt's nodes in slice order; `chips`: over all of them."""
        key = (job_id, attempt)
        if key in self._running:
            return self._running[key]
        job = self.jobs[job_id]
        now = self.loop.now()
        kept = self.progress.get(job_id, 0.0)
        nodes = (node,) if isinstance(node, str) else tuple(node)
        run = AttemptRun(job_id, attempt, nodes[0], chips, now, self.setup_seconds, kept,
                         ends_at=now + self.setup_seconds + max(0.0, job.work_seconds - kept),
                         nodes=nodes if len(nodes) > 1 else ())
        self.runs.append(run)
        self._running[key] = run
        for each in nodes:
            self._by_node.setdefault(each, set()).add(key)
        self.loop.at(run.ends_at, self._finish, key, run)
        return run

    def running(self, job_id: str, attempt: int) -> AttemptRun | None:
        return self._running.get((job_id, attempt))

    def on_node(self, node: str) -> list[AttemptRun]:
        return [self._running[k] for k in sorted(self._by_node.get(node, ()))]

    def _finish(self, key: tuple[str, int], run: AttemptRun) -> None:
        self.before_end()
        if self._running.get(key) is not run:
            return  # stopped before its work was done
        job = self.jobs[run.job_id]
        run.kept_seconds = job.work_seconds - run.progress_at_start
        self.progress[run.job_id] = job.work_seconds
        self.done.add(run.job_id)
        self._close(key, run, RunEnd.finished, run.ends_at)
        self.on_end(run)

    def stop(self, job_id: str, attempt: int, at: float, end: RunEnd = RunEnd.stopped) -> AttemptRun | None:
        """End a running attempt at `at` (not after now: a preemption is learned after it happened)."""
        key = (job_id, attempt)
        run = self._running.get(key)
        if run is None:
            return None
        at = min(max(at, run.started_at), self.loop.now(), run.ends_at)
        done = max(0.0, at - run.work_start)
        reached = run.progress_at_start + done
        ckpt = self.jobs[job_id].checkpoint_seconds
        kept = math.floor(reached / ckpt) * ckpt if ckpt else 0.0
        kept = max(kept, run.progress_at_start) if ckpt else 0.0
        run.kept_seconds = max(0.0, kept - run.progress_at_start)
        run.lost_seconds = max(0.0, reached - kept) if ckpt else reached
        self.progress[job_id] = kept
        self._close(key, run, end, at)
        return run

    def node_gone(self, node: str, at: float, end: RunEnd = RunEnd.preempted) -> list[AttemptRun]:
        return [r for r in (self.stop(j, a, at, end) for j, a in sorted(self._by_node.get(node, ()))) if r]

    def _close(self, key: tuple[str, int], run: AttemptRun, end: RunEnd, at: float) -> None:
        run.end, run.ended_at = end, at
        del self._running[key]
        for node in run.all_nodes:
            self._by_node.get(node, set()).discard(key)
