"""`tpuq submit`: bundle, upload once per candidate regional bucket, then publish each job."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpuq.contracts.bundle import Bundle, BundleError, make_bundle
from tpuq.contracts.errors import missing_bucket_line
from tpuq.runtime.clients import Clients
from tpuq.contracts.jobspec import (JOB_ID_RE, JobFile, JobSpec, PublishedJob, PublishedJobFile, dependency_names,
                                   job_id_base, split_gs_uri)


@dataclass
class PreparedJob:
    spec: JobSpec
    bundle: Bundle | None
    buckets: list[str]  # where the bundle goes: every regional bucket of the job, else the runner bucket
    id_given: bool = True  # False: `spec.id` was made here (exists nowhere before the job is submitted)
    index: int = 0  # its place among the file's jobs (`jobs[index]`), whatever `--job-id` chose


def entry_name(prepared: PreparedJob) -> str:
    """A job of the file as its writer knows it: `jobs[1] (eval)`, by the name or the id it gave (before submitting,
    an id made for it exists nowhere yet)."""
    given = prepared.spec.id if prepared.id_given else prepared.spec.name
    return f"jobs[{prepared.index}]" + (f" ({given})" if given else "")


def new_job_id(spec: JobSpec, job_file: Path, rng: random.Random) -> str:
    base = job_id_base(spec.name or job_file.resolve().parent.name)
    return f"{base}-{rng.getrandbits(32):08x}"


def file_indices(whole: JobFile, chosen: JobFile) -> list[int]:
    """Where each of `chosen` (`select_jobs(whole, ...)`) is among `whole`'s jobs: by id (a one-job file: 0)."""
    ids = [j.id for j in whole.jobs]
    return [ids.index(j.id) if j.id in ids else 0 for j in chosen.jobs]


def select_jobs(jobs: JobFile, job_ids: list[str]) -> JobFile:
    """`tpuq submit --job-id ID...`, as tpu-runner's: only the jobs with these ids. A file of one job without an
    id takes the one id given as its id. Raises ValueError naming the id."""
    if not job_ids:
        return jobs
    for job_id in job_ids:
        if not JOB_ID_RE.match(job_id):
            raise ValueError(f"--job-id {job_id!r}: must be 1-63 lowercase letters, digits or '-', starting with a "
                             "letter or digit")
    twice = sorted({i for i in job_ids if job_ids.count(i) > 1})
    if twice:
        raise ValueError(f"--job-id {twice[0]} is given twice")
    if len(jobs.jobs) == 1 and jobs.jobs[0].id is None:
        if len(job_ids) > 1:
            raise ValueError(f"the file has one job, and --job-id is given {len(job_ids)} times")
        return JobFile(jobs=[jobs.jobs[0].model_copy(update={"id": job_ids[0]})])
    known = [j.id for j in jobs.jobs if j.id]
    missing = [i for i in job_ids if i not in known]
    if missing:
        ids = ", ".join(known) or "none"
        raise ValueError(f"--job-id {missing[0]}: no job in the file has this id (ids in the file: {ids})")
    return JobFile(jobs=[j for j in jobs.jobs if j.id in job_ids])


def prepare(job_file: Path, jobs: JobFile, runner_bucket: str | None, rng: random.Random,
            indices: list[int] | None = None) -> list[PreparedJob]:
    """`indices`: each job's place in the file, when `jobs` is a selection of it (`select_jobs`; default: in order)."""
    base_dir = job_file.resolve().parent
    bundles: dict[Path, Bundle] = {}  # several jobs often share one directory: bundle it once
    prepared = []
    for i, spec in enumerate(jobs.jobs):
        bundle = None
        if spec.bundle is not None and not spec.bundle.startswith("gs://"):
            directory = (base_dir / spec.bundle).resolve()
            if directory not in bundles:
                try:
                    bundles[directory] = make_bundle(directory)
                except BundleError as e:  # "bundle: ...": named as the file's entry, as every refusal is
                    raise BundleError(f"jobs[{indices[i] if indices else i}].{e}") from None
            bundle = bundles[directory]
        buckets = [b.uri for b in spec.buckets]
        if not buckets and bundle is not None:
            if not runner_bucket:
                raise ValueError("the job lists no buckets and no runner bucket is configured (TPUQ_RUNNER_BUCKET)")
            buckets = [runner_bucket if runner_bucket.startswith("gs://") else f"gs://{runner_bucket}"]
        job_id = spec.id or new_job_id(spec, job_file, rng)
        prepared.append(PreparedJob(spec.model_copy(update={"id": job_id}), bundle, buckets, id_given=bool(spec.id),
                                    index=indices[i] if indices else i))
    return prepared


