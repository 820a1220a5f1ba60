"""The front delivers pushes as Pub/Sub does (tpuq_dev.devstack.dispatcher): many in flight per subscription,
a push window that grows with acks and shrinks with failures, the ack deadline, the retry policy. In-process: a
front before a container the test controls, and a stand-in for the emulator's subscription read. No stack."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest
from werkzeug.test import Client
from werkzeug.wrappers import Request, Response

from tpuq_dev.devstack import processes
from tpuq_dev.devstack.dispatcher import MAX_WINDOW, PUSH_BACKOFF_AFTER, START_WINDOW, Policy, Window
from tpuq_dev.devstack.front import Front, LocalGoogleSigner, Route
from tpuq_dev.devstack.run_limits import ServingLimits

from tests.helpers import serve_in_thread, wait_until

PUSHER = "tpuq-push@tpuq-local.iam.gserviceaccount.com"
SUBSCRIPTION = "projects/tpuq-local/subscriptions/probe-jobs"


# ------------------------------------------------------------------------------------------ the pure parts
def test_the_policy_is_read_as_pubsub_reads_the_subscription():
    policy = Policy.of({"ackDeadlineSeconds": 600, "retryPolicy": {"minimumBackoff": "1s", "maximumBackoff": "60s"},
                        "deadLetterPolicy": {"deadLetterTopic": "projects/p/topics/dead", "maxDeliveryAttempts": 10}})
    assert (policy.ack_deadline_seconds, policy.max_delivery_attempts) == (600, 10)
    assert [policy.retry_delay(n) for n in (1, 2, 3, 6, 7, 20)] == [1, 2, 4, 32, 60, 60]
    unset = Policy.of({})
    assert unset.ack_deadline_seconds == 10 and unset.retry_delay(5) == 0  # no retry policy: at once
    assert unset.max_delivery_attempts is None
    # A retry policy with its fields unset takes Pub/Sub's defaults (10 s, 600 s); maxDeliveryAttempts 5.
    defaults = Policy.of({"retryPolicy": {}, "deadLetterPolicy": {"deadLetterTopic": "projects/p/topics/dead"}})
    assert defaults.retry_delay(1) == 10 and defaults.retry_delay(10) == 600 and defaults.max_delivery_attempts == 5


def test_the_window_starts_small_grows_with_acks_and_halves_on_failures():
    window = Window()
    assert window.allowed == START_WINDOW < 10  # "a small single-digit window size"
    for _ in range(20):
        window.acknowledged()
    assert window.allowed == START_WINDOW + 20
    assert [window.failed() for _ in range(PUSH_BACKOFF_AFTER + 2)][-3:] == [0.1, 0.2, 0.4]  # then a push backoff
    assert window.allowed == 1
    window.acknowledged()
    assert window.consecutive_failures == 0 and window.failed() == 0.0
    for _ in range(2 * MAX_WINDOW):
        window.acknowledged()
    assert window.allowed == MAX_WINDOW


# ------------------------------------------------------------------------------------------ the front
class Emulator:
    """The emulator's subscription read, as the front makes it."""

    def __init__(self):
        self.endpoint = ""
        self.ack_deadline = 60
        self.deleted = False

    @Request.application
    def __call__(self, request: Request) -> Response:
        if request.method == "GET" and request.path == f"/v1/{SUBSCRIPTION}" and not self.deleted:
            return Response(json.dumps({"name": SUBSCRIPTION, "ackDeadlineSeconds": self.ack_deadline,
                                        "retryPolicy": {"minimumBackoff": "0s", "maximumBackoff": "1s"},
                                        "pushConfig": {"pushEndpoint": self.endpoint, "oidcToken": {
                                            "serviceAccountEmail": PUSHER,
                                            "audience": self.endpoint.removesuffix("/push/jobs")}}}),
                            content_type="application/json")
        return Response("not found", 404)


