"""`tpuq deploy` adds the dashboard as one more Cloud Run service, tpuq-ui, reachable only by the project's members.

What the plan says: the service runs `python -m tpuq.ui` (its own image, built and pushed by cloudbuild.yaml) as
the tpuq-ui account, keeps Cloud Run's invoker check on, carries TPUQ_UI_AUTH=cloudrun (users from the verified
token, tpuq.ui.identity) and no push settings, signs sessions with a key all its instances share, and nothing
grants anyone (allUsers, the push account) roles/run.invoker on it: people hold it through their project roles or
the grant docs/DEPLOYING.md gives. Its account reads what the CLI reads and publishes only on cancels and ticks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import requests
import yaml

from tests.deploy.test_cloudbuild import dockerfile_instructions
from tests.helpers import wait_until
from tpuq.deploy.infra import load_infra
from tpuq.deploy.plan import ProjectState, Target, desired_run_service, plan
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile
from tpuq_dev.devstack import processes

REPO = Path(__file__).resolve().parents[2]
TARGET = Target(fleet=FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh",
                                                "job_buckets": ["gs://data-eu"]}), project_number="42")
INFRA = load_infra(TARGET.variables())
UI_ACCOUNT = "serviceAccount:tpuq-ui@my-trc-project.iam.gserviceaccount.com"


def test_the_plan_creates_tpuq_ui_behind_the_invoker_check():
    actions = plan(TARGET, INFRA, ProjectState())
    (create,) = [a for a in actions if a.what == "Cloud Run service tpuq-ui"]
    body = create.request.body
    assert create.verb == "create" and body == desired_run_service(TARGET, INFRA, "ui")
    assert body["invokerIamDisabled"] is False
    env = {e["name"]: e["value"] for e in body["template"]["containers"][0]["env"]}
    assert env["TPUQ_UI_AUTH"] == "cloudrun" and not any(k.startswith("TPUQ_PUSH_") for k in env)
    assert body["template"]["serviceAccount"] == "tpuq-ui@my-trc-project.iam.gserviceaccount.com"
    assert body["template"]["scaling"]["maxInstanceCount"] == 3  # one session key for all: tpuq.ui.sessionkey
    assert "/tpuq/ui:" in body["template"]["containers"][0]["image"]


def test_nobody_is_granted_the_dashboard_and_nothing_is_public():
    actions = plan(TARGET, INFRA, ProjectState())
    grants = [a for a in actions if a.verb == "grant"]
    assert not [a for a in grants if a.member in ("allUsers", "allAuthenticatedUsers")]
    assert not [a for a in grants if a.iam.label == "Cloud Run service tpuq-ui"]
    ui = {(a.role, a.iam.label) for a in grants if a.member == UI_ACCOUNT}
    assert ui == {("roles/datastore.user", "project my-trc-project"),
                  ("roles/pubsub.publisher", "topic cancels"), ("roles/pubsub.publisher", "topic ticks"),
                  ("roles/secretmanager.secretAccessor", "secret tpuq-ui-session-key"),
                  ("roles/pubsub.subscriber", "subscription dead-letters-hold"),  # reads, never consumes
                  ("roles/storage.objectViewer", f"bucket gs://{TARGET.runner_bucket}"),
                  ("roles/storage.objectViewer", "bucket gs://data-eu"),
                  ("roles/cloudquotas.viewer", "project my-trc-project"), ("roles/browser", "project my-trc-project")}


def test_its_image_is_built_like_the_others_and_starts_the_dashboard():
    ui = dockerfile_instructions(REPO / "services" / "ui" / "Dockerfile")
    scheduler = dockerfile_instructions(REPO / "services" / "scheduler" / "Dockerfile")
    copies = [rest for keyword, rest in ui if keyword == "COPY"]
    assert copies == [rest for keyword, rest in scheduler if keyword == "COPY"][:len(copies)]
    assert json.loads([rest for keyword, rest in ui if keyword == "CMD"][-1]) == ["python", "-m", "tpuq.ui"]
    steps = {s["id"]: s for s in yaml.safe_load((REPO / "cloudbuild.yaml").read_text())["steps"]}
    assert steps["build-ui"]["args"][:3] == ["build", "-f", "services/ui/Dockerfile"]
    assert "push-ui" in steps["deploy"]["waitFor"]


def test_python_m_tpuq_ui_listens_on_cloud_runs_port():
    port = processes.free_port()
    env = {**os.environ, "PORT": str(port), "GOOGLE_CLOUD_PROJECT": "p", "TPUQ_UI_AUTH": "cloudrun"}
    # The module the image starts; on loopback only, on a shared machine (the container binds every interface).
    server = subprocess.Popen([sys.executable, "-m", "tpuq.ui", "--host", "127.0.0.1"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        def answered():
            try:
                return requests.get(f"http://127.0.0.1:{port}/static/htmx.min.js", timeout=5).status_code == 200
            except requests.ConnectionError:
                return server.poll() is not None
        wait_until(answered, timeout=60, what="python -m tpuq.ui on $PORT")
        assert server.poll() is None, server.stdout.read()
        refused = requests.post(f"http://127.0.0.1:{port}/jobs/j/cancel", timeout=5)
        assert refused.status_code == 403  # no session, no CSRF token: nothing changes
    finally:
        server.terminate()
        server.wait(timeout=30)
