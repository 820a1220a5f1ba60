"""Apply order and robustness: what a fresh project needs first, and what Google does moments after a create."""

from __future__ import annotations

import shutil

import pytest
import yaml

from tpuq.contracts import topology
from tpuq.deploy import gcp
from tpuq.deploy.infra import INFRA_DIR, InfraError, load_infra
from tpuq.deploy.plan import ProjectState, Target, desired_run_service, plan
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile

from .fakes import RecordingApi, state_after

FLEET = FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh",
                                  "worker_secrets": ["wandb-api-key"]})
TARGET = Target(fleet=FLEET, project_number="42")
INFRA = load_infra(TARGET.variables())


def describe(actions) -> list[str]:
    return [f"{a.verb} {a.what} {a.detail}" for a in actions]


# ------------------------------------------------------------------ secrets
def test_a_missing_secret_is_a_todo_and_nothing_is_granted_on_it():
    state = ProjectState(known=True, project_number="42", secrets={"tpuq-ssh", "tpuq-ssh-public"})  # no wandb-api-key
    actions = plan(TARGET, INFRA, state)
    on_secrets = {a.iam.key for a in actions if a.iam is not None and a.iam.key.startswith("secret:")}
    assert on_secrets == {"secret:tpuq-ssh", "secret:tpuq-ssh-public", "secret:tpuq-ui-session-key"}  # the last: deploy's
    (todo,) = [a for a in actions if a.verb == "todo" and a.what == "secret wandb-api-key"]
    assert "run tpuq deploy again" in todo.detail


def test_a_project_without_any_secret_deploys_to_the_end_and_says_what_to_create():
    actions = plan(TARGET, INFRA, ProjectState(known=True, project_number="42", secrets=set()))
    on_secrets = {a.iam.key for a in actions if a.iam is not None and a.iam.api == "secretmanager"}
    assert on_secrets == {"secret:tpuq-ui-session-key"}  # only the one deploy makes itself
    adapters = {name: RecordingApi(name) for name in [*gcp.BASE_URLS, "fleetstore"]}
    sent = gcp.apply(actions, adapters, echo=lambda line: None, sleep=lambda s: None)
    assert sent == sum(a.sends for a in actions)
    assert {r.path.rsplit("/", 1)[1] for r in adapters["secretmanager"].sent} == {
        "secrets", "tpuq-ui-session-key:addVersion", "tpuq-ui-session-key:setIamPolicy"}
    todos = " ".join(describe(a for a in actions if a.verb == "todo"))
    assert "secret tpuq-ssh" in todos and "secret wandb-api-key" in todos


def test_the_executor_is_deployed_only_once_its_key_secret_exists():
    """Without its key the executor reaches no worker: deployed anyway, it would take every assignment and start
    none (issue 32 §4). So it is left out, with a todo naming the secret and the commands that create it."""
    def deployed(state):
        actions = plan(TARGET, INFRA, state)
        executor = [a for a in actions if a.what == "Cloud Run service tpuq-executor"]
        invoker = [a for a in actions if a.iam is not None and a.iam.key == "run_service:executor"]
        return actions, executor, invoker

    actions, executor, invoker = deployed(ProjectState(known=True, project_number="42", secrets=set()))
    assert executor == [] and invoker == []  # nor a grant on a service that does not exist
    (todo,) = [a for a in actions if a.verb == "todo" and a.what == "secret tpuq-ssh"]
    assert "so it is not deployed until the secret exists" in todo.detail
    assert "gcloud secrets create tpuq-ssh --data-file=./tpuq-ssh --project=my-trc-project" in todo.commands
    assert any(a.what == "Cloud Run service tpuq-scheduler" for a in actions)  # the rest deploys
    assert any(a.what == "subscription executor-assignments" for a in actions)  # pushes wait for the service

    # once it exists, the next deploy creates the executor, mounting it
    state = state_after(actions, secrets=())
    state.secrets = {"tpuq-ssh", "tpuq-ssh-public", "wandb-api-key"}
    actions, (create,), (grant,) = deployed(state)
    assert create.verb == "create" and create.request.body["template"]["volumes"][0]["secret"]["secret"] == "tpuq-ssh"
    assert grant.role == "roles/run.invoker"
    assert not [a for a in actions if a.verb == "todo" and a.what == "secret tpuq-ssh"]


