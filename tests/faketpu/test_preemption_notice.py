"""The fake's preemption with a notice, as a spot TPU VM gets it: every host's metadata server says preempted and
TERMINATE_ON_HOST_MAINTENANCE first, the node goes PREEMPTED and its hosts stop only after the notice. And a device
held on one worker, as a previous job's leftover process holds it."""

from __future__ import annotations

import time

import pytest
from google.cloud import tpu_v2
from paramiko.ssh_exception import NoValidConnectionsError

from tpuq_dev.faketpu.control import FakeTpuControl, FakeTpuControlError
from tpuq_dev.faketpu.hosts import SSH_PORT

from .conftest import ZONE, qr_request, qr_state, ssh_run, tpu_client, wait_until

GET = "curl -sf -H 'Metadata-Flavor: Google' http://metadata.google.internal/computeMetadata/v1/instance/"


@pytest.fixture
def ready_node(fast_server, ssh_key, project):
    client = tpu_client(fast_server.url)
    client.create_queued_resource(request=qr_request(project, ZONE, "qr", "n", "v4-16", ssh_metadata=ssh_key.metadata))
    qr_name = f"projects/{project}/locations/{ZONE}/queuedResources/qr"
    wait_until(lambda: qr_state(client, qr_name) == "ACTIVE", what="ACTIVE")
    node_name = f"projects/{project}/locations/{ZONE}/nodes/n"
    yield client, node_name, [(e.ip_address, SSH_PORT) for e in client.get_node(name=node_name).network_endpoints]
    client.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=qr_name, force=True))


def test_preemption_with_a_notice_warns_every_host_then_stops_them(fast_server, ready_node, ssh_key):
    client, node_name, hosts = ready_node
    assert [ssh_run(a, p, ssh_key, GET + "preempted") for a, p in hosts] == ["FALSE", "FALSE"]
    assert ssh_run(*hosts[1], ssh_key, GET + "attributes/agent-worker-number") == "1"
    assert ssh_run(*hosts[1], ssh_key, GET + "attributes/accelerator-type") == "v4-16"

    control = FakeTpuControl(fast_server.url)
    given = time.monotonic()
    control.preempt(node_name, notice=3)
    for address, port in hosts:  # during the notice: still READY, still serving, and warned
        assert ssh_run(address, port, ssh_key, GET + "preempted") == "TRUE"
        assert ssh_run(address, port, ssh_key, GET + "maintenance-event") == "TERMINATE_ON_HOST_MAINTENANCE"
    assert client.get_node(name=node_name).state.name == "READY"
    wait_until(lambda: client.get_node(name=node_name).state.name == "PREEMPTED", timeout=20, what="PREEMPTED")
    assert time.monotonic() - given >= 3
    for address, port in hosts:
        with pytest.raises(NoValidConnectionsError):
            ssh_run(address, port, ssh_key, "true", timeout=3)


def test_a_notice_for_a_node_not_ready_is_refused(fast_server, ready_node):
    _, node_name, _ = ready_node
    control = FakeTpuControl(fast_server.url)
    control.preempt(node_name)
    with pytest.raises(FakeTpuControlError, match="PREEMPTED, not READY"):
        control.preempt(node_name, notice=30)


def test_a_held_device_is_seen_held_on_its_worker_only(fast_server, ready_node, ssh_key):
    _, node_name, hosts = ready_node
    control = FakeTpuControl(fast_server.url)
    held = control.hold_device(node_name, 1)
    assert held["device"] == "/dev/vfio/0" and held["user"] == ssh_key.user
    holders = ("for p in /proc/[0-9]*; do for f in $p/fd/*; do case $(readlink $f) in /dev/vfio/*|/dev/accel*) "
               "echo ${p#/proc/} $(readlink $f);; esac; done; done")
    assert ssh_run(*hosts[1], ssh_key, holders) == f"{held['pid']} /dev/vfio/0\n"  # seen by the login user
    assert ssh_run(*hosts[0], ssh_key, holders) == ""
    time.sleep(0.5)
    assert ssh_run(*hosts[1], ssh_key, holders) == f"{held['pid']} /dev/vfio/0\n"  # it outlives the call
    with pytest.raises(FakeTpuControlError, match="worker 2"):
        control.hold_device(node_name, 2)
    with pytest.raises(FakeTpuControlError, match="/dev/vfio/9"):
        control.hold_device(node_name, 0, "/dev/vfio/9")
