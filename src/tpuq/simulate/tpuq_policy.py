"""The `tpuq` policy: the four services' own handlers, in process, over the in-memory store, in virtual time.

Each service is its real `Service` (the handler adapter: validation, dead letters, bounded redelivery) built by
its own `build_service`/`make_handlers`, with these shells swapped for in-process ones:
- Firestore: `tpuq.inmemory.MemoryFirestore` on the virtual clock;
- Pub/Sub: `SimBus` (push to `Service.deliver`, latency, duplicates, redelivery of 5xx);
- the Cloud TPU API, Cloud Quotas and Cloud Billing: `tpuq.simulate.inprocess` over the capacity model;
- the executor's SSH and GCS shell (`Executor`): `SimExecutor` below, whose workers are `SimWorkers`; the
  executor's handlers and its pure outcome rules (`tpuq.executor.outcome.decide_outcome`) are the real ones;
- Cloud Scheduler: a tick on `tick_seconds` (production's: one a minute).
Nothing here decides anything the services decide.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from tpuq import gcslayout
from tpuq.auth import PushAuth
from tpuq.claimer import handlers as claimer_handlers
from tpuq.claimer.tpuapi import TpuApi
from tpuq.cloudchecks import PrecheckCache, PrecheckReader
from tpuq.clients import Clients, Settings
from tpuq.documents import NodeHealth, TpuNodeState
from tpuq.executor import handlers as executor_handlers
from tpuq.executor.executor import StartResult, WorkerProbe
from tpuq.executor.outcome import DEFAULT_FAILURE_GRACE, Decided, Decision, NodeState, WorkerStatus, decide_outcome
from tpuq.fleet import FleetFile
from tpuq.fleetstore import save_fleet
from tpuq.inmemory import MemoryFirestore
from tpuq.janitor import handlers as janitor_handlers
from tpuq.janitor.deleter import DeleteAdapter
from tpuq.jobspec import PublishedJob
from tpuq.messages import Assignment, AttemptOutcome, GcsObjectEvent, Tick
from tpuq.scheduler import handlers as scheduler_handlers
from tpuq.service import Service

from .bus import Delivery, SimBus
from .cloud import SimCloud
from .events import EventLoop
from .inprocess import SimGoogleApisSession, SimTpuClient
from .workers import AttemptRun, SimWorkers
from .quiet import Deadlines, TracedClock
from .waits import Waits
from .workload import SimJob

RUNNER_BUCKET = "gs://tpuq-sim-runner"
SIM_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHNpbXVsYXRpb25rZXlub3RhcmVhbGtleTAwMDAwMDAw tpuq-sim"
PRODUCTION_TICK_SECONDS = 60.0  # infra/scheduler.yaml: one Cloud Scheduler job a minute


@dataclass
class SimExecutor:
    """The executor's shell (`tpuq.executor.executor.Executor`'s methods), with the workers modelled.

    A worker's status object is "written" when its work ends and announced on `gcs-events`, as the runner
    bucket's notification does; a preempted or deleted node's workers write nothing (their hosts are gone)."""

    loop: EventLoop
    cloud: SimCloud
    workers: SimWorkers
    bus: SimBus
    failure_grace: timedelta = DEFAULT_FAILURE_GRACE
    connection_cache = None
    statuses: dict[tuple[str, int], dict[int, WorkerStatus]] = field(default_factory=dict)
    cancelled: set[tuple[str, int]] = field(default_factory=set)
    worker_counts: dict[tuple[str, int], int] = field(default_factory=dict)
    attempt_ids: dict[tuple[str, int], str] = field(default_factory=dict)

    def _node(self, name: str):
        return self.cloud.world.nodes.get(name)

    def _ready(self, name: str) -> bool:
        node = self._node(name)
        return node is not None and node.state == TpuNodeState.READY

    def start_attempt(self, assignment: Assignment) -> StartResult:
        key = (assignment.job_id, assignment.attempt)
        self.cloud.world.advance()
        if self.workers.running(*key) or key in self.statuses:
            return StartResult(True, already=True)
        if not self._ready(assignment.node):
            return StartResult(False, outcome=Decided(AttemptOutcome.infra_failed,
                                                      f"could not reach: node {assignment.node} is not READY"))
        self.worker_counts[key] = max(1, len(assignment.endpoints))
        self.attempt_ids[key] = assignment.attempt_id
        self.workers.start(assignment.job_id, assignment.attempt, assignment.node,
                           self._node(assignment.node).accelerator.chips)
        return StartResult(True)

    def run_ended(self, run: AttemptRun) -> None:
        """Every worker exited 0 at the run's end: its status objects, and their notifications."""
        key = (run.job_id, run.attempt)
        count = self.worker_counts.get(key, 1)
        ended_at = self.loop.wall(run.ended_at or self.loop.now())
        self.statuses[key] = {w: WorkerStatus(w, self.attempt_ids.get(key, ""), ended_at, exit_code=0)
                              for w in range(count)}
        for w in range(count):
            event = GcsObjectEvent(bucket=gcslayout.bucket_name(RUNNER_BUCKET),
                                   name=gcslayout.worker_status_name(run.job_id, run.attempt, w))
            self.bus.publish("gcs-events", event.model_dump_json(exclude_none=True).encode())

    def cancel_attempt(self, assignment, reason: str = "cancelled", grace_seconds: float | None = None,
                       marker: bool = True) -> Decided:
        key = (assignment.job_id, assignment.attempt)
        self.workers.stop(assignment.job_id, assignment.attempt, self.loop.now())
        if marker:
            self.cancelled.add(key)
        return Decided(AttemptOutcome.cancelled, reason)

    def read_outcome(self, attempt, node_state: NodeState = NodeState.unknown,
                     lost_workers: frozenset[int] = frozenset(), unwritable_statuses: Mapping[int, str] = {},
                     node_problem: str | None = None) -> Decision:
        key = (attempt.job_id, attempt.attempt)
        return decide_outcome(
            worker_count=self.worker_counts.get(key, max(1, len(attempt.endpoints))),
            statuses=self.statuses.get(key, {}), node_state=node_state, now=self.loop.utcnow(),
            cancel_requested=key in self.cancelled, lost_workers=lost_workers,
            unwritable_statuses=unwritable_statuses, failure_grace=self.failure_grace, node_problem=node_problem)

    def probe_attempt(self, attempt) -> dict[int, WorkerProbe]:
        key = (attempt.job_id, attempt.attempt)
        reachable = self._ready(attempt.node)
        running = self.workers.running(*key) is not None
        return {w: WorkerProbe(w, reachable=reachable, current=True, launched=True, supervisor_alive=running,
                               job_alive=running, has_status=key in self.statuses)
                for w in range(self.worker_counts.get(key, max(1, len(attempt.endpoints))))}

    def forget_nodes(self, nodes: set[str]) -> int:
        return 0


