"""The fake's Cloud Quotas and Cloud Billing stand-ins: the quickstart's gcloud commands verbatim, and REST.

They listen on their own URL (`google_apis_url`), apart from the TPU API, like their googleapis hosts. What they
report is what the fake TPU API enforces: the same scenario quota (in the quota's unit) and billing state.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import requests
import yaml

from tpuq.capacity.cloudchecks import PrecheckReader
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.server import FakeTpuServer
from tpuq.contracts.fleet import FleetFile, ProvisioningModel
from tpuq.capacity.quota import QUOTA_FACTS, QuotaSource, pool_family

GCLOUD = shutil.which("gcloud")
PROJECT = "quota-proj"
V4_SPOT = "TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI"
V5E_SPOT = "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"
V6E_SPOT = "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI"
QUOTA_PATH = f"projects/{PROJECT}/locations/global/services/tpu.googleapis.com/quotaInfos"

SCENARIO = {
    "zones": {
        "us-central2-b": {"quota": {"v4": {"spot": 64}, "v5litepod": {"spot": 0}}},
        "us-central2-a": {"quota": {"v4": {"spot": 0, "on_demand": 16}}},
        "europe-west4-a": {},
    },
    "default_quota": {"v6e": {"spot": 8}},
    "cloud_quotas": {"unknown_ids": ["TPUV6EPerProjectPerZoneForTPUAPI"]},
}


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    with FakeTpuServer(SCENARIO, state_dir=tmp_path_factory.mktemp("faketpu"), worker_hosts=False) as server:
        yield server


@pytest.fixture(scope="module")
def gcloud(fake, tmp_path_factory):
    if GCLOUD is None:
        pytest.skip("gcloud is not installed")
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": str(tmp_path_factory.mktemp("gcloud-config")),
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDQUOTAS": fake.google_apis_url + "/",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDBILLING": fake.google_apis_url + "/",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([GCLOUD, *args], env=env, capture_output=True, text=True, timeout=120)
        if check and done.returncode:
            raise AssertionError(f"gcloud {' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done

    run("config", "set", "auth/disable_credentials", "true")
    beta = run("beta", "quotas", "info", "describe", "--help", check=False)  # offline: no component listing
    if beta.returncode:
        pytest.skip(f"gcloud beta quotas is missing: {beta.stderr.strip()[:300]}")
    return run


def google_calls(fake) -> list[dict]:
    return FakeTpuControl(fake.google_apis_url).calls()


def test_the_quickstarts_quota_command_verbatim(gcloud, fake):
    """`gcloud beta quotas info describe ID --service=tpu.googleapis.com --project=P` calls /v1beta/."""
    done = gcloud("beta", "quotas", "info", "describe", V4_SPOT, "--service=tpu.googleapis.com",
                  f"--project={PROJECT}", "--format=yaml(quotaId,dimensionsInfos)")
    shown = yaml.safe_load(done.stdout)
    assert shown["quotaId"] == V4_SPOT
    by_zone = {(i.get("dimensions") or {}).get("zone"): i.get("details", {}) for i in shown["dimensionsInfos"]}
    # v4 quota counts TensorCores: 64 chips are 128; an explicit zero is `details: {}`; the default entry last.
    assert by_zone == {"us-central2-b": {"value": "128"}, "us-central2-a": {}, None: {}}
    assert shown["dimensionsInfos"][-1].get("dimensions") is None
    assert google_calls(fake)[-1]["path"] == f"/v1beta/{QUOTA_PATH}/{V4_SPOT}"


def test_the_quickstarts_billing_command_verbatim(gcloud, fake):
    control = FakeTpuControl(fake.url)
    on = json.loads(gcloud("beta", "billing", "projects", "describe", PROJECT, "--format=json").stdout)
    assert on["billingEnabled"] is True and on["name"] == f"projects/{PROJECT}/billingInfo"
    control.set_billing(False, project=PROJECT)
    try:
        off = json.loads(gcloud("beta", "billing", "projects", "describe", PROJECT, "--format=json").stdout)
    finally:
        control.set_billing(None, project=PROJECT)
    assert "billingEnabled" not in off  # proto3 JSON leaves a false out; gcloud shows what the API sent
    assert google_calls(fake)[-1]["path"] == f"/v1/projects/{PROJECT}/billingInfo"


def test_gcloud_reports_an_unknown_quota_id(gcloud):
    done = gcloud("beta", "quotas", "info", "describe", "TPUV6EPerProjectPerZoneForTPUAPI",
                  "--service=tpu.googleapis.com", f"--project={PROJECT}", check=False)
    assert done.returncode != 0 and "NOT_FOUND" in done.stderr


@pytest.mark.parametrize("version", ["v1", "v1beta"])
def test_v1_and_v1beta_serve_the_same_shape(fake, version):
    body = requests.get(f"{fake.google_apis_url}/{version}/{QUOTA_PATH}/{V6E_SPOT}", timeout=10).json()
    assert body["name"] == f"{QUOTA_PATH}/{V6E_SPOT}" and body["quotaId"] == V6E_SPOT
    # v6e is listed by no zone on its own: one default entry, applicable to every scenario zone, in chips.
    assert body["dimensionsInfos"] == [
        {"details": {"value": "8"}, "applicableLocations": ["europe-west4-a", "us-central2-a", "us-central2-b"]}]
    listed = requests.get(f"{fake.google_apis_url}/{version}/{QUOTA_PATH}", timeout=10).json()["quotaInfos"]
    assert {V4_SPOT, V5E_SPOT, V6E_SPOT} <= {q["quotaId"] for q in listed}
    assert "TPUV6EPerProjectPerZoneForTPUAPI" not in {q["quotaId"] for q in listed}


def test_the_tpu_api_serves_nothing_of_them_and_they_serve_no_tpu_api(fake):
    assert requests.get(f"{fake.url}/v1/{QUOTA_PATH}/{V4_SPOT}", timeout=10).status_code == 404
    assert requests.get(f"{fake.google_apis_url}/v2/projects/{PROJECT}/locations/us-central2-b/queuedResources",
                        timeout=10).status_code == 404


def test_what_the_reader_concludes_is_what_the_tpu_api_enforces(fake):
    """Our facts (units, IDs) against the fake's own rule: a fleet on the API's quota gets exactly the chips the
    TPU API grants. Were v4 quota read as chips, us-central2-b would show 128 chips, twice what it allows."""
    fleet = FleetFile.model_validate({"name": "f", "project": PROJECT, "tpus": [
        {"id": "v4", "type": "v4-32", "zones": ["us-central2-b", "us-central2-a", "europe-west4-a"]},
        {"id": "v5e", "type": "v5litepod-8", "zones": ["us-central2-b"]},
        {"id": "v6e", "type": "v6e-8", "zones": ["europe-west4-a", "us-central2-b"]},
    ]})
    checks = PrecheckReader(requests.Session(), fake.google_apis_url, fake.google_apis_url).read(fleet, None)
    assert checks.billing.enabled is True and checks.problems == []
    for (zone, pool, model), q in checks.quota.entries.items():
        assert q.source is QuotaSource.api and QUOTA_FACTS[(pool, model)][0].quota_id in q.detail
        assert q.chips == fake.world.scenario.quota_limit(zone, pool_family(pool), "spot"), (zone, pool)
        assert q.region is None  # the scenario has no region quota: the region IDs list no region
    assert checks.quota.chips("us-central2-b", "v4", ProvisioningModel.spot) == 64


def test_region_entries_and_unlimited_are_served_as_cloud_quotas_sends_them(tmp_path):
    """The per-region ID lists the scenario's `region_quota` regions (no default: other regions have no region
    limit); the per-zone ID leaves out a zone that only its region's quota bounds; -1 is -1 in any unit."""
    scenario = {"zones": {"us-central2-a": {}, "us-central2-b": {"quota": {"v4": {"spot": -1}}}, "us-east1-d": {}},
                "region_quota": {"us-central2": {"v4": {"spot": 16}}, "europe-west4": {"v4": {"spot": -1}}}}
    region_id = V4_SPOT.replace("PerZone", "PerRegion")
    with FakeTpuServer(scenario, state_dir=tmp_path, worker_hosts=False) as server:
        zone_body = requests.get(f"{server.google_apis_url}/v1/{QUOTA_PATH}/{V4_SPOT}", timeout=10).json()
        region_body = requests.get(f"{server.google_apis_url}/v1/{QUOTA_PATH}/{region_id}", timeout=10).json()
    assert zone_body["dimensionsInfos"] == [
        {"dimensions": {"zone": "us-central2-b"}, "details": {"value": "-1"}, "applicableLocations": ["us-central2-b"]},
        {"details": {}, "applicableLocations": ["us-central2-b", "us-east1-d"]}]  # not -a: its region bounds it
    assert region_body["dimensions"] == ["region"] and region_body["dimensionsInfos"] == [
        {"dimensions": {"region": "europe-west4"}, "details": {"value": "-1"}, "applicableLocations": ["europe-west4"]},
        {"dimensions": {"region": "us-central2"}, "details": {"value": "32"}, "applicableLocations": ["us-central2"]}]


