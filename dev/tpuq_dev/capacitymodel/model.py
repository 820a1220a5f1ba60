"""The capacity model: Cloud TPU's state machine for queued resources, nodes, operations and quota.

The fake Cloud TPU API (tpuq_dev.faketpu) serves it over HTTP with real sshd worker hosts; the fleet
simulator runs it directly. It ships with tpuq so that both work from a plain install, but no service
imports it (tests/unit/test_no_dev_imports.py).

No HTTP and no processes here: the clock and the RNG are passed in, every
method is driven by `clock.now()`, and `advance()` applies every transition
that is due (lazily, so a request after a long pause sees exactly the states
the real API would have gone through, each stamped at its scheduled time).

Worker hosts are the server's business. With `hosts_required=True` a queued
resource whose provisioning time has passed stays PROVISIONING (its node
`awaiting_hosts`) until the server calls `hosts_started()`; only then is it
ACTIVE with the hosts' network endpoints, so ACTIVE always means "reachable".

Quota: a queued resource takes its chips from the (zone, family, tier) quota
when it passes the quota check on leaving ACCEPTED, and holds them in every
state (SUSPENDED and FAILED included, like the real API) until it is deleted.
A request over quota is accepted and then FAILED with a RESOURCE_EXHAUSTED
"Quota limit ... has been exceeded" error (asynchronously, as queued resources
report it), never rejected at create.

Its siblings: `errors` (the RPC error catalogue and failure texts), `validation` (what a create
body may hold), `scenario` (the scenario file) and `clock`. None of them depends on HTTP or on the
worker hosts (sshd): a test imports them alone and checks that.
"""

from __future__ import annotations

import copy
import heapq
import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from tpuq.contracts.documents import MaintenanceStatus, MaintenanceType, QueuedResourceState, SymptomType, TpuHealth, TpuNodeState
from tpuq.contracts.tputypes import AcceleratorType, zone_region

from .clock import Clock
from .errors import (
    ApiError,
    RpcStatus,
    billing_error,
    capacity_error,
    expired_error,
    external_ip_error,
    failure_for_class,
    invalid,
    quota_api_error,
    quota_error,
    region_quota_error,
)
from .scenario import Scenario, Stockout
from .multislice import capacity_short, zone_capacity
from .subnets import Subnets
from .validation import check_queued_resource_id, parse_create_body


# The API's state enums are the ones the services read (tpuq.contracts.documents), so the fake can never speak another.
QrState = QueuedResourceState
NodeState = TpuNodeState


# Delete without force is allowed in these states even when nodes exist.
DELETABLE_WITHOUT_FORCE = (QrState.ACCEPTED, QrState.FAILED, QrState.SUSPENDED)
# States in which an unprovisioned request can still expire (validUntil).
EXPIRABLE = (QrState.ACCEPTED, QrState.WAITING_FOR_RESOURCES)


# -- the transition record ------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    """One state change of a queued resource or a node, stamped with the scenario time it is scheduled at (not
    the time `advance()` happened to apply it). A record's first transition is its creation (a queued resource
    ACCEPTED, a node CREATING); `state` None is its final removal (deleted: gone from the API). A node exists,
    and is billed, from its creation to its removal."""

    kind: Literal["queued_resource", "node"]
    name: str  # full resource name
    state: QrState | NodeState | None  # None: removed
    at: float  # scenario seconds
    accelerator_type: str  # canonical, e.g. "v4-32"
    zone: str
    project: str
    spot: bool
    chips: int
    queued_resource: str | None = None  # a node's owning queued resource (full name)

    @property
    def removed(self) -> bool:
        return self.state is None


# -- records -------------------------------------------------------------------------------


TPU_RUNTIME_PORT = 8470  # what `networkEndpoints[].port` reports: the TPU runtime's port, not SSH's


@dataclass(frozen=True)
class Endpoint:
    ip_address: str  # internal
    port: int = TPU_RUNTIME_PORT
    external_ip: str | None = None  # only with networkConfig.enableExternalIps


@dataclass(frozen=True)
class GuestAttribute:
    namespace: str
    key: str
    value: str


@dataclass(frozen=True)
class Symptom:
    """tpu.v2 Symptom of one worker, at scenario time `at`."""

    symptom_type: SymptomType
    worker: int = 0
    details: str | None = None
    at: float = 0.0


@dataclass(frozen=True)
class Maintenance:
    """tpu.v2 UpcomingMaintenance, in scenario time: the window [start, end)."""

    start: float
    end: float
    type: MaintenanceType = MaintenanceType.SCHEDULED
    can_reschedule: bool = True

    def status(self, now: float) -> MaintenanceStatus:
        return MaintenanceStatus.ONGOING if self.start <= now else MaintenanceStatus.PENDING


@dataclass
class NodeRecord:
    project: str
    zone: str
    node_id: str
    accelerator: AcceleratorType
    runtime_version: str
    spot: bool
    spec: dict  # the node as the client sent it (labels, metadata, networkConfig...)
    queued_resource: str  # full name of the owning queued resource
    create_time: float
    state: NodeState = NodeState.CREATING
    awaiting_hosts: bool = False
    active_since: float | None = None
    preempt_at: float | None = None
    delete_done_at: float | None = None
    endpoints: tuple[Endpoint, ...] = ()
    # Per worker, what its guest agent publishes, and from when (scenario time).
    guest_attributes: tuple[tuple[GuestAttribute, ...], ...] = ()
    guest_attributes_at: float | None = None
    # Health as a READY node reports it (tpu.v2 Node.health, healthDescription, symptoms, upcomingMaintenance).
    health: TpuHealth = TpuHealth.HEALTHY
    health_description: str | None = None
    symptoms: tuple[Symptom, ...] = ()
    maintenance: Maintenance | None = None
    fired_health_rules: frozenset[tuple[str, int]] = frozenset()  # scenario rules already applied to this node

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.node_id}"

    def set_health(self, health: TpuHealth, description: str | None = None,
                   symptom: Symptom | None = None) -> None:
        """HEALTHY clears the description and the symptoms; another health adds its symptom to those seen."""
        self.health = health
        if health is TpuHealth.HEALTHY:
            self.health_description, self.symptoms = None, ()
            return
        self.health_description = description
        if symptom is not None:
            self.symptoms = (*self.symptoms, symptom)

    def advance_maintenance(self, now: float) -> None:
        """Under maintenance during its window (UNHEALTHY_MAINTENANCE); after it, HEALTHY with none upcoming."""
        m = self.maintenance
        if m is None or now < m.start:
            return
        if now < m.end:
            if self.health is not TpuHealth.UNHEALTHY_MAINTENANCE:
                self.set_health(TpuHealth.UNHEALTHY_MAINTENANCE, "The node is under maintenance.")
            return
        self.maintenance = None
        if self.health is TpuHealth.UNHEALTHY_MAINTENANCE:
            self.set_health(TpuHealth.HEALTHY)

    @property
    def wants_live_hosts(self) -> bool:
        return self.awaiting_hosts or self.state == NodeState.READY

    @property
    def ssh_keys(self) -> str:
        return (self.spec.get("metadata") or {}).get("ssh-keys", "")

    @property
    def enable_external_ips(self) -> bool:
        return bool((self.spec.get("networkConfig") or {}).get("enableExternalIps"))


@dataclass
class QueuedResourceRecord:
    project: str
    zone: str
    qr_id: str
    body: dict  # as created, for echoing tpu/spot/guaranteed/queueingPolicy
    node_id: str
    node_spec: dict
    accelerator: AcceleratorType
    spot: bool
    create_time: float
    valid_until: float | None
    state: QrState = QrState.ACCEPTED
    state_since: float = 0.0
    initiator: str = "USER"
    failed_error: RpcStatus | None = None
    holds_quota: bool = False
    # Its nodes, slice order (multislice: <prefix>-0 first); all are made at once (gang) and live until deleted.
    nodes: list[NodeRecord] = field(default_factory=list)
    delete_done_at: float | None = None
    # Drawn once per request at create from its own seeded RNG (Scenario.waiting_delay, provisioning_delay), kept
    # across resets.
    waiting_delay: float = 0.0
    provisioning_delay: float = 0.0
    node_ids: tuple[str, ...] = ()  # one per slice; () reads as (node_id,)
    multislice: dict | None = None  # multisliceParams / multiNodeParams as sent; None for a single node

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.qr_id}"

    @property
    def node(self) -> NodeRecord | None:
        """The first slice's node (the only one of a single-node request)."""
        return self.nodes[0] if self.nodes else None

    @property
    def slice_ids(self) -> tuple[str, ...]:
        return self.node_ids or (self.node_id,)

    @property
    def chips(self) -> int:
        """What quota and capacity count: every slice's chips (gang: nodeCount x the type)."""
        return self.accelerator.chips * len(self.slice_ids)

    @property
    def tier(self) -> str:
        return "spot" if self.spot else "on_demand"

    def set_state(self, state: QrState, at: float, initiator: str | None = None) -> None:
        """initiator None keeps the current one: the normal path stays USER (the user's request)."""
        self.state, self.state_since = state, at
        if initiator is not None:
            self.initiator = initiator


