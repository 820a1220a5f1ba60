"""Scheduler test fixtures: the scheduler's own entry point, fed real push envelopes.

`sched` runs the scheduler on the in-memory Firestore and Pub/Sub publisher
(`tpuq_dev.inmemory`): no emulator, no stack. Messages reach it as push envelopes
through functions-framework's test client, and what it publishes is read back
from the publisher stub.

`stack_sched` is the same scheduler on the emulators of the session stack, for
tests that run scheduler processes over HTTP (two instances racing). After the
stack's reset it removes every push subscription (so no service process of the
stack reacts to what the scheduler publishes) and watches `assignments` and
`capacity` through pull subscriptions of its own.
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import functions_framework
import pytest
import requests
from google.api_core.exceptions import DeadlineExceeded
from pydantic import BaseModel

from tpuq.contracts import store, topology
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.runtime.entrypoints import source_file
from tpuq.scheduler.handlers import build_service
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import save_fleet
from tpuq_dev.inmemory import MemoryFirestore, MemoryPublisher
from tpuq.contracts.messages import FleetEvent, FleetEventKind, WorkerEndpoint

from tests.helpers import push_envelope

SCHEDULER_SOURCE = str(source_file("scheduler"))
PROJECT_ZONE = "us-central2-b"
WATCHED = ("assignments", "capacity")


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


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
    client: Any  # functions-framework test client
    published: Callable[[str], list[dict]]  # what was published to a topic since the last look
    ids: Any = field(default_factory=lambda: itertools.count(1))

    # ---- delivery
    def deliver(self, topic: str, message: BaseModel | dict, message_id: str | None = None, times: int = 2) -> str:
        """Post `message` as a push envelope `times` times (the same message id: a redelivery)."""
        message_id = message_id or f"{topic}-{next(self.ids)}"
        body = push_envelope(message, message_id, f"scheduler-{topic}")
        for _ in range(times):
            r = self.client.post(PATHS[topic], json=body)
            assert r.status_code in (200, 204), (r.status_code, r.get_data(as_text=True))
        return message_id

    def deliver_http(self, url: str, topic: str, message: BaseModel | dict, message_id: str,
                     session: requests.Session | None = None) -> int:
        body = push_envelope(message, message_id, f"scheduler-{topic}")
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
        """Everything published to `topic` since the last drain."""
        return self.published(topic)


def scheduler_app(clients: Clients):
    """The scheduler's entry point (tpuq.scheduler.main) through functions-framework, serving a scheduler built
    on `clients` (its settings are the clients')."""
    app = functions_framework.create_app("handle", SCHEDULER_SOURCE, "http")
    entry = sys.modules[Path(SCHEDULER_SOURCE).stem]  # functions-framework registers a source under its file's stem
    assert Path(entry.__file__).resolve() == Path(SCHEDULER_SOURCE).resolve()
    entry.ENTRY.use(build_service(clients.settings, clients))
    return app.test_client()


class NoStandIn:
    """A client these tests must not reach: using it fails the test instead of going to Google Cloud."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        raise AssertionError(f"the scheduler used Clients.{self._name}.{attr}, which has no in-memory stand-in here")


def memory_clients(settings: Settings, **given) -> tuple[Clients, MemoryPublisher]:
    """`Clients` whose Firestore and publisher are the in-memory stand-ins, whose other clients refuse use unless
    `given` (e.g. storage=MemoryGcs())."""
    publisher = MemoryPublisher(settings.topic_path(t.name) for t in topology.TOPICS)
    clients = Clients(settings, **{"firestore": MemoryFirestore(project=settings.project), "publisher": publisher,
                                   "storage": NoStandIn("storage"), "tpu": NoStandIn("tpu"), **given})
    return clients, publisher


@pytest.fixture
def sched(monkeypatch) -> Sched:
    # The backstops every 5 minutes (production's default is 15): the tests step the clock by that period.
    settings = Settings(project="tpuq-local", runner_bucket="tpuq-runner", backstop_seconds=300)
    clients, publisher = memory_clients(settings)
    save_fleet(clients.firestore, fleet_file(), utc(2026, 1, 1))

    def published(topic: str) -> list[dict]:
        return [json.loads(m.data) for m in publisher.take(settings.topic_path(topic))]

    return Sched(clients=clients, client=scheduler_app(clients), published=published)


# ------------------------------------------------------------------ on the emulators of the session stack


def _pulled(project: str, topic: str) -> list[dict]:
    """Everything on the test's pull subscription of `topic` (unary pull with a timeout, then ack)."""
    from google.cloud import pubsub_v1

    subscriber = pubsub_v1.SubscriberClient()
    path = f"projects/{project}/subscriptions/test-{topic}"
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
def stack_sched(clean_stack, clients) -> Sched:
    host = clean_stack.env["PUBSUB_EMULATOR_HOST"]
    _isolate(host, clean_stack.project)
    save_fleet(clients.firestore, fleet_file(), utc(2026, 1, 1))
    client = functions_framework.create_app("handle", SCHEDULER_SOURCE, "http").test_client()
    return Sched(clients=clients, client=client, published=lambda topic: _pulled(clean_stack.project, topic))
