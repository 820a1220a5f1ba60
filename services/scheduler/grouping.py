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


class CoveringPasses:
    """Whole-queue passes, one at a time per instance; a request is answered by any pass that began after it.

    When several slices free up at once, each freeing push asked for a pass of its own, and the passes, running
    together, read the same head of the queue and offered the same jobs to the same idle TPUs: all but one lost
    every pair and planned again on fresh reads (on the local stack, 286 lost pairs for 308 assignments in a
    300-job burst). A pass that begins after a request was made reads everything that request's change wrote
    (it was committed before the request asked), so that request needs no pass of its own: while one pass
    runs, the requests made meanwhile wait, and the next pass covers all of them, with the jobs they name. Each
    request still returns only once a pass covering it has ended, and one that fails covers nothing (each
    waiting request then runs its own), so an acknowledgement still means "planned"."""

    def __init__(self) -> None:
        self._one_pass = threading.Lock()  # held for the whole pass
        self._guard = threading.Lock()  # guards the counters and `_waiting`
        self._asked = 0  # requests made so far, numbered
        self._covered = 0  # every request up to this number was covered by a pass that ended
        self._waiting: set[str] = set()  # jobs named by requests not covered yet
        self.passes = 0

    def run(self, job_ids: Iterable[str], run_pass: Callable[[list[str]], object]) -> bool:
        """Return once a pass that began after this call ended (True: this call ran it). Raises what
        `run_pass` raised."""
        with self._guard:
            self._asked += 1
            mine = self._asked
            self._waiting |= set(job_ids)
        with self._one_pass:
            with self._guard:
                if self._covered >= mine:
                    return False
                covers, batch = self._asked, sorted(self._waiting)
                self._waiting.clear()
            try:
                run_pass(batch)
            except BaseException:
                with self._guard:
                    self._waiting |= set(batch)
                raise
            with self._guard:
                self._covered = max(self._covered, covers)
            self.passes += 1
            return True
