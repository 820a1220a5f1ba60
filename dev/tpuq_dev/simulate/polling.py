"""The `polling` policy: a model of one polling controller, taken from tpu-runner 0.1.12's own source.

tpu-runner (PyPI `tpu-runner==0.1.12`) runs one leader-leased controller that reads its whole inventory, decides,
acts and sleeps, over and over. Each rule below is the one its source implements; the file and function behind it
are named (paths inside the wheel's `tpu_runner/` package).

The loop
- R1 period: one pass (`Controller.reconcile_once`), then a 30 s sleep (`CONTROLLER_RECONCILE_SECONDS = 30`), for
  as long as a job is pending or running or managed capacity exists (with no job left, a second full inventory
  read per pass: `Controller.managed_capacity_exists`); then the controller exits, and a submission starts it
  again (`trigger_controller`). `tpu_runner/cli.py: main` ("controller" command), `submit_jobs`;
  `tpu_runner/controller.py: Controller.managed_capacity_exists`.
  Modelled as a pass every `period` (30 s; the pass's own duration is not added) and, while stopped, a pass at
  the submission.
- R2 pass order: refresh queued resources, refresh ready TPUs, poll running attempts, mark unusable resources,
  assign pending jobs, size capacity (create / delete), launch the attempts just assigned.
  `tpu_runner/controller.py: Controller.reconcile_once`.
- R3 inventory: one exact GET per declared ordinal's node and queued resource (`count` ordinals per entry,
  fixed names), concurrently; 404 means absent. Any other error aborts the pass, retried after the 30 s sleep.
  `tpu_runner/gcp.py: ConcurrentInventoryGCPClient.list_inventory, describe_api_inventory_targets,
  declared_tpu_targets, declared_queued_resource_targets`; `tpu_runner/cli.py: main` (`except SubprocessError`).
- R4 names: an entry's ordinal k is the queued resource `qr-<base>` with node `<base>`, base =
  `<runner>-<entry>-<k>-<hash>`; a free ordinal is re-created under the same names once the old ones are gone.
  `tpu_runner/gcp.py: generated_resource_names`; `tpu_runner/controller.py: Controller.reconcile_capacity`
  (skips names still listed).
- R5 ownership: a node or queued resource is the entry's when zone, type, provisioning model and the labels
  `managed-by` / `fleet-entry` match. `tpu_runner/gcp.py: resource_matches_entry`.

Capacity
- R6 racing: every pending job counts as demand in *every* compatible entry (type, zone/region), each entry capped
  by `count - busy`; desired = min(count, max(keep_warm_count, busy + demand)). One job in three zones makes three
  queued resources at once. `tpu_runner/capacity_policy.py: allocate_managed_pending_demand,
  desired_managed_capacity_counts`.
- R7 creates: per entry, `missing = desired - (ready TPUs + live requests without a TPU)`, capped by the entry's
  chip_limit for (provisioning model, family, zone) minus the chips already held there; one create per missing
  ordinal, lowest free ordinal first. Spot, no `--valid-until` (a request waits for ever).
  `tpu_runner/controller.py: Controller.reconcile_capacity, reserved_chips, quota_key`;
  `tpu_runner/gcp.py: build_create_queued_resource_command`.
- R8 failed creates: any error from a create stops that entry's creates for this pass and is only recorded
  (`queued_resource_create_failed`); no classification, no backoff: the next pass (30 s) tries again, for ever,
  also for errors that can never succeed (billing, permission, unknown zone).
  `tpu_runner/controller.py: Controller.reconcile_capacity` (`except Exception: ... break`).
- R9 failed requests: a FAILED (or SUSPENDED...) queued resource is terminal; its ordinal leaves the preferred set,
  so the pass deletes it, and once it is gone (a later pass) the ordinal is created again. An asynchronous quota
  failure (quota 0 in the zone) therefore repeats every second pass, for ever. `tpu_runner/gcp.py:
  TERMINAL_QUEUED_RESOURCE_STATES`; `tpu_runner/controller.py: Controller.reconcile_capacity`.
- R10 race losers: once a job is assigned, its demand leaves the other entries. A loser still waiting is deleted on
  the next pass; a loser that reached READY is an idle slice, kept `idle_timeout_seconds` (600 s by default) from
  the pass that first saw it ready, then its node and queued resource are deleted. A later pending job may use it
  meanwhile. `tpu_runner/controller.py: Controller.reconcile_capacity, managed_idle_timeout_elapsed,
  _upsert_inventory_resource`; default `tpu_runner/specs.py: FleetSpec.idle_timeout_seconds`.
- R11 deletes: queued resources are deleted with `--force --async`; NOT_FOUND counts as done; any other error
  (e.g. deleting a PROVISIONING request, which the API refuses) aborts the rest of the pass.
  `tpu_runner/gcp.py: SubprocessGCPClient.delete_queued_resource, run_idempotent_delete`;
  `tpu_runner/cli.py: main`.
- R12 idle slices: a finished attempt leaves its slice idle (idle_since = then); when no demand is left for it, it is
  deleted after `idle_timeout_seconds`. `tpu_runner/runtime.py: FirestoreStateStore.finish_attempt`;
  `tpu_runner/controller.py: Controller.reconcile_capacity`.

Jobs
- R13 dispatch order: pending jobs by (no compatible entry last, priority high > normal > low, fewest compatible
  entries first, submission time, id), matched to idle slices by augmenting paths (an earlier job may move to
  another idle slice, never be dropped for a later one). `tpu_runner/capacity_policy.py: plan_idle_assignments,
  pending_job_entry_constraint_key`; `tpu_runner/controller.py: Controller.assign_pending_jobs`.
- R14 launch: an assigned attempt is launched over SSH on every worker host in the same pass (a multi-host slice is
  one resource, one attempt on all its hosts). `tpu_runner/controller.py: Controller.reconcile_controller_managed_
  attempts`; `tpu_runner/distributed.py: DistributedTPURunner.launch`.
- R15 completion: a running attempt is polled once per pass (each host's status file in GCS, so an attempt that
  finished is seen even if its slice was preempted after); the job succeeds and the slice turns idle.
  `tpu_runner/distributed.py: DistributedTPURunner.poll`; `tpu_runner/controller.py: Controller.mark_attempt_
  succeeded`.
- R16 preemptions: seen only by polling: a terminal queued resource (SUSPENDING/SUSPENDED) or a terminal node
  (PREEMPTED...) under a running attempt ends the attempt as interrupted and puts the job back to pending (no
  retry limit, `retry_on_infrastructure_failure` defaults to true); the slice is `preempted`; its ordinal is
  deleted and re-created by capacity sizing. `tpu_runner/controller.py: Controller.reconcile_unusable_resources,
  mark_tpu_preempted`; `tpu_runner/runtime.py: finish_attempt`; `tpu_runner/specs.py: JobSpec`.
- R17 vanished slices: a resource whose node and request are both gone is marked preempted (its job, if any,
  requeued). `tpu_runner/controller.py: Controller.reconcile_unusable_resources`.

The driver (`PollingPolicy`)
- Its GETs go through the simulator's cloud: counted as `nodes.get` / `queuedResources.get`, checked (billing,
  unknown zone, scripted faults) and rendered as SimCloud does, with the world advanced once per pass rather than
  once per GET (the pass is one virtual instant).
- A pass that would repeat the previous one exactly (same records under the declared names, no submission, no
  finished attempt, no idle timeout due, no faults or billing windows, and the previous pass changed nothing) is
  counted, not run; a test checks the outcome is the same with that shortcut off.
- The workers' accounting is physics, not the controller's knowledge: an attempt's work stops at the moment its
  slice was lost (the queued resource's SUSPENDING time in the model), through `SimWorkers.node_gone(at=...)`, even
  before the controller's next pass; the controller learns it only from its GETs (R16) and requeues then.

Modelled loosely or left out (assumptions)
- The pass takes no virtual time (tpu-runner sleeps 30 s *after* a pass of parallel GETs and serial gcloud calls).
- SSH readiness: a node is usable when READY and HEALTHY; tpu-runner also demands a public IP for `direct` (the
  create body asks for external IPs exactly when the fleet's ssh_transport is direct, so they agree).
- A delete error aborts the rest of the pass's cloud calls; the pass's assignments still launch (tpu-runner would
  launch them on the next pass).
- Left out: adopted (`existing`) TPUs, pinned `tpu_name` jobs, cancellations and interruption requests, the
  exit-75 recycle, the orphaned-PROVISIONING-node grace (300 s), maintenance, disk recovery.
- A tpuq fleet entry with several zones is one tpu-runner entry per zone with the same count (that is how a
  tpu-runner file lists them), so the controller may hold up to count x zones slices where tpuq holds count;
  `split_counts=True` shares the count out over the zones instead (the first zones take the remainder; a zone
  left with 0 is not listed), the same total as tpuq's: `bench_simulate.py` reports the waste ratio both
  ways. chip_limit is the fleet's declared quota for (zone, family, tier), else the entry's
  chip_limit, else count x chips. idle_timeout is the fleet's (tpu-runner has no per-entry one).
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum, auto

from tpuq_dev.capacitymodel.errors import ApiError
from tpuq.contracts.documents import QueuedResourceState as Qs
from tpuq.contracts.documents import TpuHealth, TpuNodeState as Ns
from tpuq.contracts.fleet import FleetFile, SshTransport
from tpuq.contracts.tputypes import parse_accelerator_type, zone_region

from .cloud import SimCloud
from .events import EventLoop
from .workers import SimWorkers
from .workload import SimJob

RECONCILE_SECONDS = 30.0  # tpu_runner/cli.py: CONTROLLER_RECONCILE_SECONDS
PRIORITY_RANK = {"low": 0, "normal": 1, "high": 2}  # tpu_runner/capacity_policy.py: JOB_PRIORITY_RANK

# tpu_runner/gcp.py: PENDING_QUEUED_RESOURCE_STATES, TERMINAL_QUEUED_RESOURCE_STATES (EXPIRED: not an API state)
QR_LIVE = frozenset({Qs.ACCEPTED, Qs.WAITING_FOR_RESOURCES, Qs.PROVISIONING, Qs.CREATING, Qs.ACTIVE})
QR_TERMINAL = frozenset({Qs.FAILED, Qs.DELETING, Qs.SUSPENDING, Qs.SUSPENDED})
QR_DELETING = frozenset({Qs.DELETING, Qs.SUSPENDING})
# tpu_runner/gcp.py: TERMINAL_TPU_VM_STATES
NODE_TERMINAL = frozenset({Ns.PREEMPTED, Ns.TERMINATED, Ns.STOPPED, Ns.DELETING})
LABEL_OWNER, LABEL_ENTRY = "managed-by", "fleet-entry"
_GET_KINDS = {"nodes": "nodes.get", "queuedResources": "queuedResources.get"}  # the call counts' names


class JobStatus(Enum):
    pending = auto()
    running = auto()
    succeeded = auto()


class SlotStatus(Enum):
    """tpu-runner's resource record statuses (tpu_runner/runtime.py: ResourceRecord.status)."""

    provisioning = auto()
    idle = auto()
    busy = auto()
    unavailable = auto()
    draining = auto()
    preempted = auto()
    deleted = auto()


