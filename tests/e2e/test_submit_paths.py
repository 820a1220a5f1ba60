"""End to end, one test per submit path: tpuq submit, gcloud publish, and a job file uploaded to the bucket.

Witnesses: Firestore (job state), GCS (logs and status objects), the fake TPU's call log, and the hosts.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from tpuq.contracts import store
from tpuq_dev.devstack.stack import wait_for
from tpuq_dev.faketpu.control import FakeTpuControl

DEADLINE = 300


def job_state(clients, job_id):
    snap = clients.firestore.collection(store.JOBS).document(job_id).get()
    return (snap.to_dict() or {}) if snap.exists else {}


def wait_terminal(clients, job_id):
    return wait_for(lambda: (j := job_state(clients, job_id)).get("state") in
                    ("succeeded", "failed", "cancelled", "rejected") and j, timeout=DEADLINE,
                    what=f"job {job_id} to end")


def test_cli_submit_runs_on_every_worker(system, system_clients, tmp_path):
    job_dir = tmp_path / "proj"
    job_dir.mkdir()
    (job_dir / "hello.sh").write_text('echo "hello from worker $TPU_WORKER_ID of $TPU_WORKER_COUNT job $JOB_ID"\n')
    job_id = f"cli-{uuid.uuid4().hex[:8]}"
    (job_dir / "job.yaml").write_text(json.dumps({"jobs": [{
        "id": job_id, "tpu": "v4-32", "bundle": ".", "buckets": ["gs://tpuq-demo-us-central2"],
        "command": "sh hello.sh"}]}))
    r = subprocess.run(["tpuq", "submit", str(job_dir / "job.yaml"), "--wait", "--timeout", str(DEADLINE)],
                       env={**os.environ, **system.env}, capture_output=True, text=True, timeout=DEADLINE + 30)
    assert r.returncode == 0, r.stdout + r.stderr
    job = job_state(system_clients, job_id)
    assert job["state"] == "succeeded"
    logs = subprocess.run(["tpuq", "logs", job_id], env={**os.environ, **system.env}, capture_output=True,
                          text=True, timeout=DEADLINE)
    for w in range(4):
        assert f"[w{w}] hello from worker {w} of 4 job {job_id}" in logs.stdout
    # Its slice (perhaps an earlier job's, reused) was created by the claimer through the fake TPU API: a single
    # slice's node id is its queued resource's id.
    calls = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"]).calls(method="POST", path_contains="queuedResources")
    node_id = job["tpu"].rsplit("/", 1)[-1]
    assert [c for c in calls if f"queuedResourceId={node_id}" in c["query"].split("&")], (node_id, calls[-3:])


@pytest.fixture
def gcloud_env(system, tmp_path):
    env = {**os.environ, **system.env, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
           "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": f"http://{system.env['PUBSUB_EMULATOR_HOST']}/",
           "CLOUDSDK_CORE_PROJECT": system.project}
    subprocess.run(["gcloud", "config", "set", "auth/disable_credentials", "true"], env=env, check=True,
                   capture_output=True)
    return env


def test_gcloud_publish_runs(system_clients, gcloud_env):
    job_id = f"gc-{uuid.uuid4().hex[:8]}"
    message = json.dumps({"id": job_id, "tpu": "v4-8", "command": "echo from gcloud"})
    r = subprocess.run(["gcloud", "pubsub", "topics", "publish", "jobs", "--message", message], env=gcloud_env,
                       capture_output=True, text=True, timeout=DEADLINE)
    assert r.returncode == 0, r.stderr
    assert wait_terminal(system_clients, job_id)["state"] == "succeeded"


def test_bucket_upload_runs_and_result_is_written_beside_it(system, system_clients):
    bucket = system_clients.storage.bucket(system.runner_bucket)
    name = f"submit/{uuid.uuid4().hex[:8]}.yaml"
    bucket.blob(name).upload_from_string("jobs:\n  - tpu: v4-8\n    command: echo from the bucket\n")
    result_blob = bucket.blob(name + ".result.json")
    result = wait_for(lambda: result_blob.exists() and json.loads(result_blob.download_as_bytes()), timeout=DEADLINE,
                      what="the submit result beside the job file")
    [job_id] = result["job_ids"]
    assert wait_terminal(system_clients, job_id)["state"] == "succeeded"

    bad = f"submit/{uuid.uuid4().hex[:8]}.yaml"
    bucket.blob(bad).upload_from_string("jobs:\n  - tpu: v4-8\n    priority: urgent\n    command: x\n")
    bad_result = bucket.blob(bad + ".result.json")
    error = wait_for(lambda: bad_result.exists() and json.loads(bad_result.download_as_bytes()), timeout=DEADLINE,
                     what="the validation error beside the job file")
    assert "jobs[0].priority" in error["error"]
