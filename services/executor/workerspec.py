"""From an Assignment to what each worker's supervisor receives. Pure, no I/O.

`AttemptPlan.from_assignment` checks the assignment once and resolves buckets and
directories; `plan.worker_spec(worker_id, home, settings)` is the JSON object sent
to the worker supervisor's `prepare` on stdin. Environment values travel inside
that JSON and reach the job through `execve`: nothing is spliced into shell text.

A multislice assignment (`Assignment.slices`, issue 37) becomes one flat list of workers, slice after slice, each
known by its global id g = slice * hosts_per_slice + w (tpuq.contracts.workers): the plan's `endpoints` carry those
ids, and `slots` says which node and which worker of it each one is (for SSH and host keys). Each worker's
TPU_WORKER_* describe its own slice (what JAX expects within a slice); MEGASCALE_* and TPUQ_SLICE_* tie the slices
together (`SliceEnv`). A single-slice assignment's plan and environment are exactly those of before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tpuq.contracts.errors import Permanent
from tpuq.contracts.jobspec import (ARRAY_ENV, ATTEMPT_ENV, MEGASCALE_ENV_PREFIX, MULTISLICE_ENV, RESERVED_ENV_PREFIX,
                                    RUNNER_ENV, CacheSpec, split_gs_uri)
from tpuq.contracts.messages import Assignment, AssignmentAction, WorkerEndpoint
from tpuq.contracts.tputypes import zone_region
from tpuq.contracts.workers import global_worker_id, split_worker_id

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
# The port the Multislice coordinator (worker 0 of slice 0) listens on, in MEGASCALE_PORT and after the address in
# MEGASCALE_COORDINATOR_ADDRESS. Google documents no default for runners that set these variables themselves; public
# runners use 8081: levanter's `run_on_pod_multislice` (stanford-crfm/levanter, src/levanter/infra/ray_tpu.py:
# `port = 8081`) and marin's copy of it (marin-community/marin, same path: `port=8081,  # default port for megascale`).
# JAX itself strips any `:port` from the address (jax/_src/clusters/cloud_tpu_cluster.py).
MEGASCALE_PORT = 8081
MEGASCALE_ENV = frozenset({"MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID",
                           "MEGASCALE_PORT"})


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
class SliceEnv:
    """Where a worker stands among the slices of a job that asked for several (jobspec.MULTISLICE_ENV).

    TPUQ_SLICE_ID, TPUQ_SLICE_COUNT, TPUQ_SLICES_WANTED and TPUQ_WORKER_GLOBAL_ID are set on every such attempt, also
    on an elastic job's attempt that got one slice (then TPUQ_SLICE_COUNT=1 < TPUQ_SLICES_WANTED says so). The
    MEGASCALE_* variables JAX reads (its process environment first, then the `tpu-env` metadata: jax/_src/clusters/
    cloud_tpu_cluster.py; dev/tpuq_dev/faketpu/MULTISLICE.md, section b) are set only when the attempt has several
    slices: JAX takes MEGASCALE_COORDINATOR_ADDRESS's presence to mean Multislice. The coordinator is worker 0 of
    slice 0 ("the Megascale coordinator address is set as the host with process id = 0", same file)."""

    slice_id: int
    slice_count: int
    slices_wanted: int
    global_worker_id: int
    coordinator_ip: str
    port: int = MEGASCALE_PORT

    def as_env(self) -> dict[str, str]:
        env = {
            "TPUQ_SLICE_ID": str(self.slice_id),
            "TPUQ_SLICE_COUNT": str(self.slice_count),
            "TPUQ_SLICES_WANTED": str(self.slices_wanted),
            "TPUQ_WORKER_GLOBAL_ID": str(self.global_worker_id),
        }
        assert set(env) == MULTISLICE_ENV, "SliceEnv and jobspec.MULTISLICE_ENV disagree"
        if self.slice_count > 1:
            env |= {
                "MEGASCALE_COORDINATOR_ADDRESS": f"{self.coordinator_ip}:{self.port}",
                "MEGASCALE_NUM_SLICES": str(self.slice_count),
                "MEGASCALE_SLICE_ID": str(self.slice_id),
                "MEGASCALE_PORT": str(self.port),
            }
        return env


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
    # A job that asked for several slices: where this worker stands among them. None: one slice, as asked (the
    # environment is then exactly a single-slice job's). `worker_id` and `worker_hosts` are always its own slice's.
    slices: SliceEnv | None = None

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
        return env | standing | task | (self.slices.as_env() if self.slices is not None else {})


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
        if name.startswith(MEGASCALE_ENV_PREFIX):
            raise Permanent(f"{name!r} is reserved: tpuq sets the {MEGASCALE_ENV_PREFIX}* variables on a multislice "
                            "job", field=where)
        if not isinstance(value, str) or "\x00" in value:
            raise Permanent(f"{name!r} must be a string without NUL bytes", field=where)
    env = dict(job_env)
    env.update(runner.as_env())
    return env


@dataclass(frozen=True)
class AttemptWorkers:
    """Every worker of an attempt by the attempt's worker id (tpuq.contracts.workers), and where each one is."""

    endpoints: tuple[WorkerEndpoint, ...]  # in id order; `worker_id` is the attempt's (global) id
    slice_nodes: tuple[str, ...] = ()  # a multislice attempt's nodes in slice order; (): one slice
    hosts_per_slice: int = 0

    @property
    def slice_count(self) -> int:
        return max(1, len(self.slice_nodes))

    @property
    def slots(self) -> dict[int, tuple[str, int]] | None:
        """Each worker's (node, id within the node), for a pool over several slices; None on one slice."""
        if not self.slice_nodes:
            return None
        return {e.worker_id: (self.slice_nodes[s], w)
                for e in self.endpoints for s, w in [split_worker_id(e.worker_id, self.hosts_per_slice)]}


