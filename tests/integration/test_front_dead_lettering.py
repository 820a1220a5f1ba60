"""The front dead-letters as Pub/Sub does (tpuq_dev.devstack.deadlettering), in-process: a front before a container
that answers what the test says, and a stand-in for the emulator's subscription read and publish. No stack."""

from __future__ import annotations

import base64
import json
import threading

import pytest
from werkzeug.serving import make_server
from werkzeug.test import Client
from werkzeug.wrappers import Request, Response

from tpuq.operations.heldletters import (SOURCE_DELIVERY_COUNT, SOURCE_SUBSCRIPTION, SOURCE_SUBSCRIPTION_PROJECT,
                                         SOURCE_TOPIC_PUBLISH_TIME)
from tpuq_dev.devstack import processes
from tpuq_dev.devstack.deadlettering import DeliveryCounts, delivery_key, forwarded, gives_up
from tpuq_dev.devstack.front import Front, LocalGoogleSigner, Route

PUSHER = "tpuq-push@tpuq-local.iam.gserviceaccount.com"
SUBSCRIPTION = "projects/tpuq-local/subscriptions/scheduler-jobs"
DEAD_LETTER_TOPIC = "projects/tpuq-local/topics/dead-letters"


def envelope(message_id: str = "41", publish_time: str = "2026-12-01T14:00:00.123Z") -> dict:
    return {"subscription": SUBSCRIPTION, "message": {
        "data": base64.b64encode(b'{"id": "train-1"}').decode(), "attributes": {"source": "cli"},
        "messageId": message_id, "publishTime": publish_time}}


# ------------------------------------------------------------------------------------------ the pure parts
def test_the_decision_counts_only_unacknowledged_deliveries_at_the_limit():
    assert [gives_up(status, 5, 5) for status in (102, 200, 201, 202, 204)] == [False] * 5  # Pub/Sub's acks
    assert [gives_up(status, 5, 5) for status in (401, 403, 429, 500, 503, 504, 400, 404)] == [True] * 8
    assert not gives_up(503, 4, 5) and not gives_up(503, 50, None)  # under the limit; no dead-letter policy


def test_deliveries_are_counted_per_subscription_message_and_publish_time():
    counts = DeliveryCounts()
    key = delivery_key(envelope())
    assert key == (SUBSCRIPTION, "41", "2026-12-01T14:00:00.123Z")
    assert delivery_key({"message": {}}) is None and delivery_key("x") is None
    assert counts.delivered_again(key) is None  # the front redelivers only what the emulator pushed
    assert [counts.delivered(key) for _ in range(3)] == [1, 2, 3] and counts.delivered_again(key) == 4
    # The emulator's ids start again after a reset: the publish time tells the new message apart.
    assert counts.delivered(delivery_key(envelope(publish_time="2026-12-01T15:00:00Z"))) == 1
    counts.forget(key)
    assert counts.get(key) == 0


def test_the_forwarded_message_keeps_data_and_attributes_and_names_its_source():
    assert forwarded(envelope(), 5) == {"data": envelope()["message"]["data"], "attributes": {
        "source": "cli", SOURCE_DELIVERY_COUNT: "5", SOURCE_SUBSCRIPTION: "scheduler-jobs",
        SOURCE_SUBSCRIPTION_PROJECT: "tpuq-local", SOURCE_TOPIC_PUBLISH_TIME: "2026-12-01T14:00:00.123Z"}}


# ------------------------------------------------------------------------------------------ the front
class Emulator:
    """The emulator's subscription read (pushConfig, deadLetterPolicy) and the dead-letter topic's publish."""

    def __init__(self):
        self.endpoint = ""
        self.max_attempts = 5
        self.published: list[dict] = []

    @Request.application
    def __call__(self, request: Request) -> Response:
        if request.method == "GET" and request.path == f"/v1/{SUBSCRIPTION}":
            return Response(json.dumps({"name": SUBSCRIPTION, "pushConfig": {
                "pushEndpoint": self.endpoint,
                "oidcToken": {"serviceAccountEmail": PUSHER, "audience": self.endpoint.removesuffix("/push/jobs")}},
                "deadLetterPolicy": {"deadLetterTopic": DEAD_LETTER_TOPIC, "maxDeliveryAttempts": self.max_attempts}}),
                content_type="application/json")
        if request.method == "POST" and request.path == f"/v1/{DEAD_LETTER_TOPIC}:publish":
            self.published += request.get_json()["messages"]
            return Response(json.dumps({"messageIds": [str(len(self.published))]}), content_type="application/json")
        return Response("not found", 404)


