"""Topics and subscriptions, declared once as data.

The local stack (`tpuq dev up`), the tests, `infra/` and `tpuq deploy` all read
this module; nothing else names a topic. A subscription pushes to one service
at a path; the service routes on that path to the handler and model below.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuq.contracts import messages
from tpuq.contracts.gcslayout import STATUS_NOTIFICATION_PREFIX, SUBMIT_PREFIX

SERVICES = ("scheduler", "claimer", "executor", "janitor")


@dataclass(frozen=True)
class Topic:
    name: str
    model: type | None  # None: GCS notification payloads, dead letters
    description: str


@dataclass(frozen=True)
class Subscription:
    name: str
    topic: str
    service: str
    path: str  # the push path on the service
    ack_deadline_seconds: int = 60
    max_delivery_attempts: int = 10
    min_backoff_seconds: int = 1
    max_backoff_seconds: int = 60
    # Pub/Sub's filter on message attributes ("": every message): a message it does not match is acknowledged
    # by Pub/Sub and never pushed. Fixed at creation: deploy replaces a subscription whose filter changed.
    filter: str = ""

    @property
    def route(self) -> str:
        return self.path


TOPICS: tuple[Topic, ...] = (
    Topic("jobs", messages.JobSubmission, "Job submissions (tpuq submit, gcloud publish, bucket upload)"),
    Topic("capacity", messages.CapacityRequest, "Scheduler asks the claimer for slices, or withdraws"),
    Topic("fleet-events", messages.FleetEvent, "Claimer reports queued resource state changes"),
    Topic("assignments", messages.Assignment, "Scheduler tells the executor to run or stop an attempt"),
    Topic("attempt-events", messages.AttemptEvent, "Executor reports attempts started and ended"),
    Topic("ticks", messages.Tick, "Periodic tick (Cloud Scheduler / local tick source), to the janitor, which routes it"),
    # The minute's tick, routed to a service when its `tick_due/` document says its tick has work
    # (tpuq.runtime.tickdue), and every nudge.
    Topic("ticks-scheduler", messages.Tick, "The tick, routed to the scheduler when it has work"),
    Topic("ticks-claimer", messages.Tick, "The tick, routed to the claimer when it has work"),
    Topic("ticks-executor", messages.Tick, "The tick, routed to the executor when it has work"),
    Topic("cancels", messages.CancelRequest, "Users cancel jobs"),
    Topic("gcs-events", messages.GcsObjectEvent, "Object finalize notifications from the runner bucket"),
    Topic("notifications", messages.Notification, "Events people asked to be told of, for the janitor to deliver"),
    Topic("dead-letters", None, "Messages Pub/Sub gave up on"),
)

def object_prefix_filter(prefix: str) -> str:
    """The filter of Cloud Storage notifications for objects under `prefix` (the `objectId` attribute,
    https://cloud.google.com/storage/docs/pubsub-notifications#attributes)."""
    return f'hasPrefix(attributes.objectId, "{prefix}")'


SUBSCRIPTIONS: tuple[Subscription, ...] = (
    Subscription("scheduler-jobs", "jobs", "scheduler", "/push/jobs"),
    Subscription("scheduler-fleet-events", "fleet-events", "scheduler", "/push/fleet-events"),
    Subscription("scheduler-attempt-events", "attempt-events", "scheduler", "/push/attempt-events"),
    Subscription("scheduler-ticks", "ticks-scheduler", "scheduler", "/push/ticks"),
    Subscription("scheduler-cancels", "cancels", "scheduler", "/push/cancels"),
    # The runner bucket's two notification configs publish to one topic: each subscription takes its own prefix
    # (a status object pushed to the scheduler, or a job file to the executor, is a wasted request).
    Subscription("scheduler-gcs-submit", "gcs-events", "scheduler", "/push/gcs-submit",
                 filter=object_prefix_filter(SUBMIT_PREFIX)),
    Subscription("claimer-capacity", "capacity", "claimer", "/push/capacity"),
    Subscription("claimer-ticks", "ticks-claimer", "claimer", "/push/ticks"),
    # A start (bundle download and extract on every worker) can take minutes; 600 s is Pub/Sub's maximum.
    Subscription("executor-assignments", "assignments", "executor", "/push/assignments", ack_deadline_seconds=600),
    Subscription("executor-gcs-status", "gcs-events", "executor", "/push/gcs-status",
                 filter=object_prefix_filter(STATUS_NOTIFICATION_PREFIX)),
    Subscription("executor-ticks", "ticks-executor", "executor", "/push/ticks"),
    Subscription("janitor-fleet-events", "fleet-events", "janitor", "/push/fleet-events"),
    Subscription("janitor-attempt-events", "attempt-events", "janitor", "/push/attempt-events"),
    Subscription("janitor-ticks", "ticks", "janitor", "/push/ticks"),
    # A webhook that answers 429 or 5xx is tried again by Pub/Sub's redelivery, 10 s to 10 min apart (the
    # sender also waits out a Retry-After: tpuq.janitor.notify); 60 deliveries span about 9 hours before the
    # message is dead-lettered. Each delivery waits at most 10 s per destination, 10 destinations at most.
    Subscription("janitor-notifications", "notifications", "janitor", "/push/notifications",
                 ack_deadline_seconds=120, max_delivery_attempts=60, min_backoff_seconds=10,
                 max_backoff_seconds=600),
)

DEAD_LETTER_TOPIC = "dead-letters"
# The pull subscription that keeps what Pub/Sub dead-letters (a topic alone keeps nothing), for people to read:
# no service consumes it; `tpuq dead-letters`, `tpuq status` and the dashboard read it without acknowledging
# (tpuq.operations.heldletters). Deploy creates it (infra/pubsub.yaml, hold_subscriptions) with a week's retention.
DEAD_LETTER_HOLD_SUBSCRIPTION = f"{DEAD_LETTER_TOPIC}-hold"
DEAD_LETTER_HOLD_RETENTION_SECONDS = 7 * 86400


CLOCK_TOPIC = "ticks"  # Cloud Scheduler's tick and the nudges; the janitor routes them (tpuq.runtime.tickdue)


def tick_topic(service: str) -> str:
    """The topic of the ticks routed to `service` (the janitor's is the clock's own)."""
    return CLOCK_TOPIC if service == "janitor" else f"ticks-{service}"


def tick_topics() -> frozenset[str]:
    return frozenset(tick_topic(service) for service in SERVICES)


def topic(name: str) -> Topic:
    for t in TOPICS:
        if t.name == name:
            return t
    raise KeyError(f"no topic {name!r} is declared in tpuq.contracts.topology")


def subscriptions_for(service: str) -> list[Subscription]:
    return [s for s in SUBSCRIPTIONS if s.service == service]


def subscription_by_path(service: str, path: str) -> Subscription | None:
    path = "/" + path.strip("/")
    return next((s for s in subscriptions_for(service) if s.path == path), None)


def never_expires() -> dict:
    """A subscription's `expirationPolicy` that keeps it for good.

    pubsub v1 discovery, Subscription.expirationPolicy: "If expiration_policy is not set, a default policy with ttl
    of 31 days will be used ... If expiration_policy is set, but expiration_policy.ttl is not set, the subscription
    never expires." Activity is a successful push, so a subscription whose topic is quiet for a month (cancels,
    capacity in an idle fleet) would be deleted, and what is published to it afterwards lost.
    """
    return {}


def subscription_body(sub: Subscription, project: str, endpoint: str | None) -> dict:
    """The Pub/Sub REST body for one declared subscription: the local stack creates it, deploy adds the OIDC token."""
    body: dict = {
        "topic": f"projects/{project}/topics/{sub.topic}",
        "ackDeadlineSeconds": sub.ack_deadline_seconds,
        "retryPolicy": {
            "minimumBackoff": f"{sub.min_backoff_seconds}s",
            "maximumBackoff": f"{sub.max_backoff_seconds}s",
        },
        "deadLetterPolicy": {
            "deadLetterTopic": f"projects/{project}/topics/{DEAD_LETTER_TOPIC}",
            "maxDeliveryAttempts": sub.max_delivery_attempts,
        },
        "expirationPolicy": never_expires(),
    }
    if sub.filter:
        body["filter"] = sub.filter
    if endpoint:
        body["pushConfig"] = {"pushEndpoint": endpoint.rstrip("/") + sub.path}
    return body
