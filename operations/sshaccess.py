"""Core (pure, no I/O): how `tpuq ssh` reaches a worker of a running job, and the IAP firewall check.

A person's machine is not in the project's VPC. A worker with an external IP is reached with gcloud's GA
command; one without is reached through Identity-Aware Proxy's TCP forwarding, which only gcloud's alpha
command offers (`--tunnel-through-iap`), and which needs an ingress rule admitting IAP's range
(35.235.240.0/20) on tcp:22 to the node. The rule belongs to the project's owner: tpuq reads the rules
(compute v1 `firewalls.list`) and, when none admits IAP, prints the owner's command instead of connecting.
On the local stack the worker's sshd is reached directly, with the system `ssh`. On a multislice job, `--slice S
--worker W` picks worker W of slice S's node; `--worker G` alone is the worker's id across the slices (`job_slices`).

The shell that reads the job, the node and the firewalls and then execs is `tpuq.cli.ssh`.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpuq.contracts.documents import JobDoc, JobState, short_node_name
from tpuq.contracts.workers import split_worker_id

IAP_RANGE = "35.235.240.0/20"  # where IAP TCP forwarding connects from (Google's IAP documentation)
SSH_PORT = 22
DEFAULT_PRIORITY = 1000  # compute v1 Firewall.priority when a rule does not set one


class SshRefused(Exception):
    """`tpuq ssh` cannot connect; the message says why and what to do (one line)."""


@dataclass(frozen=True)
class NodeView:
    """What `tpuq ssh` needs of a TPU node (tpu.v2 Node), read from the TPU API."""

    name: str  # projects/P/locations/Z/nodes/N
    network: str  # networkConfig.network: a name or a URL
    tags: tuple[str, ...] = ()
    service_account: str | None = None  # serviceAccount.email
    internal_ips: tuple[str, ...] = ()  # networkEndpoints[i].ipAddress, worker i
    external_ips: tuple[str | None, ...] = ()  # networkEndpoints[i].accessConfig.externalIp, or None

    @property
    def project(self) -> str:
        return self.name.split("/")[1]

    @property
    def zone(self) -> str:
        return self.name.split("/")[3]

    @property
    def short(self) -> str:
        return short_node_name(self.name)

    @classmethod
    def from_api(cls, node: Mapping[str, Any]) -> "NodeView":
        """From a Node as REST JSON (camelCase), as the TPU API and the fake return it."""
        endpoints = node.get("networkEndpoints") or []
        return cls(
            name=node["name"],
            network=(node.get("networkConfig") or {}).get("network") or "default",
            tags=tuple(node.get("tags") or ()),
            service_account=(node.get("serviceAccount") or {}).get("email") or None,
            internal_ips=tuple(e.get("ipAddress", "") for e in endpoints),
            external_ips=tuple((e.get("accessConfig") or {}).get("externalIp") or None for e in endpoints),
        )


# ------------------------------------------------------------------ the job and its worker
def running_node(job: JobDoc) -> tuple[str, str]:
    """(node name, zone) of a running job, or SshRefused naming its state."""
    if job.state is not JobState.running or not job.tpu:
        hint = {JobState.pending: "it has no TPU yet", JobState.assigned: "it is starting: try again in a moment"}
        why = hint.get(job.state, "it has ended" if job.terminal else "")
        raise SshRefused(f"job {job.id} is {job.state.value}, not running{': ' + why if why else ''}; "
                         "tpuq ssh opens a shell only on a running job's workers")
    return job.tpu, job.zone or job.tpu.split("/")[3]


def workers_text(count: int) -> str:
    """How the workers are named to a person: `0` for one, `0-3` for four."""
    return "0" if count == 1 else f"0-{count - 1}"


def check_worker(job_id: str, worker: int, count: int, option: str = "--worker", slice_id: int | None = None) -> None:
    """A worker index the job has (of its slice `slice_id`, when given), or a one-line error naming the workers it
    has."""
    whose = f"job {job_id}" if slice_id is None else f"slice {slice_id} of job {job_id}"
    if count <= 0:
        raise SshRefused(f"{whose}: its TPU reports no workers yet")
    if not 0 <= worker < count:
        noun = "worker" if count == 1 else "workers"
        raise SshRefused(f"{option} {worker}: {whose} has {count} {noun}, {workers_text(count)}")


# A multislice job (issue 37) runs on a gang of slices, one node each (`job.gang`, slice order; slice 0 is `tpu`).
# `--slice S --worker W` is worker W of slice S's node. `--worker G` alone is the worker's global id, numbered across
# the slices as `tpuq logs --worker` and the status objects number them (tpuq.contracts.workers: G = S × hosts + W),
# so on 2 slices of 4 hosts `--worker 5` is s1/w1. On one slice both read as today's `--worker`.
def job_slices(job: JobDoc) -> tuple[str, ...]:
    """The running job's nodes, slice order: its gang on several slices, else its one node (running_node first)."""
    return tuple(job.gang) if len(job.gang) > 1 else ((job.tpu,) if job.tpu else ())


