"""Subnets are regional, in the fake: its compute v1 subnetworks (read only, the shape of compute's discovery
document) and its TPU API's create, which refuses a networkConfig naming a subnet its node's region lacks; the
claimer's create reads that refusal as the network class, and deploy's read finds the same layout."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

import pytest
import requests

from tpuq.claimer.classify import classify
from tpuq.claimer.model import REQUESTED, QrRecord
from tpuq.claimer.tpuapi import TpuApi
from tpuq.deploy import gcp, network
from tpuq.deploy.plan import Target
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.messages import FailureClass
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.server import FakeTpuServer

from .conftest import tpu_client

SCENARIO = {
    "zones": {"us-central2-b": {"quota": {"v4": {"spot": 64}}}, "europe-west4-a": {"quota": {"v5litepod": {"spot": 64}}}},
    # A custom-mode tpu-net with a subnet in us-central2 only; `default` stays auto-mode (the scenario default).
    "network": {"subnetworks": [{"name": "tpu-subnet", "region": "us-central2", "network": "tpu-net",
                                 "ipCidrRange": "10.20.0.0/20"}]},
}
PROJECT = "subnet-project"


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    with FakeTpuServer(SCENARIO, time_scale=600, state_dir=tmp_path_factory.mktemp("faketpu-subnets"),
                       worker_hosts=False) as server:
        yield server


def _schema(name: str) -> dict:
    import googleapiclient

    path = os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents", "compute.v1.json")
    with open(path) as f:
        return json.load(f)["schemas"][name]["properties"]


def _get(fake, project: str, region: str, name: str | None = None) -> requests.Response:
    tail = f"/{name}" if name else ""
    return requests.get(f"{fake.google_apis_url}/compute/v1/projects/{project}/regions/{region}/subnetworks{tail}",
                        timeout=10)


def test_subnets_have_compute_v1_shape_custom_ones_only_where_made_auto_mode_ones_everywhere(fake):
    listed = _get(fake, PROJECT, "us-central2").json()
    assert set(listed) <= set(_schema("SubnetworkList")) and listed["kind"] == "compute#subnetworkList"
    assert [s["name"] for s in listed["items"]] == ["default", "tpu-subnet"]
    for item in listed["items"]:
        assert set(item) <= set(_schema("Subnetwork")), set(item) - set(_schema("Subnetwork"))
    one = _get(fake, PROJECT, "us-central2", "tpu-subnet").json()
    assert one == next(s for s in listed["items"] if s["name"] == "tpu-subnet")
    assert one["network"] == f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/networks/tpu-net"
    assert one["region"].endswith(f"/projects/{PROJECT}/regions/us-central2") and one["ipCidrRange"] == "10.20.0.0/20"
    missing = _get(fake, PROJECT, "europe-west4", "tpu-subnet")
    assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
    assert missing.json()["error"]["message"] == (
        f"The resource 'projects/{PROJECT}/regions/europe-west4/subnetworks/tpu-subnet' was not found")
    auto = _get(fake, PROJECT, "asia-east1", "default").json()  # auto mode: a `default` subnet in every region
    assert auto["ipCidrRange"].startswith("10.") and int(auto["ipCidrRange"].split(".")[1]) >= 128
    write = requests.post(f"{fake.google_apis_url}/compute/v1/projects/{PROJECT}/regions/europe-west4/subnetworks",
                          json={"name": "tpu-subnet"}, timeout=10)
    assert write.status_code == 405  # tpuq never changes a network


def _fleet(zones: dict[str, str], **over) -> FleetFile:
    return FleetFile.model_validate({
        "name": "subnets", "project": PROJECT, "owner_prefix": "sn", "ssh_transport": "vpc",
        "network": "tpu-net", "subnetwork": "tpu-subnet",
        "tpus": [{"id": zone.rsplit("-", 1)[0], "type": tpu_type, "zones": [zone]} for zone, tpu_type in zones.items()],
        **over})


def _create(fake, fleet: FleetFile, zone: str, qr_id: str):
    entry = next(t for t in fleet.tpus if zone in t.zones)
    now = datetime.now(timezone.utc)
    qr = QrRecord(qr_id=qr_id, fleet=fleet.name, project=fleet.project, request_id="r1", entry_id=entry.id, zone=zone,
                  type=entry.type, spot=True, generation=0, state=REQUESTED, created_at=now, updated_at=now)
    return TpuApi(tpu_client(fake.url), attempts=1).create(qr, fleet, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAItest t")


def test_a_create_naming_a_subnet_its_region_lacks_is_refused_and_read_as_the_network_class(fake):
    fleet = _fleet({"us-central2-b": "v4-8", "europe-west4-a": "v5litepod-8"})
    assert _create(fake, fleet, "us-central2-b", "sn-ok").state == "CREATING"  # tpu-subnet is in us-central2
    refused = _create(fake, fleet, "europe-west4-a", "sn-eu")
    assert refused.kind == "create_failed"  # refused at once: 400 INVALID_ARGUMENT, nothing created
    assert refused.error_message.startswith("400 POST ")
    assert (": Cloud TPU received a bad request. Invalid value for field 'resource.networkInterfaces[0].subnetwork': "
            f"'projects/{PROJECT}/regions/europe-west4/subnetworks/tpu-subnet'. The referenced subnetwork resource "
            "cannot be found. [EID: 0x") in refused.error_message
    assert classify(refused.error_code, refused.error_message, refused.error_info) is FailureClass.network
    assert f"projects/{PROJECT}/locations/europe-west4-a/queuedResources/sn-eu" not in fake.world.queued_resources
    # A subnet of that name in the region, but of another network.
    other = _create(fake, _fleet({"us-central2-b": "v4-8"}, network="default"), "us-central2-b", "sn-other")
    assert other.kind == "create_failed" and 'is not valid for Network "default"' in other.error_message
    assert classify(other.error_code, other.error_message, other.error_info) is FailureClass.network


def test_per_project_layouts_and_unreadable_subnets(fake):
    control = FakeTpuControl(fake.google_apis_url)
    control.set_subnetworks("custom-only", [{"name": "tpu-subnet", "region": "europe-west4", "network": "tpu-net"}],
                            auto_mode_networks=[])
    try:
        assert [s["name"] for s in _get(fake, "custom-only", "europe-west4").json()["items"]] == ["tpu-subnet"]
        assert "items" not in _get(fake, "custom-only", "us-central2").json()  # left out when empty, as compute does
        default_fleet = FleetFile.model_validate({"name": "d", "project": "custom-only",
                                                  "tpus": [{"id": "a", "type": "v4-8", "zones": ["us-central2-b"]}]})
        refused = _create(fake, default_fleet, "us-central2-b", "sn-default")  # no auto-mode `default` network here
        assert refused.kind == "create_failed" and "subnetworks/default'" in refused.error_message
        assert _create(fake, _fleet({"europe-west4-a": "v5litepod-8"}, project="custom-only"), "europe-west4-a",
                       "sn-eu-ok").state == "CREATING"
        control.set_subnetworks("locked", None, permission_denied=True)
        denied = _get(fake, "locked", "us-central2", "default")
        assert denied.status_code == 403 and "compute.subnetworks.get" in denied.json()["error"]["message"]
    finally:
        control.set_subnetworks("custom-only", None)
        control.set_subnetworks("locked", None)


class _NoOrgPolicies:
    def call(self, method, path, params=None, body=None):
        raise gcp.ApiError("crm", method, path, 404, "not found")


def test_deploy_reads_the_same_layout_the_tpu_api_enforces(fake):
    fleet = _fleet({"us-central2-b": "v4-8", "europe-west4-a": "v5litepod-8"})
    compute = gcp.RestApi("compute", f"{fake.google_apis_url}/compute/v1/", requests.Session())
    target = Target(fleet=fleet, region="us-central2", project_number="1")
    facts = network.read_vpc_facts({"compute": compute, "crm": _NoOrgPolicies()}, target,
                                   lambda read, what: gcp._tolerant(read, None, [], what))
    assert facts.subnet["ipCidrRange"] == "10.20.0.0/20"  # the services' region: the executor's egress
    assert facts.region_subnets == {"us-central2": facts.subnet, "europe-west4": None}