@dataclass
class Operation:
    project: str
    zone: str
    op_id: str
    verb: str  # create | delete | reset
    target: str  # full resource name
    create_time: float
    api_version: str
    done: bool = False
    end_time: float | None = None
    response: QueuedResourceRecord | None = None  # snapshot; None with done = google.protobuf.Empty
    error: RpcStatus | None = None

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/operations/{self.op_id}"


@dataclass
class ApiCallFault:
    """A scripted failure of the next matching API calls (control endpoint 'fail a request now')."""

    status: str
    message: str
    method: str | None = None
    path_contains: str | None = None
    remaining: int = 1
    details: tuple[dict, ...] = ()
    error_class: str | None = None  # render that class's real refusal (errors.ERROR_CLASSES) for the call's project


# -- the world ------------------------------------------------------------------------------


def json_copy(value):
    """`copy.deepcopy` of JSON-shaped data (dicts, lists, strings, numbers, booleans, None), several times as fast;
    anything else is deep-copied as before."""
    kind = type(value)
    if kind is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if kind is list:
        return [json_copy(v) for v in value]
    if value is None or isinstance(value, (str, int, float)):  # immutable (bool is an int)
        return value
    return copy.deepcopy(value)


def _snapshot(qr: "QueuedResourceRecord") -> "QueuedResourceRecord":
    """`copy.deepcopy(qr)` for an operation's response: its JSON fields copied as JSON, its frozen values shared; a
    request that still has nodes (which refer back to it) is deep-copied whole."""
    if qr.nodes:
        return copy.deepcopy(qr)
    snap = copy.copy(qr)
    snap.body, snap.node_spec, snap.multislice = json_copy(qr.body), json_copy(qr.node_spec), json_copy(qr.multislice)
    snap.nodes, snap.failed_error = [], copy.deepcopy(qr.failed_error)
    return snap


