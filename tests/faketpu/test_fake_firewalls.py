"""The fake's compute v1 firewalls (read only): the shape of compute's discovery document, pagination, the
scenario's rules and per-project overrides, writes refused; and gcloud's own `firewall-rules list` reads it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import requests

from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.server import FakeTpuServer

SCENARIO = {
    "zones": {"us-central2-b": {}},
    "network": {"firewalls": [
        {"name": "default-allow-ssh", "sourceRanges": ["0.0.0.0/0"], "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
         "priority": 65534},
        {"name": "deny-all", "denied": [{"IPProtocol": "all"}], "sourceRanges": ["0.0.0.0/0"], "priority": 65535},
        {"name": "on-other", "network": "other", "sourceRanges": ["35.235.240.0/20"],
         "allowed": [{"IPProtocol": "tcp"}], "targetTags": ["tpuq-worker"]},
    ]},
}


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    with FakeTpuServer(SCENARIO, state_dir=tmp_path_factory.mktemp("faketpu-fw"), worker_hosts=False) as server:
        yield server


def _schema(name: str) -> dict:
    import googleapiclient

    path = os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents", "compute.v1.json")
    with open(path) as f:
        return json.load(f)["schemas"][name]["properties"]


def _list(fake, project, **params):
    return requests.get(f"{fake.google_apis_url}/compute/v1/projects/{project}/global/firewalls", params=params,
                        timeout=10)


def test_list_has_compute_v1_shape_and_pages(fake):
    first = _list(fake, "p1", maxResults=2)
    assert first.status_code == 200
    body = first.json()
    assert set(body) <= set(_schema("FirewallList")) and body["kind"] == "compute#firewallList"
    rule_fields, port_fields = set(_schema("Firewall")), set(_schema("Firewall")["allowed"]["items"]["properties"])
    for item in body["items"]:
        assert set(item) <= rule_fields, set(item) - rule_fields
        for entry in item.get("allowed", []) + item.get("denied", []):
            assert set(entry) <= port_fields
    names = [i["name"] for i in body["items"]]
    rest = _list(fake, "p1", pageToken=body["nextPageToken"]).json()
    assert "nextPageToken" not in rest
    names += [i["name"] for i in rest["items"]]
    assert names == ["default-allow-ssh", "deny-all", "on-other"]  # by name, as Compute Engine lists
    by_name = {i["name"]: i for i in body["items"] + rest["items"]}
    # What Compute Engine fills in: the network as a URL, INGRESS, priority 1000, the rule's own selfLink.
    assert by_name["on-other"]["network"] == "https://www.googleapis.com/compute/v1/projects/p1/global/networks/other"
    assert by_name["on-other"]["direction"] == "INGRESS" and by_name["on-other"]["priority"] == 1000
    assert by_name["on-other"]["allowed"] == [{"IPProtocol": "tcp"}]  # no ports key when none were given
    one = requests.get(by_name["deny-all"]["selfLink"].replace("https://www.googleapis.com", fake.google_apis_url),
                       timeout=10)
    assert one.status_code == 200 and one.json() == by_name["deny-all"]


def test_per_project_rules_and_no_items_key_when_empty(fake):
    control = FakeTpuControl(fake.google_apis_url)
    control.set_firewalls("bare", [])
    try:
        body = _list(fake, "bare").json()
        assert "items" not in body  # Compute Engine leaves an empty list out
        assert [i["name"] for i in _list(fake, "other-project").json()["items"]][:1] == ["default-allow-ssh"]
        control.set_firewalls("locked", None, permission_denied=True)
        denied = _list(fake, "locked")
        assert denied.status_code == 403 and denied.json()["error"]["status"] == "PERMISSION_DENIED"
        assert "compute.firewalls.list" in denied.json()["error"]["message"]
    finally:
        control.set_firewalls("bare", None)
        control.set_firewalls("locked", None)
    assert len(_list(fake, "bare").json()["items"]) == 3
    assert len(_list(fake, "locked").json()["items"]) == 3


@pytest.mark.parametrize("method, path", [("POST", ""), ("PATCH", "/default-allow-ssh"), ("DELETE", "/deny-all")])
def test_writes_are_refused_and_logged(fake, method, path):
    url = f"{fake.google_apis_url}/compute/v1/projects/p1/global/firewalls{path}"
    assert requests.request(method, url, json={"name": "x"}, timeout=10).status_code == 405
    assert any(c["method"] == method and c["path"].endswith(f"firewalls{path}")
               for c in FakeTpuControl(fake.google_apis_url).calls())
    assert len(_list(fake, "p1").json()["items"]) == 3


def test_gcloud_lists_the_fakes_rules(fake, tmp_path):
    if shutil.which("gcloud") is None:
        pytest.skip("gcloud is not installed")
    env = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
           "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": fake.google_apis_url + "/compute/v1/",
           "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true"}
    out = subprocess.run(["gcloud", "compute", "firewall-rules", "list", "--project=p1", "--format=json"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(r["name"] for r in json.loads(out.stdout)) == ["default-allow-ssh", "deny-all", "on-other"]
