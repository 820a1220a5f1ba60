"""The contracts of what services share through Firestore: every stored state, and typed views of the documents.

Services talk through Pub/Sub (`tpuq.messages`) and through the documents below.
Every state a document can hold is a member of an enum here, and every reader and
writer compares against and writes those members, so renaming a state is one edit
that every service sees (`tests/unit/test_documents.py` fails if a state literal
reappears elsewhere). Collection names live in `tpuq.store`; where files live in
GCS, in `tpuq.gcslayout`.

| collection                   | state field            | typed view                     |
|------------------------------|------------------------|--------------------------------|
| jobs/{job_id}                | `state`: JobState      | `JobDoc` (`tpuq.jobstate` moves the state) |
| jobs/{job_id}/attempts/{n}   | `state`: AttemptState  | `AttemptDoc`                   |
| tpus/{node}                  | `state`: TpuState      | `TpuDoc`                       |
| requests/{request_id}        | `status`: RequestStatus| `RequestRecord`                |
| queued_resources/{qr_id}     | `state`: QueuedResourceState or ClaimerQrState | `QrRecord` |
| zones/{fleet}:{zone}:{type}  |                        | `TargetRecord`                 |
| fleet_status/{fleet}         |                        | `FleetStatus`                  |
| executions/{job}:{attempt}   | `state`: ExecutionState| `ExecutionEnd` (its end)       |

Nothing here does I/O: the views convert to and from the dicts Firestore stores.

The job and attempt views declare their documents' field names once. A reader turns a stored dict into the
view (`JobDoc.from_doc`: every field but `state` is optional, fields it does not know are ignored, and a state
that is not a member of its enum raises `tpuq.errors.Permanent`, field `state`, naming the document and the
value). A writer never writes the whole view: guarded updates and merges write only the fields they change,
built with `JobDoc.fields(...)` / `AttemptDoc.fields(...)`, which refuse a name the view does not declare.
Queries name their fields with `JobDoc.field(...)`, checked the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta
from enum import Enum, StrEnum
from functools import cache
from typing import Any, ClassVar

from pydantic import Field

from tpuq import store
from tpuq.errors import Permanent
from tpuq.jobspec import StrictModel


def short_node_name(name: str) -> str:
    """`projects/p/locations/z/nodes/my-tpu` -> `my-tpu`; a short name passes through.

    The id of a node's `tpus/{node}` document, and how jobs name a TPU (the way a
    user writes it); full and short names are compared by this form. Queued
    resources are shortened the same way (`.../queuedResources/ID` -> `ID`).
    """
    return name.rsplit("/", 1)[-1]


# ------------------------------------------------------------------ jobs


class JobState(StrEnum):
    """jobs/{id}.state. Which edges exist between them is `tpuq.jobstate.TRANSITIONS`."""

    pending = "pending"
    assigned = "assigned"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    rejected = "rejected"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES


# A job in one of these never changes state again (the CLI stops watching, the demo stops waiting).
TERMINAL_JOB_STATES = frozenset({JobState.succeeded, JobState.failed, JobState.cancelled, JobState.rejected})
# The job holds a TPU: an attempt was handed to the executor and has not ended.
JOB_STATES_ON_A_TPU = (JobState.assigned, JobState.running)


class AttemptState(StrEnum):
    """jobs/{id}/attempts/{n}.state; the attempt's result is its `outcome` (`tpuq.messages.AttemptOutcome`)."""

    assigned = "assigned"
    running = "running"
    ended = "ended"


