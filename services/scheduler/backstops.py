"""When the tick's backstops for lost events run: core (pure, no I/O).

Three of the scheduler tick's backstops look for what a lost event left behind: a slice the claimer recorded
ACTIVE with no `tpus/{node}` record (its ACTIVE event lost), a job still on a TPU whose attempt the executor
recorded as ended (its `ended` event lost), a TPU still in service whose queued resource the claimer recorded
SUSPENDED, FAILED or GONE (that event lost). Each reads every live slice or every running job, so run on every
tick they cost reads in proportion to what exists, to catch events that are rarely lost. They run on a cadence
instead (`Settings.backstop_every`: $TPUQ_BACKSTOP_SECONDS, 15 minutes; the chaos soak's stack, whose
ticks come every second, shortens it): a lost event is caught within minutes, not seconds.

The cadence is recorded in one document, `tick_due/scheduler` (`{backstop}_at`: when it last ran), so
that every scheduler instance agrees: a tick reads it (one read), `decide_backstops` says which are due, and
the tick claims those with one guarded write of their new times (`tpuq.runtime.guarded`). Of two instances
handling ticks at once one claim wins and the other runs none of them; an extra tick (the dashboard's "re-plan")
runs no backstop early. A claimed run that fails is not run again before its next turn (the tick's redelivery
finds it claimed): a lost event then waits one more period.

Bounds (tests/scheduler/test_backstop_cadence.py drops each event and checks them): a lost ACTIVE is recorded
within the cadence + a tick of the claimer's record; a lost `ended` or slice-lost event is applied within
`scheduling.RECONCILE_AFTER` (the time its event may still be on its way) + the cadence + a tick. The fourth
backstop, for an assignment the executor never started, runs on every tick as before: one indexed query, one
read when nothing is late, and its own bound (Settings.republish_assignment_after) is counted per job.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import Enum

from tpuq.runtime.cadence import due_at, is_due


class Backstop(str, Enum):
    """The backstops that run on a cadence; the value names the field `{value}_at` of the state document."""

    active_slices = "active_slices"  # a lost ACTIVE fleet event
    ended_attempts = "ended_attempts"  # a lost attempt `ended` event
    lost_slices = "lost_slices"  # a lost SUSPENDED / FAILED / GONE fleet event
    full_pass = "full_pass"  # a pass an event should have run and did not (tpuq.scheduler.passdue)

    @property
    def field(self) -> str:
        return f"{self.value}_at"


def decide_backstops(state: dict | None, now: datetime, every: timedelta) -> list[Backstop]:
    """The backstops due at `now`, each run every `every`, in the order the tick runs them, given the state
    document as read (None: absent, so every one is due). A last run recorded further ahead than a period (a
    clock set wrong) is due."""
    state = state or {}
    return [backstop for backstop in Backstop if is_due(state.get(backstop.field), now, every)]


def backstops_due_at(state: dict | None, now: datetime, every: timedelta) -> datetime | None:
    """The first instant at which one of the backstops is due (None: one is, now)."""
    state = state or {}
    dues = [due_at(state.get(backstop.field), now, every) for backstop in Backstop]
    return None if any(d is None for d in dues) else min(dues)  # type: ignore[type-var]


def claimed(due: list[Backstop], now: datetime) -> dict[str, datetime]:
    """The state document's fields that claim the runs of `due` at `now`."""
    return {backstop.field: now for backstop in due}
