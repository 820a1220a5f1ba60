"""Nothing deploy creates silently expires, and what Google deletes on a timer is what docs/ARCHITECTURE.md says.

Each test pins one line of "What expires, and when" where the timer is deploy's (or the claimer's) setting.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone

import pytest
import yaml

from tpuq.contracts import gcslayout, topology
from tpuq.deploy import gcp
from tpuq.deploy.infra import INFRA_DIR, load_infra
from tpuq.deploy.plan import ProjectState, Target, plan
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile

from . import discovery
from .fakes import state_after
from .test_dry_run import tpuq

FLEET = FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh",
                                  "job_buckets": ["gs://team-data-eu"]})
TARGET = Target(fleet=FLEET, project_number="42")
INFRA = load_infra(TARGET.variables())
SECRETS = {"tpuq-ssh", "tpuq-ssh-public"}
DEFAULT_TTL = "2678400s"  # 31 days: what Pub/Sub gives a subscription created without expirationPolicy


def first_plan():
    return plan(TARGET, INFRA, ProjectState(secrets=SECRETS))


def requests_of(actions) -> list[dict]:
    return [line for a in actions for line in gcp.wire_requests(a)]


def subscription_puts(lines: list[dict]) -> dict[str, dict]:
    return {line["url"].rsplit("/", 1)[-1]: line["body"] for line in lines
            if line["method"] == "PUT" and "/subscriptions/" in line["url"]}


# ------------------------------------------------------------ subscriptions
@pytest.fixture(scope="module")
def dry_run_json(tmp_path_factory) -> list[dict]:
    tmp_path = tmp_path_factory.mktemp("expiry")
    assert tpuq(["init", "."], tmp_path).returncode == 0
    r = tpuq(["deploy", "fleet.yaml", "--dry-run", "--offline", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_every_subscription_deploy_creates_never_expires(dry_run_json):
    subs = subscription_puts(dry_run_json)
    declared = {s.name for s in topology.SUBSCRIPTIONS} | {h.name for h in INFRA.pubsub.hold_subscriptions}
    assert set(subs) == declared
    # {} with no ttl: never expires (pubsub v1 Subscription.expirationPolicy); left out it would be 31 days
    assert {name: body.get("expirationPolicy") for name, body in subs.items()} == {name: {} for name in declared}


@pytest.mark.parametrize("read_back", [{"expirationPolicy": {"ttl": DEFAULT_TTL}}, {}],
                         ids=["pubsub-default-ttl", "emulator-without-the-field"])
def test_a_subscription_that_would_expire_is_updated_to_never_expire(read_back):
    state = state_after(first_plan())
    for name in ("scheduler-cancels", "dead-letters-hold"):
        state.subscriptions[name].pop("expirationPolicy")
        state.subscriptions[name].update(copy.deepcopy(read_back))
    actions = plan(TARGET, INFRA, state)
    updates = {a.what: a.request.body for a in actions if a.sends}
    assert set(updates) == {"subscription scheduler-cancels", "subscription dead-letters-hold"}
    for body in updates.values():
        assert "expirationPolicy" in body["updateMask"].split(",")
        assert body["subscription"]["expirationPolicy"] == {}
    assert updates["subscription dead-letters-hold"]["updateMask"] == "expirationPolicy"  # the retention is right
    assert [p for line in requests_of(actions) for p in discovery.check(line)] == []
    again = plan(TARGET, INFRA, state_after(actions, start=state))
    assert [str(a) for a in again if a.sends and "subscription" in a.what] == []


def test_an_update_for_another_field_does_not_name_expiration_policy():
    """The emulator refuses an update whose mask names expirationPolicy, so it is named only when it differs."""
    state = state_after(first_plan())
    state.subscriptions["executor-assignments"]["ackDeadlineSeconds"] = 30
    (update,) = [a for a in plan(TARGET, INFRA, state) if a.sends]
    assert update.request.body["updateMask"] == "ackDeadlineSeconds,pushConfig,retryPolicy,deadLetterPolicy"


def test_message_retention_is_pubsubs_default_except_on_the_hold_subscription():
    lines = requests_of(first_plan())
    topics = [line["body"] for line in lines if line["method"] == "PUT" and "/topics/" in line["url"]]
    assert topics and not any("messageRetentionDuration" in t for t in topics)  # a topic keeps nothing itself
    subs = subscription_puts(lines)
    for sub in topology.SUBSCRIPTIONS:  # unacked messages are dropped after Pub/Sub's default 7 days
        assert "messageRetentionDuration" not in subs[sub.name] and "retainAckedMessages" not in subs[sub.name]
    assert subs["dead-letters-hold"]["messageRetentionDuration"] == "604800s"


# -------------------------------------------------------------------- buckets
def lifecycle_deletes(rules: list[dict], name: str) -> bool:
    """Whether a Delete rule selects this object name, as Cloud Storage matches (storage v1 discovery,
    lifecycle.rule.condition): any of matchesPrefix AND any of matchesSuffix, literal strings, no wildcards."""
    for rule in rules:
        c = rule["condition"]
        if rule["action"]["type"] == "Delete" and \
                any(name.startswith(p) for p in c.get("matchesPrefix", [""])) and \
                any(name.endswith(s) for s in c.get("matchesSuffix", [""])):
            return True
    return False


def runner_lifecycle() -> list[dict]:
    (create,) = [line for line in requests_of(first_plan()) if line["method"] == "POST" and line["url"].endswith("/b")]
    return create["body"]["lifecycle"]["rule"]


def test_the_runner_bucket_deletes_log_chunks_and_status_objects_after_30_days_and_nothing_tpuq_still_needs():
    rules = runner_lifecycle()
    assert {r["condition"]["age"] for r in rules} == {30}
    assert lifecycle_deletes(rules, gcslayout.log_chunk_name("job-1", 2, 0, 7))
    assert lifecycle_deletes(rules, gcslayout.worker_status_name("job-1", 2, 0))
    assert lifecycle_deletes(rules, gcslayout.cancelled_marker_name("job-1", 2))
    # a pending job may wait longer than 30 days for its bundle; an upload's result is the user's answer
    for kept in ("tpuq/bundles/" + "0" * 64 + ".tar.gz", "submit/train.yaml", "submit/train.yaml.result.json"):
        assert not lifecycle_deletes(rules, kept), kept


def test_job_buckets_get_no_lifecycle_rule_from_deploy():
    """Job buckets keep their logs: deploy only merges its grants into their IAM policies (docs/ARCHITECTURE.md)."""
    touching = [line for line in requests_of(first_plan()) if "/b/team-data-eu" in line["url"]]
    assert touching and all(line["url"].endswith("/b/team-data-eu/iam") for line in touching)


def test_why_no_rule_can_expire_a_job_buckets_logs_only():
    """Log chunks sit inside the attempt directory the job writes to, beside its checkpoints; a lifecycle condition
    has no wildcard for the job and attempt, so the narrowest rule that selects the chunks (the runner bucket's)
    also selects a job's own text files. When the layout gives logs a prefix of their own, this fails: then a
    prefix-scoped rule on job buckets becomes possible."""
    rules = runner_lifecycle()
    chunk = gcslayout.log_chunk_name("job-1", 1, 0, 0)
    users_files = (gcslayout.checkpoint_prefix("job-1") + "/step-100/notes.txt",
                   gcslayout.attempt_prefix("job-1", 1) + "/metrics.txt")
    assert lifecycle_deletes(rules, chunk)
    assert all(lifecycle_deletes(rules, name) for name in users_files)


# --------------------------------------------- the tick, secrets, Firestore, images
def test_the_tick_job_publishes_to_pubsub_and_carries_no_token_to_expire():
    (job,) = [line["body"] for line in requests_of(first_plan()) if line["url"].startswith(gcp.BASE_URLS["scheduler"])]
    assert set(job) == {"name", "description", "schedule", "timeZone", "pubsubTarget"}
    assert "oidcToken" not in json.dumps(job) and "attemptDeadline" not in job


def test_deploy_sets_no_expiry_on_secrets_firestore_documents_or_images():
    lines = requests_of(first_plan())
    secret_writes = [line for line in lines if line["url"].startswith(gcp.BASE_URLS["secretmanager"])
                     and not line["url"].endswith("IamPolicy")]
    # the one secret deploy makes, the dashboard's session key, and its version: neither expireTime nor ttl
    assert [line["url"].rsplit("/", 1)[1] for line in secret_writes] == ["secrets", "tpuq-ui-session-key:addVersion"]
    assert not [line for line in secret_writes if {"expireTime", "ttl"} & set(line["body"] or {})]
    assert not [line for line in lines if "/fields/" in line["url"]]  # no Firestore TTL policy (fields.patch)
    assert "ttl" not in (INFRA_DIR / "firestore.yaml").read_text().lower()
    (repo,) = [line["body"] for line in lines if line["url"].startswith(gcp.BASE_URLS["artifactregistry"])]
    assert "cleanupPolicies" not in repo  # every image is kept


# --------------------------------------------------------------- queued resources
@pytest.mark.parametrize("claim, seconds", [({}, 12 * 3600), ({"valid_until_seconds": 7200}, 7200)])
def test_a_queued_resource_is_valid_for_the_fleets_claim_setting(claim, seconds):
    from tpuq.claimer.model import QrRecord
    from tpuq.claimer.tpuapi import build_queued_resource

    fleet = FleetFile.model_validate({"name": "f", "project": "p", "claim": claim,
                                      "tpus": [{"id": "small", "type": "v4-8", "zones": ["us-central2-b"]}]})
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    qr = QrRecord(qr_id="tpuq-r-1-us-central2-b", fleet="f", project="p", request_id="r-1", entry_id="small",
                  zone="us-central2-b", type="v4-8", spot=True, generation=0, state="REQUESTED", created_at=now,
                  updated_at=now)
    resource = build_queued_resource(qr, fleet, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample")
    assert resource.queueing_policy.valid_until_duration.total_seconds() == seconds