class _View:
    """What the job and attempt views share: their declared field names, and partial writes checked against them."""

    COLLECTION: ClassVar[str]

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return _declared(cls)[0]

    @classmethod
    def field(cls, name: str, *nested: str) -> str:
        """A declared field's name (for a query), or a path into a map field: `field("capacity_request", "id")`."""
        if name not in cls.field_names():
            raise AttributeError(f"{cls.COLLECTION} documents have no field {name!r}")
        return ".".join((name, *nested))

    @classmethod
    def fields(cls, **values: Any) -> dict[str, Any]:
        """The fields a partial write (update, merge, create) stores: exactly those given, enum members as their
        values. A name the view does not declare is a bug in the writer: TypeError."""
        unknown = sorted(set(values) - cls.field_names())
        if unknown:
            raise TypeError(f"{cls.COLLECTION} documents have no field {', '.join(map(repr, unknown))}")
        return {k: v.value if isinstance(v, Enum) else v for k, v in values.items()}

    @classmethod
    def _from_stored(cls, doc: Mapping[str, Any], **known: Any):
        """The view of `doc`: the `known` fields as given, every other declared field as stored, or its default
        when the document lacks it (or stores null). Fields the view does not declare are ignored."""
        values = dict(known)
        for name, as_tuple in _declared(cls)[1]:
            value = doc.get(name)
            if value is not None and name not in known:
                values[name] = tuple(value) if as_tuple else value
        return cls(**values)


@cache
def _declared(cls: type) -> tuple[frozenset[str], tuple[tuple[str, bool], ...]]:
    """A view's field names, and for each whether it is stored as a list but viewed as a tuple (read once)."""
    declared = fields(cls)
    return frozenset(f.name for f in declared), tuple((f.name, isinstance(f.default, tuple)) for f in declared)


def _state(enum: type[StrEnum], doc: Mapping[str, Any], where: str) -> Any:
    value = doc.get("state")
    try:
        return enum(value)
    except ValueError:
        raise Permanent(f"{where}: state {value!r} is not one of {', '.join(m.value for m in enum)}",
                        field="state") from None


@dataclass(frozen=True)
class JobDoc(_View):
    """jobs/{job_id}: one job. Written by the scheduler (intake, the pass, the lifecycle) and, for a submission
    refused before intake, by the push adapter (stored `rejected`); read by the CLI and the demo."""

    COLLECTION: ClassVar[str] = store.JOBS

    id: str
    state: JobState
    spec: Mapping[str, Any] | None = None  # the PublishedJob as stored; absent on a job rejected at intake
    priority: str | None = None
    priority_rank: int | None = None
    types: tuple[str, ...] = ()
    source: str | None = None  # cli, pubsub or gcs
    owner: str | None = None  # who submitted it: the `owner` attribute of its message (tpuq.messages.OWNER_ATTRIBUTE)
    message_id: str | None = None
    submit_time: datetime | None = None
    updated_at: datetime | None = None
    # The current attempt (0 before the first), and how many were ever made.
    attempt: int = 0
    attempts: int = 0
    attempt_id: str | None = None
    tpu: str | None = None  # the node's full name while assigned or running
    zone: str | None = None
    region: str | None = None
    job_bucket: str | None = None
    attempt_gcs_dir: str | None = None
    checkpoint_gcs_dir: str | None = None
    pinned_region: str | None = None  # set once an attempt started: retries stay where its checkpoints are
    assigned_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    not_before: datetime | None = None  # the retry back-off
    preemptions: int = 0
    infra_failures: int = 0
    reason: str | None = None
    blocked: str | None = None  # why a pending job cannot get a TPU now
    capacity_request: Mapping[str, Any] | None = None  # the open request: {id, n, entry_id, at}
    capacity_requests: int = 0  # requests made so far (the next request's number)
    cancel_requested: bool = False
    cancel_reason: str | None = None
    assignment_republished_at: datetime | None = None
    assignment_republishes: int = 0  # how often the tick sent the current attempt's assignment again

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], doc_id: str | None = None) -> "JobDoc":
        """The view of a stored job; `doc_id` (the snapshot's id) stands in for a missing `id`."""
        job_id = doc.get("id") or doc_id or ""
        return cls._from_stored(doc, id=job_id, state=_state(JobState, doc, f"{store.JOBS}/{job_id}"))

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def capacity_request_id(self) -> str | None:
        return (self.capacity_request or {}).get("id")

    @property
    def capacity_request_entry(self) -> str | None:
        return (self.capacity_request or {}).get("entry_id")

    @property
    def spec_tpu(self) -> list[str]:
        """The TPU types the job asked for, as stored in its spec."""
        return list((self.spec or {}).get("tpu") or [])


