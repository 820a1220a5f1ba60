"""Deploy's side of reaching the workers: the executor's VPC egress, and the read-only checks of the subnet,
the firewall, OS Login and the organisation policies (tpuq.deploy.network), planned from an in-memory state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tpuq.deploy import gcp, network
from tpuq.deploy.infra import INFRA_DIR, load_infra
from tpuq.deploy.model import ProjectState, Target, VpcFacts
from tpuq.deploy.plan import desired_run_service, plan, run_projection
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile
from tpuq.capacity.subnets import example_subnet_range

BASE = {**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh", "owner_prefix": "rq"}


def target(region: str = "us-central1", **fleet) -> Target:
    return Target(fleet=FleetFile.model_validate({**BASE, **fleet}), region=region, project_number="42")


def plan_for(t: Target, vpc: VpcFacts) -> list:
    return plan(t, load_infra(t.variables()), ProjectState(known=True, project_number="42", vpc=vpc))


def about(actions, what: str):
    (found,) = [a for a in actions if a.what.startswith(what)]
    return found


SUBNET = {"name": "tpu-subnet", "network": "https://www.googleapis.com/compute/v1/projects/p/global/networks/tpu-net",
          "ipCidrRange": "10.20.0.0/24", "region": "us-central1"}


def rule(**fields) -> dict:
    return {"name": "r", "network": "projects/p/global/networks/tpu-net", "direction": "INGRESS",
            "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}], **fields}


VPC = {"ssh_transport": "vpc", "network": "tpu-net", "subnetwork": "tpu-subnet"}


# ------------------------------------------------------------ the executor's Cloud Run service
@pytest.mark.parametrize("transport", ["vpc", "iap"])
def test_the_executor_gets_direct_vpc_egress_on_the_fleets_network(transport):
    t = target(**{**VPC, "ssh_transport": transport})
    infra = load_infra(t.variables())
    template = desired_run_service(t, infra, "executor")["template"]
    assert template["vpcAccess"] == {
        "networkInterfaces": [{"network": "tpu-net", "subnetwork": "tpu-subnet", "tags": ["rq-executor"]}],
        "egress": "PRIVATE_RANGES_ONLY"}
    for other in ("scheduler", "claimer", "janitor"):
        assert "vpcAccess" not in desired_run_service(t, infra, other)["template"]


def test_direct_gives_the_executor_no_vpc_egress():
    t = target(ssh_transport="direct")
    assert "vpcAccess" not in desired_run_service(t, load_infra(t.variables()), "executor")["template"]


def test_a_service_without_the_egress_is_updated_and_one_read_back_with_full_names_is_not():
    t = target(**VPC)
    body = desired_run_service(t, load_infra(t.variables()), "executor")
    bare = json.loads(json.dumps(body))
    del bare["template"]["vpcAccess"]
    assert run_projection(bare) != run_projection(body)
    read_back = json.loads(json.dumps(body))
    read_back["template"]["vpcAccess"]["networkInterfaces"][0].update(
        network="projects/p/global/networks/tpu-net", subnetwork="projects/p/regions/us-central1/subnetworks/tpu-subnet")
    assert run_projection(read_back) == run_projection(body)


def test_the_vpc_access_body_has_only_fields_and_values_run_v2_defines():
    discovery = pytest.importorskip("googleapiclient.discovery_cache")
    doc = json.loads((Path(discovery.__file__).parent / "documents" / "run.v2.json").read_text())
    schemas = doc["schemas"]
    template = schemas["GoogleCloudRunV2RevisionTemplate"]["properties"]
    assert template["vpcAccess"]["$ref"] == "GoogleCloudRunV2VpcAccess"
    access = network.executor_vpc_access(target(**VPC).fleet)
    vpc_schema = schemas["GoogleCloudRunV2VpcAccess"]["properties"]
    assert set(access) <= set(vpc_schema) and access["egress"] in vpc_schema["egress"]["enum"]
    interface = schemas["GoogleCloudRunV2NetworkInterface"]["properties"]
    assert set(access["networkInterfaces"][0]) <= set(interface)


# ------------------------------------------------------------ the subnet in the services' region and the TPUs'
def test_a_missing_subnet_in_the_services_region_is_for_the_owner_to_create():
    todo = about(plan_for(target("europe-west1", **VPC), VpcFacts(subnet_missing=True, firewalls=[])),
                 "subnet tpu-subnet in europe-west1")
    assert todo.verb == "todo" and "services' region (europe-west1" in todo.detail
    assert todo.commands == ("gcloud compute networks subnets create tpu-subnet --network=tpu-net --region=europe-west1 "
                             f"--range={example_subnet_range('europe-west1')} --project=my-trc-project",)


def test_a_subnet_of_another_network_is_a_todo_and_the_right_one_a_check():
    other = {**SUBNET, "network": "projects/p/global/networks/default"}
    assert about(plan_for(target(**VPC), VpcFacts(subnet=other)), "subnet tpu-subnet in us-central1").verb == "todo"
    assert about(plan_for(target(**VPC), VpcFacts(subnet=SUBNET)), "subnet tpu-subnet in us-central1").verb == "check"


def compute_subnetwork(region: str, name: str = "tpu-subnet", net: str = "tpu-net", cidr: str = "10.20.0.0/20") -> dict:
    """A compute v1 Subnetwork as `subnetworks.get` returns it (the discovery document's output fields)."""
    base = "https://www.googleapis.com/compute/v1/projects/my-trc-project"
    return {"kind": "compute#subnetwork", "id": "5129349785340920316", "creationTimestamp": "2026-11-02T03:04:05.678-07:00",
            "name": name, "network": f"{base}/global/networks/{net}", "ipCidrRange": cidr,
            "gatewayAddress": cidr.split("/")[0][:-1] + "1", "region": f"{base}/regions/{region}",
            "selfLink": f"{base}/regions/{region}/subnetworks/{name}", "privateIpGoogleAccess": False,
            "fingerprint": "hMkXPh4fS8g=", "stackType": "IPV4_ONLY", "purpose": "PRIVATE", "state": "READY"}


def test_every_region_the_fleet_creates_tpus_in_needs_the_subnet_and_a_missing_one_gets_its_command():
    """The example fleet creates nodes in us-central2, europe-west4 and us-east1; the services run in us-central1.
    A custom-mode network whose subnet exists only in the services' region and us-central2 leaves two todos, each
    naming its region, the entries that need it and the owner's command with a range of its own."""
    t = target(**VPC)
    compute = ReadOnlyProject("compute", {
        f"projects/my-trc-project/regions/{r}/subnetworks/tpu-subnet": compute_subnetwork(r, cidr=f"10.{i}.0.0/20")
        for i, r in enumerate(("us-central1", "us-central2"))})
    facts = network.read_vpc_facts({"compute": compute, "crm": ReadOnlyProject("crm", {})}, t,
                                   lambda read, what: gcp._tolerant(read, None, [], what))
    subnet_reads = [path for _, path, _ in compute.calls if "/subnetworks/" in path]
    assert subnet_reads == [f"projects/my-trc-project/regions/{r}/subnetworks/tpu-subnet"
                            for r in ("us-central1", "us-central2", "europe-west4", "us-east1")]
    assert set(facts.region_subnets) == {"us-central2", "europe-west4", "us-east1"}
    actions = {a.what: a for a in plan_for(t, facts) if a.what.startswith("subnet ")}
    assert {w: a.verb for w, a in actions.items()} == {
        "subnet tpu-subnet in us-central1": "check", "subnet tpu-subnet in us-central2": "check",
        "subnet tpu-subnet in europe-west4": "todo", "subnet tpu-subnet in us-east1": "todo"}
    assert "the TPU nodes of tpus v4-spot" in actions["subnet tpu-subnet in us-central2"].detail
    missing = actions["subnet tpu-subnet in europe-west4"]
    assert missing.detail.startswith("does not exist: tpus ") and "europe-west4" in missing.detail
    assert "subnets are regional" in missing.detail
    assert missing.commands == ("gcloud compute networks subnets create tpu-subnet --network=tpu-net "
                                f"--region=europe-west4 --range={example_subnet_range('europe-west4')} "
                                "--project=my-trc-project",)
    assert example_subnet_range("europe-west4") != example_subnet_range("us-east1")
    assert {m for m, _, _ in compute.calls} == {"GET"}


def test_a_tpu_region_subnet_of_another_network_or_unreadable_is_a_todo():
    t = target(**VPC)
    other = {**compute_subnetwork("us-central2"), "network": "https://www.googleapis.com/compute/v1/projects/"
             "my-trc-project/global/networks/default"}
    actions = {a.what: a for a in plan_for(t, VpcFacts(subnet=SUBNET, region_subnets={"us-central2": other}))}
    assert actions["subnet tpu-subnet in us-central2"].detail.startswith("belongs to network default")
    unread = actions["subnet tpu-subnet in us-east1"]
    assert unread.verb == "todo" and unread.detail.startswith("could not be checked")


def test_direct_needs_no_subnet_in_the_services_region_but_one_in_every_tpu_region():
    t = target(ssh_transport="direct")
    found = {r: compute_subnetwork(r, name="default", net="default") for r in ("us-central2", "europe-west4", "us-east1")}
    subnets = {a.what: a.verb for a in plan_for(t, VpcFacts(region_subnets=found)) if a.what.startswith("subnet")}
    assert subnets == {f"subnet default in {r}": "check" for r in found}  # us-central1 (the services') not asked


# ------------------------------------------------------------ the firewall
@pytest.mark.parametrize("admitting", [
    rule(sourceTags=["rq-executor"], targetTags=["rq-worker"]),
    rule(sourceRanges=["10.0.0.0/8"]),  # covers the executor's subnet; no target: every instance
    rule(sourceRanges=["10.20.0.0/24"], allowed=[{"IPProtocol": "tcp", "ports": ["0-65535"]}]),
    rule(sourceTags=["rq-executor"], allowed=[{"IPProtocol": "all"}],
         targetServiceAccounts=["tpuq-worker@my-trc-project.iam.gserviceaccount.com"]),
])
def test_a_rule_admitting_ssh_from_the_executor_to_the_workers_is_a_check(admitting):
    check = about(plan_for(target(**VPC), VpcFacts(subnet=SUBNET, firewalls=[admitting])), "firewall")
    assert check.verb == "check" and "rq-executor" in check.detail


@pytest.mark.parametrize("useless", [
    rule(sourceTags=["rq-executor"], disabled=True),
    rule(sourceTags=["rq-executor"], direction="EGRESS"),
    rule(sourceTags=["rq-executor"], allowed=[{"IPProtocol": "tcp", "ports": ["80", "443"]}]),
    rule(sourceTags=["rq-executor"], allowed=[{"IPProtocol": "udp"}]),
    rule(sourceTags=["rq-executor"], network="projects/p/global/networks/default"),
    rule(sourceTags=["rq-executor"], targetTags=["web"]),
    rule(sourceTags=["someone-else"]),
    rule(sourceRanges=["192.168.0.0/16"]),
    rule(sourceRanges=["35.235.240.0/20"]),  # IAP's range: tpuq opens no tunnels
])
def test_without_an_admitting_rule_the_owner_gets_the_exact_command(useless):
    todo = about(plan_for(target(**VPC), VpcFacts(subnet=SUBNET, firewalls=[useless])), "firewall")
    assert todo.verb == "todo" and "FOR THE PROJECT OWNER TO RUN" in todo.detail
    assert todo.commands == ("gcloud compute firewall-rules create rq-allow-executor-ssh --network=tpu-net "
                             "--direction=INGRESS --action=ALLOW --rules=tcp:22 --source-tags=rq-executor "
                             "--target-tags=rq-worker --project=my-trc-project",)


def test_a_firewall_that_could_not_be_read_says_so_and_still_prints_the_command():
    todo = about(plan_for(target(**VPC), VpcFacts(subnet=SUBNET)), "firewall")
    assert "could not be checked" in todo.detail and "FOR THE PROJECT OWNER" not in todo.detail
    assert "--source-tags=rq-executor" in todo.commands[0]


def test_direct_needs_ssh_open_to_anywhere_because_cloud_runs_addresses_are_not_fixed():
    t = target(ssh_transport="direct")  # on the network "default"
    on_default = "projects/p/global/networks/default"
    assert about(plan_for(t, VpcFacts(firewalls=[rule(sourceTags=["rq-executor"], network=on_default)])),
                 "firewall").verb == "todo"
    todo = about(plan_for(t, VpcFacts(firewalls=[])), "firewall")
    assert "--source-ranges=0.0.0.0/0 --target-tags=rq-worker" in todo.commands[0]
    assert about(plan_for(t, VpcFacts(firewalls=[rule(sourceRanges=["0.0.0.0/0"], targetTags=["rq-worker"],
                                                      network=on_default)])),
                 "firewall").verb == "check"


# ------------------------------------------------------------ OS Login and organisation policies
def test_project_os_login_is_fine_for_the_nodes_tpuq_creates():
    actions = plan_for(target(**VPC), VpcFacts(project_metadata={"enable-oslogin": "TRUE"}))
    check = about(actions, "OS Login")
    assert check.verb == "check" and "enable-oslogin=FALSE" in check.detail
    assert not [a for a in actions if a.what.startswith("OS Login") and a.verb == "todo"]


def test_project_os_login_is_a_todo_for_existing_nodes():
    tpus = [{**BASE["tpus"][0], "existing": "my-node"}]
    actions = plan_for(target(**VPC, tpus=tpus), VpcFacts(project_metadata={"enable-oslogin": "true"}))
    assert about(actions, "OS Login on existing nodes").verb == "todo"


def test_an_enforced_require_os_login_policy_is_a_blocking_todo_with_the_way_out():
    todo = about(plan_for(target(**VPC), VpcFacts(require_os_login=True)), "OS Login")
    assert todo.verb == "todo" and todo.detail.startswith("BLOCKS EVERY JOB")
    assert todo.commands == ("gcloud resource-manager org-policies disable-enforce compute.requireOsLogin "
                             "--project=my-trc-project",)
    assert not [a for a in plan_for(target(**VPC), VpcFacts(require_os_login=False)) if a.what == "OS Login"]


def test_forbidden_external_ips_rule_out_direct():
    todo = about(plan_for(target(ssh_transport="direct"), VpcFacts(external_ips_forbidden=True)), "ssh_transport direct")
    assert todo.detail.startswith("BLOCKS EVERY JOB") and "ssh_transport: vpc" in todo.detail
    assert "worker_external_ips: false" in todo.detail


def test_forbidden_external_ips_under_vpc_ask_for_worker_external_ips_false():
    todo = about(plan_for(target(**VPC), VpcFacts(external_ips_forbidden=True)), "worker_external_ips")
    assert "v4-spot" in todo.detail and "v5e-spot" not in todo.detail  # 4 hosts get external IPs; 16 do not
    check = about(plan_for(target(**VPC, worker_external_ips=False), VpcFacts(external_ips_forbidden=True)),
                  "external IPs")
    assert check.verb == "check"


def test_without_external_ips_every_region_gets_the_nat_check():
    actions = plan_for(target(**VPC, worker_external_ips=False), VpcFacts())
    nat = {a.what for a in actions if a.what.startswith("network tpu-net in ")}
    assert nat == {"network tpu-net in us-central2", "network tpu-net in europe-west4", "network tpu-net in us-east1"}
    assert not [a for a in plan_for(target(ssh_transport="direct"), VpcFacts()) if a.what.startswith("network ")]


@pytest.mark.parametrize("policy, forbidden", [
    ({}, False), ({"listPolicy": {}}, False), ({"listPolicy": {"allValues": "ALLOW"}}, False),
    ({"listPolicy": {"allValues": "DENY"}}, True),
    ({"listPolicy": {"allowedValues": ["projects/p/zones/z/instances/bastion"]}}, True),
])
def test_vm_external_ip_access_is_read_as_an_allow_list(policy, forbidden):
    assert network.external_ips_forbidden(policy) is forbidden


# ------------------------------------------------------------ reading, read-only, 403 as a note
class ReadOnlyProject:
    """compute and crm as a project shows them; records every request; answers 403 where `forbidden` says."""

    def __init__(self, name: str, answers: dict, forbidden: tuple = ()):
        self.name, self.answers, self.forbidden, self.calls = name, answers, forbidden, []

    def call(self, method, path, params=None, body=None):
        self.calls.append((method, path, body))
        key = body["constraint"] if body and "constraint" in body else path
        if any(f in key for f in self.forbidden):
            raise gcp.ApiError(self.name, method, path, 403, "permission denied")
        if key not in self.answers:
            raise gcp.ApiError(self.name, method, path, 404, "not found")
        return self.answers[key]

    def get_or_none(self, path, params=None):
        try:
            return self.call("GET", path)
        except gcp.ApiError as e:
            if e.status == 404:
                return None
            raise

    def list_all(self, path, key, params=None):
        return self.call("GET", path).get(key, [])


def test_reading_sends_only_reads_and_a_403_becomes_a_note():
    t = target(**VPC)
    compute = ReadOnlyProject("compute", {
        "projects/my-trc-project/regions/us-central1/subnetworks/tpu-subnet": SUBNET,
        "projects/my-trc-project/global/firewalls": {"items": [rule(sourceTags=["rq-executor"])]},
        "projects/my-trc-project": {"commonInstanceMetadata": {"items": [{"key": "enable-oslogin", "value": "TRUE"}]}},
    })
    crm = ReadOnlyProject("crm", {network.REQUIRE_OS_LOGIN: {"booleanPolicy": {"enforced": True}}},
                          forbidden=(network.VM_EXTERNAL_IP_ACCESS,))
    notes: list[str] = []
    facts = network.read_vpc_facts({"compute": compute, "crm": crm}, t,
                                   lambda read, what: gcp._tolerant(read, None, notes, what))
    assert facts.subnet == SUBNET and facts.firewalls and facts.project_metadata == {"enable-oslogin": "TRUE"}
    assert facts.require_os_login is True and facts.external_ips_forbidden is None
    assert notes == [f"org policy {network.VM_EXTERNAL_IP_ACCESS}: read as empty (HTTP 403)"]
    assert {m for m, _, _ in compute.calls} == {"GET"}
    assert crm.calls == [("POST", "projects/my-trc-project:getEffectiveOrgPolicy", {"constraint": c})
                         for c in (network.REQUIRE_OS_LOGIN, network.VM_EXTERNAL_IP_ACCESS)]


def test_a_missing_subnet_reads_as_missing_and_an_unreadable_one_as_unknown():
    t = target(**VPC)
    crm = ReadOnlyProject("crm", {})

    def read(compute):
        return network.read_vpc_facts({"compute": compute, "crm": crm}, t,
                                      lambda r, what: gcp._tolerant(r, None, [], what))

    assert read(ReadOnlyProject("compute", {})).subnet_missing is True
    unknown = read(ReadOnlyProject("compute", {}, forbidden=("subnetworks",)))
    assert unknown.subnet is None and unknown.subnet_missing is False


def test_the_read_paths_are_compute_v1_and_crm_v1_methods():
    discovery = pytest.importorskip("googleapiclient.discovery_cache")
    docs = Path(discovery.__file__).parent / "documents"
    compute = json.loads((docs / "compute.v1.json").read_text())["resources"]
    assert compute["subnetworks"]["methods"]["get"]["path"] == "projects/{project}/regions/{region}/subnetworks/{subnetwork}"
    assert compute["firewalls"]["methods"]["list"]["path"] == "projects/{project}/global/firewalls"
    assert compute["projects"]["methods"]["get"]["path"] == "projects/{project}"
    crm = json.loads((docs / "cloudresourcemanager.v1.json").read_text())
    method = crm["resources"]["projects"]["methods"]["getEffectiveOrgPolicy"]
    assert (method["httpMethod"], method["path"]) == ("POST", "v1/{+resource}:getEffectiveOrgPolicy")
    assert set(crm["schemas"]["GetEffectiveOrgPolicyRequest"]["properties"]) == {"constraint"}


def test_the_executor_may_read_guest_attributes():
    iam = yaml.safe_load((INFRA_DIR / "iam.yaml").read_text())
    assert {"member": "sa:tpuq-executor", "role": "roles/tpu.viewer", "resource": "project"} in iam["bindings"]
