"""plan() is pure and idempotent; apply() merges roles without losing any and never changes the network."""

from __future__ import annotations

import pytest
import yaml

from tpuq.deploy import gcp
from tpuq.deploy.infra import load_infra
from tpuq.deploy.model import Action, NetworkFacts, ProjectState, Target, VpcFacts
from tpuq.deploy.plan import plan
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile

from .fakes import state_after

FLEET = FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh"})
TARGET = Target(fleet=FLEET, project_number="42")
INFRA = load_infra(TARGET.variables())
DEFAULT_ALLOW_SSH = {"name": "default-allow-ssh", "network": "projects/p/global/networks/default",
                     "direction": "INGRESS", "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
                     "sourceRanges": ["0.0.0.0/0"]}


SECRETS = {"tpuq-ssh", "tpuq-ssh-public"}


def test_planning_again_after_applying_changes_nothing():
    first = plan(TARGET, INFRA, ProjectState(secrets=SECRETS))
    state = state_after(first)
    state.networks = {"europe-west4": NetworkFacts(True, True), "us-east1": NetworkFacts(True, True)}
    default_subnet = {"name": "default", "network": "projects/p/global/networks/default", "ipCidrRange": "10.128.0.0/20"}
    state.vpc = VpcFacts(firewalls=[DEFAULT_ALLOW_SSH], region_subnets=dict.fromkeys(FLEET.node_regions, default_subnet))
    again = plan(TARGET, INFRA, state)
    assert [str(a) for a in again if a.sends] == []
    # ssh_transport direct: every node has external IPs (no NAT needed); the firewall was read and admits ssh, and
    # each region the fleet creates TPUs in has its subnet
    assert [a.verb for a in again] == ["check"] * (1 + len(FLEET.node_regions))


def test_a_new_image_tag_updates_the_services_only():
    state = state_after(plan(TARGET, INFRA, ProjectState(secrets=SECRETS)))
    from dataclasses import replace

    retagged = replace(TARGET, image_tag="b42")
    again = plan(retagged, load_infra(retagged.variables()), state)
    assert sorted(f"{a.verb} {a.what}" for a in again if a.sends) == [
        f"update Cloud Run service tpuq-{name}" for name in sorted(("claimer", "executor", "janitor", "scheduler", "ui"))]


def test_the_plan_never_writes_to_the_network_api():
    assert not [a for a in plan(TARGET, INFRA, ProjectState()) if a.request and a.request.api == "compute"]


def test_the_compute_adapter_refuses_writes():
    api = gcp.RestApi("compute", gcp.BASE_URLS["compute"], session=None)
    with pytest.raises(gcp.NetworkChangeRefused):
        api.call("PATCH", "projects/p/regions/r/subnetworks/default", body={"privateIpGoogleAccess": True})


def test_only_the_missing_network_setting_is_asked_for():
    state = ProjectState(known=True, project_number="42",
                         networks={"europe-west4": NetworkFacts(private_google_access=True, cloud_nat=False)})
    vpc = Target(fleet=FleetFile.model_validate({**FLEET.model_dump(), "ssh_transport": "vpc"}), project_number="42")
    (todo,) = [a for a in plan(vpc, INFRA, state) if a.verb == "todo" and a.what == "network default in europe-west4"]
    assert "Cloud NAT missing" in todo.detail and "Private Google Access" not in todo.detail.split(";")[0]
    assert not any("subnets update" in c for c in todo.commands)
    assert any("routers nats create" in c for c in todo.commands)


class PolicyApi:
    """An IAM policy endpoint: get returns the stored policy; set replaces it."""

    def __init__(self, policy: dict):
        self.policy = policy
        self.sets = 0

    def send(self, request):
        if request.path.endswith(":getIamPolicy"):
            return yaml.safe_load(yaml.safe_dump(self.policy))  # a copy, as over the wire
        self.sets += 1
        self.policy = request.body["policy"]
        return self.policy


def test_a_grant_adds_one_member_and_keeps_every_other_binding():
    existing = {"etag": "abc", "bindings": [{"role": "roles/owner", "members": ["user:boss@example.com"]},
                                            {"role": "roles/tpu.admin", "members": ["user:me@example.com"]}]}
    api = PolicyApi(existing)
    grant = next(a for a in plan(TARGET, INFRA, ProjectState()) if a.role == "roles/tpu.admin")
    gcp.apply([grant], {grant.iam.api: api}, echo=lambda line: None)
    assert api.policy["etag"] == "abc"  # sent back, so a concurrent change fails instead of being overwritten
    assert api.policy["bindings"] == [
        {"role": "roles/owner", "members": ["user:boss@example.com"]},
        {"role": "roles/tpu.admin", "members": ["user:me@example.com", grant.member]}]
    gcp.apply([grant], {grant.iam.api: api}, echo=lambda line: None)
    assert api.sets == 1  # already there: nothing is written
