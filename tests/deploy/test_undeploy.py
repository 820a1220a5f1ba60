"""`tpuq undeploy` removes what deploy created, keeps data unless --purge, and never touches anything else."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from tpuq.contracts import store
from tpuq.deploy import gcp
from tpuq.deploy.infra import load_infra
from tpuq.deploy.plan import ProjectState, Target, plan
from tpuq.deploy.undeploy import undeploy_plan
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile

from . import discovery
from .fakes import ProjectApi, RecordingApi, state_after
from .test_dry_run import tpuq

FLEET = FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh"})
TARGET = Target(fleet=FLEET, project_number="42")
INFRA = load_infra(TARGET.variables())
P = FLEET.project
SECRETS = ("tpuq-ssh", "tpuq-ssh-public")
BOSS = ("roles/owner", "user:boss@example.com")
OTHER_APP = ("roles/pubsub.publisher", f"serviceAccount:billing@{P}.iam.gserviceaccount.com")
PUBSUB_AGENT = "serviceAccount:service-42@gcp-sa-pubsub.iam.gserviceaccount.com"


def deployed() -> ProjectState:
    """A project after a deploy, plus resources that are someone else's, some with tpuq's very names."""
    s = state_after(plan(TARGET, INFRA, ProjectState(secrets=set(SECRETS))), secrets=SECRETS)
    s.iam["project"] |= {BOSS, OTHER_APP}
    s.buckets[TARGET.runner_bucket]["labels"] = dict(TARGET.labels)
    # someone else's topic and subscription, and their subscription on tpuq's `jobs` topic
    s.topics |= {"billing-events"}
    s.topic_resources["billing-events"] = {"name": f"projects/{P}/topics/billing-events"}
    s.subscriptions["billing-audit"] = {"topic": f"projects/{P}/topics/billing-events"}
    s.subscriptions["jobs-audit"] = {"topic": f"projects/{P}/topics/jobs"}
    # a topic with tpuq's name that tpuq did not create (no labels), and a look-alike account
    s.topic_resources["cancels"].pop("labels")
    s.service_account_resources[f"tpuq-janitor@{P}.iam.gserviceaccount.com"]["description"] = "the ops team's janitor"
    s.service_accounts |= {f"billing@{P}.iam.gserviceaccount.com"}
    return s


def removed(actions) -> set[str]:
    return {f"{a.verb} {a.what}" for a in actions if a.sends}


def test_it_removes_what_deploy_created_and_keeps_everything_else():
    actions = undeploy_plan(TARGET, INFRA, deployed())
    gone = removed(actions)
    assert f"delete Cloud Scheduler job tpuq-tick" in gone
    for service in ("scheduler", "claimer", "executor", "janitor"):
        assert f"delete Cloud Run service tpuq-{service}" in gone
    for sub in INFRA.pubsub.subscriptions:
        assert f"delete subscription {sub.name}" in gone
    assert "delete subscription dead-letters-hold" in gone
    assert "delete notification gs://my-trc-project-tpuq-runner/submit/" in gone
    # never someone else's, even on tpuq's topic or with tpuq's names
    assert not any(x in " ".join(gone) for x in ("billing", "jobs-audit", "topic cancels", "tpuq-janitor@"))
    assert "delete topic jobs" not in gone  # jobs-audit reads from it: deleting it would detach that
    assert {"delete topic capacity", "delete topic dead-letters", "delete topic gcs-events"} <= gone
    kept = {a.what: a.detail for a in actions if a.verb == "keep"}
    assert "jobs-audit" in kept["topic jobs"] and "not created by tpuq deploy" in kept["topic cancels"]
    assert "not created by tpuq deploy" in kept[f"service account tpuq-janitor@{P}.iam.gserviceaccount.com"]
    # the accounts deploy created go, tpuq-deploy last; their roles on what survives are revoked first
    deletes = [a.what for a in actions if a.verb == "delete" and a.what.startswith("service account")]
    assert deletes[-1] == f"service account tpuq-deploy@{P}.iam.gserviceaccount.com"
    assert f"service account tpuq-janitor@{P}.iam.gserviceaccount.com" not in deletes
    revoked = {(a.iam.key, a.role, a.member) for a in actions if a.verb == "revoke"}
    assert ("project", "roles/tpu.admin", f"serviceAccount:tpuq-claimer@{P}.iam.gserviceaccount.com") in revoked
    assert ("secret:tpuq-ssh", "roles/secretmanager.secretAccessor",
            f"serviceAccount:tpuq-executor@{P}.iam.gserviceaccount.com") in revoked
    assert not [r for r in revoked if "tpuq-janitor@" in r[2]]  # not ours: its roles are not ours to take
    first_account_delete = next(i for i, a in enumerate(actions) if a.what.startswith("service account") and a.sends)
    assert max(i for i, a in enumerate(actions) if a.verb == "revoke") < first_account_delete
    # Google's service agent keeps its project role; the owner is told how to remove it
    (agent,) = [a for a in actions if a.verb == "keep" and PUBSUB_AGENT.split(":")[1] in a.what]
    assert agent.commands == (f"gcloud projects remove-iam-policy-binding {P} --member={PUBSUB_AGENT} "
                              "--role=roles/pubsub.subscriber",)
    # data stays without --purge
    assert not [a for a in actions if a.verb == "delete" and ("bucket" in a.what or "Firestore" in a.what
                                                              or "Artifact" in a.what or "object" in a.what)]
    assert {"bucket gs://my-trc-project-tpuq-runner", "Firestore data in (default)",
            "Artifact Registry repository tpuq"} <= set(kept)


def test_a_revoke_takes_one_pair_and_leaves_every_other_binding():
    state = deployed()
    (revoke,) = [a for a in undeploy_plan(TARGET, INFRA, state)
                 if a.verb == "revoke" and a.iam.key == "project" and a.role == "roles/tpu.admin"
                 and "claimer" in a.member]

    class PolicyApi:
        def __init__(self):
            self.policy = {"etag": "e", "bindings": [
                {"role": "roles/owner", "members": ["user:boss@example.com"]},
                {"role": "roles/tpu.admin", "members": [revoke.member, f"serviceAccount:tpuq-janitor@{P}.iam.gserviceaccount.com"]},
                {"role": "roles/tpu.admin", "members": [revoke.member], "condition": {"expression": "true", "title": "t"}}]}

        def send(self, request):
            if request.path.endswith(":getIamPolicy"):
                return copy.deepcopy(self.policy)
            self.policy = request.body["policy"]
            return self.policy

    api = PolicyApi()
    gcp.apply([revoke], {"crm": api}, echo=lambda line: None, sleep=lambda s: None)
    assert api.policy == {"etag": "e", "bindings": [
        {"role": "roles/owner", "members": ["user:boss@example.com"]},
        {"role": "roles/tpu.admin", "members": [f"serviceAccount:tpuq-janitor@{P}.iam.gserviceaccount.com"]},
        {"role": "roles/tpu.admin", "members": [revoke.member], "condition": {"expression": "true", "title": "t"}}]}


def test_purge_deletes_the_bucket_the_images_and_tpuqs_collections_but_not_the_database():
    state = deployed()
    bucket = TARGET.runner_bucket
    state.bucket_objects[bucket] = ["tpuq/jobs/j/attempts/1/tpuq-logs/worker-0/0.txt", "submit/job.yaml"]
    actions = undeploy_plan(TARGET, INFRA, state, purge=True)
    gone = [f"{a.verb} {a.what}" for a in actions if a.sends]
    objects = [i for i, g in enumerate(gone) if g.startswith("delete object")]
    assert len(objects) == 2 and max(objects) < gone.index(f"delete bucket gs://{bucket}")  # a bucket goes empty
    assert "delete Artifact Registry repository tpuq" in gone
    (data,) = [a for a in actions if a.what == "Firestore data in (default)"]
    assert data.request.body == {"collectionIds": list(store.ALL_COLLECTIONS)}
    assert "keep" in {a.verb for a in actions if a.what == "Firestore database (default)"}
    assert [a for a in actions if a.verb == "delete" and a.what.startswith("Firestore index")]
    # no grant is revoked on a bucket that is deleted anyway
    assert not [a for a in actions if a.verb == "revoke" and a.iam.key == "bucket:runner"]


def test_purge_never_deletes_a_bucket_deploy_did_not_create():
    state = deployed()
    state.buckets[TARGET.runner_bucket]["labels"] = {"team": "ml"}  # the user's own bucket, named as runner_bucket
    actions = undeploy_plan(TARGET, INFRA, state, purge=True)
    assert not [a for a in actions if a.verb == "delete" and "bucket" in a.what]
    assert [a for a in actions if a.verb == "revoke" and a.iam.key == "bucket:runner"]  # tpuq's roles on it go


def test_undeploying_an_empty_project_removes_nothing():
    assert [a for a in undeploy_plan(TARGET, INFRA, ProjectState(known=True, project_number="42")) if a.sends] == []


def test_a_delete_of_something_already_gone_is_done():
    (first,) = [a for a in undeploy_plan(TARGET, INFRA, deployed()) if a.what == "Cloud Scheduler job tpuq-tick"]

    class Gone:
        def send(self, request):
            raise gcp.ApiError("scheduler", request.method, request.path, 404, "not found")

    assert gcp.apply([first], {"scheduler": Gone()}, echo=lambda line: None) == 1


def test_every_undeploy_request_is_documented():
    state = deployed()
    state.bucket_objects[TARGET.runner_bucket] = ["tpuq/jobs/j/attempts/1/tpuq-logs/worker-0/0.txt"]
    lines = [line for a in undeploy_plan(TARGET, INFRA, state, purge=True) for line in gcp.wire_requests(a)]
    assert {line["method"] for line in lines} >= {"DELETE", "POST", "GET"}
    assert [p for line in lines for p in discovery.check(line)] == []


def test_undeploy_without_a_prompt_needs_yes(tmp_path):
    assert tpuq(["init", "."], tmp_path).returncode == 0
    r = tpuq(["undeploy", "fleet.yaml"], tmp_path)
    assert r.returncode == 1 and "--yes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = tpuq(["undeploy", "fleet.yaml", "--dry-run"], tmp_path)  # no credentials here: says so, in one line
    assert r.returncode == 1 and "credentials" in r.stderr and len(r.stderr.strip().splitlines()) == 1


class OneTopicPubsub(RecordingApi):
    """Pub/Sub holding one topic that deploy created (its labels), and nothing else."""

    def list_all(self, path, key, params=None):
        if key == "topics":
            return [{"name": f"projects/{P}/topics/jobs", "labels": dict(TARGET.labels)}]
        return []


def adapters_factory(project):
    adapters = {name: RecordingApi(name) for name in [*gcp.BASE_URLS, "fleetstore"]}
    adapters["crm"] = ProjectApi("42")
    adapters["pubsub"] = OneTopicPubsub("pubsub")
    return adapters


@pytest.mark.parametrize("answer", [False, True])
def test_undeploy_asks_first_and_removes_nothing_when_told_no(answer):
    from rich.console import Console

    from tpuq.deploy.cli import run_undeploy

    made = {}

    def factory(project):
        made.update(adapters_factory(project))
        return made

    console = Console(record=True, width=300)
    questions = []
    code = run_undeploy(FLEET, console, dry_run=False, purge=False, region="us-central1", infra_dir=None,
                        confirm=lambda q: questions.append(q) or answer, adapters_factory=factory)
    assert questions == [f"make the 1 change listed above to {P}?"]
    sent = made["pubsub"].sent
    if answer:
        assert code == 0 and [(r.method, r.path) for r in sent] == [("DELETE", f"projects/{P}/topics/jobs")]
    else:
        assert code == 1 and sent == [] and "nothing removed" in console.export_text()
