"""Passes for new jobs, grouped: while one instance runs a new-job pass, the jobs stored meanwhile wait for
it and are planned together by the next one (group commit), instead of one pass each.

When thousands of jobs are published at once, Pub/Sub pushes them concurrently; each push stores its job
(one write) and would then run a pass of its own, whose reads (idle TPUs, the job, the fleet entries' counts)
are the same for every job. Grouped, a burst costs one pass per group, and each push still returns only once
a pass that covered its job has ended: its acknowledgement still means "stored and planned", and a pass that
fails puts its jobs back for the next holder, so the push that fails is retried and none is lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable


class GroupedPasses:
    """One new-job pass at a time per instance, covering every job stored while the previous one ran."""

    def __init__(self) -> None:
        self._one_pass = threading.Lock()  # held for the whole pass
        self._guard = threading.Lock()  # guards `_waiting`
        self._waiting: set[str] = set()
        self.passes = 0

    def plan(self, job_ids: Iterable[str], run_pass: Callable[[list[str]], object]) -> list[str]:
        """Return once a pass that covered `job_ids` ended; returns the ids this call's own pass covered
        (empty when an earlier holder's pass covered them). Raises what `run_pass` raised."""
        mine = set(job_ids)
        with self._guard:
            self._waiting |= mine
        with self._one_pass:
            with self._guard:
                if not mine & self._waiting:
                    return []  # the pass that held the lock before ours planned them
                batch = sorted(self._waiting)
                self._waiting.clear()
            try:
                run_pass(batch)
            except BaseException:
                with self._guard:
                    self._waiting |= set(batch)  # for the next holder, or this push's retry
                raise
            self.passes += 1
            return batch
