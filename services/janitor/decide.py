"""Core (pure, no I/O): the janitor's decisions. What to delete, given what the API and Firestore say, and `now`.

No I/O and no clock: the handler reads, calls these, and sends every delete
through `tpuq.janitor.deleter.DeleteAdapter` (which checks `is_ours` itself).
Every function here also filters on `is_ours`, so a foreign resource is never
even proposed (the property tests check both layers).

Rules (the module docstring of `tpuq.janitor` explains the why):
- losers: once a request has `count` ACTIVE winners, its other queued resources
  are losers. ACCEPTED / WAITING_FOR_RESOURCES are deleted at once; SUSPENDED
  too (with force), and FAILED once the claimer has classified it (below);
  PROVISIONING (and CREATING) are left alone and looked at again on the next
  event or tick. A racer that turns ACTIVE beyond the request's `count` (open or
  withdrawn: the request asked for `count`) is *surplus*: deleted at once,
  unless the scheduler made it busy (it serves a job) or a job other than the
  request's own is pending (the scheduler can use it; if it does not, the idle
  rule removes it later). Of two that win in the same instant, the one serving
  the job stays.
- idle: an owned TPU idle longer than its entry's idle timeout is deleted,
  longest idle first, while its entry keeps `keep_warm_count` live TPUs.
- dead: SUSPENDED queued resources and PREEMPTED nodes are deleted at once (the
  janitor owns them). A FAILED queued resource is the claimer's until it has
  classified it (back-off or drop first, then its own delete): the janitor
  deletes one only when queued_resources/{id} records its failure class
  (`classified_failures`), as a backstop; FAILED ones Firestore does not know
  at all are orphans.
- orphans: owned resources Firestore does not know, seen by the janitor for
  longer than `claim.orphan_grace_seconds`.
- paused (`tpuq fleet pause`): an idle TPU is deleted at once, whatever its timeout and `keep_warm_count`.
- drain (`tpuq fleet drain --now`): every owned queued resource and node the zones list is deleted (force);
  PROVISIONING ones once they leave it. Done when a list shows nothing owned left but what is DELETING.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tpuq.contracts.documents import TPU_STATES_IN_SERVICE, ClaimerQrState, TpuDoc, TpuNodeState, TpuState, short_node_name
from tpuq.contracts.documents import QueuedResourceState as Qr
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.messages import AttemptEvent, AttemptEventKind, AttemptOutcome, FleetEvent, FleetEventKind
from tpuq.runtime.ownership import LABEL_REQUEST, is_ours, name_and_labels, resource_name
from tpuq.contracts.racing import RaceStage, race_verdict
from tpuq.runtime.rawproto import has_field, raw_message, state_name

# A pending racer can be deleted without force: it has no node yet.
CANCELLABLE_STATES = frozenset({Qr.ACCEPTED, Qr.WAITING_FOR_RESOURCES})
DEAD_NODE_STATES = frozenset({TpuNodeState.PREEMPTED, TpuNodeState.TERMINATED})
# The API refuses deletes here, or one is already under way: never send one.
NEVER_DELETE_STATES = frozenset({Qr.PROVISIONING, Qr.CREATING, Qr.DELETING, Qr.SUSPENDING})


@dataclass(frozen=True)
class Delete:
    """Delete this resource (the API object, as read) for this reason."""

    resource: Any = field(compare=False)
    name: str
    force: bool
    reason: str


def state_of(resource: Any) -> str | None:
    """The state name of a tpu_v2 QueuedResource (`state.state`) or Node (`state`), or of a REST dict."""
    raw = raw_message(resource)
    if raw is not None and has_field(raw, "state"):
        return state_name(raw)
    state = resource.get("state") if isinstance(resource, Mapping) else getattr(resource, "state", None)
    inner = state.get("state") if isinstance(state, Mapping) else getattr(state, "state", None)
    if inner is not None and not isinstance(state, str):
        state = inner
    if state is None:
        return None
    return getattr(state, "name", None) or str(state)


def is_queued_resource(resource: Any) -> bool:
    return "/queuedResources/" in resource_name(resource)


# ---------------------------------------------------------------- losers


@dataclass(frozen=True)
class RaceMember:
    """One queued resource of a request's race, as the API shows it now (resource None: NOT_FOUND)."""

    name: str
    resource: Any = field(default=None, compare=False)
    tpu_state: str | None = None  # the scheduler's tpus/{node id}.state, None when it has no document
    tpu_created_at: datetime | None = None

    @property
    def state(self) -> str | None:
        return state_of(self.resource) if self.resource is not None else None


