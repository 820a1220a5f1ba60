"""Multislice queued resources on the fake: nodeCount slices <prefix>-<i>, gang provisioning, quota for all slices,
one slice's preemption suspending the whole request, a forced delete removing every node (MULTISLICE.md)."""

from __future__ import annotations

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2
from paramiko.ssh_exception import NoValidConnectionsError

from tpuq_dev.capacitymodel.clock import ManualClock
from tpuq_dev.capacitymodel.errors import ApiError
from tpuq_dev.capacitymodel.model import NodeState, QrState
from tpuq_dev.capacitymodel.render import render_queued_resource
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.hosts import SSH_PORT
from tpuq_dev.faketpu.server import FakeTpuServer

from .conftest import FAST_SCENARIO, ZONE, qr_request, qr_state, ssh_run, tpu_client, wait_until
from .test_api_client import manual_server  # noqa: F401 - the fixture: a server on a manual clock
from .test_model import P, Z, body, world

GET_TPU_ENV = "curl -sf -H 'Metadata-Flavor: Google' http://metadata.google.internal/computeMetadata/v1/instance/attributes/tpu-env"


def multislice_body(count=2, prefix="ms", accelerator="v4-32", field="multisliceParams") -> dict:
    b = body(accelerator=accelerator)
    spec = b["tpu"]["nodeSpec"][0]
    del spec["nodeId"]
    spec[field] = {"nodeCount": count, **({"nodeIdPrefix": prefix} if prefix else {})}
    return b


def multislice_request(project: str, qr_id: str, prefix: str, count: int = 2, ssh_metadata: str = "",
                       accelerator: str = "v4-32") -> tpu_v2.CreateQueuedResourceRequest:
    parent = f"projects/{project}/locations/{ZONE}"
    node = tpu_v2.Node(accelerator_type=accelerator, runtime_version="tpu-ubuntu2204-base",
                       metadata={"ssh-keys": ssh_metadata} if ssh_metadata else {},
                       network_config=tpu_v2.NetworkConfig(enable_external_ips=False))
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=parent, node=node,
        multislice_params=tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(node_count=count, node_id_prefix=prefix))
    qr = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), spot=tpu_v2.QueuedResource.Spot())
    return tpu_v2.CreateQueuedResourceRequest(parent=parent, queued_resource_id=qr_id, queued_resource=qr)


# -- the state machine alone ---------------------------------------------------------------


def test_two_slices_are_made_together_named_prefix_dash_index_and_the_request_echoes_its_params():
    w, clock = world(**{Z: {"quota": {"v4": {"spot": 64}}}})
    w.create_queued_resource(P, Z, "qr1", multislice_body(prefix="np"), None)
    clock.advance(6)
    qr = w.get_queued_resource(P, Z, "qr1")
    assert qr.state == QrState.PROVISIONING
    assert sorted(n.node_id for n in w.nodes.values()) == ["np-0", "np-1"]
    assert {n.state for n in w.nodes.values()} == {NodeState.CREATING}
    clock.advance(100)
    assert state_of(w) == QrState.ACTIVE and all(len(n.endpoints) == 4 for n in w.nodes.values())
    spec = render_queued_resource(w, w.get_queued_resource(P, Z, "qr1"))["tpu"]["nodeSpec"][0]
    assert spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "np"} and "nodeId" not in spec
    v2alpha1 = render_queued_resource(w, w.get_queued_resource(P, Z, "qr1"), "v2alpha1")["tpu"]["nodeSpec"][0]
    assert v2alpha1["multiNodeParams"] == {"nodeCount": 2, "nodeIdPrefix": "np"}


def state_of(w, qr_id="qr1") -> QrState:
    return w.get_queued_resource(P, Z, qr_id).state


def test_without_a_prefix_the_queued_resource_id_is_the_prefix():
    w, clock = world(**{Z: {"quota": {"v4": {"spot": 64}}}})
    w.create_queued_resource(P, Z, "train", multislice_body(prefix=None, count=3, accelerator="v4-8"), None)
    clock.advance(6)
    w.advance()
    assert sorted(n.node_id for n in w.nodes.values()) == ["train-0", "train-1", "train-2"]


