"""Core (pure, no I/O): what the live views show of one job: `tpuq watch`, `tpuq submit --wait` and `--follow`.

From what the CLI read (the job, its current attempt, the TPU that attempt runs on, the workers' status objects,
each worker's last log line, and what holds a pending job), `build_watch` makes a `JobWatch`: the job's state, one
`WorkerRow` per worker of the slice (state, exit code, last log line, elapsed time) and, while the job is pending,
why it waits. `tpuq.cli.views.watch_view` draws it on a terminal; `facts` and `change_lines` are what a watch prints
instead when its output is not one; `job_exit_code` is the commands' exit status.

How many workers: the TPU type of the node the attempt runs on (`tpus/{node}`, `tpuq.contracts.tputypes`), else the
workers' own status objects (`worker_count`), else the one type the job asked for. The workers write their status
objects (`tpuq.contracts.gcslayout`) only when they end, so a worker without one is as far as its attempt: assigned
(starting) or running.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any

from tpuq.contracts.documents import AttemptDoc, JobDoc, JobState, parse_timestamp, short_node_name
from tpuq.contracts.jobspec import ANY_TPU
from tpuq.contracts.messages import AttemptOutcome
from tpuq.contracts.tputypes import UnknownAcceleratorType, canonical_name, parse_accelerator_type

# A worker that never reported, on a job that ended: the executor stopped it (another worker failed, a cancel).
STOPPED = "stopped"
# What a watch exits with when the user stops it (Ctrl-C): the job itself keeps running.
EXIT_DETACHED = 130
# A failing worker's exit code becomes the command's, unless it would read as something else: 130 is "you stopped
# watching", and codes above 255 do not exist.
_PASSED_EXIT_CODES = range(1, 256)


@dataclass(frozen=True)
class WorkerRow:
    worker: int
    state: str  # a JobState (no status object yet), an AttemptOutcome value (it ended), or STOPPED
    exit_code: int | None = None
    signal: str | None = None
    last_line: str = ""
    elapsed: float | None = None  # seconds since the attempt (or this worker) started; to its end once ended
    ended_at: datetime | None = None

    @property
    def ended(self) -> bool:
        return self.ended_at is not None or self.state == STOPPED


@dataclass(frozen=True)
class JobWatch:
    job_id: str
    state: JobState
    attempt: int = 0
    node: str | None = None  # the short name of the node the current attempt runs on
    zone: str | None = None
    tpu_type: str | None = None
    workers: tuple[WorkerRow, ...] = ()
    waiting: tuple[str, ...] = ()  # why a pending job waits: its blocked reason, the zones racing, back-offs
    reason: str | None = None  # the job's reason: how it ended, or why it was requeued
    elapsed: float | None = None  # pending: since it was submitted; else since the attempt started
    exit_code: int | None = None  # once the job ended: what the command exits with (job_exit_code)

    @property
    def terminal(self) -> bool:
        return self.state.terminal


def type_hosts(tpu_type: str | None) -> int | None:
    """How many workers a slice of this type has; None for no type or one tputypes does not know."""
    if not tpu_type:
        return None
    try:
        return parse_accelerator_type(tpu_type).hosts
    except UnknownAcceleratorType:
        return None


def requested_type(job: JobDoc) -> str | None:
    """The job's TPU type when it asked for exactly one (not a list, not `any`)."""
    asked = [canonical_name(t) for t in job.spec_tpu]
    return asked[0] if len(asked) == 1 and asked[0] != ANY_TPU else None


def worker_count(job: JobDoc, tpu: Mapping[str, Any] | None, statuses: Mapping[int, Mapping[str, Any]]) -> int:
    """The slice's workers: the attempt's node (`tpus/{node}`: hosts, or its type), else the status objects'
    `worker_count`, else the one type the job asked for; never fewer than the workers that reported."""
    tpu = tpu or {}
    hosts = tpu.get("hosts") or type_hosts(tpu.get("type"))
    if not hosts:
        hosts = max((int(s.get("worker_count") or 0) for s in statuses.values()), default=0)
    if not hosts:
        hosts = type_hosts(requested_type(job)) or 0
    return max(int(hosts), max(statuses, default=-1) + 1)


