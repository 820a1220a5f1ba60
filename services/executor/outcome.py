"""Core (pure, no I/O): how an attempt ended, from the per-worker status objects and the node's state.

`decide_outcome` returns either `Decided` (publish the attempt's end) or `Wait`
(nothing to publish yet; if `until` is set, decide again at that time even if no
further status object arrives). The caller schedules that re-check; no clock is
read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum

from tpuq.contracts.jobspec import format_duration
from tpuq.contracts.messages import AttemptOutcome
from tpuq.contracts.runtime_failures import TAIL_LINES, RuntimeFailures  # the lines a detail shows, and reads
from tpuq.executor.worker.status import CANCEL_REASON
from tpuq.runtime.settings import DEFAULT_FAILURE_GRACE_SECONDS

# The executor's is `Settings.executor_failure_grace` (TPUQ_EXECUTOR_FAILURE_GRACE_SECONDS), this by default.
DEFAULT_FAILURE_GRACE = timedelta(seconds=DEFAULT_FAILURE_GRACE_SECONDS)
# How long after one worker ended on a preemption notice the others are waited for: a spot VM's notice (~30 s,
# production-facts.md "Spot TPU preemption notice"), by whose end each worker has saved and stopped or is gone.
NOTICE_GRACE = timedelta(seconds=30)
NODE_UNHEALTHY = "node unhealthy"  # the head of an attempt's detail when its node's health ended it
PREFLIGHT_FAILED = "preflight failed"  # the head of an attempt's detail when a worker's preflight found the host unfit
# A worker's status `phase`: it ran the command, its setup failed (the job's inputs: terminal), or its preflight found
# the host unfit (tpuq.executor.worker.preflight: an infrastructure failure, the slice quarantined).
PHASE_RUN, PHASE_SETUP, PHASE_PREFLIGHT = "run", "setup", "preflight"
TIMED_OUT = "timed out after"  # the head of an attempt's detail when the job's max_duration ended it
DETAIL_LIMIT = 8000  # AttemptEvent.detail max_length
# How a cancel reason the executor gives its own stops begins (`decide.stop_reason`, a launch that failed on
# another worker): a worker so stopped was not cancelled by anyone, and its status never makes the attempt
# cancelled (a person's cancel writes the cancel marker: `cancel_requested`).
EXECUTOR_STOP_PREFIX = "stopped: "


class NodeState(str, Enum):
    """What the caller knows about the node (from the TPU API or fleet events)."""

    ready = "ready"
    preempted = "preempted"  # node PREEMPTED, queued resource SUSPENDING/SUSPENDED
    gone = "gone"  # node deleted / NOT_FOUND
    unknown = "unknown"  # not looked up, or the lookup failed: not evidence of anything


@dataclass(frozen=True)
class WorkerStatus:
    """One worker's status object (see tpuq.executor.worker.status.build_status)."""

    worker_id: int
    attempt_id: str
    ended_at: datetime
    phase: str = PHASE_RUN  # PHASE_RUN | PHASE_SETUP | PHASE_PREFLIGHT
    exit_code: int | None = None
    signal: str | None = None
    cancelled: bool = False
    cancel_reason: str | None = None  # why it was stopped (the cancel request's reason)
    preempted: bool = False  # the worker saw the preemption (or host maintenance) notice
    preemption_notice: str | None = None
    timed_out: bool = False  # the supervisor stopped the job at the job's max_duration
    max_duration_seconds: float | None = None
    setup_error: str | None = None
    preflight_error: str | None = None  # what the preflight found: "/dev/vfio/0 is held by pid 4711 (python3 x.py)"
    log_error: str | None = None  # the logs did not all reach GCS (e.g. a 403 on the job's bucket)
    tail: str = ""
    disk: Mapping[str, object] = field(default_factory=dict)
    memory: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, object], stored_at: datetime | None = None) -> "WorkerStatus":
        """Parse a status object; `stored_at` (the object's creation time in GCS) beats the worker's clock."""
        ended = stored_at or datetime.fromisoformat(str(data["ended_at"]).replace("Z", "+00:00"))
        exit_code = data.get("exit_code")
        return cls(
            worker_id=int(data["worker_id"]),  # type: ignore[arg-type]
            attempt_id=str(data["attempt_id"]),
            ended_at=ended,
            phase=str(data.get("phase") or PHASE_RUN),
            exit_code=int(exit_code) if exit_code is not None else None,  # type: ignore[arg-type]
            signal=data.get("signal"),  # type: ignore[arg-type]
            cancelled=bool(data.get("cancelled")),
            cancel_reason=data.get(CANCEL_REASON),  # type: ignore[arg-type]
            preempted=bool(data.get("preempted")),
            preemption_notice=data.get("preemption_notice"),  # type: ignore[arg-type]
            timed_out=bool(data.get("timed_out")),
            max_duration_seconds=data.get("max_duration_seconds"),  # type: ignore[arg-type]
            setup_error=data.get("setup_error"),  # type: ignore[arg-type]
            preflight_error=data.get("preflight_error"),  # type: ignore[arg-type]
            log_error=data.get("log_error"),  # type: ignore[arg-type]
            tail=str(data.get("tail") or ""),
            disk=dict(data.get("disk") or {}),  # type: ignore[arg-type]
            memory=dict(data.get("memory") or {}),  # type: ignore[arg-type]
        )

    @property
    def stopped_by_executor(self) -> bool:
        """Stopped by the executor itself (`EXECUTOR_STOP_PREFIX`), not cancelled by a person."""
        return self.cancelled and (self.cancel_reason or "").startswith(EXECUTOR_STOP_PREFIX)

    @property
    def is_setup_failure(self) -> bool:
        return self.phase == PHASE_SETUP

    @property
    def is_preflight_failure(self) -> bool:
        return self.phase == PHASE_PREFLIGHT

    @property
    def is_failure(self) -> bool:
        return self.is_setup_failure or self.is_preflight_failure or self.exit_code != 0