@dataclass(frozen=True)
class AttemptDoc(_View):
    """jobs/{job_id}/attempts/{n}: one attempt of a job (the scheduler writes it; the CLI and the demo read it)."""

    COLLECTION: ClassVar[str] = f"{store.JOBS}/{{job_id}}/{store.ATTEMPTS}"

    attempt: int
    state: AttemptState
    attempt_id: str | None = None
    tpu: str | None = None
    zone: str | None = None
    region: str | None = None
    outcome: str | None = None  # a tpuq.messages.AttemptOutcome value, once ended
    detail: str | None = None
    assigned_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], doc_id: str | None = None) -> "AttemptDoc":
        """The view of a stored attempt; `doc_id` (its number, the snapshot's id) stands in for `attempt`."""
        n = doc.get("attempt")
        if n is None and doc_id and doc_id.isdigit():
            n = int(doc_id)
        where = f"{store.JOBS}/.../{store.ATTEMPTS}/{doc_id or n}"
        return cls._from_stored(doc, attempt=int(n or 0), state=_state(AttemptState, doc, where))


# ------------------------------------------------------------------ tpus


class TpuState(StrEnum):
    """tpus/{node}.state: the scheduler's view of an owned TPU node."""

    idle = "idle"  # ready for an assignment (scheduler: ACTIVE event, attempt freed it)
    busy = "busy"  # running an attempt (scheduler: assignment)
    deleting = "deleting"  # the janitor decided to delete it (a guarded write before the delete call)
    gone = "gone"  # lost or deleted (scheduler: SUSPENDED / FAILED / GONE event; janitor: delete done)


# Two meanings, two names:
# still holds a slice of the fleet entry's `max_slices` (the scheduler's capacity cap): a TPU being deleted
# counts until it is gone, or the scheduler would ask for a replacement while the old one still holds quota;
TPU_STATES_HOLDING_A_SLICE = frozenset({TpuState.idle, TpuState.busy, TpuState.deleting})
# serves or can serve a job (the janitor's pool, of which `keep_warm_count` are kept).
TPU_STATES_IN_SERVICE = frozenset({TpuState.idle, TpuState.busy})


@dataclass(frozen=True)
class TpuDoc:
    """The fields of tpus/{id} the janitor reads."""

    id: str
    fleet: str | None
    entry_id: str | None
    state: str | None
    idle_since: datetime | None
    queued_resource: str | None = None
    name: str | None = None
    deleting_since: datetime | None = None
    quarantined: bool = False  # its last attempt ended preempted / unreachable: never reused

    @classmethod
    def from_doc(cls, doc_id: str, doc: Mapping[str, Any]) -> "TpuDoc":
        return cls(
            id=doc_id,
            fleet=doc.get("fleet"),
            entry_id=doc.get("entry_id"),
            state=doc.get("state"),
            idle_since=doc.get("idle_since"),
            queued_resource=doc.get("queued_resource"),
            name=doc.get("name"),
            deleting_since=doc.get("deleting_since"),
            quarantined=bool(doc.get("quarantined")),
        )


class WorkerEndpoint(StrictModel):
    """One worker of a node, as the Cloud TPU API reports it (`networkEndpoints[worker_id]`).

    Stored in tpus/{node}.endpoints and queued_resources/{id}.endpoints, and carried by fleet events and
    assignments."""

    worker_id: int = Field(ge=0)
    ip: str = Field(description="The internal IP (`ipAddress`): the workers' peers, and SSH for vpc/iap fleets")
    external_ip: str | None = Field(default=None, description="`accessConfig.externalIp`: SSH for direct fleets")
    port: int | None = Field(default=None, description="The TPU runtime's port (8470) as reported; never SSH (22)")
    hostname: str | None = None


# ---------------------------------------------------- the Cloud TPU API's states


