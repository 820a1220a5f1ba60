"""Refused messages, read back for people: `tpuq dead-letters` and `tpuq status job-<message id>`.

Shell for the reads (Firestore `dead_letters/{subscription:message}`, written by the handler adapter in
`tpuq.service`), core for the rest (the rows and lines people see). A message published without an `id` would have
been job `job-<message id>` (`tpuq.scheduler.intake.job_id_for`), which gcloud prints; so `status` finds a refused
one by that message id. A message that reuses a stored job's id is refused too: it is found by its own message id,
and the stored job lists it.
"""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any, Mapping

from tpuq import store

JOB_ID_PREFIX = "job-"  # tpuq.scheduler.intake.job_id_for: the id of a job published without one


def message_id_of(job_id: str) -> str | None:
    """`job-1234` -> `1234`: the Pub/Sub message id the job id was made from, or None."""
    rest = job_id[len(JOB_ID_PREFIX):] if job_id.startswith(JOB_ID_PREFIX) else ""
    return rest or None


# ------------------------------------------------------------------------------------------ reads (shell)
def _where(db, field: str, value: str) -> list[dict[str, Any]]:
    from google.cloud.firestore import FieldFilter

    return [d.to_dict() for d in db.collection(store.DEAD_LETTERS).where(filter=FieldFilter(field, "==", value)).stream()]


def for_job_id(db, job_id: str) -> list[dict[str, Any]]:
    """Refused messages a job id leads to: the message `job-<id>` was made from, and messages naming the id
    (a reused id, or a job refused before it was stored). Newest first."""
    found = {}
    mid = message_id_of(job_id)
    for record in (_where(db, "message_id", mid) if mid else []) + _where(db, "job_id", job_id):
        found[(record.get("subscription"), record.get("message_id"))] = record
    return newest_first(found.values())


def jobs_of_message(db, job_id: str) -> list[str]:
    """For `job-<message id>` that is no job: the jobs that message stored (a whole `jobs:` file in one message)."""
    from google.cloud.firestore import FieldFilter

    from tpuq.documents import JobDoc

    mid = message_id_of(job_id)
    if not mid:
        return []
    query = db.collection(store.JOBS).where(filter=FieldFilter(JobDoc.field("message_id"), "==", mid))
    return sorted(d.id for d in query.stream())


def recent(db, topic: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """The newest refused messages (of one topic), newest first. The topic query has its composite index in
    infra/firestore.indexes.json."""
    from google.cloud import firestore

    query = db.collection(store.DEAD_LETTERS)
    if topic:
        query = query.where(filter=firestore.FieldFilter("topic", "==", topic))
    query = query.order_by("recorded_at", direction=firestore.Query.DESCENDING).limit(limit)
    return [d.to_dict() for d in query.stream()]


# ------------------------------------------------------------------------------------------ views (core)
def newest_first(records) -> list[dict[str, Any]]:
    return sorted(records, key=lambda r: (r.get("recorded_at") or datetime.min.astimezone(), r.get("message_id") or ""),
                  reverse=True)


def when(record: Mapping[str, Any], tz: tzinfo) -> str:
    """`2026-12-01 15:20:07 CET`: the time it was refused, in the zone given (the machine's), with the zone."""
    at = record.get("recorded_at")
    return at.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z") if isinstance(at, datetime) else "?"


def what(record: Mapping[str, Any]) -> str:
    """What was refused, in a few words: the job id it named, or the object a bucket notification was about."""
    if record.get("job_id"):
        return f"job {record['job_id']}"
    if record.get("topic") == "jobs" and record.get("message_id"):
        return f"{JOB_ID_PREFIX}{record['message_id']}"  # the id `tpuq status` finds it by
    if record.get("topic") == "gcs-events":
        import json

        try:
            event = json.loads(record.get("raw_data") or "")
            return f"gs://{event['bucket']}/{event['name']}"
        except (ValueError, KeyError, TypeError):
            return ""
    return ""


def row(record: Mapping[str, Any], tz: tzinfo) -> dict[str, str]:
    """One line of `tpuq dead-letters`: time (with its zone), topic, message id, what, field, reason."""
    return {"time": when(record, tz), "topic": record.get("topic") or "", "message_id": record.get("message_id") or "",
            "what": what(record), "field": record.get("field") or "", "reason": record.get("reason") or "",
            "kind": record.get("kind") or ""}


def as_json(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record for `--json`: everything stored, times as ISO 8601 with their offset."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in record.items()}


def status_lines(job_id: str, record: Mapping[str, Any], tz: tzinfo) -> list[str]:
    """`tpuq status job-<message id>` for a message that was refused: it never became a job."""
    mid = record.get("message_id")
    lines = [f"{job_id}: refused, never stored as a job (message {mid} on topic {record.get('topic')}, "
             f"{when(record, tz)})"]
    if record.get("job_id") and record["job_id"] != job_id:
        lines.append(f"  it asked for job id {record['job_id']}")
    if record.get("field"):
        lines.append(f"  field: {record['field']}")
    lines.append(f"  reason: {record.get('reason')}")
    raw = " ".join(str(record.get("raw_data") or "").split())
    if raw:
        lines.append(f"  message: {raw[:300]}{'...' if len(raw) > 300 else ''}")
    return lines


def refused_line(record: Mapping[str, Any], tz: tzinfo) -> str:
    """Under a stored job: a later message that reused its id and was refused."""
    return (f"refused: message {record.get('message_id')} ({when(record, tz)}) reused this id: "
            f"{record.get('reason')}")