@dataclass(frozen=True)
class Decided:
    outcome: AttemptOutcome
    detail: str
    exit_codes: dict[str, int] = field(default_factory=dict)  # AttemptEvent.exit_codes: worker id -> code
    # Stop what still runs on the workers once the end is published: the job runs again on another slice (a known
    # TPU runtime failure: the other workers may hang in a collective), and two attempts must not run at once.
    stop_workers: bool = False


@dataclass(frozen=True)
class Wait:
    """Not decided. `until`: decide again then even if nothing new arrives (None: wait for statuses)."""

    reason: str
    until: datetime | None = None


Decision = Decided | Wait


def decide_outcome(
    *,
    worker_count: int,
    statuses: Mapping[int, WorkerStatus],
    node_state: NodeState,
    now: datetime,
    cancel_requested: bool = False,
    lost_workers: frozenset[int] = frozenset(),
    unwritable_statuses: Mapping[int, str] = {},
    failure_grace: timedelta = DEFAULT_FAILURE_GRACE,
    node_problem: str | None = None,
    runtime_failures: RuntimeFailures = RuntimeFailures(),
) -> Decision:
    """Decide how the attempt ended.

    In order: cancelled (asked for, or a worker says a person cancelled it); infra_failed after the failure grace
    when the executor itself stopped workers before the end was published (`EXECUTOR_STOP_PREFIX`); failed, "timed out after 2h" (a worker's supervisor
    stopped the job at its max_duration: terminal, whatever the exit codes); succeeded (every worker
    exited 0 — even if the node went away afterwards — and none was stopped by a preemption notice, since a job
    that checkpoints on SIGTERM and exits 0 has not finished); failed_setup (any worker's
    setup failed: nothing was launched, or its command could not be started, and the workers still running are
    stopped); preempted (node preempted or gone, a worker
    saw the preemption notice, or a host lost its supervisor without a status);
    failed (every worker ended and one exited non-zero, or the first failure is
    `failure_grace` old: one host failing kills a slice, so the others are given a
    moment to report and an early crash is not mistaken for the root cause).

    `node_problem` (the node is not HEALTHY, as the Cloud TPU API says: `NodeHealth.unhealthy`) ends an attempt
    that has not succeeded, failed its setup or been preempted as an infrastructure failure, like a lost host: the
    job is retried from the infrastructure budget, in its region, and the TPU is not used again.

    A worker whose preflight found the host unfit (a TPU device or libtpu's lock held by another process, too little
    disk) ends the attempt as an infrastructure failure at once, naming the worker and what it found: nothing ran.
    An attempt that would end `failed` ends `infra_failed` instead when the last lines of its FIRST failing worker
    match a known TPU runtime failure (`runtime_failures`: the built-in table of tpuq.contracts.runtime_failures and
    the job's own patterns). Either way the scheduler quarantines the slice (never assigned again, deleted by the
    janitor) and retries the job from its infrastructure budget.

    A worker whose logs did not all reach GCS says so in every decision's detail, so that no attempt reads
    `succeeded` without it. `unwritable_statuses` (worker -> reason, from the probe: the supervisor ended
    but GCS refused its status object) ends the attempt as an infrastructure failure with that reason.
    """
    decision = _decide(worker_count, statuses, node_state, now, cancel_requested, lost_workers,
                       unwritable_statuses, failure_grace, node_problem, runtime_failures)
    warnings = _log_warnings(statuses)
    if isinstance(decision, Decided) and warnings:
        head, _, rest = decision.detail.partition("\n")  # the warning before any log tail, where it is seen
        detail = f"{head}, but {warnings}" + (f"\n{rest}" if rest else "")
        return Decided(decision.outcome, _limit(detail), decision.exit_codes, decision.stop_workers)
    return decision