def missing_bundle_folders(job_file: Path, jobs: JobFile) -> list[str]:
    """`jobs[0].bundle: ./data is not a directory (...)` for each local bundle folder that is not there: what
    `tpuq validate` says before `tpuq submit` would refuse it."""
    base_dir = job_file.resolve().parent
    return [f"jobs[{i}].bundle: {spec.bundle} is not a directory ({(base_dir / spec.bundle).resolve()})"
            for i, spec in enumerate(jobs.jobs)
            if spec.bundle is not None and not spec.bundle.startswith("gs://")
            and not (base_dir / spec.bundle).resolve().is_dir()]


# ------------------------------------------------------------ the job's buckets, checked before anything is sent
# Roles that let an account create objects (logs) and read them (bundles) in a bucket.
WRITER_ROLES = frozenset({"roles/storage.objectAdmin", "roles/storage.admin", "roles/storage.objectUser",
                          "roles/storage.legacyBucketOwner", "roles/storage.legacyBucketWriter"})


def _buckets_of(p: PreparedJob) -> tuple[list[str], list[str]]:
    """(the buckets one job uses, those its workers write logs to). A gs:// bundle's bucket is only read."""
    written = list(dict.fromkeys(split_gs_uri(uri)[0] for uri in p.buckets))
    read = [split_gs_uri(p.spec.bundle)[0]] if p.bundle is None and (p.spec.bundle or "").startswith("gs://") else []
    return list(dict.fromkeys(written + read)), written


def job_bucket_names(prepared: list[PreparedJob]) -> tuple[list[str], list[str]]:
    """(every bucket the jobs use, in order; the ones workers write logs to)."""
    used: list[str] = []
    written: list[str] = []
    for p in prepared:
        uses, writes = _buckets_of(p)
        used += [name for name in uses if name not in used]
        written += [name for name in writes if name not in written]
    return used, written


def _users_of(bucket: str, prepared: list[PreparedJob]) -> str:
    """`jobs[1] (eval): ` when a file of several jobs has only some using `bucket`; else nothing."""
    users = [entry_name(p) for p in prepared if bucket in _buckets_of(p)[0]]
    return f"{', '.join(users)}: " if users and len(users) < len(prepared) else ""


def may_write(bindings: list[dict], account: str) -> bool:
    """Does this bucket IAM policy (storage JSON API `b/BUCKET/iam` bindings) let `account` write objects?"""
    members = {f"serviceAccount:{account}", "allUsers", "allAuthenticatedUsers"}
    return any(b.get("role") in WRITER_ROLES and members & set(b.get("members") or []) for b in bindings)


