"""Read-only views over Firestore and GCS for the CLI (status, list, logs, watch, fleet).

What the documents and objects look like is `tpuq.contracts.documents`' and `tpuq.contracts.gcslayout`'s: nothing here imports a
service."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterator, Mapping

from tpuq.contracts import store
from tpuq.contracts import gcslayout
from tpuq.contracts.documents import AttemptDoc, JobDoc
from tpuq.contracts.jobspec import split_gs_uri

class UnknownJob(LookupError):
    pass


def as_job(job: JobDoc | Mapping[str, Any]) -> JobDoc:
    """A job's view, from the view or from its stored document."""
    return job if isinstance(job, JobDoc) else JobDoc.from_doc(job)


def get_job(db, job_id: str) -> dict[str, Any]:
    """The stored document (as `status --json` prints it); `as_job` reads it."""
    snap = db.collection(store.JOBS).document(job_id).get()
    if not snap.exists:
        raise UnknownJob(f"no job {job_id!r} (tpuq list shows the recent ones)")
    return snap.to_dict()


def list_jobs(db, limit: int = 50, state: str | None = None, owner: str | None = None) -> list[dict[str, Any]]:
    """The newest jobs, of one state and one owner when given (infra/firestore.indexes.json has their indexes)."""
    from google.cloud import firestore

    query = db.collection(store.JOBS)
    if owner:
        query = query.where(filter=firestore.FieldFilter(JobDoc.field("owner"), "==", owner))
    if state:
        query = query.where(filter=firestore.FieldFilter(JobDoc.field("state"), "==", state))
    query = query.order_by(JobDoc.field("submit_time"), direction=firestore.Query.DESCENDING)
    docs = [d.to_dict() for d in query.limit(limit).stream()]
    return docs


def attempts(db, job_id: str) -> list[dict[str, Any]]:
    """The job's stored attempts, in order (`AttemptDoc.from_doc` reads each)."""
    col = db.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS)
    stored = [(AttemptDoc.from_doc(d.to_dict() or {}, d.id).attempt, d.to_dict()) for d in col.stream()]
    return [doc for _, doc in sorted(stored, key=lambda pair: pair[0])]


def jobs_on_fleet(db, fleet: str) -> list[str]:
    """The jobs assigned to or running on a TPU of the fleet (the scheduler's tpus/ and jobs/ documents)."""
    from google.cloud import firestore

    from tpuq.contracts.documents import JOB_STATES_ON_A_TPU

    nodes = {d.get("name") for d in (s.to_dict() for s in db.collection(store.TPUS)
                                     .where(filter=firestore.FieldFilter("fleet", "==", fleet)).stream())}
    out = []
    for state in sorted(JOB_STATES_ON_A_TPU):
        q = db.collection(store.JOBS).where(filter=firestore.FieldFilter("state", "==", state))
        out += [s.id for s in q.stream() if (s.to_dict() or {}).get("tpu") in nodes]
    return sorted(out)


@dataclass
class LogChunk:
    worker: int
    seq: int
    text: str
    written_at: datetime | None = None  # when GCS stored it (the object's timeCreated): its lines carry no time


def _log_location(job: JobDoc, attempt: int | None) -> tuple[str, int] | None:
    n = attempt or job.attempt
    if not job.job_bucket or not n:
        return None
    return split_gs_uri(job.job_bucket)[0], int(n)


def worker_log_chunks(storage, stored: JobDoc | Mapping[str, Any], attempt: int | None = None,
                      worker: int | None = None, after: dict[int, int] | None = None) -> Iterator[LogChunk]:
    """Log chunks in order (per worker, by sequence), skipping those already seen in `after`."""
    job = as_job(stored)
    where = _log_location(job, attempt)
    if where is None:
        return
    bucket, n = where
    prefix = gcslayout.attempt_logs_prefix(job.id, n)
    if worker is not None:
        prefix = gcslayout.worker_log_prefix(job.id, n, worker)
    after = after or {}
    found = []
    for blob in storage.list_blobs(bucket, prefix=prefix):
        chunk = gcslayout.parse_log_chunk_name(job.id, n, blob.name)
        if chunk is None:
            continue
        w, seq = chunk
        if seq > after.get(w, -1):
            found.append((w, seq, blob))
    for w, seq, blob in sorted(found, key=lambda t: (t[0], t[1])):
        written = getattr(blob, "time_created", None)
        yield LogChunk(w, seq, blob.download_as_bytes().decode("utf-8", errors="replace"),
                       written if isinstance(written, datetime) else None)


def timed_log_lines(storage, stored: JobDoc | Mapping[str, Any], attempt: int | None = None,
                    worker: int | None = None) -> list[tuple[int, int, datetime | None, str]]:
    """Every complete line of one attempt's logs (the latest when `attempt` is None), of one worker when given:
    (worker, the line's number in its worker's log, when the chunk that completed it was written, text), in each
    worker's order. A worker's unfinished last line is included, at its last chunk's time.
    `tpuq.operations.runview.merged_by_time` makes one log of them."""
    from tpuq.operations.jobwatch import LineAssembler

    assembler = LineAssembler()
    lines: list[tuple[int, int, datetime | None, str]] = []
    count: dict[int, int] = {}
    last_written: dict[int, datetime | None] = {}
    for chunk in worker_log_chunks(storage, stored, attempt, worker):
        last_written[chunk.worker] = chunk.written_at
        for text in assembler.feed(chunk.worker, chunk.text):
            count[chunk.worker] = count.get(chunk.worker, 0) + 1
            lines.append((chunk.worker, count[chunk.worker], chunk.written_at, text))
    for w, text in assembler.flush():
        count[w] = count.get(w, 0) + 1
        lines.append((w, count[w], last_written.get(w), text))
    return lines


def worker_statuses(storage, stored: JobDoc | Mapping[str, Any], attempt: int | None = None,
                    status_bucket: str | None = None) -> dict[int, dict[str, Any]]:
    """The workers' status objects: in the runner bucket (`status_bucket`), else in the job's bucket."""
    import json

    job = as_job(stored)
    where = _log_location(job, attempt)
    if where is None:
        return {}
    bucket, n = where
    if status_bucket:
        bucket = split_gs_uri(status_bucket if status_bucket.startswith("gs://") else f"gs://{status_bucket}")[0]
    out = {}
    for blob in storage.list_blobs(bucket, prefix=gcslayout.status_prefix(job.id, n)):
        ref = gcslayout.parse_status_object_name(blob.name)
        if ref and ref.worker_id is not None:
            try:
                out[ref.worker_id] = json.loads(blob.download_as_bytes())
            except ValueError:
                out[ref.worker_id] = {}
    return out


def age(ts: Any, now: datetime) -> str:
    if not isinstance(ts, datetime):
        return ""
    seconds = max(0, int((now - ts).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"