@dataclass
class LoserDecision:
    deletes: list[Delete] = field(default_factory=list)
    surplus: list[RaceMember] = field(default_factory=list)  # late winners to delete via the tpus transaction
    waiting: list[str] = field(default_factory=list)  # PROVISIONING losers: looked at again later


def decide_losers(
    members: Iterable[RaceMember], fleet: FleetFile, request_count: int, other_jobs_pending: bool,
    classified: Collection[str] = frozenset(),
) -> LoserDecision:
    """The losers of one request's race. `request_count`: slices the request asked for (open or withdrawn: a
    withdrawn request's count still caps its race). `other_jobs_pending`: a job other than the request's own
    waits, which a surplus slice could serve. `classified`: FAILED ones the claimer has classified."""
    members = [m for m in members if m.resource is not None and is_ours(m.resource, fleet)]
    decision = LoserDecision()
    needed = max(request_count, 1)  # a race keeps one winner, whatever the count
    verdict = race_verdict({m.name: m.state for m in members}, needed)
    if verdict.stage is not RaceStage.won:
        # No winner yet, or too few: every racer may still be needed. A granted race is the claimer's to cut
        # short: it watches every racer and cancels the queued ones.
        return decision
    active = [m for m in members if m.state == Qr.ACTIVE]
    for m in members:
        if m.name not in verdict.losers:
            continue
        if m.state in CANCELLABLE_STATES:
            decision.deletes.append(Delete(m.resource, m.name, force=False, reason="race lost"))
        elif dead_and_ours_to_delete(m.resource, m.name, classified):
            decision.deletes.append(Delete(m.resource, m.name, force=True, reason=f"race lost ({m.state})"))
        elif m.state == Qr.PROVISIONING:
            decision.waiting.append(m.name)
    # Winners: the ones the scheduler already uses, then the first it recorded; the rest are surplus.
    far_future = datetime.max.replace(tzinfo=None)

    def rank(m: RaceMember):
        created = m.tpu_created_at.replace(tzinfo=None) if m.tpu_created_at else far_future
        return (m.tpu_state != TpuState.busy, created, m.name)

    surplus = sorted(active, key=rank)[needed:]
    if not other_jobs_pending:
        decision.surplus = [m for m in surplus if m.tpu_state in (None, TpuState.idle)]
    return decision


def surplus_possible(members: Iterable[RaceMember], request_count: int) -> bool:
    """More ACTIVE racers than the request asked for: only then does `decide_losers` need to know whether another
    job is pending (a read the shell skips otherwise)."""
    return sum(1 for m in members if m.state == Qr.ACTIVE) > request_count


def may_take_surplus(tpu_doc: Mapping[str, Any] | None) -> bool:
    """The guard on a surplus racer's tpus/{node}, re-checked on the fresh document: absent or idle only (a TPU
    the scheduler assigned meanwhile stays)."""
    return tpu_doc is None or tpu_doc.get("state") == TpuState.idle


def races_to_settle(present: Mapping[str, Any], request_of: Mapping[str, str]) -> dict[str, list[str]]:
    """request id -> its racers among `present`, for the races that have a winner and someone to lose."""
    races: dict[str, list[str]] = defaultdict(list)
    for name, resource in present.items():
        rid = request_of.get(name) or name_and_labels(resource)[1].get(LABEL_REQUEST)
        if rid and is_queued_resource(resource):
            races[rid].append(name)
    return {rid: names for rid, names in races.items()
            if len(names) >= 2 and any(state_of(present[n]) == Qr.ACTIVE for n in names)}


