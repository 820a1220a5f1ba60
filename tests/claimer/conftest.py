"""Claimer handler tests: the real handler app, the in-memory Firestore and Pub/Sub (`tpuq_dev.inmemory`), and the
fake Cloud TPU API (an in-process HTTP server, with its Cloud Quotas and Cloud Billing stand-ins).

The handler is driven through functions-framework's test client with real push envelopes; the fake TPU's call log
is the witness of what reached the API, the in-memory publisher of what was published. No emulator: the contract
suite (tests/contract) keeps the in-memory store honest against the emulators.
"""

from __future__ import annotations

import base64
import json
import sys
import uuid
from pathlib import Path

import functions_framework
import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from tpuq.claimer.handlers import build_service
from tpuq.claimer.sshkeys import ENV_PUBLIC_KEY
from tpuq.contracts import store, topology
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.messages import FleetEvent
from tpuq.runtime.clients import Clients
from tpuq.runtime.entrypoints import source_file
from tpuq.runtime.fleetstore import save_fleet
from tpuq.runtime.service import utcnow
from tpuq.runtime.settings import Settings
from tpuq_dev.devstack.stack import wait_for
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.server import FakeTpuServer
from tpuq_dev.inmemory import MemoryFirestore, MemoryPublisher

TEST_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtpuqclaimertestkeyonlyforthetests0000 test"
CLAIMER_SOURCE = str(source_file("claimer"))
PROJECT = "tpuq-local"


class NoStandIn:
    """A client these tests must not reach: using it fails the test instead of going to Google Cloud."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        raise AssertionError(f"the claimer used Clients.{self._name}.{attr}, which has no stand-in here")


def claimer_settings(fake: FakeTpuServer, **fields) -> Settings:
    """The claimer's settings against the fake: its TPU API, Cloud Quotas and Cloud Billing stand-ins (the quota and
    billing pre-checks read them), and the executor's public key as `tpuq dev up` gives it (sshkeys)."""
    env = {ENV_PUBLIC_KEY: TEST_PUBLIC_KEY}
    return Settings(project=PROJECT, tpu_endpoint=fake.url, quotas_endpoint=fake.google_apis_url,
                    billing_endpoint=fake.google_apis_url, env=env, **fields)


def memory_clients(settings: Settings) -> tuple[Clients, MemoryPublisher]:
    """In-memory Firestore and publisher; the TPU client is the real one (made from the settings: the fake)."""
    publisher = MemoryPublisher(settings.topic_path(t.name) for t in topology.TOPICS)
    clients = Clients(settings, firestore=MemoryFirestore(project=settings.project), publisher=publisher,
                      storage=NoStandIn("storage"), subscriber=NoStandIn("subscriber"))
    return clients, publisher


def claimer_app(clients: Clients):
    """The claimer's entry point (tpuq.claimer.main) through functions-framework, serving a claimer built on
    `clients` (its settings are the clients')."""
    app = functions_framework.create_app(target="handle", source=CLAIMER_SOURCE, signature_type="http")
    entry = sys.modules[Path(CLAIMER_SOURCE).stem]  # functions-framework registers a source under its file's stem
    assert Path(entry.__file__).resolve() == Path(CLAIMER_SOURCE).resolve()
    entry.ENTRY.use(build_service(clients.settings, clients))
    return app.test_client()


