"""`tpuq deploy --dry-run` prints the full plan, as a new user would run it, without touching anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tpuq.contracts import topology
from tpuq.deploy.infra import INFRA_DIR
from tpuq_dev.devstack.stack import DEMO_DIR

IAM = yaml.safe_load((INFRA_DIR / "iam.yaml").read_text())
SERVICES = yaml.safe_load((INFRA_DIR / "services.yaml").read_text())
SCHEDULER = yaml.safe_load((INFRA_DIR / "scheduler.yaml").read_text())
STORAGE = yaml.safe_load((INFRA_DIR / "storage.yaml").read_text())
APIS = yaml.safe_load((INFRA_DIR / "apis.yaml").read_text())


def tpuq(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """The CLI with no credentials anywhere (and no probe of a metadata server)."""
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_EMULATOR_HOST") and k not in ("GOOGLE_APPLICATION_CREDENTIALS", "K_SERVICE", "BUILD_ID")}
    env.update({"CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "TPUQ_DEV_DIR": str(tmp_path / "nostack"),
                "NO_GCE_CHECK": "True", "COLUMNS": "400"})
    return subprocess.run(["tpuq", *args], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)


@pytest.fixture(scope="module")
def init_plan(tmp_path_factory) -> str:
    tmp_path = tmp_path_factory.mktemp("deploy")
    assert tpuq(["init", "."], tmp_path).returncode == 0
    r = tpuq(["deploy", "fleet.yaml", "--dry-run"], tmp_path)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_plan_names_everything_infra_declares(init_plan):
    project = "my-trc-project"
    lines = init_plan.splitlines()

    def has(*words: str) -> bool:
        return any(all(w in line for w in words) for line in lines)

    for api in APIS["apis"]:
        assert has("enable API", api)
    for topic in topology.TOPICS:
        assert f"  create topic {topic.name}" in lines
    for sub in topology.SUBSCRIPTIONS:
        run_name = f"tpuq-{sub.service}"
        assert has(f"create subscription {sub.name} → https://{run_name}-<project-number>.us-central1.run.app{sub.path}",
                   f"OIDC as tpuq-push@{project}.iam.gserviceaccount.com", f"ack {sub.ack_deadline_seconds}s",
                   f"dead-letter after {sub.max_delivery_attempts} attempts to dead-letters"), sub.name
    for sa in IAM["service_accounts"]:
        assert has(f"create service account {sa['id']}@{project}.iam.gserviceaccount.com")
    for b in IAM["bindings"]:
        if "${" not in b["resource"]:  # secret bindings: the example fleet names no secrets
            who = b["member"].split(":", 1)[1]
            assert has("grant", b["role"], who if b["member"].startswith("sa:") else "service-<project-number>"), b
    assert has(f"create bucket gs://{project}-tpuq-runner", "delete tpuq/jobs/*.txt after 30 days")
    for s in SERVICES["services"]:
        assert has(f"create Cloud Run service {s['run_service']}",
                   f"us-central1-docker.pkg.dev/{project}/tpuq/{s['name']}:latest")
    for job in SCHEDULER["jobs"]:
        assert has(f"create Cloud Scheduler job {job['name']}", "→ topic ticks")
    for n in STORAGE["notifications"]:
        assert has(f"create notification gs://{project}-tpuq-runner/{n['object_name_prefix']} → topic gcs-events")
    assert has("create Firestore database (default)") and has("create Firestore index jobs")
    assert has("store fleet research in Firestore fleets/research")


def test_the_owner_is_told_what_16_host_slices_need_and_nothing_is_changed(tmp_path):
    assert tpuq(["init", "."], tmp_path).returncode == 0
    fleet = tmp_path / "fleet.yaml"  # under direct every node has external IPs; vpc gives 16+ hosts internal ones only
    fleet.write_text(fleet.read_text().replace("ssh_transport: direct", "ssh_transport: vpc"))
    r = tpuq(["deploy", "fleet.yaml", "--dry-run"], tmp_path)
    assert r.returncode == 0, r.stderr
    init_plan = r.stdout
    owner = init_plan.split("for a person to do")[1]
    for region in ("europe-west4", "us-east1"):  # the example's v5litepod-64 and v6e-64 have 16 hosts
        assert f"network default in {region} FOR THE PROJECT OWNER TO RUN (tpuq never changes network settings)" in owner
        assert (f"gcloud compute networks subnets update default --region={region} --enable-private-ip-google-access "
                f"--project=my-trc-project") in owner
        assert f"gcloud compute routers nats create tpuq-nat --router=tpuq-nat-router --region={region}" in owner
    # v4-32 has 4 hosts: external IPs, no NAT needed (its region's subnet is still checked, as every TPU region's)
    assert "network default in us-central2" not in owner and "--router=tpuq-nat-router --region=us-central2" not in owner
    before = init_plan.split("for a person to do")[0]
    assert "gcloud compute" not in before and "subnet" not in before.lower()


def test_the_demo_fleet_plans_too_and_needs_no_network_changes(tmp_path):
    r = tpuq(["deploy", str(DEMO_DIR / "fleet.yaml"), "--dry-run", "--offline", "--region", "europe-west4"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "create Cloud Run service tpuq-executor (image europe-west4-docker.pkg.dev/tpuq-local/tpuq/executor:latest" in r.stdout
    assert "FOR THE PROJECT OWNER" not in r.stdout


def test_skip_services_leaves_out_the_services_and_what_pushes_to_them(tmp_path):
    assert tpuq(["init", "."], tmp_path).returncode == 0
    r = tpuq(["deploy", "fleet.yaml", "--dry-run", "--skip-services"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "create topic jobs" in r.stdout and "create Artifact Registry repository tpuq" in r.stdout
    for absent in ("Cloud Run service", "create subscription scheduler-jobs", "Cloud Scheduler job", "run.invoker"):
        assert absent not in r.stdout


def test_a_bad_fleet_file_is_one_line(tmp_path):
    (tmp_path / "fleet.yaml").write_text("name: x\nproject: p\ntpus: []\n")
    r = tpuq(["deploy", "fleet.yaml", "--dry-run"], tmp_path)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "tpus" in r.stderr
