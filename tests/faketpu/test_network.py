"""Endpoints and guest attributes as the Cloud TPU API reports them, and sshd only where the client can reach it.

A node's `networkEndpoints[]` carry a distinct internal `ipAddress`, an `accessConfig.externalIp` only with
`enableExternalIps`, and `port: 8470` (the TPU runtime's). sshd answers on port 22 of the one address the
SSH client's network position reaches (scenario `network.ssh_reachable`), so a client that reads the wrong
field is refused. Host keys appear in guest attributes once the hosts are up (after `delays.host_keys`).
"""

from __future__ import annotations

import socket

import paramiko
import pytest
import requests
import yaml
from google.api_core import exceptions
from google.cloud import tpu_v2

from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.hosts import SSH_PORT
from tpuq_dev.faketpu.server import FakeTpuServer

from .conftest import FAST_SCENARIO, FAST_TIME_SCALE, ZONE, manual_clock_server, qr_request, qr_state, ssh_run, tpu_client, wait_until


def _active_node(server_url: str, project: str, ssh_key, qr_id: str, accelerator="v4-8", external_ips=True,
                 advance=None):
    client = tpu_client(server_url)
    parent = f"projects/{project}/locations/{ZONE}"
    client.create_queued_resource(request=qr_request(project, ZONE, qr_id, f"{qr_id}-node", accelerator,
                                                     ssh_metadata=ssh_key.metadata, external_ips=external_ips))
    if advance:
        advance()
    wait_until(lambda: qr_state(client, f"{parent}/queuedResources/{qr_id}") == "ACTIVE", timeout=30, what="ACTIVE")
    return client.get_node(name=f"{parent}/nodes/{qr_id}-node")


def _refused(address: str, port: int = SSH_PORT) -> bool:
    try:
        with socket.create_connection((address, port), timeout=3):
            return False
    except ConnectionRefusedError:
        return True


def test_endpoints_are_internal_and_external_addresses_with_the_runtime_port(fast_server, ssh_key, project):
    node = _active_node(fast_server.url, project, ssh_key, "both", "v4-32")
    endpoints = list(node.network_endpoints)
    internal = [e.ip_address for e in endpoints]
    external = [e.access_config.external_ip for e in endpoints]
    assert all(external) and not set(internal) & set(external) and len(set(internal + external)) == 8
    assert {e.port for e in endpoints} == {8470}
    for e in endpoints:
        # In the VPC (the default position): SSH on the internal address, port 22; the external address and
        # the runtime port serve nothing, so reading either wrong field fails.
        assert ssh_run(e.ip_address, SSH_PORT, ssh_key, "echo ok") == "ok\n"
        assert _refused(e.access_config.external_ip)
        assert _refused(e.ip_address, e.port)


def test_no_external_ip_unless_the_node_asks_for_one(fast_server, ssh_key, project):
    node = _active_node(fast_server.url, project, ssh_key, "private", external_ips=False)
    (endpoint,) = node.network_endpoints
    assert endpoint.ip_address and not endpoint.access_config.external_ip
    body = requests.get(f"{fast_server.url}/v2/{node.name}", timeout=10).json()
    assert "accessConfig" not in body["networkEndpoints"][0]


def test_from_the_internet_only_the_external_address_answers(tmp_path, ssh_key, project):
    with FakeTpuServer(FAST_SCENARIO, FAST_TIME_SCALE, tmp_path, ssh_reachable="external") as server:
        node = _active_node(server.url, project, ssh_key, "direct")
        (endpoint,) = node.network_endpoints
        assert ssh_run(endpoint.access_config.external_ip, SSH_PORT, ssh_key, "echo ok") == "ok\n"
        assert _refused(endpoint.ip_address)


def _presented_key(address: str, key_type: str) -> str:
    """The host key sshd presents when the client asks for `key_type`."""
    transport = paramiko.Transport((address, SSH_PORT))
    try:
        transport.get_security_options().key_types = [key_type]
        transport.start_client(timeout=10)
        return transport.get_remote_server_key().get_base64()
    finally:
        transport.close()


@pytest.fixture
def slow_keys_server(tmp_path):
    server, clock = manual_clock_server(tmp_path, host_keys=90)
    with server:
        yield server, clock


