"""`existing:` nodes (issue 15 §2): what one getNode of a node tpuq did not create means (tpuq.capacity.existing)."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone

import pytest

from tpuq.capacity.existing import NodeRead, add_key_command, decide_existing, key_installed, node_name
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.messages import FleetEventKind, WorkerEndpoint

NOW = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
KEY = "tpuq:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExecutor tpuq-executor"
FLEET = FleetFile.model_validate({"name": "f", "project": "p", "tpus": [
    {"id": "mine", "type": "v4-8", "zone": "us-central2-b", "existing": "my-v4"}]})
ENTRY = FLEET.tpus[0]
EP = (WorkerEndpoint(worker_id=0, ip="10.0.0.2", external_ip="34.1.2.3"),)
OTHERS = "alice:ssh-rsa AAAAB3Other alice@laptop"


def ready(**over) -> NodeRead:
    return NodeRead(**{"found": True, "state": "READY", "accelerator_type": "v4-8",
                       "ssh_keys": f"{OTHERS}\n{KEY}", "endpoints": EP, **over})


def test_a_ready_node_with_the_key_is_registered_like_a_claimed_slice():
    event, status = decide_existing(FLEET, ENTRY, ready(), KEY, NOW)
    assert status.usable and status.problem is None
    assert event.kind is FleetEventKind.active and event.node == node_name(FLEET, ENTRY)
    assert event.node == "projects/p/locations/us-central2-b/nodes/my-v4"
    assert (event.entry_id, event.type, event.chips, event.hosts, event.spot) == ("mine", "v4-8", 4, 1, False)
    assert event.endpoints == list(EP) and not event.queued_resource  # no queued resource: the janitor skips it


@pytest.mark.parametrize("read, words, fix", [
    (NodeRead(found=False), "not found", "existing:"),
    (NodeRead(found=False, error="403 permission denied"), "unreadable: 403", "roles/tpu.viewer"),
    (ready(state="CREATING"), "CREATING, not READY", None),
    (ready(state="PREEMPTED"), "PREEMPTED, not READY", None),
    (ready(accelerator_type="v4-16"), "is a v4-16", "type: v4-16"),
    (ready(ssh_keys=OTHERS), "SSH key is not in its ssh-keys", "--metadata-from-file ssh-keys=keys.txt"),
    (ready(ssh_keys=""), "SSH key is not in its ssh-keys", "value(metadata.ssh-keys)"),
    (ready(ssh_keys=KEY.replace("tpuq:", "someone:")), "SSH key is not in its ssh-keys", "gcloud"),
    (ready(endpoints=()), "no network endpoints", None),
])
def test_a_node_tpuq_cannot_use_is_not_registered_and_says_why_and_what_to_run(read, words, fix):
    event, status = decide_existing(FLEET, ENTRY, read, KEY, NOW)
    assert event is None and not status.usable
    assert status.problem.startswith("existing TPU my-v4 (us-central2-b): ") and words in status.problem
    assert (fix in status.fix) if fix else status.fix is None


def test_the_key_command_appends_to_the_keys_already_there(tmp_path):
    """The command reads the node's current ssh-keys into keys.txt and appends tpuq's line; run with a stand-in
    gcloud that prints the current value, keys.txt holds both the user's key and tpuq's, and update gets it."""
    command = add_key_command(FLEET, ENTRY, KEY)
    assert "gcloud compute tpus tpu-vm update my-v4 --zone us-central2-b --project p " \
           "--metadata-from-file ssh-keys=keys.txt" in command
    gcloud = tmp_path / "gcloud"
    gcloud.write_text(f"#!/bin/sh\ncase \"$*\" in *describe*) echo '{OTHERS}';; *) echo \"$*\" > update.args;; esac\n")
    gcloud.chmod(0o755)
    subprocess.run(command, shell=True, check=True, cwd=tmp_path, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert (tmp_path / "keys.txt").read_text().splitlines() == [OTHERS, KEY]
    assert "update my-v4" in (tmp_path / "update.args").read_text()


@pytest.mark.parametrize("metadata, installed", [
    (KEY, True),
    (f"{OTHERS}\n{KEY}\n", True),
    ("tpuq:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExecutor", True),  # no comment
    ("tpuq:ssh-ed25519 AAAAdifferent tpuq-executor", False),
    (OTHERS, False),
])
def test_key_installed(metadata, installed):
    assert key_installed(metadata, "tpuq", KEY.partition(":")[2]) is installed


@pytest.mark.parametrize("entry, words", [
    ({"id": "m", "type": "v4-8", "zones": ["us-central2-b", "us-central2-a"], "existing": "n"}, "exactly one zone"),
    ({"id": "m", "type": "v4-8", "zone": "us-central2-b", "existing": "My_Node"}, "not a TPU node id"),
])
def test_existing_entries_are_validated(entry, words):
    with pytest.raises(ValueError, match=words):
        FleetFile.model_validate({"name": "f", "project": "p", "tpus": [entry]})
