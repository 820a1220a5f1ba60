"""When a tick runs the full scheduling pass (issue 34 §1: a quiet tick reads a few documents, however long the
queue). Core (pure) and its two small writes.

Every change that gives a pending job a place runs a pass where it happens: a job stored, a TPU freed or ACTIVE,
a job requeued, a node healthy again (`tpuq.scheduler.handlers`). What no event announces is time: a job's
retry back-off ending (`PendingJob.not_before`), an idle TPU's maintenance or health refusal lifting. So the
tick's full pass, which reads up to `PER_TYPE_EXTRA` pending jobs a type, runs only when

- the last passes left something time-bound: the earliest such instant is kept in `tick_due/scheduler`
  as `pass_due_at` (the document the tick reads for its backstops anyway: no extra read), or
- the backstop cadence says so (`Backstop.full_pass`, every $TPUQ_BACKSTOP_SECONDS): the lost-event backstop,
  for a pass an event should have run and did not (its handler failed past its retries).

A tick then checks for a pending job (one read) only when one of those holds.

The follow-up of assignments the executor has not started (`scheduling.follow_up_unstarted_assignments`, its
bound `Settings.republish_assignment_after` per job) runs the same way: when `followup_due_at` has come, the
earliest `assigned_at + after` of a job still assigned, lowered by every pass that assigns (to now + after) and
set again after each follow-up from the oldest job still assigned (one read). Absent (a state document from
before it was kept): due. An idle or quiet tick reads the state document alone: 1 read (was 3, and 64 a type
with a queue).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tpuq.contracts.documents import TpuDoc
from tpuq.runtime import guarded, tickdue
from tpuq.scheduler.backstops import backstops_due_at
from tpuq.scheduler.decide import PassSnapshot, tpu_refuses_new_job

PASS_DUE_FIELD = "pass_due_at"  # in tick_due/scheduler (tpuq.runtime.tickdue)
FOLLOWUP_DUE_FIELD = "followup_due_at"  # ditto: when the follow-up of unstarted assignments is next due


def next_pass_due(snapshot: PassSnapshot, now: datetime) -> datetime | None:
    """The earliest instant after `now` at which a pass over `snapshot` could decide otherwise with nothing else
    changing: a pending job's back-off ending; `now` itself (the next tick) while an idle TPU refuses new jobs for
    a reason that lifts with time (health, maintenance: a quarantine never lifts). None: nothing time-bound."""
    dues = [q.pending.not_before for q in snapshot.queue.jobs.values()
            if q.pending.not_before is not None and q.pending.not_before > now]
    if any(not doc.get(TpuDoc.field("quarantined")) and tpu_refuses_new_job(doc, now) is not None
           for doc in snapshot.idle_tpus):
        dues.append(now)
    return min(dues, default=None)


def pass_due(state: dict | None, now: datetime) -> bool:
    """Whether the time-bound instant the last passes recorded has come."""
    due = (state or {}).get(PASS_DUE_FIELD)
    return isinstance(due, datetime) and due <= now


def followup_due(state: dict | None, now: datetime) -> bool:
    """Whether the follow-up of unstarted assignments is due: its instant has come, or none was ever kept
    (None kept: no job is assigned)."""
    state = state or {}
    if FOLLOWUP_DUE_FIELD not in state:
        return True
    due = state[FOLLOWUP_DUE_FIELD]
    return isinstance(due, datetime) and due <= now


def tick_due_at(state: dict | None, now: datetime, every: timedelta) -> datetime:
    """The first instant at which a scheduler tick has work, given `tick_due/scheduler` as it will read
    (`tpuq.runtime.tickdue`): a backstop's turn, the follow-up's or the pass's due instant; `ALWAYS` for one due
    now."""
    state = state or {}
    followup = (tickdue.ALWAYS if FOLLOWUP_DUE_FIELD not in state
                else state[FOLLOWUP_DUE_FIELD] if isinstance(state[FOLLOWUP_DUE_FIELD], datetime) else None)
    pass_due_at = state.get(PASS_DUE_FIELD) if isinstance(state.get(PASS_DUE_FIELD), datetime) else None
    backstops = backstops_due_at(state, now, every)
    return tickdue.earliest(tickdue.of_turn(backstops), followup, pass_due_at)


def with_tick_due(stored: dict | None, fields: dict, now: datetime, every: timedelta) -> dict:
    """`fields`, written over `stored` (`tick_due/scheduler` as read), with the `due_at` they make."""
    return {**fields, tickdue.DUE_AT: tick_due_at({**(stored or {}), **fields}, now, every)}


def earlier(stored: object, due: datetime | None) -> bool:
    """Whether `due` must be recorded over `stored` by a pass that saw only part of the queue (it may lower the
    instant, never raise or clear it: another pass's jobs are still waiting for theirs)."""
    return due is not None and (not isinstance(stored, datetime) or due < stored)


# ------------------------------------------------------------------ shell


def state_ref(db):
    return tickdue.ref(db, tickdue.SCHEDULER)


def lower_dues(db, dues: dict[str, datetime | None], now: datetime, every: timedelta) -> None:
    """After an event's pass: record each of `dues` (field -> instant) that is earlier than the one kept (one
    read, and a write only then). A follow-up kept as absent is due already: not lowered."""
    dues = {f: t for f, t in dues.items() if t is not None}
    if not dues:
        return
    snap = state_ref(db).get()
    stored = (snap.to_dict() or {}) if snap.exists else {}
    fields = {f: t for f, t in dues.items()
              if earlier(stored.get(f), t) and not (f == FOLLOWUP_DUE_FIELD and f not in stored)}
    if not fields:
        return
    if not guarded.commit_if_unchanged(db, guarded.WriteSet().update(snap, with_tick_due(stored, fields, now, every))):
        lower_dues(db, dues, now, every)  # another writer meanwhile: compare with what it wrote


def replace_due(db, field: str, state: dict | None, due: datetime | None, now: datetime, every: timedelta) -> None:
    """After a tick's run that saw all there is (the whole queue; every job still assigned): `due` replaces the
    instant kept, but for one still ahead that a pass recorded meanwhile (kept if earlier). A write only when the
    value changes; guarded, so that a pass's lowering is never written over."""
    state = state or {}
    if field in state and state[field] == due:
        return
    snap = state_ref(db).get()
    stored = (snap.to_dict() or {}) if snap.exists else {}
    current = stored.get(field)
    candidates = ([due] if due is not None else []) + ([current] if isinstance(current, datetime) and current > now
                                                       else [])
    value = min(candidates, default=None)
    if not guarded.commit_if_unchanged(db, guarded.WriteSet().update(snap, with_tick_due(stored, {field: value}, now,
                                                                                          every))):
        replace_due(db, field, {}, due, now, every)
