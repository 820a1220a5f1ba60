"""The front dead-letters as Pub/Sub does (tpuq_dev.devstack.deadlettering, through its push dispatcher), in-process:
a front before a container that answers what the test says, and a stand-in for the emulator's subscription read
and publish. No stack."""

from __future__ import annotations

import base64
import json
import time

import pytest
from werkzeug.test import Client
from werkzeug.wrappers import Request, Response

from tpuq.operations.heldletters import (SOURCE_DELIVERY_COUNT, SOURCE_SUBSCRIPTION, SOURCE_SUBSCRIPTION_PROJECT,
                                         SOURCE_TOPIC_PUBLISH_TIME)
from tpuq_dev.devstack import processes
from tpuq_dev.devstack.deadlettering import forwarded
from tpuq_dev.devstack.dispatcher import Policy
from tpuq_dev.devstack.front import Front, LocalGoogleSigner, Route

from tests.helpers import serve_in_thread, wait_until

PUSHER = "tpuq-push@tpuq-local.iam.gserviceaccount.com"
SUBSCRIPTION = "projects/tpuq-local/subscriptions/scheduler-jobs"
DEAD_LETTER_TOPIC = "projects/tpuq-local/topics/dead-letters"


def envelope(message_id: str = "41", publish_time: str = "2026-12-01T14:00:00.123Z") -> dict:
    return {"subscription": SUBSCRIPTION, "message": {
        "data": base64.b64encode(b'{"id": "train-1"}').decode(), "attributes": {"source": "cli"},
        "messageId": message_id, "publishTime": publish_time}}


# ------------------------------------------------------------------------------------------ the pure parts
def test_the_decision_counts_only_unacknowledged_deliveries_at_the_limit():
    policy = Policy(max_delivery_attempts=5, dead_letter_topic=DEAD_LETTER_TOPIC)
    assert [policy.gives_up(status, 5) for status in (102, 200, 201, 202, 204)] == [False] * 5  # Pub/Sub's acks
    assert [policy.gives_up(status, 5) for status in (0, 401, 403, 429, 500, 503, 504, 400, 404)] == [True] * 9
    assert not policy.gives_up(503, 4) and not Policy().gives_up(503, 50)  # under the limit; no dead-letter policy


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
        self.retry = {"minimumBackoff": "0s", "maximumBackoff": "0.2s"}  # in range (0-600 s), for a short test

    @Request.application
    def __call__(self, request: Request) -> Response:
        if request.method == "GET" and request.path == f"/v1/{SUBSCRIPTION}":
            return Response(json.dumps({"name": SUBSCRIPTION, "pushConfig": {
                "pushEndpoint": self.endpoint,
                "oidcToken": {"serviceAccountEmail": PUSHER, "audience": self.endpoint.removesuffix("/push/jobs")}},
                "retryPolicy": self.retry, "ackDeadlineSeconds": 10,
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
        self.attempts: list[int] = []  # deliveryAttempt of each push received

    @Request.application
    def __call__(self, request: Request) -> Response:
        self.received += 1
        self.attempts.append(request.get_json().get("deliveryAttempt"))
        status = self.status(self.received) if callable(self.status) else self.status
        return Response("answer", status)


@pytest.fixture
def stand():
    """start(invokers, **front_options) -> (front client, emulator, container)."""
    servers = []
    signer = LocalGoogleSigner.generate()

    def start(invokers=(PUSHER,), **options):
        emulator, container = Emulator(), Container()
        pubsub, backend = serve_in_thread(emulator), serve_in_thread(container)
        servers.extend((pubsub, backend))
        route = Route("scheduler", processes.free_port(), f"http://127.0.0.1:{backend.server_port}", tuple(invokers))
        emulator.endpoint = route.url + "/push/jobs"
        fronts.append(Front(route, signer, f"127.0.0.1:{pubsub.server_port}", **options))
        return Client(fronts[-1]), emulator, container

    fronts: list[Front] = []
    yield start
    for front in fronts:
        front.dispatcher.stop()
    for s in servers:
        s.shutdown()


def push(client: Client, body: dict, **headers) -> int:
    """One push as the emulator makes it: no Authorization header."""
    return client.post("/push/jobs", data=json.dumps(body), headers={"Content-Type": "application/json", **headers}
                       ).status_code


@pytest.mark.parametrize("invokers, received", [((PUSHER,), 5), ((), 0)], ids=["container-fails", "invoker-refused"])
def test_the_last_failed_delivery_is_dead_lettered(stand, invokers, received):
    client, emulator, container = stand(invokers)
    assert push(client, envelope()) == 204  # the emulator's push is the dispatcher's at once
    wait_until(lambda: emulator.published, what="the dead letter")
    [sent] = emulator.published
    assert sent["attributes"][SOURCE_DELIVERY_COUNT] == "5" and sent["attributes"][SOURCE_SUBSCRIPTION] == "scheduler-jobs"
    assert base64.b64decode(sent["data"]) == b'{"id": "train-1"}' and sent["attributes"]["source"] == "cli"
    assert container.received == received  # the invoker check refuses before the container
    assert container.attempts == [1, 2, 3, 4, 5][:received]  # deliveryAttempt: the subscription has a dead-letter policy


def test_an_acknowledged_delivery_is_not_dead_lettered_and_a_callers_own_push_is_not_dispatched(stand):
    client, emulator, container = stand()
    container.status = lambda n: 503 if n < 4 else 200  # the 4th delivery is acknowledged
    assert push(client, envelope()) == 204
    wait_until(lambda: container.received >= 4, what="4 deliveries")
    time.sleep(0.5)
    assert container.received == 4 and emulator.published == []
    # A request that carries a token is someone's own (the emulator sends none): answered as it is, not queued.
    assert [push(client, envelope("other"), Authorization="Bearer x.y.z") for _ in range(6)] == [401] * 6
    assert container.received == 4 and emulator.published == []


def test_a_nacked_push_waits_the_retry_policys_backoff(stand):
    client, emulator, container = stand()
    emulator.retry = {"minimumBackoff": "1s", "maximumBackoff": "2s"}
    emulator.max_attempts = 3
    started = time.monotonic()
    push(client, envelope())
    wait_until(lambda: emulator.published, what="the dead letter")
    assert container.received == 3 and time.monotonic() - started >= 1 + 2  # 1 s, then 2 s (capped)
