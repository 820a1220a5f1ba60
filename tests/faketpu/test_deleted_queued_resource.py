"""A preempted slice's queued resource, deleted by the janitor, reads NOT_FOUND for ever after: in the capacity
model, through the fake's HTTP face, and through the janitor's own reader (None, never an error). The chaos soak's
seed-17 stall logged the janitor failing to read such a queued resource minute after minute; neither the fake nor
tpuq's error mapping answers anything but NOT_FOUND for it (the real API's answer for a deleted resource)."""

from __future__ import annotations

import random

import pytest
from google.cloud import tpu_v2

from tpuq_dev.capacitymodel.clock import ManualClock
from tpuq_dev.capacitymodel.errors import ApiError
from tpuq_dev.capacitymodel.model import FakeTpuWorld, NodeState, QrState
from tpuq_dev.capacitymodel.scenario import parse_scenario
from tpuq.contracts.fleet import FleetFile
from tpuq.janitor.deleter import DeleteAdapter
from tpuq_dev.faketpu.server import FakeTpuServer

from .conftest import qr_request, tpu_client

P, Z = "tpuq-local", "us-central2-b"
QR_ID = "tpuq-r-chaos-17-0001-1-us-central2-b"
QR = f"projects/{P}/locations/{Z}/queuedResources/{QR_ID}"
NODE = f"projects/{P}/locations/{Z}/nodes/{QR_ID}"
# The chaos soak's scenario (benchmarks/chaos.py).
SCENARIO = {"seed": 1, "zones": {Z: {"quota": {"v4": {"spot": 512}}}},
            "delays": {"accepted": 1, "waiting": 5, "provisioning": 60, "suspending": 10, "deleting": 5}}


def _suspended_world() -> tuple[FakeTpuWorld, ManualClock]:
    clock = ManualClock()
    w = FakeTpuWorld(parse_scenario(SCENARIO), clock, random.Random(17))
    body = {"tpu": {"nodeSpec": [{"parent": f"projects/{P}/locations/{Z}", "nodeId": QR_ID,
                                  "node": {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}}]},
            "spot": {}}
    w.create_queued_resource(P, Z, QR_ID, body, "req-1")
    clock.advance(1 + 5 + 60)
    assert w.get_queued_resource(P, Z, QR_ID).state == QrState.ACTIVE
    w.preempt_node(P, Z, QR_ID)  # the chaos injector's preemption (POST /_fake/preempt)
    assert w.get_queued_resource(P, Z, QR_ID).state == QrState.SUSPENDING
    clock.advance(10)
    assert w.get_queued_resource(P, Z, QR_ID).state == QrState.SUSPENDED
    assert w.get_node(P, Z, QR_ID).state == NodeState.PREEMPTED
    return w, clock


def _not_found(call) -> None:
    with pytest.raises(ApiError) as err:
        call()
    assert err.value.rpc.status == "NOT_FOUND"


@pytest.mark.parametrize("node_deleted_first", [False, True])
def test_a_deleted_suspended_queued_resource_reads_not_found_for_ever(node_deleted_first):
    w, clock = _suspended_world()
    if node_deleted_first:  # an attempt-event handler deleting the PREEMPTED node on its own
        w.delete_node(P, Z, QR_ID)
    w.delete_queued_resource(P, Z, QR_ID, force=True)  # the janitor's "dead (SUSPENDED)"
    w.delete_queued_resource(P, Z, QR_ID, force=True)  # a redelivered delete while DELETING
    assert w.get_queued_resource(P, Z, QR_ID).state == QrState.DELETING
    clock.advance(5)
    for _ in range(3):  # minutes, then hours later
        _not_found(lambda: w.get_queued_resource(P, Z, QR_ID))
        _not_found(lambda: w.get_node(P, Z, QR_ID))
        _not_found(lambda: w.delete_queued_resource(P, Z, QR_ID, force=True))
        clock.advance(3600)
    assert w.next_due() is None and not w.queued_resources and not w.nodes


def test_the_janitor_reads_a_deleted_suspended_queued_resource_as_gone(tmp_path):
    clock = ManualClock()
    fleet = FleetFile.model_validate({"name": "chaos", "project": P, "owner_prefix": "tpuq",
                                      "tpus": [{"id": "single", "type": "v4-8", "zones": [Z]}]})
    with FakeTpuServer(SCENARIO, clock=clock, state_dir=tmp_path, worker_hosts=False) as server:
        client = tpu_client(server.url)
        client.create_queued_resource(request=qr_request(P, Z, QR_ID, QR_ID, "v4-8")).result(timeout=10)
        clock.advance(1 + 5 + 60)
        server.world.preempt_node(P, Z, QR_ID)
        clock.advance(10)
        reader = DeleteAdapter(client, fleet)
        assert tpu_v2.QueuedResource.pb(reader.read(QR)).state.state == tpu_v2.QueuedResourceState.State.SUSPENDED
        client.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=QR, force=True))
        clock.advance(5)
        assert reader.read_all_safely([QR, NODE]) == {QR: None, NODE: None}  # gone: not an error
