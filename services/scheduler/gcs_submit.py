"""Submitting by upload: a job file put under `submit/` in the runner bucket is validated and its jobs stored.

The result is written next to the file, so the uploader finds it where they looked:
`submit/x.yaml` -> `submit/x.yaml.result.json` with {"job_ids": [...]} or {"error": "field: reason"}. A refused
file is also a dead letter (`tpuq dead-letters --topic gcs-events`), with the field and the reason.

- Job ids: the job's `id`, else `<name>-<8 hex>` (the job's `name`, else the file's name without its suffix, as
  `tpuq submit` names jobs), the hex from the object's bucket, name and generation: the same upload always gives
  the same ids (a redelivered notification stores nothing new), a new upload of the file gives new ones.
- `bundle`: a gs:// URI, or a folder relative to the job file's folder in the bucket (`bundle: .` is the file's
  own folder). The scheduler packs that folder's objects as `tpuq submit` packs a directory (`tpuq.contracts.bundle`:
  sorted, normalised, `.tpuqignore` honoured, `*.result.json` left out), streamed from GCS to GCS
  (`tpuq.scheduler.folder_bundle`), into each of the job's buckets (else this bucket) as
  `tpuq/bundles/<sha256>.tar.gz`. A folder over `folder_bundle.MAX_FOLDER_BYTES` is refused, its size and the limit
  in the result file. Upload the folder's other files first and the job file last: the folder is read when the
  job file's notification arrives.
- The jobs are stored here, as the `jobs` topic's intake stores them (`intake.store_job`), keyed by this
  notification's message id: a redelivery finds its jobs stored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath

import yaml
from google.api_core.exceptions import Forbidden, NotFound as GcsNotFound
from pydantic import ValidationError

from tpuq.contracts import yamltext
from tpuq.contracts.bundle import BundleError
from tpuq.contracts.errors import NotFound, Permanent, describe_validation_error
from tpuq.contracts.gcslayout import SUBMIT_PREFIX
from tpuq.contracts.jobspec import JobFile, PublishedJob, job_id_base
from tpuq.contracts.messages import GcsObjectEvent
from tpuq.scheduler.folder_bundle import pack_folder, packing_name
from tpuq.scheduler.new_jobs import fleet_in_force, submit_jobs  # the jobs topic's intake, shared
from tpuq.runtime.service import Context

RESULT_SUFFIX = ".result.json"
JOB_FILE_SUFFIXES = (".yaml", ".yml", ".json")
FILE_FIELD = "(job file)"


def is_job_file(name: str) -> bool:
    return name.startswith(SUBMIT_PREFIX) and name.endswith(JOB_FILE_SUFFIXES) and not name.endswith(RESULT_SUFFIX)


def gcs_job_id(name: str | None, bucket: str, object_name: str, generation: str, index: int) -> str:
    """`<name>-<8 hex>`: deterministic for one upload (bucket, object, generation), fresh for a re-upload."""
    base = job_id_base(name or PurePosixPath(object_name).stem)
    digest = hashlib.sha256(f"gs://{bucket}/{object_name}#{generation}#{index}".encode()).hexdigest()[:8]
    return f"{base}-{digest}"


def bundle_folder(object_name: str, bundle: str) -> str | None:
    """The bucket prefix a relative `bundle` names ('submit/a/' for `bundle: .` of submit/a/job.yaml), or None
    when it leaves the job file's folder."""
    folder = PurePosixPath(object_name).parent
    parts = [p for p in (folder / bundle).parts if p not in ("", ".")]
    out: list[str] = []
    for p in parts:
        if p == "..":
            if not out:
                return None
            out.pop()
        else:
            out.append(p)
    prefix = "/".join(out)
    if not prefix.startswith(SUBMIT_PREFIX.rstrip("/")):
        return None
    return prefix + "/"