def slice_node(job_id: str, slices: tuple[str, ...], slice_id: int) -> str:
    """The node of slice `slice_id` (`--slice`), or a one-line error naming the slices the job runs on."""
    if not 0 <= slice_id < len(slices):
        runs_on = "one slice, 0" if len(slices) == 1 else f"{len(slices)} slices, {workers_text(len(slices))}"
        raise SshRefused(f"--slice {slice_id}: job {job_id} runs on {runs_on}")
    return slices[slice_id]


def global_worker(job_id: str, worker: int, hosts_per_slice: int, slice_count: int) -> tuple[int, int]:
    """`--worker G` without `--slice` on a multislice job: (slice, worker within it) of the global id G, or a
    one-line error naming both ways to name a worker."""
    if hosts_per_slice <= 0:
        raise SshRefused(f"job {job_id}: its TPU reports no workers yet")
    total = hosts_per_slice * slice_count
    if not 0 <= worker < total:
        example = f"{hosts_per_slice + 1} is s1/w1" if hosts_per_slice > 1 else f"{hosts_per_slice} is s1/w0"
        raise SshRefused(
            f"--worker {worker}: job {job_id} has {total} workers on {slice_count} slices of {hosts_per_slice}, "
            f"{workers_text(total)} numbered across the slices ({example}); or name a slice's worker: "
            f"--slice {workers_text(slice_count)} --worker {workers_text(hosts_per_slice)}")
    return split_worker_id(worker, hosts_per_slice)


def remote_command(words: Sequence[str]) -> str | None:
    """The command line the worker's shell runs: the words joined by spaces, as ssh(1) joins them."""
    return " ".join(words) if words else None


# ------------------------------------------------------------------ gcloud (a project)
def gcloud_argv(node: NodeView, worker: int, command: str | None, *, iap: bool) -> list[str]:
    """The gcloud command that opens the shell (or runs the command) on one worker.

    GA `gcloud compute tpus tpu-vm ssh` has no `--tunnel-through-iap`; `gcloud alpha` has (checked against
    gcloud's own --help)."""
    argv = ["gcloud", *(["alpha"] if iap else []), "compute", "tpus", "tpu-vm", "ssh", node.short,
            f"--zone={node.zone}", f"--project={node.project}", f"--worker={worker}"]
    if iap:
        argv.append("--tunnel-through-iap")
    if command is not None:
        argv.append(f"--command={command}")
    return argv


def ports_cover(entry: Mapping[str, Any], port: int) -> bool:
    """Does a Firewall `allowed[]`/`denied[]` entry cover tcp:`port` (tcp, all or 6; no ports means every port)?"""
    if str(entry.get("IPProtocol", "")).lower() not in ("tcp", "all", "6"):
        return False
    specs = entry.get("ports") or []
    if not specs:
        return True
    for spec in specs:
        low, _, high = str(spec).partition("-")
        try:
            if int(low) <= port <= int(high or low):
                return True
        except ValueError:
            continue
    return False


