"""How the executor reaches the workers' sshd, as `tpuq deploy` sets it up (its own service) and checks it
(everything else, read-only: subnets, firewalls, OS Login and organisation policies belong to the owner).

- vpc (and iap, which tpuq serves the same way): the executor's Cloud Run service gets Direct VPC egress,
  one interface on the fleet's network, on the subnet of the fleet's `subnetwork` name in the services'
  region (Cloud Run needs it there; VPC routes are global, so it reaches TPU VMs in every region), tagged
  `executor_network_tag`. Traffic to private ranges goes through it; the rest (Google APIs) stays as it was.
  A firewall rule must admit tcp:22 from that tag (or the subnet's range) to `worker_network_tag`.
- direct: no VPC egress. Cloud Run's egress addresses are not fixed, so the rule must admit tcp:22 from
  0.0.0.0/0 to the worker tag.
- OS Login: every node tpuq creates carries `enable-oslogin: FALSE` and the executor's key in `ssh-keys`.
  Instance metadata overrides the project's `enable-oslogin`, so a project with OS Login on is fine for
  those nodes; the organisation policy `compute.requireOsLogin` overrides both and blocks the executor.
- `compute.vmExternalIpAccess` (a list constraint) forbids external IPs: that rules out `direct`, and
  external IPs for small slices under vpc (`worker_external_ips: false` plus Cloud NAT instead).

- Subnets are regional (tpuq.capacity.subnets): the fleet's one `subnetwork` name must exist in every region it creates
  TPU nodes in, whatever the transport, as well as in the services' region under vpc/iap. Deploy GETs it in each
  (an auto-mode network has it everywhere, a custom-mode one only where its owner created it).

Every read here is a GET (compute) or crm's read-only getEffectiveOrgPolicy; what is missing becomes a
todo with the exact command for the owner.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import Any

from tpuq.deploy.model import Action, ProjectState, Target, VpcFacts
from tpuq.contracts.fleet import FleetFile, SshTransport, executor_network_tag, worker_network_tag, worker_service_account
from tpuq.contracts.tputypes import zone_region
from tpuq.operations.sshaccess import ports_cover as _covers_port  # one reading of a rule's protocol and ports
from tpuq.capacity.subnets import subnet_create_command

SSH_PORT = 22
EGRESS = "PRIVATE_RANGES_ONLY"  # only private ranges through the VPC: Google APIs keep Cloud Run's own path
REQUIRE_OS_LOGIN = "constraints/compute.requireOsLogin"
VM_EXTERNAL_IP_ACCESS = "constraints/compute.vmExternalIpAccess"
ANYWHERE = "0.0.0.0/0"
# Direct VPC egress needs a /26 or more; a TPU subnet needs an address per host of every slice in the region.
RANGE_NOTE = "use any free range: the /20 shown has room for any slice, and the executor's egress needs /26 or more"


# ------------------------------------------------------------ the executor's egress
def executor_vpc_access(fleet: FleetFile) -> dict | None:
    """run v2 RevisionTemplate.vpcAccess for the executor, or None for `direct` (it goes out to the internet)."""
    if not fleet.reaches_internal_ips:
        return None
    return {"networkInterfaces": [{"network": fleet.network, "subnetwork": fleet.subnetwork,
                                   "tags": [executor_network_tag(fleet.owner_prefix)]}],
            "egress": EGRESS}


def vpc_access_projection(access: Mapping[str, Any] | None) -> tuple | None:
    """The part of vpcAccess deploy owns, so that a service read back (full resource names) compares equal."""
    if not access:
        return None
    interfaces = tuple((_short(i.get("network", "")), _short(i.get("subnetwork", "")), tuple(sorted(i.get("tags") or [])))
                       for i in access.get("networkInterfaces") or [])
    return interfaces, access.get("egress")


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


# ------------------------------------------------------------ reading (read-only)
Tolerant = Callable[[Callable[[], Any], str], Any]  # (read, what) -> value, or None with a note (403, ...)


def read_vpc_facts(adapters: Mapping[str, Any], target: Target, tolerant: Tolerant) -> VpcFacts:
    fleet, p = target.fleet, target.project
    compute, crm = adapters["compute"], adapters["crm"]
    facts = VpcFacts()
    for region in subnet_regions(target):
        # {}: read and not there; None: could not be read (tolerant's note says why).
        subnet = tolerant(lambda region=region: compute.get_or_none(
            f"projects/{p}/regions/{region}/subnetworks/{fleet.subnetwork}") or {}, f"subnet {fleet.subnetwork} in {region}")
        if subnet is None:
            continue
        if region == target.region and fleet.reaches_internal_ips:
            facts.subnet, facts.subnet_missing = (subnet or None), not subnet
        if region in fleet.node_regions:
            facts.region_subnets[region] = subnet or None
    facts.firewalls = tolerant(lambda: compute.list_all(f"projects/{p}/global/firewalls", "items"), "firewall rules")
    project = tolerant(lambda: compute.call("GET", f"projects/{p}"), "project metadata (OS Login)")
    if project is not None:
        items = (project.get("commonInstanceMetadata") or {}).get("items") or []
        facts.project_metadata = {i.get("key", ""): str(i.get("value", "")) for i in items}
    os_login = tolerant(lambda: _effective_policy(crm, p, REQUIRE_OS_LOGIN), f"org policy {REQUIRE_OS_LOGIN}")
    if os_login is not None:
        facts.require_os_login = bool((os_login.get("booleanPolicy") or {}).get("enforced"))
    ext = tolerant(lambda: _effective_policy(crm, p, VM_EXTERNAL_IP_ACCESS), f"org policy {VM_EXTERNAL_IP_ACCESS}")
    if ext is not None:
        facts.external_ips_forbidden = external_ips_forbidden(ext)
    return facts


def subnet_regions(target: Target) -> list[str]:
    """Every region the fleet's subnet must exist in: the services' (under vpc/iap), then the TPU nodes'."""
    executor = [target.region] if target.fleet.reaches_internal_ips else []
    return list(dict.fromkeys([*executor, *target.fleet.node_regions]))


