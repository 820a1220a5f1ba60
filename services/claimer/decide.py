"""Core (pure, no I/O): one `decide_<event>(state, event, now, rng) -> Effects` per event kind
(`decide_request_received`, `decide_observed`; `decide` dispatches over them).

No I/O, no clock, no global randomness: the handler loads `ClaimState`, calls
the event's decide, and applies the effects. Rules (see docs in `tpuq.claimer`):

Fan-out. Every open request races in each compatible zone that has quota: one
queued resource per (request, zone), of the first of the request's types that
zone can take now: not dropped, not backed off, with quota left for the pool
and tier in the zone and its region (`quota_allows`, the one place that says so: the effective quota in
`state.prechecks`, declared, else the Cloud Quotas API's), with the entry holding
fewer than `max_slices` slices, and with no other pending queued resource of
that type in that zone (from any request). `count` (max_slices) caps the slices
HELD (PROVISIONING or ACTIVE, `HELD_STATES`), not the racers: an entry with
count 1 and three zones races all three; the first to win is kept and the rest
are cancelled at once (below, and the janitor on the ACTIVE event). Every live
queued resource holds quota in its zone, racers included. With
`claim.hedge_seconds` a request races at first as many zones as it lacks slices
and adds one more zone each time its newest racer has waited that long
(`racers_allowed`).

Granted. Once a request's HELD slices cover its count, its racers still queued
(ACCEPTED, WAITING_FOR_RESOURCES) are cancelled: a second grant would be a slice
billed through a PROVISIONING the API will not let us cancel. If a held one
fails, the request races again.

Single-slot entries (`FleetEntry.is_single_slot`, v6e by default): at most one
racer of that type in the whole fleet, and never alongside other types' racers
of the same request. A request races its other types first; a single-slot type
gets one racer, in the first zone that can take it, only when nothing else of
that request races.

Watch. A state change publishes one fleet event; the last seen state is kept.
ACTIVE (with node and endpoints), SUSPENDED (announced; the janitor deletes it:
`tpuq.claimer.model` says who owns which dead state), FAILED (-> classify, record
the class, back off or drop, then delete: the claimer owns FAILED, and the
janitor deletes a FAILED one only once its class is recorded), PROVISIONING and
WAITING_FOR_RESOURCES (informational), GONE (NOT_FOUND). A failed read
concludes nothing. An ACTIVE slice's node is read on every pass too: a change of
its health, symptoms or upcoming maintenance publishes NODE_HEALTH (`on_node_read`).

Brakes. `claim_gate` (paused, the grant ended, the day's VM-hour budget: `tpuq.capacity.brakes`) is asked before any
create is planned or a recorded one finished; a stopped fleet still watches, cancels and deletes.

Satisfied (ACTIVE >= count) or withdrawn requests cancel their pending racers
in deletable states. PROVISIONING is never deleted; ACTIVE never by the
claimer (once claimed a slice belongs to the scheduler and the janitor).
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta

from tpuq.claimer import room
from tpuq.claimer.room import claim_gate
from tpuq.claimer.classify import (BlockKind, block_kind, classify, describe_failure, project_block_reason, subnet_reason,
                                   zone_quota_reason)
from tpuq.claimer.model import (
    DELETABLE_STATES,
    GONE,
    REQUEST_OPEN,
    REQUEST_WITHDRAWN,
    REQUESTED,
    ClaimState,
    CreateQr,
    DeleteQr,
    Effects,
    FleetStatus,
    Observation,
    Observed,
    QrRecord,
    RequestReceived,
    RequestRecord,
    SliceNode,
    TargetRecord,
    queued_resource_id,
)
from tpuq.contracts.documents import QueuedResourceState as Qr
from tpuq.contracts.fleet import FleetEntry
from tpuq.contracts.messages import CapacityAction, CapacityRequest, FailureClass, FleetEvent, FleetEventKind
from tpuq.capacity.quota import BILLING_OFF_MESSAGE, billing_block_reason, declared_quota
from tpuq.contracts.racing import HELD_STATES, RaceStage, race_verdict
from tpuq.contracts.tputypes import canonical_name, zone_region

# Why a loser is cancelled, by the stage of its race (`tpuq.contracts.racing`): the delete's reason in the logs.
_LOSER_REASONS = {
    RaceStage.won: "request satisfied: cancel the losers",
    # Capacity granted (PROVISIONING) covers the request: the racers still queued are cancelled now, while the
    # API still lets them go. Left to race, one granted too would be a second slice billed to the end of its
    # provisioning, for nothing. Should a granted one fail, the request races again.
    RaceStage.granted: "capacity granted elsewhere: cancel the racers",
}

_ANNOUNCED = {
    Qr.ACTIVE: FleetEventKind.active,
    Qr.SUSPENDED: FleetEventKind.suspended,
    Qr.FAILED: FleetEventKind.failed,
    Qr.PROVISIONING: FleetEventKind.provisioning,
    Qr.WAITING_FOR_RESOURCES: FleetEventKind.waiting,
}


def decide_request_received(state: ClaimState, event: RequestReceived, now: datetime, rng: random.Random) -> Effects:
    """A capacity request (or its withdrawal) arrived: record it and plan its race."""
    decision = _Decision(state, now, rng)
    decision.on_request(event.request)
    return decision.effects


def decide_observed(state: ClaimState, event: Observed, now: datetime, rng: random.Random) -> Effects:
    """The API's answers (a watch pass's exact GETs, or one create's answer): act on each, then (a watch pass)
    plan every open request again."""
    decision = _Decision(state, now, rng)
    decision.on_observed(event.observations)
    if event.plan:
        decision.plan_all()
    return decision.effects


def fast_watch_targets(state: ClaimState, request_id: str) -> list[QrRecord]:
    """The request's queued resources still worth a quick re-read right after its creates: not yet ACTIVE."""
    return [q for q in state.qrs.values() if q.request_id == request_id and q.state != Qr.ACTIVE]