def race_names(queued_resource: str, request_id: str | None, claimer_docs: Iterable[Mapping[str, Any]]
               ) -> dict[str, str | None]:
    """The queued resources to read for one fleet event's race: name -> the request it races for."""
    names: dict[str, str | None] = {queued_resource: request_id}
    if request_id:
        for doc in claimer_docs:
            if doc.get("state") != ClaimerQrState.GONE and doc.get("name"):
                names[doc["name"]] = request_id
    return names


def attempt_end_to_judge(event: AttemptEvent) -> bool:
    """An attempt that ended preempted or unreachable: its TPU may be dead. Any other end frees the TPU at the
    scheduler, and the idle rule takes it from there."""
    return event.kind is AttemptEventKind.ended and event.outcome in (AttemptOutcome.preempted,
                                                                     AttemptOutcome.infra_failed)


def fleet_event_to_judge(event: FleetEvent) -> bool:
    """A fleet event whose race the janitor settles. Not `gone` (nothing left to delete), not `node_health` (the
    scheduler's and the executor's business), and only about a queued resource: a node tpuq did not create
    (`existing:`) has none, and is never deleted."""
    return event.kind not in (FleetEventKind.gone, FleetEventKind.node_health) and bool(event.queued_resource)


# A delete marked in tpus/ but not seen through is sent again after this long.
RESEND_DELETE_AFTER = timedelta(seconds=60)


@dataclass
class FinishDecision:
    gone: list[str] = field(default_factory=list)  # tpu ids whose resource is NOT_FOUND: record them gone
    resend: list[Delete] = field(default_factory=list)  # deletes that did not take: send again


def decide_finish_deletes(tpus: Iterable["TpuDoc"], resource_of: Mapping[str, str | None],
                          observed: Mapping[str, Any], now: datetime) -> FinishDecision:
    """TPUs marked deleting: gone once their resource reads NOT_FOUND (None in `observed`); the delete is sent
    again once it has not taken for RESEND_DELETE_AFTER (a name missing from `observed` was not read)."""
    decision = FinishDecision()
    for t in tpus:
        name = resource_of.get(t.id)
        if t.state != TpuState.deleting or not name or name not in observed:
            continue
        resource = observed[name]
        if resource is None:
            decision.gone.append(t.id)
        elif state_of(resource) not in NEVER_DELETE_STATES and t.deleting_since is not None \
                and now - t.deleting_since >= RESEND_DELETE_AFTER:
            decision.resend.append(Delete(resource, name, force=True, reason="delete did not take: again"))
    return decision


# ---------------------------------------------------------------- idle


def idle_expired(tpu: TpuDoc, fleet: FleetFile, now: datetime, paused: bool = False) -> bool:
    """Idle (never busy), of this fleet, and idle for longer than its entry's timeout (paused: at all). Also
    the transaction's precondition, re-checked on the freshly read document."""
    if tpu.state != TpuState.idle or tpu.idle_since is None or tpu.fleet not in (None, fleet.name):
        return False
    entry = fleet.entry(tpu.entry_id) if tpu.entry_id else None
    if entry is not None and entry.existing:
        return False  # a node the user brought: never deleted
    if tpu.quarantined or paused:
        return True  # the scheduler will not use it again (quarantined, or its fleet paused): it only costs money
    return now - tpu.idle_since >= timedelta(seconds=fleet.idle_timeout_for(tpu.entry_id))


def decide_idle(tpus: Iterable[TpuDoc], fleet: FleetFile, now: datetime, paused: bool = False) -> list[TpuDoc]:
    """Expired idle TPUs to delete, longest idle first, keeping `keep_warm_count` live TPUs per entry.

    Busy TPUs count as live (the pool never shrinks below keep_warm_count by idleness) and are never chosen.
    Paused: every idle TPU, keep_warm_count aside.
    """
    by_entry: dict[str | None, list[TpuDoc]] = defaultdict(list)
    for t in tpus:
        if t.fleet in (None, fleet.name) and t.state in TPU_STATES_IN_SERVICE:
            by_entry[t.entry_id].append(t)
    quarantined = [t for pool in by_entry.values() for t in pool if t.quarantined and idle_expired(t, fleet, now)]
    chosen: list[TpuDoc] = []
    for entry_id, pool in by_entry.items():
        entry = fleet.entry(entry_id) if entry_id else None
        keep = entry.keep_warm_count if entry and not paused else 0
        healthy = [t for t in pool if not t.quarantined]
        expired = sorted((t for t in healthy if idle_expired(t, fleet, now, paused)),
                         key=lambda t: (t.idle_since, t.id))
        room = max(len(healthy) - keep, 0)
        chosen.extend(expired[:room])
    return whole_gangs(quarantined + chosen, tpus)