def test_an_executor_whose_key_secret_went_away_is_left_as_it_is():
    state = state_after(plan(TARGET, INFRA, ProjectState(secrets={"tpuq-ssh", "tpuq-ssh-public"})),
                        secrets=("tpuq-ssh", "tpuq-ssh-public"))
    state.secrets = {"tpuq-ssh-public"}  # deleted since: a new revision would mount nothing
    actions = plan(TARGET, INFRA, state)
    assert not [a for a in actions if a.what == "Cloud Run service tpuq-executor"]
    assert [a.what for a in actions if a.verb == "todo" and "tpuq-ssh" in a.what] == ["secret tpuq-ssh"]


def test_a_fleet_naming_no_key_secret_deploys_no_executor():
    fleet = FleetFile.model_validate({k: v for k, v in yaml.safe_load(EXAMPLE_FLEET).items() if k != "ssh_key_secret"})
    target = Target(fleet=fleet, project_number="42")
    actions = plan(target, load_infra(target.variables()), ProjectState(known=True, project_number="42",
                                                                        secrets={"tpuq-ssh", "tpuq-ssh-public"}))
    assert not [a for a in actions if a.what == "Cloud Run service tpuq-executor"]
    (todo,) = [a for a in actions if a.verb == "todo" and a.what == "SSH key"]
    assert "so it is not deployed" in todo.detail and "set ssh_key_secret: tpuq-executor-ssh" in todo.detail
    assert any(c.startswith("gcloud secrets create tpuq-executor-ssh ") for c in todo.commands)


def test_a_plan_that_could_not_read_the_secrets_still_shows_the_executor():
    (create,) = [a for a in plan(TARGET, INFRA, ProjectState()) if a.what == "Cloud Run service tpuq-executor"]
    assert create.verb == "create"  # an offline dry run: unknown is not missing


# ---------------------------------------------------------- service agents
def test_the_pubsub_agent_is_made_to_exist_before_any_grant_to_it():
    actions = plan(TARGET, INFRA, ProjectState(known=True, project_number="42", secrets=set()))
    (ensure,) = [i for i, a in enumerate(actions) if a.what.startswith("Pub/Sub service agent")]
    request = actions[ensure].request
    assert (request.api, request.method, request.path) == (
        "serviceusage_v1beta1", "POST", "projects/my-trc-project/services/pubsub.googleapis.com:generateServiceIdentity")
    assert gcp.BASE_URLS[request.api] == "https://serviceusage.googleapis.com/v1beta1/"
    agent = "serviceAccount:service-42@gcp-sa-pubsub.iam.gserviceaccount.com"
    grants = [i for i, a in enumerate(actions) if a.member == agent]
    assert grants and min(grants) > ensure
    enable_pubsub = next(i for i, a in enumerate(actions) if a.what == "API pubsub.googleapis.com")
    assert enable_pubsub < ensure
    (storage,) = [a for a in actions if a.what.startswith("Cloud Storage service agent")]
    assert (storage.request.method, storage.request.path) == ("GET", "projects/my-trc-project/serviceAccount")


def test_once_the_agents_hold_their_roles_they_are_not_asked_for_again():
    state = state_after(plan(TARGET, INFRA, ProjectState(secrets={"tpuq-ssh", "tpuq-ssh-public", "wandb-api-key"})),
                        secrets=("tpuq-ssh", "tpuq-ssh-public", "wandb-api-key"))
    assert not [a for a in plan(TARGET, INFRA, state) if a.verb == "ensure"]


