"""The fake Cloud TPU through google.cloud.tpu_v2.TpuClient (REST): every state, every error."""

from __future__ import annotations

from pathlib import Path

from paramiko.ssh_exception import NoValidConnectionsError
import pytest
import requests
from google.api_core import exceptions
from google.cloud import tpu_v2

from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.hosts import SSH_PORT

from .conftest import (
    CONTROL_ZONE,
    NO_QUOTA_ZONE,
    STOCKOUT_ZONE,
    WAIT_ZONE,
    ZONE,
    manual_clock_server,
    qr_request,
    qr_state,
    ssh_run,
    tpu_client,
    wait_until,
)


@pytest.fixture
def manual_server(tmp_path):
    """A server on a manual clock: the test decides when each transition happens."""
    server, clock = manual_clock_server(tmp_path, deleting=5)
    with server:
        yield server, clock


def test_every_state_of_a_spot_v4_32_with_real_workers_and_preemption(manual_server, ssh_key, project):
    server, clock = manual_server
    client, control = tpu_client(server.url), FakeTpuControl(server.url)
    parent = f"projects/{project}/locations/{ZONE}"
    qr_name, node_name = f"{parent}/queuedResources/qr1", f"{parent}/nodes/node1"

    created = client.create_queued_resource(
        request=qr_request(project, ZONE, "qr1", "node1", ssh_metadata=ssh_key.metadata)
    ).result(timeout=10)
    assert created.name == qr_name and created.state.state.name == "ACCEPTED"
    assert created.spot is not None and "spot" in tpu_v2.QueuedResource.pb(created).DESCRIPTOR.fields_by_name
    clock.advance(1)
    assert qr_state(client, qr_name) == "WAITING_FOR_RESOURCES"
    clock.advance(5)
    assert qr_state(client, qr_name) == "PROVISIONING"
    assert client.get_node(name=node_name).state.name == "CREATING"
    with pytest.raises(exceptions.BadRequest) as refused:
        client.delete_queued_resource(name=qr_name)
    assert refused.value.message.endswith(": DeleteQueuedResource is not supported when state is PROVISIONING")

    clock.advance(600)  # provisioning done: the server starts 4 sshd hosts, then reports ACTIVE by itself
    wait_until(lambda: qr_state(client, qr_name) == "ACTIVE", what="ACTIVE")
    node = client.get_node(name=node_name)
    assert node.state.name == "READY" and node.health.name == "HEALTHY"
    assert node.accelerator_config.topology == "2x2x4" and node.queued_resource == qr_name
    endpoints = list(node.network_endpoints)
    assert len(endpoints) == 4 and len({e.ip_address for e in endpoints}) == 4
    for worker, endpoint in enumerate(endpoints):
        # Distinct internal and external addresses; `port` is the TPU runtime's, and SSH is on 22.
        assert endpoint.access_config.external_ip not in ("", endpoint.ip_address) and endpoint.port == 8470
        out = ssh_run(endpoint.ip_address, SSH_PORT, ssh_key, f"echo {worker} > /tmp/who; hostname >/dev/null; cat /tmp/who")
        assert out == f"{worker}\n"
    hosts = control.node_info(node_name)["hosts"]
    assert [h["internal_address"] for h in hosts] == [e.ip_address for e in endpoints]
    assert (Path(hosts[2]["tmp_dir"]) / "who").read_text() == "2\n"

    with pytest.raises(exceptions.BadRequest, match="force"):
        client.delete_queued_resource(name=qr_name)  # ACTIVE with nodes, no force

    control.preempt(node_name)
    assert client.get_node(name=node_name).state.name == "PREEMPTED"
    qr = client.get_queued_resource(name=qr_name)
    assert qr.state.state.name == "SUSPENDING" and qr.state.state_initiator.name == "SERVICE"
    for endpoint in endpoints:
        with pytest.raises(NoValidConnectionsError):
            ssh_run(endpoint.ip_address, SSH_PORT, ssh_key, "true", timeout=3)
    clock.advance(30)
    assert qr_state(client, qr_name) == "SUSPENDED"

    op = client.delete_queued_resource(name=qr_name)  # SUSPENDED: no force needed
    assert qr_state(client, qr_name) == "DELETING"
    clock.advance(5)
    op.result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=qr_name)
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=node_name)


