"""The real apply against the Pub/Sub and Firestore emulators: topics and subscriptions exactly as infra/ says.

The other APIs (IAM, Run, Scheduler, Storage notifications, ...) have no emulator here: recorders stand in.
A project of its own on the shared emulator keeps this apart from the stack's own topics.
"""

from __future__ import annotations

import pytest
import requests

from tpuq.contracts import topology
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import firestore

from tpuq.deploy import gcp
from tpuq.deploy.infra import INFRA_DIR, load_infra
from tpuq.deploy.plan import Target, plan
from tpuq.deploy.subscriptions import expiration_ttl, subscription_projection
from tpuq.deploy.undeploy import undeploy_plan
from tpuq.contracts.fleet import FleetFile
from tpuq_dev.devstack.stack import DEMO_DIR

from .fakes import EmulatorWithoutIam, FirestoreAdminStandIn, ProjectApi, RecordingApi, SecretsHeld

PROJECT = "tpuq-deploy-test"


@pytest.fixture
def deployment(stack):
    host = stack.env["PUBSUB_EMULATOR_HOST"]
    requests.post(f"http://{host}/reset", timeout=10)  # clean_stack declares its topics again for the next test
    data = yaml.safe_load((DEMO_DIR / "fleet.yaml").read_text())
    fleet = FleetFile.model_validate({**data, "project": PROJECT, "ssh_key_secret": "tpuq-ssh"})
    service_urls = {name: stack.env[f"TPUQ_{name.upper()}_URL"] for name in stack.services}
    target = Target(fleet=fleet, region="us-central1", service_urls=service_urls)
    infra = load_infra(target.variables())
    adapters = {name: RecordingApi(name) for name in gcp.BASE_URLS}
    adapters["crm"] = ProjectApi()
    adapters["secretmanager"] = SecretsHeld("tpuq-ssh", "tpuq-ssh-public")  # the executor's key exists: it deploys
    adapters["firestore"] = FirestoreAdminStandIn()
    adapters["pubsub"] = EmulatorWithoutIam(gcp.emulator_pubsub(host))
    adapters["fleetstore"] = gcp.FirestoreFleetStore(PROJECT, firestore.Client(project=PROJECT,
                                                                               credentials=AnonymousCredentials()))
    yield target, infra, adapters, f"http://{host}/v1/projects/{PROJECT}"
    requests.post(f"http://{host}/reset", timeout=10)
    stack.reset()


def deploy(target, infra, adapters):
    state, _ = gcp.read_state(adapters, target, infra)
    actions = plan(target, infra, state)
    gcp.apply(actions, adapters, echo=lambda line: None)
    return actions


def emulator_subscriptions(base: str) -> dict[str, dict]:
    subs = requests.get(f"{base}/subscriptions", timeout=10).json().get("subscriptions", [])
    return {s["name"].rsplit("/", 1)[-1]: s for s in subs}


def test_deploy_creates_topics_and_subscriptions_exactly_as_infra_declares(deployment):
    target, infra, adapters, base = deployment
    deploy(target, infra, adapters)

    topics = {t["name"].rsplit("/", 1)[-1] for t in requests.get(f"{base}/topics", timeout=10).json()["topics"]}
    assert topics == {t.name for t in infra.pubsub.topics}
    declared = yaml.safe_load((INFRA_DIR / "pubsub.yaml").read_text())
    subs = emulator_subscriptions(base)
    assert set(subs) == {s["name"] for s in declared["subscriptions"] + declared["hold_subscriptions"]}
    for spec in declared["subscriptions"]:
        got = subs[spec["name"]]
        url = target.service_urls[spec["service"]]
        assert got["topic"] == f"projects/{PROJECT}/topics/{spec['topic']}"
        assert got["ackDeadlineSeconds"] == spec["ack_deadline_seconds"]
        assert got["pushConfig"]["pushEndpoint"] == url + spec["path"]
        assert got["pushConfig"]["oidcToken"] == {"serviceAccountEmail": f"tpuq-push@{PROJECT}.iam.gserviceaccount.com",
                                                  "audience": url}
        assert got["deadLetterPolicy"] == {"deadLetterTopic": f"projects/{PROJECT}/topics/dead-letters",
                                           "maxDeliveryAttempts": spec["max_delivery_attempts"]}
        assert subscription_projection(got)["minimumBackoff"] == spec["min_backoff_seconds"]
        assert subscription_projection(got)["maximumBackoff"] == spec["max_backoff_seconds"]
    for name, got in subs.items():  # the emulator keeps the policy as sent: {} (never expires), no ttl
        assert got["expirationPolicy"] == {} and expiration_ttl(got) is None, name
    stored = adapters["fleetstore"].client.collection("fleets").document(target.fleet.name).get().to_dict()
    assert stored["version"] == target.fleet.version