# --------------------------------------------------- IAM propagation delay
class NewAccountPolicyApi:
    """A policy endpoint of an IAM that does not know a new account for its first `unknown_for` writes."""

    def __init__(self, unknown_for: int, status: int = 400):
        self.unknown_for = unknown_for
        self.status = status
        self.policy: dict = {"etag": "e1", "bindings": []}
        self.attempts = 0

    def send(self, request):
        if request.path.endswith(":getIamPolicy") or request.method == "GET":
            return yaml.safe_load(yaml.safe_dump(self.policy))
        self.attempts += 1
        if self.attempts <= self.unknown_for:
            member = request.body["policy"]["bindings"][-1]["members"][-1]
            raise gcp.ApiError("crm", request.method, request.path, self.status,
                               f"Service account {member.split(':', 1)[1]} does not exist.")
        self.policy = request.body["policy"]
        return self.policy


def first_project_grant():
    return next(a for a in plan(TARGET, INFRA, ProjectState()) if a.iam is not None and a.iam.key == "project")


def test_a_grant_to_an_account_iam_does_not_know_yet_is_retried_with_growing_waits():
    api, waits = NewAccountPolicyApi(unknown_for=5), []
    grant = first_project_grant()
    gcp.apply([grant], {grant.iam.api: api}, echo=lambda line: None, sleep=waits.append)
    assert api.policy["bindings"] == [{"role": grant.role, "members": [grant.member]}]
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0]  # exponential, from the injected sleep: the test never waits


def test_an_account_that_never_appears_fails_after_the_budget_with_googles_message():
    api, waits = NewAccountPolicyApi(unknown_for=10_000), []
    grant = first_project_grant()
    with pytest.raises(gcp.ApiError, match="does not exist"):
        gcp.apply([grant], {grant.iam.api: api}, echo=lambda line: None, sleep=waits.append)
    assert max(waits) == gcp.PROPAGATION_MAX_DELAY
    assert gcp.PROPAGATION_BUDGET <= sum(waits) < gcp.PROPAGATION_BUDGET + gcp.PROPAGATION_MAX_DELAY


def test_a_service_that_runs_as_a_new_account_is_retried_too():
    (create,) = [a for a in plan(TARGET, INFRA, ProjectState()) if a.what == "Cloud Run service tpuq-executor"]

    class Run:
        attempts = 0

        def send(self, request):
            self.attempts += 1
            if self.attempts <= 2:
                raise gcp.ApiError("run", request.method, request.path, 400,
                                   f"Service account {request.body['template']['serviceAccount']} does not exist.")
            return {}

    run, waits = Run(), []
    assert gcp.apply([create], {"run": run}, echo=lambda line: None, sleep=waits.append) == 1
    assert run.attempts == 3 and waits == [2.0, 4.0]


def test_a_missing_topic_is_not_waited_for():
    (create,) = [a for a in plan(TARGET, INFRA, ProjectState()) if a.what == "Cloud Scheduler job tpuq-tick"]

    class Scheduler:
        def send(self, request):
            raise gcp.ApiError("scheduler", request.method, request.path, 400, "Topic ticks does not exist.")

    waits = []
    with pytest.raises(gcp.ApiError, match="Topic ticks does not exist"):
        gcp.apply([create], {"scheduler": Scheduler()}, echo=lambda line: None, sleep=waits.append)
    assert waits == []  # names no account: a real error, at once


def test_other_errors_are_not_retried():
    api, waits = NewAccountPolicyApi(unknown_for=1, status=403), []
    grant = first_project_grant()
    with pytest.raises(gcp.ApiError):
        gcp.apply([grant], {grant.iam.api: api}, echo=lambda line: None, sleep=waits.append)
    assert waits == [] and api.attempts == 1