def whole_gangs(chosen: list[TpuDoc], tpus: Iterable[TpuDoc]) -> list[TpuDoc]:
    """The chosen TPUs, less any slice of a multislice queued resource whose siblings are not all chosen: deleting
    the queued resource deletes every slice (issue 37: "the janitor deletes the whole request, never a single
    slice"), so a gang goes only once every slice it holds may go."""
    picked = {t.id for t in chosen}
    siblings: dict[str, list[str]] = defaultdict(list)
    for t in tpus:
        if t.slice_count > 1 and t.queued_resource and t.state in TPU_STATES_IN_SERVICE:
            siblings[t.queued_resource].append(t.id)
    return [t for t in chosen
            if t.slice_count == 1 or not t.queued_resource or set(siblings[t.queued_resource]) <= picked]


def idle_delete_reason(tpu: TpuDoc, fleet: FleetFile, paused: bool) -> str:
    """What tpus/{id}.delete_reason records for an idle TPU the janitor deletes."""
    if tpu.quarantined:  # deleted at once, whatever its idle time: say why (a dirty host, a lost one, ...)
        return f"quarantined: {tpu.quarantine_reason or 'its last attempt could not finish on it'}"
    if paused:
        return "idle while the fleet is paused"
    return f"idle longer than {fleet.idle_timeout_for(tpu.entry_id)} s"


@dataclass(frozen=True)
class ReapDecision:
    """For an idle TPU already marked deleting: the delete to send, or why it is recorded gone instead."""

    delete: Delete | None = None
    gone_reason: str | None = None


def decide_reap(name: str | None, resource: Any, fleet: FleetFile) -> ReapDecision:
    """`resource`: the TPU's queued resource (or node) as just read, None when NOT_FOUND (or no name to read)."""
    if resource is None or not name:
        return ReapDecision(gone_reason="not found when the janitor deleted it")
    if not is_ours(resource, fleet):
        return ReapDecision(gone_reason="no longer carries this fleet's owner marks: left alone, not deleted")
    return ReapDecision(delete=Delete(resource, name, force=True, reason="idle timeout"))


# ---------------------------------------------------------------- dead


def classified_failures(claimer_docs: Iterable[Mapping[str, Any]]) -> set[str]:
    """Names of the FAILED queued resources whose failure the claimer has classified (and acted on): the
    class it recorded on queued_resources/{id} is the janitor's licence to delete them too."""
    return {doc["name"] for doc in claimer_docs
            if doc.get("name") and doc.get("state") == Qr.FAILED and doc.get("failure_class")}


def dead_and_ours_to_delete(resource: Any, name: str, classified: Collection[str]) -> bool:
    """A dead queued resource the janitor deletes: SUSPENDED (the janitor's), or FAILED once classified."""
    state = state_of(resource)
    return state == Qr.SUSPENDED or (state == Qr.FAILED and name in classified)


def decide_dead(resources: Iterable[Any], fleet: FleetFile, classified: Collection[str] = frozenset()
                ) -> list[Delete]:
    """SUSPENDED queued resources, FAILED ones the claimer has classified (`classified`, names), and
    PREEMPTED nodes: they hold quota until deleted. An unclassified FAILED one is left to the claimer."""
    out: list[Delete] = []
    resources = [r for r in resources if r is not None and is_ours(r, fleet)]
    # A node whose queued resource was read too goes with it (force): one delete, not two.
    read_qrs = {resource_name(r) for r in resources if is_queued_resource(r)}
    for r in resources:
        name = resource_name(r)
        state = state_of(r)
        if is_queued_resource(r) and dead_and_ours_to_delete(r, name, classified):
            out.append(Delete(r, name, force=True, reason=f"dead ({state}): holds quota"))
        elif not is_queued_resource(r) and state in DEAD_NODE_STATES and _node_back_reference(r) not in read_qrs:
            out.append(Delete(r, name, force=True, reason=f"dead node ({state}): holds quota"))
    return out


