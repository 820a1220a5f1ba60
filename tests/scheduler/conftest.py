"""Scheduler test fixtures: the emulators of the session stack, the scheduler as a push target.

`sched` isolates a test: after the stack's reset it removes every push
subscription (so no service process of the stack reacts to what the scheduler
publishes) and watches `assignments` and `capacity` through pull subscriptions
of its own. Messages reach the scheduler as real push envelopes: through
functions-framework's test client, or over HTTP to scheduler processes.
"""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import functions_framework
import pytest
import requests
from google.api_core.exceptions import DeadlineExceeded
from pydantic import BaseModel

from tpuq import store, topology
from tpuq.clients import Clients
from tpuq.entrypoints import source_file
from tpuq.fleet import FleetFile
from tpuq.fleetstore import save_fleet
from tpuq.messages import FleetEvent, FleetEventKind, WorkerEndpoint

SCHEDULER_SOURCE = str(source_file("scheduler"))
PROJECT_ZONE = "us-central2-b"
WATCHED = ("assignments", "capacity")


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def envelope(message: BaseModel | dict, message_id: str, subscription: str) -> dict:
    data = message.model_dump_json(exclude_none=True) if isinstance(message, BaseModel) else json.dumps(message)
    return {
        "message": {"data": base64.b64encode(data.encode()).decode(), "messageId": message_id, "attributes": {},
                    "publishTime": "2026-01-01T00:00:00Z"},
        "subscription": f"projects/tpuq-local/subscriptions/{subscription}",
    }


PATHS = {
    "jobs": "/push/jobs",
    "fleet-events": "/push/fleet-events",
    "attempt-events": "/push/attempt-events",
    "ticks": "/push/ticks",
    "cancels": "/push/cancels",
}


def fleet_file(**entries: Any) -> FleetFile:
    """A small fleet: v4-8 in us-central2-b (count 4) unless entries are given."""
    tpus = entries.pop("tpus", [{"id": "v4", "type": "v4-8", "zones": [PROJECT_ZONE], "count": 4}])
    return FleetFile.model_validate(
        {"name": "test", "project": "tpuq-local", "tpus": tpus,
         "retry": {"backoff_base_seconds": 0, **entries.pop("retry", {})}, **entries}
    )


def active(node: str, zone: str = PROJECT_ZONE, type_: str = "v4-8", entry_id: str | None = "v4",
           request_id: str | None = None, kind: FleetEventKind = FleetEventKind.active) -> FleetEvent:
    return FleetEvent(
        kind=kind,
        fleet="test",
        queued_resource=f"projects/tpuq-local/locations/{zone}/queuedResources/{node}",
        request_id=request_id,
        zone=zone,
        type=type_,
        node=f"projects/tpuq-local/locations/{zone}/nodes/{node}",
        entry_id=entry_id,
        chips=4,
        hosts=1,
        endpoints=[WorkerEndpoint(worker_id=0, ip="127.0.0.9", port=2222)],
        at=utc(2026, 1, 1),
    )


@dataclass
class Sched:
    """One isolated scheduler under test."""

    clients: Clients
    pubsub_host: str
    project: str
    client: Any = None  # functions-framework test client
    ids: Any = field(default_factory=lambda: itertools.count(1))

    # ---- delivery
    def deliver(self, topic: str, message: BaseModel | dict, message_id: str | None = None, times: int = 2) -> str:
        """Post `message` as a push envelope `times` times (the same message id: a redelivery)."""
        message_id = message_id or f"{topic}-{next(self.ids)}"
        body = envelope(message, message_id, f"scheduler-{topic}")
        for _ in range(times):
            r = self.client.post(PATHS[topic], json=body)
            assert r.status_code in (200, 204), (r.status_code, r.get_data(as_text=True))
        return message_id

    def deliver_http(self, url: str, topic: str, message: BaseModel | dict, message_id: str,
                     session: requests.Session | None = None) -> int:
        body = envelope(message, message_id, f"scheduler-{topic}")
        return (session or requests).post(url + PATHS[topic], json=body, timeout=120).status_code

    # ---- state
    @property
    def db(self):
        return self.clients.firestore

    def job(self, job_id: str) -> dict:
        return self.db.collection(store.JOBS).document(job_id).get().to_dict()

    def tpu(self, short: str) -> dict:
        return self.db.collection(store.TPUS).document(short).get().to_dict()

    def attempts(self, job_id: str) -> dict[str, dict]:
        col = self.db.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS)
        return {d.id: d.to_dict() for d in col.stream()}

    def all(self, collection: str) -> dict[str, dict]:
        return {d.id: d.to_dict() for d in self.db.collection(collection).stream()}

    # ---- published messages
    def drain(self, topic: str) -> list[dict]:
        """Everything published to `topic` since the last drain (unary pull with a timeout, then ack)."""
        from google.cloud import pubsub_v1

        subscriber = pubsub_v1.SubscriberClient()
        path = f"projects/{self.project}/subscriptions/test-{topic}"
        out = []
        while True:
            try:
                resp = subscriber.pull(request={"subscription": path, "max_messages": 1000,
                                                "return_immediately": True}, timeout=5)
            except DeadlineExceeded:
                break
            if not resp.received_messages:
                break
            out += [json.loads(m.message.data) for m in resp.received_messages]
            subscriber.acknowledge(request={"subscription": path, "ack_ids": [m.ack_id for m in resp.received_messages]})
        subscriber.close()
        return out


def _isolate(pubsub_host: str, project: str) -> None:
    base = f"http://{pubsub_host}/v1/projects/{project}"
    for sub in topology.SUBSCRIPTIONS:
        requests.delete(f"{base}/subscriptions/{sub.name}", timeout=10)
    for topic in WATCHED:
        r = requests.put(f"{base}/subscriptions/test-{topic}", json={"topic": f"projects/{project}/topics/{topic}",
                                                                     "ackDeadlineSeconds": 60}, timeout=10)
        r.raise_for_status()


@pytest.fixture
def sched(clean_stack, clients) -> Sched:
    host = clean_stack.env["PUBSUB_EMULATOR_HOST"]
    _isolate(host, clean_stack.project)
    save_fleet(clients.firestore, fleet_file(), utc(2026, 1, 1))
    s = Sched(clients=clients, pubsub_host=host, project=clean_stack.project)
    s.client = functions_framework.create_app("handle", SCHEDULER_SOURCE, "http").test_client()
    return s
