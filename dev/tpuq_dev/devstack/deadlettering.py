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
dead-lettered none: after a few failures it stops pushing the subscription for minutes (the stall
tpuq_dev.devstack.dispatcher describes). So locally nothing reached the dead-letter topic, and what a misconfiguration refuses was lost
without a trace, where production keeps it.

What the front does instead: its push dispatcher (tpuq_dev.devstack.dispatcher) takes every push from the
emulator and counts each message's deliveries itself. When a delivery gets no acknowledging answer and it was the
subscription's maxDeliveryAttempts-th, `publish_dead_letter` publishes the message to the subscription's
dead-letter topic on the emulator, as Pub/Sub would, and the dispatcher drops it: it leaves the subscription.

What it cannot: Pub/Sub's count is approximate (best effort: it may forward a few attempts early or late); the
front's is exact. Counts live in the front's memory, with the messages. Pub/Sub forwards only when its service
agent may publish to the dead-letter topic and subscribe to the subscription; the front checks no IAM (the IAM
model checks that infra/iam.yaml grants both).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import requests

from tpuq.operations.heldletters import (SOURCE_DELIVERY_COUNT, SOURCE_SUBSCRIPTION, SOURCE_SUBSCRIPTION_PROJECT,
                                         SOURCE_TOPIC_PUBLISH_TIME)

log = logging.getLogger("tpuq_dev.devstack.front")


# ------------------------------------------------------------------------------------------ core
def forwarded(envelope: Mapping[str, Any], attempts: int) -> dict[str, Any]:
    """The message Pub/Sub publishes to the dead-letter topic: the original's data and attributes, plus the source
    attributes (the subscription's id and project, the attempts, the original publish time)."""
    _, project, _, subscription = str(envelope["subscription"]).split("/", 3)
    message = envelope["message"]
    attributes = {**(message.get("attributes") or {}), SOURCE_DELIVERY_COUNT: str(attempts),
                  SOURCE_SUBSCRIPTION: subscription, SOURCE_SUBSCRIPTION_PROJECT: project,
                  SOURCE_TOPIC_PUBLISH_TIME: str(message.get("publishTime") or message.get("publish_time") or "")}
    return {"data": message.get("data") or "", "attributes": attributes}


# ------------------------------------------------------------------------------------------ shell
def publish_dead_letter(session: requests.Session, pubsub_host: str, envelope: Mapping[str, Any], attempts: int,
                        topic: str) -> bool:
    """Publish what Pub/Sub forwards to the dead-letter topic; False when the emulator did not take it."""
    message_id = envelope["message"].get("messageId")
    try:
        answer = session.post(f"http://{pubsub_host}/v1/{topic}:publish",
                              json={"messages": [forwarded(envelope, attempts)]}, timeout=10)
    except requests.RequestException as e:
        log.warning("could not dead-letter message %s of %s: %s", message_id, envelope["subscription"], e)
        return False
    if answer.status_code != 200:
        log.warning("could not dead-letter message %s of %s: %s %s", message_id, envelope["subscription"],
                    answer.status_code, answer.text[:200])
        return False
    log.warning("%s: message %s dead-lettered to %s after %d delivery attempts (no handler answered)",
                envelope["subscription"], message_id, topic, attempts)
    return True
