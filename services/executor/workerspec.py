"""From an Assignment to what each worker's supervisor receives. Pure, no I/O.

`AttemptPlan.from_assignment` checks the assignment once and resolves buckets and
directories; `plan.worker_spec(worker_id, home, settings)` is the JSON object sent
to the worker supervisor's `prepare` on stdin. Environment values travel inside
that JSON and reach the job through `execve`: nothing is spliced into shell text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tpuq.contracts.errors import Permanent
from tpuq.contracts.jobspec import ARRAY_ENV, ATTEMPT_ENV, RESERVED_ENV_PREFIX, RUNNER_ENV, CacheSpec, split_gs_uri
from tpuq.contracts.messages import Assignment, AssignmentAction, WorkerEndpoint
from tpuq.contracts.tputypes import zone_region

from tpuq.contracts import gcslayout

WORKER_SPEC_VERSION = 1  # worker.spec.SPEC_VERSION
GCS_API_BASE = "https://storage.googleapis.com"
METADATA_TOKEN_URL = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
# The preemption notice (TRUE/FALSE) and the host maintenance event (NONE, TERMINATE_ON_HOST_MAINTENANCE, ...), read
# with the header Metadata-Flavor: Google (https://cloud.google.com/compute/docs/instances/create-use-spot and
# https://cloud.google.com/compute/docs/metadata/getting-live-migration-notice). The supervisor polls both while the
# job runs (tpuq.executor.worker.notice).
METADATA_PREEMPTED_URL = "http://metadata.google.internal/computeMetadata/v1/instance/preempted"
METADATA_MAINTENANCE_EVENT_URL = "http://metadata.google.internal/computeMetadata/v1/instance/maintenance-event"
# A spot VM gets 30 s between the notice (ACPI G2 Soft Off) and its power-off (Compute Engine API, Scheduling.
# skipGuestOsShutdown: "120 seconds ... for Standard VMs and 30 seconds for Spot VMs", https://cloud.google.com/
# compute/docs/reference/rest/v1/instances; production-facts.md "Spot TPU preemption notice"). The job gets 25 s of
# them to checkpoint after its SIGTERM; the last 5 are the supervisor's, to upload the logs and the status object.
PREEMPTION_GRACE_SECONDS = 25.0
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class WorkerSettings:
    """How supervisors reach GCS and how patient they are. Production defaults."""

    gcs_api_base: str = GCS_API_BASE
    token_url: str | None = METADATA_TOKEN_URL
    preempted_url: str | None = METADATA_PREEMPTED_URL
    maintenance_event_url: str | None = METADATA_MAINTENANCE_EVENT_URL
    log_flush_seconds: float = 2.0
    cancel_grace_seconds: float = 30.0
    preemption_grace_seconds: float = PREEMPTION_GRACE_SECONDS  # SIGTERM on the notice, SIGKILL this much later
    stale_grace_seconds: float = 10.0
    libtpu_lockfile: str = "/tmp/libtpu_lockfile"
    # The worker's preflight (tpuq.executor.worker.preflight): where it reads the processes, which device files are
    # the TPU's (libtpu opens /dev/accel* or /dev/vfio/*: openxla/xla tpu_initialize_util.cc), and the free disk it
    # asks for (the bundle's size is not known before its download, so a floor).
    proc_root: str = "/proc"
    tpu_device_globs: tuple[str, ...] = ("/dev/accel*", "/dev/vfio/*")
    preflight_min_free_bytes: int = 1 << 30
    python: str = "/usr/bin/python3"
    gcs_retry_delay_seconds: float = 0.5  # first back-off of the bundle download; doubles, 4 tries
    status_upload_deadline_seconds: float = 900.0  # the status object is how the system learns the end: insist
    # Where status objects and cancel markers go: the runner bucket, whose finalize notifications reach the
    # executor (a job's own buckets belong to the user and carry no notification of ours). None: the job's bucket.
    status_bucket: str | None = None

    @classmethod
    def for_emulator(cls, storage_emulator_host: str, **overrides) -> "WorkerSettings":
        """Local stack: fake-gcs-server without auth (no token). The notice URLs stay production's: the fake's worker
        hosts resolve metadata.google.internal to a metadata server of their own (tpuq_dev.faketpu.metadata)."""
        return cls(gcs_api_base=storage_emulator_host.rstrip("/"), token_url=None, **overrides)

    def __post_init__(self) -> None:
        if not 0 < self.log_flush_seconds <= 5:
            raise ValueError("log_flush_seconds must be in (0, 5]: logs reach GCS at most 5 s apart")


@dataclass(frozen=True)
class RunnerEnv:
    """The variables the runner sets on every worker (jobspec.RUNNER_ENV)."""

    job_id: str
    attempt_id: str
    worker_id: int
    worker_hosts: tuple[str, ...]
    job_dir: str
    job_bucket: str  # gs://bucket
    attempt_gcs_dir: str
    checkpoint_gcs_dir: str
    attempt: int = 1
    preemptions: int = 0  # the job's, before this attempt
    resuming: bool = False  # an earlier attempt of the job started
    array_index: int | None = None  # a group's task: its index and the group's size (jobspec.ARRAY_ENV)
    array_size: int | None = None

    def as_env(self) -> dict[str, str]:
        env = {
            "JOB_ID": self.job_id,
            "ATTEMPT_ID": self.attempt_id,
            "TPU_WORKER_HOST": self.worker_hosts[self.worker_id],
            "TPU_WORKER_ID": str(self.worker_id),
            "TPU_WORKER_COUNT": str(len(self.worker_hosts)),
            "TPU_WORKER_HOSTNAMES": ",".join(self.worker_hosts),
            "JOB_DIR": self.job_dir,
            "JOB_BUCKET": self.job_bucket,
            "ATTEMPT_GCS_DIR": self.attempt_gcs_dir,
            "CHECKPOINT_GCS_DIR": self.checkpoint_gcs_dir,
        }
        assert set(env) == RUNNER_ENV, "RunnerEnv and jobspec.RUNNER_ENV disagree"
        # TPUQ_RESUMING is absent on a first run, so that `[ -n "$TPUQ_RESUMING" ]` and os.environ.get() both read it.
        standing = {"TPUQ_ATTEMPT": str(self.attempt), "TPUQ_PREEMPTIONS": str(self.preemptions)}
        if self.resuming:
            standing["TPUQ_RESUMING"] = "1"
        assert set(standing) <= ATTEMPT_ENV, "RunnerEnv and jobspec.ATTEMPT_ENV disagree"
        task = {}
        if self.array_index is not None and self.array_size is not None:
            task = {"TPUQ_ARRAY_INDEX": str(self.array_index), "TPUQ_ARRAY_SIZE": str(self.array_size)}
        assert set(task) <= ARRAY_ENV, "RunnerEnv and jobspec.ARRAY_ENV disagree"
        return env | standing | task


def build_worker_env(job_env: Mapping[str, str], runner: RunnerEnv) -> dict[str, str]:
    """The job's env plus the runner's; a job may not set a runner or TPUQ_ variable.

    JobSpec validates this already; the check is repeated here because this is the
    last point before the values reach a worker.
    """
    for name, value in job_env.items():
        where = f"job.env.{name}"
        if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
            raise Permanent(f"{name!r} is not a valid environment variable name", field=where)
        if name in RUNNER_ENV:
            raise Permanent(f"{name!r} is reserved: the runner sets it", field=where)
        if name.startswith(RESERVED_ENV_PREFIX):
            raise Permanent(f"{name!r} is reserved: names starting with {RESERVED_ENV_PREFIX} belong to tpuq", field=where)
        if not isinstance(value, str) or "\x00" in value:
            raise Permanent(f"{name!r} must be a string without NUL bytes", field=where)
    env = dict(job_env)
    env.update(runner.as_env())
    return env


@dataclass(frozen=True)
class AttemptPlan:
    """An assignment checked and resolved: everything but the per-worker home directory."""

    job_id: str
    attempt: int
    attempt_id: str
    node: str
    endpoints: tuple[WorkerEndpoint, ...]
    command: str
    job_env: Mapping[str, str]
    caches: tuple[CacheSpec, ...]
    bucket: str  # bucket name, no gs://
    bundle: tuple[str, str] | None  # (bucket, object)
    attempt_gcs_dir: str
    checkpoint_gcs_dir: str
    worker_hosts: tuple[str, ...] = field(default=())
    preemptions: int = 0
    resuming: bool = False
    array_index: int | None = None
    array_size: int | None = None
    max_duration_seconds: int | None = None  # the job's max_duration: the longest one attempt may run

    @classmethod
    def from_assignment(cls, assignment: Assignment) -> "AttemptPlan":
        if assignment.action != AssignmentAction.assign:
            raise Permanent(f"assignment action is {assignment.action.value}, not assign", field="action")
        job = assignment.job
        if job is None:
            raise Permanent("an assign message must carry the job", field="job")
        if not assignment.endpoints:
            raise Permanent("an assign message must list the node's worker endpoints", field="endpoints")
        endpoints = tuple(sorted(assignment.endpoints, key=lambda e: e.worker_id))
        if [e.worker_id for e in endpoints] != list(range(len(endpoints))):
            raise Permanent("worker ids must be 0..N-1, each once", field="endpoints")
        bucket = _job_bucket(assignment)
        bundle = split_gs_uri(job.bundle) if job.bundle else None
        return cls(
            job_id=assignment.job_id,
            attempt=assignment.attempt,
            attempt_id=assignment.attempt_id,
            node=assignment.node,
            endpoints=endpoints,
            command=job.command,
            job_env=dict(job.env),
            caches=tuple(job.caches),
            bucket=bucket,
            bundle=bundle,
            attempt_gcs_dir=assignment.attempt_gcs_dir
            or gcslayout.default_attempt_gcs_dir(bucket, assignment.job_id, assignment.attempt),
            checkpoint_gcs_dir=assignment.checkpoint_gcs_dir
            or gcslayout.default_checkpoint_gcs_dir(bucket, assignment.job_id),
            # Internal addresses in worker order: libtpu reads TPU_WORKER_HOSTNAMES to find its peers.
            worker_hosts=tuple(e.ip for e in endpoints),
            preemptions=assignment.preemptions,
            resuming=assignment.resuming,
            array_index=assignment.array_index,
            array_size=assignment.array_size,
            max_duration_seconds=job.max_duration,
        )

    @property
    def worker_count(self) -> int:
        return len(self.endpoints)

    def runner_env(self, worker_id: int, job_dir: str) -> RunnerEnv:
        return RunnerEnv(
            job_id=self.job_id,
            attempt_id=self.attempt_id,
            worker_id=worker_id,
            worker_hosts=self.worker_hosts,
            job_dir=job_dir,
            job_bucket=f"gs://{self.bucket}",
            attempt_gcs_dir=self.attempt_gcs_dir,
            checkpoint_gcs_dir=self.checkpoint_gcs_dir,
            attempt=self.attempt,
            preemptions=self.preemptions,
            resuming=self.resuming,
            array_index=self.array_index,
            array_size=self.array_size,
        )

    def worker_spec(self, worker_id: int, home: str, settings: WorkerSettings) -> dict:
        """The JSON object for the supervisor's `prepare` on worker `worker_id`."""
        job_dir = gcslayout.worker_job_dir(home)
        return {
            "version": WORKER_SPEC_VERSION,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "attempt_id": self.attempt_id,
            "worker_id": worker_id,
            "worker_count": self.worker_count,
            "command": self.command,
            "env": build_worker_env(self.job_env, self.runner_env(worker_id, job_dir)),
            "job_dir": job_dir,
            "bundle": {"bucket": self.bundle[0], "object": self.bundle[1]} if self.bundle else None,
            "caches": [{"key": c.key, "path": c.path} for c in self.caches],
            "gcs": {
                "api_base": settings.gcs_api_base,
                "token_url": settings.token_url,
                "bucket": self.bucket,
                "log_prefix": gcslayout.worker_log_prefix(self.job_id, self.attempt, worker_id),
                "status_object": gcslayout.worker_status_name(self.job_id, self.attempt, worker_id),
                "status_bucket": settings.status_bucket or self.bucket,
                "retry_delay_seconds": settings.gcs_retry_delay_seconds,
                "status_deadline_seconds": settings.status_upload_deadline_seconds,
            },
            "preempted_url": settings.preempted_url,
            "maintenance_event_url": settings.maintenance_event_url,
            "max_duration_seconds": self.max_duration_seconds,
            "log_flush_seconds": settings.log_flush_seconds,
            "cancel_grace_seconds": settings.cancel_grace_seconds,
            "preemption_grace_seconds": settings.preemption_grace_seconds,
            "stale_grace_seconds": settings.stale_grace_seconds,
            "libtpu_lockfile": settings.libtpu_lockfile,
            "preflight": {
                "proc_root": settings.proc_root,
                "device_globs": list(settings.tpu_device_globs),
                "min_free_bytes": settings.preflight_min_free_bytes,
            },
        }


def _job_bucket(assignment: Assignment) -> str:
    """The scheduler's choice, else the job's bucket for the zone's region, else its only bucket."""
    job = assignment.job
    assert job is not None
    try:
        if assignment.job_bucket:
            return gcslayout.bucket_name(assignment.job_bucket)
        uri = job.bucket_for_region(zone_region(assignment.zone))
    except ValueError as e:
        raise Permanent(str(e), field="job_bucket") from None
    if uri is None and len(job.buckets) == 1:
        uri = job.buckets[0].uri
    if uri is None:
        raise Permanent(
            f"no job bucket: the assignment names none and the job has no bucket in {assignment.zone}'s region",
            field="job_bucket",
        )
    return gcslayout.bucket_name(uri)
