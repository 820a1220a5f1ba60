"""When an executor tick judges the running attempts again (issue 34 §1: a quiet tick reads one document).

An attempt's end is noticed by event: its workers' status objects (`/push/gcs-status`). A tick is for what no
event brings, and reads `executor_ticks/state`, one document, to know whether any of it is due:

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

from datetime import datetime, timedelta

from tpuq.contracts import store
from tpuq.runtime.cadence import is_due
from tpuq.runtime import guarded

STATE_DOC = "state"  # executor_ticks/state
SWEEP_AT = "sweep_at"  # when the last judging of every running attempt was claimed
JUDGE_AT = "judge_at"  # the earliest deferred decision's time (None: none deferred)


def sweep_due(state: dict | None, now: datetime, every: timedelta) -> bool:
    return is_due((state or {}).get(SWEEP_AT), now, every)


def judge_due(state: dict | None, now: datetime) -> bool:
    at = (state or {}).get(JUDGE_AT)
    return isinstance(at, datetime) and at <= now


def earlier(stored: object, at: datetime | None) -> bool:
    return at is not None and (not isinstance(stored, datetime) or at < stored)


# ------------------------------------------------------------------ shell


def state_ref(db):
    return db.collection(store.EXECUTOR_TICKS).document(STATE_DOC)


def lower_judge_at(db, at: datetime | None) -> None:
    """A decision deferred to `at` by a handler that judged one attempt: record it if earlier than the one kept."""
    if at is None:
        return
    snap = state_ref(db).get()
    if not earlier((snap.to_dict() or {}).get(JUDGE_AT) if snap.exists else None, at):
        return
    if not guarded.commit_if_unchanged(db, guarded.WriteSet().update(snap, {JUDGE_AT: at})):
        lower_judge_at(db, at)  # another writer meanwhile: compare with what it wrote


def replace_judge_at(db, state: dict | None, at: datetime | None, now: datetime) -> None:
    """After a tick judged every running attempt: `at`, the earliest deferral it met, replaces the instants that
    have come (it judged those); one still ahead, recorded by a handler meanwhile, is kept. `state`: the document
    as the tick read it (no read again unless it must change)."""
    stored = (state or {}).get(JUDGE_AT)
    ahead = stored if isinstance(stored, datetime) and stored > now else None
    value = min((t for t in (at, ahead) if t is not None), default=None)
    if value == stored:
        return
    snap = state_ref(db).get()
    current = (snap.to_dict() or {}).get(JUDGE_AT) if snap.exists else None
    if current != stored:  # a handler recorded one meanwhile: keep whichever is earlier
        value = min((t for t in (value, current) if isinstance(t, datetime) and t > now), default=value)
    if not guarded.commit_if_unchanged(db, guarded.WriteSet().update(snap, {JUDGE_AT: value})):
        replace_judge_at(db, state | {JUDGE_AT: current} if state else {JUDGE_AT: current}, at, now)
