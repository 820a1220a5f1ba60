"""tpu-runner's files read by tpuq unchanged (issue 15 §1): the vendored deployment.example.yaml and README job.yaml,
the mapping of each tpu-runner field, and what `tpuq validate` says about them."""

from __future__ import annotations

import base64
import copy
import hashlib
import random
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from tpuq.claimer.decide import decide_observed, decide_request_received
from tpuq.claimer.model import ClaimState, NodeInfo, Observation, Observed, RequestReceived
from tpuq.cli import main
from tpuq.deploy.plan import Target
from tpuq.contracts.errors import Permanent
from tpuq.contracts.fleet import FleetFile, SshTransport
from tpuq.contracts.messages import CapacityRequest, WorkerEndpoint
from tpuq.operations.tpurunner import RUNNER_ENTRY_FIELDS, RUNNER_FIELDS, read_fleet

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tpu_runner"
EXAMPLE = FIXTURES / "deployment.example.yaml"
README_JOB = FIXTURES / "job.yaml"
# tpu_runner-0.1.12.dist-info/RECORD: tpu_runner/deployment.example.yaml,sha256=...,1514
EXAMPLE_RECORD_SHA256 = "Qupe7_KjSrBjjzDNvIJgGuQZJDFEXgv1oEAsukUKgls"
REPO = Path(__file__).resolve().parents[2]


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def runner_file(**over) -> dict:
    data = {"name": "r", "project": "p", "controller_region": "us-central1", "controller_timeout": "168h",
            "firestore_location": "nam5", "network": "default", "subnetwork": "default",
            "tpus": [{"id": "a", "type": "v4-32", "zone": "us-central2-b", "runtime": "tpu-ubuntu2204-base",
                      "count": 1, "chip_limit": 32}]}
    data.update(over)
    return data


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_vendored_example_is_the_one_in_the_package():
    digest = base64.urlsafe_b64encode(hashlib.sha256(EXAMPLE.read_bytes()).digest()).rstrip(b"=").decode()
    assert digest == EXAMPLE_RECORD_SHA256


def test_example_deployment_validates_unchanged(capsys):
    code, out, err = cli(capsys, "validate", str(EXAMPLE))
    assert code == 0, err
    assert "Traceback" not in err
    assert "tpu-runner deployment file" in out and "6 TPU entries" in out
    [note] = [line for line in err.splitlines() if line.startswith("note:")]
    assert all(f in note for f in ("controller_region", "controller_timeout", "controller_memory",
                                   "controller_max_retries")) and "not needed" in note


def test_readme_job_file_validates_unchanged(capsys):
    code, out, err = cli(capsys, "validate", str(README_JOB))
    assert code == 0, err
    assert "ok: 1 job" in out


def test_example_fields_mean_what_they_mean_in_tpu_runner():
    read = read_fleet(example())
    fleet = read.fleet
    assert read.kind == "tpu-runner"
    assert (fleet.name, fleet.project, fleet.idle_timeout_seconds) == ("example-tpu-runner", "your-gcp-project-id", 600)
    assert (fleet.network, fleet.subnetwork, fleet.firestore_location) == ("default", "default", "nam5")
    assert fleet.ssh_transport is SshTransport.direct and fleet.worker_secrets == []
    assert [t.id for t in fleet.tpus] == ["us-central2b-v4-ondemand", "us-central2b-v4-spot", "us-east1d-v6e-spot", "europe-west4a-v6e-spot",
                                          "us-central1a-v5e-spot", "europe-west4b-v5e-spot"]
    # tpu-runner's existing: is tpuq's: a node used, never created; its chip_limit adds no quota.
    mine = fleet.tpus[0]
    assert (mine.existing, mine.type, mine.zones, mine.spot) == ("your-existing-v4-tpu", "v4-64", ["us-central2-b"],
                                                                  False)
    assert fleet.zone_quota_chips("us-central2-b", "v4", mine.provisioning_model) == 0
    first = fleet.tpus[1]
    assert (first.type, first.zones, first.runtime, first.count, first.keep_warm_count) == \
        ("v4-64", ["us-central2-b"], "tpu-ubuntu2204-base", 1, 0)
    # chip_limit is tpu-runner's cap per (provisioning model, family, zone): tpuq's quota, not a per-entry cap.
    assert all(t.chip_limit is None for t in fleet.tpus)
    assert fleet.zone_quota_chips("us-central2-b", "v4", first.provisioning_model) == 32
    assert fleet.zone_quota_chips("us-east1-d", "v6e", first.provisioning_model) == 64
    assert fleet.zone_quota_chips("us-central1-a", "v5litepod", first.provisioning_model) == 64


