"""IAM is enforced, not assumed: every request deploy sends, made as the principal that sends it, against the IAM model.

Two paths send a deploy: Cloud Build, as tpuq-deploy (cloudbuild.yaml's serviceAccount), with the roles infra/iam.yaml
gives it; and a person, as a project owner (docs/DEPLOYING.md, step 2). The model (tpuq_dev.iam) refuses what the
caller's roles do not allow, including `iam.serviceAccounts.actAs` on every account a request attaches, and any request
its method table has no row for.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tpuq.contracts import topology
from tpuq.cli.files import load_yaml_file, validate_data
from tpuq.deploy import gcp
from tpuq.deploy.infra import DEPLOY_SERVICE_ACCOUNT, load_infra
from tpuq.deploy.plan import ProjectState, Target, plan
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile, worker_service_account
from tpuq_dev.devstack.stack import DEMO_DIR, LOCAL_PROJECT_OWNER
from tpuq_dev.iam import methods, roles
from tpuq_dev.iam.model import Project, Refusal, Resource, check

from . import discovery
from .test_api_schemas import RecordingSession, TpuRestRecorder, drifted_plan
from .test_dry_run import tpuq

OWNER = f"user:{LOCAL_PROJECT_OWNER}"
SECRETS = ("tpuq-ssh", "tpuq-ssh-public", "wandb-api-key")
FLEET = FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh",
                                  "worker_secrets": ["wandb-api-key"], "job_buckets": ["gs://my-trc-data"]})


def deployer(target: Target) -> str:
    return f"serviceAccount:{target.sa_email(DEPLOY_SERVICE_ACCOUNT)}"


def owned_project(target: Target) -> Project:
    """A project before any deploy: its owner, and the fleet's job buckets (the user's, made in the project with the
    default policy, as the todo's command makes them: tpuq_dev.iam.roles)."""
    project = Project(target.project, storage_agent=target.agent_email("storage"))
    project.grant(project.resource, roles.OWNER, OWNER)
    for name in target.fleet.job_bucket_names:
        project.add_bucket(name)
    return project


def deployed_project(target: Target) -> Project:
    """The project once a first deploy applied every grant infra/iam.yaml makes, as deploy's plan makes them."""
    infra = load_infra(target.variables())
    return owned_project(target).after_grants(plan(target, infra, ProjectState(secrets=set(SECRETS))))


def refused(refusals: list[Refusal]) -> str:
    return "\n".join(str(r) for r in refusals)


def blocking(refusals: list[Refusal]) -> list[Refusal]:
    return [r for r in refusals if not r.advisory]


