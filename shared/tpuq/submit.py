"""`tpuq submit`: bundle, upload once per candidate regional bucket, then publish each job."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from tpuq.bundle import Bundle, make_bundle
from tpuq.clients import Clients
from tpuq.jobspec import JobFile, JobSpec, PublishedJob, split_gs_uri


@dataclass
class PreparedJob:
    spec: JobSpec
    bundle: Bundle | None
    buckets: list[str]  # where the bundle goes: every regional bucket of the job, else the runner bucket


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "job"


def new_job_id(spec: JobSpec, job_file: Path, rng: random.Random) -> str:
    base = _slug(spec.name or job_file.resolve().parent.name)
    return f"{base}-{rng.getrandbits(32):08x}"


def prepare(job_file: Path, jobs: JobFile, runner_bucket: str | None, rng: random.Random) -> list[PreparedJob]:
    base_dir = job_file.resolve().parent
    bundles: dict[Path, Bundle] = {}  # several jobs often share one directory: bundle it once
    prepared = []
    for spec in jobs.jobs:
        bundle = None
        if spec.bundle is not None and not spec.bundle.startswith("gs://"):
            directory = (base_dir / spec.bundle).resolve()
            if directory not in bundles:
                bundles[directory] = make_bundle(directory)
            bundle = bundles[directory]
        buckets = [b.uri for b in spec.buckets]
        if not buckets and bundle is not None:
            if not runner_bucket:
                raise ValueError("the job lists no buckets and no runner bucket is configured (TPUQ_RUNNER_BUCKET)")
            buckets = [runner_bucket if runner_bucket.startswith("gs://") else f"gs://{runner_bucket}"]
        job_id = spec.id or new_job_id(spec, job_file, rng)
        prepared.append(PreparedJob(spec.model_copy(update={"id": job_id}), bundle, buckets))
    return prepared


def upload_bundle(storage, bundle: Bundle, buckets: list[str]) -> str:
    """Upload to every bucket unless already there (does-not-exist precondition); returns the first copy's URI."""
    from google.api_core.exceptions import PreconditionFailed

    for uri in buckets:
        bucket_name, _ = split_gs_uri(uri)
        blob = storage.bucket(bucket_name).blob(bundle.object_name)
        try:
            blob.upload_from_string(bundle.data, content_type="application/gzip", if_generation_match=0)
        except PreconditionFailed:
            pass  # same content, same name: already uploaded
    return f"{buckets[0]}/{bundle.object_name}"


def submit_prepared(clients: Clients, prepared: list[PreparedJob]) -> list[str]:
    ids = []
    for p in prepared:
        spec = p.spec
        bundle_uri = upload_bundle(clients.storage, p.bundle, p.buckets) if p.bundle else spec.bundle
        job = PublishedJob.model_validate({**spec.model_dump(mode="json", exclude_none=True), "bundle": bundle_uri})
        clients.publish("jobs", job, source="cli")
        ids.append(job.id)
    return ids
