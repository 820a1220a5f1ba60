"""When an executor tick judges the running attempts again (issue 34 §1: a quiet tick reads one document).

An attempt's end is noticed by event: its workers' status objects (`/push/gcs-status`). A tick is for what no
event brings, and reads `tick_due/executor`, one document, to know whether any of it is due (every write of it
also writes `due_at`, the first instant one is: `tpuq.runtime.tickdue`, which routes the tick here only then):

- a decision deferred to a time (`outcome.Wait.until`: a worker failed, the others get a grace): the earliest
  such instant is kept as `judge_at`, lowered by whichever handler deferred it;
- the lost-event backstop (a status event lost; a node turned unhealthy while probing is off): every running
  attempt is judged again on the shared cadence (`tpuq.runtime.cadence.is_due`, $TPUQ_BACKSTOP_SECONDS), claimed by
  one guarded write of `sweep_at` so that every instance agrees;
- the workers' probes (`Settings.executor_probe_every`), when probing is on: each running attempt's record is
  read to probe it, with its nodes' recorded health (every slice's), and it is judged only when the probe or that
  health finds something (a node turned unhealthy brings the executor no event).

With none of these, the tick stops at that one read (it read every running attempt and its TPU before: two
documents an attempt a minute).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from tpuq.runtime import guarded, tickdue
from tpuq.runtime.cadence import due_at, is_due

SWEEP_AT = "sweep_at"  # when the last judging of every running attempt was claimed
JUDGE_AT = "judge_at"  # the earliest deferred decision's time (None: none deferred)


def sweep_due(state: dict | None, now: datetime, every: timedelta) -> bool:
    return is_due((state or {}).get(SWEEP_AT), now, every)


def judge_due(state: dict | None, now: datetime) -> bool:
    at = (state or {}).get(JUDGE_AT)
    return isinstance(at, datetime) and at <= now


def earlier(stored: object, at: datetime | None) -> bool:
    return at is not None and (not isinstance(stored, datetime) or at < stored)


@dataclass(frozen=True)
class TickDue:
    """What makes the executor's `due_at`: the sweep's cadence, and whether its ticks probe the workers (then
    every tick has work)."""

    every: timedelta
    probing: bool = False

    def at(self, state: dict | None, now: datetime) -> datetime:
        if self.probing:
            return tickdue.ALWAYS
        state = state or {}
        judge = state.get(JUDGE_AT) if isinstance(state.get(JUDGE_AT), datetime) else None
        # A sweep overdue (never claimed since) is due now, whatever judgement waits later.
        return tickdue.earliest(tickdue.of_turn(due_at(state.get(SWEEP_AT), now, self.every)), judge)

    def fields(self, stored: dict | None, fields: dict, now: datetime) -> dict:
        """`fields`, written over `stored` (as read), with the `due_at` they make."""
        return {**fields, tickdue.DUE_AT: self.at({**(stored or {}), **fields}, now)}


# ------------------------------------------------------------------ shell


def state_ref(db):
    return tickdue.ref(db, tickdue.EXECUTOR)


def lower_judge_at(db, at: datetime | None, due: TickDue, now: datetime) -> None:
    """A decision deferred to `at` by a handler that judged one attempt: record it if earlier than the one kept."""
    if at is None:
        return
    snap = state_ref(db).get()
    stored = (snap.to_dict() or {}) if snap.exists else {}
    if not earlier(stored.get(JUDGE_AT), at):
        return
    if not guarded.commit_if_unchanged(db, guarded.WriteSet().update(snap, due.fields(stored, {JUDGE_AT: at}, now))):
        lower_judge_at(db, at, due, now)  # another writer meanwhile: compare with what it wrote


def replace_judge_at(db, state: dict | None, at: datetime | None, now: datetime, due: TickDue) -> None:
    """After a tick judged every running attempt: `at`, the earliest deferral it met, replaces the instants that
    have come (it judged those); one still ahead, recorded by a handler meanwhile, is kept. `state`: the document
    as the tick read it (no read again unless it must change)."""
    stored = (state or {}).get(JUDGE_AT)
    ahead = stored if isinstance(stored, datetime) and stored > now else None
    value = min((t for t in (at, ahead) if t is not None), default=None)
    if value == stored:
        return
    snap = state_ref(db).get()
    read = (snap.to_dict() or {}) if snap.exists else {}
    current = read.get(JUDGE_AT)
    if current != stored:  # a handler recorded one meanwhile: keep whichever is earlier
        value = min((t for t in (value, current) if isinstance(t, datetime) and t > now), default=value)
    if not guarded.commit_if_unchanged(db, guarded.WriteSet().update(snap, due.fields(read, {JUDGE_AT: value}, now))):
        replace_judge_at(db, state | {JUDGE_AT: current} if state else {JUDGE_AT: current}, at, now, due)