def _log_warnings(statuses: Mapping[int, WorkerStatus]) -> str:
    """'the logs of workers 0, 1 could not be written to gs://B: GCS 403: ...', one clause per distinct reason."""
    by_reason: dict[str, list[int]] = {}
    for w, s in sorted(statuses.items()):
        if s.log_error:
            by_reason.setdefault(s.log_error, []).append(w)
    return "; ".join(f"the logs of worker{'s' if len(ws) > 1 else ''} {', '.join(map(str, ws))} {reason}"
                     for reason, ws in by_reason.items())


def _decide(
    worker_count: int,
    statuses: Mapping[int, WorkerStatus],
    node_state: NodeState,
    now: datetime,
    cancel_requested: bool,
    lost_workers: frozenset[int],
    unwritable_statuses: Mapping[int, str],
    failure_grace: timedelta,
    node_problem: str | None = None,
    runtime_failures: RuntimeFailures = RuntimeFailures(),
) -> Decision:
    exit_codes = {str(w): s.exit_code for w, s in sorted(statuses.items()) if s.exit_code is not None}
    ended = [statuses[w] for w in range(worker_count) if w in statuses]
    all_ended = len(ended) == worker_count

    if cancel_requested or any(s.cancelled and not s.stopped_by_executor for s in ended):
        return Decided(AttemptOutcome.cancelled, "cancelled", exit_codes)
    stopped = sorted((s for s in ended if s.stopped_by_executor), key=lambda s: (s.ended_at, s.worker_id))
    if stopped:
        # Stopped before the attempt's end was published: a launch that failed on another worker. The start that
        # stopped them publishes its own end (infra_failed, naming the worker and its error) at once; only if it
        # never does (its instance died) is the attempt ended here, after the failure grace, retried elsewhere.
        first, decide_at = stopped[0], stopped[0].ended_at + failure_grace
        if now < decide_at:
            return Wait(f"worker {first.worker_id} {first.cancel_reason}; the start decides", until=decide_at)
        return Decided(AttemptOutcome.infra_failed, f"worker {first.worker_id} {first.cancel_reason}", exit_codes)
    timed_out = sorted((s for s in ended if s.timed_out), key=lambda s: (s.ended_at, s.worker_id))
    if timed_out:
        return Decided(AttemptOutcome.failed, _timed_out_detail(timed_out), exit_codes)
    if all_ended and not any(s.is_failure or s.preempted for s in ended):
        return Decided(AttemptOutcome.succeeded, f"{all_workers(worker_count)} exited 0", exit_codes)
    setup_failures = [s for s in ended if s.is_setup_failure]
    if setup_failures:
        # A worker whose supervisor could not start the command (its fork failed, say) never started, while the
        # others may run theirs, waiting for it in a collective: they are stopped, the slice freed (issue 35 §3).
        return Decided(AttemptOutcome.failed_setup, _setup_detail(setup_failures), exit_codes,
                       stop_workers=not all_ended)
    if node_state in (NodeState.preempted, NodeState.gone):
        return Decided(AttemptOutcome.preempted, f"node {node_state.value}", exit_codes)
    if any(s.preempted for s in ended):
        noticed = sorted((s for s in ended if s.preempted), key=lambda s: (s.ended_at, s.worker_id))
        save_until = noticed[0].ended_at + NOTICE_GRACE
        if not all_ended and now < save_until:
            # The others are saving their checkpoints (the worker that writes them may be the slowest): ending the
            # attempt now would free the slice for deletion under them.
            return Wait(f"worker {noticed[0].worker_id} saw the notice; waiting for the others to save and stop",
                        until=save_until)
        workers = ", ".join(str(w) for w in sorted(s.worker_id for s in noticed))  # by number, not by when
        what = next((s.preemption_notice for s in noticed if s.preemption_notice not in (None, "preempted")), None)
        notice = f"the notice of {what}" if what else "the preemption notice"
        return Decided(AttemptOutcome.preempted, f"worker {workers} saw {notice}", exit_codes)
    if node_problem:
        return Decided(AttemptOutcome.infra_failed, _limit(f"{NODE_UNHEALTHY}: {node_problem}"), exit_codes)
    preflight_failures = [s for s in ended if s.is_preflight_failure]
    if preflight_failures:
        return Decided(AttemptOutcome.infra_failed,
                       preflight_detail({s.worker_id: s.preflight_error or "unfit" for s in preflight_failures}),
                       exit_codes)
    unwritable = {w: why for w, why in sorted(unwritable_statuses.items()) if w not in statuses}
    if unwritable:
        return Decided(AttemptOutcome.infra_failed,
                       _limit("; ".join(f"worker {w}: {why}" for w, why in unwritable.items())), exit_codes)
    lost = sorted(w for w in lost_workers if w not in statuses and 0 <= w < worker_count)
    if lost:
        return Decided(
            AttemptOutcome.preempted,
            f"worker {', '.join(map(str, lost))} lost its supervisor without a status (host restarted or gone)",
            exit_codes,
        )

    failures = sorted((s for s in ended if s.is_failure), key=lambda s: (s.ended_at, s.worker_id))
    if not failures:
        return Wait(f"{len(ended)} of {worker_count} worker{'s' if worker_count != 1 else ''} ended")
    decide_at = failures[0].ended_at + failure_grace
    if all_ended or now >= decide_at:
        missing = [w for w in range(worker_count) if w not in statuses]
        detail = _failure_detail(failures, missing)
        known = runtime_failures.find(failures[0].tail)
        if known is not None:
            first = failures[0].worker_id
            head = f"worker {first}'s last lines show a TPU runtime failure ({known.name}): {known.line}"
            return Decided(AttemptOutcome.infra_failed, _limit(f"{head}; {detail}"), exit_codes, stop_workers=True)
        # Workers still running past the grace (blocked in a collective with the one that died) are stopped: the
        # slice is freed for the next job, not left idling under this one.
        return Decided(AttemptOutcome.failed, detail, exit_codes, stop_workers=bool(missing))
    return Wait(f"worker {failures[0].worker_id} failed; waiting for the other workers", until=decide_at)


