"""`tpuq validate` on fleet files whose transport settings are valid but may not do what the user expects.

Driven through the CLI, as a user runs it: the file validates (exit 0) and each warning is one line on stderr
that names the setting and the reason.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tpuq.fleet import FleetFile
from tpuq.tputypes import parse_accelerator_type


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