def check_buckets(prepared: list[PreparedJob], exists: Callable[[str], bool],
                  read_bindings: Callable[[str], list[dict] | None] | None,
                  worker_account: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the jobs' buckets: a missing bucket is an error; a bucket the workers' account
    cannot write is a warning (read_bindings None, or returning None: the policy cannot be read, say nothing)."""
    used, written = job_bucket_names(prepared)
    regions = {b.name: b.region for p in prepared for b in p.spec.buckets if b.region}
    missing = [name for name in used if not exists(name)]
    errors = [_users_of(name, prepared) + missing_bucket_line(name, regions.get(name)) for name in missing]
    warnings = []
    for name in written:
        if read_bindings is None or name in missing:
            continue
        bindings = read_bindings(name)
        if bindings is not None and not may_write(bindings, worker_account):
            warnings.append(f"the workers' account {worker_account} cannot write gs://{name}; run: gcloud storage "
                            f"buckets add-iam-policy-binding gs://{name} --member=serviceAccount:{worker_account} "
                            "--role=roles/storage.objectAdmin")
    return errors, warnings


def storage_bucket_checks(storage, emulated: bool) -> tuple[Callable[[str], bool], Callable[[str], list[dict] | None] | None]:
    """The two reads check_buckets needs, on a google-cloud-storage client. fake-gcs-server has no IAM: no policy check."""
    from google.api_core.exceptions import GoogleAPICallError

    def exists(name: str) -> bool:
        try:
            return storage.bucket(name).exists()
        except GoogleAPICallError:
            return True  # 403 on the bucket itself: it exists (a missing one is a 404), we may just not read it

    def read_bindings(name: str) -> list[dict] | None:
        try:
            policy = storage.bucket(name).get_iam_policy(requested_policy_version=3)
        except (GoogleAPICallError, ValueError):
            return None  # we may not read the policy: say nothing
        return [{"role": b.get("role"), "members": sorted(b.get("members") or [])} for b in policy.bindings]

    return exists, (None if emulated else read_bindings)


def upload_bundle(storage, bundle: Bundle, buckets: list[str]) -> str:
    """Upload to every bucket unless already there (does-not-exist precondition); returns the first copy's URI."""
    from google.api_core.exceptions import NotFound as GcsNotFound, PreconditionFailed

    from tpuq.contracts.errors import NotFound

    for uri in buckets:
        bucket_name, _ = split_gs_uri(uri)
        blob = storage.bucket(bucket_name).blob(bundle.object_name)
        try:
            blob.upload_from_string(bundle.data, content_type="application/gzip", if_generation_match=0)
        except PreconditionFailed:
            pass  # same content, same name: already uploaded
        except GcsNotFound:  # deleted since check_buckets saw it: the same one line, never the raw 404
            raise NotFound(missing_bucket_line(bucket_name, None)) from None
    return f"{buckets[0]}/{bundle.object_name}"


def unknown_dependencies(db, prepared: list[PreparedJob]) -> list[str]:
    """`depends_on` names neither in the file (the jobs submitted now) nor stored (a job, or a group's task): one
    line each, naming the field (`jobs[1].depends_on[0]`). The scheduler checks again when it stores them."""
    from google.cloud.firestore import FieldFilter

    from tpuq.contracts import store
    from tpuq.contracts.documents import JobDoc
    from tpuq.contracts.jobspec import DependsOnAny, dependency_names

    in_file = {p.spec.id for p in prepared}
    jobs = db.collection(store.JOBS)
    known: dict[str, bool] = {}
    lines = []
    for i, p in enumerate(prepared):
        key = "depends_on.any" if isinstance(p.spec.depends_on, DependsOnAny) else "depends_on"
        for k, name in enumerate(dependency_names(p.spec.depends_on)):
            if name in in_file:
                continue
            if name not in known:
                group = jobs.where(filter=FieldFilter(JobDoc.field("group"), "==", name)).limit(1)
                known[name] = jobs.document(name).get().exists or any(True for _ in group.stream())
            if not known[name]:
                lines.append(f"jobs[{i}].{key}[{k}]: no job or group {name!r} is stored or in this file")
    return lines


def ids_in_use(db, prepared: list[PreparedJob]) -> list[str]:
    """The jobs whose id (a group's: its name) a stored job already has: one line each, naming the field. The
    scheduler refuses such a file whole (`dead-letters`, after the CLI has said "submitted"); found here first, it
    is one line and nothing is sent. One batched read of the jobs' ids, one query per group."""
    from google.cloud.firestore import FieldFilter

    from tpuq.contracts import store
    from tpuq.contracts.documents import JobDoc

    jobs = db.collection(store.JOBS)
    singles = [p.spec.id for p in prepared if not p.spec.is_group]
    stored = {snap.id: (snap.to_dict() or {}).get("state")
              for snap in db.get_all([jobs.document(i) for i in singles]) if snap.exists} if singles else {}
    lines = []
    for i, p in enumerate(prepared):
        job_id = p.spec.id
        if p.spec.is_group:
            if any(True for _ in jobs.where(filter=FieldFilter(JobDoc.field("group"), "==", job_id)).limit(1).stream()):
                lines.append(f"jobs[{i}].id: the group {job_id!r} is already stored (`tpuq status {job_id}`)")
        elif job_id in stored:
            lines.append(f"jobs[{i}].id: {job_id!r} is already a stored job ({stored[job_id]}: `tpuq status {job_id}`)")
    return lines


def depend_on_each_other(prepared: list[PreparedJob]) -> bool:
    """Some job of the file names another: they travel as one message (one `jobs:` file), so the scheduler stores
    them together, and never sees a job before the one it names (Pub/Sub does not keep the order of messages)."""
    ids = {p.spec.id for p in prepared}
    return any(n in ids for p in prepared for n in dependency_names(p.spec.depends_on))


def submit_prepared(clients: Clients, prepared: list[PreparedJob], owner: str | None = None) -> list[str]:
    """Upload each bundle and publish each job; `owner` (who submits) travels as the message's owner attribute."""
    from tpuq.contracts.messages import OWNER_ATTRIBUTE

    attributes = {OWNER_ATTRIBUTE: owner} if owner else {}
    ids = []
    together = depend_on_each_other(prepared)
    published = []
    for p in prepared:
        spec = p.spec
        bundle_uri = upload_bundle(clients.storage, p.bundle, p.buckets) if p.bundle else spec.bundle
        job = PublishedJob.model_validate({**spec.model_dump(mode="json", exclude_none=True), "bundle": bundle_uri})
        if together:
            published.append(job)
        else:
            clients.publish("jobs", job, source="cli", **attributes)
        ids.append(job.id)
    if together:
        clients.publish("jobs", PublishedJobFile(jobs=published), source="cli", **attributes)
    return ids
