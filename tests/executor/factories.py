"""Assignments and jobs for the executor tests."""

from __future__ import annotations

import io
import tarfile
from datetime import datetime, timezone

from tpuq.contracts.messages import Assignment, WorkerEndpoint

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def make_assignment(
    *,
    job_id: str = "job-1",
    attempt: int = 1,
    attempt_id: str | None = None,
    hosts: int = 2,
    endpoints: list[WorkerEndpoint] | None = None,
    command: str = "echo hello",
    env: dict | None = None,
    bundle: str | None = None,
    caches: list[dict] | None = None,
    bucket: str = "jobs-us-central2",
    job_bucket: str | None = None,
    preemptions: int = 0,
    resuming: bool = False,
    max_duration: str | int | None = None,
) -> Assignment:
    if endpoints is None:
        endpoints = [WorkerEndpoint(worker_id=i, ip=f"10.0.0.{i + 2}") for i in range(hosts)]
    job = {
        "id": job_id,
        "tpu": "v4-32",
        "buckets": [f"gs://{bucket}"],
        "command": command,
        "env": env or {},
        "caches": caches or [],
    }
    if bundle:
        job["bundle"] = bundle
    if max_duration is not None:
        job["max_duration"] = max_duration
    return Assignment.model_validate(
        {
            "job_id": job_id,
            "attempt": attempt,
            "attempt_id": attempt_id or f"{job_id}-a{attempt}",
            "node": "projects/p/locations/us-central2-b/nodes/n1",
            "zone": "us-central2-b",
            "endpoints": [e.model_dump() for e in endpoints],
            "job": job,
            "job_bucket": job_bucket,
            "preemptions": preemptions,
            "resuming": resuming,
            "at": T0,
        }
    )


def upload_bundle(gcs, bucket: str, files: dict[str, bytes], name: str = "bundles/b.tar.gz", extra=()) -> str:
    """A .tar.gz of `files` (plus raw TarInfo `extra` members) in the fake GCS; returns its gs:// URI."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    gcs.upload(bucket, name, buf.getvalue())
    return f"gs://{bucket}/{name}"
