"""The claimer service: shell (Firestore, the Cloud TPU API, Pub/Sub). Load state, call `decide`, apply.

Watch schedule. Ticks (Cloud Scheduler; the local tick source) drive a watch
pass over every live queued resource of every fleet; a tick reads the rest of
the claim state only when there is an open request or a GET says something new
(`quiet`). Pub/Sub has no delayed
delivery, so right after a capacity request's creates the handler itself
re-reads that request's queued resources `FAST_WATCH_PASSES` times, spread
over the fleet's `claim.watch_interval_seconds`: quota, billing and capacity
refusals surface within seconds of ACCEPTED and are acted on at once, while
the minutes-long wait for ACTIVE is left to ticks (no handler sits idle).

Every handler is idempotent: names are deterministic, creates carry a
requestId, state changes are published once (the last seen state is stored)
and a redelivered message finds its work done.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Callable

from tpuq.capacity import existing

from tpuq.contracts import store
from tpuq.capacity.cloudchecks import PrecheckCache, cache_from_settings
from tpuq.claimer import idlemark, notices, statestore
from tpuq.claimer.decide import decide_observed, decide_request_received, fast_watch_targets
from tpuq.claimer.model import ClaimState, CreateQr, Effects, Observed, QrRecord, RequestReceived
from tpuq.claimer.quiet import tick_needs_full_state
from tpuq.claimer.sshkeys import PublicKeyProvider, default_provider, ssh_keys_metadata
from tpuq.claimer.tpuapi import NodeJsonReader, TpuApi
from tpuq.contracts.documents import RequestRecord
from tpuq.contracts.errors import Retryable
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.cadence import TickMemory
from tpuq.runtime.clients import Clients
from tpuq.runtime.fleetstore import fleet_of, load_fleet
from tpuq.runtime.isolation import Isolated
from tpuq.contracts.messages import CapacityRequest, Tick
from tpuq.runtime.service import Context, Service
from tpuq.runtime.settings import DEFAULT_BACKSTOP_SECONDS, Settings

log = logging.getLogger("tpuq.claimer")

FAST_WATCH_PASSES = 3
# A create whose zone slot another handler took between this one's read and its write (`claim_and_record`: N jobs
# submitted together are N capacity requests handled at once) is planned again at once, on what that handler wrote,
# rather than at the next tick (a minute in production): up to this many times, each after a pause of up to
# CLAIM_RETRY_JITTER_SECONDS so that the handlers retrying together do not meet again.
CLAIM_RETRIES = 8
CLAIM_RETRY_JITTER_SECONDS = 0.05


@dataclass
class Claimer:
    """The imperative shell for one fleet and one message."""

    ctx: Context
    fleet: FleetFile
    tpu: TpuApi
    public_key: PublicKeyProvider
    sleep: Callable[[float], None] = time.sleep
    prechecks: PrecheckCache | None = None  # quota and billing, read before deciding (None: declared quota only)
    writer: statestore.StateWriter = field(init=False)
    transient_failure: bool = False  # a create still failed after retries: ask Pub/Sub to redeliver
    lost_claims: int = 0  # creates not sent: another handler took the zone slot meanwhile (`CLAIM_RETRIES`)
    # fleet -> what a tick last found here (`ClaimerState.ticks_checked`; `idlemark`)
    ticks_checked: dict[str, idlemark.TickCheck] = field(default_factory=dict)
    told: set[str] = field(default_factory=set)  # notifications this instance published (`notices.tell`)
    views: statestore.FleetViews | None = None  # the instance's views of the fleet's targets and live resources
    quiet_until: datetime | None = None  # after `tick`: until when the fleet's tick may stop at its mark

    def __post_init__(self) -> None:
        self.writer = statestore.StateWriter(self.ctx.clients.firestore)

    def load(self, *request_ids: str, open_requests: dict[str, RequestRecord] | None = None) -> ClaimState:
        state = statestore.load_state(self.ctx.clients.firestore, self.fleet, tuple(request_ids), self.ctx.now(),
                                      open_requests, self.views)
        notices.after_load(self.ctx, self.fleet, state.status, state.day_use, self.told)
        if self.prechecks is None:
            return state
        checks = self.prechecks.get(self.fleet, self.ctx.now(), fresh=state.blocked)
        for line in checks.problems:
            log.warning("fleet %s pre-check: %s", self.fleet.name, line)
        return replace(state, prechecks=checks)

    def step(self, state: ClaimState, effects: Effects) -> ClaimState:
        """apply → create → decide, until nothing is left to do. A create's answer from the API is the next event
        (an `Observed`, decided by `decide_observed`).

        Creates run one at a time, each decided on before the next is sent: a project-level refusal
        stops the rest, and a zone refused for quota is not asked again in the same message.
        """
        try:
            return self._step(state, effects)
        finally:
            self.mark_opened()

    def mark_opened(self) -> None:
        """After writing an open request or a new queued resource: the fleet's tick mark says busy (`idlemark`)."""
        if self.writer.opened:
            idlemark.mark_busy(self.ctx.clients.firestore, self.fleet.name, self.ctx.now())
            self.writer.opened = False

    def _step(self, state: ClaimState, effects: Effects) -> ClaimState:
        creates: deque[CreateQr] = deque()
        while effects is not None:
            state = self.apply(state, effects)
            creates.extendleft(reversed(effects.creates))  # a create's follow-ups go before its siblings
            effects = None
            while creates and effects is None:
                if state.blocked:
                    return state  # a project-level refusal: not one more create anywhere
                state, answer = self.create(state, creates.popleft())
                if answer is not None:
                    effects = decide_observed(state, answer, self.ctx.now(), self.ctx.rng)
        return state

    def on_request(self, state: ClaimState, request: CapacityRequest) -> ClaimState:
        return self.step(state, decide_request_received(state, RequestReceived(request), self.ctx.now(),
                                                        self.ctx.rng))

    def apply(self, state: ClaimState, effects: Effects) -> ClaimState:
        """Every effect but the creates, which `step` sends one by one."""
        # Publish before recording: a crash in between republishes (at least once), never loses an event.
        for event in effects.events:
            self.ctx.publish("fleet-events", event, fleet=event.fleet, kind=event.kind.value)
        for qr in effects.qrs.values():
            self.writer.put_qr(qr)
        for request in effects.requests.values():
            self.writer.put_request(request)
        if effects.status is not None:
            self.writer.put_status(effects.status)
            notices.tell(self.ctx, notices.blocked_notice(self.fleet, effects.status, self.ctx.now()), self.told)
        for target in effects.targets.values():
            self.writer.put_target(target)
        state = effects.applied(state)
        for delete in effects.deletes:
            outcome = self.tpu.delete(delete.qr, self.fleet, delete.force, delete.resource)
            log.info("delete %s (%s, force=%s): %s", delete.qr.name, delete.reason, delete.force, outcome)
        return state

    def create(self, state: ClaimState, create: CreateQr) -> tuple[ClaimState, Observed | None]:
        """Send one create; returns the state and the API's answer as an event (None: nothing to decide)."""
        qr = create.qr
        if create.claim and not self.writer.claim_and_record(state, qr):
            log.info("zone %s/%s was claimed by another handler meanwhile; %s not created", qr.zone, qr.type, qr.qr_id)
            self.lost_claims += 1
            return state, None
        state = replace(state, qrs={**state.qrs, qr.qr_id: qr})
        outcome = self.tpu.create(qr, self.fleet, self.public_key(self.fleet))
        if outcome.kind == "unknown":
            self.transient_failure = True  # recorded as REQUESTED: a redelivery or the next watch finishes it
            return state, None
        return state, Observed({qr.qr_id: outcome}, plan=False)

    def existing(self) -> None:
        """Read every `existing:` node (getNode); register the usable ones (an ACTIVE event, as for a claimed
        slice), and record each one's status for `tpuq fleet` and the waiting jobs. Never writes to the node."""
        entries = [e for e in self.fleet.tpus if e.existing]
        if not entries:
            return
        now = self.ctx.now()
        key_line = ssh_keys_metadata(self.fleet.ssh_user, self.public_key(self.fleet))
        for entry in entries:
            read = self.tpu.read_node(existing.node_name(self.fleet, entry))
            event, status = existing.decide_existing(self.fleet, entry, read, key_line, now)
            if event is not None:
                self.ctx.publish("fleet-events", event, fleet=event.fleet, kind=event.kind.value)
            if status.problem:
                log.warning("%s; fix: %s", status.problem, status.fix)
            self.writer.put_existing(self.fleet.name, status, now)

    def tick(self, force: bool = False) -> None:
        """A tick's watch pass, reading first only what can need acting on: a fleet marked idle, nothing
        (`idlemark`: its mark alone, the queries again on the backstop cadence; the mark is not read while this
        instance's last tick found the fleet busy, `ticks_checked`); an open request is
        planned on the whole state, as before (its query not read twice); with none, only the live queued
        resources are read and GET, and the rest of the state is loaded only if a GET says something new (`quiet`:
        the pass then runs as before, its GETs made again after the load: never decided on answers older than it).
        An idle fleet costs its mark (two empty queries and a write when it turns idle or the backstop is due).
        `force` (a nudge: a person changed the fleet or its brakes): the queries and the watch pass run now."""
        db, now, name = self.ctx.clients.firestore, self.ctx.now(), self.fleet.name
        every = self.ctx.settings.backstop_every
        last, mark = self.ticks_checked.get(name), None
        self.quiet_until = None
        if force and self.views is not None:
            self.views.forget()  # a person changed something: read every target and live queued resource again
        if idlemark.read_mark_first(last) and not force:
            mark = idlemark.read_mark(db, name)
            if idlemark.tick_may_stop(mark.to_dict(), now, every):
                self.quiet_until = idlemark.quiet_until(mark.to_dict(), now, every)
                return
        requests, qrs = self._watched()
        if not requests and not qrs and mark is None:
            # Turned idle since the last tick here: mark it, guarded on the mark as read before queries that agree.
            mark = idlemark.read_mark(db, name)
            requests, qrs = self._watched()
        self.ticks_checked[name] = idlemark.TickCheck(idle=not requests and not qrs)
        if not requests:
            if not qrs:
                if idlemark.mark_idle(db, mark, now, every, watch_always=any(e.existing for e in self.fleet.tpus)):
                    self.quiet_until = idlemark.quiet_until(idlemark.idle_mark(now), now, every)
                return
            live = ClaimState(fleet=self.fleet, qrs=qrs)
            if not force and not tick_needs_full_state(live, self.tpu.observe_all(qrs.values()), now):
                return
        self.watch(self.load(open_requests=requests))

    def _watched(self) -> tuple[dict[str, RequestRecord], dict[str, QrRecord]]:
        """The fleet's open requests; with none, its live queued resources (else not read: `load` reads them)."""
        db = self.ctx.clients.firestore
        requests = statestore.load_open_requests(db, self.fleet)
        return requests, ({} if requests else statestore.load_live_qrs(db, self.fleet, self.views, self.ctx.now()))

    def watch(self, state: ClaimState, qrs: list[QrRecord] | None = None) -> ClaimState:
        """One watch pass: exact GETs of the given (default: all live) queued resources, then decide."""
        targets = list(state.qrs.values()) if qrs is None else qrs
        observed = Observed(self.tpu.observe_all(targets), plan=True)
        return self.step(state, decide_observed(state, observed, self.ctx.now(), self.ctx.rng))


