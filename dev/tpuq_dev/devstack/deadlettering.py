"""Pub/Sub's dead-lettering of pushes, which the local front (tpuq_dev.devstack.front) does for the emulator.

What Google does ("Dead-letter topics", https://cloud.google.com/pubsub/docs/handling-failures; the
DeadLetterPolicy reference): a push that is not acknowledged is delivered again; a push is acknowledged by the
answers 102, 200, 201, 202 and 204 and by nothing else (https://cloud.google.com/pubsub/docs/push), whoever gives
the answer: the container, or Cloud Run's front in its place (401/403 from the invoker check, 429 with every
instance busy, 504 past the request timeout, 503 with the container down). After about the subscription's
`deadLetterPolicy.maxDeliveryAttempts` (5 to 100; "1 + the number of NACKs and of ack deadlines exceeded")
deliveries, Pub/Sub publishes a new message to the dead-letter topic, with the original's data and attributes
and four more: CloudPubSubDeadLetterSourceDeliveryCount, ...SourceSubscription (the subscription's id),
...SourceSubscriptionProject and ...SourceTopicPublishTime (tpuq.operations.heldletters names them), and removes the
message from the subscription. Only the dead-letter topic's subscriptions keep it (tpuq's hold subscription).

What the emulator does (0.8.20, measured on a push subscription with maxDeliveryAttempts 5 whose endpoint answers
503): one failing message alone is pushed 5 times within ~11 s (10 times within ~44 s for 10) and then
dead-lettered, with those four attributes; but with three failing messages it pushed 8 times in 300 s and
dead-lettered none: after a few failures it stops pushing the subscription for minutes (the stall `Front._deliver`
describes). So locally nothing reached the dead-letter topic, and what a misconfiguration refuses was lost
without a trace, where production keeps it.

What the front does instead (`DeadLettering`): it counts the deliveries of each message per subscription (key:
subscription, message id, publish time): every push from the emulator (a request without any Authorization
header: Pub/Sub's own, the emulator sends none), and every redelivery the front makes itself
(`redeliver_seconds`). When a delivery gets no acknowledging answer and it was the subscription's
maxDeliveryAttempts-th, the front publishes the message to the subscription's dead-letter topic on the emulator,
as Pub/Sub would, and answers the emulator 204 so that it stops redelivering: the message leaves the subscription.
The policy and the push endpoint are read from the emulator's subscription, as the front reads pushConfig (only
a subscription that pushes to this front's URL and path is dead-lettered here). The emulator counts no more
deliveries than the front sees, so it never dead-letters a message twice.

What it cannot: Pub/Sub's count is approximate (best effort: it may forward a few attempts early or late); the
front's is exact. Counts live in the front's memory: a front restarted mid-way counts from zero. Pub/Sub counts only
when its service agent may publish to the dead-letter topic and subscribe to the subscription; the front checks no
IAM (the IAM model checks that infra/iam.yaml grants both). Pushes whose redelivery the emulator stalls are
dead-lettered only once they reach the count (`redeliver_seconds` makes the front redeliver 5xx and 429 itself).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from tpuq.operations.heldletters import (SOURCE_DELIVERY_COUNT, SOURCE_SUBSCRIPTION, SOURCE_SUBSCRIPTION_PROJECT,
                                         SOURCE_TOPIC_PUBLISH_TIME)

log = logging.getLogger("tpuq_dev.devstack.front")

ACKNOWLEDGING = frozenset({102, 200, 201, 202, 204})  # https://cloud.google.com/pubsub/docs/push
POLICY_TTL_SECONDS = 5.0  # a changed deadLetterPolicy applies within this long (as the front's pushConfig cache)
AUTHORIZATION_HEADERS = ("Authorization", "X-Serverless-Authorization")

Key = tuple[str, str, str]  # (subscription's full name, message id, publish time)


# ------------------------------------------------------------------------------------------ core
def delivery_key(envelope: Any) -> Key | None:
    """Which message of which subscription a push body delivers; None for anything else."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("message"), dict):
        return None
    subscription, message = envelope.get("subscription"), envelope["message"]
    message_id = message.get("messageId") or message.get("message_id")
    if not isinstance(subscription, str) or not subscription or not message_id:
        return None
    return subscription, str(message_id), str(message.get("publishTime") or message.get("publish_time") or "")


def gives_up(status: int, attempts: int, max_attempts: int | None) -> bool:
    """Pub/Sub's decision after one delivery: forward to the dead-letter topic (the delivery was not acknowledged
    and was the last the policy allows)."""
    return status not in ACKNOWLEDGING and bool(max_attempts) and attempts >= max_attempts  # type: ignore[operator]


def forwarded(envelope: Mapping[str, Any], attempts: int) -> dict[str, Any]:
    """The message Pub/Sub publishes to the dead-letter topic: the original's data and attributes, plus the source
    attributes (the subscription's id and project, the attempts, the original publish time)."""
    _, project, _, subscription = str(envelope["subscription"]).split("/", 3)
    message = envelope["message"]
    attributes = {**(message.get("attributes") or {}), SOURCE_DELIVERY_COUNT: str(attempts),
                  SOURCE_SUBSCRIPTION: subscription, SOURCE_SUBSCRIPTION_PROJECT: project,
                  SOURCE_TOPIC_PUBLISH_TIME: str(message.get("publishTime") or message.get("publish_time") or "")}
    return {"data": message.get("data") or "", "attributes": attributes}