# -- configuration -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One tpu-runner `tpus[]` entry: one type in one zone, `count` fixed ordinals."""

    id: str
    zone: str
    type: str
    family: str
    chips: int
    count: int
    keep_warm: int
    chip_limit: int
    runtime: str
    slots: tuple[tuple[str, str], ...]  # (queued resource id, node id) of ordinals 1..count

    @property
    def quota_key(self) -> tuple[str, str]:
        return (self.family, self.zone)


@dataclass(frozen=True)
class Config:
    runner: str
    project: str
    entries: tuple[Entry, ...]
    idle_timeout: float
    external_ips: bool
    network: str
    subnetwork: str
    # (job types, job regions) -> the entries that accept such a pending job (`_Pass.accepting`): a memo, not state
    accepting_memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    key_memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)  # `_Pass._constraint_key`

    def __post_init__(self) -> None:
        ids = [e.id for e in self.entries]
        if len(set(ids)) != len(ids):
            raise ValueError(f"entry ids must be unique: {ids}")

    @functools.cached_property
    def by_id(self) -> dict[str, Entry]:
        return {e.id: e for e in self.entries}

    def entry(self, entry_id: str | None) -> Entry | None:
        return self.by_id.get(entry_id)  # type: ignore[arg-type]


def _slug(value: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]+", "-", value.lower())).strip("-")


