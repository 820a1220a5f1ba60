"""The few google-cloud-storage calls the bucket-upload path makes (tpuq.scheduler.gcs_submit, tpuq.operations.submit), in
memory: `client.bucket(name)`, `bucket.blob(name)`, `bucket.list_blobs(prefix=)`, `blob.download_as_bytes()`,
`blob.download_to_filename()`, `blob.upload_from_string(data, content_type=, if_generation_match=)`, `blob.size`.

What it keeps of GCS, because the handler would notice: a missing object or bucket is google.api_core's NotFound;
`if_generation_match=0` on an existing object is PreconditionFailed; only the buckets created exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.api_core.exceptions import NotFound, PreconditionFailed


@dataclass
class MemoryGcs:
    buckets: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def create_bucket(self, name: str) -> None:
        self.buckets.setdefault(name, {})

    def bucket(self, name: str) -> "_Bucket":
        return _Bucket(self, name)

    def objects(self, bucket: str) -> dict[str, bytes]:
        return dict(self.buckets.get(bucket, {}))


@dataclass
class _Bucket:
    gcs: MemoryGcs
    name: str

    def _objects(self) -> dict[str, bytes]:
        if self.name not in self.gcs.buckets:
            raise NotFound(f"404 The specified bucket does not exist: {self.name}")
        return self.gcs.buckets[self.name]

    def blob(self, name: str) -> "_Blob":
        return _Blob(self, name)

    def list_blobs(self, prefix: str = ""):
        return [_Blob(self, n) for n in sorted(self._objects()) if n.startswith(prefix)]


@dataclass
class _Blob:
    bucket: _Bucket
    name: str

    @property
    def size(self) -> int | None:
        data = self.bucket._objects().get(self.name)
        return None if data is None else len(data)

    def download_as_bytes(self) -> bytes:
        objects = self.bucket._objects()
        if self.name not in objects:
            raise NotFound(f"404 No such object: {self.bucket.name}/{self.name}")
        return objects[self.name]

    def download_to_filename(self, filename: str) -> None:
        with open(filename, "wb") as f:
            f.write(self.download_as_bytes())

    def upload_from_string(self, data, content_type: str | None = None, if_generation_match: int | None = None):
        objects = self.bucket._objects()
        if if_generation_match == 0 and self.name in objects:
            raise PreconditionFailed(f"412 {self.bucket.name}/{self.name} exists")
        objects[self.name] = data.encode() if isinstance(data, str) else bytes(data)
