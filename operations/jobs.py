"""What a user does to jobs and fleets, shared by the CLI (tpuq.cli) and the dashboard (tpuq.ui): ask for a
cancel, decide whether someone else's job may be cancelled, change a pending job's priority, nudge the services.
No printing and no argument parsing: those stay in each front end. The heavier modules are imported where
they are used, so that a CLI command that needs none of them starts as fast as before."""

from __future__ import annotations

from tpuq.contracts import store
from tpuq.contracts.documents import JobDoc
from tpuq.contracts.documents.jobs import STILL_RACING_ENDINGS


def nudge(clients, source: str) -> None:
    """A tick now, marked as a nudge, so that every service applies the change at once instead of at the next
    scheduled tick, or (a quiet tick skips what is not due) the next run of its backstop cadence."""
    from datetime import datetime, timezone

    from tpuq.contracts.messages import Tick

    clients.publish("ticks", Tick(at=datetime.now(timezone.utc), source=source, nudge=True))


def request_cancel(clients, job_id: str, reason: str, requested_by: str, if_pending: bool = False,
                   expected_attempt: int | None = None) -> None:
    """Ask the scheduler to cancel a job (`cancels` topic): `tpuq cancel` and the dashboard (tpuq.ui)."""
    from tpuq.contracts.messages import CancelRequest

    clients.publish("cancels", CancelRequest(job_id=job_id, reason=reason, requested_by=requested_by,
                                             if_pending=if_pending, expected_attempt=expected_attempt))


def cancel_refusal(job_id: str, owner: str | None, me: str, force: bool) -> str | None:
    """Why `tpuq cancel` leaves a job alone: someone else submitted it and --force was not given (pure)."""
    if force or not owner or owner == me:
        return None
    return f"{job_id} was submitted by {owner}, not you ({me}): tpuq cancel --force {job_id} cancels it anyway"


def change_priority(clients, job_id: str, wanted, now) -> tuple[str, dict | None]:
    """Set a pending job's priority (a guarded read-decide-commit) and nudge the scheduler: `set-priority` and the
    dashboard (tpuq.ui). ("unknown" | "conflict" | "same" | "changed", the job as read)."""
    from tpuq.runtime.guarded import WriteSet, read_decide_commit
    from tpuq.contracts.jobstate import IllegalTransition, reprioritized

    ref = clients.firestore.collection(store.JOBS).document(job_id)

    def decide(snap):
        if not snap.exists:
            return WriteSet(), ("unknown", None)
        job = snap.to_dict()
        try:
            fields = reprioritized(job, wanted, now)
        except IllegalTransition:
            return WriteSet(), ("conflict", job)
        return WriteSet().update(snap, fields), ("changed" if fields else "same", job)

    result, job = read_decide_commit(clients.firestore, [ref], decide)
    if result == "changed":
        nudge(clients, "set-priority")  # the scheduler's next pass, now, takes the queue in the new order
    return result, job


def blocked_label(job: JobDoc) -> str:
    """What the job's stored `blocked` is, for people: "racing" when its request is open and the text is one racer's
    refusal the request goes on after (a stockout in one zone while the others race: `STILL_RACING_ENDINGS`), else
    "blocked" (no entry offers its type, the entries are full, the project refuses, a zone's quota is gone)."""
    racing = job.capacity_request_id and (job.blocked or "").endswith(STILL_RACING_ENDINGS)
    return "racing" if racing else "blocked"


def shown_reason(job: JobDoc) -> str | None:
    """The job's reason, unless it only repeats the state (`reason: succeeded` under `state: succeeded`)."""
    reason = (job.reason or "").strip()
    return reason if reason and reason != job.state.value else None


def priority_refusal(job_id: str, job: dict) -> str:
    """`set-priority` on a job that has started or ended: it keeps its priority, named when it has one (a job
    rejected at intake has none)."""
    stays = f" (its priority stays {job['priority']})" if job.get("priority") else ""
    return f"{job_id} is {job.get('state')}: set-priority changes only a pending job{stays}"