@dataclass
class DeliveryCounts:
    """Deliveries of each unacknowledged message, per subscription. Thread-safe (a front thread per request)."""

    _counts: dict[Key, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def delivered(self, key: Key) -> int:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            return self._counts[key]

    def delivered_again(self, key: Key) -> int | None:
        """A redelivery by the front itself, of a message the emulator pushed; None for one it did not."""
        with self._lock:
            if key not in self._counts:
                return None
            self._counts[key] += 1
            return self._counts[key]

    def get(self, key: Key) -> int:
        with self._lock:
            return self._counts.get(key, 0)

    def forget(self, key: Key) -> None:
        with self._lock:
            self._counts.pop(key, None)


# ------------------------------------------------------------------------------------------ shell
@dataclass
class DeadLettering:
    """One route's dead-lettering: `answer` wraps the front's handling of a request."""

    route_url: str  # the service's URL: a subscription whose pushEndpoint starts with it pushes here
    pubsub_host: str
    session: requests.Session = field(default_factory=requests.Session)
    now: Callable[[], float] = time.monotonic
    counts: DeliveryCounts = field(default_factory=DeliveryCounts)
    _subscriptions: dict[str, tuple[dict, float]] = field(default_factory=dict, repr=False)

    def answer(self, request, handle: Callable[[Any], Any]):
        """`handle(request)` (the front), counted as a delivery when it is the emulator's push; on the last failed
        delivery the message is dead-lettered and the emulator gets 204."""
        key = self._pushed_by_pubsub(request)
        if key is None:
            return handle(request)
        self.counts.delivered(key)
        response = handle(request)
        return self.settle(key, request.path, request.get_data(), response)

    def settle(self, key: Key, path: str, body: bytes, response):
        if response.status_code in ACKNOWLEDGING:
            self.counts.forget(key)
            return response
        attempts, policy = self.counts.get(key), self._policy(key[0], path)
        if not gives_up(response.status_code, attempts, policy.get("maxDeliveryAttempts")):
            return response
        if not self._publish(json.loads(body), attempts, policy["deadLetterTopic"]):
            return response  # not forwarded: the emulator redelivers, and the next failure tries again
        self.counts.forget(key)
        from werkzeug.wrappers import Response

        return Response(status=204)

    def redelivered(self, body: bytes) -> None:
        """The front delivered a push again itself (`redeliver_seconds`): one more delivery."""
        key = _key_of(body)
        if key is not None:
            self.counts.delivered_again(key)

    def exhausted(self, body: bytes) -> bool:
        """No redelivery left: the deliveries so far of a message the emulator pushed (`answer` counts only those)
        reach its subscription's maxDeliveryAttempts."""
        key = _key_of(body)
        if key is None or not self.counts.get(key):
            return False
        limit = self._policy(key[0]).get("maxDeliveryAttempts")
        return bool(limit) and self.counts.get(key) >= limit

    # ---- the emulator
    def _pushed_by_pubsub(self, request) -> Key | None:
        if any(h in request.headers for h in AUTHORIZATION_HEADERS):
            return None  # the emulator sends no token: someone else's request (a test's, a person's)
        return _key_of(request.get_data())

    def _policy(self, subscription: str, path: str | None = None) -> dict:
        """The subscription's deadLetterPolicy when it pushes to this route (at `path`, when given), else {}."""
        cached = self._subscriptions.get(subscription)
        if cached is None or self.now() - cached[1] >= POLICY_TTL_SECONDS:
            try:
                got = self.session.get(f"http://{self.pubsub_host}/v1/{subscription}", timeout=10)
                body = got.json() if got.status_code == 200 else {}
            except (requests.RequestException, ValueError):
                body = {}
            cached = (body, self.now())
            self._subscriptions[subscription] = cached
        body = cached[0]
        endpoint = (body.get("pushConfig") or {}).get("pushEndpoint") or ""
        if endpoint != self.route_url + (path or endpoint.removeprefix(self.route_url)):
            return {}
        policy = body.get("deadLetterPolicy") or {}
        return policy if policy.get("deadLetterTopic") else {}

    def _publish(self, envelope: dict, attempts: int, topic: str) -> bool:
        try:
            answer = self.session.post(f"http://{self.pubsub_host}/v1/{topic}:publish",
                                       json={"messages": [forwarded(envelope, attempts)]}, timeout=10)
        except requests.RequestException as e:
            log.warning("could not dead-letter message %s of %s: %s", envelope["message"].get("messageId"),
                        envelope["subscription"], e)
            return False
        if answer.status_code != 200:
            log.warning("could not dead-letter message %s of %s: %s %s", envelope["message"].get("messageId"),
                        envelope["subscription"], answer.status_code, answer.text[:200])
            return False
        log.warning("%s: message %s dead-lettered to %s after %d delivery attempts (no handler answered)",
                    envelope["subscription"], envelope["message"].get("messageId"), topic, attempts)
        return True


def _key_of(body: bytes) -> Key | None:
    try:
        return delivery_key(json.loads(body or b"null"))
    except ValueError:
        return None