# ------------------------------------------- API enablement propagation
def google_error(status: int, reason: str, domain: str = "googleapis.com") -> dict:
    """A Google API error body (AIP-193), as one answers a call to an API enabled moments ago."""
    return {"error": {"code": status, "status": "PERMISSION_DENIED", "message":
                      "Cloud Pub/Sub API has not been used in project 42 before or it is disabled. Enable it by visiting "
                      "https://console.developers.google.com/apis/api/pubsub.googleapis.com/overview?project=42 then "
                      "retry. If you enabled this API recently, wait a few minutes for the action to propagate to our "
                      "systems and retry.",
                      "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                                   "domain": domain, "metadata": {"service": "pubsub.googleapis.com",
                                                                  "consumer": "projects/42"}}]}}


class Transport:
    """A requests-like session that answers each request with the next (status, body) of a script."""

    def __init__(self, *answers: tuple[int, dict]):
        self.answers, self.sent = list(answers), []

    def request(self, method, url, params=None, json=None, timeout=None):
        import json as json_module

        import requests

        self.sent.append((method, url))
        status, body = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        response = requests.Response()
        response.status_code, response._content = status, json_module.dumps(body).encode()
        return response


def first_topic_create():
    return next(a for a in plan(TARGET, INFRA, ProjectState()) if a.what.startswith("topic "))


def test_an_api_enabled_moments_ago_is_retried_until_it_answers():
    """Right after services:enable, the API's first calls can answer 403 SERVICE_DISABLED (production-facts.md)."""
    disabled = google_error(403, "SERVICE_DISABLED")
    transport, waits = Transport((403, disabled), (403, disabled), (200, {})), []
    create = first_topic_create()
    pubsub = gcp.RestApi("pubsub", gcp.BASE_URLS["pubsub"], transport, sleep=waits.append)
    assert gcp.apply([create], {"pubsub": pubsub}, echo=lambda line: None, sleep=waits.append) == 1
    assert len(transport.sent) == 3 and waits == [2.0, 4.0]


def test_an_api_that_stays_disabled_fails_after_its_budget_with_googles_message():
    transport, waits = Transport((403, google_error(403, "SERVICE_DISABLED"))), []
    pubsub = gcp.RestApi("pubsub", gcp.BASE_URLS["pubsub"], transport)
    with pytest.raises(gcp.ApiError, match="has not been used in project 42") as e:
        gcp.apply([first_topic_create()], {"pubsub": pubsub}, echo=lambda line: None, sleep=waits.append)
    assert e.value.service_disabled and max(waits) == gcp.PROPAGATION_MAX_DELAY
    assert gcp.ENABLEMENT_BUDGET <= sum(waits) < gcp.ENABLEMENT_BUDGET + gcp.PROPAGATION_MAX_DELAY


@pytest.mark.parametrize("status, reason, domain", [
    (403, "IAM_PERMISSION_DENIED", "iam.googleapis.com"),  # a role the caller lacks: real, said at once
    (403, "SERVICE_DISABLED", "example.com"),  # the reason names another domain's
    (400, "SERVICE_DISABLED", "googleapis.com"),
])
def test_other_refusals_are_not_waited_for(status, reason, domain):
    transport, waits = Transport((status, google_error(status, reason, domain)), (200, {})), []
    pubsub = gcp.RestApi("pubsub", gcp.BASE_URLS["pubsub"], transport)
    with pytest.raises(gcp.ApiError):
        gcp.apply([first_topic_create()], {"pubsub": pubsub}, echo=lambda line: None, sleep=waits.append)
    assert waits == [] and len(transport.sent) == 1


def test_the_older_json_apis_way_of_saying_it_is_retried_too():
    """Cloud Storage's JSON API lists reasons in error.errors[]: accessNotConfigured (domain usageLimits)."""
    body = {"error": {"code": 403, "message": "Access Not Configured.",
                      "errors": [{"domain": "usageLimits", "reason": "accessNotConfigured", "message": "x"}]}}
    transport, waits = Transport((403, body), (200, {})), []
    storage = gcp.RestApi("storage", gcp.BASE_URLS["storage"], transport)
    bucket = next(a for a in plan(TARGET, INFRA, ProjectState()) if a.what.startswith("bucket gs://"))
    assert gcp.apply([bucket], {"storage": storage}, echo=lambda line: None, sleep=waits.append) == 1
    assert waits == [2.0]