def test_guest_attributes_publish_each_hosts_real_keys_once_it_is_up(slow_keys_server, ssh_key, project):
    server, clock = slow_keys_server
    client = tpu_client(server.url)
    node = _active_node(server.url, project, ssh_key, "keys", "v4-32", advance=lambda: clock.advance(606))
    query = tpu_v2.GetGuestAttributesRequest(name=node.name, query_path="hostkeys/")
    # ACTIVE, sshd answering, but the guest agent has not published yet: a client must wait.
    with pytest.raises(exceptions.NotFound, match="Guest Attribute"):
        client.get_guest_attributes(request=query)

    clock.advance(90)
    per_worker = client.get_guest_attributes(request=query).guest_attributes
    assert len(per_worker) == 4  # one per worker, in worker order: the response names no worker
    for endpoint, attributes in zip(node.network_endpoints, per_worker):
        items = {i.key: i for i in attributes.query_value.items}
        assert set(items) == {"ssh-ed25519", "ecdsa-sha2-nistp256"}
        assert {i.namespace for i in items.values()} == {"hostkeys"}
        for algorithm, item in items.items():
            assert item.value == _presented_key(endpoint.ip_address, algorithm)  # base64 only, as the agent writes

    one = client.get_guest_attributes(request=tpu_v2.GetGuestAttributesRequest(
        name=node.name, query_path="hostkeys/ssh-ed25519", worker_ids=["2"])).guest_attributes
    assert [[i.key for i in a.query_value.items] for a in one] == [["ssh-ed25519"]]
    assert one[0].query_value.items[0].value == {i.key: i.value for i in per_worker[2].query_value.items}["ssh-ed25519"]

    # gcloud alpha uses v2alpha1: same method, same shape.
    alpha = requests.post(f"{server.url}/v2alpha1/{node.name}:getGuestAttributes",
                          json={"queryPath": "hostkeys/"}, timeout=10)
    assert alpha.status_code == 200 and len(alpha.json()["guestAttributes"]) == 4


def test_the_executors_host_key_source_reads_them_through_the_client(slow_keys_server, ssh_key, project):
    from tpuq.executor.pins import GuestAttributeHostKeys

    server, clock = slow_keys_server
    node = _active_node(server.url, project, ssh_key, "exec", "v4-32", advance=lambda: clock.advance(606))
    source = GuestAttributeHostKeys(tpu_client(server.url))
    assert source.published(node.name) == {}  # not yet: a 404, which means "wait"
    clock.advance(90)
    hosts = server.hosts_of(node.name)
    assert source.published(node.name) == {i: f"ssh-ed25519 {h.host_keys()['ssh-ed25519']}"
                                           for i, h in enumerate(hosts)}


def test_a_node_preempted_before_publishing_its_keys_is_not_waited_for(slow_keys_server, ssh_key, project):
    """The chaos soak preempts attempts while they start: the executor must not wait its whole host-key deadline
    (minutes, holding a request thread) for keys a preempted node will never publish."""
    from tpuq.executor.pins import GuestAttributeHostKeys, HostKeysUnavailable

    server, clock = slow_keys_server
    node = _active_node(server.url, project, ssh_key, "gone", "v4-8", advance=lambda: clock.advance(606))
    source = GuestAttributeHostKeys(tpu_client(server.url))
    assert source.published(node.name) == {}  # not yet, and the node lives: wait
    FakeTpuControl(server.url).preempt(node.name)
    with pytest.raises(HostKeysUnavailable, match="PREEMPTED"):
        source.published(node.name)


def test_the_dev_stack_puts_ssh_where_its_fleets_executor_would_reach_it(tmp_path):
    from tpuq_dev.devstack.stack import DEMO_DIR, DevStack

    fleet = yaml.safe_load((DEMO_DIR / "fleet.yaml").read_text())
    assert DevStack(state_dir=tmp_path, fleet_file=DEMO_DIR / "fleet.yaml")._ssh_reachable() == [
        "--ssh-reachable", "internal"]  # the demo's fleet: vpc, the default
    for transport, reachable in (("iap", "internal"), ("direct", "external")):
        path = tmp_path / f"{transport}.yaml"
        path.write_text(yaml.safe_dump({**fleet, "ssh_transport": transport}))
        assert DevStack(state_dir=tmp_path, fleet_file=path)._ssh_reachable() == ["--ssh-reachable", reachable]