def test_the_local_stacks_subscriptions_never_expire(stack):
    """The stack declares its push subscriptions with deploy's own desired_subscription; the emulator takes the policy."""
    stack.reset()
    host = stack.env["PUBSUB_EMULATOR_HOST"]
    subs = emulator_subscriptions(f"http://{host}/v1/projects/{stack.project}")
    assert subs and {name: sub.get("expirationPolicy") for name, sub in subs.items()} == {name: {} for name in subs}


def test_a_second_deploy_changes_nothing_in_pubsub_or_firestore(deployment):
    target, infra, adapters, _ = deployment
    deploy(target, infra, adapters)
    again = deploy(target, infra, adapters)
    assert [str(a) for a in again if a.request and a.request.api in ("pubsub", "fleetstore")] == []


def test_a_subscription_changed_by_hand_is_put_back(deployment):
    target, infra, adapters, base = deployment
    deploy(target, infra, adapters)
    r = requests.patch(f"{base}/subscriptions/executor-assignments", timeout=10,
                       json={"subscription": {"ackDeadlineSeconds": 30}, "updateMask": "ackDeadlineSeconds"})
    assert r.status_code == 200, r.text
    actions = deploy(target, infra, adapters)
    assert [f"{a.verb} {a.what}" for a in actions if a.request and a.request.api == "pubsub"] == [
        "update subscription executor-assignments"]
    declared = next(s for s in topology.SUBSCRIPTIONS if s.name == "executor-assignments").ack_deadline_seconds
    assert emulator_subscriptions(base)["executor-assignments"]["ackDeadlineSeconds"] == declared


def test_a_tick_subscription_of_an_older_deploy_is_moved_to_its_routed_topic(deployment):
    """Before the janitor routed the minute's tick (`tpuq.runtime.tickdue`), every service's tick subscription was
    on `ticks`. A subscription cannot change topic: deploy deletes its own and creates it on the new one; one it did
    not create (no tpuq labels) is left for its owner, with the command."""
    target, infra, adapters, base = deployment
    deploy(target, infra, adapters)
    for name in ("scheduler-ticks", "executor-ticks"):
        body = emulator_subscriptions(base)[name]
        assert requests.delete(f"{base}/subscriptions/{name}", timeout=10).status_code == 200
        old = {**body, "topic": f"projects/{PROJECT}/topics/ticks"}
        if name == "executor-ticks":
            old.pop("labels", None)  # someone else's
        old.pop("name", None)
        assert requests.put(f"{base}/subscriptions/{name}", json=old, timeout=10).status_code == 200, name
    actions = deploy(target, infra, adapters)
    moved = [f"{a.verb} {a.what}" for a in actions if "ticks" in a.what]
    assert moved == ["delete subscription scheduler-ticks", "create subscription scheduler-ticks",
                     "todo subscription executor-ticks"]
    subs = emulator_subscriptions(base)
    assert subs["scheduler-ticks"]["topic"] == f"projects/{PROJECT}/topics/ticks-scheduler"
    assert subs["executor-ticks"]["topic"] == f"projects/{PROJECT}/topics/ticks"  # not ours: untouched


