"""The scheduler's notifications (issue 36 §3, tpuq.contracts.notify): a job or group ended, a preemption and its
retry, a job pending too long. Core (pure) first, then the shell that publishes them.

Each notice is a function of the job's document as the handler's commit left it (and the clock): a redelivered
event that finds the job already in the state its first delivery produced publishes the same notice, with the same
event id, again, and the sender (the janitor) delivers each (event id, destination) once. So a crash between the
commit and the publish loses nothing.

- ended: every path that makes a job terminal calls `Teller.ended` with the job's terminal document (an attempt's
  end, a node lost, an attempt never started, a cancel of a pending job, a dependency never met, a job the pass
  rejects). A task of a group (`group`) is told of as the group: once, when its last task ends (`Teller._group`:
  one count query per task end, a few more reads at the group's end). `rejected` is told as `failed`.
- preempted: with whether it is retried (and where: its region, where its checkpoints are) or out of budget.
- pending: by the pass, on the pending jobs it already read (no read of its own), once per pending spell and
  destination threshold (`pending_notice` in the job: one write when a notice goes out). A job waiting for its
  dependencies or for a place in its group (`%K`) waits by design and is not told of.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from google.cloud.firestore import FieldFilter

from tpuq.contracts import store
from tpuq.contracts.basics import format_duration
from tpuq.contracts.documents import TERMINAL_JOB_STATES, JobDoc, JobState
from tpuq.contracts.errors import Permanent
from tpuq.runtime.fleetstore import fleet_or_none
from tpuq.contracts.notify import (ENDED_EVENTS, LAST_LINES, MAX_TEXT, Destination, Notification, NotifyEvent,
                                   destinations_for, event_id)
from tpuq.scheduler import grouplimit

log = logging.getLogger("tpuq.scheduler")

Doc = Mapping[str, Any]

_EVENT_OF_STATE = {JobState.succeeded: NotifyEvent.succeeded, JobState.failed: NotifyEvent.failed,
                   JobState.cancelled: NotifyEvent.cancelled, JobState.rejected: NotifyEvent.failed}
# The executor's detail of a failed attempt (tpuq.executor.outcome): "<what failed>\nlast lines of worker N:\n<tail>".
_LAST_LINES_RE = re.compile(r"\nlast lines of worker (\d+):\n")
_EXIT_RE = re.compile(r"\bexited (\d+)")
_LINE_CHARS = 500  # one log line, as shown
NAMED_TASKS = 10  # the failed tasks a group's notice names (read: at most this many documents)
_UNFINISHED = [JobState.pending.value, JobState.assigned.value, JobState.running.value]


# ------------------------------------------------------------------------------------------------------ core


def job_notify(job: Doc) -> list[Destination]:
    """The destinations the job's spec names (a group's tasks carry the group's); an unreadable one is skipped."""
    out = []
    for raw in ((job.get("spec") or {}).get("notify") or []):
        try:
            out.append(Destination.model_validate(raw))
        except ValueError as e:
            log.warning("job %s: a notify destination is unreadable: %s", job.get("id"), e)
    return out


def split_reason(reason: str | None) -> tuple[str, list[str]]:
    """A job's reason -> (what happened, the failing worker's last lines), as the executor's detail holds them."""
    text = reason or ""
    m = _LAST_LINES_RE.search(text)
    if not m:
        return text, []
    lines = [line[-_LINE_CHARS:] for line in text[m.end():].rstrip("\n").splitlines()[-LAST_LINES:]]
    return text[:m.start()], lines


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _fields(view: JobDoc) -> dict[str, str]:
    facts = {"state": view.state.value, "attempts": str(view.attempts), "zone": view.zone, "region": view.region,
             "preemptions": str(view.preemptions) if view.preemptions else None, "group": view.group}
    return {k: v for k, v in facts.items() if v}


def _title_suffix(state: JobState, head: str) -> str:
    if state is not JobState.failed:
        return ""
    if head.startswith("timed out after"):
        return " (" + head.split(" (max_duration)", 1)[0] + ")"
    m = _EXIT_RE.search(head)
    return f" (exit {m.group(1)})" if m else ""


