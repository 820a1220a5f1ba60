"""The final status object: built from what the job did, kept locally, written once to GCS."""

from __future__ import annotations

import json
import os
import time

from .files import WorkerPaths, write_json_atomic
from .gcs import Gcs

STATUS_VERSION = 1
TAIL_BYTES = 4096
STATUS_UPLOAD_DEADLINE_SECONDS = 900.0  # the status object is how the system learns the end: insist


def utcnow() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"



def _disk_and_memory(home: str) -> tuple[dict, dict]:
    disk: dict = {"path": home}
    try:
        st = os.statvfs(home)
        disk.update(free_bytes=st.f_bavail * st.f_frsize, total_bytes=st.f_blocks * st.f_frsize)
    except OSError:
        pass
    memory: dict = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    memory["total_bytes" if name == "MemTotal" else "available_bytes"] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return disk, memory


def tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    text = data.decode(errors="replace")
    if size > TAIL_BYTES and "\n" in text:
        text = text.split("\n", 1)[1]  # drop the cut first line
    return text


CANCEL_REASON = "cancel_reason"  # why the job was stopped: the cancel request's reason (the executor reads it)


def build_status(spec: dict, paths: WorkerPaths, **fields) -> dict:
    disk, memory = _disk_and_memory(paths.home)
    status = {
        "version": STATUS_VERSION,
        "job_id": spec["job_id"],
        "attempt": spec["attempt"],
        "attempt_id": spec["attempt_id"],
        "worker_id": spec["worker_id"],
        "worker_count": spec["worker_count"],
        "phase": "run",
        "exit_code": None,
        "signal": None,
        "cancelled": False,
        CANCEL_REASON: None,
        "preempted": False,  # the worker saw the preemption or maintenance notice (`preemption_notice` says which)
        "preemption_notice": None,
        "timed_out": False,  # the supervisor stopped the job at the job's max_duration (`max_duration_seconds`)
        "max_duration_seconds": None,
        "setup_error": None,
        "preflight_error": None,  # phase "preflight": what made the host unfit (tpuq.executor.worker.preflight)
        "started_at": None,
        "ended_at": utcnow(),
        "log_chunks": 0,
        "log_bytes": 0,
        "log_error": None,  # set when the logs did not all reach GCS: "could not be written to gs://B: why"
        "tail": "",
        "disk": disk,
        "memory": memory,
    }
    status.update(fields)
    return status


def publish_status(spec: dict, status: dict, deadline_seconds: float | None = None) -> None:
    """Write the per-worker status object exactly once (ifGenerationMatch=0), retrying until the deadline."""
    gcs_cfg = spec["gcs"]
    if deadline_seconds is None:
        deadline_seconds = float(gcs_cfg.get("status_deadline_seconds") or STATUS_UPLOAD_DEADLINE_SECONDS)
    gcs = Gcs(gcs_cfg["api_base"], gcs_cfg.get("token_url"))
    data = json.dumps(status, indent=1).encode()
    deadline = time.monotonic() + deadline_seconds
    delay = 0.5
    while True:
        try:
            gcs.upload(gcs_cfg.get("status_bucket") or gcs_cfg["bucket"], gcs_cfg["status_object"], data,
                       "application/json", if_absent=True)
            return
        except Exception:  # noqa: BLE001 - any failure: retry until the deadline
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 30.0)



def write_and_publish_status(paths: WorkerPaths, spec: dict, status: dict) -> None:
    """Keep the final status here, then in GCS. If GCS refuses it for good, the local copy says why, so that
    the executor's probe (`status`) can end the attempt with that reason instead of waiting for ever."""
    write_json_atomic(paths.attempt_file("status.json"), status)
    try:
        publish_status(spec, status)
    except Exception as e:  # noqa: BLE001 - recorded, then raised: the supervisor ends with an error
        gcs_cfg = spec["gcs"]
        where = f"gs://{gcs_cfg.get('status_bucket') or gcs_cfg['bucket']}/{gcs_cfg['status_object']}"
        status = dict(status, status_upload_error=f"the status object {where} could not be written: "
                                                  + " ".join(str(e).split())[:300])
        write_json_atomic(paths.attempt_file("status.json"), status)
        raise