class ClaimerHarness:
    def __init__(self, clients: Clients, publisher: MemoryPublisher, app_client, fake: FakeTpuServer, monkeypatch):
        self.clients = clients
        self.publisher = publisher
        self.app = app_client
        self.fake = fake
        self.control = FakeTpuControl(fake.url)
        self.project = clients.settings.project
        self.monkeypatch = monkeypatch
        self.events: list[FleetEvent] = []

    # ---- driving
    def fleet(self, data: dict) -> FleetFile:
        fleet = FleetFile.model_validate(data)
        save_fleet(self.clients.firestore, fleet, utcnow())
        return fleet

    def push(self, path: str, message: BaseModel, message_id: str | None = None, expect=(200, 204)) -> str:
        message_id = message_id or uuid.uuid4().hex
        data = base64.b64encode(message.model_dump_json(exclude_none=True).encode()).decode()
        body = {"message": {"data": data, "messageId": message_id, "attributes": {}},
                "subscription": f"projects/{self.project}/subscriptions/claimer{path.replace('/push/', '-')}"}
        response = self.app.post(path, json=body)
        assert response.status_code in expect, response.get_data(as_text=True)
        return message_id

    def tpuq(self, *args: str):
        """A `tpuq` command as a person runs it, in this process and on these clients (the in-memory store; the
        fake's Cloud Quotas and Billing through the settings). Returns click's Result: exit_code, stdout."""
        from tpuq.cli import connecting, fleet
        from tpuq.cli.app import app

        self.monkeypatch.setattr(connecting, "CURRENT", None)  # restored after: the CLI may set it
        self.monkeypatch.setattr(fleet, "cli_clients", lambda: self.clients)
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"}, catch_exceptions=False)

    # ---- witnesses
    def creates(self, zone: str | None = None) -> list[dict]:
        return [c for c in self.control.calls(method="POST", path_contains="/queuedResources")
                if not c["path"].endswith(":reset") and (zone is None or f"/locations/{zone}/" in c["path"])]

    def deletes(self, zone: str | None = None) -> list[dict]:
        return [c for c in self.control.calls(method="DELETE")
                if zone is None or f"/locations/{zone}/" in c["path"]]

    def pull_events(self) -> list[FleetEvent]:
        """Every fleet event the claimer has published so far (the in-memory publisher's record)."""
        taken = self.publisher.take(self.clients.settings.topic_path("fleet-events"))
        self.events += [FleetEvent.model_validate(json.loads(m.data)) for m in taken]
        return self.events

    def wait_event(self, predicate, what: str) -> FleetEvent:
        return wait_for(lambda: next((e for e in self.pull_events() if predicate(e)), None), what=what)

    def qr_docs(self) -> list[dict]:
        return [s.to_dict() for s in self.clients.firestore.collection("queued_resources").stream()]

    def fake_state(self, qr_name: str) -> str | None:
        return self.fake.world.queued_resources[qr_name].state.name if qr_name in self.fake.world.queued_resources \
            else None


@pytest.fixture
def claimer(monkeypatch, tmp_path):
    """Start a fake TPU for `scenario` and return a harness bound to a fresh claimer app on fresh in-memory clients."""
    servers: list[FakeTpuServer] = []

    def start(scenario: dict, time_scale: float = 600.0, **settings) -> ClaimerHarness:
        fake = FakeTpuServer(scenario, time_scale=time_scale, state_dir=tmp_path / "faketpu", worker_hosts=False)
        fake.start()
        servers.append(fake)
        clients, publisher = memory_clients(claimer_settings(fake, **settings))
        return ClaimerHarness(clients, publisher, claimer_app(clients), fake, monkeypatch)

    yield start
    for s in servers:
        s.stop()


def fleet_data(zones: list[str], *, types=("v4-32",), count=5, quota_chips=64, watch_interval=0.3, **extra) -> dict:
    families = {"v4-32": "v4", "v5litepod-64": "v5litepod", "v5litepod-8": "v5litepod", "v6e-8": "v6e"}
    return {
        "name": "race",
        "project": "tpuq-test",
        "owner_prefix": "tq",
        "claim": {"watch_interval_seconds": watch_interval, "capacity_backoff_base_seconds": 600},
        "quota": {z: {families[t]: {"spot": quota_chips} for t in types} for z in zones},
        "tpus": [{"id": t.replace("-", ""), "type": t, "zones": zones, "count": count} for t in types],
        **extra,
    }


def scenario_data(zones: list[str], *, families=("v4",), quota_chips=64, stocked_out=(), provisioning=600.0,
                  waiting=5.0, **extra) -> dict:
    return {
        "zones": {
            z: {"quota": {f: {"spot": quota_chips} for f in families},
                "stockouts": [{"effect": "fail"}] if z in stocked_out else []}
            for z in zones
        },
        "delays": {"accepted": 1, "waiting": waiting, "provisioning": provisioning},
        **extra,
    }


__all__ = ["ClaimerHarness", "fleet_data", "scenario_data", "store"]