class SimTpuApi(TpuApi):
    """The claimer's TPU shell, with each node's JSON parsed once per distinct answer (a watch pass reads every
    ACTIVE node each tick; most answers are the same as the last one)."""

    def __init__(self, client: SimTpuClient, parsed: dict, **kwargs):
        super().__init__(client, node_json=client.node_json, **kwargs)
        self._parsed = parsed

    def get_node(self, name: str):
        from google.cloud import tpu_v2

        data = self._call(self.node_json, name=name)
        key = json.dumps(data, sort_keys=True)
        hit = self._parsed.get(key)
        if hit is None:
            if len(self._parsed) > 20_000:
                self._parsed.clear()
            node = tpu_v2.Node.from_json(key, ignore_unknown_fields=True)
            hit = self._parsed[key] = (tpu_v2.Node.serialize(node), NodeHealth.from_api(data))
        return tpu_v2.Node.deserialize(hit[0]), hit[1]


class ScenarioPrecheckCache(PrecheckCache):
    """The claimer's quota and billing cache, read again only when the scenario's quota or billing can have
    changed (`changes`: the scenario instants where it does) or when the claimer asks for a fresh read.

    Production re-reads every 5 minutes because a person may change either at any time; in a scenario they
    change only at its own instants, so every other re-read would read the same answer."""

    def __init__(self, reader, changes: list[float]):
        super().__init__(reader, ttl_seconds=3.0e9)  # "never", in what timedelta holds
        self.changes = sorted(changes)
        self._read_at: float | None = None

    def get(self, fleet, now, fresh: bool = False):
        from .quiet import seconds_of

        t = seconds_of(now)
        if self._read_at is not None and any(self._read_at < c <= t for c in self.changes):
            fresh = True
        if fresh or self._read_at is None:
            self._read_at = t
        return super().get(fleet, now, fresh)


