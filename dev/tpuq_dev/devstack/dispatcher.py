"""Pub/Sub's push delivery, which the local front (tpuq_dev.devstack.front) does in the emulator's place.

What Google does (https://cloud.google.com/pubsub/docs/push, "Push backoff" and "Delivery rate";
https://cloud.google.com/pubsub/docs/handling-failures; the Subscription reference):
- **Many pushes in flight.** "Pub/Sub adjusts the number of concurrent push requests using a slow-start
  algorithm. The maximum allowed number of concurrent push requests is the push window. The push window
  increases on any successful delivery and decreases on any failure. The system starts with a small single-digit
  window size"; it grows exponentially while pushes are acknowledged, linearly past 3,000 outstanding messages
  per region; a subscriber that acknowledges more than 99% of pushes within a second on average gets a window
  that keeps up with any publish rate. One message per push request.
- **Acknowledgement.** 102, 200, 201, 202 and 204 acknowledge; any other answer is a negative
  acknowledgement. `ackDeadlineSeconds` (10 to 600 s, 10 by default) "is also used to set the request timeout for
  the call to the push endpoint" (Subscription reference); "if you send a negative acknowledgment or the
  acknowledgment deadline expires, Pub/Sub resends the message" (while the first handler may still be running).
- **Redelivery.** With a `retryPolicy` a nacked message waits `minimumBackoff` (0-600 s, default 10 s),
  doubling on each further failure up to `maximumBackoff` (default 600 s); without one, "messages will be retried
  as soon as possible". Beside that, after negative acknowledgements or expired deadlines Pub/Sub "stops delivering
  messages for a predetermined amount of time ... between 100 milliseconds to 60 seconds" ("push backoff", for
  the whole subscription); "the total delay is the maximum combined value of both the push backoff value and the
  retry policy value".
- **Dead-lettering** (tpuq_dev.devstack.deadlettering): after `deadLetterPolicy.maxDeliveryAttempts` deliveries
  the message goes to the dead-letter topic; with a dead-letter policy every push body carries `deliveryAttempt`.

What the emulator does instead (measured, docs/ARCHITECTURE.md "Local stand-ins and production"): never more
than 2 pushes in flight per subscription, whatever the handler's speed; the retry policy ignored (a failed push
is retried about every second, and after a few failures a subscription stalls for minutes); no `deliveryAttempt`.
So locally every message waited behind one other, and the system's concurrency was never exercised.

What the dispatcher does: the emulator's push of a message to a subscription whose `pushConfig.pushEndpoint` is
one of the front's URLs is taken at once (the emulator gets 204: the message is now the dispatcher's) and
delivered by the rules above: a push window per subscription (starts at `START_WINDOW`, +1 per ack, halved per
failure, at most `MAX_WINDOW`), the ack deadline, the retry policy's back-off per message, a push backoff for the
subscription after consecutive failures, dead-lettering at the limit, and `deliveryAttempt`. Every push still
passes the front's invoker check and Cloud Run's concurrency and timeout (run_limits): a service that cannot
keep up answers 429, which shrinks the window, as in production.

What it cannot: messages it holds live in the front's memory (a front that dies loses them, where Pub/Sub keeps
them for the retention period: harsher, never more lenient); ordering keys and exactly-once delivery are not
modelled (tpuq uses neither); a changed subscription applies within `SUBSCRIPTION_TTL_SECONDS`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

log = logging.getLogger("tpuq_dev.devstack.front")

ACKNOWLEDGING = frozenset({102, 200, 201, 202, 204})  # https://cloud.google.com/pubsub/docs/push
DEFAULT_ACK_DEADLINE_SECONDS = 10.0  # Subscription.ackDeadlineSeconds when unset
START_WINDOW = 4  # "a small single-digit window size"
MAX_WINDOW = 3000  # past 3,000 outstanding Pub/Sub grows the window linearly; Cloud Run's concurrency binds first
PUSH_BACKOFF_AFTER = 3  # consecutive failures before the subscription's pushes pause
PUSH_BACKOFF_SECONDS = (0.1, 60.0)  # "This time span can range between 100 milliseconds to 60 seconds"
SUBSCRIPTION_TTL_SECONDS = 5.0  # a subscription read again after this long: changes apply within it
NO_ANSWER = 0  # the status of a push that got no answer (container down, ack deadline passed)


# ------------------------------------------------------------------------------------------ core
@dataclass(frozen=True)
class Policy:
    """What a subscription tells Pub/Sub about delivering its messages."""

    ack_deadline_seconds: float = DEFAULT_ACK_DEADLINE_SECONDS
    min_backoff_seconds: float | None = None  # None: no retry policy (redelivered at once)
    max_backoff_seconds: float = 600.0
    max_delivery_attempts: int | None = None  # None: no dead-letter policy
    dead_letter_topic: str | None = None

    @classmethod
    def of(cls, subscription: Mapping[str, Any]) -> "Policy":
        retry = subscription.get("retryPolicy")
        dead = subscription.get("deadLetterPolicy") or {}
        topic = dead.get("deadLetterTopic") or None
        return cls(
            ack_deadline_seconds=float(subscription.get("ackDeadlineSeconds") or DEFAULT_ACK_DEADLINE_SECONDS),
            min_backoff_seconds=None if retry is None else _seconds(retry.get("minimumBackoff"), 10.0),
            max_backoff_seconds=600.0 if retry is None else _seconds(retry.get("maximumBackoff"), 600.0),
            max_delivery_attempts=(int(dead.get("maxDeliveryAttempts") or 5) if topic else None),
            dead_letter_topic=topic)

    def retry_delay(self, attempts: int) -> float:
        """How long a message nacked on its `attempts`-th delivery waits before the next one."""
        if self.min_backoff_seconds is None:
            return 0.0
        return min(self.max_backoff_seconds, self.min_backoff_seconds * 2 ** max(attempts - 1, 0))

    def gives_up(self, status: int, attempts: int) -> bool:
        """Forward to the dead-letter topic: not acknowledged, and the last delivery the policy allows."""
        return (status not in ACKNOWLEDGING and self.max_delivery_attempts is not None
                and attempts >= self.max_delivery_attempts)


def _seconds(value: Any, default: float) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)s", str(value or ""))
    return float(match.group(1)) if match else default


@dataclass
class Window:
    """One subscription's push window: how many pushes may be outstanding at once."""

    size: float = START_WINDOW
    consecutive_failures: int = 0

    @property
    def allowed(self) -> int:
        return max(1, int(self.size))

    def acknowledged(self) -> None:
        self.size = min(MAX_WINDOW, self.size + 1)  # +1 per ack: the window doubles each round of pushes
        self.consecutive_failures = 0

    def failed(self) -> float:
        """Shrink; the push backoff to apply to the whole subscription (0: none)."""
        self.size = max(1.0, self.size / 2)
        self.consecutive_failures += 1
        if self.consecutive_failures < PUSH_BACKOFF_AFTER:
            return 0.0
        low, high = PUSH_BACKOFF_SECONDS
        return min(high, low * 2 ** (self.consecutive_failures - PUSH_BACKOFF_AFTER))


