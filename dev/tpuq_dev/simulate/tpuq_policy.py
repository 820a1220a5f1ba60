"""The `tpuq` policy: the four services' own handlers, in process, over the in-memory store, in virtual time.

Each service is its real `Service` (the handler adapter: validation, dead letters, bounded redelivery) built by
its own `build_service(settings, clients, ...)`, with these shells swapped for in-process ones:
- Firestore: `tpuq_dev.inmemory.MemoryFirestore` on the virtual clock;
- Pub/Sub: `SimBus` (push to `Service.deliver`, latency, duplicates, redelivery of 5xx);
- the Cloud TPU API, Cloud Quotas and Cloud Billing: `tpuq_dev.simulate.inprocess` over the capacity model;
- the executor's SSH and GCS shell (`Executor`): `SimExecutor` below, whose workers are `SimWorkers`; the
  executor's handlers and its pure outcome rules (`tpuq.executor.outcome.decide_outcome`) are the real ones;
- Cloud Scheduler: a tick on `tick_seconds` (production's: one a minute).
Nothing here decides anything the services decide.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tpuq.contracts import gcslayout, topology
from tpuq.runtime.auth import PushAuth
from tpuq.claimer import handlers as claimer_handlers
from tpuq.claimer.tpuapi import TpuApi
from tpuq.capacity.cloudchecks import PrecheckCache, PrecheckReader
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.contracts.documents import NodeHealth, TpuNodeState
from tpuq.executor import handlers as executor_handlers
from tpuq.executor.executor import StartResult, WorkerProbe
from tpuq.executor.outcome import DEFAULT_FAILURE_GRACE, Decided, Decision, NodeState, WorkerStatus, decide_outcome
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import save_fleet
from tpuq_dev.inmemory import MemoryFirestore
from tpuq_dev.inmemory.firestore import BilledOps, _lookup
from tpuq.janitor import handlers as janitor_handlers
from tpuq.janitor.deleter import DeleteAdapter
from tpuq.contracts.jobspec import PublishedJob
from tpuq.contracts.messages import Assignment, AttemptOutcome, GcsObjectEvent, Tick
from tpuq.scheduler import handlers as scheduler_handlers
from tpuq.runtime.service import Service

from .bus import QUIET, Delivery, SimBus
from .cloud import SimCloud
from .events import EventLoop
from .inprocess import SimGoogleApisSession, SimTpuClient, parse_json
from .metrics import FirestoreOps
from .observed import RepeatedObservations
from .workers import AttemptRun, SimWorkers
from .quiet import Deadlines, TracedClock, TracedNow, flips_from
from .storeops import OpsBySubscription
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
    # Told whenever a handler reads the nodes' state (cloud=True) or the workers' (cloud=False).
    on_read: Callable[[bool], None] = lambda cloud: None
    connection_cache = None
    statuses: dict[tuple[str, int], dict[int, WorkerStatus]] = field(default_factory=dict)
    cancelled: set[tuple[str, int]] = field(default_factory=set)
    worker_counts: dict[tuple[str, int], int] = field(default_factory=dict)
    attempt_ids: dict[tuple[str, int], str] = field(default_factory=dict)

    def _node(self, name: str):
        self.on_read(True)
        return self.cloud.world.nodes.get(name)

    def _ready(self, name: str) -> bool:
        node = self._node(name)
        return node is not None and node.state == TpuNodeState.READY

    def start_attempt(self, assignment: Assignment) -> StartResult:
        key = (assignment.job_id, assignment.attempt)
        self.on_read(False)
        self.cloud.world.advance()
        if self.workers.running(*key) or key in self.statuses:
            return StartResult(True, already=True)
        nodes = _nodes_of(assignment)
        down = next((node for node in nodes if not self._ready(node)), None)
        if down is not None:
            return StartResult(False, outcome=Decided(AttemptOutcome.infra_failed,
                                                      f"could not reach: node {down} is not READY"))
        # Every worker of every slice (a multislice attempt's workers are numbered slice after slice).
        self.worker_counts[key] = _worker_count(assignment)
        self.attempt_ids[key] = assignment.attempt_id
        self.workers.start(assignment.job_id, assignment.attempt, nodes,
                           sum(self._node(node).accelerator.chips for node in nodes))
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
            # The attributes Cloud Storage sets on a notification, which the subscriptions' filters read
            # (https://cloud.google.com/storage/docs/pubsub-notifications#attributes).
            self.bus.publish("gcs-events", event.model_dump_json(exclude_none=True).encode(),
                             bucketId=event.bucket, objectId=event.name, eventType="OBJECT_FINALIZE",
                             payloadFormat="JSON_API_V1")

    def cancel_attempt(self, assignment, reason: str = "cancelled", grace_seconds: float | None = None,
                       marker: bool = True) -> Decided:
        key = (assignment.job_id, assignment.attempt)
        self.on_read(False)
        self.workers.stop(assignment.job_id, assignment.attempt, self.loop.now())
        if marker:
            self.cancelled.add(key)
        return Decided(AttemptOutcome.cancelled, reason)

    def read_outcome(self, attempt, node_state: NodeState = NodeState.unknown,
                     lost_workers: frozenset[int] = frozenset(), unwritable_statuses: Mapping[int, str] = {},
                     node_problem: str | None = None) -> Decision:
        key = (attempt.job_id, attempt.attempt)
        self.on_read(False)
        return decide_outcome(
            worker_count=self.worker_counts.get(key, _worker_count(attempt)),
            statuses=self.statuses.get(key, {}), node_state=node_state, now=self.loop.utcnow(),
            cancel_requested=key in self.cancelled, lost_workers=lost_workers,
            unwritable_statuses=unwritable_statuses, failure_grace=self.failure_grace, node_problem=node_problem)

    def probe_attempt(self, attempt) -> dict[int, WorkerProbe]:
        key = (attempt.job_id, attempt.attempt)
        self.on_read(False)
        reachable = all(self._ready(node) for node in _nodes_of(attempt))
        running = self.workers.running(*key) is not None
        return {w: WorkerProbe(w, reachable=reachable, current=True, launched=True, supervisor_alive=running,
                               job_alive=running, has_status=key in self.statuses)
                for w in range(self.worker_counts.get(key, _worker_count(attempt)))}

    def forget_nodes(self, nodes: set[str]) -> int:
        return 0


def _nodes_of(attempt) -> list[str]:
    """The attempt's nodes: a multislice attempt's slices in slice order (slice 0 is `node`), else its node."""
    return [one.node for one in getattr(attempt, "slices", None) or ()] or [attempt.node]


def _worker_count(attempt) -> int:
    """Workers over every slice (tpuq.contracts.workers: one flat list, slice after slice), at least one."""
    slices = getattr(attempt, "slices", None) or ()
    return max(1, sum(len(one.endpoints) for one in slices) if slices else len(attempt.endpoints))


class SimTpuApi(RepeatedObservations, TpuApi):
    """The claimer's TPU shell, with each node's JSON parsed once per distinct answer (a watch pass reads every
    ACTIVE node each tick; most answers are the same as the last one), and a queued resource observed once per
    distinct set of answers (`simulate.observed`)."""

    def __init__(self, client: SimTpuClient, parsed: dict, **kwargs):
        super().__init__(client, node_json=client.node_json, **kwargs)
        self.node_body = client.node_body
        self._parsed = parsed

    def get_node(self, name: str):
        from google.cloud import tpu_v2

        data, key = self._call(self.node_body, name=name)
        hit = self._parsed.get(key)
        if hit is None:
            if len(self._parsed) > 20_000:
                self._parsed.clear()
            hit = self._parsed[key] = (parse_json(tpu_v2.Node, data).SerializeToString(), NodeHealth.from_api(data))
        return tpu_v2.Node.deserialize(hit[0]), hit[1]


class ScenarioPrecheckCache(PrecheckCache):
    """The claimer's quota and billing cache, read again only when the scenario's quota or billing can have
    changed (`changes`: the scenario instants where it does) or when the claimer asks for a fresh read.

    Production re-reads every 5 minutes because a person may change either at any time; in a scenario they
    change only at its own instants, so every other re-read would read the same answer."""

    def __init__(self, reader, changes: list[float], deadlines: Callable[[], Deadlines] = Deadlines,
                 on_read: Callable[[], None] = lambda: None):
        super().__init__(reader, ttl_seconds=3.0e9)  # "never", in what timedelta holds
        self.changes = sorted(changes)
        self.deadlines = deadlines  # where the next change is noted: a quiet tick is not skipped past it
        self.on_read = on_read  # told when a read (not the kept answer) was handed out: what the claimer knows changed
        self._read_at: float | None = None
        self._handed: object = None

    def get(self, fleet, now, fresh: bool = False):
        from .quiet import seconds_of

        t = seconds_of(now)
        if self._read_at is not None and any(self._read_at < c <= t for c in self.changes):
            fresh = True
        upcoming = next((c for c in self.changes if c > t), None)
        if upcoming is not None:
            self.deadlines().note(upcoming, t)
        if fresh or self._read_at is None:
            self._read_at = t
        answer = super().get(fleet, now, fresh)
        if answer is not self._handed:
            self._handed = answer
            self.on_read()
        return answer


class TpuqPolicy:
    name = "tpuq"

    def __init__(self, *, loop: EventLoop, cloud: SimCloud, workers: SimWorkers, jobs: list[SimJob],
                 fleet: FleetFile, rng: random.Random, tick_seconds: float = PRODUCTION_TICK_SECONDS,
                 delivery: Delivery = Delivery(), skip_quiet_ticks: bool = True, verify_quiet: bool = False,
                 cpu_clock: Callable[[], float] | None = None) -> None:
        """`cpu_clock` (`time.process_time`): count the CPU seconds of the handlings, by subscription
        (`store_ops.cpu`) and, for the tick handlings run, also by whether they changed something (`tick_cpu`;
        the janitor's routing of the clock's tick is a change: it publishes the routed ticks)."""
        self.loop, self.cloud, self.workers, self.jobs, self.rng = loop, cloud, workers, jobs, rng
        self.fleet = fleet.model_copy(update={"project": cloud.project})
        self.tick_seconds = tick_seconds
        self._scratch_deadlines = Deadlines()  # what other handlers' time rules note: their service runs anyway
        self.clock = TracedClock(loop, self._scratch_deadlines)
        self.waits = Waits(loop)
        self.skip_quiet_ticks = skip_quiet_ticks or verify_quiet
        self.verify_quiet = verify_quiet
        self.ticks_published = 0
        self._ticks_handled: set[str] = set()  # the ids of the ticks some service's handler got
        self.service_ticks_run = self.service_ticks_skipped = 0
        self.ticks_quiet_checked = 0  # verify: service ticks skipping would have skipped, run and checked
        self.violations: list[tuple[float, str]] = []  # verify: those that did something (when, subscription)
        # subscription -> why its tick handlings ran (`RUN_REASONS`; skipping off: none counted)
        self.tick_runs: dict[str, Counter] = defaultdict(Counter)
        self._reading: _ReadSet | None = None  # the reads of the tick being handled
        self.db = MemoryFirestore(project=cloud.project, now=loop.utcnow, rng=random.Random(rng.random()))
        self.db.observer = self
        self.store_ops_skipped = BilledOps()  # the Firestore operations of the ticks skipped as quiet
        self.store_ops = OpsBySubscription(self.db.billed, cpu_clock)  # the same, by the subscription handled
        self.cpu_clock = cpu_clock
        # (subscription, changed something?) -> [tick handlings run, their CPU seconds]: with a cpu_clock
        self.tick_cpu: dict[tuple[str, bool], list] = defaultdict(lambda: [0, 0.0])  # [count, seconds]
        self.settings = Settings(project=cloud.project, runner_bucket=RUNNER_BUCKET)
        self.tpu_client = SimTpuClient(cloud)
        self._parsed_nodes: dict = {}
        # The services publish on the bus and the bus delivers to them: it is made first, then serves them.
        self.bus = SimBus(loop, {}, rng.randrange(2 ** 32), delivery,
                          observer=self, waits=self.waits, waiting_topics={"capacity"},
                          handling=self.store_ops.handling)
        self.executor = SimExecutor(loop, cloud, workers, self.bus, on_read=self.note_executor_read)
        self.clients = Clients(self.settings, firestore=self.db, tpu=self.tpu_client, publisher=self.bus)
        self.services = services = self._services()
        self.bus.serve(services)
        # The clock's tick (the janitor's, which routes it) and the ticks it routes to the other services
        # (tpuq.runtime.tickdue): each service's handling judged on its own.
        self._service_ticks = {sub.name: _ServiceTicks(sub.name, sub.service, clock=sub.topic == topology.CLOCK_TOPIC)
                               for sub in topology.SUBSCRIPTIONS
                               if sub.topic in topology.tick_topics() and sub.service in services}
        workers.on_end = self.executor.run_ended

    def _services(self) -> dict[str, Service]:
        prechecks = ScenarioPrecheckCache(
            PrecheckReader(SimGoogleApisSession(self.cloud), "https://sim-quotas/", "https://sim-billing/"),
            changes=self.cloud.scenario_changes(), deadlines=lambda: self.clock.deadlines,
            on_read=lambda: self._dirty_service("claimer"))
        services = {
            "claimer": claimer_handlers.build_service(
                self.settings, self.clients, public_key=lambda fleet: SIM_PUBLIC_KEY, sleep=self._handler_sleep,
                tpu_factory=lambda ctx: SimTpuApi(self.tpu_client, self._parsed_nodes, max_workers=1, attempts=1),
                prechecks_factory=lambda ctx: prechecks),
            "scheduler": scheduler_handlers.build_service(self.settings, self.clients),
            # The modelled workers are lost only with their node, which the claimer's watch reports: a probe
            # would never find anything (and each would be a tick that cannot be skipped).
            "executor": executor_handlers.build_service(self.settings, self.clients,
                                                        executor=self.executor, probe=False),
            "janitor": janitor_handlers.build_service(
                self.settings, self.clients,
                adapter_factory=lambda ctx, fleet: DeleteAdapter(self.tpu_client, fleet, max_workers=1, attempts=1)),
        }
        for service in services.values():
            service.now = self.clock
            service.rng = random.Random(0)  # replaced at each delivery by the bus's keyed one
            service.push_auth = PushAuth.from_env({})
        return services

    def _handler_sleep(self, seconds: float) -> None:
        """A handler that waits (the claimer's fast watch) holds its own push that long; the rest goes on."""
        with self.store_ops.waiting():
            self.waits.sleep(seconds)

    def start(self) -> None:
        save_fleet(self.db, self.fleet, self.loop.utcnow())
        for job in self.jobs:
            self.loop.at(job.submit_at, self._submit, job)
        self.loop.every(self.tick_seconds, self._tick, first=self.tick_seconds)

    def _submit(self, job: SimJob) -> None:
        # A job held to regions names one bucket in each, as a user does (the scheduler runs it where one is).
        buckets = [{"uri": f"gs://tpuq-sim-{region}", "region": region} for region in job.regions or ()]
        slices = list(job.slices) if isinstance(job.slices, tuple) else job.slices
        published = PublishedJob(id=job.job_id, tpu=list(job.types), priority=job.priority, buckets=buckets,
                                 command=f"sim-work {job.work_seconds:.0f}", slices=slices)
        self.bus.publish("jobs", published.model_dump_json(exclude_none=True).encode())

    def firestore_ops(self, horizon: float) -> FirestoreOps:
        """The four services' Firestore operations as production would be billed for them over the run: those
        of the handlings run, and each quiet tick skipped counted as its last handling's. The executor's probes,
        which the simulator does not run, write an attempt's record only when a worker turns unreachable or
        answers again (tpuq.executor.decide.probe_record; their interval is kept in the instance's memory): the
        modelled workers are lost only with their node, so no probe would write, and none is estimated."""
        probes = 0
        billed = self.db.billed.copy()
        billed.add(self.store_ops_skipped)
        by_subscription = self.store_ops.per_day(horizon / 86400 if horizon > 0 else 1.0,
                                                 {"executor-ticks": probes} if probes else None)
        return FirestoreOps.of(billed.reads, billed.writes, billed.deletes, probes, horizon, by_subscription)

    def activity(self) -> tuple[int, ...]:
        """What changes when anything happens: documents, messages, the cloud's mutations, attempts."""
        return (self.db.changes, sum(self.bus.published.values()) - self.bus.published["ticks"],
                sum(self.bus.failed.values()), self.cloud.mutations, len(self.workers.runs))

    def workers_version(self) -> tuple[int, ...]:
        """What changes when an attempt starts, stops or ends, or a worker's status is written."""
        return (len(self.workers.runs), len(self.workers._running), len(self.executor.statuses),
                len(self.executor.cancelled))

    # -- quiet ticks, service by service (module docstring of simulate.quiet) ---------------------------------
    def _can_skip(self, ticks: "_ServiceTicks") -> bool:
        """This service's last tick changed nothing, nothing it read has changed since, and no instant its rules
        or (if it read the cloud) the cloud's schedule care about has come. Judged when the tick reaches the
        service, so that what the other services' handling of the same tick changed counts. Why a tick was not
        skipped is counted in `tick_runs`."""
        reason = self._must_run(ticks)
        if reason is not None:
            self.tick_runs[ticks.subscription][reason] += 1
        return reason is None

    def _must_run(self, ticks: "_ServiceTicks") -> str | None:
        """The first reason (`RUN_REASONS`) this service's handling of the tick cannot be skipped, or None."""
        quiet, now = ticks.quiet, self.loop.now()
        if quiet is None:
            return "last_changed"
        if ticks.dirty:
            return "read_changed"
        if ticks.opaque:
            return "opaque_time"
        if now >= ticks.deadline:
            return "time_rule"
        if quiet.cloud:
            if self.cloud.mutations != ticks.cloud_mutations or len(self.cloud.transitions) != ticks.transitions:
                return "cloud_changed"
            due = self.cloud.next_transition()
            if now >= ticks.cloud_due or (due is not None and now >= due):
                return "cloud_due"
        if quiet.workers and self.workers_version() != ticks.workers_version:
            return "workers_changed"
        return None

    def _tick(self) -> None:
        number = self._tick_number()
        self.bus.publish_tick(Tick(at=self.loop.utcnow(), seq=number, source="simulator")
                              .model_dump_json(exclude_none=True).encode(), number)
        self.ticks_published += 1

    def _tick_number(self) -> int:
        return round(self.loop.now() / self.tick_seconds)

    @property
    def ticks_run(self) -> int:
        """Ticks that reached at least one service's handler."""
        return len(self._ticks_handled)

    @property
    def ticks_skipped(self) -> int:
        return self.ticks_published - len(self._ticks_handled)

    # -- DeliveryObserver (the bus) -------------------------------------------------------------------------
    def tick_push(self, subscription: str, message_id: str):
        ticks = self._service_ticks[subscription]
        if message_id in ticks.handled:
            # A tick's second delivery (a duplicate, a redelivery) is not judged; what it changes is seen.
            return None
        ticks.handled.add(message_id)
        skip = self.skip_quiet_ticks and self._can_skip(ticks)
        if skip and not self.verify_quiet:
            self.service_ticks_skipped += 1
            self.cloud.calls.update(ticks.calls)  # what the skipped tick would have read
            self.store_ops_skipped.add(ticks.store_ops)  # and its Firestore operations (a quiet one's: reads)
            self.store_ops.add(subscription, ticks.store_ops)
            return QUIET
        self.ticks_quiet_checked += skip
        self.service_ticks_run += 1
        if ticks.clock:
            self._ticks_handled.add(message_id)
        reads = _ReadSet()
        self._reading, self.clock.deadlines = reads, ticks.deadlines
        ticks.deadlines.reset()
        ticks.quiet, ticks.dirty = None, False
        return (ticks, reads, self.activity(), self.cloud.calls.copy(), skip, self.db.billed.copy(),
                self._remembered(ticks.service), self.cpu_clock() if self.cpu_clock is not None else 0.0)

    def tick_answered(self, token, status: int) -> None:
        self._reading, self.clock.deadlines = None, self._scratch_deadlines
        if token is None:
            return
        ticks, reads, before, calls_before, verifying, billed_before, remembered_before, cpu_before = token
        calls = self.cloud.calls - calls_before
        reads.cloud = reads.cloud or bool(calls)
        changed = status >= 500 or self.activity() != before
        if self.cpu_clock is not None:
            spent = self.tick_cpu[ticks.subscription, changed]
            spent[0] += 1
            spent[1] += self.cpu_clock() - cpu_before
        if verifying and changed:
            self.violations.append((self.loop.now(), ticks.subscription))
        # The pre-checks are read through their cache, which a repeat of this tick would hit: not counted again.
        replayed = Counter({k: n for k, n in calls.items() if k not in _CACHED_READS})
        ticks.answered(None if changed else reads, replayed, self, self.db.billed - billed_before)
        if not self._views_settled(ticks.service) or self._remembered(ticks.service) != remembered_before:
            # Its next tick reads less (`DeltaView.settled`; the janitor's `TickMemory`): run it, to count
            # what it reads.
            ticks.dirty = True

    def _views_settled(self, service: str) -> bool:
        """Whether the service's views of the store (`tpuq.runtime.deltaread`) would read the same again."""
        state = self.services[service].state if service in self.services else None
        views = getattr(state, "views", None) or {}
        return all(view.settled for fleet in views.values() for view in (fleet.targets, fleet.qrs))

    def _remembered(self, service: str) -> object:
        """What the service's instance remembers between ticks in process (the janitor's `TickMemory`)."""
        state = self.services[service].state if service in self.services else None
        memory = getattr(state, "remembered", None)
        return None if memory is None else memory.quiet_until

    def _dirty_service(self, service: str) -> None:
        """The service may know something its last quiet tick did not (a handler's state kept in process)."""
        for ticks in self._service_ticks.values():
            if ticks.service == service:
                ticks.dirty = True

    # -- StoreObserver (the in-memory Firestore) -----------------------------------------------------------
    def read_document(self, path: str) -> None:
        if self._reading is not None:
            self._reading.documents.add(path)

    def read_query(self, collection_path: str, filters) -> None:
        if self._reading is not None:
            # A filter against a moving now is left out of what a later change is judged on: a document written
            # afterwards may not match its value as read, yet start to match as now moves on.
            fixed = tuple(f for f in filters if not _moving(f.given))
            queries = self._reading.queries.setdefault(collection_path, [])
            if fixed not in queries:
                queries.append(fixed)
            self._note_moving_filters(collection_path, filters)

    def _note_moving_filters(self, collection_path: str, filters) -> None:
        """A range filter against a time that moves with now (`updated_at <= now - 2 min`) is a time rule too: the
        query's answer changes when now passes a stored value. Compare each document the other filters match
        with the moving value, as the rule's own comparison would, so that the traced clock notes where."""
        for i, f in enumerate(filters):
            mirrored = _MIRRORED.get(f.op)
            if mirrored is None or not _moving(f.given):
                continue
            others = filters[:i] + filters[i + 1:]
            for _, stored in self.db._candidates_from(collection_path, others, f.field, flips_from(f.given)):
                data = stored.data
                if all(g.matches(data) for g in others):
                    value = _lookup(data, f.field)
                    if isinstance(value, datetime):
                        getattr(f.given, mirrored)(value)  # `value <= moving` is `moving >= value`

    def changed(self, path: str, before: dict | None, after: dict | None) -> None:
        for ticks in self._service_ticks.values():
            if ticks.quiet is not None and not ticks.dirty and ticks.quiet.affected_by(path, before, after):
                ticks.dirty = True

    def note_cloud_read(self) -> None:
        if self._reading is not None:
            self._reading.cloud = True

    def note_executor_read(self, cloud: bool) -> None:
        if self._reading is not None:
            if cloud:
                self._reading.cloud = True
            else:
                self._reading.workers = True


_CACHED_READS = ("quotaInfos.get", "billingInfo.get")
# Why a tick handling ran rather than being skipped as quiet, the first that applies (`TpuqPolicy._must_run`):
RUN_REASONS = {
    "last_changed": "the service's handling of the tick before changed something (or none ran yet)",
    "read_changed": "a document it read, or one its queries matched, changed since",
    "opaque_time": "it used the time in a way the traced clock cannot follow",
    "time_rule": "an instant at which one of its time rules flips has come",
    "cloud_changed": "it read the cloud, and a resource was created, deleted or changed state since",
    "cloud_due": "it read the cloud, and a scheduled transition has come",
    "workers_changed": "it read the workers, and an attempt started or ended since",
}
_MIRRORED = {"<": "__gt__", "<=": "__ge__", ">": "__lt__", ">=": "__le__"}  # stored OP moving, from the moving side


class _ReadSet:
    """What one tick's handling read: documents by path, queries by collection (their filters), the cloud, the
    workers. A change to the store affects it when it changes a document it read, or a document one of its
    queries matched before the change or matches after it (a query's order and limit only pick among matches)."""

    __slots__ = ("documents", "queries", "cloud", "workers")

    def __init__(self) -> None:
        self.documents: set[str] = set()
        self.queries: dict[str, list[tuple]] = {}
        self.cloud = self.workers = False

    def affected_by(self, path: str, before: dict | None, after: dict | None) -> bool:
        if path in self.documents:
            return True
        for filters in self.queries.get(path.rpartition("/")[0], ()):
            for data in (before, after):
                if data is not None and all(f.matches(data) for f in filters):
                    return True
        return False


@dataclass
class _ServiceTicks:
    """One tick subscription's quiet-tick record."""

    subscription: str
    service: str
    clock: bool = False  # the clock's own tick (the janitor's), not one routed to a service
    deadlines: Deadlines = field(default_factory=Deadlines)
    quiet: _ReadSet | None = None  # the last tick's reads, if it changed nothing
    dirty: bool = False  # something it read changed since, or the service handled another message
    handled: set[str] = field(default_factory=set)  # the tick ids delivered (a second delivery is not judged)
    deadline: float = math.inf
    opaque: bool = False
    cloud_mutations: int = 0
    transitions: int = 0
    cloud_due: float = math.inf
    workers_version: tuple = ()
    calls: Counter = field(default_factory=Counter)
    store_ops: BilledOps = field(default_factory=BilledOps)  # the Firestore operations of its last handling

    def answered(self, quiet: _ReadSet | None, calls: Counter, policy: "TpuqPolicy", store_ops: BilledOps) -> None:
        self.quiet, self.calls, self.store_ops = quiet, calls, store_ops
        self.deadline, self.opaque = self.deadlines.earliest, bool(self.deadlines.opaque)
        cloud = policy.cloud
        self.cloud_mutations, self.transitions = cloud.mutations, len(cloud.transitions)
        due = cloud.next_transition()
        self.cloud_due = math.inf if due is None else due
        self.workers_version = policy.workers_version()


def _moving(value) -> bool:
    """A query's value that moves with the clock: a traced now of the handling in progress (or a time computed
    from it). A traced now kept from an earlier event (`DeltaView`'s last read) is a constant from the past."""
    return isinstance(value, TracedNow) and value._moves()
