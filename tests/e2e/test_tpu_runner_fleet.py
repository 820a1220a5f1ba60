"""A tpu-runner user's files on the local stack (issue 15, done-when): `tpuq dev up --fleet deployment.yaml` with a
tpu-runner deployment file as the fleet, and a tpu-runner job.yaml with a .tpu-runnerignore, `tpu: any` and
`tpuq submit --job-id`. Witnesses: the job's state in Firestore, the fake TPU's call log, the worker's own check
that the ignored file did not arrive, and the log it wrote to the bucket the test created."""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.operations.stackenv import load_env
from tpuq_dev.faketpu.control import FakeTpuControl

DEADLINE = 300
ZONE = "us-central2-b"
BUCKET = "runner-e2e-us-central2"

# tpu-runner's field set, unchanged: what `tpu-runner init` writes, cut down to one zone the scenario offers.
DEPLOYMENT = textwrap.dedent(f"""\
    name: runner-e2e
    project: tpuq-local
    controller_region: us-central1
    controller_timeout: 168h
    controller_memory: 1Gi
    controller_max_retries: 3
    ssh_transport: direct
    idle_timeout_seconds: 8
    firestore_location: nam5
    network: default
    subnetwork: default
    worker_secrets: []
    tpus:
      - id: us-central2b-v4-spot
        type: v4-8
        zone: {ZONE}
        runtime: tpu-ubuntu2204-base
        count: 1
        keep_warm_count: 0
        chip_limit: 4
    """)
SCENARIO = textwrap.dedent(f"""\
    seed: 5
    zones:
      {ZONE}:
        quota: {{v4: {{spot: 64}}}}
    delays: {{accepted: 1, waiting: 5, provisioning: 60, suspending: 10, deleting: 5, host_keys: 30}}
    """)
JOB = textwrap.dedent(f"""\
    jobs:
      - tpu: any
        buckets:
          - gs://{BUCKET}
        bundle: .
        priority: high
        retry_on_infrastructure_failure: false
        command: test -f train.py && test ! -e secret.env && test ! -e data/raw.bin && echo "runner job on $TPU_WORKER_ID"
    """)


def tpuq(*args, env, timeout=DEADLINE):
    return subprocess.run(["tpuq", *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def runner_stack(tmp_path):
    (tmp_path / "deployment.yaml").write_text(DEPLOYMENT)
    (tmp_path / "scenario.yaml").write_text(SCENARIO)
    env = {**os.environ, "TPUQ_DEV_DIR": str(tmp_path / "dev")}
    up = tpuq("dev", "up", "--fleet", str(tmp_path / "deployment.yaml"), "--scenario", str(tmp_path / "scenario.yaml"),
              "--tick-period", "1", env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield {**env, **load_env(tmp_path / "dev")}
    finally:
        down = tpuq("dev", "down", env=env)
        assert down.returncode == 0, down.stderr


def test_a_job_runs_with_a_tpu_runner_deployment_as_the_fleet(runner_stack, tmp_path):
    env = runner_stack
    clients = Clients(Settings.from_env(env))
    clients.storage.create_bucket(BUCKET)
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text("print('train')\n")
    (project / "secret.env").write_text("TOKEN=do-not-upload\n")
    (project / "data" / "raw.bin").write_text("big\n")
    (project / ".tpu-runnerignore").write_text("# tpu-runner's ignore file\n*.env\ndata\n")
    (project / "job.yaml").write_text(JOB)

    submit = tpuq("submit", str(project / "job.yaml"), "--job-id", "runner-e2e-1", "--wait", "--timeout",
                  str(DEADLINE), env=env, timeout=DEADLINE + 60)
    assert submit.returncode == 0, submit.stdout + submit.stderr
    assert "submitted runner-e2e-1" in submit.stdout and "ignore files used: .tpu-runnerignore" in submit.stdout

    job = clients.firestore.collection(store.JOBS).document("runner-e2e-1").get().to_dict()
    assert job["state"] == "succeeded" and job["spec"]["tpu"] == ["any"]
    assert job["spec"]["retry_on_infrastructure_failure"] is False
    creates = FakeTpuControl(env["TPUQ_TPU_API_ENDPOINT"]).calls(method="POST", path_contains="queuedResources")
    assert creates and all(f"/locations/{ZONE}/" in c["path"] for c in creates)
    logs = tpuq("logs", "runner-e2e-1", env=env, timeout=60)
    assert "runner job on 0" in logs.stdout, logs.stdout + logs.stderr
