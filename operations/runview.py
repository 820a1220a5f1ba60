"""Core (pure, no I/O): how a run's life reads to a person, the same in `tpuq status`, `tpuq logs` and the
dashboard (tpuq.ui): the job's times each with its own age, one attempt's line (when it started, when it ended,
how long it ran), which attempt a log shows, and every worker's log lines merged by time.

Times are local (`tpuq.operations.fleetreport.local_time`: with seconds and the zone). A field that is not set
is left out, never printed as `None`: a job rejected at intake has no spec, no priority, no attempt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, tzinfo
from typing import Any

from tpuq.contracts.documents import AttemptDoc, JobDoc


def stamped(label: str, when: datetime, tz: tzinfo, now: datetime) -> str:
    """`finished 14:03:27 CET (2m ago)`: a time and its own age beside it."""
    from tpuq.operations.fleetreport import local_time
    from tpuq.operations.queries import age

    return f"{label} {local_time(when, tz, now)} ({age(when, now)} ago)"


def job_times(job: JobDoc, tz: tzinfo, now: datetime) -> list[str]:
    """The job's submission, start and end, each with how long ago it was (`tpuq status JOB`)."""
    return [stamped(label, when, tz, now) for label, when in
            (("submitted", job.submit_time), ("started", job.started_at), ("finished", job.finished_at))
            if isinstance(when, datetime)]


def owner_shown(job: JobDoc) -> str:
    """The job's owner as `tpuq status` and `tpuq list` show it: "unknown" for a job published with no identity."""
    return job.owner or "unknown"


def job_head_fields(job: JobDoc) -> list[tuple[str, str]]:
    """(label, value) of the job's first line after its state: priority, source, owner; those not set are left
    out (a rejected job has no priority), and an unknown owner says so."""
    fields = [(label, value) for label, value in (("priority", job.priority), ("source", job.source)) if value]
    return fields + [("owner", owner_shown(job))]


def attempt_line(a: AttemptDoc, tz: tzinfo, now: datetime, tpu_type: str | None = None,
                 slices_wanted: int = 1) -> str:
    """`attempt 2: ended preempted on tpuq-abc, started 14:01:02 CET, ended 14:05:10 CET (ran 4m08s)`: each time
    is the one its word says (an attempt assigned but never started shows when it was assigned).

    A job that asked for several slices (`slices_wanted`, the most its `slices:` lists; `tpu_type` its one type)
    says what each attempt got, from the attempt's `gang`: `on 2 slices of v4-32 (asked 4): tpuq-a-0, tpuq-a-1`
    (`(asked N)` when an elastic job got fewer)."""
    from tpuq.contracts.documents import short_node_name
    from tpuq.operations.fleetreport import local_time
    from tpuq.operations.jobwatch import duration, slices_text

    got = len(a.gang) if len(a.gang) > 1 else 1
    if a.tpu and (got > 1 or slices_wanted > 1):
        nodes = ", ".join(short_node_name(n) for n in (a.gang if got > 1 else (a.tpu,)))
        place = f"{slices_text(got, tpu_type, slices_wanted)}: {nodes}"
    else:
        place = a.tpu or "?"
    head = f"attempt {a.attempt}: {a.state.value}" + (f" {a.outcome}" if a.outcome else "") + f" on {place}"
    times = []
    if a.started_at is None and a.assigned_at is not None:
        times.append(f"assigned {local_time(a.assigned_at, tz, now)}")
    if a.started_at is not None:
        times.append(f"started {local_time(a.started_at, tz, now)}")
    if a.ended_at is not None:
        ran = f" (ran {duration((a.ended_at - a.started_at).total_seconds())})" if a.started_at else ""
        times.append(f"ended {local_time(a.ended_at, tz, now)}{ran}")
    elif a.started_at is not None:
        times[-1] += f" (running for {duration((now - a.started_at).total_seconds())})"
    return ", ".join([head, *times])


def log_header(job_id: str, attempt: int, of: int, a: AttemptDoc | None, tz: tzinfo, now: datetime) -> str:
    """`attempt 2 of 3 of job train-1 (started 14:01:02 CET on tpuq-abc, ended preempted)`: what `tpuq logs`
    shows, so that a retried job's log is never read as another attempt's."""
    from tpuq.operations.fleetreport import local_time

    facts = []
    if a is not None and a.started_at is not None:
        facts.append(f"started {local_time(a.started_at, tz, now)}" + (f" on {a.tpu}" if a.tpu else ""))
    elif a is not None and a.assigned_at is not None:
        facts.append(f"assigned {local_time(a.assigned_at, tz, now)}, not started")
    if a is not None and a.outcome:
        facts.append(f"ended {a.outcome}")
    tail = f" ({', '.join(facts)})" if facts else ""
    return f"attempt {attempt} of {of} of job {job_id}{tail}"


def merged_by_time(lines: Iterable[tuple[int, int, Any, str]]) -> list[tuple[int, str]]:
    """Every worker's lines as one log, by time: `lines` are (worker, sequence of the line in its worker's log,
    when its chunk was written, text). The lines carry no timestamp of their own (the supervisor uploads the
    job's raw output in chunks: tpuq.executor.worker.logs), so a chunk's write time stands for its lines; each
    worker's own order is kept, and chunks written at the same moment go by worker. A chunk without a time
    sorts after those with one. Returns (worker, text)."""
    def key(item: tuple[int, int, Any, str]):
        worker, seq, when, _ = item
        return (when is None, when.timestamp() if isinstance(when, datetime) else 0.0, worker, seq)

    return [(worker, text) for worker, _, _, text in sorted(lines, key=key)]


def attempt_choices(stored_attempts: Iterable[Mapping[str, Any]]) -> list[int]:
    """The attempt numbers a log can be chosen from, in order."""
    return sorted({AttemptDoc.from_doc(doc).attempt for doc in stored_attempts} - {0})
