"""The janitor on the in-memory store (tpuq_dev.inmemory: no emulator), the fake Cloud TPU API (an in-process
HTTP server, manual clock) and the janitor's own entry point through functions-framework's test client, with
real push envelopes. The contract suite (tests/contract) keeps the in-memory store honest against the emulator."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import functions_framework
import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from tpuq.contracts import store, topology
from tpuq.runtime import guarded
from tpuq.claimer.model import QrRecord, queued_resource_id
from tpuq.claimer.statestore import qr_to_doc
from tpuq.janitor.handlers import build_service
from tpuq.runtime.clients import Clients
from tpuq.runtime.entrypoints import source_file
from tpuq.runtime.settings import Settings
from tpuq_dev.inmemory import MemoryFirestore, MemoryPublisher
from tpuq_dev.capacitymodel.clock import ManualClock
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.server import FakeTpuServer
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import save_fleet
from tpuq.runtime.ownership import owner_labels
from tests.helpers import push_envelope, wait_until  # noqa: F401 - wait_until: re-exported for this package's tests

JANITOR = str(source_file("janitor"))  # the installed entry module the janitor's container runs

WIN_ZONE = "us-central2-b"  # capacity: requests turn ACTIVE
WAIT_ZONE = "us-east1-d"  # quota, but capacity never comes: WAITING_FOR_RESOURCES for ever
THIRD_ZONE = "us-west4-a"  # capacity: requests turn ACTIVE
ZONES = (WIN_ZONE, WAIT_ZONE, THIRD_ZONE)
SCENARIO = {
    "seed": 7,
    "zones": {
        WIN_ZONE: {"quota": {"v4": {"spot": 256}}},
        WAIT_ZONE: {"quota": {"v4": {"spot": 256}}, "stockouts": [{"start": 0, "effect": "wait"}]},
        THIRD_ZONE: {"quota": {"v4": {"spot": 256}}},
    },
    # deleting 0: a delete completes within its call, so the fake shows NOT_FOUND at once.
    "delays": {"accepted": 1, "waiting": 5, "provisioning": 600, "suspending": 30, "deleting": 0},
}
ACTIVE_AFTER = 1 + 5 + 600  # scenario seconds from create to ACTIVE in a zone with capacity


class NoStandIn:
    """A client these tests must not reach: using it fails the test instead of going to Google Cloud."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        raise AssertionError(f"the janitor used Clients.{self._name}.{attr}, which has no stand-in here")


def memory_clients(settings: Settings) -> Clients:
    """The in-memory Firestore and publisher, the TPU client of `settings` (the fake's endpoint); no storage."""
    return Clients(settings, firestore=MemoryFirestore(project=settings.project),
                   publisher=MemoryPublisher(settings.topic_path(t.name) for t in topology.TOPICS),
                   storage=NoStandIn("storage"))


def janitor_app(settings: Settings, clients: Clients):
    """The janitor's entry point (tpuq.janitor.main) through functions-framework, serving a janitor built on
    `settings` and `clients`."""
    app = functions_framework.create_app("handle", JANITOR, "http")
    entry = sys.modules[Path(JANITOR).stem]  # functions-framework registers a source under its file's stem
    assert Path(entry.__file__).resolve() == Path(JANITOR).resolve()
    entry.ENTRY.use(build_service(settings, clients))
    return app.test_client()


@pytest.fixture(scope="module")
def fake_tpu(tmp_path_factory):
    clock = ManualClock()
    with FakeTpuServer(SCENARIO, clock=clock, state_dir=tmp_path_factory.mktemp("faketpu-janitor"),
                       worker_hosts=False) as server:
        yield server