def worker_outcome(status: Mapping[str, Any]) -> str:
    """How one worker ended, from its status object (the words of `tpuq.contracts.messages.AttemptOutcome`)."""
    if status.get("phase") == "setup" or status.get("setup_error"):
        return AttemptOutcome.failed_setup.value
    if status.get("cancelled"):
        return AttemptOutcome.cancelled.value
    if status.get("preempted"):
        return AttemptOutcome.preempted.value
    return (AttemptOutcome.succeeded if status.get("exit_code") == 0 else AttemptOutcome.failed).value


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def _waiting_lines(job: JobDoc, waiting: str | None) -> tuple[str, ...]:
    """The scheduler's blocked reason first, then what `tpuq.operations.fleetreport.waiting_reason` found, one item a line."""
    lines = [f"blocked: {job.blocked}"] if job.blocked else []
    for part in (waiting or "").split("; "):
        if part and part not in lines and part != f"blocked: {job.blocked}":
            lines.append(part)
    return tuple(lines)


def build_watch(job: JobDoc, attempt: AttemptDoc | None, tpu: Mapping[str, Any] | None,
                statuses: Mapping[int, Mapping[str, Any]], last_lines: Mapping[int, str], waiting: str | None,
                now: datetime) -> JobWatch:
    """The job as the live views show it. `attempt`: the job's current attempt (None before the first);
    `tpu`: the `tpus/{node}` document of that attempt's node; `statuses`: that attempt's status objects by worker;
    `last_lines`: each worker's last log line; `waiting`: what holds a pending job (`fleetreport.waiting_reason`)."""
    pending = job.state is JobState.pending
    if pending:
        # A requeued job's current attempt has ended; the next one may run on another type: only the type it
        # asked for says how many workers it will have.
        count = type_hosts(requested_type(job)) or 0
        statuses, tpu, last_lines = {}, None, {}
    else:
        count = worker_count(job, tpu, statuses) if job.attempt else 0  # rejected, or cancelled before a TPU
    started = (attempt.started_at if attempt else None) or job.started_at or (attempt.assigned_at if attempt else None)
    job_end = job.finished_at if job.terminal else now
    rows = []
    for w in range(count):
        status = statuses.get(w)
        if status is not None:
            ended = parse_timestamp(status.get("ended_at"))
            code = status.get("exit_code")
            rows.append(WorkerRow(w, worker_outcome(status), int(code) if code is not None else None,
                                  status.get("signal"), last_lines.get(w, ""),
                                  _seconds(parse_timestamp(status.get("started_at")) or started, ended), ended))
            continue
        if job.terminal:
            state = job.state.value if job.state in (JobState.succeeded, JobState.cancelled) else STOPPED
        else:
            state = job.state.value
        rows.append(WorkerRow(w, state, last_line=last_lines.get(w, ""), elapsed=_seconds(started, job_end)))
    node = (attempt.tpu if attempt else None) or job.tpu
    watch = JobWatch(
        job_id=job.id,
        state=job.state,
        attempt=job.attempt,
        node=short_node_name(node) if node and not pending else None,
        zone=((attempt.zone if attempt else None) or job.zone) if not pending else None,
        tpu_type=((tpu or {}).get("type") or requested_type(job)),
        workers=tuple(rows),
        waiting=_waiting_lines(job, waiting) if pending else (),
        reason=job.reason,
        elapsed=_seconds(job.submit_time, now) if pending else _seconds(started, job_end),
    )
    if job.terminal:
        return JobWatch(**{**watch.__dict__, "exit_code": job_exit_code(watch)})
    return watch


def job_exit_code(watch: JobWatch) -> int | None:
    """None while the job runs; 0 if it succeeded; if it failed, the exit code of the worker that failed first
    (by when it ended, then by number), when that code is one a process can exit with and not 130 (which says
    the user stopped watching); 1 otherwise (cancelled, rejected, setup failed, no code)."""
    if not watch.terminal:
        return None
    if watch.state is JobState.succeeded:
        return 0
    failed = sorted((r for r in watch.workers if r.state == AttemptOutcome.failed.value and r.exit_code),
                    key=lambda r: (r.ended_at is None, r.ended_at or datetime.max, r.worker))
    if failed and failed[0].exit_code in _PASSED_EXIT_CODES and failed[0].exit_code != EXIT_DETACHED:
        return failed[0].exit_code
    return 1


def duration(seconds: float | None) -> str:
    """`7s`, `2m05s`, `1h02m`; "" when unknown."""
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def first_line(text: str | None) -> str:
    return (text or "").strip().split("\n", 1)[0].strip()


def where(watch: JobWatch) -> str:
    """`tpuq-abc (us-central2-a, v4-32, 4 workers), attempt 1`; "" before the job has a TPU."""
    if not watch.node:
        return ""
    n = len(watch.workers)
    details = ", ".join(x for x in (watch.zone, watch.tpu_type, f"{n} worker{'s' if n != 1 else ''}" if n else "")
                        if x)
    return f"{watch.node} ({details}), attempt {watch.attempt}"