def _effective_policy(crm, project: str, constraint: str) -> dict:
    # crm v1 projects.getEffectiveOrgPolicy: a POST, but it only reads.
    return crm.call("POST", f"projects/{project}:getEffectiveOrgPolicy", body={"constraint": constraint})


def external_ips_forbidden(policy: Mapping[str, Any]) -> bool:
    """vmExternalIpAccess is an allow-list of instances: DENY all, or a list that cannot name nodes yet to come."""
    lp = policy.get("listPolicy") or {}
    return lp.get("allValues") == "DENY" or bool(lp.get("allowedValues"))


# ------------------------------------------------------------ checks (pure)
def checks(target: Target, state: ProjectState) -> list[Action]:
    out: list[Action] = []
    for region in subnet_regions(target):
        out += _subnet_check(target, state.vpc, region)
    out += _firewall_check(target, state.vpc)
    out += _os_login_checks(target, state.vpc)
    out += _external_ip_checks(target, state.vpc)
    return out


def _subnet_check(target: Target, vpc: VpcFacts, region: str) -> list[Action]:
    fleet = target.fleet
    what = f"subnet {fleet.subnetwork} in {region}"
    create = subnet_create_command(fleet, region)
    for_executor = fleet.reaches_internal_ips and region == target.region
    entries = [t.id for t in fleet.tpus if not t.existing and region in {zone_region(z) for z in t.zones}]
    needs = []
    if for_executor:
        needs.append(f"the executor's Direct VPC egress needs a subnet in the services' region ({region}, deploy's "
                     f"--region); VPC routes are global, so it reaches workers in every region of {fleet.network}")
    if entries:
        needs.append(f"tpus {', '.join(entries)} create TPU nodes in {region}, and a node's subnet must be in its own "
                     "region (subnets are regional), or every create there is refused")
    why = "; ".join(needs)
    uses = " and ".join((["the executor's VPC egress"] if for_executor else [])
                        + ([f"the TPU nodes of tpus {', '.join(entries)}"] if entries else []))
    if for_executor:
        subnet, missing = vpc.subnet, vpc.subnet_missing
    else:
        subnet, missing = vpc.region_subnets.get(region), region in vpc.region_subnets
    if subnet is not None:
        if _short(subnet.get("network", "")) != _short(fleet.network):
            return [Action("todo", what, f"belongs to network {_short(subnet.get('network', ''))}, not the fleet's "
                           f"{fleet.network}: set the fleet's subnetwork to a subnet of {fleet.network} in {region}, "
                           "or create one (FOR THE PROJECT OWNER; use any free range)", commands=(create,))]
        return [Action("check", what, f"exists ({subnet.get('ipCidrRange', '?')}): {uses}")]
    if not missing:
        return [Action("todo", what, f"could not be checked: {why}. If there is none, the project owner creates it "
                       f"({RANGE_NOTE})", commands=(create,))]
    return [Action("todo", what, f"does not exist: {why}. FOR THE PROJECT OWNER TO RUN (tpuq never changes network "
                   f"settings; {RANGE_NOTE})", commands=(create,))]


def _range_covers(source: str, subnet_range: str | None) -> bool:
    try:
        net = ipaddress.ip_network(source, strict=False)
        if net.prefixlen == 0:
            return True
        return subnet_range is not None and ipaddress.ip_network(subnet_range).subnet_of(net)
    except (ValueError, TypeError):
        return False


def admits_ssh(rule: Mapping[str, Any], fleet: FleetFile, worker_account: str, subnet_range: str | None) -> bool:
    """Does this firewall rule let the executor open tcp:22 on the fleet's TPU VMs?"""
    if rule.get("disabled") or (rule.get("direction") or "INGRESS") != "INGRESS":
        return False
    if _short(rule.get("network", "")) != _short(fleet.network):
        return False
    if not any(_covers_port(a, SSH_PORT) for a in rule.get("allowed") or []):
        return False
    targets, target_accounts = rule.get("targetTags") or [], rule.get("targetServiceAccounts") or []
    if (targets or target_accounts) and worker_network_tag(fleet.owner_prefix) not in targets \
            and worker_account not in target_accounts:
        return False
    ranges = rule.get("sourceRanges") or []
    if fleet.reaches_internal_ips:
        return executor_network_tag(fleet.owner_prefix) in (rule.get("sourceTags") or []) or any(
            _range_covers(r, subnet_range) for r in ranges)
    # direct: Cloud Run's egress addresses are not fixed, so only a rule open to everyone admits it.
    return any(_range_covers(r, None) for r in ranges)


