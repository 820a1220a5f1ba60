"""The claimer service: shell (Firestore, the Cloud TPU API, Pub/Sub). Load state, call `decide`, apply.

Watch schedule. Ticks (Cloud Scheduler; the local tick source) drive a watch
pass over every live queued resource of every fleet. Pub/Sub has no delayed
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
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable

from tpuq.capacity import existing

from tpuq.contracts import store
from tpuq.capacity.cloudchecks import PrecheckCache, cache_from_settings
from tpuq.claimer import statestore
from tpuq.claimer.decide import decide, fast_watch_targets
from tpuq.claimer.model import ClaimState, CreateQr, Effects, Event, Observed, QrRecord, RequestReceived
from tpuq.claimer.sshkeys import PublicKeyProvider, default_provider, ssh_keys_metadata
from tpuq.claimer.tpuapi import NodeJsonReader, TpuApi
from tpuq.contracts.errors import Retryable
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import fleet_of, load_fleet
from tpuq.runtime.isolation import Isolated
from tpuq.contracts.messages import CapacityRequest, Tick
from tpuq.runtime.service import Context, Service

log = logging.getLogger("tpuq.claimer")

FAST_WATCH_PASSES = 3


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

    def __post_init__(self) -> None:
        self.writer = statestore.StateWriter(self.ctx.clients.firestore)

    def load(self, *request_ids: str) -> ClaimState:
        state = statestore.load_state(self.ctx.clients.firestore, self.fleet, tuple(request_ids), self.ctx.now())
        if self.prechecks is None:
            return state
        checks = self.prechecks.get(self.fleet, self.ctx.now(), fresh=state.blocked)
        for line in checks.problems:
            log.warning("fleet %s pre-check: %s", self.fleet.name, line)
        return replace(state, prechecks=checks)

    def step(self, state: ClaimState, event: Event) -> ClaimState:
        """decide → apply, until nothing is left to do. A create's answer from the API is the next event.

        Creates run one at a time, each decided on before the next is sent: a project-level refusal
        stops the rest, and a zone refused for quota is not asked again in the same message.
        """
        creates: deque[CreateQr] = deque()
        while event is not None:
            effects = decide(state, event, self.ctx.now(), self.ctx.rng)
            state = self.apply(state, effects)
            creates.extendleft(reversed(effects.creates))  # a create's follow-ups go before its siblings
            event = None
            while creates and event is None:
                if state.blocked:
                    return state  # a project-level refusal: not one more create anywhere
                state, event = self.create(state, creates.popleft())
        return state

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

    def watch(self, state: ClaimState, qrs: list[QrRecord] | None = None) -> ClaimState:
        """One watch pass: exact GETs of the given (default: all live) queued resources, then decide."""
        targets = list(state.qrs.values()) if qrs is None else qrs
        return self.step(state, Observed(self.tpu.observe_all(targets), plan=True))


_NODE_READERS: dict[int, NodeJsonReader] = {}  # one HTTP session per Clients, made on the first read


def _tpu(ctx: Context) -> TpuApi:
    settings = getattr(ctx.clients, "settings", None)
    reader = None
    if settings is not None:
        reader = _NODE_READERS.get(id(ctx.clients))
        if reader is None:
            reader = _NODE_READERS[id(ctx.clients)] = NodeJsonReader(settings.tpu_endpoint)
    return TpuApi(ctx.clients.tpu, node_json=reader)


def make_handlers(public_key: PublicKeyProvider | None = None, sleep: Callable[[float], None] = time.sleep,
                  tpu_factory: Callable[[Context], TpuApi] = _tpu,
                  prechecks_factory: Callable[[Context], PrecheckCache | None] | None = None):
    provider = public_key or default_provider()
    caches: dict[int, PrecheckCache | None] = {}  # one TTL cache per Clients, made on the first message

    def prechecks(ctx: Context) -> PrecheckCache | None:
        key = id(ctx.clients)
        if key not in caches:
            settings = getattr(ctx.clients, "settings", None)  # in-memory test clients have none: nothing to read
            caches[key] = (prechecks_factory(ctx) if prechecks_factory
                           else cache_from_settings(settings) if settings is not None else None)
        return caches[key]

    def on_capacity(request: CapacityRequest, ctx: Context) -> None:
        fleet = load_fleet(ctx.clients.firestore, request.fleet)
        claimer = Claimer(ctx, fleet, tpu_factory(ctx), provider, sleep, prechecks(ctx))
        state = claimer.step(claimer.load(request.request_id), RequestReceived(request))
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
        fleets = Isolated("claimer tick", log)  # one fleet's trouble never stops the watch of the others
        for snap in ctx.clients.firestore.collection(store.FLEETS).stream():
            with fleets.part(f"fleet {snap.id}"):
                fleet = fleet_of(snap)
                claimer = Claimer(ctx, fleet, tpu_factory(ctx), provider, sleep, prechecks(ctx))
                claimer.watch(claimer.load())
                claimer.existing()
        fleets.raise_if_any()

    return {"/push/capacity": on_capacity, "/push/ticks": on_tick}


def build_service(**kwargs) -> Service:
    return Service(name="claimer", handlers=make_handlers(**kwargs))
