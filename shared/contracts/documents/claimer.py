"""The claimer's documents: requests/, queued_resources/, zones/ and fleet_status/."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from tpuq.contracts.documents.tpuapi import ClaimerQrState, NodeHealth, QueuedResourceState
from tpuq.contracts.documents.tpus import WorkerEndpoint


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
    slices: tuple[int, ...] = ()  # a gang request's sizes to try, largest first (CapacityRequest.slices); () single
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
class SliceNode:
    """One slice of a multislice queued resource, as the claimer last read its node."""

    name: str
    endpoints: tuple[WorkerEndpoint, ...] = ()
    health: NodeHealth | None = None

    def to_doc(self) -> dict[str, Any]:
        return {"name": self.name, "endpoints": [e.model_dump() for e in self.endpoints],
                "node_health": self.health.to_doc() if self.health else None}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> "SliceNode":
        return cls(doc["name"], tuple(WorkerEndpoint.model_validate(e) for e in doc.get("endpoints") or ()),
                   NodeHealth.from_doc(doc))


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
    # A multislice queued resource (`multisliceParams.nodeCount`): its size, and each slice's node once ACTIVE (slice
    # 0 is also `node`, `endpoints`, `node_health`). Its nodes are `<qr_id>-<i>`: the claimer sets nodeIdPrefix to
    # the queued resource's id.
    slices: int = 1
    slice_nodes: tuple[SliceNode, ...] = ()

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
        return self.node_names[0]

    @property
    def node_names(self) -> tuple[str, ...]:
        """Its nodes' full names: one named as itself, or a multislice request's `<id>-0 .. <id>-<n-1>`
        (MultisliceParams.node_id_prefix: "node ids of nodes created will be "np-0", "np-1"")."""
        base = f"projects/{self.project}/locations/{self.zone}/nodes/{self.qr_id}"
        return (base,) if self.slices == 1 else tuple(f"{base}-{i}" for i in range(self.slices))


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
    doc["slice_nodes"] = [n.to_doc() for n in qr.slice_nodes]
    doc["name"] = qr.name
    doc["live"] = qr.live
    return doc


def qr_from_doc(doc: Mapping[str, Any]) -> QrRecord:
    fields = {k: v for k, v in doc.items() if k in QrRecord.__dataclass_fields__}
    fields["endpoints"] = tuple(WorkerEndpoint.model_validate(e) for e in doc.get("endpoints") or ())
    fields["node_health"] = NodeHealth.from_doc(doc)
    fields["slice_nodes"] = tuple(SliceNode.from_doc(n) for n in doc.get("slice_nodes") or ())
    return QrRecord(**fields)


def request_to_doc(request: RequestRecord) -> dict[str, Any]:
    doc = _fields_of(request)
    for key in ("types", "regions", "zones", "job_ids", "slices"):
        doc[key] = list(doc[key])
    doc["generations"] = dict(request.generations)
    return doc


def request_from_doc(doc: Mapping[str, Any]) -> RequestRecord:
    fields = {k: v for k, v in doc.items() if k in RequestRecord.__dataclass_fields__}
    for key in ("types", "regions", "zones", "job_ids", "slices"):
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

