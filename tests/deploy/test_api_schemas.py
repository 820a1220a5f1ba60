"""Every request tpuq sends to Google is one Google documents: checked against the discovery documents.

The documents are the ones google-api-python-client ships offline (a test dependency only). The test is generic:
it checks whatever `tpuq deploy --dry-run --offline --json` prints, so any request added to deploy is checked too.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone

import pytest
import requests
import yaml

from tpuq.deploy import gcp
from tpuq.deploy.infra import load_infra
from tpuq.deploy.plan import ProjectState, Target, plan
from tpuq_dev.devstack.stack import DEMO_DIR
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile

from . import discovery
from .fakes import state_after
from .test_dry_run import tpuq

FLEET = FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh",
                                  "worker_secrets": ["wandb-api-key"]})
SECRETS = ("tpuq-ssh", "tpuq-ssh-public", "wandb-api-key")


def problems_of(lines: list[dict]) -> list[str]:
    return [p for line in lines for p in discovery.check(line)]


# ------------------------------------------------------- the checker itself
@pytest.mark.parametrize("request_, expected", [
    ({"method": "PUT", "url": "https://pubsub.googleapis.com/v1/projects/p/topics/t", "query": {}, "body": {"lables": {}}},
     "body.lables: no such field"),
    ({"method": "POST", "url": "https://pubsub.googleapis.com/v1/projects/p/topics/t", "query": {}, "body": {}},
     "no method takes POST at this path"),
    ({"method": "POST", "url": "https://run.googleapis.com/v2/projects/p/locations/r/services", "query": {"serviceId": "s"},
      "body": {"template": {"containers": [{"image": "i"}], "executionEnvironment": "GEN3"}}},
     "body.template.executionEnvironment: 'GEN3' is not one of"),
    ({"method": "POST", "url": "https://storage.googleapis.com/storage/v1/b", "query": {}, "body": {"name": "b"}},
     "required query parameter 'project' is missing"),
    ({"method": "GET", "url": "https://cloudscheduler.googleapis.com/v1/projects/p/locations/r/jobz", "query": {}, "body": None},
     "no documented method has this path"),
    ({"method": "POST", "url": "https://serviceusage.googleapis.com/v1/projects/p/services/pubsub.googleapis.com:generateServiceIdentity",
      "query": {}, "body": {}}, "no documented method has this path"),  # v1beta1 only
    ({"method": "PUT", "url": "https://pubsub.googleapis.com/v1/projects/p/subscriptions/s", "query": {},
      "body": {"topic": "projects/p/topics/t", "retryPolicy": {"minimumBackoff": "1 second"}}},
     "body.retryPolicy.minimumBackoff: '1 second' is not a google-duration"),
], ids=["unknown-field", "wrong-verb", "bad-enum", "missing-required-query", "unknown-path", "v1-has-no-service-identity",
        "bad-duration"])
def test_the_checker_finds_what_google_would_refuse(request_, expected):
    assert any(expected in p for p in discovery.check(request_)), discovery.check(request_)


# ------------------------------------------------------------------- deploy
@pytest.mark.parametrize("fleet", ["init", "demo"])
def test_every_request_of_a_deploy_to_an_empty_project_is_documented(tmp_path, fleet):
    if fleet == "init":
        assert tpuq(["init", "."], tmp_path).returncode == 0
        # Set, not appended: a key given twice is refused (tpuq.contracts.yamltext).
        fleet = {**yaml.safe_load((tmp_path / "fleet.yaml").read_text()), "ssh_key_secret": "tpuq-ssh"}
        (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet, sort_keys=False))
        path = "fleet.yaml"
    else:
        path = str(DEMO_DIR / "fleet.yaml")
    r = tpuq(["deploy", path, "--dry-run", "--offline", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines and all(set(line) == {"method", "url", "query", "body"} for line in lines)
    assert problems_of(lines) == []


def drifted_plan(fleet: FleetFile, secrets: tuple[str, ...]) -> tuple[Target, list]:
    """A project that has everything, with every resource drifted and no grant left, planned again with a new
    image tag: the updates, grants and secret mounts deploy sends there. (the target, the actions)"""
    target = Target(fleet=fleet, project_number="42")
    infra = load_infra(target.variables())
    state = state_after(plan(target, infra, ProjectState(known=True, project_number="42", secrets=set(secrets))),
                        secrets=secrets)
    for sub in state.subscriptions.values():
        sub["ackDeadlineSeconds"] = 11
    for bucket in state.buckets.values():
        bucket["lifecycle"] = {"rule": []}
    for job in state.scheduler_jobs.values():
        job["schedule"] = "*/5 * * * *"
    state.iam = {}  # every grant again, the secrets' included
    retagged = replace(target, image_tag="b42")
    return retagged, plan(retagged, load_infra(retagged.variables()), state)


def test_updates_and_secret_grants_on_a_project_that_has_everything_are_documented():
    _, actions = drifted_plan(FLEET, SECRETS)
    verbs = {(a.verb, a.request.api if a.request else a.iam.api) for a in actions if a.sends}
    assert {("update", "run"), ("update", "pubsub"), ("update", "storage"), ("update", "scheduler"),
            ("grant", "secretmanager")} <= verbs
    assert problems_of([line for a in actions for line in gcp.wire_requests(a)]) == []


class RecordingSession:
    """A requests-like session that records every request and answers 200 with an empty object."""

    def __init__(self):
        self.sent: list[dict] = []

    def request(self, method, url, params=None, json=None, timeout=None):
        self.sent.append({"method": method, "url": url, "query": dict(params or {}), "body": json})
        response = requests.Response()
        response.status_code, response._content = 200, b"{}"
        return response


def test_reading_the_project_sends_only_documented_requests():
    target = Target(fleet=FLEET)
    infra = load_infra(target.variables())
    session = RecordingSession()
    adapters = {name: gcp.RestApi(name, url, session) for name, url in gcp.BASE_URLS.items()}
    adapters["fleetstore"] = object()  # no stored_version: not read
    gcp.read_state(adapters, target, infra)
    assert len(session.sent) > 10
    assert problems_of(session.sent) == []


# --------------------------------------------------------------- Cloud TPU
class TpuRestRecorder:
    """What google-cloud-tpu's REST transport sends through its session, recorded; it answers a pending operation."""

    def __init__(self):
        self.sent: list[dict] = []

    def __call__(self, method, url, params=None, data=None, **kwargs):
        self.sent.append({"method": method.upper(), "url": url, "query": dict(params or []),
                          "body": json.loads(data) if data else None})
        response = requests.Response()
        response.status_code = 200
        response._content = b'{"name": "projects/p/locations/z/operations/op-1"}'
        return response