def attempt_workers(assignment: Assignment) -> AttemptWorkers:
    """The assignment's workers, checked: each node's ids 0..hosts-1, each once; on several slices, the same number
    of hosts on each, distinct nodes, and slice 0 being the assignment's node and endpoints. Raises Permanent."""
    endpoints = _in_order(assignment.endpoints, "endpoints")
    if len(assignment.slices) <= 1:
        if assignment.slices:
            _same_as_node(assignment, _in_order(assignment.slices[0].endpoints, "slices[0].endpoints"))
        return AttemptWorkers(endpoints, (), len(endpoints))
    hosts = len(endpoints)
    flat: list[WorkerEndpoint] = []
    for s, one in enumerate(assignment.slices):
        own = _in_order(one.endpoints, f"slices[{s}].endpoints")
        if len(own) != hosts:
            raise Permanent(f"slice {s} ({one.node}) has {len(own)} workers and slice 0 has {hosts}: every slice of a "
                            "multislice attempt is of one TPU type", field=f"slices[{s}].endpoints")
        flat += [e.model_copy(update={"worker_id": global_worker_id(s, e.worker_id, hosts)}) for e in own]
    _same_as_node(assignment, _in_order(assignment.slices[0].endpoints, "slices[0].endpoints"))
    nodes = tuple(one.node for one in assignment.slices)
    if len(set(nodes)) != len(nodes):
        raise Permanent(f"a node is listed twice among the slices: {', '.join(nodes)}", field="slices")
    return AttemptWorkers(tuple(flat), nodes, hosts)


def _in_order(endpoints, where: str) -> tuple[WorkerEndpoint, ...]:
    ordered = tuple(sorted(endpoints, key=lambda e: e.worker_id))
    if [e.worker_id for e in ordered] != list(range(len(ordered))):
        raise Permanent("worker ids must be 0..N-1, each once", field=where)
    return ordered


def _same_as_node(assignment: Assignment, first: tuple[WorkerEndpoint, ...]) -> None:
    if assignment.slices[0].node != assignment.node or first != _in_order(assignment.endpoints, "endpoints"):
        raise Permanent(f"slice 0 must be the assignment's node and endpoints ({assignment.node}), not "
                        f"{assignment.slices[0].node}", field="slices[0]")


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
    # A multislice attempt (AttemptWorkers): `endpoints` and `worker_hosts` hold every slice's workers, by global id.
    slice_nodes: tuple[str, ...] = ()
    hosts_per_slice: int = 0  # 0: all of `endpoints` (one slice)
    slices_wanted: int | None = None  # the most the job asked for (Assignment.slices_wanted); None or 1: one

    @classmethod
    def from_assignment(cls, assignment: Assignment) -> "AttemptPlan":
        if assignment.action != AssignmentAction.assign:
            raise Permanent(f"assignment action is {assignment.action.value}, not assign", field="action")
        job = assignment.job
        if job is None:
            raise Permanent("an assign message must carry the job", field="job")
        if not assignment.endpoints:
            raise Permanent("an assign message must list the node's worker endpoints", field="endpoints")
        workers = attempt_workers(assignment)
        endpoints = workers.endpoints
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
            # Internal addresses in worker order: libtpu reads TPU_WORKER_HOSTNAMES (its slice's) to find its peers.
            worker_hosts=tuple(e.ip for e in endpoints),
            preemptions=assignment.preemptions,
            resuming=assignment.resuming,
            array_index=assignment.array_index,
            array_size=assignment.array_size,
            max_duration_seconds=job.max_duration,
            slice_nodes=workers.slice_nodes,
            hosts_per_slice=workers.hosts_per_slice,
            slices_wanted=assignment.slices_wanted,
        )

    @property
    def worker_count(self) -> int:
        return len(self.endpoints)

    @property
    def slice_count(self) -> int:
        return max(1, len(self.slice_nodes))

    @property
    def slots(self) -> dict[int, tuple[str, int]] | None:
        """Each worker's (node, id within it) on several slices (tpuq.executor.ssh.WorkerPool); None on one."""
        return AttemptWorkers(self.endpoints, self.slice_nodes, self.hosts_per_slice).slots

    def runner_env(self, worker_id: int, job_dir: str) -> RunnerEnv:
        """The runner's variables of the attempt's worker `worker_id` (its global id on several slices)."""
        hosts = self.hosts_per_slice or self.worker_count
        s, w = split_worker_id(worker_id, hosts)
        wanted = max(self.slices_wanted or 1, self.slice_count)
        slices = None
        if wanted > 1:  # a job that asked for several slices, also when it got one
            slices = SliceEnv(slice_id=s, slice_count=self.slice_count, slices_wanted=wanted,
                              global_worker_id=worker_id, coordinator_ip=self.worker_hosts[0])
        return RunnerEnv(
            job_id=self.job_id,
            attempt_id=self.attempt_id,
            worker_id=w,
            worker_hosts=self.worker_hosts[s * hosts:(s + 1) * hosts],
            job_dir=job_dir,
            job_bucket=f"gs://{self.bucket}",
            attempt_gcs_dir=self.attempt_gcs_dir,
            checkpoint_gcs_dir=self.checkpoint_gcs_dir,
            attempt=self.attempt,
            preemptions=self.preemptions,
            resuming=self.resuming,
            array_index=self.array_index,
            array_size=self.array_size,
            slices=slices,
        )

    def worker_spec(self, worker_id: int, home: str, settings: WorkerSettings) -> dict:
        """The JSON object for the supervisor's `prepare` on worker `worker_id` (the attempt's id: its status object,
        log prefix and exit code are under it)."""
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