class QueuedResourceState(StrEnum):
    """tpu_v2 `QueuedResourceState.State`, as the API reports it (STATE_UNSPECIFIED is never reported).

    The fake TPU API (`tpuq_dev.faketpu`) runs this same enum."""

    CREATING = "CREATING"
    ACCEPTED = "ACCEPTED"
    WAITING_FOR_RESOURCES = "WAITING_FOR_RESOURCES"
    PROVISIONING = "PROVISIONING"
    ACTIVE = "ACTIVE"
    FAILED = "FAILED"
    DELETING = "DELETING"
    SUSPENDING = "SUSPENDING"
    SUSPENDED = "SUSPENDED"


class ClaimerQrState(StrEnum):
    """The two states the claimer records in queued_resources/{id}.state that the API never reports."""

    REQUESTED = "REQUESTED"  # the create is recorded (with the zone claim) but the API's answer is not seen yet
    GONE = "GONE"  # the API says NOT_FOUND: the queued resource no longer exists


class TpuNodeState(StrEnum):
    """tpu_v2 `Node.State`, as the API reports it (STATE_UNSPECIFIED is never reported).

    The fake TPU API runs this same enum (it moves its nodes through CREATING, READY, DELETING, PREEMPTED)."""

    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REIMAGING = "REIMAGING"
    DELETING = "DELETING"
    REPAIRING = "REPAIRING"
    STOPPED = "STOPPED"
    STOPPING = "STOPPING"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    HIDING = "HIDING"
    HIDDEN = "HIDDEN"
    UNHIDING = "UNHIDING"
    UNKNOWN = "UNKNOWN"


class TpuHealth(StrEnum):
    """tpu_v2 `Node.Health` (HEALTH_UNSPECIFIED, what an absent field means, is None here)."""

    HEALTHY = "HEALTHY"
    TIMEOUT = "TIMEOUT"  # unresponsive
    UNHEALTHY_TENSORFLOW = "UNHEALTHY_TENSORFLOW"  # the in-guest ML stack is unhealthy
    UNHEALTHY_MAINTENANCE = "UNHEALTHY_MAINTENANCE"  # under maintenance; resumes once rescheduled


class SymptomType(StrEnum):
    """tpu_v2 `Symptom.SymptomType` (SYMPTOM_TYPE_UNSPECIFIED aside)."""

    LOW_MEMORY = "LOW_MEMORY"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    EXECUTE_TIMED_OUT = "EXECUTE_TIMED_OUT"
    MESH_BUILD_FAIL = "MESH_BUILD_FAIL"
    HBM_OUT_OF_MEMORY = "HBM_OUT_OF_MEMORY"
    PROJECT_ABUSE = "PROJECT_ABUSE"


class MaintenanceType(StrEnum):
    """tpu.v2 `UpcomingMaintenance.type` (the discovery document's; google-cloud-tpu's tpu_v2 has no such message)."""

    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    SCHEDULED = "SCHEDULED"  # seven days' notice
    UNSCHEDULED = "UNSCHEDULED"  # critical: less notice


class MaintenanceStatus(StrEnum):
    """tpu.v2 `UpcomingMaintenance.maintenanceStatus`."""

    UNKNOWN = "UNKNOWN"
    PENDING = "PENDING"  # scheduled, not started
    ONGOING = "ONGOING"  # under way


# A node whose maintenance window opens within this much of now takes no new job. Jobs declare no run time, so
# this stands for "before the job could end": the longest a TPU job usually runs between checkpoints and retries
# (a day), well inside the seven days' notice of SCHEDULED maintenance, so a node keeps working for most of it.
MAINTENANCE_HORIZON = timedelta(hours=24)


def _enum_or_none(enum: type[StrEnum], value: Any) -> Any:
    try:
        return enum(value) if value else None
    except ValueError:
        return None  # a value Google added since: known as "not one of ours", never a crash