class FakeTpuWorld:
    """Every queued resource, node and operation of the fake, for every project. Thread-safe.

    on_transition, when given, is called (under the world's lock) with a `Transition` for every state change of a
    queued resource or node, their creation and their final removal included, in scenario-time order.

    Scheduling: each live record has at most one next due time (`_due`), kept in a heap; `advance()` pops what is
    due in time order and `next_due()` peeks, so neither scans the records. A deleted record leaves the live dicts.
    """

    def __init__(self, scenario: Scenario, clock: Clock, rng: random.Random | None = None, *, hosts_required=False,
                 on_transition: Callable[[Transition], None] | None = None):
        self.scenario = scenario
        self.on_transition = on_transition
        self.clock = clock
        self.rng = rng if rng is not None else random.Random(scenario.seed)
        self.hosts_required = hosts_required
        self.lock = threading.RLock()
        self.queued_resources: dict[str, QueuedResourceRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.operations: dict[str, Operation] = {}
        self._request_ids: dict[tuple[str, str], str] = {}  # (parent, requestId) -> operation name
        self.stockout_overrides: dict[tuple[str, str | None], Stockout | None] = {}
        self.billing_overrides: dict[str | None, bool] = {}  # project (None = all) -> disabled
        self.faults: list[ApiCallFault] = []
        self.subnets = Subnets(scenario)  # the project's VPC subnets: what a create's networkConfig must name
        self._fired_at_rules: set[tuple[int, str]] = set()
        self._ip_counter = 0
        self._due: dict[str, float] = {}  # record name -> its next scheduled transition
        self._heap: list[tuple[float, int, str]] = []  # (due, seq, name); stale when _due disagrees
        self._seq = 0
        self._chips_held: dict[tuple[str, str, str, str], int] = {}  # (project, zone, family, tier) -> chips
        self._incarnations: dict[str, int] = {}  # node name -> times a node of that name turned READY
        self._dirty: dict[str, None] = {}  # (an ordered set) records whose due time must be recomputed
        self._pending_deletes: dict[str, list[Operation]] = {}  # target -> its delete operations not done yet
        self._capacity_freed_at: dict[tuple[str, str], float] = {}  # (zone, family) -> when capacity last freed
        # Health rules need a scan of READY nodes; skip it when nothing can change a node's health by itself.
        self._health_scan = bool(scenario.health.events or scenario.health.maintenance)

    # -- checks shared by every API call ----------------------------------------------

    def check_call(self, project: str, zone: str | None, method: str = "", path: str = "") -> None:
        """Project-level faults and scripted call failures; raises ApiError."""
        with self.lock:
            for fault in self.faults:
                if fault.remaining > 0 and (fault.method in (None, method.upper())) and (
                    fault.path_contains is None or fault.path_contains in path
                ):
                    fault.remaining -= 1
                    if fault.error_class:
                        rpc = self.sync_error_of_class(fault.error_class, project, zone or "-")
                        raise ApiError(rpc.status, fault.message or rpc.message, rpc.details)
                    raise ApiError(fault.status, fault.message, fault.details)
            if self.faults:
                self.faults = [f for f in self.faults if f.remaining > 0]
            if self.billing_disabled(project):
                err = billing_error(project)
                raise ApiError(err.status, err.message, err.details)
            if zone is not None and zone != "-" and not self.scenario.has_zone(zone):
                raise ApiError(
                    "INVALID_ARGUMENT",
                    f"Invalid value for field 'parent': 'projects/{project}/locations/{zone}'. "
                    f"Location {zone} is not found or access is unauthorized.",
                )

    def billing_disabled(self, project: str) -> bool:
        if project in self.billing_overrides:
            return self.billing_overrides[project]
        if None in self.billing_overrides:
            return self.billing_overrides[None]
        return self.scenario.billing_disabled_at(self.clock.now())

    # -- queued resources -------------------------------------------------------------

    def create_queued_resource(
        self, project: str, zone: str, qr_id: str | None, body: dict, request_id: str | None, api_version="v2"
    ) -> Operation:
        with self.lock:
            self.advance()
            parent = f"projects/{project}/locations/{zone}"
            if request_id and (parent, request_id) in self._request_ids:
                # Idempotent retry: the same operation, not a second resource.
                return self.operations[self._request_ids[(parent, request_id)]]
            check_queued_resource_id(qr_id)
            parsed = parse_create_body(parent, body, qr_id or "", api_version)
            name = f"{parent}/queuedResources/{qr_id}"
            if name in self.queued_resources:
                raise ApiError("ALREADY_EXISTS", f"Resource '{name}' already exists")
            taken = {q_id for q in self.queued_resources.values() if q.project == project and q.zone == zone
                     for q_id in q.slice_ids}
            for node_id in parsed.node_ids:
                node_name = f"{parent}/nodes/{node_id}"
                if node_name in self.nodes or node_id in taken:
                    raise ApiError("ALREADY_EXISTS", f"Resource '{node_name}' already exists")
            self.subnets.check_create(project, zone, parsed.node_spec)  # subnets are regional
            now = self.clock.now()
            valid_until = None
            if parsed.valid_until_offset is not None:
                valid_until = now + parsed.valid_until_offset
            elif parsed.valid_until_abs is not None:
                valid_until = now + (parsed.valid_until_abs - self.clock.wall(now)).total_seconds()
            qr = QueuedResourceRecord(
                project=project,
                zone=zone,
                qr_id=qr_id,
                body=json_copy(body),
                node_id=parsed.node_id,
                node_spec=json_copy(parsed.node_spec),
                accelerator=parsed.accelerator,
                spot=parsed.spot,
                create_time=now,
                valid_until=valid_until,
                state=QrState.ACCEPTED,
                state_since=now,
                waiting_delay=self.scenario.waiting_delay(zone, parsed.accelerator.family, name),
                provisioning_delay=self.scenario.provisioning_delay(zone, parsed.accelerator.family, name),
                node_ids=parsed.node_ids,
                multislice=json_copy(parsed.multislice),
            )
            self.queued_resources[name] = qr
            self._dirty.setdefault(name)
            self._emit_qr(qr, now)
            op = self._new_operation(project, zone, "create", name, api_version)
            self._finish(op, response=_snapshot(qr))
            if request_id:
                self._request_ids[(parent, request_id)] = op.name
            return op


    def get_queued_resource(self, project: str, zone: str, qr_id: str) -> QueuedResourceRecord:
        with self.lock:
            self.advance()
            return self._qr(project, zone, qr_id)

    def _qr(self, project: str, zone: str, qr_id: str) -> QueuedResourceRecord:
        name = f"projects/{project}/locations/{zone}/queuedResources/{qr_id}"
        qr = self.queued_resources.get(name)
        if qr is None:
            raise ApiError("NOT_FOUND", f"Resource '{name}' was not found")
        return qr

    def list_queued_resources(self, project, zone, page_size=0, page_token=""):
        with self.lock:
            self.advance()
            prefix = f"projects/{project}/locations/{zone}/queuedResources/" if zone != "-" else None
            items = [
                q
                for q in self.queued_resources.values()
                if (q.name.startswith(prefix) if prefix else q.project == project)
            ]
            return _page(sorted(items, key=lambda q: q.name), page_size, page_token)

    def delete_queued_resource(self, project, zone, qr_id, force=False, api_version="v2") -> Operation:
        with self.lock:
            self.advance()
            qr = self._qr(project, zone, qr_id)
            if qr.state == QrState.PROVISIONING:
                raise ApiError(
                    "FAILED_PRECONDITION", "DeleteQueuedResource is not supported when state is PROVISIONING"
                )
            has_nodes = bool(qr.nodes)
            if has_nodes and not force and qr.state not in DELETABLE_WITHOUT_FORCE + (QrState.DELETING,):
                raise ApiError(
                    "FAILED_PRECONDITION",
                    f"Cannot delete queued resource '{qr.name}' in state {qr.state.value} while it has nodes; "
                    "delete the nodes first or set force=true",
                )
            now = self.clock.now()
            op = self._new_operation(project, zone, "delete", qr.name, api_version)
            if qr.state != QrState.DELETING:
                self._set_qr_state(qr, QrState.DELETING, now, "USER")
                qr.delete_done_at = now + self.scenario.delays.deleting
                for node in qr.nodes:  # force: every slice's node
                    self._start_node_delete(node, now)
            self.advance()  # a zero deleting delay completes the operation in this very call
            return op

    def reset_queued_resource(self, project, zone, qr_id, api_version="v2") -> Operation:
        with self.lock:
            self.advance()
            qr = self._qr(project, zone, qr_id)
            if qr.state not in (QrState.SUSPENDED, QrState.FAILED):
                raise ApiError(
                    "FAILED_PRECONDITION", f"ResetQueuedResource is not supported when state is {qr.state.value}"
                )
            now = self.clock.now()
            for node in list(qr.nodes):
                self._remove_node(node, now)
            # Back in the queue; the quota check runs again on leaving ACCEPTED.
            self._hold_quota(qr, False)
            qr.failed_error = None
            self._set_qr_state(qr, QrState.ACCEPTED, now, "USER")
            op = self._new_operation(project, zone, "reset", qr.name, api_version)
            self._finish(op, response=_snapshot(qr))
            return op

    # -- nodes --------------------------------------------------------------------------

    def get_node(self, project, zone, node_id) -> NodeRecord:
        with self.lock:
            self.advance()
            return self._node(project, zone, node_id)

    def _node(self, project, zone, node_id) -> NodeRecord:
        name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
        node = self.nodes.get(name)
        if node is None:
            raise ApiError("NOT_FOUND", f"Resource '{name}' was not found")
        return node

    def get_guest_attributes(self, project, zone, node_id, query_path: str = "", worker_ids=()) -> list[list[GuestAttribute]]:
        """One list per requested worker (all, in worker order, when worker_ids is empty), like
        `GetGuestAttributesResponse.guestAttributes`, which carries no worker id: position is the worker.

        Before any worker has published under the path: 404, as Compute Engine answers for guest attributes
        not written yet ("The resource 'hostkeys/' of type 'Guest Attribute' was not found.")."""
        with self.lock:
            self.advance()
            node = self._node(project, zone, node_id)
            published = (node.state == NodeState.READY and node.guest_attributes_at is not None
                         and node.guest_attributes_at <= self.clock.now())
            per_worker = node.guest_attributes if published else ()
            try:
                wanted = [int(w) for w in worker_ids] if worker_ids else list(range(node.accelerator.hosts))
            except ValueError:
                raise invalid(f"workerIds must be worker numbers, got {list(worker_ids)!r}", "worker_ids") from None
            if any(not 0 <= w < node.accelerator.hosts for w in wanted):
                raise invalid(f"workerIds {list(worker_ids)!r}: {node.name} has workers 0..{node.accelerator.hosts - 1}",
                              "worker_ids")
            namespace, _, key = query_path.strip("/").partition("/")
            out = []
            for w in wanted:
                items = per_worker[w] if w < len(per_worker) else ()
                out.append([a for a in items if (not namespace or a.namespace == namespace) and (not key or a.key == key)])
            if not any(out):
                raise ApiError("NOT_FOUND", f"The resource '{query_path}' of type 'Guest Attribute' was not found.")
            return out

    def list_nodes(self, project, zone, page_size=0, page_token=""):
        with self.lock:
            self.advance()
            items = [n for n in self.nodes.values() if n.project == project and zone in ("-", n.zone)]
            return _page(sorted(items, key=lambda n: n.name), page_size, page_token)

    def delete_node(self, project, zone, node_id, api_version="v2") -> Operation:
        with self.lock:
            self.advance()
            node = self._node(project, zone, node_id)
            qr = self.queued_resources.get(node.queued_resource)
            if qr is not None and qr.state == QrState.PROVISIONING:
                raise ApiError("FAILED_PRECONDITION", "DeleteNode is not supported while its queued resource is PROVISIONING")
            now = self.clock.now()
            op = self._new_operation(project, zone, "delete", node.name, api_version)
            if node.state != NodeState.DELETING:
                self._start_node_delete(node, now)
                if qr is not None and qr.state == QrState.ACTIVE:
                    # The slice is gone; the request keeps its quota until deleted itself.
                    self._set_qr_state(qr, QrState.SUSPENDED, now, "USER")
            self.advance()
            return op

    def _start_node_delete(self, node: NodeRecord, now: float) -> None:
        self._set_node_state(node, NodeState.DELETING, now)
        node.awaiting_hosts = False
        node.delete_done_at = now + self.scenario.delays.deleting

    def _remove_node(self, node: NodeRecord, at: float) -> None:
        if self.nodes.pop(node.name, None) is not None:
            self._emit_node(node, None, at)
        self._dirty.setdefault(node.name)
        qr = self.queued_resources.get(node.queued_resource)
        if qr is not None and node in qr.nodes:
            qr.nodes.remove(node)
        self._complete_deletes(node.name)
        self._capacity_freed(node, at)

    # -- the transition record ---------------------------------------------------------

    def _set_qr_state(self, qr: QueuedResourceRecord, state: QrState, at: float, initiator: str | None = None) -> None:
        changed = qr.state != state
        qr.set_state(state, at, initiator)
        self._dirty.setdefault(qr.name)
        if changed:
            self._emit_qr(qr, at)

    def _set_node_state(self, node: NodeRecord, state: NodeState, at: float) -> None:
        changed = node.state != state
        node.state = state
        self._dirty.setdefault(node.name)
        self._dirty.setdefault(node.queued_resource)
        if changed:
            self._emit_node(node, state, at)
            if state not in (NodeState.CREATING, NodeState.READY):
                self._capacity_freed(node, at)

    def _emit_qr(self, qr: QueuedResourceRecord, at: float, removed: bool = False) -> None:
        if self.on_transition is not None:
            self.on_transition(Transition("queued_resource", qr.name, None if removed else qr.state, at,
                                          qr.accelerator.name, qr.zone, qr.project, qr.spot, qr.chips))

    def _emit_node(self, node: NodeRecord, state: NodeState | None, at: float) -> None:
        if self.on_transition is not None:
            self.on_transition(Transition("node", node.name, state, at, node.accelerator.name, node.zone,
                                          node.project, node.spot, node.accelerator.chips, node.queued_resource))

    # -- operations ---------------------------------------------------------------------

    def get_operation(self, project, zone, op_id) -> Operation:
        with self.lock:
            self.advance()
            name = f"projects/{project}/locations/{zone}/operations/{op_id}"
            op = self.operations.get(name)
            if op is None:
                raise ApiError("NOT_FOUND", f"Resource '{name}' was not found")
            return op

    def _new_operation(self, project, zone, verb, target, api_version) -> Operation:
        now = self.clock.now()
        op_id = f"operation-{int(self.clock.wall(now).timestamp() * 1000)}-{uuid.UUID(int=self.rng.getrandbits(128)).hex[:20]}"
        op = Operation(project, zone, op_id, verb, target, now, api_version)
        self.operations[op.name] = op
        if verb == "delete":
            self._pending_deletes.setdefault(target, []).append(op)
        return op

    def _finish(self, op: Operation, response: QueuedResourceRecord | None = None, error: RpcStatus | None = None):
        op.done, op.end_time, op.response, op.error = True, self.clock.now(), response, error

    # -- time -------------------------------------------------------------------------

    def advance(self) -> None:
        """Apply every transition due by now, in scenario-time order, each stamped at its own scheduled time.

        Only the records with something due are touched (a heap of next due times), so the cost does not grow
        with the records ever created."""
        with self.lock:
            now = self.clock.now()
            self._reschedule()
            heap, due = self._heap, self._due
            while heap and heap[0][0] <= now:
                at, _, name = heapq.heappop(heap)
                if due.get(name) != at:
                    continue  # superseded by a later reschedule
                del due[name]
                applied = self._apply_due(name, now)
                self._dirty[name] = None
                self._reschedule()
                if not applied and due.get(name, now + 1) <= now:
                    due.pop(name)  # nothing happened: never spin on it (it is rescheduled when next touched)
            if self._health_scan:
                for node in list(self.nodes.values()):
                    if node.state == NodeState.READY:
                        self._advance_health(node, now)

    def next_due(self) -> float | None:
        """The earliest scenario time at which a transition is scheduled (a delay's end, a preemption, a delete
        completing, an expiry, the end of a `wait` stockout a waiting request sits in); None when nothing will
        happen by itself. A node awaiting its hosts (hosts_required) waits for the server, not for a time."""
        with self.lock:
            self._reschedule()
            heap, due = self._heap, self._due
            while heap and due.get(heap[0][2]) != heap[0][0]:
                heapq.heappop(heap)
            return heap[0][0] if heap else None

    def _reschedule(self) -> None:
        if not self._dirty:
            return
        names = list(self._dirty)
        self._dirty.clear()
        for name in names:
            at = self._record_due(name)
            if at is None:
                self._due.pop(name, None)
            elif self._due.get(name) != at:
                self._due[name] = at
                self._seq += 1
                heapq.heappush(self._heap, (at, self._seq, name))

    def _record_due(self, name: str) -> float | None:
        qr = self.queued_resources.get(name)
        if qr is not None:
            return self._qr_due(qr)
        node = self.nodes.get(name)
        if node is not None and node.state == NodeState.DELETING:
            return node.delete_done_at
        return None

    def _apply_due(self, name: str, now: float) -> bool:
        qr = self.queued_resources.get(name)
        if qr is not None:
            return self._step(qr, now)
        node = self.nodes.get(name)
        if node is not None and node.state == NodeState.DELETING and node.delete_done_at is not None \
                and node.delete_done_at <= now:
            self._remove_node(node, node.delete_done_at)
            return True
        return False

    def _qr_due(self, qr: QueuedResourceRecord) -> float | None:
        """When `_step` will next move this request (mirrors it; None: not by itself)."""
        state, since = qr.state, qr.state_since
        if state in EXPIRABLE:
            if state == QrState.ACCEPTED:
                at = since + self.scenario.delays.accepted
            else:
                at = self._capacity_time(qr, since + qr.waiting_delay)
            if qr.valid_until is not None and (at is None or qr.valid_until < at):
                return qr.valid_until
            return at
        if state == QrState.PROVISIONING:
            started = not qr.nodes or any(n.awaiting_hosts or n.state == NodeState.READY for n in qr.nodes)
            return None if started else since + qr.provisioning_delay
        if state == QrState.ACTIVE:
            times = [t for n in qr.nodes if n.state == NodeState.READY and (t := self._preemption_time(n)) is not None]
            return min(times) if times else None
        if state == QrState.SUSPENDING:
            return since + self.scenario.delays.suspending
        if state == QrState.DELETING:
            return qr.delete_done_at
        return None

    def _capacity_time(self, qr: QueuedResourceRecord, start: float) -> float | None:
        """When a capacity check first run at `start` settles (as `_capacity_check` walks): at once on a scripted
        failure, a `fail` stockout or free capacity; at the end of a chain of `wait` stockouts; None: never."""
        zone, family = qr.zone, qr.accelerator.family
        if self.scenario.failure_at(zone, family, start) is not None:
            return start
        at = start
        while True:
            stockout = self.scenario.stockout_at(zone, family, at, self.stockout_overrides)
            if stockout is None:
                if capacity_short(self, qr):
                    return None  # until a node of the zone frees capacity (_capacity_freed)
                return max(at, self._capacity_freed_at.get((zone, family), at))
            if stockout.effect == "fail":
                return at
            if stockout.end is None:
                return None
            at = stockout.end

    def _advance_health(self, node: NodeRecord, now: float) -> None:
        """The scenario's health events and maintenance notices due for a READY node, in time order."""
        rules = self.scenario.health
        due = []
        for kind, scripted in (("event", rules.events), ("maintenance", rules.maintenance)):
            for i, rule in enumerate(scripted):
                key = (kind, i)
                if key in node.fired_health_rules or node.active_since is None:
                    continue
                at = rule.due_for(node.active_since)
                if at is not None and at <= now and rule.matches(node.zone, node.accelerator.family, node.node_id):
                    due.append((at, key, rule))
        for at, key, rule in sorted(due, key=lambda d: (d[0], d[1])):
            node.advance_maintenance(at)
            node.fired_health_rules = node.fired_health_rules | {key}
            if key[0] == "event":
                symptom = Symptom(rule.symptom, rule.worker, rule.details, at) if rule.symptom else None
                node.set_health(rule.health, rule.description, symptom)
            else:
                node.maintenance = Maintenance(at + rule.notice, at + rule.notice + rule.duration, rule.type,
                                               rule.can_reschedule)
        node.advance_maintenance(now)

    def _step(self, qr: QueuedResourceRecord, now: float) -> bool:
        """Apply the next due transition of one queued resource; False when nothing is due."""
        delays = self.scenario.delays
        state, since = qr.state, qr.state_since
        self._dirty.setdefault(qr.name)
        if state in EXPIRABLE:
            expires = qr.valid_until is not None and qr.valid_until <= now
            # Transitions due before the expiry still happen; the expiry wins over later ones.
            horizon = qr.valid_until if expires else now
            if state == QrState.ACCEPTED and since + delays.accepted <= horizon:
                self._quota_check(qr, since + delays.accepted)
                return True
            if state == QrState.WAITING_FOR_RESOURCES and since + qr.waiting_delay <= horizon:
                if self._capacity_check(qr, since + qr.waiting_delay, horizon):
                    return True
            if expires:
                wall = self.clock.wall(qr.valid_until).strftime("%Y-%m-%dT%H:%M:%SZ")
                self._fail(qr, expired_error(wall), qr.valid_until)
                return True
            return False
        if state == QrState.PROVISIONING and since + qr.provisioning_delay <= now:
            if not qr.nodes or any(n.awaiting_hosts or n.state == NodeState.READY for n in qr.nodes):
                return False  # the server is starting them
            if self.hosts_required:
                for node in qr.nodes:
                    node.awaiting_hosts = True
                return False
            for node in qr.nodes:
                self._activate(qr, node, self._synthetic_endpoints(node), since + qr.provisioning_delay)
            return True
        if state == QrState.ACTIVE:
            due = [(t, i) for i, n in enumerate(qr.nodes)
                   if n.state == NodeState.READY and (t := self._preemption_due(n, now)) is not None]
            if due:
                at, first = min(due)
                self._preempt(qr, at, qr.nodes[first])
                return True
            return False
        if state == QrState.SUSPENDING and since + delays.suspending <= now:
            self._set_qr_state(qr, QrState.SUSPENDED, since + delays.suspending, qr.initiator)
            return True
        if state == QrState.DELETING and qr.delete_done_at is not None and qr.delete_done_at <= now:
            for node in list(qr.nodes):
                self._remove_node(node, qr.delete_done_at)
            del self.queued_resources[qr.name]
            self._hold_quota(qr, False)
            self._emit_qr(qr, qr.delete_done_at, removed=True)
            self._complete_deletes(qr.name)
            return True
        return False

    def _quota_check(self, qr: QueuedResourceRecord, at: float) -> None:
        """The zone's own quota, then its region's (shared by the region's zones): both are enforced."""
        family, chips = qr.accelerator.family, qr.chips  # multislice: nodeCount x the type's chips
        limit = self.scenario.quota_limit(qr.zone, family, qr.tier)  # None: no limit of the zone's own
        if limit is not None and self._quota_used(qr.project, qr.zone, family, qr.tier) + chips > limit:
            self._fail(qr, quota_error(qr.zone, family, qr.spot, limit), at)
            return
        region = zone_region(qr.zone)
        shared = self.scenario.region_quota_limit(region, family, qr.tier)
        if shared is not None and self._region_quota_used(qr.project, region, family, qr.tier) + chips > shared:
            self._fail(qr, region_quota_error(region, family, qr.spot, shared), at)
            return
        self._hold_quota(qr, True)
        self._set_qr_state(qr, QrState.WAITING_FOR_RESOURCES, at)

    def _capacity_check(self, qr: QueuedResourceRecord, at: float, horizon: float) -> bool:
        """True when the request moved on by `horizon`; False when it is still waiting for capacity."""
        scripted = self.scenario.failure_at(qr.zone, qr.accelerator.family, at)
        if scripted is not None:
            self._fail(qr, self._error_of_class(qr, scripted.error, at), at)
            return True
        while True:
            stockout = self.scenario.stockout_at(qr.zone, qr.accelerator.family, at, self.stockout_overrides)
            if stockout is None:
                break
            if stockout.effect == "fail":
                self._fail(qr, capacity_error(qr.zone, self.rng), at)
                return True
            if stockout.end is None or stockout.end > horizon:
                return False
            at = stockout.end  # the window closed while nobody looked: provisioning began then
        if capacity_short(self, qr):
            return False  # gang: every slice's chips at once or none; re-checked when capacity is freed
        at = max(at, self._capacity_freed_at.get((qr.zone, qr.accelerator.family), at))
        if self._external_ips_short(qr):
            region = zone_region(qr.zone)
            self._fail(qr, external_ip_error(region, self.scenario.external_ip_limit(region) or 0), at)
            return True
        self._set_qr_state(qr, QrState.PROVISIONING, at)
        for node_id in qr.slice_ids:  # gang provisioning: every slice's node in the same instant
            node = NodeRecord(
                project=qr.project,
                zone=qr.zone,
                node_id=node_id,
                accelerator=qr.accelerator,
                runtime_version=qr.node_spec["runtimeVersion"],
                spot=qr.spot,
                spec=qr.node_spec,
                queued_resource=qr.name,
                create_time=at,
            )
            qr.nodes.append(node)
            self.nodes[node.name] = node
            self._emit_node(node, node.state, at)
        return True

    def _capacity_freed(self, node: NodeRecord, at: float | None = None) -> None:
        """A node left CREATING/READY or was removed: in a zone with finite capacity (scenario `capacity`), the
        requests waiting there are checked again, from then on."""
        if zone_capacity(self.scenario, node.zone, node.accelerator.family) is None:
            return
        key = (node.zone, node.accelerator.family)
        if at is not None:
            self._capacity_freed_at[key] = max(at, self._capacity_freed_at.get(key, at))
        for qr in self.queued_resources.values():
            if qr.state == QrState.WAITING_FOR_RESOURCES and qr.zone == node.zone:
                self._dirty.setdefault(qr.name)

    def _external_ips_short(self, qr: QueuedResourceRecord) -> bool:
        """Would this request's node pass its region's in-use external IP quota (one address per host)?"""
        if not (qr.node_spec.get("networkConfig") or {}).get("enableExternalIps"):
            return False
        region = zone_region(qr.zone)
        limit = self.scenario.external_ip_limit(region)
        if limit is None:
            return False
        held = sum(n.accelerator.hosts for n in self.nodes.values()
                   if n.project == qr.project and zone_region(n.zone) == region and n.enable_external_ips)
        return held + qr.accelerator.hosts * len(qr.slice_ids) > limit

    def _error_of_class(self, qr: QueuedResourceRecord, error_class: str, at: float) -> RpcStatus:
        return failure_for_class(
            error_class, project=qr.project, zone=qr.zone, family=qr.accelerator.family, spot=qr.spot, rng=self.rng,
            wall=self.clock.wall(at).strftime("%Y-%m-%dT%H:%M:%SZ"),
            external_ip_limit=self.scenario.external_ip_limit(zone_region(qr.zone)) or 8)

    def _fail(self, qr: QueuedResourceRecord, error: RpcStatus, at: float) -> None:
        qr.failed_error = error
        self._set_qr_state(qr, QrState.FAILED, at, "SERVICE")
        for node in qr.nodes:
            self._start_node_delete(node, at)

    def _activate(self, qr: QueuedResourceRecord, node: NodeRecord, endpoints: tuple[Endpoint, ...], at: float) -> None:
        """One slice's node READY; the request ACTIVE once every slice's node is (gang)."""
        node.endpoints = endpoints
        node.awaiting_hosts = False
        node.active_since = at
        node.preempt_at = self._draw_preemption(node, at)
        self._set_node_state(node, NodeState.READY, at)
        if all(n.state == NodeState.READY for n in qr.nodes):
            self._set_qr_state(qr, QrState.ACTIVE, at)

    def _draw_preemption(self, node: NodeRecord, active_since: float) -> float | None:
        if not node.spot:
            return None
        rules = self.scenario.preemption
        candidates = []
        incarnation = self._incarnations.get(node.name, 0)
        self._incarnations[node.name] = incarnation + 1
        lifetime = self.scenario.spot_lifetime(node.zone, node.accelerator.family, node.name, incarnation)
        if lifetime is not None:
            candidates.append(active_since + lifetime)
        for rule in rules.scripted:
            if rule.after_active is not None and rule.matches(node.zone, node.accelerator.family, node.node_id):
                candidates.append(active_since + rule.after_active)
        return min(candidates) if candidates else None

    def _preemption_time(self, node: NodeRecord) -> float | None:
        """When a READY node is next preempted: its drawn lifetime's end or a scripted `at` since it turned READY."""
        due = [node.preempt_at] if node.preempt_at is not None else []
        if node.spot and node.active_since is not None:
            due += [rule.at for rule in self.scenario.preemption.scripted
                    if rule.at is not None and node.active_since <= rule.at
                    and rule.matches(node.zone, node.accelerator.family, node.node_id)]
        return min(due) if due else None

    def _preemption_due(self, node: NodeRecord, now: float) -> float | None:
        due = []
        if node.preempt_at is not None and node.preempt_at <= now:
            due.append(node.preempt_at)
        if node.spot and node.active_since is not None:
            for rule in self.scenario.preemption.scripted:
                if (
                    rule.at is not None
                    and node.active_since <= rule.at <= now
                    and rule.matches(node.zone, node.accelerator.family, node.node_id)
                ):
                    due.append(rule.at)
        return min(due) if due else None

    def _preempt(self, qr: QueuedResourceRecord, at: float, node: NodeRecord | None = None) -> None:
        """A slice is preempted: the whole request is SUSPENDING, and with it every slice of a multislice request
        (the fake shows them all PREEMPTED: MULTISLICE.md)."""
        for each in qr.nodes:
            if each is node or node is None or each.state == NodeState.READY:
                each.preempt_at = None
                self._set_node_state(each, NodeState.PREEMPTED, at)
        self._set_qr_state(qr, QrState.SUSPENDING, at, "SERVICE")

    def _complete_deletes(self, target: str) -> None:
        for op in self._pending_deletes.pop(target, ()):
            if not op.done:
                self._finish(op)

    def _synthetic_endpoints(self, node: NodeRecord) -> tuple[Endpoint, ...]:
        out = []
        for _ in range(node.accelerator.hosts):
            self._ip_counter += 1
            ip = f"10.130.{self._ip_counter // 250}.{self._ip_counter % 250 + 2}"
            external = f"34.1.{self._ip_counter // 250}.{self._ip_counter % 250 + 2}" if node.enable_external_ips else None
            out.append(Endpoint(ip, TPU_RUNTIME_PORT, external))
        return tuple(out)

    # -- quota --------------------------------------------------------------------------

    def quota_used(self, project: str, zone: str, family: str, tier: str) -> int:
        """Chips held in (zone, family, tier) by requests that passed the quota check and are not deleted."""
        with self.lock:
            self.advance()
            return self._quota_used(project, zone, family, tier)

    def _quota_used(self, project: str, zone: str, family: str, tier: str) -> int:
        return self._chips_held.get((project, zone, family, tier), 0)

    def _region_quota_used(self, project: str, region: str, family: str, tier: str) -> int:
        return sum(held for (p, zone, f, t), held in self._chips_held.items()
                   if (p, f, t) == (project, family, tier) and zone_region(zone) == region)

    def _hold_quota(self, qr: QueuedResourceRecord, hold: bool) -> None:
        """The one place holds_quota changes, so `_chips_held` always sums the live requests that hold."""
        if qr.holds_quota == hold:
            return
        qr.holds_quota = hold
        key = (qr.project, qr.zone, qr.accelerator.family, qr.tier)
        self._chips_held[key] = self._chips_held.get(key, 0) + (qr.chips if hold else -qr.chips)

    # -- host hand-off (server) ---------------------------------------------------------

    def nodes_awaiting_hosts(self) -> list[NodeRecord]:
        with self.lock:
            self.advance()
            return [n for n in self.nodes.values() if n.awaiting_hosts]

    def node_names_wanting_hosts(self) -> set[str]:
        with self.lock:
            return {n.name for n in self.nodes.values() if n.wants_live_hosts}

    def hosts_started(self, node_name: str, endpoints: tuple[Endpoint, ...],
                      guest_attributes: tuple[tuple[GuestAttribute, ...], ...] = ()) -> bool:
        """The server started a node's hosts: it becomes READY and its request ACTIVE. False if no longer wanted.

        guest_attributes (per worker) are published `delays.host_keys` after that."""
        with self.lock:
            node = self.nodes.get(node_name)
            if node is None or not node.awaiting_hosts:
                return False
            qr = self.queued_resources.get(node.queued_resource)
            if qr is None or qr.state != QrState.PROVISIONING:
                return False
            now = self.clock.now()
            self._activate(qr, node, endpoints, now)
            node.guest_attributes = guest_attributes
            node.guest_attributes_at = now + self.scenario.delays.host_keys
            return True

    def hosts_failed(self, node_name: str, message: str) -> None:
        with self.lock:
            node = self.nodes.get(node_name)
            if node is None:
                return
            qr = self.queued_resources.get(node.queued_resource)
            if qr is not None and qr.state == QrState.PROVISIONING:
                self._fail(qr, RpcStatus("INTERNAL", f"Internal error: worker hosts failed to start: {message}"),
                           self.clock.now())

    # -- control ------------------------------------------------------------------------

    def preempt_node(self, project: str, zone: str, node_id: str) -> NodeRecord:
        with self.lock:
            self.advance()
            node = self._node(project, zone, node_id)
            qr = self.queued_resources.get(node.queued_resource)
            if node.state != NodeState.READY or qr is None or qr.state != QrState.ACTIVE:
                raise ApiError("FAILED_PRECONDITION", f"node {node.name} is {node.state.value}, not READY")
            self._preempt(qr, self.clock.now(), node)
            return node

    def set_node_health(self, project: str, zone: str, node_id: str, health: TpuHealth,
                        description: str | None = None, symptom: SymptomType | None = None,
                        details: str | None = None, worker: int = 0) -> NodeRecord:
        """The control API's health change of a READY node, now (its hosts keep running)."""
        with self.lock:
            self.advance()
            node = self._ready_node(project, zone, node_id)
            if not 0 <= worker < node.accelerator.hosts:
                raise invalid(f"worker {worker}: {node.name} has workers 0..{node.accelerator.hosts - 1}", "worker")
            now = self.clock.now()
            node.set_health(health, description, Symptom(symptom, worker, details, now) if symptom else None)
            return node

    def schedule_maintenance(self, project: str, zone: str, node_id: str, starts_in: float | None,
                             duration: float = 3600, type: MaintenanceType = MaintenanceType.SCHEDULED,
                             can_reschedule: bool = True) -> NodeRecord:
        """The control API's maintenance notice for a READY node: its window opens `starts_in` scenario seconds
        from now and lasts `duration`; `starts_in` None takes the notice back."""
        with self.lock:
            self.advance()
            node = self._ready_node(project, zone, node_id)
            if starts_in is None:
                node.maintenance = None
                if node.health is TpuHealth.UNHEALTHY_MAINTENANCE:
                    node.set_health(TpuHealth.HEALTHY)
                return node
            if starts_in < 0 or duration <= 0:
                raise invalid("starts_in must be 0 or more and duration more than 0", "starts_in")
            now = self.clock.now()
            node.maintenance = Maintenance(now + starts_in, now + starts_in + duration, type, can_reschedule)
            node.advance_maintenance(now)
            self._health_scan = True  # its window opens and closes with time: advance() must look at READY nodes
            return node

    def _ready_node(self, project: str, zone: str, node_id: str) -> NodeRecord:
        node = self._node(project, zone, node_id)
        if node.state != NodeState.READY:
            raise ApiError("FAILED_PRECONDITION", f"node {node.name} is {node.state.value}, not READY")
        return node

    def fail_queued_resource(self, project: str, zone: str, qr_id: str, error_class: str) -> QueuedResourceRecord:
        with self.lock:
            self.advance()
            qr = self._qr(project, zone, qr_id)
            if qr.state in (QrState.FAILED, QrState.DELETING, QrState.SUSPENDED, QrState.SUSPENDING):
                raise ApiError("FAILED_PRECONDITION", f"{qr.name} is {qr.state.value}: too late to fail it")
            try:
                error = self._error_of_class(qr, error_class, self.clock.now())
            except ValueError as e:
                raise invalid(str(e)) from None
            self._fail(qr, error, self.clock.now())
            return qr

    def sync_error_of_class(self, error_class: str, project: str, zone: str) -> RpcStatus:
        """A synchronous refusal of that class for a call on (project, zone). quota is the real 429 with its
        QuotaFailure (a create over quota); the others are that class's failedData error, details included."""
        if error_class == "quota":
            return quota_api_error(zone, "v4", True, 0).rpc
        return failure_for_class(error_class, project=project, zone=zone, family="v4", spot=True, rng=self.rng,
                                 wall=self.clock.wall(self.clock.now()).strftime("%Y-%m-%dT%H:%M:%SZ"))

    def set_stockout(self, zone: str, family: str | None, stocked_out: bool | None, effect: str = "fail") -> None:
        """True: no capacity; False: capacity regardless of the scenario; None: back to the scenario."""
        with self.lock:
            self.advance()
            key = (zone, family)
            if stocked_out is None:
                self.stockout_overrides.pop(key, None)
            else:
                self.stockout_overrides[key] = Stockout(family=family, effect=effect) if stocked_out else None
            for qr in self.queued_resources.values():
                if qr.state == QrState.WAITING_FOR_RESOURCES and qr.zone == zone:
                    self._dirty.setdefault(qr.name)  # its capacity check may settle at another time now

    def set_billing(self, project: str | None, enabled: bool | None) -> None:
        with self.lock:
            if enabled is None:
                self.billing_overrides.pop(project, None)
            else:
                self.billing_overrides[project] = not enabled

    def add_fault(self, fault: ApiCallFault) -> None:
        with self.lock:
            self.faults.append(fault)


def _page(items: list, page_size: int, page_token: str) -> tuple[list, str]:
    start = 0
    if page_token:
        try:
            start = int(page_token)
        except ValueError:
            raise invalid(f"Invalid page token {page_token!r}", "page_token") from None
    if page_size < 0:
        raise invalid("pageSize must not be negative", "page_size")
    size = page_size or 1000
    page = items[start : start + size]
    next_token = str(start + size) if start + size < len(items) else ""
    return page, next_token
