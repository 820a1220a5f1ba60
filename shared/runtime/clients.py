"""Cloud clients, created lazily and passed in.

Nothing connects at import time. A `Clients` is built from a `Settings` (tpuq.runtime.settings: the variables
`tpuq dev env` prints, or the deployed service's env, read once) and each client is created on first use.
Tests build their own `Clients`.
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel

from tpuq.runtime.httppool import widen_rest_client
from tpuq.runtime.settings import Settings  # what the clients connect to is part of the one settings object

_CONSTRUCTION_LOCK = threading.Lock()


@contextmanager
def _environment(values: dict[str, str | None]):
    """Google's clients read the *_EMULATOR_HOST variables once, when constructed. Construct them under
    exactly these Settings' values, so that two Clients in one process (tests, tools) never cross over."""
    with _CONSTRUCTION_LOCK:
        saved = {k: os.environ.get(k) for k in values}
        try:
            _set_environ(values)
            yield
        finally:
            _set_environ(saved)


def _set_environ(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


KINDS = ("firestore", "publisher", "subscriber", "storage", "tpu")


class Clients:
    """The cloud clients of one process, each created on first use from `settings` (thread-safe: Flask's threaded
    server and a service's concurrent requests share one). A client passed in is used as it is instead: tests and
    the simulator pass their in-memory stand-ins (`Clients(settings, firestore=MemoryFirestore(...))`)."""

    def __init__(self, settings: Settings, **given: Any):
        unknown = sorted(set(given) - set(KINDS))
        if unknown:
            raise TypeError(f"Clients: no client called {', '.join(unknown)} (one of {', '.join(KINDS)})")
        self.settings = settings
        self._made: dict[str, Any] = dict(given)
        self._lock = threading.Lock()

    def _client(self, kind: str, make) -> Any:
        made = self._made.get(kind)
        if made is None:
            with self._lock:
                made = self._made.get(kind)
                if made is None:
                    made = self._made[kind] = make()
        return made

    @property
    def firestore(self):
        return self._client("firestore", self._new_firestore)

    @property
    def publisher(self):
        return self._client("publisher", self._new_publisher)

    @property
    def subscriber(self):
        """Only people's reads use it: the dead letters Pub/Sub keeps in the hold subscription (tpuq.operations.heldletters)."""
        return self._client("subscriber", self._new_subscriber)

    @property
    def storage(self):
        return self._client("storage", self._new_storage)

    @property
    def tpu(self):
        return self._client("tpu", self._new_tpu)

    def _new_firestore(self):
        from google.cloud import firestore

        with _environment(self.settings.emulator_env):
            return firestore.Client(project=self.settings.project)

    def _new_publisher(self):
        from google.cloud import pubsub_v1

        # One message per batch: ~1.6 ms per publish instead of ~10 ms of batching delay.
        with _environment(self.settings.emulator_env):
            return pubsub_v1.PublisherClient(batch_settings=pubsub_v1.types.BatchSettings(max_messages=1))

    def _new_subscriber(self):
        from google.cloud import pubsub_v1

        with _environment(self.settings.emulator_env):
            return pubsub_v1.SubscriberClient()

    def _new_storage(self):
        from google.cloud import storage

        with _environment(self.settings.emulator_env):
            if self.settings.storage_emulator:
                from google.auth.credentials import AnonymousCredentials

                return storage.Client(project=self.settings.project, credentials=AnonymousCredentials())
            return storage.Client(project=self.settings.project)

    def _new_tpu(self):
        from google.cloud import tpu_v2

        endpoint = self.settings.tpu_endpoint
        if endpoint:
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials

            return widen_rest_client(tpu_v2.TpuClient(
                transport="rest",
                credentials=AnonymousCredentials(),
                client_options=ClientOptions(api_endpoint=endpoint),
            ))
        return widen_rest_client(tpu_v2.TpuClient(transport="rest"))

    def publish(self, topic: str, message: BaseModel | dict[str, Any], **attributes: str) -> str:
        """Publish a model as JSON to a declared topic; returns the message id."""
        if isinstance(message, BaseModel):
            data = message.model_dump_json(exclude_none=True).encode()
        else:
            data = json.dumps(message).encode()
        future = self.publisher.publish(self.settings.topic_path(topic), data, **attributes)
        return future.result(timeout=30)