def _sources(rule: Mapping[str, Any]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = []
    for source in rule.get("sourceRanges") or []:
        try:
            out.append(ipaddress.ip_network(source, strict=False))
        except ValueError:
            continue
    return out


def _targets_node(rule: Mapping[str, Any], node: NodeView) -> bool:
    """No target list applies to every instance of the network; otherwise a tag or the account must match."""
    tags, accounts = rule.get("targetTags") or [], rule.get("targetServiceAccounts") or []
    if not tags and not accounts:
        return True
    return bool(set(tags) & set(node.tags)) or (node.service_account is not None and node.service_account in accounts)


def _short(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1]


def _applies(rule: Mapping[str, Any], node: NodeView) -> bool:
    return (not rule.get("disabled") and (rule.get("direction") or "INGRESS") == "INGRESS"
            and _short(rule.get("network") or "default") == _short(node.network) and _targets_node(rule, node))


def iap_rules(firewalls: Sequence[Mapping[str, Any]], node: NodeView) -> list[str]:
    """The rules that let IAP's TCP forwarding reach tcp:22 on this node; empty when none does.

    An allow rule counts when it covers all of IAP's range on the node's network and targets the node, and
    no deny rule of the same or a higher priority (a lower number; deny wins a tie) blocks any of that range.
    """
    iap = ipaddress.ip_network(IAP_RANGE)
    applying = [r for r in firewalls if _applies(r, node)]

    def priority(rule: Mapping[str, Any]) -> int:
        return int(rule.get("priority", DEFAULT_PRIORITY))

    denies = [r for r in applying if any(ports_cover(d, SSH_PORT) for d in r.get("denied") or [])
              and any(s.version == 4 and s.overlaps(iap) for s in _sources(r))]
    out = []
    for rule in applying:
        if not any(ports_cover(a, SSH_PORT) for a in rule.get("allowed") or []):
            continue
        if not any(s.version == 4 and iap.subnet_of(s) for s in _sources(rule)):
            continue
        if any(priority(d) <= priority(rule) for d in denies):
            continue
        out.append(rule.get("name", "?"))
    return sorted(out)


def iap_rule_name(network: str) -> str:
    return f"{_short(network)}-allow-ssh-from-iap"[:63]


def iap_firewall_command(node: NodeView) -> str:
    """The command the project's owner runs (tpuq never creates it): IAP's range on tcp:22, to this node."""
    argv = ["gcloud", "compute", "firewall-rules", "create", iap_rule_name(node.network), f"--project={node.project}",
            f"--network={_short(node.network)}", "--direction=INGRESS", "--action=ALLOW", f"--rules=tcp:{SSH_PORT}",
            f"--source-ranges={IAP_RANGE}"]
    if node.tags:
        argv.append(f"--target-tags={','.join(node.tags)}")
    return shlex.join(argv)


def iap_missing_message(node: NodeView, worker: int) -> str:
    return (f"worker {worker} of {node.short} has no external IP, so it is reached through IAP, and no firewall rule "
            f"of network {_short(node.network)} in project {node.project} admits IAP's range ({IAP_RANGE}) on "
            f"tcp:{SSH_PORT} to it; the project's owner creates one (tpuq never changes firewalls): "
            f"{iap_firewall_command(node)}")


# ------------------------------------------------------------------ the local stack
def local_ssh_argv(address: str, user: str, key_file: str, known_hosts: str, command: str | None) -> list[str]:
    """The system ssh straight to a local worker's sshd: tpuq's key, the host key pinned (never trusted blindly)."""
    argv = ["ssh", "-i", key_file, "-p", str(SSH_PORT), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
    argv += ["-l", user, address]
    if command is not None:
        argv += ["--", command]
    return argv


def known_hosts_line(address: str, host_key: str) -> str:
    """`ADDRESS ssh-ed25519 BASE64`: one pinned key, as ssh's known_hosts holds it."""
    return f"{address} {host_key.strip()}\n"