@dataclass
class Push:
    """One message the dispatcher holds for a subscription: what the emulator pushed, and its deliveries."""

    subscription: str
    path: str
    envelope: dict
    headers: dict
    attempts: int = 0

    @property
    def message_id(self) -> str:
        return str(self.envelope.get("message", {}).get("messageId", ""))


# ------------------------------------------------------------------------------------------ shell
@dataclass
class _Queue:
    ready: list = field(default_factory=list)  # heap of (not_before, seq, Push)
    window: Window = field(default_factory=Window)
    in_flight: int = 0
    paused_until: float = 0.0
    most_in_flight: int = 0
    delivered: int = 0
    cleared: bool = False  # dropped by `clear`: its sending thread ends, a new message starts a new queue


class PushDispatcher:
    """Delivers the pushes the front takes from the emulator: `accept` queues one, a thread per subscription sends.

    `deliver(push, policy)` makes one delivery and returns its status (NO_ANSWER for none); it runs on a thread of
    its own, and its answer counts only if it comes within the ack deadline. `policy_of(subscription)` reads the
    subscription (None: it is gone, or pushes elsewhere now: its messages are dropped, as deleting a subscription
    drops them); `dead_letter(push, policy)` publishes to the dead-letter topic (False: not published, retried)."""

    def __init__(self, deliver: Callable[[Push, Policy], int], policy_of: Callable[[str], Policy | None],
                 dead_letter: Callable[[Push, Policy], bool], clock: Callable[[], float] = time.monotonic):
        self._deliver = deliver
        self._policy_of = policy_of
        self._dead_letter = dead_letter
        self._clock = clock
        self._queues: dict[str, _Queue] = {}
        self._seq = itertools.count()
        self._changed = threading.Condition()
        self._stopped = False

    def accept(self, push: Push) -> None:
        with self._changed:
            queue = self._queues.get(push.subscription)
            if queue is None:
                queue = self._queues[push.subscription] = _Queue()
                threading.Thread(target=self._send_loop, args=(push.subscription, queue), daemon=True,
                                 name=f"push {push.subscription.rsplit('/', 1)[-1]}").start()
            heapq.heappush(queue.ready, (self._clock(), next(self._seq), push))
            self._changed.notify_all()

    def clear(self) -> int:
        """Drop every message held (the emulator was reset: its subscriptions, and their messages, are gone).
        Deliveries under way finish; their answers are ignored. How many were dropped."""
        with self._changed:
            dropped = sum(len(q.ready) + q.in_flight for q in self._queues.values())
            for queue in self._queues.values():
                queue.ready.clear()
                queue.cleared = True
            self._queues.clear()
            self._changed.notify_all()
            return dropped

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def stats(self) -> dict[str, dict[str, float]]:
        """Per subscription: the window, pushes in flight, the most ever in flight, deliveries, messages held."""
        with self._changed:
            return {name: {"window": q.window.allowed, "in_flight": q.in_flight, "most_in_flight": q.most_in_flight,
                           "delivered": q.delivered, "held": len(q.ready) + q.in_flight}
                    for name, q in self._queues.items()}

    def _send_loop(self, subscription: str, queue: _Queue) -> None:
        while True:
            with self._changed:
                push = self._next(queue)
                while push is None and not (self._stopped or queue.cleared):
                    self._changed.wait(self._wait_seconds(queue))
                    push = self._next(queue)
                if self._stopped or queue.cleared:
                    return
                queue.in_flight += 1
                queue.most_in_flight = max(queue.most_in_flight, queue.in_flight)
            threading.Thread(target=self._attempt, args=(queue, push), daemon=True).start()

    def _next(self, queue: _Queue) -> Push | None:
        now = self._clock()
        if (not queue.ready or queue.in_flight >= queue.window.allowed or now < queue.paused_until
                or queue.ready[0][0] > now):
            return None
        return heapq.heappop(queue.ready)[2]

    def _wait_seconds(self, queue: _Queue) -> float | None:
        if not queue.ready or queue.in_flight >= queue.window.allowed:
            return None  # a finished push or a new message notifies
        return max(0.001, max(queue.paused_until, queue.ready[0][0]) - self._clock())

    def _attempt(self, queue: _Queue, push: Push) -> None:
        policy = self._policy_of(push.subscription)
        if policy is None:
            log.warning("%s: message %s dropped: the subscription is gone or pushes elsewhere now", push.subscription,
                        push.message_id)
            with self._changed:
                queue.in_flight -= 1
                self._changed.notify_all()
            return
        push.attempts += 1
        status = self._within_deadline(push, policy)
        acknowledged = status in ACKNOWLEDGING
        dead_lettered = policy.gives_up(status, push.attempts) and self._dead_letter(push, policy)
        with self._changed:
            queue.in_flight -= 1
            queue.delivered += 1
            if queue.cleared:
                pass  # dropped meanwhile
            elif acknowledged:
                queue.window.acknowledged()
            else:
                pause = queue.window.failed()
                queue.paused_until = max(queue.paused_until, self._clock() + pause)
                if not dead_lettered:
                    heapq.heappush(queue.ready, (self._clock() + policy.retry_delay(push.attempts),
                                                 next(self._seq), push))
            self._changed.notify_all()

    def _within_deadline(self, push: Push, policy: Policy) -> int:
        """The delivery's status, or NO_ANSWER when none came within the ack deadline (the container keeps
        running it, as on Cloud Run; Pub/Sub has given up on that delivery)."""
        answer: dict[str, int] = {}
        done = threading.Event()

        def deliver() -> None:
            try:
                answer["status"] = self._deliver(push, policy)
            except Exception:  # noqa: BLE001 - a delivery that failed is a nack, whatever the cause
                log.exception("%s: push of message %s failed", push.subscription, push.message_id)
            finally:
                done.set()

        threading.Thread(target=deliver, daemon=True).start()
        if not done.wait(policy.ack_deadline_seconds):
            log.warning("%s: message %s not acknowledged within the ack deadline (%.0f s): delivered again",
                        push.subscription, push.message_id, policy.ack_deadline_seconds)
            return NO_ANSWER
        return answer.get("status", NO_ANSWER)


@dataclass
class Subscriptions:
    """The emulator's subscriptions as read (GET), each kept `SUBSCRIPTION_TTL_SECONDS`."""

    pubsub_host: str
    session: requests.Session
    clock: Callable[[], float] = time.monotonic
    _read: dict[str, tuple[dict | None, float]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, name: str) -> dict | None:
        """The subscription's body; None when the emulator has no such subscription; {} when it did not answer."""
        with self._lock:
            cached = self._read.get(name)
        if cached is not None and self.clock() - cached[1] < SUBSCRIPTION_TTL_SECONDS:
            return cached[0]
        try:
            answer = self.session.get(f"http://{self.pubsub_host}/v1/{name}", timeout=10)
            body = answer.json() if answer.status_code == 200 else None if answer.status_code == 404 else {}
        except (requests.RequestException, ValueError):
            return {}  # not kept: read again next time
        with self._lock:
            self._read[name] = (body, self.clock())
        return body

    def forget(self) -> None:
        with self._lock:
            self._read.clear()