def _timed_out_detail(stopped: list[WorkerStatus]) -> str:
    first = stopped[0]
    limit = f" {format_duration(first.max_duration_seconds)}" if first.max_duration_seconds else ""
    workers = ", ".join(str(s.worker_id) for s in stopped)
    head = f"{TIMED_OUT}{limit} (max_duration): worker {workers} stopped"
    tail = "\n".join(first.tail.rstrip("\n").splitlines()[-TAIL_LINES:])
    return _limit(f"{head}\nlast lines of worker {first.worker_id}:\n{tail}" if tail else head)


def all_workers(count: int) -> str:
    """`the 1 worker`, `all 4 workers`: a slice's workers, said of every one of them."""
    return "the 1 worker" if count == 1 else f"all {count} workers"


def preflight_detail(findings: Mapping[int, str]) -> str:
    """'preflight failed: worker 2: /dev/vfio/0 is held by pid 4711 (python3 train.py)', one clause per worker."""
    return _limit(f"{PREFLIGHT_FAILED}: " + "; ".join(f"worker {w}: {why}" for w, why in sorted(findings.items())))


def _setup_detail(failures: list[WorkerStatus]) -> str:
    lines = [f"worker {s.worker_id}: {s.setup_error or 'setup failed'}" for s in failures]
    return _limit("setup failed: " + "; ".join(lines))


def _failure_detail(failures: list[WorkerStatus], missing: list[int]) -> str:
    first = failures[0]
    parts = [
        "worker "
        + ", ".join(f"{s.worker_id} exited {s.exit_code}" + (f" ({s.signal})" if s.signal else "") for s in failures)
    ]
    if missing:
        parts.append(f"no status yet from worker {', '.join(map(str, missing))}")
    parts.append(_resources(first))
    tail = "\n".join(first.tail.rstrip("\n").splitlines()[-TAIL_LINES:])
    head = "; ".join(p for p in parts if p)
    return _limit(f"{head}\nlast lines of worker {first.worker_id}:\n{tail}" if tail else head)


def _resources(status: WorkerStatus) -> str:
    out = []
    free, total = status.disk.get("free_bytes"), status.disk.get("total_bytes")
    if isinstance(free, int) and isinstance(total, int):
        out.append(f"disk {_gib(free)} free of {_gib(total)}")
    avail, mem_total = status.memory.get("available_bytes"), status.memory.get("total_bytes")
    if isinstance(avail, int) and isinstance(mem_total, int):
        out.append(f"memory {_gib(avail)} available of {_gib(mem_total)}")
    return f"worker {status.worker_id}: " + ", ".join(out) if out else ""


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _limit(text: str) -> str:
    if len(text) <= DETAIL_LIMIT:
        return text
    # Keep the head (what failed) and the end of the log (why).
    return text[: DETAIL_LIMIT // 4] + "\n[...]\n" + text[-(DETAIL_LIMIT * 3 // 4 - 10) :]
