"""infra/ agrees with the code it deploys: topology, object prefixes, messages, indexes."""

from __future__ import annotations

import shutil

import pytest
import yaml

from tpuq.contracts import topology
from tpuq.deploy import infra as infra_mod
from tpuq.deploy.infra import INFRA_DIR, InfraError, load_infra, topology_drift
from tpuq.deploy.plan import Target
from tpuq.scheduler import gcs_submit
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts import gcslayout
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.messages import Tick

FLEET = FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh",
                                  "worker_secrets": ["wandb-key", "hf-token"]})


@pytest.fixture
def infra():
    return load_infra(Target(fleet=FLEET).variables())


def test_pubsub_yaml_is_what_topology_generates():
    assert topology_drift(yaml.safe_load((INFRA_DIR / "pubsub.yaml").read_text())) == []
    assert (INFRA_DIR / "pubsub.yaml").read_text() == infra_mod.render_pubsub_text()


def test_a_drifted_pubsub_yaml_is_refused(tmp_path):
    shutil.copytree(INFRA_DIR, tmp_path / "infra")
    path = tmp_path / "infra" / "pubsub.yaml"
    data = yaml.safe_load(path.read_text())
    data["subscriptions"][0]["ack_deadline_seconds"] = 11
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InfraError, match="scheduler-jobs differs in ack_deadline_seconds"):
        load_infra(Target(fleet=FLEET).variables(), tmp_path / "infra")


def test_notifications_use_the_prefixes_the_code_watches(infra):
    prefixes = {n.object_name_prefix for n in infra.storage.notifications}
    assert prefixes == {gcs_submit.SUBMIT_PREFIX, gcslayout.STATUS_NOTIFICATION_PREFIX}
    assert {n.topic for n in infra.storage.notifications} == {"gcs-events"}


def test_the_log_lifecycle_rule_selects_log_chunks_only_under_tpuq_jobs(infra):
    rule = infra.storage.buckets[0].lifecycle[0]
    log_chunk = gcslayout.log_chunk_name("job-1", 3, 0, 7)
    status = gcslayout.status_prefix("job-1", 3) + "worker-0.json"

    def matches(name: str) -> bool:
        return any(name.startswith(p) for p in rule.matches_prefix) and any(name.endswith(s) for s in rule.matches_suffix)

    assert matches(log_chunk) and rule.age_days == 30 and rule.action == "Delete"
    assert not matches(status) and not matches(gcslayout.WORKER_SUPERVISOR) and not matches("submit/job.yaml")


def test_the_tick_job_publishes_a_valid_tick_to_the_ticks_topic(infra):
    (job,) = infra.scheduler.jobs
    Tick.model_validate(job.data)
    assert topology.topic(job.topic).model is Tick


def test_every_service_has_its_own_account_and_the_push_account_may_invoke_it(infra):
    accounts = {sa.id for sa in infra.iam.service_accounts}
    invoked = {b.resource.split(":", 1)[1] for b in infra.iam.bindings
               if b.member == "sa:tpuq-push" and b.role == "roles/run.invoker"}
    for service in infra.services.services:
        assert service.service_account in accounts
        assert service.service_account == f"tpuq-{service.name}"
    assert invoked == set(topology.SERVICES)
    push_roles = {b.role for b in infra.iam.bindings if b.member == "sa:tpuq-push"}
    assert push_roles == {"roles/run.invoker"}  # nothing else


def test_secret_bindings_follow_the_fleet(infra):
    secrets = sorted((b.member, b.resource) for b in infra.iam.bindings if b.resource.startswith("secret:"))
    assert secrets == [("sa:tpuq-claimer", "secret:tpuq-ssh-public"), ("sa:tpuq-executor", "secret:tpuq-ssh"),
                       ("sa:tpuq-ui", "secret:tpuq-ui-session-key"),  # the one deploy makes, whatever the fleet
                       ("sa:tpuq-worker", "secret:hf-token"), ("sa:tpuq-worker", "secret:wandb-key")]
    keyless = {k: v for k, v in yaml.safe_load(EXAMPLE_FLEET).items() if k != "ssh_key_secret"}
    bare = load_infra(Target(fleet=FleetFile.model_validate(keyless)).variables())
    assert [b.resource for b in bare.iam.bindings if b.resource.startswith("secret:")] == ["secret:tpuq-ui-session-key"]
    assert bare.services.service("executor").secret_files == []


def test_firestore_indexes_come_from_the_shared_indexes_file(infra):
    assert infra.firestore.indexes_file == "firestore.indexes.json"
    assert infra.firestore.indexes and all(i["collectionGroup"] for i in infra.firestore.indexes)


def test_the_claimers_written_since_queries_have_their_composite_indexes(infra):
    """`fleet == f and written_at > t` (the claimer's views, `tpuq.claimer.statestore.FleetViews`) needs a composite
    index in Firestore, which neither stand-in asks for (the emulator serves any query): declared here, or
    production's views fall back to reading everything (`tpuq.runtime.deltaread`)."""
    from tpuq.contracts import store
    from tpuq.runtime.deltaread import WRITTEN_AT

    declared = {(i["collectionGroup"], tuple(f["fieldPath"] for f in i["fields"])) for i in infra.firestore.indexes}
    for collection in (store.QUEUED_RESOURCES, store.ZONES):
        assert (collection, ("fleet", WRITTEN_AT)) in declared, collection
