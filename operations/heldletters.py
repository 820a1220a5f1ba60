"""What Pub/Sub dead-lettered itself: pushes no handler ever answered, read back from the hold subscription.

A push that never gets a handler's answer (Cloud Run's front refuses it: 401/403 while an invoker grant
propagates, 429 at max instances, 504 past the request timeout; or the container crashes) is redelivered, and
after about the subscription's `deadLetterPolicy.maxDeliveryAttempts` (5 to 100) delivery attempts Pub/Sub
forwards it to the dead-letter topic ("Dead-letter topics", https://cloud.google.com/pubsub/docs/handling-failures:
"After an approximately configured number of delivery attempts, Pub/Sub can forward the undeliverable message";
the count is best effort, it may come a few attempts early or late). No handler saw it, so no `dead_letters/`
record exists (tpuq.runtime.service writes those); only the hold subscription on the dead-letter topic keeps it, for
its retention (7 days, tpuq.contracts.topology.DEAD_LETTER_HOLD_RETENTION_SECONDS). Pub/Sub's service agent needs
publisher on the dead-letter topic and subscriber on the source subscription for this ("Pub/Sub only counts
delivery attempts when a dead-letter topic is configured correctly and includes the correct IAM permissions";
infra/iam.yaml grants both).

The forwarded message "wraps the original message in a new one and adds attributes that identify the source
subscription": the same data and attributes, plus the four `SOURCE_*` attributes below (the Pub/Sub emulator
0.8.20 writes the same four). It is a new message: its id is not the original's, and no attribute carries the
original id. So a message is found by the job id its data names (`tpuq submit` always names one); one published
without an id (whose job would have been `job-<message id>`) is found only by its topic and publish time.

Reading without consuming (`read`): a pull, then modifyAckDeadline 0 (a nack) on every message pulled. Nothing is
acknowledged; each message stays for the rest of its retention. While a read holds them (at most a few seconds)
another reader does not see them, and if a reader dies holding them they come back after the subscription's ack
deadline (10 s). A pull needs `pubsub.subscriptions.consume` on the hold subscription (roles/pubsub.subscriber,
https://cloud.google.com/pubsub/docs/access-control): infra/iam.yaml grants it to the dashboard's account; a
person needs it too (project owners and editors hold it).

Core (`held_record`): a forwarded message as a record shaped like the handlers' `dead_letters/` records, so that
tpuq.operations.deadletters shows both alike. Shell (`read`): the pulls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from tpuq.contracts import topology

# Attributes Pub/Sub adds to a message it forwards to a dead-letter topic (handling-failures page above).
SOURCE_DELIVERY_COUNT = "CloudPubSubDeadLetterSourceDeliveryCount"
SOURCE_SUBSCRIPTION = "CloudPubSubDeadLetterSourceSubscription"  # the subscription's id, not its full name
SOURCE_SUBSCRIPTION_PROJECT = "CloudPubSubDeadLetterSourceSubscriptionProject"
SOURCE_TOPIC_PUBLISH_TIME = "CloudPubSubDeadLetterSourceTopicPublishTime"  # when the original was published
SOURCE_ATTRIBUTES = (SOURCE_DELIVERY_COUNT, SOURCE_SUBSCRIPTION, SOURCE_SUBSCRIPTION_PROJECT, SOURCE_TOPIC_PUBLISH_TIME)

UNDELIVERED = "undelivered"  # the record's `kind`; the handlers write "invalid" and "exhausted" (tpuq.runtime.service)
NEVER_ANSWERED = "never answered by a handler"

# The first pull waits this long for messages (an empty subscription costs that much); later pulls, which only
# collect what the first left, wait less. A pull that asks not to wait at all (`return_immediately`) is deprecated
# and may come back empty although messages are there (googleapis/google-cloud-java#3168).
FIRST_PULL_SECONDS = 3.0
MORE_PULL_SECONDS = 1.0
PULL_BATCH = 1000  # Pub/Sub's maximum max_messages
NACK_BATCH = 500  # ack ids per modifyAckDeadline request (a request is at most 512 KB)


class HeldUnreadable(Exception):
    """The hold subscription could not be read (no permission, not deployed, unreachable): said, never hidden."""


# ------------------------------------------------------------------------------------------ core
def held_record(message_id: str, data: bytes, attributes: Mapping[str, str],
                forwarded_at: datetime | None) -> dict[str, Any]:
    """One forwarded message as a dead-letter record: the subscription and the delivery attempts from Pub/Sub's
    attributes, the topic and service from tpuq.contracts.topology, the job id from the data (as the handlers read it)."""
    from tpuq.contracts.documents import parse_timestamp
    from tpuq.runtime.service import job_id_in

    original = {k: v for k, v in attributes.items() if k not in SOURCE_ATTRIBUTES}
    subscription = str(attributes.get(SOURCE_SUBSCRIPTION) or "").rsplit("/", 1)[-1]
    declared = next((s for s in topology.SUBSCRIPTIONS if s.name == subscription), None)
    topic = declared.topic if declared else ""
    count = str(attributes.get(SOURCE_DELIVERY_COUNT) or "")
    attempts = int(count) if count.isdigit() else None
    try:
        payload = json.loads(data or b"null")
    except ValueError:
        payload = None
    return {
        "origin": "pubsub",
        "kind": UNDELIVERED,
        "message_id": None,  # Pub/Sub keeps no original id (module docstring)
        "dead_letter_message_id": message_id,
        "subscription": subscription,
        "project": attributes.get(SOURCE_SUBSCRIPTION_PROJECT) or "",
        "topic": topic,
        "service": declared.service if declared else "",
        "delivery_attempts": attempts,
        "published_at": parse_timestamp(attributes.get(SOURCE_TOPIC_PUBLISH_TIME)),
        "recorded_at": forwarded_at,
        "job_id": job_id_in(payload if isinstance(payload, dict) else None, topic),
        "field": None,
        "reason": NEVER_ANSWERED + (f": Pub/Sub gave up after {attempts} delivery attempts" if attempts else ""),
        "raw_data": data.decode("utf-8", errors="replace")[:100_000],
        "attributes": original,
    }


# ------------------------------------------------------------------------------------------ shell
def read(clients, limit: int = PULL_BATCH) -> list[dict[str, Any]]:
    """Up to `limit` messages the hold subscription keeps, as `held_record`s, left in it (nacked); HeldUnreadable
    when it cannot be read."""
    from google.api_core import exceptions

    subscriber = clients.subscriber
    path = clients.settings.subscription_path(topology.DEAD_LETTER_HOLD_SUBSCRIPTION)
    pulled: list = []
    try:
        while len(pulled) < limit:
            try:
                response = subscriber.pull(request={"subscription": path,
                                                    "max_messages": min(limit - len(pulled), PULL_BATCH)},
                                           timeout=MORE_PULL_SECONDS if pulled else FIRST_PULL_SECONDS)
            except exceptions.DeadlineExceeded:
                break  # nothing (more) within the wait
            if not response.received_messages:
                break
            pulled += response.received_messages
    except exceptions.GoogleAPICallError as e:
        fix = {exceptions.NotFound: "`tpuq deploy` creates it",
               exceptions.PermissionDenied: "reading it needs roles/pubsub.subscriber on it"}.get(type(e), "")
        raise HeldUnreadable(f"could not read the dead letters Pub/Sub keeps in subscription "
                             f"{topology.DEAD_LETTER_HOLD_SUBSCRIPTION} ({e.__class__.__name__}: {e.message})"
                             + (f"; {fix}" if fix else "")) from None
    finally:
        _leave(subscriber, path, [m.ack_id for m in pulled])
    return [held_record(m.message.message_id, m.message.data, dict(m.message.attributes), m.message.publish_time)
            for m in pulled]


def _leave(subscriber, path: str, ack_ids: list[str]) -> None:
    """Give the messages back at once (a nack: modifyAckDeadline 0), for other readers and the next read."""
    from google.api_core import exceptions

    for start in range(0, len(ack_ids), NACK_BATCH):
        try:
            subscriber.modify_ack_deadline(request={"subscription": path, "ack_ids": ack_ids[start:start + NACK_BATCH],
                                                    "ack_deadline_seconds": 0})
        except exceptions.GoogleAPICallError:
            pass  # they come back by themselves after the subscription's ack deadline
