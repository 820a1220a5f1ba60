"""Claimer handler tests: the real handler app, the Firestore and Pub/Sub emulators, and the fake TPU API.

The handler is driven through functions-framework's test client with real push
envelopes; the fake TPU's call log is the witness of what reached the API.
"""

from __future__ import annotations

import base64
import uuid

import pytest
from google.cloud import pubsub_v1
from pydantic import BaseModel

from tpuq.contracts import store
from tpuq_dev.devstack.stack import wait_for
from tpuq.runtime.entrypoints import source_file
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.server import FakeTpuServer
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import save_fleet
from tpuq.contracts.messages import FleetEvent
from tpuq.runtime.service import utcnow

TEST_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtpuqclaimertestkeyonlyforthetests0000 test"


class ClaimerHarness:
    def __init__(self, clients, app_client, fake: FakeTpuServer, project: str):
        self.clients = clients
        self.app = app_client
        self.fake = fake
        self.control = FakeTpuControl(fake.url)
        self.project = project
        self.subscriber = pubsub_v1.SubscriberClient()
        self.events_sub = clients.settings.subscription_path(f"test-fleet-events-{uuid.uuid4().hex[:8]}")
        self.subscriber.create_subscription(
            request={"name": self.events_sub, "topic": clients.settings.topic_path("fleet-events")})
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

    # ---- witnesses
    def creates(self, zone: str | None = None) -> list[dict]:
        return [c for c in self.control.calls(method="POST", path_contains="/queuedResources")
                if not c["path"].endswith(":reset") and (zone is None or f"/locations/{zone}/" in c["path"])]

    def deletes(self, zone: str | None = None) -> list[dict]:
        return [c for c in self.control.calls(method="DELETE")
                if zone is None or f"/locations/{zone}/" in c["path"]]

    def pull_events(self) -> list[FleetEvent]:
        response = self.subscriber.pull(request={"subscription": self.events_sub, "max_messages": 100,
                                                 "return_immediately": True}, timeout=10)
        if response.received_messages:
            self.subscriber.acknowledge(request={"subscription": self.events_sub,
                                                 "ack_ids": [m.ack_id for m in response.received_messages]})
            self.events += [FleetEvent.model_validate_json(m.message.data) for m in response.received_messages]
        return self.events

    def wait_event(self, predicate, what: str) -> FleetEvent:
        return wait_for(lambda: next((e for e in self.pull_events() if predicate(e)), None), what=what)

    def qr_docs(self) -> list[dict]:
        return [s.to_dict() for s in self.clients.firestore.collection("queued_resources").stream()]

    def fake_state(self, qr_name: str) -> str | None:
        return self.fake.world.queued_resources[qr_name].state.name if qr_name in self.fake.world.queued_resources \
            else None


@pytest.fixture
def claimer(clients, monkeypatch, tmp_path):
    """Start a fake TPU for `scenario` and return a harness bound to a fresh claimer app."""
    import functions_framework

    servers: list[FakeTpuServer] = []
    harnesses: list[ClaimerHarness] = []

    def start(scenario: dict, time_scale: float = 600.0) -> ClaimerHarness:
        fake = FakeTpuServer(scenario, time_scale=time_scale, state_dir=tmp_path / "faketpu", worker_hosts=False)
        fake.start()
        servers.append(fake)
        monkeypatch.setenv("TPUQ_TPU_API_ENDPOINT", fake.url)
        # The claimer's quota and billing pre-checks read the fake's Cloud Quotas and Cloud Billing stand-ins.
        monkeypatch.setenv("TPUQ_CLOUDQUOTAS_API_ENDPOINT", fake.google_apis_url)
        monkeypatch.setenv("TPUQ_CLOUDBILLING_API_ENDPOINT", fake.google_apis_url)
        monkeypatch.setenv("TPUQ_SSH_PUBLIC_KEY", TEST_PUBLIC_KEY)
        app = functions_framework.create_app(target="handle", source=str(source_file("claimer")),
                                             signature_type="http")
        harness = ClaimerHarness(clients, app.test_client(), fake, clients.settings.project)
        harnesses.append(harness)
        return harness

    yield start
    for h in harnesses:
        try:
            h.subscriber.delete_subscription(request={"subscription": h.events_sub})
        except Exception:  # noqa: BLE001 - the emulator may be reset already
            pass
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
