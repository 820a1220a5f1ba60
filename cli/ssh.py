"""`tpuq ssh JOB [--slice S] [--worker N] [-- CMD]`: shell: reads the job, its node (on a multislice job, the
slice's) and the firewalls, then execs ssh or gcloud.

The decisions (which command, which firewall rule admits IAP, which worker) are `tpuq.operations.sshaccess`'s.
- On the local stack (the environment names the stack's SSH key, `TPUQ_SSH_PRIVATE_KEY_FILE`, which only
  `tpuq dev env` gives): the system `ssh`, straight to the worker's sshd at the address the executor uses, with
  the host key its guest attributes publish pinned.
- Against a project: gcloud's `compute tpus tpu-vm ssh` for a worker with an external IP; `gcloud alpha ...
  --tunnel-through-iap` for one without, once a firewall rule admitting IAP is found (compute v1
  `firewalls.list`, read only; `TPUQ_COMPUTE_API_ENDPOINT` points it at a stand-in).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Optional

import typer

from tpuq.cli.connecting import cli_clients, fleet_in_use, job_or_fail
from tpuq.cli.console import CliError, err
from tpuq.operations.sshaccess import SshRefused, remote_command

ENV_COMPUTE_ENDPOINT = "TPUQ_COMPUTE_API_ENDPOINT"  # a stand-in of compute.googleapis.com (the fake's Google APIs)
COMPUTE_URL = "https://compute.googleapis.com/"
ENV_LOCAL_KEY = "TPUQ_SSH_PRIVATE_KEY_FILE"  # the local stack's executor key (`tpuq dev env`); production: never here


def ssh(job_id: str = typer.Argument(..., metavar="JOB"),
        worker: int = typer.Option(0, "--worker", min=0,
                                   help="Which worker (0 first): of the slice --slice names; on a multislice job "
                                        "without --slice, the worker's id across the slices, as `tpuq logs --worker` "
                                        "numbers them (slice × hosts per slice + worker: on 2 slices of 4 hosts, 5 "
                                        "is s1/w1)"),
        slice_id: Optional[int] = typer.Option(None, "--slice", min=0,
                                               help="Which slice of a multislice job (0 first, in the order "
                                                    "`tpuq status` lists its nodes); --worker is then the "
                                                    "worker within that slice"),
        command: Optional[list[str]] = typer.Argument(None, metavar="CMD",
                                                      help="Run this command instead of a shell; its exit code is "
                                                           "tpuq's. The words are joined by spaces, as ssh does")) -> None:
    """A shell (or one command) on a worker of a running job: gcloud against a project, ssh on the local stack."""
    from tpuq.contracts.documents import JobDoc
    from tpuq.operations.sshaccess import running_node

    clients = cli_clients()
    try:
        job = JobDoc.from_doc(job_or_fail(clients.firestore, job_id), job_id)
        running_node(job)
        node, worker = _pick_worker(clients, job, slice_id, worker)
        line = remote_command(command or [])
        local_key = os.environ.get(ENV_LOCAL_KEY)
        if clients.settings.firestore_emulator and local_key:
            argv = _local_argv(clients, node, worker, line, local_key)
        else:
            argv = _project_argv(node, worker, line)
    except SshRefused as e:
        raise CliError(str(e)) from None
    _exec(argv)


def _pick_worker(clients, job, slice_id: int | None, worker: int):
    """(the node, the worker within it) that `--slice`/`--worker` name (tpuq.operations.sshaccess: job_slices)."""
    from tpuq.contracts.workers import worker_label
    from tpuq.operations.sshaccess import check_worker, global_worker, job_slices, slice_node

    slices = job_slices(job)
    if slice_id is not None:
        node = _read_node(clients, slice_node(job.id, slices, slice_id))
        check_worker(job.id, worker, len(node.internal_ips), slice_id=slice_id if len(slices) > 1 else None)
    elif len(slices) > 1:  # --worker alone on several slices: the global id
        first = _read_node(clients, slices[0])
        slice_id, worker = global_worker(job.id, worker, len(first.internal_ips), len(slices))
        node = first if slice_id == 0 else _read_node(clients, slices[slice_id])
        check_worker(job.id, worker, len(node.internal_ips), slice_id=slice_id)
    else:
        node = _read_node(clients, slices[0])
        check_worker(job.id, worker, len(node.internal_ips))
    if len(slices) > 1:
        hosts = len(node.internal_ips)
        err.print(f"[dim]{worker_label(slice_id * hosts + worker, hosts, len(slices))}: slice {slice_id} of "
                  f"{len(slices)}, its node {node.short}[/dim]", highlight=False)
    return node, worker


def _read_node(clients, name: str):
    from google.api_core import exceptions
    from google.cloud import tpu_v2

    from tpuq.operations.sshaccess import NodeView

    try:
        node = clients.tpu.get_node(name=name)
    except exceptions.NotFound:
        raise SshRefused(f"the job's TPU {name} no longer exists") from None
    except exceptions.GoogleAPICallError as e:
        raise SshRefused(f"cannot read the job's TPU {name}: {e.message}") from None
    import json

    return NodeView.from_api(json.loads(tpu_v2.Node.to_json(node)))


# ------------------------------------------------------------------ a project: gcloud
def _project_argv(node, worker: int, line: str | None) -> list[str]:
    from tpuq.operations.sshaccess import gcloud_argv, iap_firewall_command, iap_missing_message, iap_rules

    if node.external_ips[worker]:
        err.print(f"[dim]worker {worker} of {node.short} ({node.zone}): gcloud, to its external IP[/dim]",
                  highlight=False)
        return gcloud_argv(node, worker, line, iap=False)
    firewalls, why = _read_firewalls(node.project)
    if firewalls is None:
        err.print(f"[yellow]warning:[/yellow] could not read the firewall rules of {node.project} ({why}): if the "
                  f"connection fails, the project's owner may need to run: {iap_firewall_command(node)}",
                  highlight=False, markup=True)
    else:
        rules = iap_rules(firewalls, node)
        if not rules:
            raise SshRefused(iap_missing_message(node, worker))
        err.print(f"[dim]worker {worker} of {node.short} ({node.zone}) has no external IP: gcloud alpha through IAP "
                  f"(firewall rule {', '.join(rules)})[/dim]", highlight=False)
    return gcloud_argv(node, worker, line, iap=True)


def _read_firewalls(project: str) -> tuple[list[dict] | None, str]:
    """compute v1 firewalls.list, every page; (None, why) when it cannot be read. Only ever a GET."""
    import requests

    from tpuq.deploy.gcp import ApiError, RestApi

    endpoint = os.environ.get(ENV_COMPUTE_ENDPOINT)
    if endpoint:
        session = requests.Session()
    else:
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/compute.readonly"])
        session = AuthorizedSession(credentials)
    compute = RestApi("compute", (endpoint or COMPUTE_URL).rstrip("/") + "/compute/v1/", session)
    try:
        return compute.list_all(f"projects/{project}/global/firewalls", "items"), ""
    except ApiError as e:
        return None, f"HTTP {e.status}: {e.message}"
    except requests.RequestException as e:
        return None, type(e).__name__


# ------------------------------------------------------------------ the local stack: ssh
def _local_argv(clients, node, worker: int, line: str | None, key_file: str) -> list[str]:
    from tpuq.contracts.errors import TpuqError
    from tpuq.executor.pins import GuestAttributeHostKeys, HostKeysUnavailable
    from tpuq.executor.ssh import ssh_address
    from tpuq.runtime.fleetstore import load_fleet
    from tpuq.contracts.messages import WorkerEndpoint
    from tpuq.operations.sshaccess import known_hosts_line, local_ssh_argv

    try:
        # The executor's login, from the one place it is named: the fleet in force's ssh_user is the only user
        # the claimer put in the node's ssh-keys metadata.
        fleet = load_fleet(clients.firestore, fleet_in_use())
    except TpuqError as e:
        raise SshRefused(f"cannot tell which user the workers let in: {e}") from None
    transport, user = fleet.ssh_transport, fleet.ssh_user
    endpoint = WorkerEndpoint(worker_id=worker, ip=node.internal_ips[worker], external_ip=node.external_ips[worker])
    address = ssh_address(endpoint, transport)
    try:
        host_key = GuestAttributeHostKeys(clients.tpu).published(node.name).get(worker)
    except HostKeysUnavailable as e:
        raise SshRefused(str(e)) from None
    if not host_key:
        raise SshRefused(f"worker {worker} of {node.short} has not published its host key yet: try again in a moment")
    known_hosts = Path(key_file).parent / f"known_hosts-{node.short}-w{worker}"
    known_hosts.write_text(known_hosts_line(address, host_key))
    err.print(f"[dim]worker {worker} of {node.short}: ssh {user}@{address} (local stack)[/dim]", highlight=False)
    return local_ssh_argv(address, user, key_file, str(known_hosts), line)


def _exec(argv: list[str]) -> None:
    """Hand the terminal over: this process becomes ssh or gcloud, whose exit code is the command's."""
    program = shutil.which(argv[0])
    if program is None:
        raise CliError(f"`{argv[0]}` is not installed or not on PATH; tpuq ssh runs: {' '.join(argv)}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(program, argv)
