"""Intake of a group (`array:` / `sweep:`, tpuq.contracts.arrays), shell (Firestore): one submitted job stored as
its tasks, ordinary pending jobs `<group>-<index>`.

Storing a group all or nothing. Firestore commits at most 500 writes at once ("Maximum number of writes that can be
passed to a Commit operation or performed in a transaction: 500", https://cloud.google.com/firestore/quotas#writes_and_transactions;
https://firebase.google.com/docs/firestore/manage-data/transactions#batched-writes), in a request of at most 10 MiB
("Maximum API request size", same page), so a group of up to 500 small tasks is one atomic commit and a larger one
(up to MAX_ARRAY_TASKS) a few. What makes the whole all or nothing:
  - every refusal is decided before the first write: the spec was validated whole (every task's id, env and size),
    and every task id is read first (one batched read): one taken by another submission refuses the group, nothing
    stored;
  - the task ids are deterministic (the group's id, its own or derived from the message id, and the index), and
    each chunk creates only the tasks not yet stored: a delivery that crashed between two chunks is not acked, so
    Pub/Sub delivers it again, and that delivery finds the first chunks stored under its own message id and creates
    the rest. A redelivery of a group wholly stored writes nothing.
What is not atomic: between such a crash and the redelivery (seconds: the push is retried with back-off), the
first chunks' tasks are already pending and may start; the redelivery completes the group. Were the message
dead-lettered in between (every delivery failing), the group would stay partial: `tpuq status GROUP` counts its
stored tasks against `array_size`, and `tpuq cancel GROUP` ends them.
"""

from __future__ import annotations

import json

from google.api_core.exceptions import AlreadyExists

from tpuq.contracts import arrays, store
from tpuq.contracts.documents import JobDoc
from tpuq.contracts.errors import Permanent, Retryable
from tpuq.contracts.jobspec import PublishedJob
from tpuq.scheduler import grouplimit

MAX_WRITES_PER_COMMIT = 500  # Firestore's limit (module docstring)
MAX_COMMIT_BYTES = 8 * 1024 * 1024  # under the 10 MiB request limit, with room for the request's own framing
_DOC_OVERHEAD_BYTES = 4 * 1024  # a task's fields beside its spec: the scheduler's are a few KiB at most


def group_id_for(job: PublishedJob, message_id: str) -> str:
    """The group's id: the job's own (validated to leave room for `-<index>`), else derived from the message id as
    intake derives a job's, shortened so that every task id fits in 63 characters."""
    if job.id:
        return job.id
    room = 63 - arrays.longest_task_suffix(job.array, job.sweep)
    return f"job-{message_id}".lower()[:room].rstrip("-")


def group_members(job: PublishedJob, group_id: str) -> list[tuple[PublishedJob, dict]]:
    """(the task's job, its group fields) for each task, in index order. A task is the job without its group fields,
    its env given the task's sweep values; TPUQ_ARRAY_INDEX / TPUQ_ARRAY_SIZE reach it through the assignment."""
    tasks = arrays.group_tasks(group_id, job.array, job.sweep)
    base = {"array": None, "sweep": None, "max_running": None}
    limit = job.group_limit
    return [(job.model_copy(update=base | {"id": t.id, "env": {**job.env, **t.env}}),
             JobDoc.fields(group=group_id, array_index=t.index, array_size=len(tasks), array_limit=limit))
            for t in tasks]


def task_ids(job: PublishedJob, message_id: str) -> list[str]:
    group_id = group_id_for(job, message_id)
    return [t.id for t in arrays.group_tasks(group_id, job.array, job.sweep)]


def _chunks(docs: list[tuple[str, dict]]) -> list[list[tuple[str, dict]]]:
    """Consecutive chunks of at most MAX_WRITES_PER_COMMIT documents and MAX_COMMIT_BYTES."""
    out: list[list[tuple[str, dict]]] = []
    size = 0
    for job_id, doc in docs:
        doc_bytes = len(json.dumps(doc.get("spec") or {}, default=str).encode()) + _DOC_OVERHEAD_BYTES
        if not out or len(out[-1]) >= MAX_WRITES_PER_COMMIT or size + doc_bytes > MAX_COMMIT_BYTES:
            out.append([])
            size = 0
        out[-1].append((job_id, doc))
        size += doc_bytes
    return out


def store_group(db, job: PublishedJob, message_id: str, document, field: str = "id") -> tuple[list[str], int]:
    """Store every task of the group (module docstring); returns (task ids, how many this delivery created).
    `document(task_job, task_id) -> dict`: the stored job's document (intake.job_document, with its time, source,
    owner and blocked reason), to which the group fields are added."""
    group_id = group_id_for(job, message_id)
    members = group_members(job, group_id)
    ids = [task.id for task, _ in members]
    jobs = db.collection(store.JOBS)
    limit = job.group_limit
    created = 0
    for _ in range(3):
        stored = {s.id: (s.to_dict() or {}) for s in db.get_all([jobs.document(i) for i in ids]) if s.exists}
        taken = [i for i, doc in stored.items() if doc.get(JobDoc.field("message_id")) != message_id]
        if taken:
            raise Permanent(f"task id {sorted(taken)[0]!r} of group {group_id!r} is already used by another "
                            "submission; nothing of this group was stored" if len(stored) == len(taken) else
                            f"task id {sorted(taken)[0]!r} of group {group_id!r} is already used by another "
                            "submission", field=field)
        missing = [(task.id, _with_held_reason(document(task, task.id) | extra, n, limit))
                   for n, (task, extra) in enumerate(members) if task.id not in stored]
        try:
            for chunk in _chunks(missing):
                batch = db.batch()
                for job_id, doc in chunk:
                    batch.create(jobs.document(job_id), doc)
                batch.commit()
                created += len(chunk)
            return ids, created
        except AlreadyExists:
            continue  # another delivery of this message stores the group at once: read again, create the rest
    raise Retryable(f"group {group_id!r}: its tasks keep being stored by another delivery; try again")


def _with_held_reason(doc: dict, position: int, limit: int | None) -> dict:
    """A task past its group's limit is stored saying why it waits (tpuq.scheduler.grouplimit), unless it has a
    reason of its own (no fleet entry can run it): the first pass then writes nothing to the held tasks, rather than
    one guarded commit each."""
    if limit is not None and position >= limit and not doc.get(JobDoc.field("blocked")):
        doc[JobDoc.field("blocked")] = grouplimit.held_reason(str(doc[JobDoc.field("group")]), limit)
    return doc