@pytest.mark.parametrize("entry_id", ["small", "big"])
def test_the_claimers_queued_resource_create_is_documented(entry_id):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2

    from tpuq.claimer.model import QrRecord
    from tpuq.claimer.tpuapi import TpuApi

    fleet = FleetFile.model_validate({
        "name": "race", "project": "p",
        "tpus": [{"id": "small", "type": "v4-32", "zones": ["us-central2-b"]},
                 {"id": "big", "type": "v5litepod-64", "zones": ["europe-west4-a"], "provisioning_model": "on_demand"}]})
    zone, type_ = {"small": ("us-central2-b", "v4-32"), "big": ("europe-west4-a", "v5litepod-64")}[entry_id]
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    qr = QrRecord(qr_id=f"tpuq-r-1-{zone}", fleet="race", project="p", request_id="r-1", entry_id=entry_id, zone=zone,
                  type=type_, spot=entry_id == "small", generation=0, state="REQUESTED", created_at=now, updated_at=now)
    client = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials())
    session = TpuRestRecorder()
    client._transport._session.request = session  # Session.post(...) comes here: no network, no credentials
    TpuApi(client, attempts=1, worker_service_account="tpuq-worker@p.iam.gserviceaccount.com").create(
        qr, fleet, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample")
    (sent,) = session.sent
    assert sent["url"] == f"https://tpu.googleapis.com/v2/projects/p/locations/{zone}/queuedResources"
    assert sent["query"]["queuedResourceId"] == qr.qr_id
    assert problems_of(session.sent) == []


# ------------------------------------------------------------- Cloud Build
def test_cloudbuild_yaml_is_a_build_cloud_build_documents():
    """`gcloud builds submit` sends cloudbuild.yaml as the Build of projects.builds.create."""
    from .test_cloudbuild import BUILD

    build = {"method": "POST", "url": "https://cloudbuild.googleapis.com/v1/projects/p/builds", "query": {},
             "body": BUILD}
    assert discovery.find_method("POST", build["url"])[0].id == "cloudbuild.projects.builds.create"
    assert discovery.check(build) == []