@pytest.mark.parametrize("change, field", [
    (lambda b: b["tpu"]["nodeSpec"][0].update(nodeId="n1"), "multislice_params"),  # "instead of node_id"
    (lambda b: b["tpu"]["nodeSpec"][0]["multisliceParams"].update(nodeCount=1), "node_count"),  # "needs to be > 1"
    (lambda b: b["tpu"]["nodeSpec"][0]["multisliceParams"].pop("nodeCount"), "node_count"),  # "Required"
    (lambda b: b["tpu"]["nodeSpec"][0]["multisliceParams"].update(nodeIdPrefix="a/b"), "node_id_prefix"),
])
def test_what_the_api_refuses_is_refused_at_create(change, field):
    refused, w = multislice_body(), world()[0]
    change(refused)
    rpc = pytest.raises(ApiError, w.create_queued_resource, P, Z, "qr1", refused, None).value.rpc
    assert rpc.status == "INVALID_ARGUMENT" and rpc.details[0]["fieldViolations"][0]["field"].endswith(field)
    assert w.queued_resources == {}


def test_each_api_version_takes_its_own_name_for_the_message():
    w, _ = world(**{Z: {"quota": {"v4": {"spot": 64}}}})
    with pytest.raises(ApiError, match="Unknown name \"multiNodeParams\""):
        w.create_queued_resource(P, Z, "qr1", multislice_body(field="multiNodeParams"), None, api_version="v2")
    with pytest.raises(ApiError, match="Unknown name \"multisliceParams\""):
        w.create_queued_resource(P, Z, "qr1", multislice_body(), None, api_version="v2alpha1")
    w.create_queued_resource(P, Z, "qr1", multislice_body(field="multiNodeParams"), None, api_version="v2alpha1")


def test_a_slice_name_already_taken_is_a_conflict():
    w, _ = world(**{Z: {"quota": {"v4": {"spot": 64}}}})
    w.create_queued_resource(P, Z, "single", body(node_id="ms-1"), None)
    with pytest.raises(ApiError) as e:
        w.create_queued_resource(P, Z, "qr1", multislice_body(prefix="ms"), None)
    assert e.value.rpc.status == "ALREADY_EXISTS" and "nodes/ms-1" in e.value.rpc.message


def test_quota_counts_every_slice():
    """32 spot v4 chips: one v4-32 (16 chips) passes, two of them (32) pass, three (48) FAIL on quota."""
    w, clock = world(**{Z: {"quota": {"v4": {"spot": 32}}}})
    w.create_queued_resource(P, Z, "three", multislice_body(count=3, prefix="a"), None)
    w.create_queued_resource(P, Z, "two", multislice_body(count=2, prefix="b"), None)
    clock.advance(1)
    three, two = w.get_queued_resource(P, Z, "three"), w.get_queued_resource(P, Z, "two")
    assert three.state == QrState.FAILED and "Quota limit" in three.failed_error.message
    assert "Limit: 32 in zone" in three.failed_error.message
    assert two.state == QrState.WAITING_FOR_RESOURCES and w.quota_used(P, Z, "v4", "spot") == 32


def test_gang_provisioning_waits_until_every_slice_fits_then_makes_them_all():
    """The zone has 40 v4 chips: a 16-chip slice runs; a 2 x 16-chip request (24 would fit one of its slices)
    waits with no node at all, and gets both when the slice is deleted."""
    w, clock = world(**{Z: {"quota": {"v4": {"spot": 128}}, "capacity": {"v4": 40}}})
    w.create_queued_resource(P, Z, "single", body(node_id="one"), None)
    clock.advance(106)
    assert state_of(w, "single") == QrState.ACTIVE
    w.create_queued_resource(P, Z, "qr1", multislice_body(), None)
    clock.advance(1000)
    assert state_of(w) == QrState.WAITING_FOR_RESOURCES
    assert [n.node_id for n in w.nodes.values()] == ["one"]
    assert w.next_due() is None  # nothing frees capacity by itself here
    w.delete_queued_resource(P, Z, "single", force=True)
    freed = clock.now()  # a DELETING node's chips are back in the zone's pool
    clock.advance(5)
    assert state_of(w) == QrState.PROVISIONING
    assert sorted(n.node_id for n in w.nodes.values()) == ["ms-0", "ms-1"]
    assert {n.create_time for n in w.nodes.values()} == {freed}  # both at once, stamped when the chips came back