def real_tpu(ctx: Context) -> TpuApi:
    """The Cloud TPU API of the service's clients; nodes read as JSON through the instance's one reader (one
    HTTP session per service instance); the created nodes run as the settings' worker service account."""
    return TpuApi(ctx.clients.tpu, node_json=ctx.state.node_reader,
                  worker_service_account=ctx.settings.worker_service_account)


@dataclass
class ClaimerState:
    """What one claimer instance keeps between messages (`ctx.state`): made by `build_service`, never global."""

    public_key: PublicKeyProvider
    sleep: Callable[[float], None]
    tpu_factory: Callable[[Context], TpuApi]
    node_reader: NodeJsonReader | None  # the one session `real_tpu` reads nodes with (None: a tpu_factory of its own)
    prechecks_factory: Callable[[Context], PrecheckCache | None]
    _prechecks: list[PrecheckCache | None] = field(default_factory=list, repr=False)  # [] until the first message
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    ticks_checked: dict[str, idlemark.TickCheck] = field(default_factory=dict)  # fleet -> a tick's last finding here
    told: set[str] = field(default_factory=set)  # notifications this instance published (`notices.tell`)
    backstop_every: timedelta = timedelta(seconds=DEFAULT_BACKSTOP_SECONDS)  # the views' whole reads (Settings')
    views: dict[str, statestore.FleetViews] = field(default_factory=dict)  # fleet -> its targets and live resources
    remembered: TickMemory = field(default_factory=TickMemory)  # every fleet idle until (`idlemark`)

    def prechecks(self, ctx: Context) -> PrecheckCache | None:
        """The instance's one quota and billing cache (None: declared quota only), made on the first message."""
        if not self._prechecks:
            with self._lock:
                if not self._prechecks:
                    self._prechecks.append(self.prechecks_factory(ctx))
        return self._prechecks[0]

    def claimer(self, ctx: Context, fleet: FleetFile) -> Claimer:
        with self._lock:
            views = self.views.get(fleet.name)
            if views is None:
                views = self.views[fleet.name] = statestore.FleetViews.of(fleet.name, self.backstop_every)
        return Claimer(ctx, fleet, self.tpu_factory(ctx), self.public_key, self.sleep, self.prechecks(ctx),
                       ticks_checked=self.ticks_checked, told=self.told, views=views)


