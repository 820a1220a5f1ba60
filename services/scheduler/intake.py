"""Job intake, shell (Firestore): the scheduler's entry for the `jobs` topic.

A valid job is stored once, as `pending`, with its submit time and source.
Redelivery of the same message stores nothing new; a different message that
reuses a stored job id is refused (dead-lettered) and the stored job is kept.
A whole `jobs:` file in one message stores every job in it, under deterministic ids (`file_jobs`), so a
redelivery stores nothing new; if one of its ids is taken by another submission, none is stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from google.api_core.exceptions import AlreadyExists

from tpuq.contracts import store
from tpuq.contracts.documents import JobDoc, JobState
from tpuq.contracts.errors import Permanent
from tpuq.contracts.jobspec import PublishedJob, PublishedJobFile, dependency_names
from tpuq.scheduler import arrays

SOURCES = ("cli", "pubsub", "gcs")


def job_id_for(job: PublishedJob, message_id: str) -> str:
    """An explicit id wins; otherwise the Pub/Sub message id makes redelivery land on one job."""
    return job.id or f"job-{message_id}".lower()[:63]


def file_jobs(jobs: PublishedJobFile, message_id: str) -> list[PublishedJob]:
    """The jobs of a `jobs:` file message, each with its id: its own, else `job-<message id>-<n>` (n from 0)."""
    base = f"job-{message_id}".lower()[:58]
    return [j if j.id else j.model_copy(update={"id": f"{base}-{i}"}) for i, j in enumerate(jobs.jobs)]


def refuse_taken_ids(db, jobs: list[PublishedJob], message_id: str) -> None:
    """Before storing any job of a file: Permanent (field `jobs[n].id`) if one id is another submission's."""
    for i, job in enumerate(jobs):
        if job.is_group:  # each task id is checked by tpuq.scheduler.arrays.store_group, before any task is stored
            refs = [db.collection(store.JOBS).document(t) for t in arrays.task_ids(job, message_id)]
            taken = [s.id for s in db.get_all(refs)
                     if s.exists and (s.to_dict() or {}).get(JobDoc.field("message_id")) != message_id]
            if taken:
                raise Permanent(f"task id {sorted(taken)[0]!r} is already used by another submission; nothing of "
                                "this file was stored", field=f"jobs[{i}].id")
            continue
        snap = db.collection(store.JOBS).document(job_id_for(job, message_id)).get()
        if snap.exists and (snap.to_dict() or {}).get(JobDoc.field("message_id")) != message_id:
            raise Permanent(f"job id {job.id!r} is already used by another submission; nothing of this file was "
                            "stored", field=f"jobs[{i}].id")


def job_document(job: PublishedJob, job_id: str, source: str, message_id: str, now: datetime,
                 blocked: str | None = None, owner: str | None = None) -> dict[str, Any]:
    """The new job's document. `blocked`: why no fleet entry can run it (`capacity.unrunnable_reason`), set from
    the first second; it stays pending, since a later `tpuq fleet apply` may make it runnable."""
    spec = job.model_dump(mode="json", exclude_none=True)
    spec["id"] = job_id
    return JobDoc.fields(
        id=job_id,
        state=JobState.pending,
        spec=spec,
        priority=job.priority.value,
        priority_rank=job.priority.rank,
        types=list(job.tpu),
        submit_time=now,
        updated_at=now,
        source=source if source in SOURCES else "pubsub",
        owner=owner,
        message_id=message_id,
        attempts=0,
        preemptions=0,
        infra_failures=0,
        pinned_region=None,
        reason=None,
        blocked=blocked,
    ) | (JobDoc.fields(depends_on_ids=names)  # its waiters are found by array-contains when one ends
         if (names := dependency_names(job.depends_on)) else {})


def store_job(db, job: PublishedJob, source: str, message_id: str, now: datetime,
              blocked: str | None = None, owner: str | None = None) -> tuple[str, bool]:
    """Create jobs/{id}; returns (job_id, created). Idempotent per message id."""
    job_id = job_id_for(job, message_id)
    ref = db.collection(store.JOBS).document(job_id)
    try:
        ref.create(job_document(job, job_id, source, message_id, now, blocked, owner))
        return job_id, True
    except AlreadyExists:
        existing = ref.get().to_dict() or {}
        if existing.get(JobDoc.field("message_id")) == message_id:  # (not the view: any stored state will do)
            return job_id, False  # a redelivery of the message that stored it
        raise Permanent(f"job id {job_id!r} is already used by another submission", field="id") from None
