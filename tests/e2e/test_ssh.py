"""`tpuq ssh` as a person uses it: on the local stack straight to a worker's sshd (one command, its exit code, a
live shell in tmux), and against a project handed over to gcloud (a recording stand-in first on PATH) with the
IAP firewall check read from the fake's compute endpoint."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.contracts.documents import JobDoc, JobState
from tpuq.contracts.messages import CancelRequest
from tpuq.operations.sshaccess import IAP_RANGE
from tpuq_dev.faketpu.control import FakeTpuControl
from tests.helpers import wait_until

DEADLINE = 300


def tpuq(env: dict, *args: str, timeout: float = DEADLINE) -> subprocess.CompletedProcess:
    return subprocess.run(["tpuq", *args], env=env, capture_output=True, text=True, timeout=timeout)


def local_env(system) -> dict:
    return {**os.environ, **system.env}


@pytest.fixture(scope="module")
def pod_job(system, tmp_path_factory):
    """A 4-worker v4-32 job submitted with `tpuq submit`, running (a long sleep) while the tests use it."""
    env = local_env(system)
    job_id = f"ssh-{uuid.uuid4().hex[:6]}"
    folder = tmp_path_factory.mktemp("ssh-job")
    (folder / "job.yaml").write_text(f"jobs:\n  - id: {job_id}\n    tpu: v4-32\n"
                                     "    buckets: [gs://tpuq-demo-us-central2]\n    command: sleep 900\n")
    submitted = tpuq(env, "submit", str(folder / "job.yaml"))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr

    db = Clients(Settings.from_env(system.env)).firestore

    def running():  # polled in Firestore: a CLI call per poll is seconds on a loaded machine
        stored = db.collection(store.JOBS).document(job_id).get().to_dict() or {}
        return stored if stored.get("state") == JobState.running else None

    job = wait_until(running, timeout=DEADLINE, what=f"{job_id} running")
    yield job_id, job
    tpuq(env, "cancel", job_id)


def write_on_host(system, node: str, worker: int, name: str, text: str) -> None:
    """A file in one worker host's own /tmp (each fake host has its own), written from outside."""
    hosts = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"]).node_info(node)["hosts"]
    Path(hosts[worker]["tmp_dir"], name).write_text(text)


def test_one_command_on_worker_2_of_a_running_pod_job(system, pod_job):
    job_id, job = pod_job
    env = local_env(system)
    marker = f"m-{uuid.uuid4().hex[:8]}"
    write_on_host(system, job["tpu"], 2, marker, "only on worker 2\n")

    on_2 = tpuq(env, "ssh", job_id, "--worker", "2", "--", "cat", f"/tmp/{marker}", "&&", "echo", "$((6*7))")
    assert on_2.returncode == 0, on_2.stderr
    assert on_2.stdout.splitlines() == ["only on worker 2", "42"]  # the worker's shell ran the words
    on_1 = tpuq(env, "ssh", job_id, "--worker", "1", "--", "test", "-e", f"/tmp/{marker}")
    assert on_1.returncode == 1, on_1.stderr  # another host: the file is not there
    assert tpuq(env, "ssh", job_id, "--", "exit 7").returncode == 7  # worker 0; the exit code passed through

    beyond = tpuq(env, "ssh", job_id, "--worker", "7", "--", "true")
    assert beyond.returncode == 1 and beyond.stderr.strip() == f"error: --worker 7: job {job_id} has 4 workers, 0-3"
    logs = tpuq(env, "logs", job_id, "--worker", "7")
    assert logs.returncode == 1 and logs.stderr.strip() == f"error: --worker 7: job {job_id} has 4 workers, 0-3"

    # Every connection went to the address the executor uses (the internal one, for this vpc fleet).
    host = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"]).node_info(job["tpu"])["hosts"][2]
    assert host["address"] == host["internal_address"]


def test_only_a_running_job(system, pod_job):
    env = local_env(system)
    # Waits for pod_job, whatever slices other tests on this stack free meanwhile.
    waiting = f"ssh-wait-{uuid.uuid4().hex[:6]}"
    clients = Clients(Settings.from_env(system.env))
    clients.publish("jobs", {"id": waiting, "tpu": "v4-32", "depends_on": [pod_job[0]], "command": "true"})
    try:
        wait_until(lambda: clients.firestore.collection(store.JOBS).document(waiting).get().exists,
                   timeout=DEADLINE, what=f"{waiting} stored")
        refused = tpuq(env, "ssh", waiting)
    finally:  # what `tpuq cancel` publishes (a CLI call is seconds on a loaded machine)
        clients.publish("cancels", CancelRequest(job_id=waiting, reason="test over"))
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"error: job {waiting} is pending, not running: it has no TPU yet")