def ended_notice(job: Doc, fleet_notify: list[Destination] | None, now: datetime) -> Notification | None:
    """A job's terminal document -> its `succeeded` / `failed` / `cancelled` notice (None: not terminal, nobody
    asked, or a task of a group: the group is told of as a whole, `group_notice`)."""
    view = JobDoc.from_doc(job)
    event = _EVENT_OF_STATE.get(view.state)
    if event is None or view.group:
        return None
    destinations = destinations_for(event, job_notify(job), fleet_notify)
    if not destinations:
        return None
    head, lines = split_reason(view.reason)
    title = f"{view.id} {view.state.value}" + _title_suffix(view.state, head)
    return Notification(event_id=event_id(event, view.id), event=event, subject=view.id, title=_clip(title, 300),
                        text=_clip(head, MAX_TEXT), lines=lines if view.state is JobState.failed else [],
                        fields=_fields(view), destinations=destinations, at=view.finished_at or view.updated_at or now)


def preempted_notice(job: Doc, attempt: int, fleet_notify: list[Destination] | None,
                     now: datetime) -> Notification | None:
    """Attempt `attempt` ended preempted; `job` is the job's document after: retried (pending again, in its region)
    or not (failed: its budget spent, or cancelled meanwhile). None: nobody asked, or the job moved on since."""
    view = JobDoc.from_doc(job)
    if view.attempt != attempt or view.state not in (JobState.pending, JobState.failed, JobState.cancelled):
        return None
    destinations = destinations_for(NotifyEvent.preempted, job_notify(job), fleet_notify)
    if not destinations:
        return None
    retried = view.state is JobState.pending
    where = view.pinned_region or view.region
    head, _ = split_reason(view.reason)
    if retried:
        title = f"{view.id} preempted (attempt {attempt}): retried" + (f" in {where}" if where else "")
        text = (f"{head}. Back in the queue" + (f", in region {where}, where its checkpoints are" if where else "")
                + (f", not before {view.not_before:%H:%M:%S} UTC" if view.not_before else "") + ".")
    else:
        title = f"{view.id} preempted (attempt {attempt}): not retried"
        text = head or f"the job is {view.state.value}"
    return Notification(event_id=event_id(NotifyEvent.preempted, view.id, attempt), event=NotifyEvent.preempted,
                        subject=view.id, title=_clip(title, 300), text=_clip(text, MAX_TEXT), fields=_fields(view),
                        destinations=destinations, at=now)


def group_outcome(counts: Mapping[str, int]) -> NotifyEvent:
    """A group that ended: failed if a task failed (or was rejected), else cancelled if one was, else succeeded."""
    if counts.get(JobState.failed.value) or counts.get(JobState.rejected.value):
        return NotifyEvent.failed
    if counts.get(JobState.cancelled.value):
        return NotifyEvent.cancelled
    return NotifyEvent.succeeded


def group_wants_telling(task: Doc, fleet_notify: list[Destination] | None) -> bool:
    """Does any destination want a group's end, whichever it is? (Else its tasks' ends read nothing more.)"""
    notify = job_notify(task)
    return any(destinations_for(e, notify, fleet_notify) for e in ENDED_EVENTS)


def group_notice(task: Doc, counts: Mapping[str, int], named: list[tuple[str, str, str]],
                 fleet_notify: list[Destination] | None, now: datetime) -> Notification | None:
    """The group of `task` (one of its tasks' documents) ended: its counts by state, and the first failed, rejected
    or cancelled tasks `named` ((id, state, reason)); the first failed one's last lines."""
    group = str(task.get(JobDoc.field("group")))
    event = group_outcome(counts)
    destinations = destinations_for(event, job_notify(task), fleet_notify)
    if not destinations:
        return None
    total = sum(counts.values())
    bad = {NotifyEvent.failed: (JobState.failed.value, JobState.rejected.value),
           NotifyEvent.cancelled: (JobState.cancelled.value,)}.get(event, ())
    n_bad = sum(counts.get(s, 0) for s in bad)
    title = f"group {group} {event.value}: " + (f"{n_bad} of {total} tasks {event.value}" if bad
                                                 else f"all {total} tasks succeeded")
    by_state = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if n)
    text = [f"{total} tasks: {by_state}"]
    lines: list[str] = []
    for task_id, state, reason in named:
        head, tail = split_reason(reason)
        text.append(f"{state}: {task_id}" + (f": {head}" if head else ""))
        if tail and not lines and state == JobState.failed.value:
            lines = tail
    more = n_bad - len(named) if bad else 0
    if more > 0:
        text.append(f"and {more} more (tpuq status {group})")
    fields = {"group": group, "tasks": str(total), **{s: str(n) for s, n in counts.items() if n}}
    return Notification(event_id=event_id(event, "group:" + group), event=event, subject=group,
                        title=_clip(title, 300), text=_clip("\n".join(text), MAX_TEXT), lines=lines, fields=fields,
                        destinations=destinations, at=now)