def _create_and_wait_failed(url: str, project: str, zone: str, **kwargs):
    """Create a v4-32 spot request in `zone`, wait for FAILED, return its failedData.error."""
    client = tpu_client(url)
    name = f"projects/{project}/locations/{zone}/queuedResources/q"
    client.create_queued_resource(request=qr_request(project, zone, "q", "n", **kwargs)).result(timeout=10)
    wait_until(lambda: qr_state(client, name) == "FAILED", what="FAILED")
    return client.get_queued_resource(name=name).state.failed_data.error


def test_no_quota_fails_with_quota_text(fast_server, project):
    error = _create_and_wait_failed(fast_server.url, project, NO_QUOTA_ZONE)
    assert error.code == 8
    assert error.message == (
        f"Quota limit 'TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 0 in zone {NO_QUOTA_ZONE}."
    )


def test_stockout_fails_with_capacity_text(fast_server, project):
    error = _create_and_wait_failed(fast_server.url, project, STOCKOUT_ZONE)
    assert error.code == 8
    assert error.message.startswith(f'There is no more capacity in the zone "{STOCKOUT_ZONE}"; you can try in another zone')
    assert "[EID: 0x" in error.message
    # FAILED deletes without force, and holds its quota until then.
    control = FakeTpuControl(fast_server.url)
    assert control.quota(project, STOCKOUT_ZONE, "v4", "spot")["used"] == 16
    tpu_client(fast_server.url).delete_queued_resource(
        name=f"projects/{project}/locations/{STOCKOUT_ZONE}/queuedResources/q"
    ).result(timeout=10)
    assert control.quota(project, STOCKOUT_ZONE, "v4", "spot")["used"] == 0


def test_valid_until_duration_expires(fast_server, project):
    error = _create_and_wait_failed(fast_server.url, project, WAIT_ZONE, valid_until_seconds=120)
    assert error.code == 4


def test_capacity_control_and_fail_now(fast_server, project):
    client, control = tpu_client(fast_server.url), FakeTpuControl(fast_server.url)
    parent = f"projects/{project}/locations/{CONTROL_ZONE}"
    control.set_stockout(CONTROL_ZONE, "v4", True, effect="wait")
    try:
        client.create_queued_resource(request=qr_request(project, CONTROL_ZONE, "q1", "n1", "v4-8")).result(timeout=10)
        wait_until(lambda: qr_state(client, f"{parent}/queuedResources/q1") == "WAITING_FOR_RESOURCES", what="waiting")
        control.fail(f"{parent}/queuedResources/q1", "reserved")
        error = client.get_queued_resource(name=f"{parent}/queuedResources/q1").state.failed_data.error
        assert error.code == 9 and error.message.startswith("Insufficient reserved capacity")
    finally:
        control.set_stockout(CONTROL_ZONE, "v4", None)
    client.create_queued_resource(request=qr_request(project, CONTROL_ZONE, "q2", "n2", "v4-8")).result(timeout=10)
    wait_until(lambda: qr_state(client, f"{parent}/queuedResources/q2") == "ACTIVE", what="ACTIVE after stockout ends")
    client.delete_queued_resource(
        request=tpu_v2.DeleteQueuedResourceRequest(name=f"{parent}/queuedResources/q2", force=True)
    ).result(timeout=10)


def test_billing_disabled_refuses_calls_with_reason(fast_server, project):
    client, control = tpu_client(fast_server.url), FakeTpuControl(fast_server.url)
    control.set_billing(False, project)
    control.clear_calls()
    with pytest.raises(exceptions.Forbidden) as e:
        client.create_queued_resource(request=qr_request(project, ZONE, "q", "n"))
    assert e.value.reason == "BILLING_DISABLED"
    assert e.value.message.endswith(
        f": Billing account for project '{project}' is not found. Billing must be enabled for activation of "
        "service(s) 'tpu.googleapis.com' to proceed."
    )
    [call] = [c for c in control.calls(method="POST") if project in c["path"]]
    assert call["status"] == 403 and call["args"]["queuedResourceId"] == "q"
    control.set_billing(True, project)
    client.create_queued_resource(request=qr_request(project, ZONE, "q", "n", "v4-8")).result(timeout=10)


