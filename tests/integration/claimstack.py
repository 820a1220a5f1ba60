"""The claim path as a stack: the claimer and the janitor, one Firestore, one fake Cloud TPU on a manual clock.

Both services run their real `Service` (push envelopes in, the adapter's routing, dead-lettering) behind a
Flask test client each, on the Firestore the caller gives (the session stack's emulator in the tests, the
in-memory stand-in in the benchmark). What the claimer publishes on `fleet-events` is delivered to the janitor,
every push twice (Pub/Sub delivers at least once). Time is the fake's: the claimer's clock reads the same
manual clock (so back-offs run in scenario time) and its fast-watch pauses advance it. The fake's call log is
the witness of what reached the Cloud TPU API.

No scheduler runs: a test stands in for it (capacity requests, withdraws, the TPU documents it would write)
through `on_event`, called with each fleet event before the janitor gets it.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any, Callable

import flask

from tests.helpers import push_envelope
from tpuq.contracts import store
from tpuq.runtime.auth import PushAuth
from tpuq.claimer import handlers as claimer_handlers
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq_dev.capacitymodel.clock import ManualClock
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.server import FakeTpuServer
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import save_fleet
from tpuq_dev.inmemory import MemoryPublisher
from tpuq.janitor import handlers as janitor_handlers
from tpuq.contracts.messages import CapacityAction, CapacityRequest, FleetEvent, Tick
from tpuq.runtime.service import Service

PROJECT = "tpuq-claimstack"
TEST_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtpuqclaimertestkeyonlyforthetests0000 test"


def _app(service: Service):
    app = flask.Flask(service.name)
    app.add_url_rule("/<path:path>", view_func=lambda path: service.dispatch(flask.request), methods=["POST"])
    return app.test_client()


class ClaimStack:
    def __init__(self, db, scenario: dict, fleet_data: dict, state_dir: Path, seed: int = 1,
                 janitor_first: bool = True):
        """`janitor_first`: on a tick the janitor handles it before the claimer (Pub/Sub promises no order;
        this is the order that used to lose a FAILED queued resource's failure)."""
        self.clock = ManualClock()
        self.fake = FakeTpuServer(scenario, clock=self.clock, state_dir=state_dir, worker_hosts=False)
        self.fake.start()
        self.control = FakeTpuControl(self.fake.url)
        # The fake answers Cloud Quotas and Cloud Billing too, from the same scenario: the claimer's pre-checks
        # read it, never Google.
        self.publisher = MemoryPublisher()
        # The janitor's orphan scan never runs by itself here (tests call it).
        settings = Settings(project=PROJECT, tpu_endpoint=self.fake.url, quotas_endpoint=self.fake.google_apis_url,
                            billing_endpoint=self.fake.google_apis_url, orphan_scan_seconds=10 ** 9,
                            backstop_seconds=0)  # the janitor's full sweep on every tick: these tests are its rules
        self.clients = Clients(settings, firestore=db, publisher=self.publisher)
        self.db = db
        self.fleet = FleetFile.model_validate(fleet_data)
        save_fleet(db, self.fleet, self.now())
        self.janitor_first = janitor_first
        self.events: list[FleetEvent] = []
        self.on_event: Callable[[FleetEvent], None] | None = None
        self._ids = itertools.count(1)
        claimer = claimer_handlers.build_service(settings, self.clients, public_key=lambda fleet: TEST_PUBLIC_KEY,
                                                 sleep=self.clock.advance)
        janitor = janitor_handlers.build_service(settings, self.clients)
        for service in (claimer, janitor):
            service.now = self.now
            service.rng = random.Random(seed)
            service.push_auth = PushAuth.from_env({})
        self.claimer, self.janitor = _app(claimer), _app(janitor)

    def close(self) -> None:
        self.fake.stop()

    # ---- time
    def now(self):
        return self.clock.wall(self.clock.now())

    @property
    def scenario_time(self) -> float:
        return self.clock.now()

    # ---- messages
    def post_twice(self, app, path: str, subscription: str, data: bytes | dict | Any) -> None:
        body = push_envelope(data, f"m-{next(self._ids)}", subscription)
        codes = [app.post(path, json=body).status_code for _ in range(2)]
        assert codes == [204, 204], (path, codes)

    def request(self, request_id: str, types: tuple[str, ...] = ("v4-32",), count: int = 1,
                action: CapacityAction = CapacityAction.request, job_ids: tuple[str, ...] = (),
                route: bool = True) -> None:
        """A capacity request (or withdraw) as the scheduler sends it. `route=False` from inside `on_event`:
        what it publishes is routed by the `route` already running."""
        message = CapacityRequest(request_id=request_id, fleet=self.fleet.name, types=list(types), count=count,
                                  action=action, job_ids=list(job_ids or (request_id,)), at=self.now())
        self.post_twice(self.claimer, "/push/capacity", "claimer-capacity", message)
        if route:
            self.route()

    def withdraw(self, request_id: str, types: tuple[str, ...] = ("v4-32",)) -> None:
        self.request(request_id, types, action=CapacityAction.withdraw)

    def tick(self, advance: float = 0.0) -> None:
        """Move scenario time on, then one tick to both services; fleet events are routed after each."""
        self.clock.advance(advance)
        tick = Tick(seq=next(self._ids))
        order = (self.janitor, self.claimer) if self.janitor_first else (self.claimer, self.janitor)
        for app in order:
            self.post_twice(app, "/push/ticks", "claimer-ticks" if app is self.claimer else "janitor-ticks", tick)
            self.route()

    def route(self) -> None:
        """Deliver what the claimer published on fleet-events: to `on_event` (the scheduler's stand-in), then
        to the janitor, in publish order."""
        while True:
            messages = self.publisher.take(self.clients.settings.topic_path("fleet-events"))
            if not messages:
                return
            for m in messages:
                event = FleetEvent.model_validate_json(m.data)
                self.events.append(event)
                if self.on_event is not None:
                    self.on_event(event)
                self.post_twice(self.janitor, "/push/fleet-events", "janitor-fleet-events", m.data)

    # ---- the scheduler's documents, when a test plays the scheduler
    def record_tpu(self, event: FleetEvent, state: str, job_id: str | None = None) -> None:
        qr_id = event.queued_resource.rsplit("/", 1)[-1]
        self.db.collection(store.TPUS).document(qr_id).set({
            "name": event.node, "fleet": event.fleet, "zone": event.zone, "type": event.type,
            "entry_id": event.entry_id, "queued_resource": event.queued_resource, "request_id": event.request_id,
            "state": state, "job_id": job_id, "idle_since": self.now(), "created_at": self.now(),
            "updated_at": self.now()})

    def record_job(self, job_id: str, state: str) -> None:
        self.db.collection(store.JOBS).document(job_id).set({"id": job_id, "state": state})

    # ---- witnesses: the fake's call log and state
    def calls(self, method: str, zone: str | None = None) -> list[dict]:
        return [c for c in self.control.calls(method=method, path_contains="/queuedResources")
                if not c["path"].split("?")[0].endswith(":reset")
                and (zone is None or f"/locations/{zone}/" in c["path"])]

    def creates(self, zone: str | None = None) -> list[dict]:
        return self.calls("POST", zone)

    def created_ids(self, zone: str | None = None) -> list[str]:
        return [c["args"]["queuedResourceId"] for c in self.creates(zone)]

    def deleted_ids(self, zone: str | None = None) -> list[str]:
        return [c["path"].split("?")[0].rsplit("/", 1)[-1] for c in self.calls("DELETE", zone)]

    def state(self, qr_id: str, zone: str) -> str | None:
        name = f"projects/{PROJECT}/locations/{zone}/queuedResources/{qr_id}"
        qr = self.fake.world.queued_resources.get(name)
        return qr.state.name if qr is not None else None

    def qr_doc(self, qr_id: str) -> dict:
        snap = self.db.collection(store.QUEUED_RESOURCES).document(qr_id).get()
        return snap.to_dict() if snap.exists else {}
