"""Run the scheduler's bucket-upload handler once under the scheduler's memory limit, as Cloud Run counts it: a
helper that tests/scheduler/test_folder_bundle.py starts as a subprocess (a limit cannot be lifted in the process
that set it).

    python upload_under_memory_limit.py LIMIT_BYTES GCS_URL BUCKET JOB_FILE

On Cloud Run the file system is in memory: what the process holds and what it wrote to /tmp count together
against the limit (https://cloud.google.com/run/docs/container-contract#filesystem). So the handler's temporary
files go to a directory of their own, and a sampler records the largest sum of resident memory and that
directory's bytes (`peak_bytes`). RLIMIT_AS (set before the handler's modules are imported) stops the process
outright if its address space alone passes the limit. Prints one JSON line: the result file the handler wrote
beside the job file (or the error that ended it) and the peaks.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
import threading
from datetime import datetime, timezone

PAGE = os.sysconf("SC_PAGE_SIZE")


def _tree_bytes(root: str) -> int:
    total = 0
    for directory, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                pass  # removed while we looked
    return total


class CloudRunMemory(threading.Thread):
    """Samples resident memory plus the bytes under `tmp`, every 10 ms, and keeps the largest sum."""

    def __init__(self, tmp: str):
        super().__init__(daemon=True)
        self.tmp, self.peak, self.peak_tmp = tmp, 0, 0
        self.done = threading.Event()

    def sample(self) -> None:
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * PAGE
        on_tmp = _tree_bytes(self.tmp)
        self.peak, self.peak_tmp = max(self.peak, resident + on_tmp), max(self.peak_tmp, on_tmp)

    def run(self) -> None:
        while not self.done.wait(0.01):
            self.sample()


def run_upload(gcs_url: str, bucket_name: str, job_file: str) -> dict:
    """The handler on the job file's notification; what it wrote beside the file (or why it stopped)."""
    import random

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from tpuq.contracts import topology
    from tpuq.runtime.clients import Clients
    from tpuq.runtime.settings import Settings
    from tpuq.contracts.fleet import FleetFile
    from tpuq.runtime.fleetstore import save_fleet
    from tpuq_dev.inmemory import MemoryFirestore, MemoryPublisher
    from tpuq.contracts.messages import GcsObjectEvent
    from tpuq.scheduler import gcs_submit
    from tpuq.runtime.service import Context

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    settings = Settings(project="tpuq-local", runner_bucket=bucket_name)
    gcs = storage.Client(project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": gcs_url})
    clients = Clients(settings, firestore=MemoryFirestore(project=settings.project), storage=gcs,
                      publisher=MemoryPublisher(settings.topic_path(t.name) for t in topology.TOPICS))
    save_fleet(clients.firestore, FleetFile.model_validate(
        {"name": "test", "project": "tpuq-local",
         "tpus": [{"id": "v4", "type": "v4-8", "zones": ["us-central2-b"], "count": 4}]}), now)
    blob = gcs.bucket(bucket_name).get_blob(job_file)
    sub = next(s for s in topology.SUBSCRIPTIONS if s.name == "scheduler-gcs-submit")
    ctx = Context(clients=clients, now=lambda: now, rng=random.Random(0), message_id="m-1", attributes={},
                  publish_time=now, subscription=sub, service="scheduler", settings=settings)
    event = GcsObjectEvent(bucket=bucket_name, name=job_file, generation=str(blob.generation), size=blob.size)
    outcome: dict = {}
    try:
        gcs_submit.on_object_finalized(event, ctx)
    except MemoryError:
        outcome["error"] = "MemoryError"
    except Exception as e:  # noqa: BLE001 - a refusal (Permanent) still wrote its result file
        outcome["error"] = f"{type(e).__name__}: {e}"[:500]
    result = gcs.bucket(bucket_name).blob(job_file + gcs_submit.RESULT_SUFFIX)
    try:
        outcome["result"] = json.loads(result.download_as_bytes())
    except Exception:  # noqa: BLE001 - no result file: the handler died before writing one
        outcome["result"] = None
    return outcome


if __name__ == "__main__":
    tempfile.tempdir = tempfile.mkdtemp(prefix="cloud-run-tmp-")  # the instance's /tmp, in memory there
    meter = CloudRunMemory(tempfile.tempdir)
    meter.start()
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # before the handler's modules are imported
    try:
        answer = run_upload(*sys.argv[2:5])
    except MemoryError:
        answer = {"error": "MemoryError", "result": None}
    meter.done.set()
    meter.join()
    meter.sample()
    shutil.rmtree(tempfile.tempdir, ignore_errors=True)
    answer.update(peak_bytes=meter.peak, peak_tmp_bytes=meter.peak_tmp,
                  peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    sys.stdout.write(json.dumps(answer) + "\n")