# ------------------------------------------------------ Cloud Run timeout
def test_the_executors_request_timeout_is_the_assignments_ack_deadline():
    deadline = topology.subscription_by_path("executor", "/push/assignments").ack_deadline_seconds
    assert deadline == 600
    body = desired_run_service(TARGET, INFRA, "executor")
    assert body["template"]["timeout"] == f"{deadline}s"
    for service in topology.SERVICES:  # no service's pushes are cut off before Pub/Sub stops waiting
        timeout = int(desired_run_service(TARGET, INFRA, service)["template"]["timeout"].rstrip("s"))
        assert timeout >= max(s.ack_deadline_seconds for s in topology.SUBSCRIPTIONS if s.service == service)


def test_a_timeout_below_the_ack_deadline_is_refused(tmp_path):
    shutil.copytree(INFRA_DIR, tmp_path / "infra")
    path = tmp_path / "infra" / "services.yaml"
    data = yaml.safe_load(path.read_text())
    next(s for s in data["services"] if s["name"] == "executor")["timeout_seconds"] = 300
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InfraError, match="executor.timeout_seconds: 300 is below the 600 s ack deadline of "
                                         "executor-assignments"):
        load_infra(TARGET.variables(), tmp_path / "infra")


# ------------------------------------------------------ ownership marks
def test_what_deploy_creates_carries_its_marks():
    labels = {"tpuq-owner": FLEET.owner_prefix, "tpuq-fleet": FLEET.name}
    created = [a for a in plan(TARGET, INFRA, ProjectState()) if a.verb == "create" and a.request is not None]
    marked = 0
    for a in created:
        body, api = a.request.body, a.request.api
        if api in ("pubsub", "run", "artifactregistry") or (api == "storage" and a.request.path == "b"):
            assert body["labels"] == labels, a.what
            marked += 1
        if api in ("iam", "scheduler"):
            described = body["serviceAccount"]["description"] if api == "iam" else body["description"]
            assert described == TARGET.marker, a.what
            marked += 1
    # topics, push and hold subscriptions, services (the four and the dashboard), the bucket, the repository,
    # accounts, the tick job
    assert marked == (len(topology.TOPICS) + len(topology.SUBSCRIPTIONS) + 1 + len(INFRA.services.services) + 1 + 1
                      + len(INFRA.iam.service_accounts) + 1)


# ------------------------------------------------------------ Cloud Build
def test_the_plan_says_which_account_builds_use_and_that_cloudbuild_yaml_names_its_own():
    state = ProjectState(known=True, project_number="42",
                         cloud_build_account="projects/my-trc-project/serviceAccounts/42-compute@developer.gserviceaccount.com")
    (check,) = [a for a in plan(TARGET, INFRA, state) if a.what == "Cloud Build"]
    assert "builds that name no account run as 42-compute@developer.gserviceaccount.com" in check.detail
    assert "Compute Engine default account" in check.detail
    assert f"runs as tpuq-deploy@{FLEET.project}.iam.gserviceaccount.com" in check.detail
    assert not check.sends


def test_the_cloud_build_account_is_read_from_cloud_build():
    class CloudBuild(RecordingApi):
        def call(self, method, path, params=None, body=None):
            assert (method, path) == ("GET", "projects/my-trc-project/locations/global/defaultServiceAccount")
            return {"name": path, "serviceAccountEmail": "projects/my-trc-project/serviceAccounts/42@cloudbuild.gserviceaccount.com"}

    adapters = {name: RecordingApi(name) for name in [*gcp.BASE_URLS, "fleetstore"]}
    adapters["cloudbuild"] = CloudBuild("cloudbuild")
    state, _ = gcp.read_state(adapters, TARGET, INFRA)
    assert state.cloud_build_account.endswith("/42@cloudbuild.gserviceaccount.com")
