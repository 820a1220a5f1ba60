"""Where an attempt's files live: in GCS and on the workers. Pure functions, no I/O.

The one owner of these names: the executor and its workers write them, the scheduler names the attempt and
checkpoint directories, and the CLI (`tpuq logs`, `tpuq watch`) reads them.

GCS, all in the job's bucket (JOB_BUCKET):

    tpuq/jobs/{job}/attempts/{n}/                    ATTEMPT_GCS_DIR unless the assignment names one
    tpuq/jobs/{job}/attempts/{n}/tpuq-logs/worker-{i}/{seq:06d}.txt
                                                     log chunks: the worker's stdout and stderr merged,
                                                     one object per flush (at most 5 s apart)
    tpuq/jobs/{job}/checkpoints/                     CHECKPOINT_GCS_DIR unless the assignment names one
    tpuq/status/{job}/{n}/worker-{i}.json            the worker's final status, written once, last
    tpuq/status/{job}/{n}/cancelled.json             written by Executor.cancel_attempt

Status objects sit under their own prefix so that the bucket's notification
config can use `object_name_prefix="tpuq/status/"`: log chunks (one per worker
every few seconds) then never reach the gcs-events topic. Attempt numbers must
not be reused within a job: each status object is written with
ifGenerationMatch=0.

Workers: see `tpuq.executor.worker` (its package docstring has the file layout).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpuq.contracts.jobspec import split_gs_uri

STATUS_ROOT = "tpuq/status"
STATUS_NOTIFICATION_PREFIX = STATUS_ROOT + "/"
# Job files people upload for the scheduler (tpuq.scheduler.gcs_submit); the runner bucket's other notification.
SUBMIT_PREFIX = "submit/"
CANCELLED_MARKER = "cancelled.json"

# On every worker, relative to the login user's home.
WORKER_ROOT = "tpuq"
WORKER_SUPERVISOR = "tpuq/supervisor.py"
WORKER_JOB_DIR = "tpuq/job"
WORKER_CACHE_ROOT = "tpuq-cache"

_STATUS_NAME_RE = re.compile(
    r"^" + re.escape(STATUS_ROOT) + r"/(?P<job>[a-z0-9][a-z0-9-]{0,62})/(?P<attempt>[1-9][0-9]*)/"
    r"(?:worker-(?P<worker>[0-9]+)\.json|(?P<cancelled>" + re.escape(CANCELLED_MARKER) + r"))$"
)


def bucket_name(bucket: str) -> str:
    """'gs://b' or 'b' -> 'b'."""
    if bucket.startswith("gs://"):
        name, path = split_gs_uri(bucket)
        if path.strip("/"):
            raise ValueError(f"{bucket!r} must name a bucket, not an object")
        return name
    return split_gs_uri(f"gs://{bucket}")[0]


def attempt_prefix(job_id: str, attempt: int) -> str:
    return f"tpuq/jobs/{job_id}/attempts/{attempt}"


def default_attempt_gcs_dir(bucket: str, job_id: str, attempt: int) -> str:
    return f"gs://{bucket_name(bucket)}/{attempt_prefix(job_id, attempt)}"


def checkpoint_prefix(job_id: str) -> str:
    """Fixed across attempts, so a retry resumes from the checkpoints of the one before."""
    return f"tpuq/jobs/{job_id}/checkpoints"


def default_checkpoint_gcs_dir(bucket: str, job_id: str) -> str:
    return f"gs://{bucket_name(bucket)}/{checkpoint_prefix(job_id)}"


def attempt_logs_prefix(job_id: str, attempt: int) -> str:
    """Object-name prefix of every worker's log chunks of one attempt."""
    return f"{attempt_prefix(job_id, attempt)}/tpuq-logs/"


def worker_log_prefix(job_id: str, attempt: int, worker_id: int) -> str:
    """Object-name prefix of one worker's log chunks; chunk k is f'{prefix}{k:06d}.txt'."""
    return f"{attempt_logs_prefix(job_id, attempt)}worker-{worker_id}/"


def log_chunk_name(job_id: str, attempt: int, worker_id: int, seq: int) -> str:
    return f"{worker_log_prefix(job_id, attempt, worker_id)}{seq:06d}.txt"


def parse_log_chunk_name(job_id: str, attempt: int, name: str) -> tuple[int, int] | None:
    """(worker, sequence) of one of the attempt's log chunks, or None for any other object."""
    prefix = attempt_logs_prefix(job_id, attempt)
    parts = name[len(prefix):].split("/") if name.startswith(prefix) else []
    if len(parts) != 2 or not parts[0].startswith("worker-"):
        return None
    try:
        return int(parts[0][len("worker-"):]), int(parts[1].split(".")[0])
    except ValueError:
        return None


def status_prefix(job_id: str, attempt: int) -> str:
    return f"{STATUS_ROOT}/{job_id}/{attempt}/"


def worker_status_name(job_id: str, attempt: int, worker_id: int) -> str:
    return f"{status_prefix(job_id, attempt)}worker-{worker_id}.json"


def cancelled_marker_name(job_id: str, attempt: int) -> str:
    return f"{status_prefix(job_id, attempt)}{CANCELLED_MARKER}"


@dataclass(frozen=True)
class StatusObjectRef:
    """What a status-object name says; `worker_id` is None for the cancelled marker."""

    job_id: str
    attempt: int
    worker_id: int | None

    @property
    def is_cancel_marker(self) -> bool:
        return self.worker_id is None


def parse_status_object_name(name: str) -> StatusObjectRef | None:
    """For the gcs-events handler: which attempt a finalized object belongs to, or None if not ours."""
    m = _STATUS_NAME_RE.match(name)
    if not m:
        return None
    worker = m.group("worker")
    return StatusObjectRef(m.group("job"), int(m.group("attempt")), int(worker) if worker is not None else None)


def worker_job_dir(home: str) -> str:
    """JOB_DIR on a worker whose login home is `home` (must match worker.files.WorkerPaths)."""
    return f"{home.rstrip('/')}/{WORKER_JOB_DIR}"
