"""An in-memory Pub/Sub publisher with `google.cloud.pubsub_v1.PublisherClient.publish`'s call shape.

What it keeps of Pub/Sub's behaviour, because our code would notice:
- `data` must be bytes and attribute values text, or `publish` raises
  TypeError, as the real client does before anything is sent;
- publishing to a topic that is not declared fails (NotFound from the
  future's `result()`), when the stub is given the declared topics;
- every publish gets a distinct message id, returned by `result()`.
Messages are kept in publish order; `take(topic)` hands over (and forgets)
what was published to a topic since the last take, the way a test's pull
subscription would.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Iterable

from google.api_core.exceptions import NotFound


@dataclass(frozen=True)
class PublishedMessage:
    topic: str  # the full path, projects/{project}/topics/{name}
    data: bytes
    attributes: dict[str, str] = field(default_factory=dict)
    message_id: str = ""


class _Published:
    """The future `publish` returns, already resolved."""

    def __init__(self, message_id: str | None, error: Exception | None = None):
        self._message_id, self._error = message_id, error

    def result(self, timeout: float | None = None) -> str:
        if self._error is not None:
            raise self._error
        assert self._message_id is not None
        return self._message_id

    def done(self) -> bool:
        return True

    def exception(self, timeout: float | None = None) -> Exception | None:
        return self._error


class MemoryPublisher:
    def __init__(self, topics: Iterable[str] | None = None):
        """`topics`: the full paths of the declared topics; None accepts any topic."""
        self.topics = None if topics is None else set(topics)
        self.messages: list[PublishedMessage] = []
        self._taken: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    @staticmethod
    def topic_path(project: str, topic: str) -> str:
        return f"projects/{project}/topics/{topic}"

    def publish(self, topic: str, data: bytes, ordering_key: str = "", retry=None, timeout=None,
                **attrs: str) -> _Published:
        if not isinstance(data, bytes):
            raise TypeError("Data being published to Pub/Sub must be sent as a bytestring.")
        if any(not isinstance(v, str) for v in attrs.values()):
            raise TypeError("All attributes being published to Pub/Sub must be sent as text strings.")
        if self.topics is not None and topic not in self.topics:
            return _Published(None, NotFound(f"Resource not found (resource={topic})."))
        with self._lock:
            message = PublishedMessage(topic, data, dict(attrs), str(next(self._ids)))
            self.messages.append(message)
        return _Published(message.message_id)

    def take(self, topic: str) -> list[PublishedMessage]:
        """What was published to `topic` (a full path) since the last take, in publish order."""
        with self._lock:
            on_topic = [m for m in self.messages if m.topic == topic]
            start = self._taken.get(topic, 0)
            self._taken[topic] = len(on_topic)
            return on_topic[start:]
