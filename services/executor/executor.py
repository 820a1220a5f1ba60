"""The executor's service-facing API, shell (SSH, GCS): start, cancel, and judge an attempt.

    executor = Executor(ssh_login=lambda: SshLogin.of(load_fleet(db)), ssh_key=load_key, pin_store=pins,
                        host_keys=GuestAttributeHostKeys(tpu_client), objects=GcsObjectStore(storage_client),
                        clock=now_utc)
    result = executor.start_attempt(assignment)          # on an assign message
    if result.outcome: publish AttemptEvent(ended, result.outcome)
    else: publish AttemptEvent(started)

    decision = executor.cancel_attempt(assignment)       # on a cancel message: always Decided(cancelled)

    decision = executor.read_outcome(AttemptRef.from_assignment(a), node_state)   # on a status-object finalize
    if isinstance(decision, Decided): publish ended
    elif decision.until: schedule a re-check at decision.until (or let the next tick do it)

Every call is idempotent for one attempt, as Pub/Sub redelivers: a second
start_attempt of a running attempt changes nothing on the workers and returns
`already=True`.

A multislice attempt (Assignment.slices) is started, probed, cancelled and judged on every worker of every slice:
one pool over all of them, each worker known by its global id (tpuq.contracts.workers), which is also the id of its
status object and its exit code, so `decide_outcome` judges the N slices' workers as one attempt.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import paramiko

from tpuq.contracts import gcslayout
from tpuq.executor.budget import CLEANUP_SECONDS, Deadline, start_budget_seconds
from tpuq.executor.objects import ObjectStore
from tpuq.contracts.runtime_failures import RuntimeFailures
from tpuq.executor.outcome import (DEFAULT_FAILURE_GRACE, EXECUTOR_STOP_PREFIX, PHASE_PREFLIGHT, Decided, Decision,
                                   NodeState, WorkerStatus, decide_outcome, preflight_detail)
from tpuq.executor.pins import HostKeyPinStore, HostKeySource
from tpuq.executor.ssh import ConnectionCache, ConnectPolicy, SshLogin, WorkerConnection, WorkerPool, WorkerResult
from tpuq.executor.supervisor_bundle import build_supervisor_script
from tpuq.executor.worker.control import BOOTSTRAP
from tpuq.executor.workerspec import AttemptPlan, WorkerSettings, attempt_workers
from tpuq.contracts.messages import Assignment, AttemptOutcome, WorkerEndpoint

DETAIL_PER_WORKER = 600  # characters of one worker's error in a detail
# The reason the workers that did start record when another worker's launch failed: not a cancel, so the attempt
# ends infra_failed whoever judges it first (`outcome.EXECUTOR_STOP_PREFIX`).
LAUNCH_FAILED_STOP = EXECUTOR_STOP_PREFIX + "another worker failed to launch"
# Supervisor steps that take the worker's control lock (tpuq.executor.worker.processes.control_lock).
LOCKING_STEPS = frozenset({"prepare", "start", "launch"})
LOCK_WAIT_SLACK_SECONDS = 5.0  # the lock wait ends this long before the command's timeout, so the worker answers


@dataclass(frozen=True)
class AttemptRef:
    """Enough to cancel or judge an attempt: built from its assign or cancel message."""

    job_id: str
    attempt: int
    attempt_id: str
    node: str
    bucket: str | None  # job bucket name; None when a cancel message names none
    endpoints: tuple[WorkerEndpoint, ...]  # every slice's workers, by the attempt's (global) worker id
    # What counts as a TPU runtime failure in this job's exits (its infra_failure_patterns, the built-in table).
    runtime_failures: RuntimeFailures = RuntimeFailures()
    # A multislice attempt: each worker's (node, id within it); None on one slice (tpuq.executor.ssh.WorkerPool).
    slots: Mapping[int, tuple[str, int]] | None = None

    @classmethod
    def from_assignment(cls, assignment: Assignment) -> "AttemptRef":
        bucket = None
        if assignment.job is not None and assignment.endpoints and assignment.action.value == "assign":
            bucket = AttemptPlan.from_assignment(assignment).bucket
        elif assignment.job_bucket:
            bucket = gcslayout.bucket_name(assignment.job_bucket)
        workers = attempt_workers(assignment)
        return cls(
            job_id=assignment.job_id,
            attempt=assignment.attempt,
            attempt_id=assignment.attempt_id,
            node=assignment.node,
            bucket=bucket,
            endpoints=workers.endpoints,
            runtime_failures=_runtime_failures(assignment),
            slots=workers.slots,
        )

    @property
    def worker_count(self) -> int:
        return len(self.endpoints)


@dataclass(frozen=True)
class StartResult:
    """`outcome` is set when the attempt ended before its command ran (publish it as ended)."""

    started: bool
    already: bool = False
    outcome: Decided | None = None
    notes: Mapping[int, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerProbe:
    """What `status` on a worker said; `reachable=False` when SSH failed."""

    worker_id: int
    reachable: bool
    current: bool = False  # the worker's workspace belongs to this attempt
    launched: bool = False
    supervisor_alive: bool = False
    job_alive: bool = False
    has_status: bool = False
    status_error: str | None = None  # the supervisor ended, and GCS refused its status object: why
    error: str | None = None

    @property
    def lost(self) -> bool:
        """Reachable, but the attempt is not running there and left no status: the host restarted or was reused."""
        if not self.reachable:
            return False
        if not self.current:
            return True
        return self.launched and not self.supervisor_alive and not self.has_status


class Executor:
    def __init__(
        self,
        *,
        ssh_login: Callable[[], SshLogin],
        ssh_key: Callable[[], paramiko.PKey],
        pin_store: HostKeyPinStore,
        host_keys: HostKeySource,
        objects: ObjectStore,
        clock: Callable[[], datetime],
        settings: WorkerSettings = WorkerSettings(),
        connect_policy: ConnectPolicy = ConnectPolicy(),
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        failure_grace: timedelta = DEFAULT_FAILURE_GRACE,
        command_timeout: float = 900.0,
        connection_cache: ConnectionCache | None = None,
        start_budget: float | None = None,
    ):
        # Read per pool: the fleet in force names the user and the address (`SshLogin.of(fleet)`).
        self.ssh_login = ssh_login
        self._ssh_key = ssh_key
        self.pin_store = pin_store
        self.host_keys = host_keys
        self.objects = objects
        self.clock = clock
        self.settings = settings
        self.connect_policy = connect_policy
        self._sleep = sleep
        self._monotonic = monotonic
        self.failure_grace = failure_grace
        self.command_timeout = command_timeout
        # How long one start may take, all steps together (tpuq.executor.budget): inside the assignment's push.
        self.start_budget = start_budget_seconds() if start_budget is None else start_budget
        self._script = build_supervisor_script()
        # Connections kept between attempts (None: a new connection per call). See tpuq.executor.ssh.
        self.connection_cache = connection_cache

    def _status_bucket(self, ref: "AttemptRef") -> str | None:
        return self.settings.status_bucket or ref.bucket

    # -- SSH plumbing ---------------------------------------------------------

    def _pool(self, attempt: "AttemptPlan | AttemptRef", deadline: Deadline | None = None) -> WorkerPool:
        """Connections to every worker of the attempt: its node's, or every slice's."""
        login = self.ssh_login()
        return WorkerPool(
            attempt.endpoints,
            user=login.user,
            pkey=self._ssh_key(),
            node=attempt.node,
            slots=attempt.slots,
            pin_store=self.pin_store,
            host_keys=self.host_keys,
            transport=login.transport,
            policy=self.connect_policy,
            sleep=self._sleep,
            monotonic=self._monotonic,
            cache=self.connection_cache,
            deadline=deadline,
        )

    def forget_nodes(self, nodes: set[str]) -> int:
        """Close the connections kept to these nodes (they left the fleet); returns how many."""
        return self.connection_cache.forget_nodes(nodes) if self.connection_cache is not None else 0

    def _supervisor(self, conn: WorkerConnection, *args: str, stdin: str | None = None,
                    deadline: Deadline | None = None, timeout: float | None = None) -> dict:
        """Run a supervisor subcommand and parse its one-line JSON answer. With a deadline, the command gets what is
        left of it (`prepare`, `start` and `launch` also wait no longer for the worker's control lock)."""
        directory, module = gcslayout.WORKER_SUPERVISOR.removesuffix(".py").rsplit("/", 1)
        limit = self.command_timeout if timeout is None else timeout
        if deadline is not None:
            limit = deadline.cap(limit, f"`{args[0]}` on worker {conn.worker_id}")
            if args[0] in LOCKING_STEPS:
                # The worker answers "another prepare or launch holds this worker" before the command times out.
                args = (args[0], "--lock-wait", f"{max(limit - LOCK_WAIT_SLACK_SECONDS, 0.0):.0f}", *args[1:])
        argv = [self.settings.python, "-I", "-S", "-c", BOOTSTRAP, directory, module, *args]
        result = conn.exec(argv, stdin=stdin, timeout=limit)
        try:
            answer = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RuntimeError(
                f"supervisor {args[0]} exited {result.exit_code} without an answer: {result.stderr.strip()[-400:]}"
            ) from None
        if not isinstance(answer, dict):
            raise RuntimeError(f"supervisor {args[0]} answered {answer!r}")
        return answer

    # -- start ----------------------------------------------------------------

    def start_attempt(self, assignment: Assignment) -> StartResult:
        """Prepare every worker, then launch the command on all of them (or on none).

        Raises tpuq.contracts.errors.Permanent for an assignment that can never run (no job,
        bad endpoints, env that overrides runner variables, no bucket).
        """
        plan = AttemptPlan.from_assignment(assignment)
        deadline = Deadline.after(self.start_budget, self._monotonic)
        with self._pool(plan, deadline) as pool:
            unreachable = pool.connect()
            if unreachable:
                return StartResult(False, outcome=_infra("could not reach", unreachable, deadline))

            # A one-worker slice is prepared and launched by one supervisor process (`start`): there is no
            # other worker to wait for before launching. A slice of several prepares every worker first.
            alone = len(pool.connections) == 1
            step = ["start", "--attempt-id", plan.attempt_id] if alone else ["prepare"]

            def prepare(conn: WorkerConnection) -> dict:
                conn.bound_io(deadline.cap(self.command_timeout, f"writing to worker {conn.worker_id}"))
                home = conn.home()
                # A kept connection already wrote this very script: the workspace is cleaned, never the script.
                wrote = conn.put_file_once(gcslayout.WORKER_SUPERVISOR, self._script, 0o755)
                spec = json.dumps(plan.worker_spec(conn.worker_id, home, self.settings))
                try:
                    return self._supervisor(conn, *step, stdin=spec, deadline=deadline)
                except RuntimeError:
                    if wrote:
                        raise
                    # Someone removed it since (a job may delete ~/tpuq): write it again, once.
                    conn.put_file(gcslayout.WORKER_SUPERVISOR, self._script, 0o755)
                    return self._supervisor(conn, *step, stdin=spec, deadline=deadline)

            prepared = pool.run(prepare)
            launched_too = {}
            if alone:
                launched_too = {w: WorkerResult(w, value=r.value["launched"]) for w, r in prepared.items()
                                if r.ok and r.value.get("launched") is not None}
                prepared = {w: WorkerResult(w, value=r.value["prepared"]) if r.ok else r for w, r in prepared.items()}
            notes = {w: list(r.value.get("notes", [])) for w, r in prepared.items() if r.ok and r.value}
            setup = {w: r.value["reason"] for w, r in prepared.items()
                     if r.ok and not r.value.get("ok") and r.value.get("kind") == "setup"}
            if setup:
                detail = "setup failed: " + "; ".join(f"worker {w}: {_short(m)}" for w, m in sorted(setup.items()))
                return StartResult(False, outcome=Decided(AttemptOutcome.failed_setup, detail[:8000]), notes=notes)
            unfit = {w: _short(r.value["reason"]) for w, r in prepared.items()
                     if r.ok and not r.value.get("ok") and r.value.get("kind") == PHASE_PREFLIGHT}
            if unfit:  # a TPU device or libtpu's lock held, or too little disk: the slice is quarantined
                return StartResult(False, outcome=Decided(AttemptOutcome.infra_failed, preflight_detail(unfit)),
                                   notes=notes)
            failed = _failures(prepared)
            if failed:
                return StartResult(False, outcome=_infra("could not prepare", failed, deadline), notes=notes)

            launched = launched_too or pool.run(
                lambda c: self._supervisor(c, "launch", "--attempt-id", plan.attempt_id, deadline=deadline))
            failed = _failures(launched)
            if failed:
                if any(r.ok and r.value.get("kind") == "cancelled" for r in launched.values()):
                    return StartResult(False, outcome=Decided(AttemptOutcome.cancelled, "cancelled before launch"))
                # One host missing kills a slice: stop the workers that did start.
                started = [w for w, r in launched.items() if r.ok and r.value.get("ok")]
                # After the budget, if need be: the margin holds CLEANUP_SECONDS for it.
                pool.run(lambda c: self._supervisor(c, "cancel", "--attempt-id", plan.attempt_id,
                                                    "--reason", LAUNCH_FAILED_STOP, "--grace", "5",
                                                    timeout=CLEANUP_SECONDS),
                         started)
                return StartResult(False, outcome=_infra("could not launch", failed, deadline), notes=notes)
            already = all(r.value.get("already") for r in prepared.values())
            return StartResult(True, already=already, notes=notes)

    # -- cancel ---------------------------------------------------------------

    def cancel_attempt(
        self, assignment: Assignment | AttemptRef, reason: str = "cancelled", grace_seconds: float | None = None,
        marker: bool = True,
    ) -> Decided:
        """TERM the job's process group on every worker (KILL after the grace). The outcome is cancelled.

        The cancel marker in GCS makes every later read_outcome of the attempt say
        cancelled too, whatever the workers' exit codes. `marker=False` only stops the workers (an attempt whose
        end is already published otherwise, e.g. its node turned unhealthy).
        """
        ref = assignment if isinstance(assignment, AttemptRef) else AttemptRef.from_assignment(assignment)
        status_bucket = self._status_bucket(ref)
        if status_bucket and marker:
            marker = json.dumps({"attempt_id": ref.attempt_id, "reason": reason, "at": self.clock().isoformat()})
            self.objects.create(status_bucket, gcslayout.cancelled_marker_name(ref.job_id, ref.attempt), marker.encode(),
                                "application/json")
        args = ["cancel", "--attempt-id", ref.attempt_id, "--reason", reason[:500]]
        if grace_seconds is not None:
            args += ["--grace", str(grace_seconds)]
        problems: dict[int, object] = {}
        if ref.endpoints:
            with self._pool(ref) as pool:
                problems.update(pool.connect())
                problems.update(_failures(pool.run(lambda c: self._supervisor(c, *args))))
        detail = reason
        if problems:
            detail += "; not reached: " + "; ".join(f"worker {w}: {_short(e)}" for w, e in sorted(problems.items()))
        return Decided(AttemptOutcome.cancelled, detail[:8000])

    # -- outcome --------------------------------------------------------------

    def read_statuses(self, ref: AttemptRef) -> tuple[dict[int, WorkerStatus], bool]:
        """The attempt's status objects (ignoring any of another attempt id) and whether it was cancelled."""
        bucket = self._status_bucket(ref)
        if not bucket:
            raise ValueError("the attempt's job bucket is not known")
        statuses: dict[int, WorkerStatus] = {}
        cancelled = False
        for name in self.objects.list_names(bucket, gcslayout.status_prefix(ref.job_id, ref.attempt)):
            parsed = gcslayout.parse_status_object_name(name)
            if parsed is None:
                continue
            stored = self.objects.read(bucket, name)
            if stored is None:
                continue
            try:
                data = json.loads(stored.data)
            except ValueError:
                continue
            if data.get("attempt_id") != ref.attempt_id:
                continue
            if parsed.is_cancel_marker:
                cancelled = True
            else:
                statuses[parsed.worker_id] = WorkerStatus.from_json(data, stored_at=stored.created)
        return statuses, cancelled

    def read_outcome(
        self,
        attempt: Assignment | AttemptRef,
        node_state: NodeState = NodeState.unknown,
        lost_workers: frozenset[int] = frozenset(),
        unwritable_statuses: Mapping[int, str] = {},
        node_problem: str | None = None,
    ) -> Decision:
        ref = attempt if isinstance(attempt, AttemptRef) else AttemptRef.from_assignment(attempt)
        statuses, cancelled = self.read_statuses(ref)
        return decide_outcome(
            worker_count=ref.worker_count,
            statuses=statuses,
            node_state=node_state,
            now=self.clock(),
            cancel_requested=cancelled,
            lost_workers=lost_workers,
            unwritable_statuses=unwritable_statuses,
            failure_grace=self.failure_grace,
            node_problem=node_problem,
            runtime_failures=ref.runtime_failures,
        )

    def probe_attempt(self, attempt: Assignment | AttemptRef) -> dict[int, WorkerProbe]:
        """Ask every worker what it runs (for ticks: finds hosts that restarted and lost the job)."""
        ref = attempt if isinstance(attempt, AttemptRef) else AttemptRef.from_assignment(attempt)
        probes: dict[int, WorkerProbe] = {}
        with self._pool(ref) as pool:
            for w, e in pool.connect().items():
                probes[w] = WorkerProbe(w, reachable=False, error=_short(e))
            for w, r in pool.run(lambda c: self._supervisor(c, "status", "--attempt-id", ref.attempt_id)).items():
                if not r.ok:
                    probes[w] = WorkerProbe(w, reachable=False, error=_short(r.error))
                    continue
                s = r.value
                probes[w] = WorkerProbe(
                    w,
                    reachable=True,
                    current=bool(s.get("current")),
                    launched=bool(s.get("launched")),
                    supervisor_alive=bool(s.get("supervisor_alive")),
                    job_alive=bool(s.get("job_alive")),
                    has_status=s.get("status") is not None,
                    status_error=None if s.get("supervisor_alive") else (s.get("status") or {}).get("status_upload_error"),
                )
        return dict(sorted(probes.items()))


def _runtime_failures(assignment: Assignment) -> RuntimeFailures:
    """The job's reading of its exits: its own patterns, and the built-in table unless it turned that off. A cancel
    message carries no job: the built-in table (a cancelled attempt ends cancelled whatever its last lines)."""
    job = assignment.job
    if job is None:
        return RuntimeFailures()
    return RuntimeFailures.for_job(job.infra_failure_patterns, job.builtin_infra_failure_patterns)


def _short(error: object) -> str:
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    return text[:DETAIL_PER_WORKER]


def _failures(results) -> dict[int, object]:
    out: dict[int, object] = {}
    for w, r in results.items():
        if not r.ok:
            out[w] = r.error
        elif not r.value.get("ok"):
            out[w] = r.value.get("reason", "failed")
    return out


def _infra(what: str, problems: Mapping[int, object], deadline: Deadline | None = None) -> Decided:
    detail = f"{what} worker " + "; ".join(f"{w}: {_short(e)}" for w, e in sorted(problems.items()))
    if deadline is not None and deadline.expired:
        # Said first: the per-worker errors (a command timed out, a host key never came) are its symptoms.
        detail = f"{deadline.describe()} ran out: {detail}"
    return Decided(AttemptOutcome.infra_failed, detail[:8000])