@pytest.mark.parametrize("over, field, words", [
    ({"tpus": [{"type": "v4-32", "zone": "us-central2-b", "count": 1}]}, "tpus[0].chip_limit", "required"),
    ({"tpus": [{"id": "a", "type": "v4-32", "zone": "us-central2-b", "count": 1, "chip_limit": 0}]},
     "tpus[a].chip_limit", "positive"),
    ({"tpus": [{"id": "a", "type": "v4-32", "zone": "us-central2-b", "count": 1, "chip_limit": 32},
               {"id": "b", "type": "v4-8", "zone": "us-central2-b", "count": 1, "chip_limit": 16}]},
     "tpus[b].chip_limit", "disagrees with the 32 of tpus[a]"),
    ({"quota": {"us-central2-b": {"v4": {"spot": 64}}}}, "quota", "chip_limit"),
    ({"bucket": "gs://a", "runner_bucket": "gs://b"}, "runner_bucket", "bucket"),
])
def test_runner_only_rules_name_the_field(over, field, words):
    with pytest.raises(Permanent) as e:
        read_fleet(runner_file(**over))
    assert e.value.field == field and words in str(e.value) and "\n" not in str(e.value)


def test_field_errors_keep_the_files_paths(capsys, tmp_path):
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(runner_file(tpus=[{"id": "a", "type": "v9-8", "zone": "us-central2-b",
                                                      "count": 1, "chip_limit": 8}])))
    code, _, err = cli(capsys, "validate", str(path))
    assert code == 1 and "invalid tpu-runner deployment file: tpus[0].type" in err and "v9-8" in err


@pytest.mark.parametrize("over, check", [
    ({"bucket": "gs://my-runner/"}, lambda f: f.runner_bucket == "gs://my-runner"),
    ({}, lambda f: f.runner_bucket is None),  # tpuq's default runner bucket
    ({}, lambda f: f.ssh_transport is SshTransport.direct),  # tpu-runner's default, not tpuq's vpc
    ({"ssh_transport": "IAP"}, lambda f: f.ssh_transport is SshTransport.iap and not f.external_ips_for(
        f.tpus[0].accelerator)),
    ({"network": "research", "subnetwork": "tpus"}, lambda f: (f.network, f.subnetwork) == ("research", "tpus")),
    ({"tpus": [{"type": "v5litepod-8", "zone": "europe-west4-b", "count": 1, "chip_limit": 8}]},
     lambda f: f.tpus[0].id == "v5litepod-8-europe-west4-b-1"),  # tpu-runner's derived id
    ({"tpus": [{"id": "a", "type": "v4-8", "zone": "us-central2-b", "count": 1, "chip_limit": 8,
                "provisioning_model": "on-demand"}]},
     lambda f: f.zone_quota_chips("us-central2-b", "v4", f.tpus[0].provisioning_model) == 8 and not f.tpus[0].spot),
    ({"ssh_key_secret": "tpuq-ssh"}, lambda f: f.ssh_key_secret == "tpuq-ssh"),  # tpuq's own fields may be added
])
def test_runner_field_mapping(over, check):
    assert check(read_fleet(runner_file(**over)).fleet)


def test_iap_says_what_tpuq_does_instead_in_one_line():
    read = read_fleet(runner_file(ssh_transport="iap"))
    [line] = [w for w in read.warnings if "iap" in w]
    assert "no IAP tunnels" in line and "internal IPs" in line


def test_counts_above_chip_limit_warn_and_the_cap_holds():
    read = read_fleet(runner_file(tpus=[{"id": "a", "type": "v4-32", "zone": "us-central2-b", "count": 2,
                                         "chip_limit": 32},
                                        {"id": "b", "type": "v4-32", "zone": "us-central2-b", "count": 2,
                                         "chip_limit": 32}]))
    assert any("64 chips, above their chip_limit of 32" in w for w in read.warnings)