def test_one_slice_preempted_suspends_the_request_and_every_slice_and_a_forced_delete_removes_all():
    w, clock = world(**{Z: {"quota": {"v4": {"spot": 64}}}})
    w.create_queued_resource(P, Z, "qr1", multislice_body(), None)
    clock.advance(106)
    w.preempt_node(P, Z, "ms-1")
    assert state_of(w) == QrState.SUSPENDING and w.get_queued_resource(P, Z, "qr1").initiator == "SERVICE"
    assert {w.get_node(P, Z, n).state for n in ("ms-0", "ms-1")} == {NodeState.PREEMPTED}
    clock.advance(30)
    assert state_of(w) == QrState.SUSPENDED
    assert w.quota_used(P, Z, "v4", "spot") == 32  # still held until deleted
    w.delete_queued_resource(P, Z, "qr1", force=True)
    clock.advance(5)
    w.advance()
    assert w.nodes == {} and w.queued_resources == {} and w.quota_used(P, Z, "v4", "spot") == 0


def test_a_scenario_preemption_of_one_slice_suspends_the_whole_request():
    w, clock = world({"preemption": {"scripted": [{"after_active": 50, "node_id": "ms-0"}]}},
                     **{Z: {"quota": {"v4": {"spot": 64}}}})
    w.create_queued_resource(P, Z, "qr1", multislice_body(), None)
    clock.advance(106 + 50)
    assert state_of(w) == QrState.SUSPENDING
    assert w.get_queued_resource(P, Z, "qr1").state_since == 156
    assert {w.get_node(P, Z, n).state for n in ("ms-0", "ms-1")} == {NodeState.PREEMPTED}


# -- through google-cloud-tpu, with real worker hosts --------------------------------------------


def test_two_v4_32_slices_through_the_client_eight_workers_that_know_their_slice(manual_server, ssh_key, project):  # noqa: F811
    server, clock = manual_server
    client, control = tpu_client(server.url), FakeTpuControl(server.url)
    parent = f"projects/{project}/locations/{ZONE}"
    qr_name = f"{parent}/queuedResources/ms"
    created = client.create_queued_resource(
        request=multislice_request(project, "ms", "train", ssh_metadata=ssh_key.metadata)).result(timeout=10)
    spec = created.tpu.node_spec[0]
    assert (spec.multislice_params.node_count, spec.multislice_params.node_id_prefix, spec.node_id) == (2, "train", "")
    clock.advance(6)
    assert qr_state(client, qr_name) == "PROVISIONING"
    assert sorted(n.name.rsplit("/", 1)[1] for n in client.list_nodes(parent=parent)) == ["train-0", "train-1"]
    clock.advance(600)
    wait_until(lambda: qr_state(client, qr_name) == "ACTIVE", what="ACTIVE", timeout=60)
    nodes = [client.get_node(name=f"{parent}/nodes/train-{i}") for i in range(2)]
    assert all(n.state.name == "READY" and n.queued_resource == qr_name for n in nodes)
    endpoints = [e for n in nodes for e in n.network_endpoints]
    assert len(endpoints) == 8 and len({e.ip_address for e in endpoints}) == 8
    coordinator = nodes[0].network_endpoints[0].ip_address
    for slice_id, node in enumerate(nodes):
        for worker, endpoint in enumerate(node.network_endpoints):
            env = ssh_run(endpoint.ip_address, SSH_PORT, ssh_key, GET_TPU_ENV)
            assert env == (f"MEGASCALE_COORDINATOR_ADDRESS: '{coordinator}'\nMEGASCALE_NUM_SLICES: '2'\n"
                           f"MEGASCALE_SLICE_ID: '{slice_id}'\n")
            number = ssh_run(endpoint.ip_address, SSH_PORT, ssh_key, GET_TPU_ENV.replace("tpu-env", "agent-worker-number"))
            assert number == str(worker)

    control.preempt(f"{parent}/nodes/train-1")
    qr = client.get_queued_resource(name=qr_name)
    assert qr.state.state.name == "SUSPENDING" and qr.state.state_initiator.name == "SERVICE"
    assert [client.get_node(name=n.name).state.name for n in nodes] == ["PREEMPTED", "PREEMPTED"]
    for endpoint in endpoints:  # every slice's workers are gone, not only the preempted slice's
        with pytest.raises(NoValidConnectionsError):
            ssh_run(endpoint.ip_address, SSH_PORT, ssh_key, "true", timeout=3)
    clock.advance(30)
    assert qr_state(client, qr_name) == "SUSPENDED"

    op = client.delete_queued_resource(request={"name": qr_name, "force": True})
    clock.advance(5)
    op.result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=qr_name)
    assert list(client.list_nodes(parent=parent)) == []
    deletes = [c for c in control.calls() if c["method"] == "DELETE"]
    assert [c["path"] for c in deletes] == [f"/v2/{qr_name}"]  # one call deletes every slice


