"""End to end: a job whose bucket the workers cannot write still runs, and `tpuq status` says its logs were lost.

The job is published directly (as `gcloud pubsub topics publish` would), past `tpuq submit`'s bucket check,
to a bucket that does not exist: fake-gcs-server refuses every log upload to it (404), as Google refuses a
bucket the workers' account may not write (403). Status objects go to the runner bucket, which works.
"""

from __future__ import annotations

import os
import subprocess
import uuid

from tpuq.contracts import store
from tpuq_dev.devstack.stack import wait_for
from tpuq.contracts.jobspec import PublishedJob

DEADLINE = 300


def test_lost_logs_are_said_next_to_succeeded(system, system_clients):
    job_id = f"nolog-{uuid.uuid4().hex[:8]}"
    missing = "tpuq-nowhere-us-central2"
    system_clients.publish("jobs", PublishedJob.model_validate(
        {"id": job_id, "tpu": "v4-8", "command": "echo lost", "buckets": [f"gs://{missing}"]}), source="cli")
    jobs = system_clients.firestore.collection(store.JOBS)
    job = wait_for(lambda: (j := (jobs.document(job_id).get().to_dict() or {})).get("state") in
                   ("succeeded", "failed", "cancelled", "rejected") and j, timeout=DEADLINE, what=f"job {job_id} to end")
    assert job["state"] == "succeeded"
    shown = subprocess.run(["tpuq", "status", job_id], env={**os.environ, **system.env}, capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "succeeded" in shown.stdout
    assert f"but the logs of worker 0 could not be written to gs://{missing}: GCS 404" in shown.stdout, shown.stdout
