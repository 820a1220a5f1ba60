"""gcloud's own multislice commands against the fake, verbatim: `gcloud alpha compute tpus queued-resources create
NAME --node-count=2 --node-prefix=P ...` (v2alpha1's multiNodeParams), describe (alpha and GA), delete --force."""

from __future__ import annotations

import json

import pytest
from google.api_core import exceptions

from tpuq_dev.faketpu.control import FakeTpuControl

from .conftest import ZONE, qr_state, tpu_client, wait_until
from .test_gcloud import gcloud  # noqa: F401 - the fixture: gcloud pointed at the fast server

ALPHA_QR = ("alpha", "compute", "tpus", "queued-resources")


def test_gcloud_alpha_creates_a_two_slice_v4_32_request_and_deletes_every_slice(gcloud, fast_server):  # noqa: F811
    run, _, _, project = gcloud
    client, control = tpu_client(fast_server.url), FakeTpuControl(fast_server.url)
    parent = f"projects/{project}/locations/{ZONE}"
    name = f"{parent}/queuedResources/g-ms"
    run(*ALPHA_QR, "create", "g-ms", "--node-count=2", "--node-prefix=slice", "--zone", ZONE,
        "--accelerator-type", "v4-32", "--runtime-version", "tpu-ubuntu2204-base", "--spot")

    (post,) = control.calls(method="POST", path_contains=f"{parent}/queuedResources")
    assert post["path"].startswith("/v2alpha1/")
    assert post["body"]["tpu"]["nodeSpec"][0]["multiNodeParams"] == {"nodeCount": 2, "nodeIdPrefix": "slice"}
    assert control.quota(project, ZONE, "v4", "spot")["used"] in (0, 32)  # 2 x 16 chips once past ACCEPTED

    wait_until(lambda: qr_state(client, name) == "ACTIVE", what="ACTIVE", timeout=60)
    assert control.quota(project, ZONE, "v4", "spot")["used"] == 32
    alpha = json.loads(run(*ALPHA_QR, "describe", "g-ms", "--zone", ZONE, "--format=json").stdout)
    ga = json.loads(run("compute", "tpus", "queued-resources", "describe", "g-ms", "--zone", ZONE,
                        "--format=json").stdout)
    assert alpha["state"]["state"] == ga["state"]["state"] == "ACTIVE"
    assert alpha["tpu"]["nodeSpec"][0]["multiNodeParams"] == {"nodeCount": 2, "nodeIdPrefix": "slice"}
    assert ga["tpu"]["nodeSpec"][0]["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "slice"}
    vms = json.loads(run("compute", "tpus", "tpu-vm", "list", "--zone", ZONE, "--format=json").stdout)
    assert sorted(v["name"].rsplit("/", 1)[1] for v in vms) == ["slice-0", "slice-1"]
    assert all(len(v["networkEndpoints"]) == 4 and v["queuedResource"] == name for v in vms)

    refused = run(*ALPHA_QR, "create", "g-one", "--node-count=1", "--zone", ZONE, "--accelerator-type", "v4-8",
                  "--runtime-version", "tpu-ubuntu2204-base", check=False)
    assert refused.returncode != 0 and "Node count must be greater than 1" in refused.stderr  # gcloud's own check

    run(*ALPHA_QR, "delete", "g-ms", "--zone", ZONE, "--force", "--quiet")
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=name)
    assert list(client.list_nodes(parent=parent)) == []
    assert control.quota(project, ZONE, "v4", "spot")["used"] == 0