def _state(ctx: Context) -> ClaimerState:
    return ctx.state


def on_capacity(request: CapacityRequest, ctx: Context) -> None:
    fleet = load_fleet(ctx.clients.firestore, request.fleet or ctx.settings.fleet)
    claimer = _state(ctx).claimer(ctx, fleet)
    state = claimer.on_request(claimer.load(request.request_id), request)
    for _ in range(CLAIM_RETRIES):
        if not claimer.lost_claims:
            break
        # Planned again on a fresh read (the other handler's claim and queued resource included), as a tick plans.
        claimer.lost_claims = 0
        claimer.sleep(ctx.rng.uniform(0, CLAIM_RETRY_JITTER_SECONDS))
        state = claimer.watch(claimer.load(request.request_id))
    pause = fleet.claim.watch_interval_seconds / FAST_WATCH_PASSES
    for _ in range(FAST_WATCH_PASSES):
        mine = fast_watch_targets(state, request.request_id)
        if not mine:
            break
        claimer.sleep(pause)
        state = claimer.watch(state, mine)
    if claimer.transient_failure:
        raise Retryable(f"capacity request {request.request_id}: the TPU API kept failing; redeliver")


def on_tick(tick: Tick, ctx: Context) -> None:
    """Per fleet: the watch pass (`Claimer.tick`), the `existing:` nodes, the grant's notices. A quiet tick (every
    fleet remembered idle by this instance, no mark busy since, no nudge) stops at one query (`idlemark`)."""
    state, db = _state(ctx), ctx.clients.firestore
    if not tick.nudge and state.remembered.quiet_at(ctx.now()) and not idlemark.any_fleet_busy(db):
        return
    state.remembered.quiet_until = None  # until every fleet below says until when it is idle
    due: list[datetime | None] = []
    fleets = Isolated("claimer tick", log)  # one fleet's trouble never stops the watch of the others
    for snap in db.collection(store.FLEETS).stream():
        due.append(None)  # this fleet's, unless its part below ends
        with fleets.part(f"fleet {snap.id}"):
            claimer = state.claimer(ctx, fleet_of(snap))
            claimer.tick(force=tick.nudge)
            claimer.existing()
            notices.tell(ctx, notices.grant_notice(claimer.fleet, ctx.now()), claimer.told)
            if not any(entry.existing for entry in claimer.fleet.tpus):  # those nodes are read on every tick
                due[-1] = claimer.quiet_until
    state.remembered.remember(due)
    fleets.raise_if_any()


ROUTES = {"/push/capacity": on_capacity, "/push/ticks": on_tick}


def build_service(settings: Settings, clients: Clients | None = None, *, public_key: PublicKeyProvider | None = None,
                  sleep: Callable[[float], None] = time.sleep, tpu_factory: Callable[[Context], TpuApi] | None = None,
                  prechecks_factory: Callable[[Context], PrecheckCache | None] | None = None) -> Service:
    """One claimer instance. Defaults: the SSH public key from the settings' environment (`sshkeys`), the Cloud
    TPU API of `clients` (`real_tpu`), and one quota and billing cache made from the settings."""
    state = ClaimerState(
        public_key=public_key or default_provider(settings.env),
        sleep=sleep,
        tpu_factory=tpu_factory or real_tpu,
        node_reader=NodeJsonReader(settings.tpu_endpoint) if tpu_factory is None else None,  # connects on first read
        prechecks_factory=prechecks_factory or (lambda ctx: cache_from_settings(ctx.settings)),
        backstop_every=settings.backstop_every,
    )
    return Service(name="claimer", routes=ROUTES, settings=settings,
                   clients=clients if clients is not None else Clients(settings), state=state)