class TpuqPolicy:
    name = "tpuq"

    def __init__(self, *, loop: EventLoop, cloud: SimCloud, workers: SimWorkers, jobs: list[SimJob],
                 fleet: FleetFile, rng: random.Random, tick_seconds: float = PRODUCTION_TICK_SECONDS,
                 delivery: Delivery = Delivery(), skip_quiet_ticks: bool = True, verify_quiet: bool = False) -> None:
        self.loop, self.cloud, self.workers, self.jobs, self.rng = loop, cloud, workers, jobs, rng
        self.fleet = fleet.model_copy(update={"project": cloud.project})
        self.tick_seconds = tick_seconds
        self.deadlines = Deadlines()
        self.clock = TracedClock(loop, self.deadlines)
        self.waits = Waits(loop)
        self.skip_quiet_ticks = skip_quiet_ticks or verify_quiet
        self.verify_quiet = verify_quiet
        self.ticks_run = self.ticks_skipped = 0
        self.ticks_quiet_checked = 0  # verify: ticks skipping would have skipped, run and checked
        self.violations: list[float] = []  # verify: ticks skipping would have skipped that did something
        self._last_tick: tuple | None = None  # (activity, reads) once the last tick that ran was handled, if quiet
        self._tick_in_flight: _TickRecord | None = None
        self.db = MemoryFirestore(project=cloud.project, now=loop.utcnow, rng=random.Random(rng.random()))
        self.clients = Clients(Settings(project=cloud.project, runner_bucket=RUNNER_BUCKET))
        self.tpu_client = SimTpuClient(cloud)
        self._parsed_nodes: dict = {}
        self.clients.__dict__["firestore"] = self.db
        self.clients.__dict__["tpu"] = self.tpu_client
        services = self._services()
        self.bus = SimBus(loop, services, rng.randrange(2 ** 32), delivery,
                          observe_ticks=(self.activity, self.cloud.calls, self.on_tick_delivered),
                          waits=self.waits, waiting_topics={"capacity"})
        self.clients.__dict__["publisher"] = self.bus
        self.executor = SimExecutor(loop, cloud, workers, self.bus)
        workers.on_end = self.executor.run_ended
        # The modelled workers are lost only with their node, which the claimer's watch reports: a probe
        # would never find anything (and each would be a tick that cannot be skipped).
        executor_handlers.use_executor(self.clients, self.executor, probe_every=None)

    def _services(self) -> dict[str, Service]:
        prechecks = ScenarioPrecheckCache(
            PrecheckReader(SimGoogleApisSession(self.cloud), "https://sim-quotas/", "https://sim-billing/"),
            changes=self.cloud.scenario_changes())
        services = {
            "claimer": claimer_handlers.build_service(
                public_key=lambda fleet: SIM_PUBLIC_KEY, sleep=self._handler_sleep,
                tpu_factory=lambda ctx: SimTpuApi(self.tpu_client, self._parsed_nodes, max_workers=1, attempts=1),
                prechecks_factory=lambda ctx: prechecks),
            "scheduler": scheduler_handlers.build_service(),
            "executor": executor_handlers.build_service(),
            "janitor": janitor_handlers.build_service(
                adapter_factory=lambda ctx, fleet: DeleteAdapter(self.tpu_client, fleet, max_workers=1, attempts=1)),
        }
        for service in services.values():
            service.clients_factory = lambda: self.clients
            service.now = self.clock
            service.rng = random.Random(0)  # replaced at each delivery by the bus's keyed one
            service.push_auth = PushAuth.from_env({})
        return services

    def _handler_sleep(self, seconds: float) -> None:
        """A handler that waits (the claimer's fast watch) holds its own push that long; the rest goes on."""
        self.waits.sleep(seconds)

    def start(self) -> None:
        save_fleet(self.db, self.fleet, self.loop.utcnow())
        for job in self.jobs:
            self.loop.at(job.submit_at, self._submit, job)
        self.loop.every(self.tick_seconds, self._tick, first=self.tick_seconds)

    def _submit(self, job: SimJob) -> None:
        # A job held to regions names one bucket in each, as a user does (the scheduler runs it where one is).
        buckets = [{"uri": f"gs://tpuq-sim-{region}", "region": region} for region in job.regions or ()]
        published = PublishedJob(id=job.job_id, tpu=list(job.types), priority=job.priority, buckets=buckets,
                                 command=f"sim-work {job.work_seconds:.0f}")
        self.bus.publish("jobs", published.model_dump_json(exclude_none=True).encode())

    def activity(self) -> tuple[int, ...]:
        """What changes when anything happens: documents, messages, the cloud's mutations, attempts."""
        return (self.db.changes, sum(self.bus.published.values()) - self.bus.published["ticks"],
                sum(self.bus.failed.values()), self.cloud.mutations, len(self.workers.runs))

    def _quiet_since_last_tick(self) -> bool:
        """The last tick only read (every service's handling of it changed nothing), nothing happened since, and
        no instant the services' rules or the cloud's schedule care about comes before this tick would."""
        if self._last_tick is None:
            return False
        activity, _ = self._last_tick
        # The tick's handlers would run when its deliveries arrive: every one of them must come before the
        # earliest instant a rule flips or the cloud changes.
        reached = self.loop.now() + self.bus.tick_reaches_all_by(self._tick_number())
        due = self.cloud.next_transition()
        return (activity == self.activity() and not self.deadlines.opaque and reached < self.deadlines.earliest
                and (due is None or reached < due))

    def _tick(self) -> None:
        verifying = False
        if self.skip_quiet_ticks and self._quiet_since_last_tick():
            if not self.verify_quiet:
                self.ticks_skipped += 1
                self.cloud.calls.update(self._last_tick[1])  # what the skipped tick would have read
                return
            verifying = True
            self.ticks_quiet_checked += 1
        self._last_tick = None
        self.deadlines.reset()
        self.ticks_run += 1
        number = self._tick_number()
        message_id = self.bus.publish_tick(Tick(at=self.loop.utcnow(), seq=number, source="simulator")
                                           .model_dump_json(exclude_none=True).encode(), number)
        self._tick_in_flight = _TickRecord(message_id, verifying, self.bus.subscriptions_of("ticks"))

    def _tick_number(self) -> int:
        return round(self.loop.now() / self.tick_seconds)

    def on_tick_delivered(self, message_id: str, subscription: str, changed: bool, reads) -> None:
        """The bus reports each tick delivery: whether the handler changed anything, and what it read."""
        record = self._tick_in_flight
        if record is None or record.message_id != message_id:
            return  # a redelivery or a duplicate of an older tick: its handling counts as activity if it acts
        record.pending.discard(subscription)
        record.changed = record.changed or changed
        record.reads.update(reads)
        if record.pending:
            return
        self._tick_in_flight = None
        if record.verifying and record.changed:
            self.violations.append(self.loop.now())
        self._last_tick = None if record.changed else (self.activity(), record.reads)


@dataclass
class _TickRecord:
    message_id: str
    verifying: bool
    pending: set[str]
    changed: bool = False
    reads: Counter = field(default_factory=Counter)
