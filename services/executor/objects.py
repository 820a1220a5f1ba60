"""The few GCS operations the executor does itself (the workers talk to GCS on their own)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True)
class StoredObject:
    data: bytes
    created: datetime | None  # the server's creation time: a clock every worker agrees on


class ObjectStore(Protocol):
    def list_names(self, bucket: str, prefix: str) -> list[str]: ...

    def read(self, bucket: str, name: str) -> StoredObject | None:
        """None when the object does not exist."""
        ...

    def create(self, bucket: str, name: str, data: bytes, content_type: str) -> bool:
        """Write only if absent (ifGenerationMatch=0); False when it already existed."""
        ...


class GcsObjectStore:
    """ObjectStore over google-cloud-storage (`tpuq.runtime.clients.Clients.storage()` gives the client)."""

    def __init__(self, client) -> None:
        self._client = client

    def list_names(self, bucket: str, prefix: str) -> list[str]:
        return sorted(b.name for b in self._client.list_blobs(bucket, prefix=prefix))

    def read(self, bucket: str, name: str) -> StoredObject | None:
        from google.api_core import exceptions as gexc

        blob = self._client.bucket(bucket).get_blob(name)
        if blob is None:
            return None
        try:
            data = blob.download_as_bytes(if_generation_match=blob.generation)
        except gexc.NotFound:
            return None
        return StoredObject(data, blob.time_created)

    def create(self, bucket: str, name: str, data: bytes, content_type: str) -> bool:
        from google.api_core import exceptions as gexc

        try:
            self._client.bucket(bucket).blob(name).upload_from_string(
                data, content_type=content_type, if_generation_match=0
            )
            return True
        except gexc.PreconditionFailed:
            return False