def test_an_interactive_shell_in_tmux(system, pod_job, tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux)")
    job_id, job = pod_job
    marker = f"w1-{uuid.uuid4().hex[:8]}"
    write_on_host(system, job["tpu"], 1, marker, "this is worker 1\n")
    socket = f"tpuq-ssh-{uuid.uuid4().hex[:8]}"  # a tmux server of its own
    env = {**local_env(system), "TERM": "xterm", "TPUQ_TEST_SIDE": "local"}  # sshd forwards no environment

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket, *args], env=env, capture_output=True, text=True, timeout=30,
                              check=True).stdout

    tmux("new-session", "-d", "-s", "ssh", "-x", "160", "-y", "40", "sh")
    try:
        tmux("send-keys", "-t", "ssh", f"tpuq ssh {job_id} --worker 1", "Enter")
        tmux("send-keys", "-t", "ssh", "echo marker-$((6*7)); cat /tmp/" + marker, "Enter")
        def answered() -> str:
            screen = tmux("capture-pane", "-p", "-t", "ssh")
            return screen if "this is worker 1" in screen else ""

        screen = wait_until(answered, timeout=DEADLINE, what="the remote shell's answer")
        # Run by the remote shell, not only typed: a line of output (after the prompt), not the echo command.
        assert any(line.split("$ ")[-1] == "marker-42" for line in screen.splitlines()), screen
        tmux("send-keys", "-t", "ssh", "exit", "Enter")
        typed_at: list[float] = []

        def local_shell_answers() -> bool:
            # What is typed while the remote shell is still exiting goes to it and is lost with it: type again
            # now and then. Only the local shell knows TPUQ_TEST_SIDE, so the remote one cannot pass this.
            if any(line.split("$ ")[-1] == "back-local"
                   for line in tmux("capture-pane", "-p", "-t", "ssh").splitlines()):
                return True
            if not typed_at or time.monotonic() - typed_at[-1] > 3:
                tmux("send-keys", "-t", "ssh", "echo back-$TPUQ_TEST_SIDE", "Enter")
                typed_at.append(time.monotonic())
            return False

        wait_until(local_shell_answers, timeout=DEADLINE, what="the local shell after exit")
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=30)


# ------------------------------------------------------------------ against a project: gcloud
GCLOUD_STAND_IN = """#!/bin/sh
for a in "$@"; do printf '%s\\n' "$a"; done > "$GCLOUD_RECORD"
exit 5
"""


