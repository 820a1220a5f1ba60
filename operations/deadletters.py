"""Refused messages, read back for people: `tpuq dead-letters`, `tpuq status job-<message id>`, the dashboard.

Two sources, one list (`merged`, the one place they meet): the handlers' own records (Firestore
`dead_letters/{subscription:message}`, written by the handler adapter in `tpuq.runtime.service`: a message it refused, or
failed on every delivery), and the messages no handler ever answered, which only Pub/Sub's dead-lettering kept
(the hold subscription, read by `tpuq.operations.heldletters`). Each record says its subscription, its delivery attempts
when known, and its reason class (`REASON_CLASSES`). Shell for the Firestore reads, core for the rest (the rows
and lines people see). A message published without an `id` would have been job `job-<message id>`
(`tpuq.scheduler.intake.job_id_for`), which gcloud prints; so `status` finds a refused one by that message id. A
message that reuses a stored job's id is refused too: it is found by its own message id, and the stored job lists
it. A message Pub/Sub dead-lettered keeps no original id (tpuq.operations.heldletters): it is found by the job id it names,
and one naming none is offered by its topic and publish time (`unnamed_lines`).
"""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any, Mapping

from tpuq.contracts import store
from tpuq.operations.heldletters import NEVER_ANSWERED, UNDELIVERED

JOB_ID_PREFIX = "job-"  # tpuq.scheduler.intake.job_id_for: the id of a job published without one
# A record's `kind` (tpuq.runtime.service writes "invalid" and "exhausted"; tpuq.operations.heldletters UNDELIVERED), in words.
REASON_CLASSES = {"invalid": "refused by its handler", "exhausted": "failed in its handler on every delivery",
                  UNDELIVERED: NEVER_ANSWERED}


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

    from tpuq.contracts.documents import JobDoc

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


# Where a person's submissions arrive: a published `jobs` message, an uploaded job file (`gcs-events` also carries the
# workers' status objects, to the executor's subscription: not submissions).
SUBMISSION_SUBSCRIPTIONS = ("scheduler-jobs", "scheduler-gcs-submit")


def refused_submissions_since(db, since: datetime, look_at: int = 10) -> tuple[int, bool]:
    """How many submissions (`SUBMISSION_SUBSCRIPTIONS`) their handler refused at or after `since`, and whether there
    may be more: the newest `look_at` of each topic are read (`recent`'s indexed query: that many reads at most)."""
    from tpuq.contracts import topology

    def recent_enough(record: dict) -> bool:
        return record.get("recorded_at") is not None and record["recorded_at"] >= since

    count, more = 0, False
    topics = dict.fromkeys(sub.topic for sub in topology.SUBSCRIPTIONS if sub.name in SUBMISSION_SUBSCRIPTIONS)
    for topic in topics:
        newest = recent(db, topic, look_at)
        count += sum(1 for r in newest if r.get("subscription") in SUBMISSION_SUBSCRIPTIONS
                     and r.get("kind") == "invalid" and recent_enough(r))
        # The last one read is still within the day: older ones may be too.
        more = more or (len(newest) == look_at and recent_enough(newest[-1]))
    return count, more


def read_merged(clients, topic: str | None = None, limit: int = 50) -> tuple[list[dict[str, Any]], str | None]:
    """The handlers' records and the messages Pub/Sub dead-lettered, merged (`merged`); and why the latter could not
    be read, when so (said beside the list, never hidden)."""
    held, problem = read_held(clients)
    return merged(recent(clients.firestore, topic, limit), held, topic, limit), problem


def read_held(clients) -> tuple[list[dict[str, Any]], str | None]:
    """What the hold subscription keeps, or why it could not be read."""
    from tpuq.operations import heldletters

    try:
        return heldletters.read(clients), None
    except heldletters.HeldUnreadable as e:
        return [], str(e)


