"""Whether a claimer tick may stop at one read (issue 34 §1: a tick with nothing due reads ~1 document).

A tick watches a fleet's open requests and live queued resources; with neither there is nothing to watch. That
answer is kept in `tick_due/claimer:{fleet}` (`quiet`, with the `due_at` it makes: `tpuq.runtime.tickdue`, which
routes a tick to the claimer only when a fleet's is due), so an idle fleet's tick reads that one document instead of
the two queries that find nothing.

- A tick whose queries find nothing marks the fleet idle, conditioned on the version of the mark it read first:
  a writer that marked it busy meanwhile wins.
- Every claimer handling that writes an open request or creates a queued resource marks the fleet busy after
  those writes (`StateWriter.opened`; one write per such handling, none for the updates of a busy fleet's
  records): a tick whose queries ran before the write and marks idle after it is overwritten, one that marks
  idle before it is not guarded on the busy mark. Only the claimer writes requests and queued resources (the
  CLI's `tpuq fleet retry` writes targets and the status, which matter only to an open request).
- While a tick here last found the fleet busy, the next one runs its queries without reading the mark; the tick
  whose queries first find nothing reads the mark and runs them again before marking it idle (the guard must be
  the mark as read before the queries).
- An instance whose last tick read every fleet's mark and found each idle remembers until when the first may
  stop (`quiet_until`; `tpuq.runtime.cadence.TickMemory`): until then a tick asks only whether any mark says busy
  (`any_fleet_busy`, one query: one read for the deployment), not for the fleets and their marks. A fleet with
  `existing:` entries is never remembered idle (its nodes are read on every tick); a fleet applied comes with a
  nudge (`tpuq fleet apply`), which reads every fleet; the grant's notices, told by a tick that reads the fleet,
  wait at most until that instant.
- The lost-event backstop (a handler that died between its writes and its mark): a tick runs the two queries
  again whatever the mark says once the backstop cadence has passed since they last found the fleet idle
  ($TPUQ_BACKSTOP_SECONDS, `tpuq.runtime.cadence.is_due` on the mark's `at`, which that tick writes again): one
  check a cadence for the deployment, whatever instance makes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from google.cloud.firestore import FieldFilter

from tpuq.contracts import store
from tpuq.runtime import guarded, tickdue
from tpuq.runtime.cadence import due_at, is_due

IDLE_FIELD = "quiet"  # no open request and no live queued resource when `at` was written
AT_FIELD = "at"  # when the mark was last written: idle, when the queries last found nothing (the backstop's)


@dataclass(frozen=True)
class TickCheck:
    """What a tick's queries last found on this instance (kept in its memory, per fleet)."""

    idle: bool  # no open request, no live queued resource


def read_mark_first(last: TickCheck | None) -> bool:
    """Whether a tick reads the mark before its queries: not while this instance's last tick found the fleet busy
    (the queries run anyway; the mark would be one read more on every busy tick)."""
    return last is None or last.idle


def tick_may_stop(mark: dict | None, now: datetime, every: timedelta) -> bool:
    """True: the fleet is marked idle and the backstop check is not due (`AT_FIELD`: when the queries last found
    it idle)."""
    mark = mark or {}
    return mark.get(IDLE_FIELD) is True and not is_due(mark.get(AT_FIELD), now, every)


def quiet_until(mark: dict | None, now: datetime, every: timedelta) -> datetime | None:
    """For a fleet whose tick may stop at `mark`: until when it may (None: it may not, now)."""
    return due_at((mark or {}).get(AT_FIELD), now, every) if tick_may_stop(mark, now, every) else None


# ------------------------------------------------------------------ shell


def _ref(db, fleet: str):
    return tickdue.ref(db, tickdue.claimer_doc_id(fleet))


def read_mark(db, fleet: str):
    """The fleet's mark (one read)."""
    return _ref(db, fleet).get()


def mark_idle(db, seen, now: datetime, every: timedelta, watch_always: bool = False) -> bool:
    """Mark the fleet idle unless the mark changed since `seen` (its snapshot before the tick's queries).
    `watch_always`: its ticks have work all the same (the fleet's `existing:` nodes are read on every tick)."""
    mark = idle_mark(now)
    due = tickdue.ALWAYS if watch_always else quiet_until(mark, now, every)
    return guarded.commit_if_unchanged(db, guarded.WriteSet().update(seen, {**mark, tickdue.DUE_AT: due}))


def idle_mark(now: datetime) -> dict:
    """The mark of a fleet whose queries found nothing at `now`."""
    return {IDLE_FIELD: True, AT_FIELD: now}


def any_fleet_busy(db) -> bool:
    """Whether any fleet's mark says busy (one read when none does): what a tick of an instance that remembers
    every fleet idle asks (`tpuq.runtime.cadence.TickMemory`)."""
    query = db.collection(store.TICK_DUE).where(filter=FieldFilter(IDLE_FIELD, "==", False)).limit(1)
    return any(True for _ in query.stream())


def mark_busy(db, fleet: str, now: datetime) -> None:
    """A request or queued resource may be open or live: the next tick runs its queries."""
    _ref(db, fleet).set({IDLE_FIELD: False, AT_FIELD: now, tickdue.DUE_AT: tickdue.ALWAYS})
