"""Core (pure data): the claimer's state, events and effects, plain immutable data for `decide`.

Firestore holds this state: the documents' typed views (`RequestRecord`,
`QrRecord`, `TargetRecord`, `FleetStatus`) are in `tpuq.contracts.documents`, the
claimer's reads and writes in `tpuq.claimer.statestore`. `tpuq.claimer.decide`
maps (state, event) to `Effects`; the handler applies them through small adapters.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from tpuq.capacity.brakes import DayUse
from tpuq.contracts.documents import (
    QR_STATES_RACING,
    NodeHealth,
    ClaimerQrState,
    FleetStatus,
    QrRecord,
    SliceNode,
    RequestRecord,
    RequestStatus,
    TargetRecord,
)
from tpuq.contracts.documents import QueuedResourceState as _Qr
from tpuq.contracts.errors import ErrorInfo
from tpuq.contracts.fleet import FleetEntry, FleetFile
from tpuq.contracts.messages import FailureClass, FleetEvent, WorkerEndpoint
from tpuq.capacity.quota import Prechecks

# The claimer's own states for a stored queued resource (the API never reports them), and the racing ones.
REQUESTED, GONE = ClaimerQrState.REQUESTED, ClaimerQrState.GONE
PENDING_STATES = QR_STATES_RACING
# Who deletes a dead queued resource (one owner each, so nothing deletes what another has yet to read):
# - FAILED: the claimer. It classifies the failure, records the class on queued_resources/{id}
#   (`failure_class`: the janitor's licence to delete it too), applies back-off or drop, then deletes it.
# - SUSPENDED: the janitor (on the attempt event, the fleet event, or a tick). A preemption has nothing
#   to classify (no back-off, no drop); the claimer announces it and leaves the delete to the janitor.
# States the claimer sends a delete in: ones the API accepts it in, minus the janitor's SUSPENDED. Never
# PROVISIONING (the API refuses, and it may still win); never ACTIVE (a claimed slice is the scheduler's and
# the janitor's business).
DELETABLE_STATES = frozenset({_Qr.ACCEPTED, _Qr.WAITING_FOR_RESOURCES, _Qr.FAILED})

# Slices an entry holds (PROVISIONING or ACTIVE: `tpuq.contracts.racing.HELD_STATES`) are what its `count` (max_slices)
# caps. Racers waiting in the queue hold no slice, so an entry with count 1 still races every zone with quota; the
# first to win is kept and the rest are cancelled (`tpuq.contracts.racing.race_verdict`).

MAX_RESOURCE_ID = 63
REQUEST_OPEN, REQUEST_WITHDRAWN = RequestStatus.open, RequestStatus.withdrawn

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
class ClaimState:
    fleet: FleetFile
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    qrs: dict[str, QrRecord] = field(default_factory=dict)  # live ones, by qr id
    targets: dict[tuple[str, str], TargetRecord] = field(default_factory=dict)  # (zone, type) -> record
    status: FleetStatus | None = None
    # Quota by (zone, family, tier) and billing, read by the handler before deciding (tpuq.capacity.quota). None: only
    # the fleet file's declared quota is known (unit tests, tools).
    prechecks: Prechecks | None = None
    paused: bool = False  # fleet_control/{fleet}.paused: no new creates (`tpuq fleet pause`)
    day_use: DayUse = field(default_factory=DayUse)  # the day's VM-hours, for the fleet's budget

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
    health: NodeHealth | None = None  # health, symptoms, upcoming maintenance as read


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
    error_info: ErrorInfo | None = None  # the error's google.rpc.ErrorInfo / QuotaFailure, when the API sent one
    node: NodeInfo | None = None
    # A multislice request's nodes, slice order, all read (one unreadable: none, and nothing is concluded).
    nodes: tuple[NodeInfo, ...] = ()
    resource: Any = field(default=None, compare=False)  # the API object, for the ownership check on delete

    @classmethod
    def found(cls, state: str, **kw) -> "Observation":
        return cls("found", state=state, **kw)


@dataclass(frozen=True)
class RequestReceived:
    request: Any  # tpuq.contracts.messages.CapacityRequest


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