class Container:
    """Takes `seconds` to answer each push; counts how many it holds at once."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.status = 204
        self.lock = threading.Lock()
        self.now_in = 0
        self.most_in = 0
        self.received: list[str] = []

    @Request.application
    def __call__(self, request: Request) -> Response:
        with self.lock:
            self.now_in += 1
            self.most_in = max(self.most_in, self.now_in)
            self.received.append(request.get_json()["message"]["messageId"])
        time.sleep(self.seconds)
        with self.lock:
            self.now_in -= 1
        return Response("", self.status)


@pytest.fixture
def stand():
    """start(seconds, **limits) -> (front, emulator stand-in, container)."""
    servers = []
    signer = LocalGoogleSigner.generate()

    def start(seconds: float, **limits):
        emulator, container = Emulator(), Container(seconds)
        pubsub, backend = serve_in_thread(emulator), serve_in_thread(container)
        servers.extend((pubsub, backend))
        route = Route("probe", processes.free_port(), f"http://127.0.0.1:{backend.server_port}", (PUSHER,),
                      ServingLimits(**limits))
        emulator.endpoint = route.url + "/push/jobs"
        fronts.append(Front(route, signer, f"127.0.0.1:{pubsub.server_port}"))
        return fronts[-1], emulator, container

    fronts: list[Front] = []
    yield start
    for front in fronts:
        front.dispatcher.stop()
    for s in servers:
        s.shutdown()


def push(front: Front, message_id: str) -> int:
    body = {"subscription": SUBSCRIPTION, "message": {"data": base64.b64encode(b"{}").decode(),
                                                      "messageId": message_id, "publishTime": "2026-12-04T10:00:00Z"}}
    return Client(front).post("/push/jobs", data=json.dumps(body), headers={"Content-Type": "application/json"}
                              ).status_code


def test_many_pushes_are_in_flight_at_once_and_the_window_grows_with_acks(stand):
    """The emulator alone holds 2 in flight per subscription: 40 pushes of 0.3 s took 6 s. Pub/Sub keeps more."""
    front, _, container = stand(0.3, concurrency=20, max_instances=3)
    started = time.monotonic()
    assert [push(front, f"m-{i}") for i in range(40)] == [204] * 40  # taken at once
    wait_until(lambda: len(container.received) == 40, timeout=30, what="every push at the container")
    took = time.monotonic() - started
    stats = front.dispatcher.stats()[SUBSCRIPTION]
    assert container.most_in > 2 and stats["most_in_flight"] > 2, (container.most_in, stats)
    assert took < 40 * 0.3 / 2, took  # faster than 2 at a time
    wait_until(lambda: front.dispatcher.stats()[SUBSCRIPTION]["held"] == 0, timeout=10, what="all acknowledged")
    assert front.dispatcher.stats()[SUBSCRIPTION]["window"] >= 40  # +1 per ack
    assert sorted(container.received) == sorted(f"m-{i}" for i in range(40))  # each once


def test_the_window_never_exceeds_what_the_service_holds_and_a_429_is_delivered_again(stand):
    """Cloud Run's concurrency × instances (1 × 2 here) binds: past it, a push waits in Cloud Run's queue, then 429,
    a nack: the window shrinks and the message comes again."""
    front, _, container = stand(0.4, concurrency=1, max_instances=2, queue_seconds=0.1)
    for i in range(12):
        push(front, f"m-{i}")
    wait_until(lambda: front.dispatcher.stats()[SUBSCRIPTION]["held"] == 0, timeout=30, what="all acknowledged")
    assert container.most_in <= 2
    assert sorted(set(container.received)) == sorted(f"m-{i}" for i in range(12))
    assert front.dispatcher.stats()[SUBSCRIPTION]["delivered"] > 12  # the 429s were delivered again


def test_a_push_unanswered_within_the_ack_deadline_is_delivered_again_while_the_first_runs(stand):
    front, emulator, container = stand(1.5)
    emulator.ack_deadline = 1
    push(front, "slow")
    wait_until(lambda: len(container.received) >= 2, timeout=10, what="a second delivery")
    assert container.received[:2] == ["slow", "slow"] and container.most_in == 2  # the first was still running


def test_a_deleted_subscriptions_messages_are_dropped_and_a_reset_drops_everything_held(stand):
    """Deleting a subscription drops its messages in Pub/Sub; the stack resets the emulator between tests, and
    what the front held for the old subscriptions must not reach the new ones of the same name."""
    front, emulator, container = stand(0.0)
    container.status = 503
    for i in range(5):
        push(front, f"m-{i}")
    wait_until(lambda: len(container.received) >= 5, timeout=10, what="the first deliveries")
    assert front.reset() == 5  # what the stack's reset asks of the front
    front.subscriptions.forget()
    emulator.deleted = True
    push(front, "after")  # not this front's subscription any more: refused as nobody's
    seen = len(container.received)
    time.sleep(1.5)  # retry policy 0-1 s: a held message would have come again by now
    assert len(container.received) == seen and front.dispatcher.stats() == {}


def test_messages_of_a_subscription_deleted_meanwhile_are_dropped(stand):
    front, emulator, container = stand(0.0)
    container.status = 503
    for i in range(3):
        push(front, f"m-{i}")
    wait_until(lambda: len(container.received) >= 3, timeout=10, what="the first deliveries")
    emulator.deleted = True
    front.subscriptions.forget()  # read again at once, not after SUBSCRIPTION_TTL_SECONDS
    wait_until(lambda: front.dispatcher.stats()[SUBSCRIPTION]["held"] == 0, timeout=10, what="the messages dropped")
    seen = len(container.received)
    time.sleep(1.2)
    assert len(container.received) == seen