def slot_names(runner: str, entry_id: str, zone: str, type_: str, ordinal: int) -> tuple[str, str]:
    """tpu_runner/gcp.py: generated_resource_names: a stable hash of (entry, zone, type, ordinal) in the names."""
    digest = hashlib.sha1(f"{entry_id}|{zone}|{type_}|{ordinal}".encode()).hexdigest()[:8]
    base = f"{_slug(f'{runner}-{entry_id}')[:36].rstrip('-')}-{ordinal}-{digest}"
    return f"qr-{base}", base


def zone_counts(count: int, zones: int, split: bool) -> list[int]:
    """Each zone's tpu-runner `count` for a tpuq entry of `count` over `zones` zones."""
    if not split:
        return [count] * zones
    return [count // zones + (1 if i < count % zones else 0) for i in range(zones)]


def config_from_fleet(fleet: FleetFile, project: str, split_counts: bool = False) -> Config:
    entries = []
    for fe in fleet.tpus:
        if fe.existing or not fe.spot:
            continue  # tpu-runner creates spot entries only (tpu_runner/specs.py: fleet_spec_from_dict)
        accel = fe.accelerator
        for zone, count in zip(fe.zones, zone_counts(fe.count, len(fe.zones), split_counts)):
            if count == 0:
                continue
            eid = f"{fe.id}-{zone}"
            declared = fleet.declared_quota_chips(zone, accel.family, fe.provisioning_model)
            limit = declared if declared is not None else (fe.chip_limit or count * accel.chips)
            slots = tuple(slot_names(fleet.name, eid, zone, accel.name, k) for k in range(1, count + 1))
            entries.append(Entry(eid, zone, accel.name, accel.family, accel.chips, count, fe.keep_warm_count,
                                 limit, fe.runtime_version, slots))
    return Config(fleet.name, project, tuple(entries), float(fleet.idle_timeout_seconds),
                  fleet.ssh_transport is SshTransport.direct, fleet.network, fleet.subnetwork)


def create_body(config: Config, entry: Entry, node_id: str) -> dict:
    """The QueuedResource `gcloud alpha compute tpus queued-resources create ... --spot --async` sends
    (tpu_runner/gcp.py: build_create_queued_resource_command): labels, startup script, network, spot, no
    validUntil."""
    parent = f"projects/{config.project}/locations/{entry.zone}"
    node = {
        "acceleratorType": entry.type,
        "runtimeVersion": entry.runtime,
        "labels": {LABEL_OWNER: config.runner, LABEL_ENTRY: entry.id},
        "metadata": {"startup-script-url": f"gs://{config.runner}/artifacts/startup.sh"},
        "networkConfig": {"network": config.network, "subnetwork": config.subnetwork,
                          "enableExternalIps": config.external_ips},
        "schedulingConfig": {"spot": True},
    }
    return {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": node_id, "node": node}]}, "spot": {}}


# -- what the controller sees -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    node_id: str
    zone: str
    type: str
    state: str
    health: str
    labels: Mapping[str, str]

    @property
    def ready(self) -> bool:  # tpu_runner/gcp.py: TPUVM.operationally_ready
        return self.state == Ns.READY and self.health == TpuHealth.HEALTHY

    @property
    def terminal(self) -> bool:
        return self.state in NODE_TERMINAL


@dataclass(frozen=True)
class QrView:
    qr_id: str
    zone: str
    type: str
    state: str
    node_id: str | None
    labels: Mapping[str, str]

    @property
    def live(self) -> bool:
        return self.state in QR_LIVE

    @property
    def terminal(self) -> bool:
        return self.state in QR_TERMINAL

    @property
    def deleting(self) -> bool:
        return self.state in QR_DELETING


def node_view(item: dict) -> NodeView:
    """tpu_runner/gcp.py: parse_tpu_vm, from the REST JSON of a node."""
    return NodeView(item["name"].rsplit("/", 1)[-1], item["name"].split("/")[3],
                    str(item.get("acceleratorType", "")).rsplit("/", 1)[-1], str(item.get("state", Ns.READY)),
                    str(item.get("health", TpuHealth.HEALTHY)), dict(item.get("labels") or {}))


def qr_view(item: dict) -> QrView:
    """tpu_runner/gcp.py: parse_queued_resource, from the REST JSON of a queued resource."""
    spec = ((item.get("tpu") or {}).get("nodeSpec") or [{}])[0]
    node = spec.get("node") or {}
    state = item.get("state") or {}
    return QrView(item["name"].rsplit("/", 1)[-1], item["name"].split("/")[3],
                  str(node.get("acceleratorType", "")).rsplit("/", 1)[-1],
                  str(state.get("state", "") if isinstance(state, dict) else state), spec.get("nodeId"),
                  dict(item.get("labels") or node.get("labels") or {}))


def owned(view: NodeView | QrView, entry: Entry, runner: str) -> bool:
    """tpu_runner/gcp.py: resource_matches_entry."""
    return (view.zone == entry.zone and view.type == entry.type and view.labels.get(LABEL_OWNER) == runner
            and view.labels.get(LABEL_ENTRY) == entry.id)


@dataclass(frozen=True)
class JobRec:
    id: str
    submitted_at: float
    rank: int
    types: frozenset[str]
    regions: frozenset[str] | None
    status: JobStatus = JobStatus.pending
    attempts: int = 0
    node: str | None = None  # node id of the current attempt

    def accepts(self, type_: str, zone: str) -> bool:
        return type_ in self.types and (self.regions is None or zone_region(zone) in self.regions)


def job_record(job: SimJob) -> JobRec:
    return JobRec(job.job_id, job.submit_at, PRIORITY_RANK.get(str(getattr(job.priority, "value", job.priority)), 1),
                  frozenset(parse_accelerator_type(t).name for t in job.types),
                  frozenset(job.regions) if job.regions is not None else None)


@dataclass(frozen=True)
class Observed:
    nodes: Mapping[str, NodeView] = field(default_factory=dict)  # node id -> what its GET returned
    qrs: Mapping[str, QrView] = field(default_factory=dict)  # queued resource id -> what its GET returned
    submitted: tuple[JobRec, ...] = ()  # jobs submitted since the last pass
    exited: frozenset[str] = frozenset()  # jobs whose running attempt's status files say it is done


@dataclass(frozen=True)
class Slot:
    """tpu-runner's resource record of one ordinal (tpu_runner/runtime.py: ResourceRecord)."""

    node_id: str
    entry_id: str
    status: SlotStatus
    job: str | None = None
    idle_since: float | None = None

    @property
    def busy(self) -> bool:  # tpu_runner/capacity_policy.py: resource_is_busy
        return self.status is SlotStatus.busy or self.job is not None


@dataclass(frozen=True)
class ControllerState:
    config: Config
    jobs: Mapping[str, JobRec] = field(default_factory=dict)  # pending and running only
    slots: Mapping[str, Slot] = field(default_factory=dict)
    running: bool = False  # the controller's Cloud Run execution is up

    @property
    def has_active_jobs(self) -> bool:
        return bool(self.jobs)


# -- actions -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateQr:
    entry_id: str
    zone: str
    qr_id: str
    node_id: str
    body: dict = field(hash=False, compare=False)


@dataclass(frozen=True)
class DeleteQr:
    zone: str
    qr_id: str


@dataclass(frozen=True)
class DeleteNode:
    zone: str
    node_id: str


@dataclass(frozen=True)
class Dispatch:
    job_id: str
    attempt: int
    zone: str
    node_id: str
    chips: int


@dataclass(frozen=True)
class Requeue:
    """A running attempt the controller found on lost capacity: interrupted, its job pending again."""

    job_id: str
    attempt: int
    zone: str
    node_id: str


@dataclass(frozen=True)
class Succeeded:
    job_id: str
    attempt: int


Action = CreateQr | DeleteQr | DeleteNode | Dispatch | Requeue | Succeeded


# -- the functional core ----------------------------------------------------------------------------------------


class _Pass:
    """One reconcile pass over copies of the state's maps; `reconcile` is its pure face."""

    def __init__(self, state: ControllerState, observed: Observed, now: float) -> None:
        self.cfg = state.config
        self.now = now
        self.obs = observed
        self.jobs = dict(state.jobs)
        for job in observed.submitted:
            self.jobs.setdefault(job.id, job)
        self.slots = dict(state.slots)
        self.actions: list[Action] = []
        self._reserved: Counter | None = None  # (family, zone) -> chips held (`reserved_chips`)

    def entry_of(self, view: NodeView | QrView) -> Entry | None:
        """The entry that owns the view: only the one whose id is the view's entry label can."""
        e = self.cfg.by_id.get(view.labels.get(LABEL_ENTRY))  # type: ignore[arg-type]
        return e if e is not None and owned(view, e, self.cfg.runner) else None

    def run(self) -> ControllerState:
        self.refresh_queued()
        self.refresh_ready()
        self.poll_attempts()
        self.unusable()
        self.assign()
        self.capacity()
        jobs = {k: j for k, j in self.jobs.items() if j.status is not JobStatus.succeeded}
        return replace(ControllerState(self.cfg), jobs=jobs, slots=self.slots, running=True)

    # tpu_runner/controller.py: Controller.refresh_queued_resources
    def refresh_queued(self) -> None:
        for qr in self.obs.qrs.values():
            entry = self.entry_of(qr)
            if not qr.live or not qr.node_id or entry is None:
                continue
            slot = self.slots.get(qr.node_id)
            if slot is not None and (slot.job or slot.status is SlotStatus.idle):
                continue
            self.slots[qr.node_id] = Slot(qr.node_id, entry.id, SlotStatus.provisioning)

    # tpu_runner/controller.py: Controller.refresh_ready_resources, _upsert_inventory_resource
    def refresh_ready(self) -> None:
        for node in self.obs.nodes.values():
            entry = self.entry_of(node)
            if entry is None:
                continue
            slot = self.slots.get(node.node_id)
            if node.ready:
                if slot is None:
                    self.slots[node.node_id] = Slot(node.node_id, entry.id, SlotStatus.idle, idle_since=self.now)
                elif slot.job:
                    if slot.status is not SlotStatus.busy:  # (an equal record otherwise)
                        self.slots[node.node_id] = replace(slot, status=SlotStatus.busy)
                elif slot.status in (SlotStatus.deleted, SlotStatus.preempted, SlotStatus.provisioning,
                                     SlotStatus.unavailable):
                    self.slots[node.node_id] = replace(slot, status=SlotStatus.idle, idle_since=self.now)
            elif slot is None:
                self.slots[node.node_id] = Slot(node.node_id, entry.id, SlotStatus.unavailable)

    # tpu_runner/controller.py: Controller.reconcile_controller_managed_attempts, mark_attempt_succeeded
    def poll_attempts(self) -> None:
        for job in list(self.jobs.values()):
            if job.status is JobStatus.running and job.id in self.obs.exited:
                self.jobs[job.id] = replace(job, status=JobStatus.succeeded, node=None)
                self.actions.append(Succeeded(job.id, job.attempts))
                slot = self.slots.get(job.node or "")
                if slot is not None and slot.job == job.id:
                    self.slots[slot.node_id] = replace(slot, status=SlotStatus.idle, job=None, idle_since=self.now)

    # tpu_runner/controller.py: Controller.mark_tpu_preempted
    def preempted(self, slot: Slot) -> Slot:
        if slot.job:
            job = self.jobs.get(slot.job)
            if job is not None and job.status is JobStatus.running:
                entry = self.cfg.entry(slot.entry_id)
                self.actions.append(Requeue(job.id, job.attempts, entry.zone if entry else "", slot.node_id))
                self.jobs[job.id] = replace(job, status=JobStatus.pending, node=None)
        slot = replace(slot, status=SlotStatus.preempted, job=None, idle_since=None)
        self.slots[slot.node_id] = slot
        return slot

    # tpu_runner/controller.py: Controller.reconcile_unusable_resources
    def unusable(self) -> None:
        terminal_qr = {q.node_id: q for q in self.obs.qrs.values() if q.node_id and q.terminal}
        live_qr = {q.node_id: q for q in self.obs.qrs.values() if q.node_id and q.live}
        for slot in list(self.slots.values()):
            entry = self.cfg.entry(slot.entry_id)
            if entry is None:
                continue
            node = self.obs.nodes.get(slot.node_id)
            if slot.node_id in terminal_qr:
                self.preempted(slot)
                continue
            if node is not None and not owned(node, entry, self.cfg.runner):
                node = None
            if node is not None and node.ready and slot.status is not SlotStatus.draining:
                continue
            qr = live_qr.get(slot.node_id)
            if node is None and qr is not None:
                if slot.job:
                    slot = self.preempted(slot)
                if slot.status is SlotStatus.draining:
                    continue
                self.slots[slot.node_id] = replace(slot, status=SlotStatus.provisioning, idle_since=None)
                continue
            if node is not None and qr is not None and not node.ready and not node.terminal and not slot.job:
                self.slots[slot.node_id] = replace(slot, status=SlotStatus.provisioning, idle_since=None)
                continue
            if node is not None:
                if node.terminal and slot.job:
                    slot = self.preempted(slot)
                if slot.status is not SlotStatus.draining and not node.terminal and node.state != Ns.READY:
                    self.slots[slot.node_id] = replace(slot, status=SlotStatus.unavailable)
                    continue
                if node.state != Ns.DELETING:
                    self.actions.append(DeleteNode(entry.zone, node.node_id))
                self.slots[slot.node_id] = replace(slot, status=SlotStatus.draining)
                continue
            if slot.job:
                self.preempted(slot)
            elif slot.status not in (SlotStatus.deleted, SlotStatus.preempted):
                self.slots[slot.node_id] = replace(slot, status=SlotStatus.preempted, idle_since=None)

    def _entry_accepts(self, job: JobRec, entry: Entry) -> bool:  # capacity_policy.py: pending_job_accepts_entry
        return job.status is JobStatus.pending and entry.count > 0 and job.accepts(entry.type, entry.zone)

    def accepting(self, job: JobRec) -> tuple[int, ...]:
        """The indexes of the entries `_entry_accepts` a pending job of this shape (types, regions): the same for
        every job of the shape, so worked out once per shape."""
        memo = self.cfg.accepting_memo
        shape = (job.types, job.regions)
        found = memo.get(shape)
        if found is None:
            pending = job if job.status is JobStatus.pending else replace(job, status=JobStatus.pending)
            found = memo[shape] = tuple(i for i, e in enumerate(self.cfg.entries) if self._entry_accepts(pending, e))
        return found

    def _constraint_key(self, job: JobRec) -> tuple:  # capacity_policy.py: pending_job_entry_constraint_key
        # (of a pending job; `sum(_entry_accepts(job, e) for e in entries)`), kept per job record: a function of
        # its fields, and a waiting job keeps its record from pass to pass
        memo = self.cfg.key_memo
        kept = memo.get(id(job))
        if kept is not None and kept[0] is job:
            return kept[1]
        compatible = len(self.accepting(job))
        key = (compatible == 0, -job.rank, compatible, job.submitted_at, job.id)
        if len(memo) > 100_000:
            memo.clear()
        memo[id(job)] = (job, key)
        return key

    # tpu_runner/capacity_policy.py: plan_idle_assignments; tpu_runner/controller.py: Controller.assign_pending_jobs
    def assign(self) -> None:
        idle = sorted((s for s in self.slots.values() if s.status is SlotStatus.idle and not s.busy),
                      key=lambda s: s.node_id)
        if not idle:
            return
        entries = {s.node_id: self.cfg.entry(s.entry_id) for s in idle}
        ordered = sorted((j for j in self.jobs.values() if j.status is JobStatus.pending), key=self._constraint_key)
        matched: dict[str, JobRec] = {}

        def fits(job: JobRec, slot: Slot) -> bool:
            e = entries[slot.node_id]
            return e is not None and job.accepts(e.type, e.zone)

        fitting: dict[tuple, list[Slot]] = {}  # job shape -> the idle slots (in `idle`'s order) it fits

        def match(job: JobRec, visited: set[str]) -> bool:
            shape = (job.types, job.regions)
            if shape not in fitting:
                fitting[shape] = [s for s in idle if fits(job, s)]
            candidates = sorted((s for s in fitting[shape] if s.node_id not in visited),
                                key=lambda s: (s.node_id in matched, s.node_id))
            for slot in candidates:
                visited.add(slot.node_id)
                previous = matched.get(slot.node_id)
                if previous is None or match(previous, visited):
                    matched[slot.node_id] = job
                    return True
            return False

        for job in ordered:
            match(job, set())
        by_job = {job.id: node_id for node_id, job in matched.items()}
        for job in ordered:
            node_id = by_job.get(job.id)
            if node_id is None:
                continue
            entry = entries[node_id]
            attempt = job.attempts + 1
            self.jobs[job.id] = replace(job, status=JobStatus.running, attempts=attempt, node=node_id)
            self.slots[node_id] = replace(self.slots[node_id], status=SlotStatus.busy, job=job.id, idle_since=None)
            self.actions.append(Dispatch(job.id, attempt, entry.zone, node_id, entry.chips))

    # tpu_runner/capacity_policy.py: allocate_managed_pending_demand, desired_managed_capacity_counts
    def desired_counts(self) -> dict[str, int]:
        entries = self.cfg.entries
        busy_by_entry = Counter(s.entry_id for s in self.slots.values() if s.busy)
        busy = {e.id: busy_by_entry[e.id] for e in entries}
        # Each pending job, in constraint order, adds one to every accepting entry still under its cap (count -
        # busy); entries are independent of each other, and once every entry is at its cap no job adds anything.
        caps = [max(0, e.count - busy[e.id]) for e in entries]
        demand = [0] * len(entries)
        open_entries = sum(1 for cap in caps if cap > 0)
        if open_entries:
            pending = sorted((j for j in self.jobs.values() if j.status is JobStatus.pending),
                             key=self._constraint_key)
            for job in pending:
                for i in self.accepting(job):
                    if demand[i] < caps[i]:
                        demand[i] += 1
                        if demand[i] == caps[i]:
                            open_entries -= 1
                if not open_entries:
                    break
        return {e.id: min(e.count, max(e.keep_warm, busy[e.id] + demand[i])) for i, e in enumerate(entries)}

    # tpu_runner/controller.py: Controller.managed_idle_timeout_elapsed
    def idle_timeout_elapsed(self, node_id: str, entry: Entry) -> bool:
        if self.cfg.idle_timeout == 0:
            return True
        slot = self.slots.get(node_id) or Slot(node_id, entry.id, SlotStatus.idle)
        if slot.idle_since is not None:
            return self.now - slot.idle_since >= self.cfg.idle_timeout
        self.slots[node_id] = replace(slot, idle_since=self.now)
        return False

    def _delete_node(self, entry: Entry, node_id: str) -> None:
        self.actions.append(DeleteNode(entry.zone, node_id))
        slot = self.slots.get(node_id) or Slot(node_id, entry.id, SlotStatus.idle)
        self.slots[node_id] = replace(slot, status=SlotStatus.deleted, job=None, idle_since=None)

    # tpu_runner/controller.py: Controller.reconcile_capacity, reserved_chips
    def capacity(self) -> None:
        cfg, obs = self.cfg, self.obs
        quota: dict[tuple[str, str], int] = {}
        for e in cfg.entries:
            if e.quota_key not in quota:
                quota[e.quota_key] = max(0, e.chip_limit - self.reserved_chips(e))
        desired_counts = self.desired_counts()
        # What each entry owns (in the order observed) and its busy slots, grouped once for the pass.
        qrs_of, nodes_of = self._owned_by_entry(obs.qrs.values()), self._owned_by_entry(obs.nodes.values())
        busy_of: dict[str, set[str]] = {}
        for s in self.slots.values():
            if s.busy:
                busy_of.setdefault(s.entry_id, set()).add(s.node_id)
        used_names = set(obs.qrs)
        used_nodes = {q.node_id for q in obs.qrs.values() if q.node_id}
        for e in cfg.entries:
            declared = e.slots
            desired_count = desired_counts[e.id]
            declared_ids = [n for _, n in declared]
            mine_qrs = qrs_of.get(e.id, [])
            mine_nodes = nodes_of.get(e.id, [])
            terminal_qr_nodes = {q.node_id for q in mine_qrs if q.terminal and q.node_id}
            terminal_qr_names = {q.qr_id for q in mine_qrs if q.terminal}
            busy_ids = busy_of.get(e.id, set())
            ready = [n for n in mine_nodes if n.ready and n.node_id not in terminal_qr_nodes
                     and f"qr-{n.node_id}" not in terminal_qr_names]
            live_ids = {n.node_id for n in ready} | {q.node_id for q in mine_qrs if q.live and q.node_id}
            preferred: dict[str, None] = {}  # (an ordered set)
            for group in (busy_ids, live_ids, set(declared_ids) - terminal_qr_nodes):
                preferred.update((n, None) for n in declared_ids if n in group and n not in preferred)
            desired_ids = set(list(preferred)[:desired_count])
            desired = [(q, n) for q, n in declared if n in desired_ids]
            deleted_qrs: set[str] = set()
            if desired_count == 0:
                ready_names = {n.node_id for n in ready}
                gone: set[str] = set()
                for node in ready:
                    if node.node_id in busy_ids or not self.idle_timeout_elapsed(node.node_id, e):
                        continue
                    self._delete_node(e, node.node_id)
                    gone.add(node.node_id)
                for q in mine_qrs:
                    if not q.deleting and (not q.node_id or q.node_id not in ready_names or q.node_id in gone):
                        self.actions.append(DeleteQr(e.zone, q.qr_id))
                continue
            retained: set[str] = set()
            for node in ready:
                if node.node_id in desired_ids or node.node_id in busy_ids:
                    continue
                if not self.idle_timeout_elapsed(node.node_id, e):
                    retained.add(node.node_id)
                    continue
                self._delete_node(e, node.node_id)
            pairs = set(desired)
            for q in mine_qrs:
                if (q.qr_id, q.node_id) in pairs or q.node_id in retained or q.deleting or q.node_id in busy_ids:
                    continue
                self.actions.append(DeleteQr(e.zone, q.qr_id))
                deleted_qrs.add(q.qr_id)
            ready = [n for n in ready if n.node_id in desired_ids]
            terminal_nodes = {n.node_id for n in mine_nodes if n.terminal and n.node_id in desired_ids}
            for q in mine_qrs:
                if q.qr_id in deleted_qrs or q.deleting:
                    continue
                if q.node_id in terminal_nodes or (q.terminal and (q.qr_id, q.node_id) in pairs):
                    self.actions.append(DeleteQr(e.zone, q.qr_id))
                    deleted_qrs.add(q.qr_id)
            ready_ids = {n.node_id for n in ready}
            waiting = [q for q in mine_qrs if q.live and q.qr_id not in deleted_qrs and q.node_id not in terminal_nodes
                       and (q.qr_id, q.node_id) in pairs and q.node_id not in ready_ids]
            missing = max(0, desired_count - len(ready) - len(waiting))
            missing = min(missing, quota[e.quota_key] // e.chips)
            for qr_id, node_id in desired:
                if missing <= 0:
                    break
                if qr_id in used_names or node_id in used_nodes:
                    continue
                self.actions.append(CreateQr(e.id, e.zone, qr_id, node_id, create_body(cfg, e, node_id)))
                self.slots[node_id] = Slot(node_id, e.id, SlotStatus.provisioning)
                quota[e.quota_key] -= e.chips
                missing -= 1

    def _owned_by_entry(self, views) -> dict[str, list]:
        """Entry id -> the views `owned` by that entry, in the views' order (`[v for v in views if owned(v, e)]`
        for every entry at once: only the entry named by a view's entry label can own it)."""
        out: dict[str, list] = {}
        runner, by_id = self.cfg.runner, self.cfg.by_id
        for view in views:
            e = by_id.get(view.labels.get(LABEL_ENTRY))  # type: ignore[arg-type]
            if e is not None and owned(view, e, runner):
                out.setdefault(e.id, []).append(view)
        return out

    def reserved_chips(self, entry: Entry) -> int:
        """Chips held in the entry's (family, zone): non-terminal nodes, plus live requests without a node."""
        if self._reserved is None:  # every (family, zone) at once: the observations do not change in a pass
            terminal_qr_nodes = {q.node_id for q in self.obs.qrs.values() if q.terminal and q.node_id}
            nodes: dict[tuple, set[str]] = {}
            reserved: Counter = Counter()
            for n in self.obs.nodes.values():
                if not n.terminal and n.node_id not in terminal_qr_nodes:
                    family, chips = _accel(n.type)
                    nodes.setdefault((family, n.zone), set()).add(n.node_id)
                    reserved[(family, n.zone)] += chips
            for q in self.obs.qrs.values():
                if q.live:
                    family, chips = _accel(q.type)
                    if q.node_id not in nodes.get((family, q.zone), ()):
                        reserved[(family, q.zone)] += chips
            self._reserved = reserved
        return self._reserved[entry.quota_key]


@functools.lru_cache(maxsize=None)
def _accel(type_: str) -> tuple[str | None, int]:
    """(family, chips) of an accelerator type; (None, 0) for one tpu-runner would not parse."""
    try:
        a = parse_accelerator_type(type_)
    except ValueError:
        return None, 0
    return a.family, a.chips


def reconcile(state: ControllerState, observed: Observed, now: float) -> tuple[ControllerState, list[Action]]:
    """One tpu-runner pass (R2): the state it keeps in Firestore and what it observed -> the new state and its
    calls, in the order it makes them."""
    p = _Pass(state, observed, now)
    new_state = p.run()
    return new_state, p.actions


def should_stop(state: ControllerState, inventory: Observed) -> bool:
    """R1: no pending or running job and none of the fleet's capacity in a fresh inventory read: the controller
    exits after this pass."""
    return not state.has_active_jobs and not inventory.nodes and not inventory.qrs


# -- the driver --------------------------------------------------------------------------------------------------


class PollingPolicy:
    """tpu-runner's controller on the simulator: every period it GETs its declared names through `SimCloud`,
    runs `reconcile`, and makes the calls; attempts run on `SimWorkers`."""

    def __init__(self, *, loop: EventLoop, cloud: SimCloud, workers: SimWorkers, jobs: list[SimJob],
                 fleet: FleetFile, rng: random.Random, period: float = RECONCILE_SECONDS,
                 split_counts: bool = False) -> None:
        self.loop, self.cloud, self.workers, self.rng, self.period = loop, cloud, workers, rng, period
        self.jobs = sorted(jobs, key=lambda j: (j.submit_at, j.job_id))
        self.state = ControllerState(config_from_fleet(fleet, cloud.project, split_counts))
        self._next_job = 0
        self.log: list[tuple[float, Action]] = []  # every action made, with its time
        self.create_errors: list[tuple[float, str, str]] = []  # (time, zone, RPC status) of refused creates
        self.aborted_passes = 0  # passes whose inventory read failed (R3)
        self.cut_short_passes = 0  # passes whose remaining calls a refused delete cancelled (R11)
        self.quiet_passes = 0  # passes only counted (see _fingerprint)
        self.inventory_reads = 0  # full inventory reads (one GET per declared node and queued resource each)
        self._checked: dict[str, ApiError | None] = {}  # zone -> the pass's project-level answer (`_get`)
        self.passes = 0
        self._live: dict[tuple[str, int], tuple[str, str]] = {}  # (job, attempt) -> (zone, node id) started
        self._quiet: tuple | None = None  # the world's fingerprint after a pass that changed nothing
        # Every declared ordinal: (zone, queued resource id, node id, the queued resource's and the node's full names)
        self._views: dict[str, tuple[dict, NodeView | QrView]] = {}  # full name -> (its last body, its view)
        self._declared = [(e.zone, qr_id, node_id, self._name(e.zone, "queuedResources", qr_id),
                           self._name(e.zone, "nodes", node_id))
                          for e in self.state.config.entries for qr_id, node_id in e.slots]

    def start(self) -> None:
        self.workers.before_end = self._physics
        self.loop.every(self.period, self._tick, first=self.loop.now())
        for job in self.jobs:
            self.loop.at(job.submit_at, self._submitted)

    # R1: a stopped controller is started by a submission; a running one sees it on its next pass.
    def _submitted(self) -> None:
        if not self.state.running:
            self.state = replace(self.state, running=True)
            self._tick()

    def _tick(self) -> None:
        if not self.state.running:
            return
        self._physics()  # advances the world to now
        fingerprint = self._fingerprint()
        if self._quiet is not None and self._quiet == fingerprint and self._still_quiet():
            self._count_gets()  # the pass would read the same, decide nothing and change nothing: only its GETs
            self.passes += 1
            self.quiet_passes += 1
            return
        self._quiet = None
        observed = self._observe()
        if observed is None:
            self.aborted_passes += 1
            return
        self.passes += 1
        before = self.state
        self.state, actions = reconcile(self.state, observed, self.loop.now())
        self._act(actions)
        if not self.state.has_active_jobs and self._stops():
            self.state = replace(self.state, running=False)
        elif not actions and self.state == before:
            self._quiet = fingerprint

    # A pass that would repeat the last one exactly is only counted (the run's speed; the outcome is the same):
    # same records under the declared names, no submission, no finished attempt, no idle timeout due, and no
    # scripted call faults or billing windows (they make GETs fail at a time of their own).
    def _fingerprint(self) -> tuple:
        qrs, nodes = self.cloud.world.queued_resources, self.cloud.world.nodes
        out = []
        for _, _, _, qr_name, node_name in self._declared:
            q, n = qrs.get(qr_name), nodes.get(node_name)
            out.append((q.state if q else None, n.state if n else None, n.health if n else None))
        return tuple(out)

    def _still_quiet(self) -> bool:
        world, now = self.cloud.world, self.loop.now()
        if world.faults or world.billing_overrides or world.scenario.billing.disabled_windows or self._unseen_jobs():
            return False
        if any(j.status is JobStatus.running and j.id in self.workers.done for j in self.state.jobs.values()):
            return False
        timeout = self.state.config.idle_timeout
        return not any(s.idle_since is not None and not s.busy and now - s.idle_since >= timeout
                       for s in self.state.slots.values())

    def _count_gets(self) -> None:
        reads = 1 if self.state.has_active_jobs else 2  # R1: the second inventory read of a pass without jobs
        self.inventory_reads += reads
        if self._declared:  # (`SimCloud.count` of each GET)
            self.cloud.calls["nodes.get"] += len(self._declared) * reads
            self.cloud.calls["queuedResources.get"] += len(self._declared) * reads

    def _unseen_jobs(self) -> bool:
        return self._next_job < len(self.jobs) and self.jobs[self._next_job].submit_at <= self.loop.now()

    def _inventory(self) -> tuple[dict[str, NodeView], dict[str, QrView]]:
        """R3: GET every declared name; a 404 is absence; any other error (ApiError) is the caller's."""
        nodes, qrs = {}, {}
        self.inventory_reads += 1
        self.cloud.world.advance()
        self._checked = {}  # a new pass: asked again
        views = self._views
        for zone, qr_id, node_id, qr_name, node_name in self._declared:
            node = self._get(zone, "nodes", node_name)
            if node is not None:
                nodes[node_id] = self._view(views, node_name, node, node_view)
            qr = self._get(zone, "queuedResources", qr_name)
            if qr is not None:
                qrs[qr_id] = self._view(views, qr_name, qr, qr_view)
        return nodes, qrs

    @staticmethod
    def _view(views: dict, name: str, body: dict, parse):
        """`parse(body)`, parsed again only when the body is another object: SimCloud hands out the same body
        object while the resource's rendered fields stay the same (and bodies are never changed)."""
        kept = views.get(name)
        if kept is not None and kept[0] is body:
            return kept[1]
        view = parse(body)
        views[name] = (body, view)
        return view

    def _stops(self) -> bool:
        """R1: with no job left, tpu-runner reads the whole inventory a second time (`managed_capacity_exists`)
        and stops only if nothing of the fleet's is there; a failing read keeps it running."""
        try:
            nodes, qrs = self._inventory()
        except ApiError:
            return False
        return should_stop(self.state, Observed(nodes, qrs)) and not self._unseen_jobs()

    def _observe(self) -> Observed | None:
        """R3: the pass's inventory; any error but NOT_FOUND aborts the pass."""
        try:
            nodes, qrs = self._inventory()
        except ApiError:
            return None
        now = self.loop.now()
        submitted = []
        while self._next_job < len(self.jobs) and self.jobs[self._next_job].submit_at <= now:
            submitted.append(job_record(self.jobs[self._next_job]))
            self._next_job += 1
        exited = frozenset(j for j in self.state.jobs if j in self.workers.done)
        return Observed(nodes, qrs, tuple(submitted), exited)

    def _get(self, zone: str, collection: str, full: str) -> dict | None:
        """`SimCloud.get_node` / `get_queued_resource` (counted, checked, rendered the same way) without the
        model's `advance()` on every call: the pass's GETs are at one virtual instant, and the driver advanced the
        world once before them. `full`: the resource's full name. None for NOT_FOUND (R3)."""
        cloud, world = self.cloud, self.cloud.world
        cloud.calls[_GET_KINDS[collection]] += 1  # `SimCloud.count` of a read
        if world.faults:  # scripted failures count down call by call
            world.check_call(cloud.project, zone, "GET", collection)
        else:  # without them the answer is the project's and the zone's, at this instant: asked once a pass
            if zone not in self._checked:
                try:
                    world.check_call(cloud.project, zone, "GET", collection)
                    self._checked[zone] = None
                except ApiError as err:
                    self._checked[zone] = err
            if self._checked[zone] is not None:
                raise self._checked[zone]
        if collection == "nodes":
            record = world.nodes.get(full)
            return cloud.node_record_body(record)[0] if record is not None else None
        record = world.queued_resources.get(full)
        return cloud.queued_resource_record_body(record)[0] if record is not None else None

    def _act(self, actions: list[Action]) -> None:
        now = self.loop.now()
        failed_entries: set[str] = set()
        aborted = False
        for action in actions:
            if isinstance(action, Dispatch):
                self.workers.start(action.job_id, action.attempt, self._node_name(action.zone, action.node_id),
                                   action.chips)
                self._live[(action.job_id, action.attempt)] = (action.zone, action.node_id)
            elif isinstance(action, Requeue):
                self._node_gone(action.zone, action.node_id)
            elif isinstance(action, Succeeded):
                pass
            elif aborted:
                continue
            elif isinstance(action, CreateQr):
                if action.entry_id in failed_entries:
                    continue  # R8: the first failure ends this entry's creates for the pass
                try:
                    self.cloud.create_queued_resource(action.zone, action.qr_id, action.body)
                except ApiError as err:
                    failed_entries.add(action.entry_id)
                    self.create_errors.append((now, action.zone, err.rpc.status))
                    continue
            else:
                try:
                    if isinstance(action, DeleteQr):
                        self.cloud.delete_queued_resource(action.zone, action.qr_id, force=True)
                    else:
                        self.cloud.delete_node(action.zone, action.node_id)
                except ApiError as err:
                    if err.rpc.status != "NOT_FOUND":  # R11
                        aborted = True
                        self.cut_short_passes += 1
                    continue
            self.log.append((now, action))

    def _node_name(self, zone: str, node_id: str) -> str:
        return self._name(zone, "nodes", node_id)

    def _name(self, zone: str, collection: str, resource_id: str) -> str:
        return f"projects/{self.cloud.project}/locations/{zone}/{collection}/{resource_id}"

    def _node_gone(self, zone: str, node_id: str) -> None:
        at = self._lost_at(zone, node_id)
        self.workers.node_gone(self._node_name(zone, node_id), at=self.loop.now() if at is None else at)

    def _lost_at(self, zone: str, node_id: str) -> float | None:
        """When the slice under a node was really lost (simulator truth for the workers' accounting, never shown
        to `reconcile`): the service's preemption time of its queued resource (or the node's deletion)."""
        world = self.cloud.world
        node = world.nodes.get(self._node_name(zone, node_id))
        qr = world.queued_resources.get(node.queued_resource) if node is not None else None
        if qr is None:
            qr = next((q for q in world.queued_resources.values()
                       if q.project == self.cloud.project and q.zone == zone and q.node_id == node_id), None)
        if qr is None:
            return None
        if qr.state == Qs.SUSPENDING:
            return qr.state_since
        if qr.state == Qs.SUSPENDED:
            return qr.state_since - (world.scenario.delays.suspending if qr.initiator == "SERVICE" else 0.0)
        if node is not None and node.state in NODE_TERMINAL:
            return qr.state_since
        return None

    def _physics(self) -> None:
        """Work stops when its slice is lost, whether or not the controller has looked yet (the workers' view)."""
        self.cloud.world.advance()
        for key, (zone, node_id) in list(self._live.items()):
            if self.workers.running(*key) is None:
                del self._live[key]
                continue
            at = self._lost_at(zone, node_id)
            if at is not None:
                self.workers.node_gone(self._node_name(zone, node_id), at=at)
