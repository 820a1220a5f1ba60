"""Cloud clients, created lazily and passed in.

Nothing connects at import time. A `Clients` is built from the environment
(the same variables `tpuq dev env` prints, or the deployed service's env) and
each client is created on first use. Tests build their own `Clients`.
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pydantic import BaseModel

ENV_PROJECT = "GOOGLE_CLOUD_PROJECT"
ENV_TPU_ENDPOINT = "TPUQ_TPU_API_ENDPOINT"
ENV_CLOUDQUOTAS_ENDPOINT = "TPUQ_CLOUDQUOTAS_API_ENDPOINT"  # the quota pre-check's Cloud Quotas API (tpuq.capacity.cloudchecks)
ENV_CLOUDBILLING_ENDPOINT = "TPUQ_CLOUDBILLING_API_ENDPOINT"  # ... and Cloud Billing API
ENV_TOPIC_PREFIX = "TPUQ_TOPIC_PREFIX"  # tests isolate themselves with a prefix
ENV_RUNNER_BUCKET = "TPUQ_RUNNER_BUCKET"


@dataclass
class Settings:
    project: str
    tpu_endpoint: str | None = None
    quotas_endpoint: str | None = None
    billing_endpoint: str | None = None
    topic_prefix: str = ""
    runner_bucket: str | None = None
    storage_emulator: str | None = None
    pubsub_emulator: str | None = None
    firestore_emulator: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        project = env.get(ENV_PROJECT) or env.get("GCLOUD_PROJECT") or "tpuq-local"
        return cls(
            project=project,
            tpu_endpoint=env.get(ENV_TPU_ENDPOINT) or None,
            quotas_endpoint=env.get(ENV_CLOUDQUOTAS_ENDPOINT) or None,
            billing_endpoint=env.get(ENV_CLOUDBILLING_ENDPOINT) or None,
            topic_prefix=env.get(ENV_TOPIC_PREFIX, ""),
            runner_bucket=env.get(ENV_RUNNER_BUCKET) or None,
            storage_emulator=env.get("STORAGE_EMULATOR_HOST") or None,
            pubsub_emulator=env.get("PUBSUB_EMULATOR_HOST") or None,
            firestore_emulator=env.get("FIRESTORE_EMULATOR_HOST") or None,
        )

    @property
    def emulator_env(self) -> dict[str, str | None]:
        return {
            "PUBSUB_EMULATOR_HOST": self.pubsub_emulator,
            "FIRESTORE_EMULATOR_HOST": self.firestore_emulator,
            "STORAGE_EMULATOR_HOST": self.storage_emulator,
        }

    def topic_path(self, name: str) -> str:
        return f"projects/{self.project}/topics/{self.topic_prefix}{name}"

    def subscription_path(self, name: str) -> str:
        return f"projects/{self.project}/subscriptions/{self.topic_prefix}{name}"


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


@dataclass
class Clients:
    """Lazily created clients. Thread-safe enough for Flask's threaded server."""

    settings: Settings = field(default_factory=Settings.from_env)

    @cached_property
    def firestore(self):
        from google.cloud import firestore

        with _environment(self.settings.emulator_env):
            return firestore.Client(project=self.settings.project)

    @cached_property
    def publisher(self):
        from google.cloud import pubsub_v1

        # One message per batch: ~1.6 ms per publish instead of ~10 ms of batching delay.
        with _environment(self.settings.emulator_env):
            return pubsub_v1.PublisherClient(batch_settings=pubsub_v1.types.BatchSettings(max_messages=1))

    @cached_property
    def subscriber(self):
        """Only people's reads use it: the dead letters Pub/Sub keeps in the hold subscription (tpuq.operations.heldletters)."""
        from google.cloud import pubsub_v1

        with _environment(self.settings.emulator_env):
            return pubsub_v1.SubscriberClient()

    @cached_property
    def storage(self):
        from google.cloud import storage

        with _environment(self.settings.emulator_env):
            if self.settings.storage_emulator:
                from google.auth.credentials import AnonymousCredentials

                return storage.Client(project=self.settings.project, credentials=AnonymousCredentials())
            return storage.Client(project=self.settings.project)

    @cached_property
    def tpu(self):
        from google.cloud import tpu_v2

        endpoint = self.settings.tpu_endpoint
        if endpoint:
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials

            return tpu_v2.TpuClient(
                transport="rest",
                credentials=AnonymousCredentials(),
                client_options=ClientOptions(api_endpoint=endpoint),
            )
        return tpu_v2.TpuClient(transport="rest")

    def publish(self, topic: str, message: BaseModel | dict[str, Any], **attributes: str) -> str:
        """Publish a model as JSON to a declared topic; returns the message id."""
        if isinstance(message, BaseModel):
            data = message.model_dump_json(exclude_none=True).encode()
        else:
            data = json.dumps(message).encode()
        future = self.publisher.publish(self.settings.topic_path(topic), data, **attributes)
        return future.result(timeout=30)