def held_by_design(view: JobDoc) -> bool:
    """A pending job that waits by its own spec: for its dependencies, or for a place in its group (`%K`)."""
    if view.waiting:
        return True
    return bool(view.group and view.array_limit and view.blocked == grouplimit.held_reason(view.group,
                                                                                           view.array_limit))


def pending_why(view: JobDoc, fresh_blocked: str | None, now: datetime) -> str:
    """What holds a pending job, in one sentence: the reason the pass just wrote or found, else what it waits on."""
    if fresh_blocked or view.blocked:
        return str(fresh_blocked or view.blocked)
    if view.not_before is not None and view.not_before > now:
        return f"retry back-off until {view.not_before:%Y-%m-%d %H:%M:%S} UTC"
    if view.capacity_request:
        return "a capacity request is open: the claimer is racing the fleet's zones for a TPU"
    return "waiting for a TPU"


def pending_notice(job: Doc, fleet_notify: list[Destination] | None, now: datetime, fresh_blocked: str | None = None
                   ) -> tuple[Notification | None, dict | None, datetime | None]:
    """A pending job -> (its `pending` notice to the destinations whose `pending_after` it has now passed and that
    were not told in this spell, the job's fields recording that, when its next destination's turn comes)."""
    view = JobDoc.from_doc(job)
    if view.state is not JobState.pending or held_by_design(view):
        return None, None, None
    since = view.pending_since if view.attempt else (view.pending_since or view.submit_time)
    destinations = destinations_for(NotifyEvent.pending, job_notify(job), fleet_notify)
    if since is None or not destinations:
        return None, None, None
    told = view.pending_notice or {}
    told_after = int(told.get("after") or 0) if told.get("attempt") == view.attempt else 0
    waited = now - since
    due = [d for d in destinations if told_after < d.pending_after <= waited.total_seconds()]
    later = [since + timedelta(seconds=d.pending_after) for d in destinations if d.pending_after > max(
        told_after, waited.total_seconds())]
    next_due = min(later) if later else None
    if not due:
        return None, None, next_due
    why = pending_why(view, fresh_blocked, now)
    notice = Notification(
        event_id=event_id(NotifyEvent.pending, view.id, view.attempt), event=NotifyEvent.pending, subject=view.id,
        title=_clip(f"{view.id} pending for {format_duration(waited.total_seconds())}", 300),
        text=_clip(why, MAX_TEXT), fields=_fields(view), destinations=due, at=now)
    marker = JobDoc.fields(pending_notice={"attempt": view.attempt, "after": max(d.pending_after for d in due)})
    return notice, marker, next_due


# ----------------------------------------------------------------------------------------------------- shell


_UNREAD = object()


