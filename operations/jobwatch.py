"""Core (pure, no I/O): what the live views show of one job: `tpuq watch`, `tpuq submit --wait` and `--follow`.

From what the CLI read (the job, its current attempt, the TPU that attempt runs on, the workers' status objects,
each worker's last log line, and what holds a pending job), `build_watch` makes a `JobWatch`: the job's state, one
`WorkerRow` per worker of the slice (state, exit code, last log line, elapsed time) and, while the job is pending,
why it waits. A multislice attempt (its `gang`, issue 37) has a row per worker of every slice, in the attempt's
numbering (`tpuq.contracts.workers`: g = slice * hosts_per_slice + w), each labelled `s1/w0` and with its slice.
`tpuq.cli.views.watch_view` draws it on a terminal; `facts` and `change_lines` are what a watch prints instead
when its output is not one; `job_exit_code` is the commands' exit status.

How many workers: the TPU type of the node the attempt runs on (`tpus/{node}`, `tpuq.contracts.tputypes`; on several
slices, slice 0's, times the slices), else the workers' own status objects (`worker_count`, every slice's workers),
else the one type the job asked for (times the most slices it asked for). The workers write their status
objects (`tpuq.contracts.gcslayout`) only when they end, so a worker without one is as far as its attempt: assigned
(starting) or running.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, tzinfo
from typing import Any

from tpuq.contracts.documents import AttemptDoc, JobDoc, JobState, parse_timestamp, short_node_name
from tpuq.contracts.jobspec import ANY_TPU
from tpuq.contracts.messages import AttemptOutcome
from tpuq.contracts.tputypes import UnknownAcceleratorType, canonical_name, parse_accelerator_type
from tpuq.contracts.workers import split_worker_id, worker_label
from tpuq.operations.jobs import blocked_label

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
    label: str = ""  # `s1/w0` on a job that asked for several slices; "" on one slice (the row is `worker`)
    slice_id: int | None = None  # its slice, on a job that asked for several slices

    @property
    def ended(self) -> bool:
        return self.ended_at is not None or self.state == STOPPED

    @property
    def name(self) -> str:
        """How the row names its worker: `2`, or `s1/w0` on several slices."""
        return self.label or str(self.worker)


@dataclass(frozen=True)
class JobWatch:
    job_id: str
    state: JobState
    attempt: int = 0
    node: str | None = None  # the short name of the node the current attempt runs on (slice 0's on several)
    nodes: tuple[str, ...] = ()  # a multislice attempt's nodes (short names), slice order; () on one slice
    slices_wanted: int = 1  # the most slices the job asked for (`slices:`); 1 for a single-slice job
    zone: str | None = None
    tpu_type: str | None = None
    workers: tuple[WorkerRow, ...] = ()
    waiting: tuple[str, ...] = ()  # why a pending job waits: its blocked reason, the zones racing, back-offs
    reason: str | None = None  # the job's reason: how it ended, or why it was requeued
    elapsed: float | None = None  # pending: since it was submitted (or its last attempt ended); else since it started
    exit_code: int | None = None  # once the job ended: what the command exits with (job_exit_code)
    # Pending again: how its last attempt ended ("attempt 1 ended preempted: ..."), the retry still to come.
    ended_attempt: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def slices(self) -> int:
        """The slices the current attempt runs on (1 on one slice, or before it has a TPU)."""
        return max(1, len(self.nodes))


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


def slice_hosts(job: JobDoc, tpu: Mapping[str, Any] | None) -> int | None:
    """The workers of one slice: the attempt's node (`tpus/{node}`: hosts, or its type; slice 0's on several
    slices, which all have one type), else the one type the job asked for; None when neither says."""
    tpu = tpu or {}
    hosts = tpu.get("hosts") or type_hosts(tpu.get("type")) or type_hosts(requested_type(job))
    return int(hosts) if hosts else None


def worker_count(job: JobDoc, tpu: Mapping[str, Any] | None, statuses: Mapping[int, Mapping[str, Any]],
                 slices: int = 1) -> int:
    """The attempt's workers, on `slices` slices: the attempt's node (`tpus/{node}`: hosts, or its type) times the
    slices, else the status objects' `worker_count` (every slice's), else the one type the job asked for times the
    slices; never fewer than the workers that reported."""
    tpu = tpu or {}
    hosts = tpu.get("hosts") or type_hosts(tpu.get("type"))
    hosts = int(hosts) * slices if hosts else 0
    if not hosts:
        hosts = max((int(s.get("worker_count") or 0) for s in statuses.values()), default=0)
    if not hosts:
        hosts = (type_hosts(requested_type(job)) or 0) * slices
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
    lines = []
    if job.blocked:  # a racer's refusal while the request races on is said as it is, not as a block
        lines.append(job.blocked if blocked_label(job) == "racing" else f"blocked: {job.blocked}")
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
    wanted = max(job.spec_slice_counts, default=1)
    gang = () if pending else ((attempt.gang if attempt else ()) or job.gang)
    if pending:
        # A requeued job's current attempt has ended; the next one may run on another type: only the type it
        # asked for says how many workers it will have (on the most slices it asked for).
        slices = wanted
        count = (type_hosts(requested_type(job)) or 0) * wanted
        statuses, tpu, last_lines = {}, None, {}
    else:
        slices = max(1, len(gang))
        count = worker_count(job, tpu, statuses, slices) if job.attempt else 0  # rejected, or cancelled before a TPU
    # A job that asked for several slices names its workers `s1/w0`, also when an elastic one got a single slice
    # (as `tpuq logs` does: tpuq.contracts.workers.job_worker_labels).
    hosts = slice_hosts(job, tpu) if not pending else type_hosts(requested_type(job))
    if not hosts and count and slices > 1:
        hosts = count // slices
    multislice = max(slices, wanted) > 1 and bool(hosts)

    def labelled(row: WorkerRow) -> WorkerRow:
        if not multislice:
            return row
        return replace(row, label=worker_label(row.worker, hosts, max(slices, wanted)),
                       slice_id=split_worker_id(row.worker, hosts)[0])
    started = (attempt.started_at if attempt else None) or job.started_at or (attempt.assigned_at if attempt else None)
    job_end = job.finished_at if job.terminal else now
    rows = []
    for w in range(count):
        status = statuses.get(w)
        if status is not None:
            ended = parse_timestamp(status.get("ended_at"))
            code = status.get("exit_code")
            rows.append(labelled(WorkerRow(w, worker_outcome(status), int(code) if code is not None else None,
                                           status.get("signal"), last_lines.get(w, ""),
                                           _seconds(parse_timestamp(status.get("started_at")) or started, ended),
                                           ended)))
            continue
        if job.terminal:
            state = job.state.value if job.state in (JobState.succeeded, JobState.cancelled) else STOPPED
        else:
            state = job.state.value
        rows.append(labelled(WorkerRow(w, state, last_line=last_lines.get(w, ""), elapsed=_seconds(started, job_end))))
    node = (attempt.tpu if attempt else None) or job.tpu
    watch = JobWatch(
        job_id=job.id,
        state=job.state,
        attempt=job.attempt,
        node=short_node_name(node) if node and not pending else None,
        nodes=tuple(short_node_name(n) for n in gang) if len(gang) > 1 else (),
        slices_wanted=wanted,
        zone=((attempt.zone if attempt else None) or job.zone) if not pending else None,
        tpu_type=((tpu or {}).get("type") or requested_type(job)),
        workers=tuple(rows),
        waiting=_waiting_lines(job, waiting) if pending else (),
        reason=job.reason,
        elapsed=_seconds(job.submit_time, now) if pending else _seconds(started, job_end),
    )
    if pending and attempt is not None and attempt.outcome:
        detail = first_line(attempt.detail)
        watch = replace(watch, ended_attempt=f"attempt {attempt.attempt} ended {attempt.outcome}" +
                        (f": {detail}" if detail else ""),
                        elapsed=_seconds(attempt.ended_at or job.submit_time, now))
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


def slices_text(got: int, tpu_type: str | None, wanted: int = 1) -> str:
    """`2 slices of v4-32`, with `(asked 4)` when an elastic job got fewer than it asked for; `1 slice of v4-32
    (asked 4)`; "" on one slice of a single-slice job."""
    if got <= 1 and wanted <= 1:
        return ""
    text = f"{got} slice{'s' if got != 1 else ''}" + (f" of {tpu_type}" if tpu_type else "")
    return text + (f" (asked {wanted})" if wanted > got else "")


def where(watch: JobWatch) -> str:
    """`tpuq-abc (us-central2-a, v4-32, 4 workers), attempt 1`; on several slices `tpuq-abc-0, tpuq-abc-1
    (us-central2-a, 2 slices of v4-32, 8 workers), attempt 1`; "" before the job has a TPU."""
    if not watch.node:
        return ""
    n = len(watch.workers)
    kind = slices_text(watch.slices, watch.tpu_type, watch.slices_wanted) or watch.tpu_type
    details = ", ".join(x for x in (watch.zone, kind, f"{n} worker{'s' if n != 1 else ''}" if n else "") if x)
    nodes = watch.nodes or (watch.node,)
    shown = ", ".join(nodes) if len(nodes) <= 3 else f"{nodes[0]} ... {nodes[-1]}"
    return f"{shown} ({details}), attempt {watch.attempt}"


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
    """One ended worker: "worker 2: failed, exited 3 (SIGTERM); last line: oops" (`worker s1/w0: ...` on several
    slices)."""
    text = f"worker {row.name}: {row.state}"
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
    if watch.ended_attempt and watch.state is JobState.pending:  # said once, before why it waits now
        job = {f"attempt {watch.attempt}": watch.ended_attempt, **job}
    ended = {f"worker {r.name}": worker_fact(r) for r in watch.workers if r.ended} if workers else {}
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