def test_bad_requests(fast_server, project):
    client = tpu_client(fast_server.url)
    parent = f"projects/{project}/locations/{ZONE}"
    # malformed: 400 with a message
    response = requests.post(f"{fast_server.url}/v2/{parent}/queuedResources?queuedResourceId=x", data="{not json")
    assert response.status_code == 400
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT" and response.json()["error"]["message"]
    with pytest.raises(exceptions.BadRequest, match="acceleratorType"):
        client.create_queued_resource(request=qr_request(project, ZONE, "q", "n", "v9-8"))
    # unknown resource: 404
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=f"{parent}/queuedResources/nope")
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{parent}/nodes/nope")
    with pytest.raises(exceptions.NotFound):
        client.delete_queued_resource(name=f"{parent}/queuedResources/nope")
    # duplicate id: 409
    client.create_queued_resource(request=qr_request(project, ZONE, "dup", "dup-node", "v4-8")).result(timeout=10)
    with pytest.raises(exceptions.Conflict):
        client.create_queued_resource(request=qr_request(project, ZONE, "dup", "other-node", "v4-8"))


def test_repeated_request_id_returns_the_same_operation(fast_server, project):
    client, control = tpu_client(fast_server.url), FakeTpuControl(fast_server.url)
    request = qr_request(project, ZONE, "once", "once-node", "v4-8", request_id="4f1c2b8e-0000-4000-8000-000000000001")
    first = client.create_queued_resource(request=request)
    second = client.create_queued_resource(request=request)
    assert first.operation.name == second.operation.name
    assert [q.name for q in client.list_queued_resources(parent=f"projects/{project}/locations/{ZONE}")] == [
        f"projects/{project}/locations/{ZONE}/queuedResources/once"
    ]
    posts = [c for c in control.calls(method="POST") if project in c["path"]]
    assert len(posts) == 2 and all(c["args"]["requestId"] == request.request_id for c in posts)


def test_list_paging_nodes_reset_and_node_delete(fast_server, project):
    client, control = tpu_client(fast_server.url), FakeTpuControl(fast_server.url)
    parent = f"projects/{project}/locations/{ZONE}"
    for i in range(3):
        client.create_queued_resource(request=qr_request(project, ZONE, f"q{i}", f"n{i}", "v4-8", tier="guaranteed"))
    control.clear_calls()
    pager = client.list_queued_resources(request=tpu_v2.ListQueuedResourcesRequest(parent=parent, page_size=2))
    assert [q.name.rsplit("/", 1)[1] for q in pager] == ["q0", "q1", "q2"]
    lists = control.calls(method="GET", path_contains=project)
    assert len(lists) == 2 and lists[1]["args"]["pageToken"]

    wait_until(lambda: all(qr_state(client, f"{parent}/queuedResources/q{i}") == "ACTIVE" for i in range(3)), what="ACTIVE")
    assert sorted(n.name.rsplit("/", 1)[1] for n in client.list_nodes(parent=parent)) == ["n0", "n1", "n2"]

    client.delete_node(name=f"{parent}/nodes/n0").result(timeout=10)
    assert qr_state(client, f"{parent}/queuedResources/q0") == "SUSPENDED"
    client.reset_queued_resource(name=f"{parent}/queuedResources/q0").result(timeout=10)
    wait_until(lambda: qr_state(client, f"{parent}/queuedResources/q0") == "ACTIVE", what="ACTIVE after reset")
    for i in range(3):
        client.delete_queued_resource(
            request=tpu_v2.DeleteQueuedResourceRequest(name=f"{parent}/queuedResources/q{i}", force=True)
        ).result(timeout=10)
    assert list(client.list_queued_resources(parent=parent)) == []


def test_injected_fault_fails_exactly_the_next_matching_call(fast_server, project):
    client, control = tpu_client(fast_server.url), FakeTpuControl(fast_server.url)
    name = f"projects/{project}/locations/{ZONE}/queuedResources/q"
    client.create_queued_resource(request=qr_request(project, ZONE, "q", "n", "v4-8")).result(timeout=10)
    control.inject_fault("UNAVAILABLE", method="GET", path_contains=name)
    with pytest.raises(exceptions.ServiceUnavailable):
        client.get_queued_resource(name=name)
    assert client.get_queued_resource(name=name).name == name


def test_call_log_records_method_path_query_and_clears(fast_server, project):
    client, control = tpu_client(fast_server.url), FakeTpuControl(fast_server.url)
    control.clear_calls()
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=f"projects/{project}/locations/{ZONE}/queuedResources/x")
    [call] = control.calls()
    assert call["method"] == "GET" and call["status"] == 404
    assert call["path"] == f"/v2/projects/{project}/locations/{ZONE}/queuedResources/x"
    assert call["query"] == "$alt=json;enum-encoding=int" and call["time"].endswith("Z")
    control.clear_calls()
    assert control.calls() == []
    assert control.health()["ok"]