def parse_job_file(text: str, bucket: str, name: str, generation: str) -> tuple[list[PublishedJob], dict[int, str]]:
    """Pure: the job file's text -> (the jobs, with their ids; {job index: bucket folder to pack as its bundle}).
    A refusal is `Permanent` with the field and the reason."""
    try:
        data = yamltext.load(text)
    except yaml.YAMLError as e:
        raise Permanent(yamltext.error_text(e), field=FILE_FIELD) from None
    if not isinstance(data, dict):
        raise Permanent("the job file must be a mapping with a `jobs:` list", field=FILE_FIELD)
    try:
        jobs = JobFile.model_validate(data)
    except ValidationError as e:
        field, reason = describe_validation_error(e, model=JobFile)
        raise Permanent(reason, field=field) from None
    out, folders = [], {}
    for i, spec in enumerate(jobs.jobs):
        data = spec.model_dump(mode="json", exclude_none=True)
        if spec.bundle and not spec.bundle.startswith("gs://"):
            folder = bundle_folder(name, spec.bundle)
            if folder is None:
                raise Permanent(f"{spec.bundle!r} leaves the folder {SUBMIT_PREFIX}: a bundle is a folder under it, "
                                "relative to the job file, or a gs:// URI", field=f"jobs[{i}].bundle")
            folders[i] = folder
            del data["bundle"]  # set once the folder is packed
        data.setdefault("id", gcs_job_id(spec.name, bucket, name, generation, i))
        try:
            out.append(PublishedJob.model_validate(data))
        except ValidationError as e:
            field, reason = describe_validation_error(e, prefix=f"jobs[{i}]", model=PublishedJob)
            raise Permanent(reason, field=field) from None
    return out, folders


def _folder_objects(bucket, folder: str) -> list:
    """The folder's objects, result files and folder placeholders left out."""
    return [b for b in bucket.list_blobs(prefix=folder)
            if not b.name.endswith("/") and not b.name.endswith(RESULT_SUFFIX)]


def _with_bundles(ctx: Context, event: GcsObjectEvent, jobs: list[PublishedJob],
                  folders: dict[int, str]) -> list[PublishedJob]:
    """Each job whose bundle is a folder of the bucket, with the gs:// URI of that folder's packed bundle."""
    bucket = ctx.clients.storage.bucket(event.bucket)
    packed: dict[str, str] = {}
    out = []
    for i, job in enumerate(jobs):
        folder = folders.get(i)
        if folder is None:
            out.append(job)
            continue
        if folder not in packed:
            targets = [b.uri for b in job.buckets] or [f"gs://{event.bucket}"]
            temp = packing_name(event.bucket, event.name, str(event.generation or "0"), folder)
            try:
                packed[folder] = pack_folder(ctx.clients.storage, event.bucket, folder, _folder_objects(bucket, folder),
                                             targets, temp)
            except BundleError as e:
                raise Permanent(str(e).removeprefix("bundle: "), field=f"jobs[{i}].bundle") from None
            except NotFound as e:
                raise Permanent(str(e), field=f"jobs[{i}].buckets") from None
            except Forbidden:  # deploy grants the scheduler the runner bucket only
                raise Permanent(f"the scheduler's account may not write the bundle to {', '.join(targets)}: grant "
                                "tpuq-scheduler roles/storage.objectCreator there, or upload the bundle yourself and "
                                "give its gs:// URI", field=f"jobs[{i}].buckets") from None
        out.append(job.model_copy(update={"bundle": packed[folder]}))
    return out


def on_object_finalized(event: GcsObjectEvent, ctx: Context) -> None:
    if not is_job_file(event.name):
        return  # bundles, results and everything else in the bucket
    bucket = ctx.clients.storage.bucket(event.bucket)
    result_blob = bucket.blob(event.name + RESULT_SUFFIX)
    generation = str(event.generation or "0")
    where = {"object": event.name, "generation": generation}
    try:
        data = bucket.blob(event.name).download_as_bytes()
    except GcsNotFound:  # deleted before it was read, or a redelivery after: no file to put a result beside
        raise Permanent(f"gs://{event.bucket}/{event.name} no longer exists: nothing was submitted",
                        field="name") from None
    try:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise Permanent("the job file is not UTF-8 text", field=FILE_FIELD) from None
        jobs, folders = parse_job_file(text, event.bucket, event.name, generation)
        jobs = _with_bundles(ctx, event, jobs, folders)
        job_ids = submit_jobs(ctx, jobs, "gcs", fleet_in_force(ctx), from_file=True)
    except Permanent as e:
        error = e.args[0] if e.args else str(e)
        text = error if not e.field or error.startswith(e.field) else f"{e.field}: {error}"
        result_blob.upload_from_string(json.dumps({"error": text, **where}, indent=2), content_type="application/json")
        raise  # acked and recorded as a dead letter of gcs-events, with the field and the reason
    result_blob.upload_from_string(json.dumps({"job_ids": job_ids, **where}, indent=2),
                                   content_type="application/json")