def firewall_command(target: Target) -> str:
    fleet = target.fleet
    source = (f"--source-tags={executor_network_tag(fleet.owner_prefix)}" if fleet.reaches_internal_ips
              else f"--source-ranges={ANYWHERE}")
    return (f"gcloud compute firewall-rules create {fleet.owner_prefix}-allow-executor-ssh --network={fleet.network} "
            f"--direction=INGRESS --action=ALLOW --rules=tcp:{SSH_PORT} {source} "
            f"--target-tags={worker_network_tag(fleet.owner_prefix)} --project={target.project}")


def _firewall_check(target: Target, vpc: VpcFacts) -> list[Action]:
    fleet = target.fleet
    what = f"firewall tcp:{SSH_PORT} on {fleet.network}"
    source = (f"the executor (tag {executor_network_tag(fleet.owner_prefix)})" if fleet.reaches_internal_ips
              else f"anywhere ({ANYWHERE}: ssh_transport direct, and Cloud Run's egress addresses are not fixed)")
    worker_account = worker_service_account(target.project)
    if vpc.firewalls is not None:
        subnet_range = (vpc.subnet or {}).get("ipCidrRange")
        rules = [r.get("name", "?") for r in vpc.firewalls if admits_ssh(r, fleet, worker_account, subnet_range)]
        if rules:
            return [Action("check", what, f"rule {', '.join(sorted(rules))} admits {source} to the TPU VMs")]
    to = f"to the TPU VMs (tag {worker_network_tag(fleet.owner_prefix)}, which every node tpuq creates carries)"
    if vpc.firewalls is None:
        return [Action("todo", what, f"could not be checked: a rule must admit {source} {to}. If none does, the "
                       "project owner creates one", commands=(firewall_command(target),))]
    return [Action("todo", what, f"no rule admits {source} {to}: the executor cannot reach any worker. FOR THE "
                   "PROJECT OWNER TO RUN (tpuq never changes firewalls)", commands=(firewall_command(target),))]


def _os_login_checks(target: Target, vpc: VpcFacts) -> list[Action]:
    p, out = target.project, []
    if vpc.require_os_login:
        out.append(Action("todo", "OS Login", f"BLOCKS EVERY JOB: the organisation policy {REQUIRE_OS_LOGIN} is enforced "
                          f"on {p}; it overrides the enable-oslogin=FALSE that tpuq sets on each node, so the workers "
                          "ignore the executor's key in ssh-keys metadata and no job can start. The way out: an "
                          "organisation policy administrator exempts this project (tpuq does not log in through OS "
                          "Login)", commands=(f"gcloud resource-manager org-policies disable-enforce "
                                              f"compute.requireOsLogin --project={p}",)))
    project_flag = (vpc.project_metadata or {}).get("enable-oslogin", "")
    if project_flag.strip().upper() == "TRUE":
        out.append(Action("check", "OS Login", "the project's metadata turns it on (enable-oslogin=TRUE); every node "
                          "tpuq creates sets enable-oslogin=FALSE in its own metadata, which takes precedence, so the "
                          "executor's key in ssh-keys is honoured"))
        existing = [t.id for t in target.fleet.tpus if t.existing]
        if existing:
            out.append(Action("todo", "OS Login on existing nodes", f"tpus {', '.join(existing)} name nodes tpuq did not "
                              "create: they follow the project's enable-oslogin=TRUE and ignore the executor's key "
                              "unless their own metadata sets enable-oslogin=FALSE and carries the key"))
    return out


def _external_ip_checks(target: Target, vpc: VpcFacts) -> list[Action]:
    fleet = target.fleet
    if not vpc.external_ips_forbidden:
        return []
    why = f"the organisation policy {VM_EXTERNAL_IP_ACCESS} forbids external IPs on {target.project}"
    if fleet.ssh_transport is SshTransport.direct:
        return [Action("todo", "ssh_transport direct", f"BLOCKS EVERY JOB: {why}, and direct reaches each worker at its "
                       "external IP. Set `ssh_transport: vpc` and `worker_external_ips: false` in the fleet file "
                       "(workers then need Cloud NAT to reach PyPI; deploy checks it), then deploy again")]
    small = [t.id for t in fleet.tpus if fleet.external_ips_for(t.accelerator)]
    if small:
        return [Action("todo", "worker_external_ips", f"{why}, so creating tpus {', '.join(small)} (under 16 hosts, "
                       "which get external IPs by default) would fail. Set `worker_external_ips: false` in the fleet "
                       "file (workers then need Cloud NAT to reach PyPI; deploy checks it), then deploy again")]
    return [Action("check", "external IPs", f"{why}; no node of this fleet asks for one")]