def capacity_backoff_seconds(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential in consecutive failures, capped, with 'equal jitter': never below half the step."""
    step = min(cap, base * (2 ** max(failures - 1, 0)))
    return step / 2 + rng.uniform(0, step / 2)


def request_record(request: CapacityRequest, now: datetime, existing: RequestRecord | None) -> RequestRecord:
    return RequestRecord(
        request_id=request.request_id,
        fleet=request.fleet,
        types=tuple(dict.fromkeys(canonical_name(t) for t in request.types)),
        regions=tuple(request.regions),
        zones=tuple(request.zones),
        count=request.count,
        slices=tuple(request.slices),
        status=REQUEST_OPEN,
        job_ids=tuple(request.job_ids),
        generations=dict(existing.generations) if existing else {},
        at=request.at,
        created_at=existing.created_at if existing else now,
        updated_at=now,
    )


class _Decision:
    def __init__(self, state: ClaimState, now: datetime, rng: random.Random):
        self.fleet = state.fleet
        self.version = state.fleet.version
        self.now = now
        self.rng = rng
        self.requests = dict(state.requests)
        self.qrs = {k: q for k, q in state.qrs.items() if q.live}
        self.targets = dict(state.targets)
        self.status = state.status
        self.prechecks = state.prechecks
        self.quota = state.prechecks.quota if state.prechecks else declared_quota(state.fleet)
        self.state = state
        self.effects = Effects()

    # ------------------------------------------------------------ helpers
    @property
    def blocked(self) -> bool:
        return self.status is not None and self.status.is_blocked(self.version)

    def target(self, zone: str, tpu_type: str) -> TargetRecord:
        return self.targets.get((zone, tpu_type)) or TargetRecord(self.fleet.name, zone, tpu_type)

    def put_qr(self, qr: QrRecord) -> QrRecord:
        if qr.live:
            self.qrs[qr.qr_id] = qr
        else:
            self.qrs.pop(qr.qr_id, None)
        self.effects.qrs[qr.qr_id] = qr
        return qr

    def put_target(self, target: TargetRecord) -> None:
        key = (target.zone, target.type)
        self.targets[key] = target
        self.effects.targets[key] = target

    def put_request(self, request: RequestRecord) -> None:
        self.requests[request.request_id] = request
        self.effects.requests[request.request_id] = request

    def announce(self, qr: QrRecord, kind: FleetEventKind, failure: FailureClass | None = None,
                 message: str | None = None, only_slice: int | None = None) -> None:
        entry = self.fleet.entry(qr.entry_id)
        accel = entry.accelerator if entry else None
        with_health = kind in (FleetEventKind.active, FleetEventKind.node_health)
        if qr.slices == 1:
            slices = [(None, qr.node, qr.endpoints, qr.node_health)]
        else:
            # A multislice request: one event per slice, each naming its node (known once it was ACTIVE).
            nodes = qr.slice_nodes
            slices = [(i, nodes[i].name if i < len(nodes) else (name if qr.node else None),
                       nodes[i].endpoints if i < len(nodes) else (), nodes[i].health if i < len(nodes) else None)
                      for i, name in enumerate(qr.node_names) if only_slice is None or i == only_slice]
        for index, node, endpoints, health in slices:
            self.effects.events.append(
                FleetEvent(
                    kind=kind,
                    fleet=qr.fleet,
                    queued_resource=qr.name,
                    request_id=qr.request_id,
                    zone=qr.zone,
                    type=qr.type,
                    node=node,
                    entry_id=qr.entry_id,
                    chips=accel.chips if accel else 0,
                    hosts=accel.hosts if accel else 0,
                    spot=qr.spot,
                    endpoints=list(endpoints),
                    failure_class=failure,
                    failure_message=message,
                    node_health=health if with_health else None,
                    slice_index=index,
                    slice_count=qr.slices,
                    at=self.now,
                )
            )

    def request_delete(self, qr: QrRecord, force: bool, reason: str, resource=None) -> QrRecord:
        """Mark for deletion; send the delete now only in a state the API accepts it in."""
        if not qr.delete_requested:
            qr = self.put_qr(replace(qr, delete_requested=True, updated_at=self.now))
        if qr.state in DELETABLE_STATES and not any(d.qr.qr_id == qr.qr_id for d in self.effects.deletes):
            self.effects.deletes.append(DeleteQr(qr, force=force, reason=reason, resource=resource))
        return qr

    # ------------------------------------------------------------ requests
    def on_request(self, request: CapacityRequest) -> None:
        existing = self.requests.get(request.request_id)
        if request.action is CapacityAction.withdraw:
            self.withdraw(request, existing)
            return
        if existing is not None and not existing.open:
            return  # a withdrawal is final for that request id, even if an older request message arrives late
        if existing is None or request.at is None or existing.at is None or request.at >= existing.at:
            record = request_record(request, self.now, existing)
            if existing is None or replace(record, updated_at=existing.updated_at) != existing:
                self.put_request(record)
        self.plan_all()

    def withdraw(self, request: CapacityRequest, existing: RequestRecord | None) -> None:
        record = existing or replace(request_record(request, self.now, None))
        if record.status != REQUEST_WITHDRAWN:
            self.put_request(replace(record, status=REQUEST_WITHDRAWN, updated_at=self.now))
        for qr in [q for q in self.qrs.values() if q.request_id == request.request_id]:
            # ACTIVE: claimed capacity, the scheduler's and janitor's business. PROVISIONING: cannot be deleted
            # and may still win; if it turns ACTIVE it is announced like any other slice.
            if qr.state in (Qr.ACTIVE, Qr.PROVISIONING):
                continue
            self.request_delete(qr, force=False, reason="request withdrawn")

    # ------------------------------------------------------------ watch
    def on_observed(self, observations: dict[str, Observation]) -> None:
        for qr_id, obs in observations.items():
            qr = self.qrs.get(qr_id)
            if qr is None or obs.kind == "unknown":
                continue  # a failed read is "unknown state", never "gone"
            if obs.kind == "not_found":
                self.on_not_found(qr)
            elif obs.kind == "create_failed":
                failure, message = self.classify(qr, obs)
                self.on_failure(qr, failure, message)
                self.announce(qr, FleetEventKind.failed, failure, message)
                # It never existed: nothing to delete, and the zone slot is free again.
                self.put_qr(replace(qr, state=GONE, failure_class=failure.value,
                                    failure_message=message, updated_at=self.now))
            elif obs.state is not None:
                self.on_found(qr, obs)

    def on_not_found(self, qr: QrRecord) -> None:
        if qr.state == REQUESTED and not qr.delete_requested and self.may_create(qr):
            # Our create was recorded but never confirmed (a crash, or the API failed): finish it. Same name and
            # same requestId, so the API cannot make a second one.
            self.effects.creates.append(CreateQr(qr, claim=False))
            return
        gone = self.put_qr(replace(qr, state=GONE, updated_at=self.now))
        if qr.state != REQUESTED:
            self.announce(gone, FleetEventKind.gone)

    def may_create(self, qr: QrRecord) -> bool:
        request = self.requests.get(qr.request_id)
        target = self.target(qr.zone, qr.type)
        # An entry removed from the fleet since this create was recorded can never be built again.
        return (request is not None and request.open and not self.blocked and not target.dropped(self.version)
                and not target.backed_off(self.now) and self.fleet.entry(qr.entry_id) is not None
                and claim_gate(self.state, qr.request_id, (qr.type,), self.qrs.values(), self.now,
                               qr.slices) is None)

    def on_found(self, qr: QrRecord, obs: Observation) -> None:
        state = obs.state
        if state == qr.state:
            if qr.delete_requested and state in DELETABLE_STATES:
                self.request_delete(qr, force=False, reason="delete not yet taken", resource=obs.resource)
            if state == Qr.ACTIVE:
                self.on_node_read(qr, obs)
            return
        if state == Qr.ACTIVE and not self.nodes_complete(qr, obs):
            return  # no endpoints yet (a node read failed, or none listed): announce on a later pass
        qr = replace(qr, state=state, updated_at=self.now)
        kind = _ANNOUNCED.get(state)
        if state == Qr.ACTIVE:
            slice_nodes = tuple(SliceNode(n.name, n.endpoints, n.health) for n in obs.nodes) if qr.slices > 1 else ()
            qr = self.put_qr(replace(qr, node=obs.node.name, endpoints=obs.node.endpoints,
                                     node_health=obs.node.health, slice_nodes=slice_nodes))
            self.announce(qr, FleetEventKind.active)
            target = self.target(qr.zone, qr.type)
            if target.capacity_failures or target.unknown_failures:
                self.put_target(replace(target, capacity_failures=0, unknown_failures=0))
        elif state == Qr.FAILED:
            failure, message = self.classify(qr, obs)
            qr = self.put_qr(replace(qr, failure_class=failure.value, failure_message=message))
            self.on_failure(qr, failure, message)
            self.announce(qr, FleetEventKind.failed, failure, message)
            self.request_delete(qr, force=False, reason=f"failed ({failure.value})", resource=obs.resource)
        elif state == Qr.SUSPENDED:
            # Preempted: nothing to classify. The janitor owns the delete (on this announcement, the attempt
            # event or a tick); the slot frees once it reads NOT_FOUND, and the race goes on while demand remains.
            qr = self.put_qr(qr)
            self.announce(qr, FleetEventKind.suspended)
        else:
            qr = self.put_qr(qr)
            if kind is not None:
                self.announce(qr, kind)
            if qr.delete_requested and state in DELETABLE_STATES:
                self.request_delete(qr, force=False, reason="delete requested earlier", resource=obs.resource)

    @staticmethod
    def nodes_complete(qr: QrRecord, obs: Observation) -> bool:
        """Whether an ACTIVE read brought every node with its workers (a multislice request: all its slices)."""
        if qr.slices > 1:
            return len(obs.nodes) == qr.slices and all(n.endpoints for n in obs.nodes)
        return obs.node is not None and bool(obs.node.endpoints)

    def on_node_read(self, qr: QrRecord, obs: Observation) -> None:
        """An ACTIVE slice's node, read again: a change of its health or upcoming maintenance is announced once
        (NODE_HEALTH, with what the API now says) and kept. A failed read concludes nothing. A multislice request's
        slices each so, one event for the slice whose health changed."""
        if qr.slices > 1:
            if len(obs.nodes) != qr.slices or len(qr.slice_nodes) != qr.slices:
                return
            changed = [i for i, (was, read) in enumerate(zip(qr.slice_nodes, obs.nodes))
                       if read.health is not None and read.health != was.health]
            if not changed:
                return
            nodes = tuple(replace(was, health=read.health) if i in changed else was
                          for i, (was, read) in enumerate(zip(qr.slice_nodes, obs.nodes)))
            qr = self.put_qr(replace(qr, slice_nodes=nodes, node_health=nodes[0].health, updated_at=self.now))
            for i in changed:
                self.announce(qr, FleetEventKind.node_health, only_slice=i)
            return
        health = obs.node.health if obs.node is not None else None
        if health is None or health == qr.node_health:
            return
        qr = self.put_qr(replace(qr, node_health=health, updated_at=self.now))
        self.announce(qr, FleetEventKind.node_health)

    def classify(self, qr: QrRecord, obs: Observation) -> tuple[FailureClass, str]:
        """The failure class (ErrorInfo first, then the text, then the code) and the sentence people are shown."""
        lived = (self.now - qr.created_at).total_seconds() >= self.fleet.claim.valid_until_seconds
        failure = classify(obs.error_code, obs.error_message, obs.error_info, past_valid_until=lived)
        return failure, describe_failure(failure, obs.error_code, obs.error_message, obs.error_info,
                                         self.fleet, zone_region(qr.zone))

    def on_failure(self, qr: QrRecord, failure: FailureClass, message: str | None) -> None:
        claim = self.fleet.claim
        target = replace(self.target(qr.zone, qr.type), last_failure_class=failure.value,
                         last_failure_message=message)
        if failure is FailureClass.capacity:
            failures = target.capacity_failures + 1
            delay = capacity_backoff_seconds(failures, claim.capacity_backoff_base_seconds,
                                             claim.capacity_backoff_max_seconds, self.rng)
            target = replace(target, capacity_failures=failures, backoff_until=self.now + timedelta(seconds=delay))
        elif failure is FailureClass.zone_quota:
            entry = self.fleet.entry(qr.entry_id)
            tier = entry.provisioning_model.value if entry else ("spot" if qr.spot else "on-demand")
            target = replace(target, dropped_version=self.version,
                             dropped_reason=zone_quota_reason(qr.zone, qr.type, tier))
        elif failure is FailureClass.project:
            if not self.blocked:
                self.status = FleetStatus(
                    fleet=self.fleet.name,
                    blocked=project_block_reason(self.fleet.project, message),
                    blocked_version=self.version,
                    blocked_message=message,
                    blocked_at=self.now,
                )
                self.effects.status = self.status
        elif failure is FailureClass.expired:
            pass  # validUntil reached while queued: no penalty, the next plan requests again in this zone
        elif failure is FailureClass.external_ip_quota:
            self.back_off_region(qr, target)
            return
        elif failure is FailureClass.network:
            self.drop_region(qr, target)
            return
        else:  # unknown: `unknown_error_retries` retries after a back-off, then stopped a long time
            failures = target.unknown_count(self.version) + 1
            target = replace(target, unknown_failures=failures, unknown_version=self.version,
                             backoff_until=self.now + timedelta(seconds=self.unknown_backoff_seconds(failures)))
        self.put_target(target)

    def unknown_backoff_seconds(self, failures: int) -> float:
        """`unknown_error_retries` retries after a capacity-style back-off, then stopped a long time."""
        claim = self.fleet.claim
        if failures > claim.unknown_error_retries:
            return claim.unknown_error_backoff_seconds
        return capacity_backoff_seconds(failures, claim.capacity_backoff_base_seconds,
                                        claim.capacity_backoff_max_seconds, self.rng)

    def back_off_region(self, qr: QrRecord, failed: TargetRecord) -> None:
        """An external IP refusal: IN_USE_ADDRESSES is a per-region quota (production-facts.md, "External IPs"), so
        every zone of the region, for every type whose nodes take external IPs, would be refused alike. They all
        back off together, on one retry count for the region (the most any of them has), as the unknown class."""
        targets = self.region_targets(qr, failed, external_ips_only=True)  # the region's reason shown on each
        failures = max(t.unknown_count(self.version) for t in targets) + 1
        until = self.now + timedelta(seconds=self.unknown_backoff_seconds(failures))
        for target in targets:
            self.put_target(replace(target, unknown_failures=failures, unknown_version=self.version,
                                    backoff_until=max(until, target.backoff_until or until)))

    def region_targets(self, qr: QrRecord, failed: TargetRecord, external_ips_only: bool) -> list[TargetRecord]:
        """The failed target, then every other (zone, type) the fleet may create in qr's region (only types whose
        nodes take external IPs, when asked), each carrying the failed one's class and message."""
        region = zone_region(qr.zone)
        keys = {(zone, entry.type) for entry in self.fleet.tpus
                if not entry.existing and (not external_ips_only or self.fleet.external_ips_for(entry.accelerator))
                for zone in entry.zones if zone_region(zone) == region}
        keys.discard((qr.zone, qr.type))
        return [failed, *(replace(self.target(zone, tpu_type), last_failure_class=failed.last_failure_class,
                                  last_failure_message=failed.last_failure_message) for zone, tpu_type in sorted(keys))]

    def drop_region(self, qr: QrRecord, failed: TargetRecord) -> None:
        """The TPU API refused the fleet's subnetwork in qr's region: it is one subnet for every zone and type there,
        so all of them are dropped until a person creates it (`tpuq fleet unblock`) or the fleet file changes."""
        reason = subnet_reason(self.fleet, zone_region(qr.zone))
        for target in self.region_targets(qr, failed, external_ips_only=False):
            self.put_target(replace(target, dropped_version=self.version, dropped_reason=reason))

    # ------------------------------------------------------------ fan-out
    def plan_all(self) -> None:
        if self.prechecks is not None and self.prechecks.billing.disabled and not self.blocked:
            self.status = FleetStatus(fleet=self.fleet.name, blocked=billing_block_reason(self.fleet.project),
                                      blocked_version=self.version, blocked_message=BILLING_OFF_MESSAGE,
                                      blocked_at=self.now)
            self.effects.status = self.status
        elif self.prechecks is not None and self.prechecks.billing.enabled and self.blocked \
                and block_kind(self.status.blocked_message) is BlockKind.billing:
            # The cause is gone: Cloud Billing reports billing enabled again (read afresh while blocked). If the TPU
            # API still refuses, its next refusal blocks again.
            self.status = FleetStatus(fleet=self.fleet.name)
            self.effects.status = self.status
        open_requests = sorted(
            (r for r in self.requests.values() if r.open and r.fleet == self.fleet.name),
            key=lambda r: (r.created_at or self.now, r.request_id),
        )
        for request in open_requests:
            self.plan_request(request)

    def plan_request(self, request: RequestRecord) -> None:
        mine = [q for q in self.qrs.values() if q.request_id == request.request_id]
        verdict = race_verdict({q.qr_id: q.state for q in mine}, request.count)
        if verdict.stage is not RaceStage.racing:  # won or granted: cancel the losers still racing, add no zone
            for qr in mine:
                if qr.qr_id in verdict.losers and qr.pending and not qr.delete_requested:
                    self.request_delete(qr, force=False, reason=_LOSER_REASONS[verdict.stage])
            return
        held = sum(1 for q in mine if q.state in HELD_STATES)
        if self.blocked or claim_gate(self.state, request.request_id, request.types, self.qrs.values(),
                                        self.now, min(request.slices, default=1)) is not None:
            return
        racing = [q for q in mine if q.pending]
        if any(self.single_slot(q) for q in racing):
            return  # a single-slot racer races alone
        racing_zones = {q.zone for q in racing}
        zones = self.candidate_zones(request)
        new_racers = self.racers_allowed(request, held, racing)
        for zone in zones:
            if new_racers <= 0:
                break
            if zone in racing_zones:
                continue
            picked = self.pick_entry(request, zone, single_slot=False)
            if picked is not None:
                request = self.create(request, zone, *picked)
                racing_zones.add(zone)
                new_racers -= 1
        if racing_zones:
            return  # other types race for this request: no single-slot type alongside them
        for zone in zones:  # nothing races for it: one single-slot racer, in the first zone that takes one
            picked = self.pick_entry(request, zone, single_slot=True)
            if picked is not None:
                self.create(request, zone, *picked)
                return

    def racers_allowed(self, request: RequestRecord, held: int, racing: list[QrRecord]) -> float:
        """How many zones a request may add to its race now: all of them; or with `claim.hedge_seconds`, as
        many as its count still lacks (slices held and racers queued counted), and beyond that one more each
        time its newest racer has waited that long."""
        hedge = self.fleet.claim.hedge_seconds
        if not hedge:
            return float("inf")
        queued = [q for q in racing if q.state not in HELD_STATES]
        lacking = request.count - held - len(queued)
        if lacking > 0:
            return lacking
        newest = max((q.created_at or self.now) for q in queued)
        return 1 if self.now >= newest + timedelta(seconds=hedge) else 0

    def single_slot(self, qr: QrRecord) -> bool:
        entry = self.fleet.entry(qr.entry_id)
        return entry is not None and entry.is_single_slot

    def candidate_zones(self, request: RequestRecord) -> list[str]:
        types = set(request.types)
        zones: dict[str, None] = {}
        for entry in self.fleet.tpus:
            if entry.type not in types or entry.existing:
                continue
            for zone in entry.zones:
                if request.zones and zone not in request.zones:
                    continue
                if request.regions and zone_region(zone) not in request.regions:
                    continue
                zones[zone] = None
        return list(zones)

    def pick_entry(self, request: RequestRecord, zone: str, single_slot: bool) -> tuple[FleetEntry, int] | None:
        """The entry of the first of the request's types this zone can race now, among single-slot entries
        or among the others, and how many slices to ask of it (1; a gang request: `gang_size`)."""
        for tpu_type in request.types:
            target = self.target(zone, tpu_type)
            if target.dropped(self.version) or target.backed_off(self.now):
                continue
            if any(q.pending and q.zone == zone and q.type == tpu_type for q in self.qrs.values()):
                continue  # never two requests for the same type in one zone
            for entry in self.fleet.tpus:
                if entry.type != tpu_type or zone not in entry.zones or entry.existing:
                    continue
                if entry.is_single_slot != single_slot:
                    continue
                if single_slot and any(q.pending and q.type == tpu_type for q in self.qrs.values()):
                    continue  # one request at a time for a single-slot type, in the whole fleet
                size = self.gang_size(request, zone, entry)
                if size is not None:
                    return entry, size
        return None

    def gang_size(self, request: RequestRecord, zone: str, entry: FleetEntry) -> int | None:
        """How many slices of `entry` the request asks for in `zone`: 1 for a single-slice request, else the
        largest of its gang sizes the entry's `count` and the zone's quota leave room for, one size smaller for
        each capacity failure in a row there (an elastic job takes the largest count it can get). None: none fits."""
        sizes = request.slices or (1,)  # (a single-slot type's gang races alone, as its single slices do)
        held = self.slices_of(entry)
        fitting = [n for n in sizes if held + n <= entry.max_slices and self.quota_allows(zone, entry, n)
                   and (n == 1 or claim_gate(self.state, request.request_id, (entry.type,), self.qrs.values(),
                                             self.now, n) is None)]
        if not fitting:
            return None
        return fitting[min(self.target(zone, entry.type).capacity_failures, len(fitting) - 1)]

    def slices_of(self, entry: FleetEntry) -> int:
        return room.slices_held(self.qrs.values(), entry)

    def quota_allows(self, zone: str, entry: FleetEntry, slices: int = 1) -> bool:
        return room.quota_allows(self.quota, self.fleet, self.qrs.values(), zone, entry, slices)

    def create(self, request: RequestRecord, zone: str, entry: FleetEntry, slices: int = 1) -> RequestRecord:
        generation = request.generations.get(zone, 0)
        qr = QrRecord(
            qr_id=queued_resource_id(self.fleet.owner_prefix, request.request_id, zone, generation),
            fleet=self.fleet.name,
            project=self.fleet.project,
            request_id=request.request_id,
            entry_id=entry.id,
            zone=zone,
            type=entry.type,
            spot=entry.spot,
            generation=generation,
            state=REQUESTED,
            slices=slices,
            created_at=self.now,
            updated_at=self.now,
        )
        # Recorded in the working state so later zones and requests in this pass see it; the shell writes the
        # record together with the zone claim, not with the other state updates.
        self.qrs[qr.qr_id] = qr
        self.effects.creates.append(CreateQr(qr, claim=True))
        request = replace(request, generations={**request.generations, zone: generation + 1}, updated_at=self.now)
        self.put_request(request)
        return request
