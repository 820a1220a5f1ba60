"""The liveness rule: core (pure, no I/O).

A pending job that can run is assigned, or has a capacity request the claimer holds open, or shows a reason that
holds it (`blocked`, or `waiting` for its dependencies, written by the scheduler), within `LIVENESS_BOUND` of the moment it could first run
(its submission, its retry back-off's end, its last change). A job that breaks the rule waits for nothing: no pass
will ever move it. That is a bug in tpuq, and the CLI, the dashboard and the chaos soak show it as one instead of
an ordinary "pending".

Whether the claimer holds the request open is the claimer's record (`requests/{id}`, status `open`): the job's own
`capacity_request` only says what the scheduler asked for. A withdrawn request is never served again, and a
request message that never reached the claimer is never served at all.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from tpuq.contracts.documents import JobDoc, JobState

# Longer than a pass takes after any event, and than a request message takes to reach the claimer through
# Pub/Sub's push retries while a service restarts; far shorter than a user's patience.
LIVENESS_BOUND = timedelta(minutes=2)


def could_run_since(job: JobDoc) -> datetime | None:
    """When the pending job could first run as it stands: the latest of its submission, the end of its retry
    back-off and its last change."""
    moments = [t for t in (job.submit_time, job.not_before, job.updated_at) if isinstance(t, datetime)]
    return max(moments) if moments else None


def nothing_holds(job: JobDoc, open_request_ids: Collection[str], now: datetime,
                  bound: timedelta = LIVENESS_BOUND) -> str | None:
    """Why this job breaks the liveness rule, for people; None when it keeps it (or is not pending).
    `open_request_ids`: the ids of the capacity requests the claimer holds open (`requests/{id}`)."""
    if job.state is not JobState.pending:
        return None
    since = could_run_since(job)
    if since is None or now - since < bound:
        return None
    request = job.capacity_request_id
    if request:  # a request nobody serves holds nothing, whatever reason the job shows besides
        if request in open_request_ids:
            return None
        what = f"its capacity request {request} is not open at the claimer"
    elif job.blocked or job.waiting:  # a stated reason: the fleet's, or its dependencies' (issue 36)
        return None
    else:
        what = "no TPU, no capacity request and no stated reason"
    minutes = int((now - since).total_seconds() // 60)
    return f"nothing holds it for {minutes} min: {what} (a tpuq bug: please report it)"