class Container:
    def __init__(self):
        self.status = 503
        self.received = 0

    @Request.application
    def __call__(self, request: Request) -> Response:
        self.received += 1
        return Response("answer", self.status)


@pytest.fixture
def stand():
    """start(invokers, **front_options) -> (front client, emulator, container)."""
    servers = []
    signer = LocalGoogleSigner.generate()

    def start(invokers=(PUSHER,), **options):
        emulator, container = Emulator(), Container()
        for app in (emulator, container):
            server = make_server("127.0.0.1", 0, app, threaded=True)
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
            servers.append(server)
        pubsub, backend = servers[-2], servers[-1]
        route = Route("scheduler", processes.free_port(), f"http://127.0.0.1:{backend.server_port}", tuple(invokers))
        emulator.endpoint = route.url + "/push/jobs"
        front = Front(route, signer, f"127.0.0.1:{pubsub.server_port}", **options)
        return Client(front), emulator, container

    yield start
    for s in servers:
        s.shutdown()


def push(client: Client, body: dict, **headers) -> int:
    """One push as the emulator makes it: no Authorization header."""
    return client.post("/push/jobs", data=json.dumps(body), headers={"Content-Type": "application/json", **headers}
                       ).status_code


@pytest.mark.parametrize("invokers, answer", [((PUSHER,), 503), ((), 403)], ids=["container-fails", "invoker-refused"])
def test_the_last_failed_delivery_is_dead_lettered_and_acknowledged(stand, invokers, answer):
    client, emulator, container = stand(invokers)
    assert [push(client, envelope()) for _ in range(4)] == [answer] * 4 and emulator.published == []
    assert push(client, envelope()) == 204  # the 5th: forwarded, and it leaves the subscription
    [sent] = emulator.published
    assert sent["attributes"][SOURCE_DELIVERY_COUNT] == "5" and sent["attributes"][SOURCE_SUBSCRIPTION] == "scheduler-jobs"
    assert base64.b64decode(sent["data"]) == b'{"id": "train-1"}' and sent["attributes"]["source"] == "cli"
    assert container.received == (4 + 1 if invokers else 0)  # the invoker check refuses before the container


def test_an_acknowledged_delivery_starts_the_count_again_and_a_callers_own_push_is_not_counted(stand):
    client, emulator, container = stand()
    assert [push(client, envelope()) for _ in range(3)] == [503] * 3
    container.status = 200
    assert push(client, envelope()) == 200
    container.status = 503
    assert [push(client, envelope()) for _ in range(4)] == [503] * 4 and emulator.published == []
    # A request that carries a token is someone's own (the emulator sends none): answered as it is, never counted.
    assert [push(client, envelope("other"), Authorization="Bearer x.y.z") for _ in range(6)] == [401] * 6
    assert emulator.published == []


def test_the_fronts_own_redeliveries_count_and_stop_at_the_limit(stand):
    """With `redeliver_seconds` the front redelivers a failed push itself: those are deliveries too, and it stops
    redelivering once they reach maxDeliveryAttempts (2 here, below Pub/Sub's minimum of 5, to keep the test short:
    the front redelivers after 1, 2, 4 and 8 s)."""
    client, emulator, container = stand(redeliver_seconds=60)
    emulator.max_attempts = 2
    assert push(client, envelope()) == 204
    assert container.received == 2 and emulator.published[0]["attributes"][SOURCE_DELIVERY_COUNT] == "2"
