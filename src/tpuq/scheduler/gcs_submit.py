"""Submitting by upload: a job file put under `submit/` in the runner bucket is validated and published.

The result is written next to the file, so the uploader finds it where they looked:
`submit/x.yaml` -> `submit/x.yaml.result.json` with {"job_ids": [...]} or {"error": "field: reason"}.
A bundle directory is not a thing in a bucket: the job's `bundle` is a gs:// URI (uploaded beside the
job file, e.g. `submit/x.tar.gz`), or a path relative to the job file's folder in the same bucket.
"""

from __future__ import annotations

import json

import yaml
from pydantic import ValidationError

from tpuq.errors import describe_validation_error
from tpuq.jobspec import JobFile, PublishedJob
from tpuq.messages import GcsObjectEvent
from tpuq.service import Context

SUBMIT_PREFIX = "submit/"
RESULT_SUFFIX = ".result.json"
JOB_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def is_job_file(name: str) -> bool:
    return name.startswith(SUBMIT_PREFIX) and name.endswith(JOB_FILE_SUFFIXES) and not name.endswith(RESULT_SUFFIX)


def parse_job_file(text: str, bucket: str, name: str, generation: str) -> list[PublishedJob]:
    """Pure: the job file's text -> the jobs to publish, or ValueError('field: reason')."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ValueError("the job file must be a mapping with a `jobs:` list")
    try:
        jobs = JobFile.model_validate(data)
    except ValidationError as e:
        raise ValueError(describe_validation_error(e)[1]) from None
    folder = name.rsplit("/", 1)[0]
    out = []
    for i, spec in enumerate(jobs.jobs):
        data = spec.model_dump(mode="json", exclude_none=True)
        if spec.bundle and not spec.bundle.startswith("gs://"):
            data["bundle"] = f"gs://{bucket}/{folder}/{spec.bundle.lstrip('./')}"
        # The object generation makes ids stable under redelivery and fresh for a re-upload.
        data.setdefault("id", f"gcs-{generation}-{i}"[:63])
        try:
            out.append(PublishedJob.model_validate(data))
        except ValidationError as e:
            raise ValueError(describe_validation_error(e, prefix=f"jobs[{i}]")[1]) from None
    return out


def on_object_finalized(event: GcsObjectEvent, ctx: Context) -> None:
    if not is_job_file(event.name):
        return  # bundles, results and everything else in the bucket
    bucket = ctx.clients.storage.bucket(event.bucket)
    result_blob = bucket.blob(event.name + RESULT_SUFFIX)
    generation = str(event.generation or "0")
    try:
        text = bucket.blob(event.name).download_as_bytes().decode()
        jobs = parse_job_file(text, event.bucket, event.name, generation)
    except ValueError as e:
        result = {"error": str(e), "object": event.name, "generation": generation}
    except UnicodeDecodeError:
        result = {"error": "the job file is not UTF-8 text", "object": event.name, "generation": generation}
    else:
        for job in jobs:
            ctx.publish("jobs", job, source="gcs")
        result = {"job_ids": [j.id for j in jobs], "object": event.name, "generation": generation}
    result_blob.upload_from_string(json.dumps(result, indent=2), content_type="application/json")
