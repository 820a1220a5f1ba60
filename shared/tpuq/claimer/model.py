"""Core (pure data): the claimer's state, events and effects, plain immutable data for `decide`.

Firestore holds this state (see `tpuq.claimer.statestore` for the document
shapes); `tpuq.claimer.decide` maps (state, event) to `Effects`; the handler
applies them through small adapters.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from tpuq.fleet import FleetEntry, FleetFile
from tpuq.messages import FailureClass, FleetEvent, WorkerEndpoint

# Our own first state: the create is recorded (with the zone claim) but the API's answer is not seen yet.
REQUESTED = "REQUESTED"
# The API says NOT_FOUND: the queued resource no longer exists.
GONE = "GONE"

# States in which a queued resource still races for capacity (it holds its zone's slot for its type).
PENDING_STATES = frozenset({REQUESTED, "CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING"})
# States a delete is accepted in. Never PROVISIONING (the API refuses, and it may still win);
# never ACTIVE (a claimed slice is the scheduler's and the janitor's business).
DELETABLE_STATES = frozenset({"ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED", "SUSPENDED"})

MAX_RESOURCE_ID = 63
REQUEST_OPEN = "open"
REQUEST_WITHDRAWN = "withdrawn"

_REQUEST_ID_NAMESPACE = uuid.UUID("5f0c1a9e-4d3b-4f7e-9a51-7d1b0c2e6a10")


def queued_resource_id(owner_prefix: str, request_id: str, zone: str, generation: int = 0) -> str:
    """Deterministic: owner prefix + request id + zone (+ generation after the first in that zone).

    Redelivered requests therefore name the same resource. Ids the API would
    refuse as too long keep prefix and zone and shorten the request id with a hash.
    """
    suffix = f"-{generation}" if generation else ""
    name = f"{owner_prefix}-{request_id}-{zone}{suffix}"
    if len(name) <= MAX_RESOURCE_ID:
        return name
    digest = hashlib.sha256(request_id.encode()).hexdigest()[:8]
    room = MAX_RESOURCE_ID - len(f"{owner_prefix}--{digest}-{zone}{suffix}")
    return f"{owner_prefix}-{request_id[:max(room, 0)].rstrip('-')}-{digest}-{zone}{suffix}".replace("--", "-")


def create_request_id(project: str, zone: str, qr_id: str) -> str:
    """The API's idempotency key for one create: the same for every redelivery of that create."""
    return str(uuid.uuid5(_REQUEST_ID_NAMESPACE, f"{project}/{zone}/{qr_id}"))


@dataclass(frozen=True)
class RequestRecord:
    request_id: str
    fleet: str
    types: tuple[str, ...]
    regions: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    count: int = 1
    status: str = REQUEST_OPEN
    job_ids: tuple[str, ...] = ()
    generations: dict[str, int] = field(default_factory=dict)  # zone -> queued resources created there so far
    at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def open(self) -> bool:
        return self.status == REQUEST_OPEN


@dataclass(frozen=True)
class QrRecord:
    """One queued resource the claimer created, with the last state it saw."""

    qr_id: str
    fleet: str
    project: str
    request_id: str
    entry_id: str
    zone: str
    type: str
    spot: bool
    generation: int
    state: str
    created_at: datetime
    updated_at: datetime
    delete_requested: bool = False
    failure_class: str | None = None
    failure_message: str | None = None
    node: str | None = None
    endpoints: tuple[WorkerEndpoint, ...] = ()

    @property
    def live(self) -> bool:
        return self.state != GONE

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.qr_id}"

    @property
    def node_name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.qr_id}"


@dataclass(frozen=True)
class TargetRecord:
    """Back-off and drop state of one race target: (fleet, zone, TPU type)."""

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
    fleet: str
    blocked: str | None = None  # the reason, for people
    blocked_version: str | None = None
    blocked_message: str | None = None
    blocked_at: datetime | None = None

    def is_blocked(self, fleet_version: str) -> bool:
        return bool(self.blocked) and self.blocked_version == fleet_version


@dataclass(frozen=True)
class ClaimState:
    fleet: FleetFile
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    qrs: dict[str, QrRecord] = field(default_factory=dict)  # live ones, by qr id
    targets: dict[tuple[str, str], TargetRecord] = field(default_factory=dict)  # (zone, type) -> record
    status: FleetStatus | None = None

    def target(self, zone: str, tpu_type: str) -> TargetRecord:
        return self.targets.get((zone, tpu_type)) or TargetRecord(self.fleet.name, zone, tpu_type)

    @property
    def blocked(self) -> bool:
        return self.status is not None and self.status.is_blocked(self.fleet.version)

    def entry_of(self, qr: QrRecord) -> FleetEntry | None:
        return self.fleet.entry(qr.entry_id)


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class NodeInfo:
    name: str
    endpoints: tuple[WorkerEndpoint, ...] = ()


@dataclass(frozen=True)
class Observation:
    """What one exact GET (or one create) told about a queued resource.

    kind: "found" (state set), "not_found" (it is gone), "unknown" (the read
    failed: nothing is concluded), "create_failed" (a synchronous create error:
    the resource never existed).
    """

    kind: str
    state: str | None = None
    error_code: int | None = None
    error_message: str | None = None
    node: NodeInfo | None = None
    resource: Any = field(default=None, compare=False)  # the API object, for the ownership check on delete

    @classmethod
    def found(cls, state: str, **kw) -> "Observation":
        return cls("found", state=state, **kw)


@dataclass(frozen=True)
class RequestReceived:
    request: Any  # tpuq.messages.CapacityRequest


@dataclass(frozen=True)
class Observed:
    observations: dict[str, Observation]
    plan: bool = True  # plan new creates after applying (a watch pass); False for create outcomes


Event = RequestReceived | Observed


# --------------------------------------------------------------- effects


@dataclass(frozen=True)
class CreateQr:
    qr: QrRecord
    # True: a new create, recorded with a conditional write on its zone target (the claim).
    # False: finishing a create recorded earlier whose answer was never seen.
    claim: bool = True


@dataclass(frozen=True)
class DeleteQr:
    qr: QrRecord
    force: bool
    reason: str
    resource: Any = field(default=None, compare=False)


@dataclass
class Effects:
    creates: list[CreateQr] = field(default_factory=list)
    deletes: list[DeleteQr] = field(default_factory=list)
    events: list[FleetEvent] = field(default_factory=list)
    qrs: dict[str, QrRecord] = field(default_factory=dict)
    targets: dict[tuple[str, str], TargetRecord] = field(default_factory=dict)
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    status: FleetStatus | None = None

    def applied(self, state: ClaimState) -> ClaimState:
        """The state after these effects' state updates (creates are recorded as REQUESTED by the shell)."""
        qrs = {**state.qrs, **self.qrs}
        qrs = {k: v for k, v in qrs.items() if v.live}
        return replace(
            state,
            qrs=qrs,
            targets={**state.targets, **self.targets},
            requests={**state.requests, **self.requests},
            status=self.status or state.status,
        )

    @property
    def empty(self) -> bool:
        return not (self.creates or self.deletes or self.events or self.qrs or self.targets or self.requests
                    or self.status)


def failure_class_of(value: str | None) -> FailureClass | None:
    return FailureClass(value) if value else None