# ---------------------------------------------------------------- drain


@dataclass
class DrainDecision:
    deletes: list[Delete] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # PROVISIONING, CREATING, SUSPENDING: deleted on a later pass

    @property
    def done(self) -> bool:
        return not self.deletes and not self.waiting


DRAIN_WAIT_STATES = frozenset({Qr.PROVISIONING, Qr.CREATING, Qr.SUSPENDING, TpuNodeState.CREATING})
DRAIN_DONE_STATES = frozenset({Qr.DELETING, TpuNodeState.DELETING})


def drain_marks(tpus: Iterable[TpuDoc]) -> list[TpuDoc]:
    """The TPUs a drain marks deleting before it deletes: the scheduler must not hand out what is about to go."""
    return [t for t in tpus if t.state in (TpuState.idle, TpuState.busy)]


def drain_may_mark(tpu_doc: Mapping[str, Any] | None) -> bool:
    """The drain's guard on tpus/{node}, re-checked on the fresh document."""
    return tpu_doc is not None and tpu_doc.get("state") in (TpuState.idle, TpuState.busy)


def decide_drain(listed: Iterable[Any], fleet: FleetFile) -> DrainDecision:
    """`tpuq fleet drain --now`: every owned queued resource and node the zones list, Firestore or not.

    Only `is_ours` resources are even looked at. A node whose queued resource is listed goes with it (force)."""
    listed = [r for r in listed if r is not None and is_ours(r, fleet)]
    qr_names = {resource_name(r) for r in listed if is_queued_resource(r)}
    qr_node_ids = {node for r in listed if is_queued_resource(r) for node in _node_ids_of(r)}
    decision = DrainDecision()
    for r in listed:
        name, state = resource_name(r), state_of(r)
        if state in DRAIN_DONE_STATES:
            continue
        if not is_queued_resource(r) and (_node_back_reference(r) in qr_names
                                          or short_node_name(name) in qr_node_ids):
            continue  # deleted with its queued resource
        if state in DRAIN_WAIT_STATES:
            decision.waiting.append(name)
        else:
            decision.deletes.append(Delete(r, name, force=True, reason="drain: tpuq fleet drain --now"))
    return decision


# ---------------------------------------------------------------- orphans


@dataclass
class OrphanDecision:
    deletes: list[Delete] = field(default_factory=list)
    first_seen: dict[str, datetime] = field(default_factory=dict)  # candidates still in their grace period


def decide_orphans(
    listed: Iterable[Any], known_ids: set[str], first_seen: Mapping[str, datetime], fleet: FleetFile, now: datetime
) -> OrphanDecision:
    """Owned resources (from the per-zone lists) that Firestore does not know.

    `known_ids`: short ids of every queued resource and node Firestore records. A
    candidate is deleted once the janitor has seen it for `orphan_grace_seconds`
    (its own clock, not the API's createTime). A node whose queued resource is
    listed goes with that queued resource (force), never on its own.
    """
    listed = [r for r in listed if r is not None and is_ours(r, fleet)]
    qr_node_ids = set()
    for r in listed:
        if is_queued_resource(r):
            qr_node_ids.add(short_node_name(resource_name(r)))
            qr_node_ids.update(_node_ids_of(r))
    grace = timedelta(seconds=fleet.claim.orphan_grace_seconds)
    decision = OrphanDecision()
    for r in listed:
        name = resource_name(r)
        rid = short_node_name(name)
        if rid in known_ids or state_of(r) in NEVER_DELETE_STATES:
            continue
        if not is_queued_resource(r) and (rid in qr_node_ids or _node_back_reference(r)):
            continue  # deleted with its queued resource
        seen = first_seen.get(name, now)
        if now - seen >= grace:
            decision.deletes.append(Delete(r, name, force=True, reason="orphan: owned, unknown to Firestore"))
        else:
            decision.first_seen[name] = seen
    return decision