class NodeSymptom(StrictModel):
    """tpu.v2 `Symptom`: something that happened to one worker."""

    symptom_type: SymptomType | None = None
    details: str | None = Field(default=None, max_length=2000)
    worker_id: str | None = None
    create_time: datetime | None = None

    def describe(self) -> str:
        what = self.symptom_type.value if self.symptom_type else "a symptom"
        where = f" on worker {self.worker_id}" if self.worker_id else ""
        return f"{what}{where}" + (f": {self.details}" if self.details else "")


class UpcomingMaintenance(StrictModel):
    """tpu.v2 `UpcomingMaintenance` (`upcomingMaintenance` of a node)."""

    type: MaintenanceType | None = None
    status: MaintenanceStatus | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    latest_window_start: datetime | None = None
    can_reschedule: bool | None = None

    def describe(self) -> str:
        kind = f" ({self.type.value})" if self.type and self.type is not MaintenanceType.UNKNOWN_TYPE else ""
        if self.status is MaintenanceStatus.ONGOING:
            return f"maintenance{kind} under way"
        when = f"from {_show_time(self.window_start)}" if self.window_start else "at a time not given"
        return f"maintenance{kind} {when}"


def _show_time(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M UTC")


class NodeHealth(StrictModel):
    """What the Cloud TPU API says of a node's health: tpu.v2 Node `health`, `healthDescription`, `symptoms` and
    `upcomingMaintenance`. Read by the claimer (every watch pass of an ACTIVE node, and `existing:` nodes), carried
    by fleet events, stored in tpus/{node}.node_health; the matcher and the executor judge it with the two rules
    below."""

    health: TpuHealth | None = None  # None: the API did not say (HEALTH_UNSPECIFIED): not evidence of anything
    description: str | None = Field(default=None, max_length=2000)
    symptoms: list[NodeSymptom] = Field(default_factory=list)
    upcoming_maintenance: UpcomingMaintenance | None = None

    @classmethod
    def from_api(cls, node: Mapping[str, Any]) -> "NodeHealth":
        """From a node as the REST API renders it (camelCase JSON); unknown enum values read as absent."""
        maintenance = node.get("upcomingMaintenance") or None
        return cls(
            health=_enum_or_none(TpuHealth, node.get("health")),
            description=(node.get("healthDescription") or None) and str(node["healthDescription"])[:2000],
            symptoms=[NodeSymptom(symptom_type=_enum_or_none(SymptomType, s.get("symptomType")),
                                  details=(s.get("details") or None) and str(s["details"])[:2000],
                                  worker_id=(str(s["workerId"]) if s.get("workerId") not in (None, "") else None),
                                  create_time=parse_timestamp(s.get("createTime")))
                      for s in node.get("symptoms") or () if isinstance(s, Mapping)],
            upcoming_maintenance=UpcomingMaintenance(
                type=_enum_or_none(MaintenanceType, maintenance.get("type")),
                status=_enum_or_none(MaintenanceStatus, maintenance.get("maintenanceStatus")),
                window_start=parse_timestamp(maintenance.get("windowStartTime")),
                window_end=parse_timestamp(maintenance.get("windowEndTime")),
                latest_window_start=parse_timestamp(maintenance.get("latestWindowStartTime")),
                can_reschedule=maintenance.get("canReschedule"),
            ) if isinstance(maintenance, Mapping) else None,
        )

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> "NodeHealth | None":
        """tpus/{node}.node_health as stored; None when never recorded (or unreadable: judged as unknown)."""
        stored = (doc or {}).get("node_health")
        if not stored:
            return None
        try:
            return cls.model_validate(stored)
        except ValueError:
            return None

    def to_doc(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def unhealthy(self) -> str | None:
        """Why a job must not run on the node (nor go on running there), or None. Only a health the API reports
        other than HEALTHY counts; an absent one (HEALTH_UNSPECIFIED) is not evidence, as tpu-runner reads it."""
        if self.health is None or self.health is TpuHealth.HEALTHY:
            return None
        why = self.health.value
        details = [self.description] if self.description else []
        details += [s.describe() for s in self.symptoms]
        return why + (f" ({'; '.join(details)})" if details else "")

    def maintenance_due(self, now: datetime, horizon: timedelta = MAINTENANCE_HORIZON) -> str | None:
        """Why the node's maintenance comes before a new job could end, or None: under way, or its window opens
        before `now + horizon` (a window whose start is not given counts as soon; one already over, not)."""
        m = self.upcoming_maintenance
        if m is None:
            return None
        if m.status is MaintenanceStatus.ONGOING:
            return m.describe()
        if m.window_end is not None and m.window_end <= now:
            return None
        if m.window_start is None or m.window_start <= now + horizon:
            return m.describe()
        return None

    def refuses_new_job(self, now: datetime, horizon: timedelta = MAINTENANCE_HORIZON) -> str | None:
        """The matcher's rule: why the node takes no new job now, or None."""
        return self.unhealthy() or self.maintenance_due(now, horizon)


# ------------------------------------------------------- the claimer's documents


class RequestStatus(StrEnum):
    """requests/{id}.status."""

    open = "open"
    withdrawn = "withdrawn"


# States in which a queued resource still races for capacity (it holds its zone's slot for its type).
QR_STATES_RACING = frozenset({ClaimerQrState.REQUESTED, QueuedResourceState.CREATING, QueuedResourceState.ACCEPTED,
                              QueuedResourceState.WAITING_FOR_RESOURCES, QueuedResourceState.PROVISIONING})


@dataclass(frozen=True)
class RequestRecord:
    """requests/{request_id}: one capacity request."""

    request_id: str
    fleet: str
    types: tuple[str, ...]
    regions: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    count: int = 1
    status: str = RequestStatus.open.value
    job_ids: tuple[str, ...] = ()
    generations: dict[str, int] = field(default_factory=dict)  # zone -> queued resources created there so far
    at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def open(self) -> bool:
        return self.status == RequestStatus.open


@dataclass(frozen=True)
class QrRecord:
    """queued_resources/{qr_id}: one queued resource the claimer created, with the last state it saw."""

    qr_id: str
    fleet: str
    project: str
    request_id: str
    entry_id: str
    zone: str
    type: str
    spot: bool
    generation: int
    state: str  # a QueuedResourceState or a ClaimerQrState
    created_at: datetime
    updated_at: datetime
    delete_requested: bool = False
    failure_class: str | None = None
    failure_message: str | None = None
    node: str | None = None
    endpoints: tuple[WorkerEndpoint, ...] = ()
    node_health: NodeHealth | None = None  # the node's health as last announced (ACTIVE, NODE_HEALTH)

    @property
    def live(self) -> bool:
        return self.state != ClaimerQrState.GONE

    @property
    def pending(self) -> bool:
        return self.state in QR_STATES_RACING

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.qr_id}"

    @property
    def node_name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.qr_id}"