def test_chip_limit_caps_chips_across_entries_in_the_claimer():
    """Two entries of one (spot, v4, zone) with chip_limit 32 share 32 chips: two v4-32s, not four."""
    fleet = read_fleet(runner_file(tpus=[
        {"id": "a", "type": "v4-32", "zone": "us-central2-b", "count": 2, "chip_limit": 32},
        {"id": "b", "type": "v4-32", "zone": "us-central2-b", "count": 2, "chip_limit": 32}])).fleet
    state = ClaimState(fleet)
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    created = []

    def step(event):
        nonlocal state
        decide = decide_request_received if isinstance(event, RequestReceived) else decide_observed
        effects = decide(state, event, now, random.Random(1))
        state = effects.applied(state)
        state = replace(state, qrs={**state.qrs, **{c.qr.qr_id: c.qr for c in effects.creates}})
        return effects

    for n in range(4):
        new = step(RequestReceived(CapacityRequest(request_id=f"r{n}", fleet="r", types=["v4-32"], count=1))).creates
        created += new
        for c in new:  # each wins, so that the next request may race in the zone
            node = NodeInfo(f"projects/p/locations/us-central2-b/nodes/n{n}", (WorkerEndpoint(worker_id=0, ip="10.0.0.2"),))
            step(Observed({c.qr.qr_id: Observation.found("WAITING_FOR_RESOURCES")}))
            step(Observed({c.qr.qr_id: Observation.found("ACTIVE", node=node)}))
    assert len(created) == 2 and {c.qr.entry_id for c in created} <= {"a", "b"}


def test_tpuq_files_keep_their_per_entry_chip_limit():
    fleet = read_fleet({"name": "t", "project": "p", "tpus": [
        {"id": "a", "type": "v4-32", "zones": ["us-central2-b"], "count": 4, "chip_limit": 32}]}).fleet
    assert read_fleet({"name": "t", "project": "p", "tpus": [{"id": "a", "type": "v4-8", "zone": "us-central2-b"}]}
                      ).kind == "tpuq"
    assert fleet.quota is None and fleet.tpus[0].chip_limit == 32 and fleet.tpus[0].max_slices == 2


def test_firestore_location_reaches_deploy():
    fleet = read_fleet(runner_file()).fleet
    assert Target(fleet=fleet, region="europe-west4").variables()["firestore_location"] == "nam5"
    assert Target(fleet=fleet, firestore_location="eur3").variables()["firestore_location"] == "eur3"
    plain = FleetFile.model_validate({"name": "t", "project": "p", "tpus": [{"id": "a", "type": "v4-8",
                                                                              "zones": ["us-central2-b"]}]})
    assert Target(fleet=plain, region="europe-west4").variables()["firestore_location"] == "europe-west4"
    with pytest.raises(ValueError, match="not a Firestore location"):
        FleetFile.model_validate({**plain.model_dump(mode="json"), "firestore_location": "Nam 5"})


def test_a_file_with_neither_jobs_nor_tpus_says_so(capsys, tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: x\nproject: p\n")
    code, _, err = cli(capsys, "validate", str(path))
    assert code == 1 and "neither a job file nor a fleet file" in err and "jobs: is required" not in err


def test_the_runner_example_is_not_changed_by_reading_it():
    data = example()
    before = copy.deepcopy(data)
    read_fleet(data)
    assert data == before


def test_migrating_page_covers_every_runner_field_and_command():
    page = (REPO / "docs" / "MIGRATING.md").read_text()
    names = sorted(RUNNER_FIELDS) + [f"tpus[].{f}" for f in sorted(RUNNER_ENTRY_FIELDS)] + [
        "id", "tpu", "bundle", "command", "tpu_name", "zone", "buckets", "caches", "env", "priority",
        "retry_on_infrastructure_failure", ".tpu-runnerignore"]  # tpu-runner's JOB_SPEC_FIELDS and its ignore file
    for name in names:
        assert f"`{name}`" in page, name
    for command in ("init", "validate-fleet", "validate-jobs", "deploy", "submit", "watch", "logs", "cancel",
                    "set-priority", "interrupt-spot", "probe-adopted-device-owners", "status"):
        assert f"`tpu-runner {command}" in page, command
    assert "MIGRATING.md" in (REPO / "README.md").read_text()
