"""gcloud's own TPU commands against the fake: alpha (/v2alpha1/) and GA (/v2/), same states as the client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest
from google.api_core import exceptions

from tpuq_dev.faketpu.control import FakeTpuControl

from .conftest import NO_QUOTA_ZONE, ZONE, qr_state, tpu_client, wait_until

GCLOUD = shutil.which("gcloud")
pytestmark = pytest.mark.skipif(GCLOUD is None, reason="gcloud is not installed")


@pytest.fixture(scope="module")
def gcloud(fast_server, tmp_path_factory):
    """Run gcloud against the fake in a throwaway configuration; returns (run, project)."""
    project = f"gcloud-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": str(tmp_path_factory.mktemp("gcloud-config")),
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": fast_server.url + "/",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
    }

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [GCLOUD, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def finish(process: subprocess.Popen, check: bool = True) -> subprocess.CompletedProcess:
        out, err = process.communicate(timeout=120)
        if check and process.returncode:
            raise AssertionError(f"{process.args} exited {process.returncode}: {err}")
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return finish(start(*args), check)

    run("config", "set", "auth/disable_credentials", "true")
    run("config", "set", "core/project", project)
    return run, start, finish, project


def test_gcloud_create_describe_list_delete_show_the_fake_states(gcloud, fast_server):
    run, start, finish, project = gcloud
    client, control = tpu_client(fast_server.url), FakeTpuControl(fast_server.url)
    parent = f"projects/{project}/locations/{ZONE}"
    common = ["--zone", ZONE, "--runtime-version", "tpu-ubuntu2204-base", "--format=json"]
    alpha_qr = ["alpha", "compute", "tpus", "queued-resources"]
    creates = [
        start(*alpha_qr, "create", "g-spot", "--node-id", "g-spot-node", "--accelerator-type", "v4-32", "--spot",
              "--metadata", "ssh-keys=someone:ssh-ed25519 AAAA someone", "--valid-until-duration", "1h", *common),
        start(*alpha_qr, "create", "g-model", "--node-id", "g-model-node", "--accelerator-type", "v4-8",
              "--provisioning-model=SPOT", *common),
        start(*alpha_qr, "create", "g-guar", "--node-id", "g-guar-node", "--accelerator-type", "v4-8", "--guaranteed",
              *common),
    ]
    for process in creates:
        finish(process)

    posts = {c["args"]["queuedResourceId"]: c for c in control.calls(method="POST", path_contains=project)}
    assert all(c["path"].startswith("/v2alpha1/") for c in posts.values())
    assert "spot" in posts["g-spot"]["body"] and posts["g-model"]["body"]["provisioningModel"] == "SPOT"
    assert "guaranteed" in posts["g-guar"]["body"]
    assert control.quota(project, ZONE, "v4", "spot")["used"] == 16 + 4
    assert control.quota(project, ZONE, "v4", "on_demand")["used"] == 4

    names = ["g-spot", "g-model", "g-guar"]
    wait_until(lambda: all(qr_state(client, f"{parent}/queuedResources/{n}") == "ACTIVE" for n in names), what="ACTIVE")

    alpha = json.loads(run(*alpha_qr, "describe", "g-spot", "--zone", ZONE, "--format=json").stdout)
    ga = json.loads(run("compute", "tpus", "queued-resources", "describe", "g-spot", "--zone", ZONE, "--format=json").stdout)
    assert alpha["state"]["state"] == ga["state"]["state"] == "ACTIVE"
    assert alpha["name"] == ga["name"] == f"{parent}/queuedResources/g-spot" and "spot" in alpha

    listed_alpha = json.loads(run(*alpha_qr, "list", "--zone", ZONE, "--format=json").stdout)
    listed_ga = json.loads(run("compute", "tpus", "queued-resources", "list", "--zone", ZONE, "--format=json").stdout)
    expected = {f"{parent}/queuedResources/{n}": "ACTIVE" for n in names}
    assert {q["name"]: q["state"]["state"] for q in listed_alpha} == expected
    assert {q["name"]: q["state"]["state"] for q in listed_ga} == expected

    vm = json.loads(run("compute", "tpus", "tpu-vm", "describe", "g-spot-node", "--zone", ZONE, "--format=json").stdout)
    node = client.get_node(name=f"{parent}/nodes/g-spot-node")
    assert vm["state"] == node.state.name == "READY"
    assert [e["ipAddress"] for e in vm["networkEndpoints"]] == [e.ip_address for e in node.network_endpoints]
    assert len(vm["networkEndpoints"]) == 4 and vm["acceleratorConfig"]["topology"] == "2x2x4"
    vms = json.loads(run("compute", "tpus", "tpu-vm", "list", "--zone", ZONE, "--format=json").stdout)
    assert sorted(v["name"].rsplit("/", 1)[1] for v in vms) == ["g-guar-node", "g-model-node", "g-spot-node"]

    # Without --force an ACTIVE request with nodes is refused, as by the real API.
    refused = run(*alpha_qr, "delete", "g-guar", "--zone", ZONE, "--quiet", check=False)
    assert refused.returncode != 0 and "force" in refused.stderr
    for process in [start(*alpha_qr, "delete", n, "--zone", ZONE, "--force", "--quiet") for n in names]:
        finish(process)
    for n in names:
        with pytest.raises(exceptions.NotFound):
            client.get_queued_resource(name=f"{parent}/queuedResources/{n}")
    assert control.quota(project, ZONE, "v4", "spot")["used"] == 0


def test_gcloud_shows_a_failed_request_with_its_error(gcloud, fast_server):
    run, _, _, project = gcloud
    client = tpu_client(fast_server.url)
    name = f"projects/{project}/locations/{NO_QUOTA_ZONE}/queuedResources/g-failed"
    run("alpha", "compute", "tpus", "queued-resources", "create", "g-failed", "--node-id", "g-failed-node",
        "--zone", NO_QUOTA_ZONE, "--accelerator-type", "v4-8", "--runtime-version", "tpu-ubuntu2204-base", "--spot")
    wait_until(lambda: qr_state(client, name) == "FAILED", what="FAILED")
    described = json.loads(
        run("compute", "tpus", "queued-resources", "describe", "g-failed", "--zone", NO_QUOTA_ZONE, "--format=json").stdout
    )
    assert described["state"]["state"] == "FAILED"
    assert described["state"]["failedData"]["error"]["message"].startswith(
        "Quota limit 'TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded."
    )
    run("alpha", "compute", "tpus", "queued-resources", "delete", "g-failed", "--zone", NO_QUOTA_ZONE, "--quiet")
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=name)
