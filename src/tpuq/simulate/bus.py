"""Pub/Sub in process: every subscription of `tpuq.topology` pushes to its service's `Service.deliver`.

What it keeps of Pub/Sub push, because the services would notice:
- at least once: with `duplicate_probability` a message is delivered a second time, `duplicate_delay` later;
- a push that answers 5xx is redelivered after the subscription's exponential backoff (min..max), and the
  service's own delivery count dead-letters it after `max_delivery_attempts`, as in production;
- no order between subscriptions or messages: each delivery waits its own latency, drawn from the run's RNG.
Deliveries are events of the loop, so a handler never runs inside another one.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass

from tpuq import topology
from tpuq.inmemory.pubsub import _Published
from tpuq.service import PushMessage, Service

from .events import EventLoop
from .waits import Waits


@dataclass(frozen=True)
class Delivery:
    latency: float = 0.05  # seconds from publish to push, mean (exponential)
    duplicate_probability: float = 0.0
    duplicate_delay: float = 10.0  # mean seconds before the duplicate (exponential)


class SimBus:
    """`clients.publisher` for the services: `publish(topic_path, data, **attributes)` as the real client."""

    def __init__(self, loop: EventLoop, services: dict[str, Service], rng: random.Random,
                 delivery: Delivery = Delivery(), topic_prefix: str = "", waits: Waits | None = None,
                 waiting_topics: frozenset[str] | set[str] = frozenset()) -> None:
        self.loop, self.services, self.rng, self.delivery = loop, services, rng, delivery
        self.waits, self.waiting_topics = waits, frozenset(waiting_topics)  # pushes whose handler may wait
        self.topic_prefix = topic_prefix
        self._ids = itertools.count(1)
        self.published: Counter[str] = Counter()
        self.delivered: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self._subs: dict[str, list[topology.Subscription]] = {}
        for sub in topology.SUBSCRIPTIONS:
            if sub.service in services:
                self._subs.setdefault(sub.topic, []).append(sub)

    def publish(self, topic: str, data: bytes, ordering_key: str = "", retry=None, timeout=None,
                **attributes: str) -> _Published:
        if not isinstance(data, bytes):
            raise TypeError("Data being published to Pub/Sub must be sent as a bytestring.")
        name = topic.rsplit("/", 1)[-1].removeprefix(self.topic_prefix)
        message_id = str(next(self._ids))
        self.published[name] += 1
        for sub in self._subs.get(name, ()):
            msg = PushMessage(message_id, data, dict(attributes), self.loop.utcnow(), sub.name)
            self.loop.after(self._latency(), self._deliver, sub, msg, 1)
            if self.delivery.duplicate_probability and self.rng.random() < self.delivery.duplicate_probability:
                self.loop.after(self._latency() + self.rng.expovariate(1 / self.delivery.duplicate_delay),
                                self._deliver, sub, msg, 1)
        return _Published(message_id)

    def _latency(self) -> float:
        mean = self.delivery.latency
        return self.rng.expovariate(1 / mean) if mean > 0 else 0.0

    def _deliver(self, sub: topology.Subscription, msg: PushMessage, attempt: int) -> None:
        self.delivered[sub.name] += 1

        def push():
            return self.services[sub.service].deliver(sub, PushMessage(
                msg.message_id, msg.data, msg.attributes, msg.publish_time, msg.subscription, attempt))

        if self.waits is not None and sub.topic in self.waiting_topics:
            self.waits.run(push, lambda answer: self._answered(sub, msg, attempt, answer))
        else:
            self._answered(sub, msg, attempt, push())

    def _answered(self, sub: topology.Subscription, msg: PushMessage, attempt: int, answer) -> None:
        _, status = answer
        if status >= 500:
            self.failed[sub.name] += 1
            backoff = min(sub.max_backoff_seconds, sub.min_backoff_seconds * 2 ** (attempt - 1))
            self.loop.after(backoff, self._deliver, sub, msg, attempt + 1)