class Teller:
    """Publishes the scheduler's notices for one message (`ctx`). The fleet is read at most once, and only when a
    notice may be due (`fleet`: the one the handler read, if it did)."""

    def __init__(self, ctx, fleet: Any = _UNREAD):
        self.ctx = ctx
        self._fleet = fleet

    def fleet_notify(self) -> list[Destination]:
        if self._fleet is _UNREAD:
            self._fleet = fleet_or_none(self.ctx.clients.firestore, self.ctx.settings.fleet)
        return list(self._fleet.notify) if self._fleet is not None else []

    def publish(self, notice: Notification | None) -> None:
        if notice is not None:
            self.ctx.publish("notifications", notice, event=notice.event.value)
            log.info("notification %s to %d destination(s)", notice.event_id, len(notice.destinations))

    def ended(self, job: Doc) -> None:
        """`job`: a job's document as its ending commit left it (or as a redelivery found it, terminal)."""
        try:
            view = JobDoc.from_doc(job)
        except Permanent:
            return
        if view.state not in TERMINAL_JOB_STATES:
            return
        if view.group:
            self._group(job)
        else:
            self.publish(ended_notice(job, self.fleet_notify(), self.ctx.now()))

    __call__ = ended  # (tpuq.scheduler.dependencies tells of the jobs it cancels through this)

    def attempt_ended(self, before: Doc | None, fields: Doc | None, attempt: int) -> None:
        """After an attempt's end was committed (`fields`: the job's writes, None when this delivery changed
        nothing). The job as it is now is told of: a redelivery that finds it as the first delivery left it
        publishes the same notices again. A preemption is read from the job's reason, which the end wrote
        ("preempted: retry 1 of 3: ...", "preempted: retry budget spent ...": `jobstate.retry_decision`)."""
        if before is None:
            return
        job = {**before, **fields} if fields else dict(before)
        if JobDoc.from_doc(job).attempt != attempt:
            return  # a stale attempt's event: it changed nothing
        if str(job.get("reason") or "").startswith("preempted"):
            self.publish(preempted_notice(job, attempt, self.fleet_notify(), self.ctx.now()))
        self.ended(job)

    def _group(self, task: Doc) -> None:
        """A task ended: when none of its group is left unfinished, the group's notice. One count query per task
        end (an aggregation: one read per 1,000 index entries); at the group's end four more counts and at most
        NAMED_TASKS documents. Two last tasks ending at once may both publish it: the same event id."""
        fleet_notify = self.fleet_notify()
        if not group_wants_telling(task, fleet_notify):
            return
        view = JobDoc.from_doc(task)
        tasks = self.ctx.clients.firestore.collection(store.JOBS).where(
            filter=FieldFilter(JobDoc.field("group"), "==", view.group))
        state = JobDoc.field("state")
        if _count(tasks.where(filter=FieldFilter(state, "in", _UNFINISHED))):
            return
        counts = {s.value: _count(tasks.where(filter=FieldFilter(state, "==", s.value)))
                  for s in sorted(TERMINAL_JOB_STATES)}
        if sum(counts.values()) < (view.array_size or 0):
            return  # a submission not wholly stored yet: its redelivery stores the rest
        bad = [s.value for s in (JobState.failed, JobState.rejected, JobState.cancelled)]
        q = tasks.where(filter=FieldFilter(state, "in", bad)).limit(NAMED_TASKS)
        named = sorted(((s.id, d.get("state"), d.get("reason") or "") for s in q.stream() if (d := s.to_dict() or {})),
                       key=lambda t: (bad.index(t[1]) if t[1] in bad else 9, t[0]))
        self.publish(group_notice(task, counts, named, fleet_notify, self.ctx.now()))

    def pending(self, job_snaps: Iterable, skip: set[str], fresh_blocked: Mapping[str, str]) -> datetime | None:
        """The pass's pending jobs (snapshots it read): a `pending` notice for each past a destination's
        `pending_after` (published, then recorded on the job: a crash in between publishes it again, under the same
        id); returns when the next one falls due (the pass's due time, `tpuq.scheduler.passdue`). No reads."""
        now = self.ctx.now()
        fleet_notify = self.fleet_notify()
        fleet_wants = any(d.wants(NotifyEvent.pending) for d in fleet_notify)
        next_due: datetime | None = None
        for snap in job_snaps:
            if snap.id in skip:
                continue  # assigned (or refused) by this pass
            if not fleet_wants and not _spec_notify(snap):
                continue  # nobody to tell: its document is not copied out (the pass copies each once)
            try:
                notice, marker, due = pending_notice(snap.to_dict() or {}, fleet_notify, now,
                                                     fresh_blocked.get(snap.id))
            except Permanent:
                continue
            if due is not None and (next_due is None or due < next_due):
                next_due = due
            if notice is not None:
                self.publish(notice)
                # Not guarded: it concerns no other writer (a job assigned meanwhile keeps it for a spell past).
                snap.reference.update(marker)
        return next_due


def _spec_notify(snap) -> Any:
    try:
        return snap.get("spec.notify")
    except KeyError:  # the field is absent
        return None


def _count(query) -> int:
    return int(query.count().get()[0][0].value)


def sooner(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)