def orphan_scan_due(last_scan: datetime | None, now: datetime, interval_seconds: float) -> bool:
    """A per-zone list is the only scan tpuq makes: at most once per `interval_seconds` per fleet."""
    return last_scan is None or now - last_scan >= timedelta(seconds=interval_seconds)


def orphan_scan_due_at(last_scan: datetime | None, now: datetime, interval_seconds: float) -> datetime | None:
    """The instant from which `orphan_scan_due` says yes (None: due now)."""
    if orphan_scan_due(last_scan, now, interval_seconds):
        return None
    assert last_scan is not None
    return last_scan + timedelta(seconds=interval_seconds)


def listed_owned_ids(listed: Iterable[Any], fleet: FleetFile) -> set[str]:
    """The short ids of the listed resources that are ours: the ones `decide_orphans` asks `known_ids` about."""
    return {short_node_name(resource_name(r)) for r in listed if r is not None and is_ours(r, fleet)}


def known_ids(claimer_docs: Iterable[Mapping[str, Any]], tpus: Iterable[TpuDoc]) -> set[str]:
    """Every short id Firestore knows a resource by: the claimer's queued resources and nodes, and tpus/."""
    known: set[str] = set()
    for q in claimer_docs:
        known.update(filter(None, (q.get("qr_id"), short_node_name(q.get("node") or ""))))
    for t in tpus:
        known.update(filter(None, (t.id, short_node_name(t.queued_resource or ""), short_node_name(t.name or ""))))
    return known


def _node_ids_of(qr: Any) -> list[str]:
    tpu = qr.get("tpu") if isinstance(qr, Mapping) else getattr(qr, "tpu", None)
    if tpu is None:
        return []
    specs = (tpu.get("nodeSpec") or tpu.get("node_spec") or []) if isinstance(tpu, Mapping) else tpu.node_spec
    out = []
    for s in specs:
        node_id = s.get("nodeId") or s.get("node_id") if isinstance(s, Mapping) else getattr(s, "node_id", "")
        if node_id:
            out.append(node_id)
            continue
        # A multislice request: nodes `<prefix>-0 .. <prefix>-<n-1>`, the prefix defaulting to the request's id
        # (QueuedResource.Tpu.NodeSpec.MultisliceParams).
        params = (s.get("multisliceParams") or s.get("multislice_params") or {}) if isinstance(s, Mapping) \
            else getattr(s, "multislice_params", None)
        count = (params.get("nodeCount") or params.get("node_count")) if isinstance(params, Mapping) \
            else getattr(params, "node_count", 0)
        if count:
            prefix = (params.get("nodeIdPrefix") or params.get("node_id_prefix")) if isinstance(params, Mapping) \
                else getattr(params, "node_id_prefix", "")
            prefix = prefix or short_node_name(resource_name(qr))
            out.extend(f"{prefix}-{i}" for i in range(int(count)))
    return out


def _node_back_reference(node: Any) -> str:
    ref = node.get("queuedResource") if isinstance(node, Mapping) else getattr(node, "queued_resource", "")
    return ref or ""


def node_id_of(qr: Any) -> str:
    """The node id a queued resource asks for (the claimer uses the queued resource's own id)."""
    return node_ids_of(qr)[0]


def node_ids_of(qr: Any) -> list[str]:
    """Every node id a queued resource asks for: its one node, or a multislice request's every slice."""
    return _node_ids_of(qr) or [short_node_name(resource_name(qr))]


def dedupe(deletes: Iterable[Delete]) -> list[Delete]:
    """One delete per resource per handler run; force wins."""
    out: dict[str, Delete] = {}
    for d in deletes:
        if d.name not in out or (d.force and not out[d.name].force):
            out[d.name] = d
    return list(out.values())