@dataclass(frozen=True)
class TargetRecord:
    """zones/{fleet}:{zone}:{type}: back-off and drop state of one race target."""

    fleet: str
    zone: str
    type: str
    capacity_failures: int = 0
    backoff_until: datetime | None = None
    dropped_version: str | None = None  # the fleet version it was dropped under
    dropped_reason: str | None = None
    unknown_failures: int = 0
    unknown_version: str | None = None
    last_failure_class: str | None = None
    last_failure_message: str | None = None
    last_claim: str | None = None
    # Firestore update time of the loaded document: the zone claim is a write conditioned on it.
    update_time: Any = field(default=None, compare=False)

    def dropped(self, fleet_version: str) -> bool:
        return self.dropped_version == fleet_version

    def backed_off(self, now: datetime) -> bool:
        return self.backoff_until is not None and now < self.backoff_until

    def unknown_count(self, fleet_version: str) -> int:
        return self.unknown_failures if self.unknown_version == fleet_version else 0


@dataclass(frozen=True)
class FleetStatus:
    """fleet_status/{fleet}: a project-level block."""

    fleet: str
    blocked: str | None = None  # the reason, for people
    blocked_version: str | None = None
    blocked_message: str | None = None
    blocked_at: datetime | None = None

    def is_blocked(self, fleet_version: str) -> bool:
        return bool(self.blocked) and self.blocked_version == fleet_version