def test_refusals_are_api_errors_and_the_reader_falls_back(tmp_path):
    scenario = {**SCENARIO, "cloud_quotas": {"permission_denied": True}, "billing": {"permission_denied": True}}
    fleet = FleetFile.model_validate({"name": "f", "project": PROJECT, "tpus": [
        {"id": "v4", "type": "v4-32", "zones": ["us-central2-b"]}], "quota": {"us-central2-b": {"v4": {"spot": 32}}},
    })
    other = FleetFile.model_validate({"name": "f", "project": PROJECT, "tpus": [
        {"id": "v4", "type": "v4-32", "zones": ["us-central2-a"]}]})
    with FakeTpuServer(scenario, state_dir=tmp_path, worker_hosts=False) as server:
        r = requests.get(f"{server.google_apis_url}/v1/{QUOTA_PATH}/{V4_SPOT}", timeout=10)
        assert r.status_code == 403 and r.json()["error"]["status"] == "PERMISSION_DENIED"
        reader = PrecheckReader(requests.Session(), server.google_apis_url, server.google_apis_url)
        declared, unknown = reader.read(fleet, None), reader.read(other, None)
    assert declared.quota.chips("us-central2-b", "v4", ProvisioningModel.spot) == 32  # declared wins, no read
    assert unknown.quota.chips("us-central2-a", "v4", ProvisioningModel.spot) is None  # not checked
    assert unknown.problems[0].startswith(f"quota {V4_SPOT}: HTTP 403 PERMISSION_DENIED: Permission")
    assert unknown.problems[1].startswith(f"quota {V4_SPOT.replace('PerZone', 'PerRegion')}: HTTP 403 PERMISSION")
    assert unknown.problems[2].startswith("billing: HTTP 403 PERMISSION_DENIED: The caller does not have permission")
    assert unknown.billing.enabled is None


def test_default_quota_applies_to_unlisted_zones_in_the_tpu_api_too(fake):
    assert fake.world.scenario.quota_limit("europe-west4-a", "v6e", "spot") == 8
    assert fake.world.scenario.quota_limit("us-east1-d", "v6e", "spot") == 0  # not a scenario zone
    assert fake.world.scenario.quota_limit("us-central2-a", "v4", "spot") == 0  # listed with 0: no default