@dataclass
class Stack:
    """One test's world: its own project in the fake, its fleet in Firestore, the janitor app."""

    fleet: FleetFile
    db: object
    tpu: tpu_v2.TpuClient
    control: FakeTpuControl
    clock: ManualClock
    app: object
    foreign: list[str]

    # ---- time and the fake
    def advance(self, scenario_seconds: float) -> None:
        self.clock.advance(scenario_seconds)

    def state(self, name: str) -> str | None:
        try:
            if "/queuedResources/" in name:
                return self.tpu.get_queued_resource(name=name).state.state.name
            return self.tpu.get_node(name=name).state.name
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ == "NotFound":
                return None
            raise

    def deletes(self) -> list[dict]:
        """The witness: every DELETE the fake received for this test's project."""
        return [c for c in self.control.calls(method="DELETE") if f"/projects/{self.fleet.project}/" in c["path"]]

    def deleted_ids(self) -> list[str]:
        return [c["path"].split("?")[0].rsplit("/", 1)[-1] for c in self.deletes()]

    # ---- resources
    def create(self, qr_id: str, zone: str, labels: dict[str, str]) -> str:
        parent = f"projects/{self.fleet.project}/locations/{zone}"
        node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", labels=labels,
                           scheduling_config=tpu_v2.SchedulingConfig(spot=True))
        resource = tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
                parent=parent, node_id=qr_id, node=node)]),
            spot=tpu_v2.QueuedResource.Spot())
        self.tpu.create_queued_resource(request=tpu_v2.CreateQueuedResourceRequest(
            parent=parent, queued_resource_id=qr_id, queued_resource=resource))
        return f"{parent}/queuedResources/{qr_id}"

    def create_owned(self, request_id: str, zone: str, record: bool = True) -> str:
        """A racer as the claimer makes it: deterministic name, owner labels, and its Firestore record."""
        qr_id = queued_resource_id(self.fleet.owner_prefix, request_id, zone)
        name = self.create(qr_id, zone, owner_labels(self.fleet, request_id))
        if record:
            now = datetime.now(timezone.utc)
            qr = QrRecord(qr_id=qr_id, fleet=self.fleet.name, project=self.fleet.project, request_id=request_id,
                          entry_id="v4pool", zone=zone, type="v4-8", spot=True, generation=0, state="ACCEPTED",
                          created_at=now, updated_at=now)
            self.db.collection("queued_resources").document(qr_id).set(qr_to_doc(qr))
        return name

    def record_request(self, request_id: str, count: int = 1, status: str = "open") -> None:
        self.db.collection(store.REQUESTS).document(request_id).set(
            {"request_id": request_id, "fleet": self.fleet.name, "count": count, "status": status})

    def record_tpu(self, qr_name: str, state: str = "idle", idle_since: datetime | None = None) -> str:
        """The scheduler's tpus/{short node id} document for an ACTIVE queued resource."""
        qr_id = qr_name.rsplit("/", 1)[-1]
        zone = qr_name.split("/")[3]
        now = datetime.now(timezone.utc)
        self.write_tpu(qr_id, {
            "name": f"projects/{self.fleet.project}/locations/{zone}/nodes/{qr_id}", "short": qr_id,
            "fleet": self.fleet.name, "zone": zone, "type": "v4-8", "entry_id": "v4pool",
            "queued_resource": qr_name, "state": state, "job_id": "j1" if state == "busy" else None,
            "idle_since": idle_since or now, "created_at": now, "updated_at": now}, replace=True)
        return qr_id

    def write_tpu(self, tpu_id: str, fields: dict, replace: bool = False) -> None:
        """A write of tpus/{id} as the scheduler makes it: one commit of `tpuq.runtime.guarded`, which also tells
        the janitor's tick that it has work when the TPU is written idle or deleting (`tpuq.runtime.tickdue`)."""
        ref = self.db.collection(store.TPUS).document(tpu_id)
        doc = fields if replace else {**(ref.get().to_dict() or {}), **fields}
        assert guarded.commit_if_unchanged(self.db, guarded.WriteSet().replace(ref, doc))

    def tpu_doc(self, tpu_id: str) -> dict:
        return self.db.collection(store.TPUS).document(tpu_id).get().to_dict() or {}

    # ---- messages: every one is delivered twice (redelivery must change nothing)
    def post_twice(self, path: str, data: dict) -> None:
        body = push_envelope(data, f"m-{uuid.uuid4().hex[:10]}", "janitor")
        codes = [self.app.post(path, json=body).status_code for _ in range(2)]
        assert codes == [204, 204], codes

    def fleet_event(self, kind: str, qr_name: str, request_id: str | None = None) -> None:
        zone = qr_name.split("/")[3]
        qr_id = qr_name.rsplit("/", 1)[-1]
        self.post_twice("/push/fleet-events", {
            "kind": kind, "fleet": self.fleet.name, "queued_resource": qr_name, "request_id": request_id,
            "zone": zone, "type": "v4-8", "entry_id": "v4pool",
            "node": f"projects/{self.fleet.project}/locations/{zone}/nodes/{qr_id}",
            "at": datetime.now(timezone.utc).isoformat()})

    def tick(self) -> None:
        self.post_twice("/push/ticks", {"seq": 1})


def make_fleet(project: str, **overrides) -> FleetFile:
    entry = {"id": "v4pool", "type": "v4-8", "zones": list(ZONES), "count": 4, "keep_warm_count": 0}
    entry.update(overrides.pop("entry", {}))
    return FleetFile.model_validate({"name": "jf", "project": project, "owner_prefix": "tpuq",
                                     "claim": {"orphan_grace_seconds": 0}, "tpus": [entry], **overrides})


@pytest.fixture
def janitor_stack(request, fake_tpu):
    """Per test: a fresh project in the fake and a fresh in-memory store, the fleet (override with
    @pytest.mark.fleet(...)), foreign resources in every zone (checked untouched at the end), and the janitor
    app pointed at the fake."""
    marker = request.node.get_closest_marker("fleet")
    project = f"p-{uuid.uuid4().hex[:10]}"
    fleet = make_fleet(project, **(marker.kwargs if marker else {}))
    # backstop_seconds=0: the full sweep (the lost-event backstop, on a cadence in production) runs on every tick
    # here, where the tests are about its rules; tests/janitor/test_quiet_tick.py is about the cadence.
    settings = Settings(project=project, tpu_endpoint=fake_tpu.url, orphan_scan_seconds=3600, backstop_seconds=0)
    clients = memory_clients(settings)
    db = clients.firestore
    save_fleet(db, fleet, datetime.now(timezone.utc))
    tpu = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                           client_options=ClientOptions(api_endpoint=fake_tpu.url))
    app = janitor_app(settings, clients)
    s = Stack(fleet, db, tpu, FakeTpuControl(fake_tpu.url), fake_tpu.clock, app, [])
    for zone in ZONES:  # someone else's, in the same project and zones: no label / another prefix / copied label
        s.foreign.append(s.create(f"user-tpu-{zone}", zone, {}))
        s.foreign.append(s.create(f"tpuq-by-hand-{zone}", zone, {"team": "ml"}))
        s.foreign.append(s.create(f"other-r1-{zone}", zone, owner_labels(fleet, "r1")))
    yield s
    # Every janitor pass of every test: nothing foreign was ever deleted.
    foreign_ids = {n.rsplit("/", 1)[-1] for n in s.foreign}
    assert not foreign_ids & set(s.deleted_ids())
    for name in s.foreign:
        assert s.state(name) not in (None, "DELETING"), name


def pytest_configure(config):
    config.addinivalue_line("markers", "fleet(**fields): fleet file fields for the janitor_stack fixture")