def job_fact(watch: JobWatch) -> str:
    """The job's state in one line: "pending: racing v4-8 in us-central2-a", "running on NODE (...), attempt 1",
    "failed: worker 2 exited 3"."""
    if watch.state is JobState.pending:
        return "pending" + (f": {'; '.join(watch.waiting)}" if watch.waiting else "")
    if watch.terminal:
        reason = first_line(watch.reason)
        return watch.state.value + (f": {reason}" if reason and reason != watch.state.value else "")
    place = where(watch)
    if not place:
        return watch.state.value
    return f"assigned to {place}" if watch.state is JobState.assigned else f"{watch.state.value} on {place}"


def worker_fact(row: WorkerRow) -> str:
    """One ended worker: "worker 2: failed, exited 3 (SIGTERM); last line: oops"."""
    text = f"worker {row.worker}: {row.state}"
    if row.exit_code is not None:
        text += f", exited {row.exit_code}"
    if row.signal:
        text += f" ({row.signal})"
    if row.last_line and row.state != AttemptOutcome.succeeded.value:
        text += f"; last line: {row.last_line}"
    return text


def facts(watch: JobWatch, workers: bool = True) -> dict[str, str]:
    """What a watch prints a line for when it changes (its output is not a terminal): the job's state (with why a
    pending job waits and where a running one runs), and each worker once it ended. Running workers follow their
    job: a line each would only repeat it. In order: the job's line first, except that a job's end comes after
    its workers' (the last line says how it ended). `workers=False`: the job's line only (`submit --wait`)."""
    job = {"job": job_fact(watch)}
    ended = {f"worker {r.worker}": worker_fact(r) for r in watch.workers if r.ended} if workers else {}
    return {**ended, **job} if watch.terminal else {**job, **ended}


def change_lines(before: Mapping[str, str] | None, after: Mapping[str, str]) -> list[str]:
    """The facts that are new or changed since `before`, in `after`'s order."""
    before = before or {}
    return [value for key, value in after.items() if before.get(key) != value]


def stamp(now: datetime, tz: tzinfo) -> str:
    """`15:03:04 UTC`: when a line was printed, in the machine's time zone, with the zone's name."""
    return now.astimezone(tz).strftime("%H:%M:%S %Z")


def detach_message(jobs: Mapping[str, str | None]) -> str:
    """What Ctrl-C in a watch prints: the jobs keep running (job id -> its last known state, None if not known),
    and the commands that watch, show or cancel them."""
    def now(state: str | None) -> str:
        return f"now {state}; " if state else ""

    if len(jobs) == 1:
        [(j, state)] = jobs.items()
        return (f"stopped watching; job {j} keeps running ({now(state)}tpuq did not cancel it).\n"
                f"  watch it:    tpuq watch {j}\n"
                f"  its logs:    tpuq logs {j} -f\n"
                f"  cancel it:   tpuq cancel {j}")
    lines = [f"stopped watching; jobs {', '.join(jobs)} keep running (tpuq did not cancel them)."]
    for j, state in jobs.items():
        lines.append(f"  {j} ({state or 'not stored yet'}):  tpuq watch {j}  |  tpuq logs {j} -f  |  tpuq cancel {j}")
    return "\n".join(lines)


@dataclass
class LineAssembler:
    """Log chunks into lines, per worker: a chunk may end mid-line, so the rest waits for the next chunk.

    `feed` returns the complete lines; `last` is the worker's last non-empty line, the unfinished one included
    (a progress bar redrawn with carriage returns shows its latest state)."""

    partial: dict[int, str] = field(default_factory=dict)
    latest: dict[int, str] = field(default_factory=dict)

    def feed(self, worker: int, text: str) -> list[str]:
        lines = (self.partial.pop(worker, "") + text).split("\n")
        self.partial[worker] = lines.pop()
        for line in reversed([*lines, self.partial[worker]]):
            shown = next((part.strip() for part in reversed(line.split("\r")) if part.strip()), "")
            if shown:
                self.latest[worker] = shown
                break
        return lines

    def last(self, worker: int) -> str:
        return self.latest.get(worker, "")

    def flush(self) -> list[tuple[int, str]]:
        """The unfinished lines, once no more chunks will come."""
        rest = [(w, text) for w, text in sorted(self.partial.items()) if text]
        self.partial.clear()
        return rest