def test_the_runner_bucket_s_subscriptions_of_an_older_deploy_are_replaced_to_take_their_filter(deployment):
    """Before each took only its own prefix, both subscriptions of the runner bucket's notifications took every
    object. A filter is fixed at creation (the emulator refuses to update one, as Pub/Sub does): deploy deletes its
    own and creates it with the filter; one it did not create is left for its owner, with the command; a second
    deploy finds nothing to do."""
    target, infra, adapters, base = deployment
    deploy(target, infra, adapters)
    for name in ("scheduler-gcs-submit", "executor-gcs-status"):
        body = emulator_subscriptions(base)[name]
        assert body["filter"] == next(s.filter for s in topology.SUBSCRIPTIONS if s.name == name)
        assert requests.delete(f"{base}/subscriptions/{name}", timeout=10).status_code == 200
        old = {k: v for k, v in body.items() if k not in ("name", "filter")}
        if name == "executor-gcs-status":
            old.pop("labels", None)  # someone else's
        assert requests.put(f"{base}/subscriptions/{name}", json=old, timeout=10).status_code == 200, name
    actions = deploy(target, infra, adapters)
    replaced = [f"{a.verb} {a.what}" for a in actions if "gcs-" in a.what]
    assert replaced == ["delete subscription scheduler-gcs-submit", "create subscription scheduler-gcs-submit",
                        "todo subscription executor-gcs-status"], [str(a) for a in actions]
    subs = emulator_subscriptions(base)
    assert subs["scheduler-gcs-submit"]["filter"] == 'hasPrefix(attributes.objectId, "submit/")'
    assert not subs["executor-gcs-status"].get("filter")  # not ours: untouched
    assert [a for a in deploy(target, infra, adapters) if "gcs-submit" in a.what] == []

def test_what_the_stand_ins_received_never_touches_the_network(deployment):
    target, infra, adapters, _ = deployment
    deploy(target, infra, adapters)
    assert adapters["compute"].sent == []
    created = {r.params["serviceId"] for r in adapters["run"].sent if r.method == "POST" and r.params}
    assert created == {s.run_service for s in infra.services.services}
    notifications = [r.body["object_name_prefix"] for r in adapters["storage"].sent if r.path.endswith("notificationConfigs")]
    assert notifications == ["submit/", "tpuq/status/"]


def test_undeploy_removes_tpuqs_topics_and_subscriptions_and_nothing_else(deployment):
    target, infra, adapters, base = deployment
    deploy(target, infra, adapters)
    # someone else's topic and subscription, and their subscription on tpuq's jobs topic
    for path, body in (("topics/billing-events", {}),
                       ("subscriptions/billing-audit", {"topic": f"projects/{PROJECT}/topics/billing-events"}),
                       ("subscriptions/jobs-audit", {"topic": f"projects/{PROJECT}/topics/jobs"})):
        assert requests.put(f"{base}/{path}", json=body, timeout=10).status_code == 200
    state, _ = gcp.read_state(adapters, target, infra)
    gcp.apply(undeploy_plan(target, infra, state), adapters, echo=lambda line: None, sleep=lambda s: None)

    topics = {t["name"].rsplit("/", 1)[-1] for t in requests.get(f"{base}/topics", timeout=10).json().get("topics", [])}
    assert topics == {"billing-events", "jobs"}  # jobs stays: jobs-audit still reads from it
    assert set(emulator_subscriptions(base)) == {"billing-audit", "jobs-audit"}
    assert emulator_subscriptions(base)["jobs-audit"]["topic"] == f"projects/{PROJECT}/topics/jobs"
    # run twice: nothing left of tpuq's to remove
    state, _ = gcp.read_state(adapters, target, infra)
    assert [a for a in undeploy_plan(target, infra, state) if a.sends and a.request and a.request.api == "pubsub"] == []