# ------------------------------------------------------------ what deploy sends
def dry_run(tmp_path: Path, which: str) -> tuple[Target, list[dict]]:
    """`tpuq deploy --dry-run --offline --json` on the init fleet (with an SSH key secret) or the demo's, and the
    Target it planned for (the same fleet file, read as the CLI reads it)."""
    if which == "init":
        assert tpuq(["init", "."], tmp_path).returncode == 0
        path = tmp_path / "fleet.yaml"
        # Set, not appended: a key given twice is refused (tpuq.contracts.yamltext).
        fleet = {**yaml.safe_load(path.read_text()), "ssh_key_secret": "tpuq-ssh", "job_buckets": ["gs://my-trc-data"]}
        path.write_text(yaml.safe_dump(fleet, sort_keys=False))
    else:
        path = DEMO_DIR / "fleet.yaml"
    r = tpuq(["deploy", str(path), "--dry-run", "--offline", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    return Target(fleet=validate_data(load_yaml_file(path), "fleet")), [json.loads(l) for l in r.stdout.splitlines()]


@pytest.mark.parametrize("which", ["init", "demo"])
def test_every_request_of_a_deploy_is_allowed_to_the_cloud_build_account(tmp_path, which):
    target, requests = dry_run(tmp_path, which)
    assert {methods.find(r["method"], r["url"]).method.id for r in requests} >= {
        "run.projects.locations.services.create", "pubsub.projects.subscriptions.create",
        "cloudscheduler.projects.locations.jobs.create", "iam.projects.serviceAccounts.setIamPolicy"}
    assert refused(check(requests, deployer(target), deployed_project(target))) == ""


@pytest.mark.parametrize("which", ["init", "demo"])
def test_every_request_of_a_deploy_is_allowed_to_a_project_owner(tmp_path, which):
    """The hand path, on a project that has nothing yet: the runner bucket the plan creates gets the default policy
    that lets owners manage it, and each grant lands before what needs it."""
    target, requests = dry_run(tmp_path, which)
    assert refused(check(requests, OWNER, owned_project(target))) == ""


def updates_and_secret_grants() -> tuple[Target, list[dict]]:
    """A project that has everything, with every resource drifted, and secrets to grant and mount (updates carry
    the same attached accounts as creates: a PATCH of a service needs actAs too)."""
    retagged, actions = drifted_plan(FLEET, SECRETS)
    return retagged, [line for a in actions for line in gcp.wire_requests(a)]


def test_updates_secret_grants_and_secret_mounts_are_allowed_to_both():
    target, requests = updates_and_secret_grants()
    ids = {methods.find(r["method"], r["url"]).method.id for r in requests}
    assert {"run.projects.locations.services.patch", "pubsub.projects.subscriptions.patch",
            "cloudscheduler.projects.locations.jobs.patch", "secretmanager.projects.secrets.setIamPolicy"} <= ids
    assert any("volumes" in (r["body"] or {}).get("template", {}) for r in requests)  # the executor mounts its key
    assert refused(check(requests, deployer(target), deployed_project(target))) == ""
    project = owned_project(target)
    project.add_bucket(target.runner_bucket)  # made by the first deploy
    assert refused(check(requests, OWNER, project)) == ""


def test_moving_an_older_deploys_tick_subscription_is_allowed_to_the_cloud_build_account():
    """A subscription cannot change topic: deploy deletes its own and creates it again (the ticks the janitor routes
    since 2026-12-05); `pubsub.subscriptions.delete` is in roles/pubsub.admin."""
    from tpuq.deploy.subscriptions import desired_subscription

    target, _ = drifted_plan(FLEET, SECRETS)
    infra = load_infra(target.variables())
    state = ProjectState(known=True, project_number="42", secrets=set(SECRETS))
    spec = next(s for s in infra.pubsub.subscriptions if s.name == "scheduler-ticks")
    state.subscriptions = {spec.name: {**desired_subscription(target, infra, spec),
                                       "topic": f"projects/{target.project}/topics/ticks"}}
    requests = [line for a in plan(target, infra, state) if a.what == "subscription scheduler-ticks"
                for line in gcp.wire_requests(a)]
    assert [methods.find(r["method"], r["url"]).method.id for r in requests] == [
        "pubsub.projects.subscriptions.delete", "pubsub.projects.subscriptions.create"]
    assert refused(check(requests, deployer(target), deployed_project(target))) == ""


class AnsweringSession(RecordingSession):
    """Records every request; answers each with a resource that exists, so every read deploy makes is made."""

    def request(self, method, url, params=None, json=None, timeout=None):
        response = super().request(method, url, params, json, timeout)
        response._content = b'{"name": "projects/p/databases/(default)"}'
        return response


def test_reading_the_project_is_allowed_but_for_cloud_builds_default_account():
    target = Target(fleet=FleetFile.model_validate({**FLEET.model_dump(), "ssh_transport": "vpc"}), project_number="42")
    session = AnsweringSession()
    adapters = {name: gcp.RestApi(name, url, session) for name, url in gcp.BASE_URLS.items()}
    adapters["fleetstore"] = object()  # the Firestore client's read: not a REST request
    gcp.read_state(adapters, target, load_infra(target.variables()))
    read = {methods.find(r["method"], r["url"]).method.id for r in session.sent if methods.find(r["method"], r["url"])}
    assert {"compute.routers.list", "compute.subnetworks.get", "firestore.projects.databases.collectionGroups.indexes.list",
            "cloudbilling.projects.getBillingInfo", "storage.notifications.list"} <= read
    as_deployer = check(session.sent, deployer(target), deployed_project(target))
    assert blocking(as_deployer) == [], refused(as_deployer)
    # tpuq-deploy holds no Cloud Build role: the plan only loses the line naming the default build account.
    assert {r.method for r in as_deployer} == {"cloudbuild.projects.locations.getDefaultServiceAccount"}
    project = owned_project(target)
    project.add_bucket(target.runner_bucket)  # read as existing: made by a first deploy
    assert refused(check(session.sent, OWNER, project)) == ""


# ------------------------------------------------------------ what the check says
def without_grants(requests: list[dict]) -> list[dict]:
    """A later deploy's requests, every grant already in place (else the plan's own grants would restore a binding
    a test removed, before the request that needs it: the model applies each grant that passes)."""
    return [r for r in requests if methods.find(r["method"], r["url"]).method.effect != "grant"]


@pytest.mark.parametrize("account, method, count", [
    ("tpuq-ui", "run.projects.locations.services.patch", 1),  # template.serviceAccount
    ("tpuq-push", "pubsub.projects.subscriptions.patch", len(topology.SUBSCRIPTIONS)),  # every push's oidcToken
])
def test_an_account_the_caller_may_not_act_as_is_refused_naming_method_permission_and_account(account, method, count):
    target, requests = updates_and_secret_grants()
    project = deployed_project(target)
    project.bindings = {b for b in project.bindings if b[0] != Resource("service_account", target.sa_email(account))}
    refusals = check(without_grants(requests), deployer(target), project)
    assert len(refusals) == count and {r.method for r in refusals} == {method}
    assert (f"{target.sa_email(DEPLOY_SERVICE_ACCOUNT)} lacks iam.serviceAccounts.actAs on service account "
            f"{target.sa_email(account)}") in str(refusals[0])


def test_a_scheduler_job_that_calls_with_a_token_needs_act_as_on_its_account():
    """tpuq's tick publishes to a topic (pubsubTarget: no account); a job with httpTarget's token would attach one."""
    target = Target(fleet=FLEET, project_number="42")
    job = {"method": "POST", "url": "https://cloudscheduler.googleapis.com/v1/projects/my-trc-project/locations/"
           "us-central1/jobs", "query": {}, "body": {"httpTarget": {"uri": "https://x", "oidcToken": {
               "serviceAccountEmail": target.sa_email("tpuq-worker")}}}}
    (refusal,) = check([job], deployer(target), deployed_project(target))
    assert f"lacks iam.serviceAccounts.actAs on service account {target.sa_email('tpuq-worker')}" in str(refusal)
    assert check([job], OWNER, owned_project(target)) == []


def test_a_revision_whose_account_cannot_read_its_secret_is_refused():
    target, requests = updates_and_secret_grants()
    project = deployed_project(target)
    project.bindings = {b for b in project.bindings if b[0] != Resource("secret", "tpuq-ssh")}
    (refusal,) = check(without_grants(requests), deployer(target), project)
    assert (f"{target.sa_email('tpuq-executor')} lacks secretmanager.versions.access on secret tpuq-ssh"
            in str(refusal)), refusal


def test_a_request_the_table_has_no_row_for_is_refused():
    request = {"method": "POST", "url": "https://run.googleapis.com/v2/projects/p/locations/r/jobs", "query": {},
               "body": {}}
    (refusal,) = check([request], OWNER, owned_project(Target(fleet=FLEET)))
    assert "no row in the IAM model's method table" in str(refusal)


# ------------------------------------------------------------ reading what Pub/Sub dead-lettered
def held_read(project: str) -> list[dict]:
    """tpuq.operations.heldletters.read as REST: a pull from the hold subscription, then modifyAckDeadline 0 on what it got."""
    path = f"https://pubsub.googleapis.com/v1/projects/{project}/subscriptions/{topology.DEAD_LETTER_HOLD_SUBSCRIPTION}"
    return [{"method": "POST", "url": f"{path}:pull", "query": {}, "body": {"maxMessages": 1000}},
            {"method": "POST", "url": f"{path}:modifyAckDeadline", "query": {},
             "body": {"ackIds": ["a"], "ackDeadlineSeconds": 0}}]


def test_the_dashboard_and_owners_may_read_the_dead_letters_pubsub_kept_and_no_service_may():
    target = Target(fleet=FLEET, project_number="42")
    requests = held_read(target.project)
    assert [methods.find(r["method"], r["url"]).method.id for r in requests] == [
        "pubsub.projects.subscriptions.pull", "pubsub.projects.subscriptions.modifyAckDeadline"]
    assert check(requests, f"serviceAccount:{target.sa_email('tpuq-ui')}", deployed_project(target)) == []
    assert check(requests, OWNER, owned_project(target)) == []
    refusals = check(requests, f"serviceAccount:{target.sa_email('tpuq-scheduler')}", deployed_project(target))
    assert [r.permission for r in refusals] == ["pubsub.subscriptions.consume"] * 2
    assert f"on subscription {topology.DEAD_LETTER_HOLD_SUBSCRIPTION}" in str(refusals[0])


# ------------------------------------------------------------ the claimer
def claimer_create(project: str) -> dict:
    """The claimer's queued-resource create, as google-cloud-tpu's REST transport sends it (build_queued_resource)."""
    from datetime import datetime, timezone

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2

    from tpuq.claimer.model import QrRecord
    from tpuq.claimer.tpuapi import TpuApi

    fleet = FleetFile.model_validate({"name": "race", "project": project,
                                      "tpus": [{"id": "small", "type": "v4-32", "zones": ["us-central2-b"]}]})
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    qr = QrRecord(qr_id="tpuq-r-1-us-central2-b", fleet="race", project=project, request_id="r-1", entry_id="small",
                  zone="us-central2-b", type="v4-32", spot=True, generation=0, state="REQUESTED", created_at=now,
                  updated_at=now)
    client = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials())
    recorder = TpuRestRecorder()
    client._transport._session.request = recorder
    TpuApi(client, attempts=1, worker_service_account=worker_service_account(project)).create(
        qr, fleet, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample")
    (sent,) = recorder.sent
    return sent


def test_the_claimer_may_create_nodes_that_run_as_the_worker_account_and_only_through_its_grant():
    target = Target(fleet=FLEET, project_number="42")
    create = claimer_create(target.project)
    claimer = f"serviceAccount:{target.sa_email('tpuq-claimer')}"
    assert check([create], claimer, deployed_project(target)) == []
    project = deployed_project(target)
    worker = Resource("service_account", worker_service_account(target.project))
    project.bindings = {b for b in project.bindings if b[0] != worker}
    (refusal,) = check([create], claimer, project)
    assert str(refusal).startswith("tpu.projects.locations.queuedResources.create (POST https://tpu.googleapis.com/")
    assert f"lacks iam.serviceAccounts.actAs on service account {worker_service_account(target.project)}" in str(refusal)


# ------------------------------------------------------------ the tables themselves
@pytest.mark.parametrize("row", methods.METHODS, ids=lambda row: row.id)
def test_each_row_is_the_documented_method_of_its_id_and_says_where_its_permissions_come_from(row):
    sample = re.sub(r"\{([a-z_]+)\}", lambda m: f"sample-{m.group(1)}", row.url)
    api = row.id.split(".", 1)[0]
    if not list(discovery.documents_dir().glob(f"{api}.*.json")):  # Cloud Quotas: no document ships; its page
        assert row.source.startswith(f"https://cloud.google.com/docs/quotas/reference/rest/") and api == "cloudquotas"
    else:
        found, _ = discovery.find_method(row.http_method, sample)
        assert found is not None and found.id == row.id, (row.id, found and found.id)
    assert methods.find(row.http_method, sample).method is row  # no other row shadows it
    assert row.source and all(n.permission for n in row.needs)


def test_every_role_deploy_grants_has_a_row_and_the_rows_list_only_modelled_permissions():
    granted = {b.role for b in load_infra(Target(fleet=FLEET).variables()).iam.bindings}
    assert granted - set(roles.ROLES) == set()
    modelled = methods.modelled_permissions()
    assert {role: set(perms) - modelled for role, (_, perms) in roles.ROLES.items() if set(perms) - modelled} == {}
    assert roles.OWNER_LACKS <= modelled
