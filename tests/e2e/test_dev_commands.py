"""The local stack does what a TPU VM does, driven as a person does: a job checkpoints to $CHECKPOINT_GCS_DIR with
`gcloud storage` and no change, `tpuq ssh` shows one worker's processes only, and `tpuq dev dirty|preempt|unhealthy`
hold a worker's device, preempt the job's slice after a notice its workers see, and make its next slice unhealthy."""

from __future__ import annotations

import os
import subprocess
import uuid

import requests

from tpuq.contracts import store
from tpuq.contracts.documents import JobState
from tpuq.contracts.messages import CancelRequest
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq_dev.faketpu.control import FakeTpuControl, FakeTpuControlError
from tests.helpers import wait_until

DEADLINE = 300
BUCKET = "tpuq-demo-us-central2"
FLAVOR = {"Metadata-Flavor": "Google"}
HOLDERS = ("for p in /proc/[0-9]*; do for f in $p/fd/*; do case $(readlink $f) in /dev/vfio/*|/dev/accel*) "
           "echo holder ${p#/proc/} $(readlink $f);; esac; done; done")


def tpuq(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tpuq", *args], env=env, capture_output=True, text=True, timeout=DEADLINE)


def metadata(host: dict, key: str) -> str | None:
    """`instance/<key>` from the host's metadata server; None: the server is gone (its node deleted)."""
    try:
        return requests.get(f"http://{host['internal_address']}/computeMetadata/v1/instance/{key}", headers=FLAVOR,
                            timeout=5).text
    except requests.ConnectionError:
        return None


def node_state(control: FakeTpuControl, node: str) -> str:
    try:
        return control.node_info(node)["node"]["state"]
    except FakeTpuControlError as e:
        if "404" in str(e):
            return "gone"
        raise


def test_a_job_s_life_on_the_fake_hosts_through_the_dev_commands(system):
    env = {**os.environ, **system.env}
    clients = Clients(Settings.from_env(system.env))
    db = clients.firestore
    control = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"])
    job_id = f"dev-{uuid.uuid4().hex[:6]}"
    # Worker 0 checkpoints with gcloud storage, as on a TPU VM: nothing in the command says where Cloud Storage is.
    command = ('if [ "$TPU_WORKER_ID" = 0 ]; then echo step-7 > /tmp/ck && '
               'gcloud storage cp /tmp/ck "$CHECKPOINT_GCS_DIR/ck-$ATTEMPT_ID" || exit 3; fi; sleep 900')
    clients.publish("jobs", {"id": job_id, "tpu": "v4-32", "buckets": [f"gs://{BUCKET}"], "command": command})

    def running_on(not_on: str | None = None):
        job = db.collection(store.JOBS).document(job_id).get().to_dict() or {}
        return job if job.get("state") == JobState.running and job.get("tpu") != not_on else None

    first = wait_until(running_on, timeout=DEADLINE, what=f"{job_id} running")
    # Waits for the running job, whatever slices other tests on this stack free meanwhile.
    waiting = f"dev-wait-{uuid.uuid4().hex[:6]}"
    try:
        blobs = clients.storage.bucket(BUCKET)  # the system stack's fake GCS, whatever this process's environment says
        found = wait_until(lambda: [b for b in blobs.list_blobs(prefix=f"tpuq/jobs/{job_id}/checkpoints/")],
                           timeout=120, what="the checkpoint in fake GCS")
        assert [(b.name, b.download_as_text()) for b in found] == [
            (f"tpuq/jobs/{job_id}/checkpoints/ck-{first['attempt_id']}", "step-7\n")]
        # Errors name what is wrong.
        unknown = tpuq(env, "dev", "preempt", "no-such-job")
        assert unknown.returncode == 1 and "no-such-job" in unknown.stderr, unknown.stderr
        beyond = tpuq(env, "dev", "dirty", job_id, "--worker", "4")
        assert beyond.returncode == 1 and beyond.stderr.strip() == f"error: --worker 4: job {job_id} has 4 workers, 0-3"
        clients.publish("jobs", {"id": waiting, "tpu": "v4-32", "depends_on": [job_id], "command": "true"})
        wait_until(lambda: db.collection(store.JOBS).document(waiting).get().exists, timeout=DEADLINE, what="stored")
        pending = tpuq(env, "dev", "unhealthy", waiting)
        assert pending.returncode == 1 and pending.stderr.strip() == f"error: job {waiting} is pending: it is on no TPU slice now"
        clients.publish("cancels", CancelRequest(job_id=waiting, reason="test over"))  # not to take the next slice
        # dirty: a holder of /dev/vfio/0 on worker 1, seen there (and only there) through /proc.
        dirty = tpuq(env, "dev", "dirty", job_id, "--worker", "1")
        assert dirty.returncode == 0, dirty.stderr
        assert "holds /dev/vfio/0 open" in dirty.stdout and "worker 1 of" in dirty.stdout
        on_1 = tpuq(env, "ssh", job_id, "--worker", "1", "--", HOLDERS + "; ps -eo pid,args")
        on_2 = tpuq(env, "ssh", job_id, "--worker", "2", "--", HOLDERS + "; ps -eo pid,args")
        assert on_1.returncode == 0 and on_2.returncode == 0, on_1.stderr + on_2.stderr
        assert [line.split()[2] for line in on_1.stdout.splitlines() if line.startswith("holder ")] == ["/dev/vfio/0"]
        assert "sleep infinity" in on_1.stdout
        assert not [line for line in on_2.stdout.splitlines() if line.startswith("holder ")]
        assert "sleep infinity" not in on_2.stdout  # worker 2's processes only
        assert any(line.split()[:2] == ["1", "sshd:"] or line.split()[0] == "1" and "sshd" in line
                   for line in on_2.stdout.splitlines())  # pid 1 is the host's sshd
        assert "sleep 900" in on_2.stdout  # the job runs there too
        # preempt: the notice on every worker's metadata server, then the node PREEMPTED. The hosts are read
        # before: once the notice is over the node may be gone already (a loaded machine is slow to look).
        hosts = control.node_info(first["tpu"])["hosts"]
        preempt = tpuq(env, "dev", "preempt", job_id, "--notice", "15")
        assert preempt.returncode == 0, preempt.stderr
        assert "instance/preempted TRUE" in preempt.stdout and "(in 15 s)" in preempt.stdout
        # (Read from here, at each host's metadata address: the job, told at once, may have ended already, and
        # then tpuq may delete the doomed slice before the notice is over: its metadata servers go with it.)
        seen = [metadata(host, "preempted") for host in hosts]
        if None in seen:
            assert node_state(control, first["tpu"]) != "READY", seen
        else:
            assert seen == ["TRUE"] * len(hosts)
            assert {metadata(host, "maintenance-event") for host in hosts} <= {"TERMINATE_ON_HOST_MAINTENANCE", None}
        wait_until(lambda: node_state(control, first["tpu"]) in ("PREEMPTED", "gone"), timeout=60,
                   what="the node PREEMPTED (or deleted since: the attempt ended on the notice)")
        # The job runs again on a new slice; `tpuq dev unhealthy` makes that one report itself unhealthy.
        second = wait_until(lambda: running_on(not_on=first["tpu"]), timeout=DEADLINE, what="the retry running")
        sick = tpuq(env, "dev", "unhealthy", job_id)
        assert sick.returncode == 0, sick.stderr
        assert "now reports health UNHEALTHY_TENSORFLOW" in sick.stdout
        node = control.node_info(second["tpu"])["node"]
        assert node["health"] == "UNHEALTHY_TENSORFLOW", node
    finally:
        clients.publish("cancels", CancelRequest(job_id=waiting, reason="test over"))
        clients.publish("cancels", CancelRequest(job_id=job_id, reason="test over"))
