"""Pub/Sub in process: every subscription of `tpuq.contracts.topology` pushes to its service's `Service.deliver`.

What it keeps of Pub/Sub push, because the services would notice:
- at least once: with `duplicate_probability` a message is delivered a second time, `duplicate_delay` later;
- a push that answers 5xx is redelivered after the subscription's exponential backoff (min..max), and the
  service's own delivery count dead-letters it after `max_delivery_attempts`, as in production;
- no order between subscriptions or messages: each delivery waits its own latency.
Deliveries are events of the loop, so a handler never runs inside another one.

Randomness is keyed, not streamed: a delivery's latency, its duplicate, and the `rng` its handler gets are drawn
from (seed, subscription, message id, attempt), and ticks are numbered apart from other messages. So a run's
messages and their randomness do not depend on how many ticks ran: skipping a quiet tick changes nothing else.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

from tpuq.contracts import topology
from tpuq_dev.inmemory.pubsub import _Published
from tpuq_dev.pubsubfilter import compile_filter
from tpuq.runtime.service import PushMessage, Service

from .events import EventLoop
from .waits import Waits


@dataclass(frozen=True)
class Delivery:
    latency: float = 0.05  # seconds from publish to push, mean (exponential)
    duplicate_probability: float = 0.0
    duplicate_delay: float = 10.0  # mean seconds before the duplicate (exponential)


QUIET = object()  # a tick push the observer knows would be quiet: not pushed


class KeyedRandom(random.Random):
    """`random.Random(key)`, seeded when first drawn from rather than when made: the same numbers (every draw goes
    through `random` or `getrandbits`), without seeding a generator for each of the many handlings that draw
    nothing."""

    def __init__(self, key: str) -> None:  # (random.Random.__init__ would seed now)
        self._key: str | None = key
        self.gauss_next = None

    def _seeded(self) -> None:
        key, self._key = self._key, None
        random.Random.seed(self, key)

    def random(self) -> float:
        if self._key is not None:
            self._seeded()
        return super().random()

    def getrandbits(self, k: int) -> int:
        if self._key is not None:
            self._seeded()
        return super().getrandbits(k)

    def getstate(self):
        if self._key is not None:
            self._seeded()
        return super().getstate()

    def seed(self, a=None, version: int = 2) -> None:
        self._key = None
        super().seed(a, version)

    def setstate(self, state) -> None:
        self._key = None
        super().setstate(state)


class DeliveryObserver(Protocol):
    def tick_push(self, subscription: str, message_id: str) -> object:
        """A tick is about to be pushed to `subscription`; the token comes back with its answer. `QUIET`: the
        push would change nothing and is not made."""

    def tick_answered(self, token: object, status: int) -> None: ...


class SimBus:
    """`clients.publisher` for the services: `publish(topic_path, data, **attributes)` as the real client."""

    TICK_IDS_FROM = 10 ** 12  # ticks' message ids, apart from the others'

    def __init__(self, loop: EventLoop, services: dict[str, Service], seed: int,
                 delivery: Delivery = Delivery(), topic_prefix: str = "", observer: "DeliveryObserver | None" = None,
                 waits: Waits | None = None, waiting_topics: frozenset[str] | set[str] = frozenset(),
                 handling: Callable[[str], AbstractContextManager] | None = None) -> None:
        """`observer` (a `DeliveryObserver`) is told of every tick push before and after it, so that its handling
        can be judged quiet or not (and skipped when it would be). `waits` runs the pushes of `waiting_topics`,
        whose handlers may wait (simulate.waits). Each push's handler runs inside `handling(subscription)`
        (`simulate.storeops` counts the store's operations by subscription so)."""
        self.observer = observer
        self.handling = handling or (lambda subscription: nullcontext())
        self.loop, self.services, self.seed, self.delivery = loop, services, seed, delivery
        self.waits, self.waiting_topics = waits, frozenset(waiting_topics)
        self.topic_prefix = topic_prefix
        self._ids = itertools.count(1)
        self.published: Counter[str] = Counter()
        self.delivered: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.serve(services)

    def serve(self, services: dict[str, Service]) -> None:
        """Deliver to these services (a bus is made before the services that publish on it)."""
        self.services = services
        self._subs: dict[str, list[topology.Subscription]] = {}
        self._filters = {sub.name: compile_filter(sub.filter) for sub in topology.SUBSCRIPTIONS}
        for sub in topology.SUBSCRIPTIONS:
            if sub.service in services:
                self._subs.setdefault(sub.topic, []).append(sub)

    def publish(self, topic: str, data: bytes, ordering_key: str = "", retry=None, timeout=None,
                **attributes: str) -> _Published:
        if not isinstance(data, bytes):
            raise TypeError("Data being published to Pub/Sub must be sent as a bytestring.")
        name = topic.rsplit("/", 1)[-1].removeprefix(self.topic_prefix)
        message_id = attributes.pop("_sim_message_id", None) or str(next(self._ids))
        self.published[name] += 1
        for sub in self._subs.get(name, ()):
            if not self._filters[sub.name](attributes):
                continue  # acknowledged by Pub/Sub itself, never pushed (tpuq_dev.pubsubfilter)
            msg = PushMessage(message_id, data, dict(attributes), self.loop.utcnow(), sub.name)
            for delay in self._delays(sub.name, message_id):
                self.loop.after(delay, self._deliver, sub, msg, 1)
        return _Published(message_id)

    def subscriptions_of(self, topic: str) -> set[str]:
        return {sub.name for sub in self._subs.get(topic, ())}

    def _delays(self, subscription: str, message_id: str) -> list[float]:
        """When (after its publish) a message reaches a subscription's push endpoint: once, or twice."""
        rng = self.rng_for(subscription, message_id, 0)
        delays = [self._latency(rng)]
        if self.delivery.duplicate_probability and rng.random() < self.delivery.duplicate_probability:
            delays.append(self._latency(rng) + rng.expovariate(1 / self.delivery.duplicate_delay))
        return delays

    def publish_tick(self, data: bytes, number: int) -> str:
        """Tick `number` (the n-th period of the run, whether the ticks before it ran or not) has its own id."""
        return self.publish("ticks", data, _sim_message_id=self.tick_id(number)).result()

    def tick_id(self, number: int) -> str:
        return str(self.TICK_IDS_FROM + number)

    def rng_for(self, subscription: str, message_id: str, attempt: int) -> random.Random:
        return random.Random(self._rng_key(subscription, message_id, attempt))

    def _rng_key(self, subscription: str, message_id: str, attempt: int) -> str:
        return f"{self.seed}:{subscription}:{message_id}:{attempt}"

    def _latency(self, rng: random.Random) -> float:
        mean = self.delivery.latency
        return rng.expovariate(1 / mean) if mean > 0 else 0.0

    def _deliver(self, sub: topology.Subscription, msg: PushMessage, attempt: int) -> None:
        self.delivered[sub.name] += 1
        service = self.services[sub.service]

        def push():
            # The handler's randomness, keyed too (seeded only if the handler draws: most never do).
            service.rng = KeyedRandom(self._rng_key(sub.name, msg.message_id, attempt))
            with self.handling(sub.name):
                return service.deliver(sub, PushMessage(
                    msg.message_id, msg.data, msg.attributes, msg.publish_time, msg.subscription, attempt))

        observer = self.observer
        if self.waits is not None and sub.topic in self.waiting_topics:
            self.waits.run(push, lambda answer: self._answered(sub, msg, attempt, answer[1]))
            return
        if observer is None or sub.topic not in topology.tick_topics():
            _, status = push()
        else:
            token = observer.tick_push(sub.name, msg.message_id)
            if token is QUIET:
                return  # its handling would change nothing: as if pushed and answered 204
            _, status = push()
            observer.tick_answered(token, status)
        self._answered(sub, msg, attempt, status)

    def _answered(self, sub: topology.Subscription, msg: PushMessage, attempt: int, status: int) -> None:
        if status >= 500:
            self.failed[sub.name] += 1
            backoff = min(sub.max_backoff_seconds, sub.min_backoff_seconds * 2 ** (attempt - 1))
            self.loop.after(backoff, self._deliver, sub, msg, attempt + 1)
