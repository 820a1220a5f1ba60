"""Core (pure, no I/O): nodes the user brought (`existing:` fleet entries).

tpuq never creates, changes or deletes such a node. The claimer's tick reads it
(an exact getNode) and `decide_existing` says what that read means: once it is
READY and carries the executor's key in its `ssh-keys` metadata, an ACTIVE fleet
event registers it like a claimed slice (the scheduler's `tpus/{node}`); else a
problem line and the command that fixes it, which the claimer records in
`existing_tpus/{fleet}:{entry}` for `tpuq fleet` and the waiting jobs.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tpuq.contracts.documents import NodeHealth, TpuNodeState
from tpuq.contracts.fleet import FleetEntry, FleetFile
from tpuq.contracts.messages import FleetEvent, FleetEventKind, WorkerEndpoint


def node_name(fleet: FleetFile, entry: FleetEntry) -> str:
    """The full name of the entry's node: the entry's (first) zone in the fleet's project."""
    return f"projects/{fleet.project}/locations/{entry.zones[0]}/nodes/{entry.existing}"


@dataclass(frozen=True)
class NodeRead:
    """One getNode of an existing node. found=False with no error: NOT_FOUND; error: the read failed."""

    found: bool
    state: str | None = None
    accelerator_type: str | None = None
    ssh_keys: str = ""  # the node's `ssh-keys` metadata, as is
    spot: bool = False
    endpoints: tuple[WorkerEndpoint, ...] = ()
    error: str | None = None
    health: NodeHealth | None = None


@dataclass(frozen=True)
class ExistingStatus:
    """What `decide_existing` concluded; stored per entry (`existing_tpus/`)."""

    entry_id: str
    node: str
    usable: bool
    problem: str | None = None
    fix: str | None = None

    def to_doc(self, fleet: str, now: datetime) -> dict[str, Any]:
        return {"fleet": fleet, "entry_id": self.entry_id, "node": self.node, "usable": self.usable,
                "problem": self.problem, "fix": self.fix, "updated_at": now}


def key_installed(ssh_keys: str, user: str, public_key: str) -> bool:
    """True when a `USER:TYPE BODY ...` line of the metadata carries this key body for this user."""
    body = public_key.split()[1] if len(public_key.split()) > 1 else public_key
    for line in ssh_keys.splitlines():
        who, _, key = line.strip().partition(":")
        parts = key.split()
        if who == user and len(parts) >= 2 and parts[1] == body:
            return True
    return False


def add_key_command(fleet: FleetFile, entry: FleetEntry, key_line: str) -> str:
    """Shell lines that ADD tpuq's key to the node's `ssh-keys`, keeping the keys already there.

    `gcloud compute tpus tpu-vm update --metadata-from-file ssh-keys=FILE` replaces the ssh-keys value with the
    file's content (`--update-metadata` would too), so the file is first filled with the current value."""
    node, zone, project = entry.existing or "", entry.zones[0], fleet.project
    where = f"{shlex.quote(node)} --zone {zone} --project {project}"
    return (f"gcloud compute tpus tpu-vm describe {where} --format='value(metadata.ssh-keys)' > keys.txt && "
            f"echo {shlex.quote(key_line)} >> keys.txt && "
            f"gcloud compute tpus tpu-vm update {where} --metadata-from-file ssh-keys=keys.txt")


def decide_existing(fleet: FleetFile, entry: FleetEntry, read: NodeRead, key_line: str,
                    now: datetime) -> tuple[FleetEvent | None, ExistingStatus]:
    """(the ACTIVE event that registers the node, or None; its status). `key_line` is `USER:KEY comment`."""
    name = node_name(fleet, entry)
    short = entry.existing or ""

    def problem(text: str, fix: str | None = None) -> tuple[None, ExistingStatus]:
        return None, ExistingStatus(entry.id, short, False, f"existing TPU {short} ({entry.zones[0]}): {text}", fix)

    if read.error:
        return problem(f"unreadable: {read.error}",
                       "check that the node exists and that tpuq's account may read it (roles/tpu.viewer)")
    if not read.found:
        return problem("not found", f"create it, or fix `existing:` of tpus[{entry.id}]")
    if read.state != TpuNodeState.READY:
        return problem(f"{read.state}, not READY: tpuq uses it once it is READY")
    accel = entry.accelerator
    if read.accelerator_type and read.accelerator_type != accel.name:
        return problem(f"is a {read.accelerator_type}, the fleet entry says {accel.name}",
                       f"set type: {read.accelerator_type} on tpus[{entry.id}]")
    user, _, key = key_line.partition(":")
    if not key_installed(read.ssh_keys, user, key):
        return problem("tpuq's SSH key is not in its ssh-keys metadata, so the executor cannot log in",
                       add_key_command(fleet, entry, key_line))
    if not read.endpoints:
        return problem("has no network endpoints yet")
    event = FleetEvent(kind=FleetEventKind.active, fleet=fleet.name, queued_resource="", zone=entry.zones[0],
                       type=accel.name, node=name, entry_id=entry.id, chips=accel.chips, hosts=accel.hosts,
                       spot=read.spot, endpoints=list(read.endpoints), node_health=read.health, at=now)
    return event, ExistingStatus(entry.id, short, True)
