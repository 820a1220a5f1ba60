"""What a create asks the Cloud TPU API for: tier, labels, ssh-keys, internal IPs, expiry, the workers' account."""

from __future__ import annotations

from datetime import datetime, timezone

from tpuq.claimer.model import QrRecord
from tpuq.claimer.tpuapi import build_queued_resource
from tpuq.contracts.fleet import FleetFile

NOW = datetime(2026, 11, 29, tzinfo=timezone.utc)
FLEET = FleetFile.model_validate({
    "name": "race", "project": "p", "claim": {"valid_until_seconds": 7200},
    "tpus": [{"id": "small", "type": "v4-32", "zones": ["us-central2-b"]},
             {"id": "big", "type": "v5litepod-64", "zones": ["europe-west4-a"], "provisioning_model": "on_demand"}],
})
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample"


def qr(entry_id, zone, type_, spot):
    return QrRecord(qr_id=f"tpuq-r-1-{zone}", fleet="race", project="p", request_id="r-1", entry_id=entry_id,
                    zone=zone, type=type_, spot=spot, generation=0, state="REQUESTED", created_at=NOW,
                    updated_at=NOW)


def test_spot_small_slice_with_labels_keys_and_expiry():
    body = build_queued_resource(qr("small", "us-central2-b", "v4-32", True), FLEET, KEY)
    node = body.tpu.node_spec[0].node
    assert "spot" in body and "guaranteed" not in body
    assert node.accelerator_type == "v4-32" and node.scheduling_config.spot
    assert node.network_config.enable_external_ips  # 4 hosts: external IPs are fine
    assert node.metadata["ssh-keys"] == f"tpuq:{KEY} tpuq-executor"
    assert node.labels["tpuq-owner"] == "tpuq" and node.labels.get("tpuq-fleet") == "race"
    assert body.queueing_policy.valid_until_duration.seconds == 7200
    assert not node.service_account.email


def test_on_demand_big_slice_internal_ips_and_worker_account():
    body = build_queued_resource(qr("big", "europe-west4-a", "v5litepod-64", False), FLEET, KEY,
                                 worker_service_account="tpuq-worker@p.iam.gserviceaccount.com")
    node = body.tpu.node_spec[0].node
    assert "guaranteed" in body and "spot" not in body
    assert not node.network_config.enable_external_ips  # 16 hosts: internal IPs only
    assert node.service_account.email == "tpuq-worker@p.iam.gserviceaccount.com"


def _fleet(**overrides):
    return FleetFile.model_validate({**FLEET.model_dump(mode="json"), **overrides})


def _node_json(fleet, entry="small", zone="us-central2-b", type_="v4-32"):
    import json

    from google.cloud import tpu_v2

    body = build_queued_resource(qr(entry, zone, type_, True), fleet, KEY)
    return json.loads(tpu_v2.QueuedResource.to_json(body))["tpu"]["nodeSpec"][0]["node"]


def test_the_node_joins_the_fleets_network_with_the_workers_tag_and_os_login_off():
    node = _node_json(_fleet(network="research-vpc", subnetwork="tpu-us-central2", owner_prefix="lab"))
    config = node["networkConfig"]
    assert (config["network"], config["subnetwork"], config["enableExternalIps"]) == (
        "research-vpc", "tpu-us-central2", True)
    assert node["tags"] == ["lab-worker"]
    # ssh-keys metadata is ignored when OS Login is on: the node turns it off for itself.
    assert node["metadata"]["enable-oslogin"] == "FALSE"
    assert node["metadata"]["ssh-keys"] == f"tpuq:{KEY} tpuq-executor"


def test_the_network_defaults_to_default_and_the_fleets_names_pass_through():
    assert _node_json(FLEET)["networkConfig"]["network"] == "default"
    assert _node_json(FLEET)["networkConfig"]["subnetwork"] == "default"
    named = _node_json(_fleet(network="research", subnetwork="tpus"))["networkConfig"]
    assert (named["network"], named["subnetwork"]) == ("research", "tpus")


def test_external_ips_follow_the_transport():
    big = ("big", "europe-west4-a", "v5litepod-64")
    assert _node_json(FLEET, *big)["networkConfig"]["enableExternalIps"] is False  # vpc, 16 hosts: internal only
    assert _node_json(_fleet(ssh_transport="direct"), *big)["networkConfig"]["enableExternalIps"] is True
    assert _node_json(_fleet(worker_external_ips=False))["networkConfig"]["enableExternalIps"] is False


def test_an_active_node_is_read_back_with_both_addresses_and_never_the_runtime_port_as_ssh():
    from google.cloud import tpu_v2

    from tpuq.claimer.tpuapi import TpuApi

    node = tpu_v2.Node(name="projects/p/locations/us-central2-b/nodes/n", network_endpoints=[
        tpu_v2.NetworkEndpoint(ip_address="10.130.0.2", port=8470,
                               access_config=tpu_v2.AccessConfig(external_ip="34.1.0.2")),
        tpu_v2.NetworkEndpoint(ip_address="10.130.0.3", port=8470),
    ])

    class Client:
        def get_node(self, name):
            return node

    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[
        tpu_v2.QueuedResource.Tpu.NodeSpec(parent="projects/p/locations/us-central2-b", node_id="n")]))
    info = TpuApi(Client())._node_info(resource, qr("small", "us-central2-b", "v4-32", True))
    assert [e.model_dump() for e in info.endpoints] == [
        {"worker_id": 0, "ip": "10.130.0.2", "external_ip": "34.1.0.2", "port": 8470, "hostname": None},
        {"worker_id": 1, "ip": "10.130.0.3", "external_ip": None, "port": 8470, "hostname": None},
    ]
