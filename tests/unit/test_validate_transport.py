"""`tpuq validate` on fleet files whose transport settings are valid but may not do what the user expects.

Driven through the CLI, as a user runs it: the file validates (exit 0) and each warning is one line on stderr
that names the setting and the reason.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.tputypes import parse_accelerator_type


def tpuq(*args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_EMULATOR_HOST")}
    return subprocess.run(["tpuq", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


def fleet_file(tmp_path, **fields):
    data = {"name": "lab", "project": "p", "tpus": [{"id": "pod", "type": "v5litepod-64", "zones": ["europe-west4-a"]},
                                                    {"id": "small", "type": "v4-8", "zones": ["us-central2-b"]}]}
    data.update(fields)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def warnings_of(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("warning:")]


def test_the_init_fleet_validates_with_one_warning_per_big_direct_slice(tmp_path):
    assert tpuq("init", str(tmp_path), cwd=tmp_path).returncode == 0
    r = tpuq("validate", str(tmp_path / "fleet.yaml"), cwd=tmp_path)
    assert r.returncode == 0 and "ok: fleet 'research'" in r.stdout
    found = warnings_of(r)
    assert len(found) == 2, r.stderr
    for entry, kind in (("v5e-spot", "v5litepod-64"), ("v6e-spot", "v6e-64")):
        line = next(w for w in found if f"tpus[{entry}]" in w)  # printed as text, not eaten as markup
        assert kind in line and "16 hosts" in line and "IN_USE_ADDRESSES" in line and "ssh_transport: vpc" in line


def test_direct_warns_when_a_regions_entries_together_may_hold_more_external_ips_than_its_quota(tmp_path):
    """IN_USE_ADDRESSES is per region (production-facts.md): 2 v4-32 (4 hosts each) and one v4-8 in us-central2 may
    hold 9 external IPs there at once, though no entry alone passes 8. Before, only an entry whose one slice had
    more than 8 hosts was warned about."""
    tpus = [{"id": "pods", "type": "v4-32", "zones": ["us-central2-b"], "count": 2},
            {"id": "one", "type": "v4-8", "zones": ["us-central2-a", "europe-west4-a"]},
            {"id": "eu", "type": "v4-32", "zones": ["europe-west4-b"], "count": 1}]
    r = tpuq("validate", str(fleet_file(tmp_path, ssh_transport="direct", tpus=tpus)), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    [line] = warnings_of(r)  # europe-west4: 4 + 1 = 5, within the quota
    assert "region us-central2: the fleet may hold 9 external IPs there at once" in line
    assert "tpus[pods] v4-32: 2 x 4 hosts" in line and "tpus[one] v4-8: 1 x 1 hosts" in line
    assert "IN_USE_ADDRESSES" in line and "ssh_transport: vpc" in line


def test_external_ips_by_region_count_each_entrys_most_slices_in_every_region_it_may_use():
    fleet = FleetFile.model_validate({"name": "lab", "project": "p", "ssh_transport": "direct", "tpus": [
        {"id": "a", "type": "v4-32", "zones": ["us-central2-b", "us-central2-a", "us-east1-d"], "count": 3},
        {"id": "capped", "type": "v4-32", "zones": ["us-east1-d"], "count": 5, "chip_limit": 32},  # 2 slices
        {"id": "none", "type": "v4-32", "zones": ["us-east1-d"], "count": 0},
        {"id": "mine", "type": "v4-8", "zones": ["us-east1-c"], "existing": "node-1"}]})
    assert [(r, n) for r, n, _ in fleet.external_ips_by_region()] == [("us-central2", 12), ("us-east1", 21)]
    vpc = FleetFile.model_validate({**fleet.model_dump(mode="json", exclude_none=True), "ssh_transport": "vpc",
                                    "worker_external_ips": False})
    assert vpc.external_ips_by_region() == []


@pytest.mark.parametrize("fields, expected", [
    ({"ssh_transport": "iap"}, ["ssh_transport: iap: tpuq opens no IAP tunnels", "internal IPs only", "Cloud NAT"]),
    ({"ssh_transport": "iap", "worker_external_ips": True}, ["ssh_transport: iap", "worker_external_ips: true keeps"]),
    ({"ssh_transport": "direct", "worker_external_ips": False, "tpus": [{"id": "small", "type": "v4-8",
                                                                        "zones": ["us-central2-b"]}]},
     ["worker_external_ips: false has no effect with ssh_transport: direct"]),
])
def test_transport_settings_that_do_something_else_are_said(tmp_path, fields, expected):
    r = tpuq("validate", str(fleet_file(tmp_path, **fields)), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = "\n".join(warnings_of(r))
    for words in expected:
        assert words in text, r.stderr


def test_a_vpc_fleet_validates_quietly(tmp_path):
    r = tpuq("validate", str(fleet_file(tmp_path, ssh_transport="vpc")), cwd=tmp_path)
    assert r.returncode == 0 and warnings_of(r) == [], r.stderr


@pytest.mark.parametrize("transport, setting, small, big", [
    ("vpc", None, True, False),
    ("vpc", False, False, False),
    ("iap", None, False, False),   # iap asks for private IPs
    ("iap", True, True, False),
    ("direct", None, True, True),  # the executor reaches every node at its external IP
    ("direct", False, True, True),
])
def test_which_nodes_get_external_ips(transport, setting, small, big):
    fleet = FleetFile.model_validate({"name": "lab", "project": "p", "ssh_transport": transport,
                                      **({} if setting is None else {"worker_external_ips": setting}),
                                      "tpus": [{"id": "a", "type": "v4-8", "zones": ["us-central2-b"]}]})
    assert fleet.external_ips_for(parse_accelerator_type("v4-8")) is small
    assert fleet.external_ips_for(parse_accelerator_type("v5litepod-64")) is big


@pytest.mark.parametrize("field, value", [("network", "projects/host/global/networks/shared"),
                                          ("subnetwork", "Default"), ("network", "")])
def test_network_names_other_than_the_projects_own_are_refused(tmp_path, field, value):
    r = tpuq("validate", str(fleet_file(tmp_path, **{field: value})), cwd=tmp_path)
    assert r.returncode != 0 and field in r.stderr and "Traceback" not in r.stderr, r.stderr