# ------------------------------------------------------------------------------------------ merge (core)
def merged(recorded, held, topic: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Every refused message in one list, newest first, at most `limit`, of one topic when given: the handlers'
    records and the messages Pub/Sub dead-lettered (`tpuq.operations.heldletters.held_record`)."""
    return newest_first(r for r in [*recorded, *held] if topic is None or r.get("topic") == topic)[:limit]


def held_for_job_id(held, job_id: str) -> list[dict[str, Any]]:
    """The dead-lettered messages that name this job id, newest first."""
    return newest_first(r for r in held if r.get("job_id") == job_id)


def unnamed_held(held, job_id: str) -> list[dict[str, Any]]:
    """For `job-<message id>`, found nowhere else: the dead-lettered submissions that name no job id, one of which
    may be it (Pub/Sub keeps no original message id to tell)."""
    if not message_id_of(job_id):
        return []
    return newest_first(r for r in held if r.get("topic") == "jobs" and not r.get("job_id"))


# ------------------------------------------------------------------------------------------ views (core)
def newest_first(records) -> list[dict[str, Any]]:
    return sorted(records, key=lambda r: (r.get("recorded_at") or datetime.min.astimezone(), r.get("message_id") or ""),
                  reverse=True)


def reason_class(record: Mapping[str, Any]) -> str:
    return REASON_CLASSES.get(record.get("kind") or "invalid", record.get("kind") or "")


def attempts(record: Mapping[str, Any]) -> str:
    n = record.get("delivery_attempts")
    return str(n) if isinstance(n, int) else ""


def when(record: Mapping[str, Any], tz: tzinfo, key: str = "recorded_at") -> str:
    """`2026-12-01 15:20:07 CET`: the time it was refused (or `key`'s), in the zone given (the machine's), with the
    zone."""
    at = record.get(key)
    return at.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z") if isinstance(at, datetime) else "?"


def what(record: Mapping[str, Any]) -> str:
    """What was refused, in a few words: the job id it named, or the object a bucket notification was about."""
    if record.get("job_id"):
        return f"job {record['job_id']}"
    if record.get("topic") == "jobs" and record.get("message_id"):
        return f"{JOB_ID_PREFIX}{record['message_id']}"  # the id `tpuq status` finds it by
    if record.get("topic") == "jobs" and record.get("kind") == UNDELIVERED:
        return "a job without an id"
    if record.get("topic") == "gcs-events":
        import json

        try:
            event = json.loads(record.get("raw_data") or "")
            return f"gs://{event['bucket']}/{event['name']}"
        except (ValueError, KeyError, TypeError):
            return ""
    return ""


def row(record: Mapping[str, Any], tz: tzinfo) -> dict[str, str]:
    """One line of `tpuq dead-letters`: time (with its zone), topic, subscription, message id, what, delivery
    attempts, field, reason and its class."""
    reason = record.get("reason") or ""
    if record.get("kind") == UNDELIVERED and record.get("published_at"):
        reason += f" (published {when(record, tz, 'published_at')})"
    return {"time": when(record, tz), "topic": record.get("topic") or "", "message_id": record.get("message_id") or "",
            "what": what(record), "field": record.get("field") or "", "reason": reason,
            "kind": record.get("kind") or "", "subscription": record.get("subscription") or "",
            "attempts": attempts(record), "class": reason_class(record)}


def as_json(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record for `--json`: everything stored, times as ISO 8601 with their offset, and its reason class."""
    return {**{k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in record.items()},
            "reason_class": reason_class(record)}


def status_lines(job_id: str, record: Mapping[str, Any], tz: tzinfo) -> list[str]:
    """`tpuq status job-<message id>` for a message that was refused: it never became a job."""
    if record.get("kind") == UNDELIVERED:
        return undelivered_lines(job_id, record, tz)
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


def undelivered_lines(job_id: str, record: Mapping[str, Any], tz: tzinfo) -> list[str]:
    """`tpuq status ID` for a submission no handler ever answered: Pub/Sub dead-lettered it."""
    lines = [f"{job_id}: never stored as a job: {NEVER_ANSWERED} (Pub/Sub dead-lettered it from subscription "
             f"{record.get('subscription')} after {attempts(record) or 'its'} delivery attempts, "
             f"{when(record, tz)})", f"  published: {when(record, tz, 'published_at')}",
             "  why: the service never answered its pushes (Cloud Run refused them: 401/403 while an invoker grant "
             "propagates, 429 at max instances, 504 past the request timeout; or the container crashed): its logs, "
             "and Cloud Run's request logs, say which"]
    raw = " ".join(str(record.get("raw_data") or "").split())
    if raw:
        lines.append(f"  message: {raw[:300]}{'...' if len(raw) > 300 else ''}")
    return lines


def unnamed_lines(job_id: str, records: list[Mapping[str, Any]], tz: tzinfo) -> list[str]:
    """`tpuq status job-<message id>` stored nowhere, while Pub/Sub dead-lettered submissions that name no job id:
    one may be it (Pub/Sub keeps no original message id), told apart by publish time."""
    lines = [f"{job_id}: no such job; Pub/Sub dead-lettered {len(records)} submission(s) naming no job id, "
             f"{NEVER_ANSWERED} (it keeps no original message id: see the publish times; `tpuq dead-letters "
             "--topic jobs` lists them):"]
    for r in records:
        lines.append(f"  published {when(r, tz, 'published_at')}, dead-lettered {when(r, tz)} from subscription "
                     f"{r.get('subscription')} after {attempts(r) or '?'} delivery attempts")
    return lines
