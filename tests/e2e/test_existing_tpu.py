"""An `existing:` TPU on the local stack (issue 15 §2): a node made through the fake's API by hand, without tpuq's
labels, named in the fleet as `existing:`, runs a job and is still there afterwards; one whose ssh-keys lack the
executor's key is not used, and the waiting job and `tpuq fleet` say why and which gcloud line fixes it.
Witnesses: the jobs in Firestore, the fake TPU's call log (no create, no DELETE or PATCH of either node, even
after the idle timeout and a drain), and the nodes as the API lists them."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.runtime.fleetstore import load_control
from tpuq_dev.devstack.stack import DevStack
from tpuq_dev.faketpu.control import FakeTpuControl
from tests.helpers import wait_until

PROJECT = "tpuq-local"
ZONE = "us-central2-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
SCENARIO = {
    "seed": 7,
    "zones": {ZONE: {"quota": {"v4": {"spot": 64}}}},
    "delays": {"accepted": 1, "waiting": 2, "provisioning": 30, "suspending": 10, "deleting": 5, "host_keys": 30},
}
FLEET = {
    "name": "mine", "project": PROJECT, "ssh_transport": "direct",
    "idle_timeout_seconds": 2,  # an idle node tpuq owned would be deleted at once; these never are
    "tpus": [{"id": "keyed", "type": "v4-8", "zone": ZONE, "existing": "users-v4"},
             {"id": "keyless", "type": "v4-8", "zone": ZONE, "existing": "users-other-v4"}],
}
DEADLINE = 300


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = Path(tmp_path_factory.mktemp("tpuq-existing"))
    (root / "scenario.yaml").write_text(yaml.safe_dump(SCENARIO))
    (root / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    s = DevStack(state_dir=root / "stack", services=("scheduler", "claimer", "executor", "janitor"),
                 scenario=root / "scenario.yaml", fleet_file=root / "fleet.yaml", time_scale=60.0, tick_period=1.0,
                 extra_buckets=("tpuq-demo-us-central2",))
    with s.running():
        yield s


def tpuq(stack, *args) -> subprocess.CompletedProcess:
    done = subprocess.run(["tpuq", *args], env={**os.environ, **stack.env}, capture_output=True, text=True,
                          timeout=DEADLINE)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def make_by_hand(tpu, node_id: str, ssh_keys: str) -> None:
    """What a user does in the console: a node (through a queued resource) with no tpuq labels."""
    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", labels={"team": "ml"},
                       metadata={"ssh-keys": ssh_keys, "enable-oslogin": "FALSE"},
                       network_config=tpu_v2.NetworkConfig(enable_external_ips=True),
                       scheduling_config=tpu_v2.SchedulingConfig(spot=True))
    tpu.create_queued_resource(request=tpu_v2.CreateQueuedResourceRequest(
        parent=PARENT, queued_resource_id=node_id, queued_resource=tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
                parent=PARENT, node_id=node_id, node=node)]), spot=tpu_v2.QueuedResource.Spot())))


def test_an_existing_node_runs_jobs_and_is_never_changed_or_deleted(stack):
    env = stack.env
    clients = Clients(Settings.from_env(env))
    control = FakeTpuControl(env["TPUQ_TPU_API_ENDPOINT"])
    tpu = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                           client_options=ClientOptions(api_endpoint=env["TPUQ_TPU_API_ENDPOINT"]))
    public = Path(env["TPUQ_SSH_PUBLIC_KEY_FILE"]).read_text().split()
    others = "alice:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAlicesOwnKeyxxxxxxxxxxxxxxxxxxxxxxxxxxx alice@laptop"
    make_by_hand(tpu, "users-v4", f"{others}\ntpuq:{public[0]} {public[1]} tpuq-executor")
    make_by_hand(tpu, "users-other-v4", others)
    hand_made = {f"{PARENT}/nodes/users-v4", f"{PARENT}/nodes/users-other-v4"}

    # Any compatible job runs on the idle existing node; one naming it by tpu_name too.
    jobs = [f"x-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    clients.publish("jobs", {"id": jobs[0], "tpu": "v4-8", "command": "echo any on $TPU_WORKER_ID"})
    clients.publish("jobs", {"id": jobs[1], "tpu": "v4-8", "tpu_name": "users-v4", "command": "echo named"})
    keyless = f"x-{uuid.uuid4().hex[:8]}"
    clients.publish("jobs", {"id": keyless, "tpu": "v4-8", "tpu_name": "users-other-v4", "command": "echo never"})

    def job(job_id: str) -> dict:
        return clients.firestore.collection(store.JOBS).document(job_id).get().to_dict() or {}

    def diag() -> str:
        db = clients.firestore
        return repr({"jobs": [job(j) for j in jobs], "tpus": [d.to_dict() for d in db.collection(store.TPUS).stream()],
                     "existing": [d.to_dict() for d in db.collection(store.EXISTING_TPUS).stream()]})

    for job_id in jobs:
        try:
            wait_until(lambda: job(job_id).get("state") == "succeeded", timeout=DEADLINE, what=job_id)
        except AssertionError:
            raise AssertionError(diag()) from None
        done = wait_until(lambda: job(job_id).get("state") == "succeeded" and job(job_id), timeout=DEADLINE,
                          what=f"job {job_id} to run on the existing node")
        assert done["tpu"] == f"{PARENT}/nodes/users-v4"

    # The keyless node: not used; the waiting job and `tpuq fleet` say why and what to run.
    def status_text() -> str:
        return " ".join(tpuq(stack, "status", keyless).stdout.split())  # the terminal's wrapping undone

    status = wait_until(lambda: "SSH key is not in" in (out := status_text()) and out,
                        timeout=DEADLINE, what="the waiting job to say the key is missing")
    assert "users-other-v4" in status and "--metadata-from-file ssh-keys=keys.txt" in status
    assert job(keyless)["state"] == "pending"
    view = json.loads(tpuq(stack, "fleet", "--json").stdout)
    by_node = {e["node"]: e for e in view["existing"]}
    assert by_node["users-v4"]["usable"] is True and by_node["users-other-v4"]["usable"] is False
    assert "gcloud compute tpus tpu-vm update users-other-v4" in by_node["users-other-v4"]["fix"]
    human = " ".join(tpuq(stack, "fleet").stdout.split())
    assert "existing TPU users-v4" in human and "run: gcloud compute tpus tpu-vm describe users-other-v4" in human

    # Idle far beyond its 2 s timeout, then a drain: neither node is deleted nor changed, nothing is created.
    wait_until(lambda: (clients.firestore.collection(store.TPUS).document("users-v4").get().to_dict() or {})
               .get("state") == "idle", timeout=DEADLINE, what="the existing node idle again")
    tpuq(stack, "fleet", "drain", "--now")
    wait_until(lambda: load_control(clients.firestore, "mine").drain_id and not load_control(
        clients.firestore, "mine").drain_pending, timeout=DEADLINE, what="the drain to finish")
    calls = control.calls()
    touched = [c for c in calls if c["method"] in ("DELETE", "PATCH")
               and any(n.rsplit("/", 1)[-1] in c["path"] for n in hand_made)]
    assert touched == []
    creates = [c for c in calls if c["method"] == "POST" and c["path"].endswith("/queuedResources")]
    assert len(creates) == 2 and all("users-" in json.dumps(c) for c in creates), "only the test's own creates"
    listed = {n.name: n.state.name for n in tpu.list_nodes(parent=PARENT)}
    assert {listed.get(n) for n in hand_made} == {"READY"}
    print(f"fake TPU API calls: {len(calls)}; DELETE/PATCH of the hand-made nodes: {len(touched)}")