def test_quota_refusal_counts_node_count_times_the_chips(fast_server, project):
    """ZONE's spot v4 quota is 256 chips: 8 x v4-64 (32 chips each) fit, 9 do not."""
    client = tpu_client(fast_server.url)
    name = f"projects/{project}/locations/{ZONE}/queuedResources/big"
    client.create_queued_resource(request=multislice_request(project, "big", "big", 9, accelerator="v4-64"))
    wait_until(lambda: qr_state(client, name) == "FAILED", what="FAILED on quota")
    error = client.get_queued_resource(name=name).state.failed_data.error
    assert error.code == 8 and "Quota limit 'TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI'" in error.message


def test_not_enough_capacity_for_every_slice_gives_none_through_the_client(tmp_path, project):
    """40 v4 chips in the zone and a v4-32 (16) running: two more v4-32 slices (32) wait with no node; one
    single v4-32 would have fitted. Deleting the running slice lets both come at once."""
    scenario = {**FAST_SCENARIO, "zones": {ZONE: {"quota": {"v4": {"spot": 256}}, "capacity": {"v4": 40}}}}
    clock = ManualClock()
    with FakeTpuServer(scenario, state_dir=tmp_path, clock=clock, worker_hosts=False) as server:
        client = tpu_client(server.url)
        parent = f"projects/{project}/locations/{ZONE}"
        client.create_queued_resource(request=qr_request(project, ZONE, "one", "one-node")).result(timeout=10)
        clock.advance(606)
        assert qr_state(client, f"{parent}/queuedResources/one") == "ACTIVE"
        client.create_queued_resource(request=multislice_request(project, "ms", "ms")).result(timeout=10)
        clock.advance(3600)
        assert qr_state(client, f"{parent}/queuedResources/ms") == "WAITING_FOR_RESOURCES"
        assert [n.name.rsplit("/", 1)[1] for n in client.list_nodes(parent=parent)] == ["one-node"]
        client.delete_queued_resource(request={"name": f"{parent}/queuedResources/one", "force": True})
        clock.advance(6)
        assert qr_state(client, f"{parent}/queuedResources/ms") == "PROVISIONING"
        assert sorted(n.name.rsplit("/", 1)[1] for n in client.list_nodes(parent=parent)) == ["ms-0", "ms-1"]
        clock.advance(600)
        assert qr_state(client, f"{parent}/queuedResources/ms") == "ACTIVE"
