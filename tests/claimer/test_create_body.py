"""What a create asks the Cloud TPU API for: tier, labels, ssh-keys, internal IPs, expiry, the workers' account."""

from __future__ import annotations

from datetime import datetime, timezone

from tpuq.claimer.model import QrRecord
from tpuq.claimer.tpuapi import build_queued_resource
from tpuq.fleet import FleetFile

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


def test_spot_small_slice_with_labels_keys_and_expiry(monkeypatch):
    monkeypatch.delenv("TPUQ_WORKER_SERVICE_ACCOUNT", raising=False)
    body = build_queued_resource(qr("small", "us-central2-b", "v4-32", True), FLEET, KEY)
    node = body.tpu.node_spec[0].node
    assert "spot" in body and "guaranteed" not in body
    assert node.accelerator_type == "v4-32" and node.scheduling_config.spot
    assert node.network_config.enable_external_ips  # 4 hosts: external IPs are fine
    assert node.metadata["ssh-keys"] == f"tpuq:{KEY} tpuq-executor"
    assert node.labels["tpuq-owner"] == "tpuq" and node.labels.get("tpuq-fleet") == "race"
    assert body.queueing_policy.valid_until_duration.seconds == 7200
    assert not node.service_account.email


def test_on_demand_big_slice_internal_ips_and_worker_account(monkeypatch):
    monkeypatch.setenv("TPUQ_WORKER_SERVICE_ACCOUNT", "tpuq-worker@p.iam.gserviceaccount.com")
    body = build_queued_resource(qr("big", "europe-west4-a", "v5litepod-64", False), FLEET, KEY)
    node = body.tpu.node_spec[0].node
    assert "guaranteed" in body and "spot" not in body
    assert not node.network_config.enable_external_ips  # 16 hosts: internal IPs only
    assert node.service_account.email == "tpuq-worker@p.iam.gserviceaccount.com"
