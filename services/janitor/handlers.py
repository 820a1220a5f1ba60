"""The janitor service: shell (Firestore, the Cloud TPU API). Thin handlers: read, call the pure `decide_*`
functions of `tpuq.janitor.decide`, apply what they return (deletes through the DeleteAdapter, tpus/ marks).

Shape: module-level `on_<topic>(message, ctx)` handlers, the route table `ROUTES`, and `build_service(settings,
clients)`, whose per-instance `JanitorState` (the orphan-scan interval, the TPU adapter's factory) is `ctx.state`.

- /push/fleet-events: the event's race (every queued resource of its request,
  by exact GET): losers and dead ones are deleted synchronously, in this handler.
- /push/ticks: per fleet, what can need action now (TPUs idle past their timeout, TPUs marked deleting), and on
  a cadence recorded in `janitor/{fleet}` (`tpuq.janitor.cadence`) the full sweep by exact GET of every live
  queued resource Firestore knows (dead ones, losers that left PROVISIONING, stuck deletes: the backstop for
  lost fleet events) and (rate-limited, same document) the orphan scan.
- /push/ticks also applies `fleet_control/{fleet}`: paused deletes idle TPUs at once; a drain asked for
  (`tpuq fleet drain --now`) deletes every owned resource the zones list, and is recorded done.
- /push/attempt-events: an attempt that ended preempted / infra_failed: the
  TPU's queued resource and node are read and deleted if dead.

Every handler is idempotent: it reads the API's state before each delete, a
resource already DELETING or NOT_FOUND is left alone, and the tpus/{id}
"deleting" mark is a conditional write, so a redelivered message deletes nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

from google.cloud.firestore import FieldFilter

from tpuq.runtime import guarded

from tpuq.contracts import store, topology
from tpuq.contracts.documents import TPU_STATES_HOLDING_A_SLICE, JobState, TpuDoc, TpuState, short_node_name
from tpuq.contracts.documents import QueuedResourceState as Qr
from tpuq.contracts.errors import TpuqError
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import FleetControl, fleet_of, load_control, load_fleet, record_drain_progress
from tpuq.janitor import cadence
from tpuq.janitor import decide as d
from tpuq.janitor import leaked
from tpuq.janitor.deleter import ACCEPTED, DeleteAdapter, DeleteOutcome, NotOurs
from tpuq.runtime import tickdue
from tpuq.runtime.isolation import Isolated
from tpuq.contracts.messages import AttemptEvent, FleetEvent, Tick
from tpuq.contracts.notify import Notification
from tpuq.janitor import notify
from tpuq.runtime.clients import Clients
from tpuq.runtime.service import Context, Service
from tpuq.runtime.settings import Settings

log = logging.getLogger("tpuq.janitor")

# The claimer's record of every queued resource it created (tpuq.claimer.statestore.QUEUED_RESOURCES).
CLAIMER_QUEUED_RESOURCES = store.QUEUED_RESOURCES
# janitor/{fleet}: when the last orphan scan ran, and the orphan candidates seen so far.
JANITOR = store.JANITOR


@dataclass
class Report:
    deleted: list[DeleteOutcome] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)


@dataclass
class Janitor:
    """The imperative shell for one fleet and one message."""

    ctx: Context
    fleet: FleetFile
    api: DeleteAdapter
    report: Report = field(default_factory=Report)
    paused: bool = False  # fleet_control/{fleet}.paused: idle TPUs go at once

    @property
    def db(self):
        return self.ctx.clients.firestore

    # ------------------------------------------------------------ Firestore reads
    def claimer_docs(self, **equals: Any) -> list[dict]:
        q = self.db.collection(CLAIMER_QUEUED_RESOURCES).where(filter=FieldFilter("fleet", "==", self.fleet.name))
        for key, value in equals.items():
            q = q.where(filter=FieldFilter(key, "==", value))
        return [s.to_dict() for s in q.stream()]

    def tpu_docs(self, live_only: bool = False, states: frozenset[str] | None = None) -> list[d.TpuDoc]:
        """The fleet's TPUs; `live_only`: not gone (a tick's sweep, reaping and drain need no others, and the gone
        ones are every TPU the fleet ever had: read on every tick, they would grow the tick's reads for ever);
        `states`: only those in these states."""
        q = self.db.collection(store.TPUS).where(filter=FieldFilter("fleet", "==", self.fleet.name))
        if live_only or states:
            q = q.where(filter=FieldFilter("state", "in", sorted(states or TPU_STATES_HOLDING_A_SLICE)))
        return [d.TpuDoc.from_doc(s.to_dict(), s.id) for s in q.stream()]

    def known_among(self, listed) -> set[str]:
        """Of the listed resources' ids, those `d.known_ids` counts as known (all `decide_orphans` asks about).

        Usually each has a document of its own id (`queued_resources/{id}` or `tpus/{id}`, in this fleet): one
        batched read of those. Only when one has not are every queued resource and TPU document of the fleet
        read, as the rule says; a fleet keeps every document it ever had, so reading them all on every scan
        would grow without end."""
        ids = d.listed_owned_ids(listed, self.fleet)
        if not ids:
            return set()
        found: set[str] = set()
        for collection in (CLAIMER_QUEUED_RESOURCES, store.TPUS):  # a TPU's record only for what has no claimer's
            refs = [self.db.collection(collection).document(i) for i in sorted(ids - found)]
            found |= {s.id for s in self.db.get_all(refs)
                      if s.exists and (s.to_dict() or {}).get("fleet") == self.fleet.name}
            if ids <= found:
                return found
        return d.known_ids(self.claimer_docs(), self.tpu_docs())

    def request_demand(self, request_id: str) -> tuple[int, set[str]]:
        """The slices the request asked for, and the jobs it asks for."""
        snap = self.db.collection(store.REQUESTS).document(request_id).get()
        doc = snap.to_dict() if snap.exists else {}
        return int(doc.get("count", 1)), set(doc.get("job_ids") or ())

    def jobs_pending(self, besides: set[str]) -> bool:
        """Whether a job other than `besides` is pending (a surplus slice could serve it)."""
        q = self.db.collection(store.JOBS).where(filter=FieldFilter("state", "==", JobState.pending))
        return any(s.id not in besides for s in q.limit(len(besides) + 1).stream())

    # ------------------------------------------------------------ API reads
    def read_all(self, names: list[str]) -> dict[str, Any]:
        """Exact GETs; a name whose read keeps failing is left out (unknown state concludes nothing)."""
        out: dict[str, Any] = {}
        failed: dict[str, TpuqError] = {}
        for name, value in self.api.read_all_safely(names).items():
            if isinstance(value, TpuqError):
                failed[name] = value
            else:
                out[name] = value
        if failed:  # with what the API answered (each distinct answer once): a read that keeps failing says why
            answers = dict.fromkeys(f"{type(e).__name__}: {str(e)[:300]}" for e in failed.values())
            more = f"; and {len(answers) - 3} other answers" if len(answers) > 3 else ""
            log.warning("could not read %s; they are looked at again on the next event or tick (%s)", list(failed),
                        "; ".join(list(answers)[:3]) + more)
        return out

    # ------------------------------------------------------------ deletes
    def delete(self, deletes: list[d.Delete]) -> None:
        for item in d.dedupe(deletes):
            try:
                self.report.deleted.append(self.api.delete(item.resource, force=item.force, reason=item.reason))
            except NotOurs:
                # The guard said no (e.g. the fleet's owner prefix changed since we created it): never delete,
                # never fail the whole pass over it either.
                log.warning("refused to delete %s: it does not carry this fleet's owner marks", item.name)
                self.report.deleted.append(DeleteOutcome(item.name, "refused", "not ours"))

    def mark_deleting(self, tpu_id: str, allowed, reason: str, absent_fields: dict | None = None) -> bool:
        """The scheduler's assignment guard (`tpuq.runtime.guarded`), over the same tpus/{node} document.

        `allowed(doc or None)` decides on the fresh document; an assignment that commits in between makes
        this write fail (and vice versa), so a TPU is either assigned or deleted, never both.
        """
        now = self.ctx.now()
        snap = self.db.collection(store.TPUS).document(tpu_id).get()
        doc = snap.to_dict() if snap.exists else None
        if not allowed(doc):
            return False
        fields = TpuDoc.fields(state=TpuState.deleting, deleting_since=now, delete_reason=reason, updated_at=now)
        if not snap.exists:
            fields = {**(absent_fields or {}), **fields, "created_at": now}
        if not guarded.commit_if_unchanged(self.db, guarded.WriteSet().update(snap, fields)):
            log.info("tpus/%s changed under us (an assignment won): not deleted", tpu_id)
            return False
        return True

    def mark_all_deleting(self, checks: list[tuple[str, Any]], reason: str, absent_fields: dict | None = None) -> bool:
        """`mark_deleting` for several TPUs at once (a gang's slices): one guarded commit over all their documents,
        each `allowed` on its fresh read; none is marked unless all are. A slice with no record yet (its ACTIVE not
        handled) is recorded deleting with `absent_fields`, as `mark_deleting` does: the scheduler's record of it
        then keeps that state, and no later race verdict ranks it as a fresh idle winner."""
        now = self.ctx.now()
        snaps = [self.db.collection(store.TPUS).document(tpu_id).get() for tpu_id, _ in checks]
        if not all(allowed(snap.to_dict() if snap.exists else None) for snap, (_, allowed) in zip(snaps, checks)):
            return False
        fields = TpuDoc.fields(state=TpuState.deleting, deleting_since=now, delete_reason=reason, updated_at=now)
        writes = guarded.WriteSet()
        for snap in snaps:
            writes.update(snap, fields if snap.exists else {**(absent_fields or {}), **fields, "created_at": now})
        if not guarded.commit_if_unchanged(self.db, writes):
            log.info("a slice of %s changed under us (an assignment won): not deleted", [c[0] for c in checks])
            return False
        return True

    def gang_slices(self, queued_resource: str) -> list[d.TpuDoc]:
        """The recorded slices of a multislice queued resource that are not gone."""
        q = self.db.collection(store.TPUS).where(filter=FieldFilter("queued_resource", "==", queued_resource))
        return [t for t in (d.TpuDoc.from_doc(s.to_dict() or {}, s.id) for s in q.stream())
                if t.state != TpuState.gone]

    def mark_gone(self, tpu_id: str, reason: str) -> None:
        now = self.ctx.now()
        self.db.collection(store.TPUS).document(tpu_id).set(
            TpuDoc.fields(state=TpuState.gone, gone_at=now, gone_reason=reason, updated_at=now), merge=True)

    # ------------------------------------------------------------ races and dead ones
    def settle(self, observed: dict[str, Any], request_of: dict[str, str], classified: set[str]) -> None:
        """Dead resources, then each request's losers, among what was just read. `classified`: the FAILED
        queued resources the claimer has classified (`d.classified_failures`); other FAILED ones are its."""
        present = {n: r for n, r in observed.items() if r is not None}
        deletes = d.decide_dead(present.values(), self.fleet, classified)
        for rid, names in d.races_to_settle(present, request_of).items():
            deletes += self.settle_race(rid, {n: present[n] for n in names}, classified)
        self.delete(deletes)

    def settle_race(self, request_id: str, members: dict[str, Any], classified: set[str]) -> list[d.Delete]:
        count, job_ids = self.request_demand(request_id)
        # An ACTIVE member's TPUs: its node, or a multislice request's every slice (`<prefix>-<i>`), judged as one:
        # busy if any slice is, and taken as a surplus only if every slice may be.
        tpu_ids = {n: d.node_ids_of(r) for n, r in members.items() if d.state_of(r) == Qr.ACTIVE}
        snaps = {s.id: s for s in self.db.get_all([self.db.collection(store.TPUS).document(i)
                                                   for i in {i for ids in tpu_ids.values() for i in ids}])}
        race = []
        for name, resource in members.items():
            docs = [snap.to_dict() if snap is not None and snap.exists else {}
                    for snap in (snaps.get(i) for i in tpu_ids.get(name, [""]))]
            states = [doc.get("state") for doc in docs]
            state = TpuState.busy if TpuState.busy in states else states[0]
            race.append(d.RaceMember(name, resource, state, min((doc.get("created_at") for doc in docs
                                                                 if doc.get("created_at")), default=None)))
        other_jobs_pending = self.jobs_pending(job_ids) if d.surplus_possible(race, count) else False
        decision = d.decide_losers(race, self.fleet, count, other_jobs_pending, classified)
        self.report.waiting += decision.waiting
        deletes = list(decision.deletes)
        for m in decision.surplus:
            ids, why = tpu_ids[m.name], "surplus: its race was already won"
            absent = {"fleet": self.fleet.name, "queued_resource": m.name, "request_id": request_id}
            marked = (self.mark_deleting(ids[0], d.may_take_surplus, why, absent) if len(ids) == 1
                      else self.mark_all_deleting([(i, d.may_take_surplus) for i in ids], why, absent))
            if marked:
                deletes.append(d.Delete(m.resource, m.name, force=True, reason="surplus racer: race already won"))
        return deletes

    def settle_event(self, event: FleetEvent) -> None:
        """The event's race: every queued resource of its request, by exact GET."""
        claimer = self.claimer_docs(request_id=event.request_id) if event.request_id else []
        names = d.race_names(event.queued_resource, event.request_id, claimer)
        self.settle(self.read_all(list(names)), {n: r for n, r in names.items() if r},
                    d.classified_failures(claimer))

    # ------------------------------------------------------------ ticks
    def sweep(self, tpus: list[d.TpuDoc]) -> None:
        """Exact GETs of every live queued resource Firestore knows for the fleet (no list call)."""
        request_of: dict[str, str] = {}
        docs = self.claimer_docs(live=True)
        for doc in docs:
            if doc.get("name"):
                request_of[doc["name"]] = doc.get("request_id") or ""
        tpu_resource = {t.id: t.queued_resource or t.name for t in tpus if t.state != TpuState.gone}
        observed = self.read_all([*request_of, *filter(None, tpu_resource.values())])
        self.settle(observed, request_of, d.classified_failures(docs))
        self.finish_deletes(tpus, tpu_resource, observed)

    def finish_deletes(self, tpus: list[d.TpuDoc], tpu_resource: dict[str, str | None], observed: dict) -> None:
        """TPUs marked deleting: gone once NOT_FOUND; the delete is sent again if it did not take."""
        decision = d.decide_finish_deletes(tpus, tpu_resource, observed, self.ctx.now())
        for tpu_id in decision.gone:
            self.mark_gone(tpu_id, "deleted by the janitor")
        self.delete(decision.resend)

    def reap_idle(self, tpus: list[d.TpuDoc]) -> None:
        now, paused = self.ctx.now(), self.paused
        still_expired = (lambda t: lambda doc: doc is not None and d.idle_expired(
            d.TpuDoc.from_doc(doc, t.id), self.fleet, self.ctx.now(), paused))
        # A multislice queued resource's slices go together (`d.whole_gangs`): all marked deleting in one guarded
        # commit, or none (an assignment of any of them wins), then one read and one delete of the request.
        groups: dict[str, list[d.TpuDoc]] = {}
        for t in d.decide_idle(tpus, self.fleet, now, paused):
            key = t.queued_resource if t.slice_count > 1 and t.queued_resource else t.id
            groups.setdefault(key, []).append(t)
        for key, group in groups.items():
            reason = d.idle_delete_reason(group[0], self.fleet, paused)
            if len(group) == 1 and group[0].slice_count == 1:
                marked = self.mark_deleting(group[0].id, still_expired(group[0]), reason)
            else:
                # Every slice the store knows of this request, whatever the caller read (a quiet pass reads idle
                # TPUs only: a busy slice, say a single-slice job's, would be unseen and killed with the request).
                slices = self.gang_slices(key)
                marked = {t.id for t in slices} <= {t.id for t in group} and self.mark_all_deleting(
                    [(t.id, still_expired(t)) for t in slices], reason)
            if not marked:
                continue
            name = group[0].queued_resource or group[0].name
            decision = d.decide_reap(name, self.api.read(name) if name else None, self.fleet)
            if decision.gone_reason:
                for t in group:
                    self.mark_gone(t.id, decision.gone_reason)
            if decision.delete:
                self.delete([decision.delete])

    def list_fleet_zones(self) -> tuple[list[Any], bool]:
        """Every queued resource and node in the fleet's zones; False when a zone could not be listed."""
        listed: list[Any] = []
        complete = True
        for zone in dict.fromkeys(z for entry in self.fleet.tpus for z in entry.zones):
            try:
                listed += self.api.list_zone(zone)
            except TpuqError as e:
                complete = False
                log.warning("cannot list %s (%s); the next pass tries again", zone, e)
        return listed, complete

    def drain(self, control: FleetControl, tpus: list[d.TpuDoc]) -> None:
        """`tpuq fleet drain --now`: delete every owned queued resource and node of the fleet's zones, then list
        again; the drain is recorded done once a list shows nothing owned left but what is DELETING. Idempotent:
        a redelivered tick lists again, and a delete of what is gone is 'already gone'."""
        assert control.drain_id
        for t in d.drain_marks(tpus):
            self.mark_deleting(t.id, d.drain_may_mark, "drain: tpuq fleet drain --now")
        listed, complete = self.list_fleet_zones()
        decision = d.decide_drain(listed, self.fleet)
        before = len(self.report.deleted)
        self.delete(decision.deletes)
        if decision.deletes:
            listed, complete = self.list_fleet_zones()
            decision = d.decide_drain(listed, self.fleet)
        deleted = [o.name for o in self.report.deleted[before:] if o.result == ACCEPTED]
        if decision.waiting:
            log.info("drain %s: waiting for %s to leave PROVISIONING", control.drain_id, decision.waiting)
        record_drain_progress(self.db, self.fleet.name, control.drain_id, deleted,
                              complete and decision.done, self.ctx.now())

    def claim_due_runs(self, orphan_scan_seconds: float, sweep_every: timedelta) -> DueRuns:
        """The full sweep and the orphan scan, if due (`cadence.sweep_due`, `d.orphan_scan_due`), claimed with
        one guarded write of janitor/{fleet}: of two tick handlers at once one claim wins, the other runs
        neither (it still runs the quiet pass)."""
        now = self.ctx.now()
        snap = self.db.collection(JANITOR).document(self.fleet.name).get()
        doc = snap.to_dict() if snap.exists else {}
        sweep = cadence.sweep_due(doc.get(cadence.SWEEP_AT), now, sweep_every)
        orphans = d.orphan_scan_due(doc.get(cadence.ORPHAN_SCAN_AT), now, orphan_scan_seconds)
        if not (sweep or orphans):
            return DueRuns(False, False, doc)
        fields = {**({cadence.SWEEP_AT: now} if sweep else {}), **({cadence.ORPHAN_SCAN_AT: now} if orphans else {})}
        if not snap.exists:
            fields = {"fleet": self.fleet.name, "orphan_first_seen": [], **fields}
        if not guarded.commit_if_unchanged(self.db, guarded.WriteSet().update(snap, fields)):
            return DueRuns(False, False, doc)  # another tick handler claimed them
        return DueRuns(sweep, orphans, doc, claimed=fields)

    def quiet_pass(self) -> bool:
        """Between full sweeps: only the TPUs that can need action now, by one indexed query (idle or marked
        deleting): a delete finished or to send again, and the idle rule when an idle TPU is past its timeout
        (every live TPU read then only if its entry keeps some warm: `cadence.needs_every_live_tpu`). Whether
        any was found (the next tick has work)."""
        waiting = self.tpu_docs(states=tickdue.WAKE_JANITOR_STATES)
        deleting = [t for t in waiting if t.state == TpuState.deleting]
        if deleting:
            tpu_resource = {t.id: t.queued_resource or t.name for t in deleting}
            self.finish_deletes(deleting, tpu_resource, self.read_all(list(filter(None, tpu_resource.values()))))
        now = self.ctx.now()
        expired = [t for t in waiting if d.idle_expired(t, self.fleet, now, self.paused)]
        if not expired:
            return bool(waiting)
        keep_warm_of = lambda entry_id: (self.fleet.entry(entry_id).keep_warm_count  # noqa: E731
                                         if entry_id and self.fleet.entry(entry_id) else 0)
        if cadence.needs_every_live_tpu(expired, keep_warm_of, self.paused):
            self.reap_idle(self.tpu_docs(live_only=True))
        else:
            self.reap_idle([t for t in waiting if t.state == TpuState.idle])
        return True

    def scan_orphans(self, doc: dict) -> None:
        """Once claimed (`claim_due_runs`, at most once per orphan-scan interval per fleet): list every zone of
        the fleet, delete owned resources Firestore does not know. `doc`: janitor/{fleet} as read before."""
        now = self.ctx.now()
        listed, _ = self.list_fleet_zones()
        known = self.known_among(listed)
        first_seen = {e["name"]: e["seen"] for e in doc.get("orphan_first_seen") or []}
        decision = d.decide_orphans(listed, known, first_seen, self.fleet, now)
        leaked.tell(self.ctx, self.fleet, decision.deletes)  # before the delete: a rescan tells the same id again
        self.delete(decision.deletes)
        self.db.collection(JANITOR).document(self.fleet.name).update(
            {"orphan_first_seen": [{"name": n, "seen": s} for n, s in decision.first_seen.items()]})


@dataclass(frozen=True)
class DueRuns:
    """What a tick claimed for a fleet: the full sweep, the orphan scan; `doc`: janitor/{fleet} as read."""

    sweep: bool
    orphans: bool
    doc: dict
    claimed: dict = field(default_factory=dict)  # the fields this tick wrote to claim them

    @property
    def after(self) -> dict:
        """janitor/{fleet} as it reads after the claim."""
        return {**self.doc, **self.claimed}


# ------------------------------------------------------------------ handlers

AdapterFactory = Callable[[Context, FleetFile], DeleteAdapter]


def default_adapter(ctx: Context, fleet: FleetFile) -> DeleteAdapter:
    """The one place the Cloud TPU client is handed to the janitor (to the adapter, which checks ownership)."""
    return DeleteAdapter(ctx.clients.tpu, fleet)


@dataclass(frozen=True)
class JanitorState:
    """The janitor's per-instance state (`ctx.state`), made by build_service."""

    orphan_scan_seconds: float  # Settings.orphan_scan_seconds: at most one orphan scan per fleet this often
    sweep_every: timedelta = timedelta(minutes=5)  # Settings.backstop_every: the full sweep's cadence
    adapter_factory: AdapterFactory = default_adapter  # the simulator passes its in-process TPU API
    notifier: notify.Notifier | None = None  # /push/notifications: Secret Manager, the URL cache, the POST
    router: tickdue.RouterMemory = field(default_factory=tickdue.RouterMemory)  # the clock's tick to the others


def janitor_for(ctx: Context, fleet: FleetFile) -> Janitor:
    state: JanitorState = ctx.state
    return Janitor(ctx, fleet, state.adapter_factory(ctx, fleet))


def on_fleet_event(event: FleetEvent, ctx: Context) -> None:
    if not d.fleet_event_to_judge(event):
        return
    fleet = load_fleet(ctx.clients.firestore, event.fleet)
    janitor_for(ctx, fleet).settle_event(event)


def on_tick(tick: Tick, ctx: Context) -> None:
    """The clock's tick: first routed to the services whose tick has work (`tpuq.runtime.tickdue`: one query, one
    read when nothing is due), then the janitor's own when its `tick_due/janitor` is due (a TPU idle or deleting,
    a run on its cadence), on a nudge, or on this instance's first tick: per fleet, the runs due on their cadence,
    a drain asked for, and the quiet pass."""
    state: JanitorState = ctx.state
    db, now = ctx.clients.firestore, ctx.now()
    services, due = state.router.route(tick.nudge, lambda: tickdue.due_docs(db, now))
    for service in services:
        # Raised on failure: the tick's redelivery routes it again (a tick twice does nothing twice).
        ctx.publish(topology.tick_topic(service), tick)
    if due is not None and tickdue.JANITOR not in due:
        return
    # The guard of the due this tick writes: a TPU made idle meanwhile (its commit sets ALWAYS) wins over it.
    mine = due[tickdue.JANITOR] if due is not None else tickdue.ref(db, tickdue.JANITOR).get()
    fleet_dues: list = []
    fleets = Isolated("janitor tick", log)  # one fleet's trouble never stops the others' pass
    for snap in db.collection(store.FLEETS).stream():
        fleet_dues.append(tickdue.ALWAYS)  # this fleet's, unless its part below ends
        with fleets.part(f"fleet {snap.id}"):
            fleet_dues[-1] = _fleet_tick(ctx, state, fleet_of(snap), now)
    _record_due(db, mine, tickdue.earliest(*fleet_dues) or now + state.sweep_every)
    fleets.raise_if_any()


def _record_due(db, seen, at) -> None:
    """After a tick that read every fleet: its next tick's work is due `at` (`tick_due/janitor`), unless the
    document changed since `seen` (its snapshot before the fleets were read: a TPU made idle meanwhile wins)."""
    if (seen.to_dict() or {}).get(tickdue.DUE_AT) != at:
        guarded.commit_if_unchanged(db, guarded.WriteSet().update(seen, {tickdue.DUE_AT: at}))


def _fleet_tick(ctx: Context, state: "JanitorState", fleet: FleetFile, now) -> Any:
    """One fleet's part of the janitor's tick; when its next tick has work (`tickdue.ALWAYS`: the next one)."""
    janitor = janitor_for(ctx, fleet)
    control = load_control(ctx.clients.firestore, fleet.name)
    janitor.paused = control.paused
    runs = janitor.claim_due_runs(state.orphan_scan_seconds, state.sweep_every)
    if runs.sweep or control.drain_pending:
        tpus = janitor.tpu_docs(live_only=True)
        if control.drain_pending:
            janitor.drain(control, tpus)
            tpus = janitor.tpu_docs(live_only=True)
        janitor.sweep(tpus)
        janitor.reap_idle(tpus)
        waiting = any(t.state in tickdue.WAKE_JANITOR_STATES for t in tpus)
    else:
        waiting = janitor.quiet_pass()
    if runs.orphans:
        janitor.scan_orphans(runs.doc)
    if waiting or control.drain_pending:
        return tickdue.ALWAYS
    return tickdue.of_turn(cadence.runs_due_at(runs.after, now, state.sweep_every, state.orphan_scan_seconds))


def on_attempt_event(event: AttemptEvent, ctx: Context) -> None:
    if not d.attempt_end_to_judge(event):
        return
    snap = ctx.clients.firestore.collection(store.TPUS).document(short_node_name(event.node)).get()
    doc = snap.to_dict() if snap.exists else {}
    if not doc.get("fleet"):
        return  # not a TPU tpuq recorded: nothing of ours to judge
    fleet = load_fleet(ctx.clients.firestore, doc["fleet"])
    janitor = janitor_for(ctx, fleet)
    names = [n for n in (doc.get("queued_resource"), event.node) if n]
    # A preempted slice's queued resource is SUSPENDED: the janitor's own to delete, here and now.
    janitor.settle(janitor.read_all(names), {}, set())


def on_notification(notification: Notification, ctx: Context) -> None:
    """Deliver to each destination once (tpuq.janitor.notify); Retryable while one is to be tried again."""
    state: JanitorState = ctx.state
    notify.deliver(notification, ctx, state.notifier or notify.Notifier.from_settings(ctx.settings))


ROUTES = {
    "/push/fleet-events": on_fleet_event,
    "/push/ticks": on_tick,
    "/push/attempt-events": on_attempt_event,
    "/push/notifications": on_notification,
}


def build_service(settings: Settings, clients: Clients | None = None, *,
                  adapter_factory: AdapterFactory | None = None, notifier: notify.Notifier | None = None) -> Service:
    """`adapter_factory(ctx, fleet)`: the door to the Cloud TPU API (default: a DeleteAdapter on ctx.clients.tpu);
    `notifier`: how notifications are sent (default: from the settings, tpuq.janitor.notify)."""
    state = JanitorState(orphan_scan_seconds=settings.orphan_scan_seconds, sweep_every=settings.backstop_every,
                         adapter_factory=adapter_factory or default_adapter,
                         notifier=notifier or notify.Notifier.from_settings(settings))
    return Service(name="janitor", routes=ROUTES, settings=settings,
                   clients=clients if clients is not None else Clients(settings), state=state)