@pytest.fixture
def project_env(system, tmp_path):
    """The CLI as on a laptop against a project: no local stack key, so gcloud; gcloud a recording stand-in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(GCLOUD_STAND_IN)
    (bin_dir / "gcloud").chmod(0o755)
    env = {**local_env(system), "PATH": f"{bin_dir}:{os.environ['PATH']}", "GCLOUD_RECORD": str(tmp_path / "argv")}
    env.pop("TPUQ_SSH_PRIVATE_KEY_FILE", None)
    return env


def recorded(env) -> list[str] | None:
    path = Path(env["GCLOUD_RECORD"])
    return path.read_text().splitlines() if path.exists() else None


def test_project_worker_with_external_ip_gets_gcloud_ga(system, pod_job, project_env):
    job_id, job = pod_job  # the demo fleet (vpc, 4 hosts) gives its nodes external IPs
    node, zone = job["tpu"], job["zone"]
    done = tpuq(project_env, "ssh", job_id, "--worker", "3", "--", "hostname")
    assert done.returncode == 5, done.stderr  # gcloud's exit code is tpuq's
    assert recorded(project_env) == ["compute", "tpus", "tpu-vm", "ssh", node.rsplit("/", 1)[-1], f"--zone={zone}",
                                     "--project=tpuq-local", "--worker=3", "--command=hostname"]


IAP_PROJECT = "ssh-iap-lab"
IAP_ZONE = "us-central2-a"


@pytest.fixture(scope="module")
def private_node(system):
    """A node without external IPs (networkConfig.enableExternalIps false) in a project of its own, and a job
    running on it there; what the project's firewall holds is set per test through the fake."""
    endpoint = system.env["TPUQ_TPU_API_ENDPOINT"]
    tpu = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                           client_options=ClientOptions(api_endpoint=endpoint))
    parent = f"projects/{IAP_PROJECT}/locations/{IAP_ZONE}"
    node_id = f"tpuq-priv-{uuid.uuid4().hex[:6]}"
    spec = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", tags=["tpuq-worker"],
                       network_config=tpu_v2.NetworkConfig(network="default", enable_external_ips=False),
                       scheduling_config=tpu_v2.SchedulingConfig(spot=True))
    tpu.create_queued_resource(request=tpu_v2.CreateQueuedResourceRequest(
        parent=parent, queued_resource_id=node_id, queued_resource=tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
                parent=parent, node_id=node_id, node=spec)]), spot=tpu_v2.QueuedResource.Spot())))
    name = f"{parent}/nodes/{node_id}"
    wait_until(lambda: tpu.get_node(name=name).state == tpu_v2.Node.State.READY, timeout=DEADLINE, what=name)
    db = Clients(Settings.from_env({**system.env, "GOOGLE_CLOUD_PROJECT": IAP_PROJECT})).firestore
    job_id = f"iap-{uuid.uuid4().hex[:6]}"
    db.collection("jobs").document(job_id).set(JobDoc.fields(id=job_id, state=JobState.running, tpu=name, zone=IAP_ZONE))
    yield job_id, name
    requests.delete(f"{endpoint}/v2/{parent}/queuedResources/{node_id}", params={"force": "true"}, timeout=30)


def iap_env(project_env) -> dict:
    return {**project_env, "GOOGLE_CLOUD_PROJECT": IAP_PROJECT}


IAP_RULE = {"name": "allow-iap-ssh", "sourceRanges": [IAP_RANGE], "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
            "targetTags": ["tpuq-worker"]}


OWNER_COMMAND = ("gcloud compute firewall-rules create default-allow-ssh-from-iap --project=ssh-iap-lab "
                 "--network=default --direction=INGRESS --action=ALLOW --rules=tcp:22 "
                 "--source-ranges=35.235.240.0/20 --target-tags=tpuq-worker")


@pytest.mark.parametrize("rules, unreadable, exit_code", [([], False, 1), ([IAP_RULE], False, 5), ([], True, 5)],
                         ids=["no-rule", "iap-rule", "rules-unreadable"])
def test_project_worker_without_external_ip(system, private_node, project_env, rules, unreadable, exit_code):
    job_id, node = private_node
    env = iap_env(project_env)
    google = FakeTpuControl(system.env["TPUQ_COMPUTE_API_ENDPOINT"])
    google.set_firewalls(IAP_PROJECT, rules, permission_denied=unreadable)
    google.clear_calls()
    try:
        done = tpuq(env, "ssh", job_id)
    finally:
        google.set_firewalls(IAP_PROJECT, None)
    assert done.returncode == exit_code, done.stderr
    # The check read the project's firewalls (compute v1 firewalls.list) and changed nothing.
    calls = google.calls(path_contains="/firewalls")
    assert [(c["method"], c["path"]) for c in calls] == [("GET", f"/compute/v1/projects/{IAP_PROJECT}/global/firewalls")]
    short = node.rsplit("/", 1)[-1]
    if exit_code == 1:
        assert recorded(env) is None  # gcloud never ran
        assert done.stderr.startswith(f"error: worker 0 of {short} has no external IP")
        assert done.stderr.rstrip().endswith(OWNER_COMMAND)
        return
    assert recorded(env) == ["alpha", "compute", "tpus", "tpu-vm", "ssh", short, f"--zone={IAP_ZONE}",
                             f"--project={IAP_PROJECT}", "--worker=0", "--tunnel-through-iap"]
    if unreadable:  # said, with the owner's command in case the tunnel fails, and tried anyway
        assert "could not read the firewall rules of ssh-iap-lab (HTTP 403" in done.stderr
        assert OWNER_COMMAND in done.stderr
    else:
        assert "allow-iap-ssh" in done.stderr
