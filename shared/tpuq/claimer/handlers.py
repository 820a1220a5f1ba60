"""The claimer service: thin handlers that load state, call `decide`, and apply the effects.

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
from dataclasses import dataclass, field, replace
from typing import Callable

from tpuq.claimer import statestore
from tpuq.claimer.decide import decide
from tpuq.claimer.model import ClaimState, Effects, Event, Observed, QrRecord, RequestReceived
from tpuq.claimer.sshkeys import PublicKeyProvider, default_provider
from tpuq.claimer.tpuapi import TpuApi
from tpuq.documents import QueuedResourceState as Qr
from tpuq.errors import Retryable
from tpuq.fleet import FleetFile
from tpuq.fleetstore import load_fleet
from tpuq.messages import CapacityRequest, Tick
from tpuq.service import Context, Service

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
    writer: statestore.StateWriter = field(init=False)
    transient_failure: bool = False  # a create still failed after retries: ask Pub/Sub to redeliver

    def __post_init__(self) -> None:
        self.writer = statestore.StateWriter(self.ctx.clients.firestore)

    def load(self, *request_ids: str) -> ClaimState:
        return statestore.load_state(self.ctx.clients.firestore, self.fleet, tuple(request_ids))

    def step(self, state: ClaimState, event: Event) -> ClaimState:
        return self.apply(state, decide(state, event, self.ctx.now(), self.ctx.rng))

    def apply(self, state: ClaimState, effects: Effects) -> ClaimState:
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
        for create in effects.creates:
            if state.blocked:
                break  # a project-level refusal: not one more create anywhere
            state = self.create(state, create.qr, create.claim)
        return state

    def create(self, state: ClaimState, qr: QrRecord, claim: bool) -> ClaimState:
        if claim and not self.writer.claim_and_record(state, qr):
            log.info("zone %s/%s was claimed by another handler meanwhile; %s not created", qr.zone, qr.type, qr.qr_id)
            return state
        state = replace(state, qrs={**state.qrs, qr.qr_id: qr})
        outcome = self.tpu.create(qr, self.fleet, self.public_key(self.fleet))
        if outcome.kind == "unknown":
            self.transient_failure = True  # recorded as REQUESTED: a redelivery or the next watch finishes it
            return state
        return self.step(state, Observed({qr.qr_id: outcome}, plan=False))

    def watch(self, state: ClaimState, qrs: list[QrRecord] | None = None) -> ClaimState:
        """One watch pass: exact GETs of the given (default: all live) queued resources, then decide."""
        targets = list(state.qrs.values()) if qrs is None else qrs
        return self.step(state, Observed(self.tpu.observe_all(targets), plan=True))


def _tpu(ctx: Context) -> TpuApi:
    return TpuApi(ctx.clients.tpu)


def make_handlers(public_key: PublicKeyProvider | None = None, sleep: Callable[[float], None] = time.sleep,
                  tpu_factory: Callable[[Context], TpuApi] = _tpu):
    provider = public_key or default_provider()

    def on_capacity(request: CapacityRequest, ctx: Context) -> None:
        fleet = load_fleet(ctx.clients.firestore, request.fleet)
        claimer = Claimer(ctx, fleet, tpu_factory(ctx), provider, sleep)
        state = claimer.step(claimer.load(request.request_id), RequestReceived(request))
        pause = fleet.claim.watch_interval_seconds / FAST_WATCH_PASSES
        for _ in range(FAST_WATCH_PASSES):
            mine = [q for q in state.qrs.values() if q.request_id == request.request_id and q.state != Qr.ACTIVE]
            if not mine:
                break
            claimer.sleep(pause)
            state = claimer.watch(state, mine)
        if claimer.transient_failure:
            raise Retryable(f"capacity request {request.request_id}: the TPU API kept failing; redeliver")

    def on_tick(tick: Tick, ctx: Context) -> None:
        failures = []
        for fleet in statestore.load_fleets(ctx.clients.firestore):
            try:
                claimer = Claimer(ctx, fleet, tpu_factory(ctx), provider, sleep)
                claimer.watch(claimer.load())
            except Exception as e:  # noqa: BLE001 - one fleet's trouble must not stop the watch of the others
                log.exception("tick: watching fleet %s failed", fleet.name)
                failures.append(f"{fleet.name}: {e}")
        if failures:
            raise Retryable("; ".join(failures))

    return {"/push/capacity": on_capacity, "/push/ticks": on_tick}


def build_service(**kwargs) -> Service:
    return Service(name="claimer", handlers=make_handlers(**kwargs))