def _fields_of(record: Any) -> dict[str, Any]:
    """A flat record's fields as a map, without `asdict`'s deep copy (the claimer writes these on every change:
    asdict deep-copied the endpoints' models only for them to be replaced). Nested values are the caller's."""
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


def qr_to_doc(qr: QrRecord) -> dict[str, Any]:
    doc = _fields_of(qr)
    doc["endpoints"] = [e.model_dump() for e in qr.endpoints]
    doc["node_health"] = qr.node_health.to_doc() if qr.node_health else None
    doc["name"] = qr.name
    doc["live"] = qr.live
    return doc


def qr_from_doc(doc: Mapping[str, Any]) -> QrRecord:
    fields = {k: v for k, v in doc.items() if k in QrRecord.__dataclass_fields__}
    fields["endpoints"] = tuple(WorkerEndpoint.model_validate(e) for e in doc.get("endpoints") or ())
    fields["node_health"] = NodeHealth.from_doc(doc)
    return QrRecord(**fields)


def request_to_doc(request: RequestRecord) -> dict[str, Any]:
    doc = _fields_of(request)
    for key in ("types", "regions", "zones", "job_ids"):
        doc[key] = list(doc[key])
    doc["generations"] = dict(request.generations)
    return doc


def request_from_doc(doc: Mapping[str, Any]) -> RequestRecord:
    fields = {k: v for k, v in doc.items() if k in RequestRecord.__dataclass_fields__}
    for key in ("types", "regions", "zones", "job_ids"):
        fields[key] = tuple(fields.get(key) or ())
    fields["generations"] = dict(fields.get("generations") or {})
    return RequestRecord(**fields)


def target_to_doc(target: TargetRecord) -> dict[str, Any]:
    doc = asdict(target)
    doc.pop("update_time")
    return doc


def target_from_doc(doc: Mapping[str, Any], update_time: Any) -> TargetRecord:
    fields = {k: v for k, v in doc.items() if k in TargetRecord.__dataclass_fields__ and k != "update_time"}
    return TargetRecord(**fields, update_time=update_time)


def status_from_doc(doc: Mapping[str, Any]) -> FleetStatus:
    return FleetStatus(**{k: v for k, v in doc.items() if k in FleetStatus.__dataclass_fields__})


def status_to_doc(status: FleetStatus) -> dict[str, Any]:
    return asdict(status)


# ------------------------------------------------------------------ executions


class ExecutionState(StrEnum):
    """executions/{job}:{attempt}.state; whether its end was published is the separate `ended` flag."""

    starting = "starting"  # the assignment was received; the workers are being prepared
    started = "started"  # the command runs on every worker (the tick's backstop judges only these)


def execution_doc_id(job_id: str, attempt: int) -> str:
    """executions/{job}:{attempt}: the executor writes it, the scheduler's backstop reads it."""
    return store.doc_id(job_id, str(attempt))


@dataclass(frozen=True)
class ExecutionEnd:
    """What executions/{job}:{attempt} says about the attempt's end, once the executor published it.

    The scheduler's tick applies it when the `ended` event was lost."""

    outcome: str  # a tpuq.messages.AttemptOutcome value
    detail: str | None = None
    ended_at: datetime | None = None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> "ExecutionEnd | None":
        """None while the end is not published (or the document does not exist)."""
        if not doc or not doc.get("ended") or not doc.get("outcome"):
            return None
        return cls(outcome=doc["outcome"], detail=doc.get("detail"), ended_at=doc.get("ended_at"))

    def to_doc(self) -> dict[str, Any]:
        return {"ended": True, "outcome": self.outcome, "detail": self.detail, "ended_at": self.ended_at}


def parse_timestamp(value: Any) -> datetime | None:
    """An RFC 3339 time as Pub/Sub and the workers' status objects write it ("2026-12-01T15:00:00.123456Z"), or a
    stored datetime as is; None when absent or not a time."""
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
