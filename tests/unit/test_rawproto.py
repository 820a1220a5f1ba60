"""tpuq.runtime.rawproto reads typed resources through their protobuf: each answer must be the one proto-plus's own
attributes give (the path every stand-in takes) and, where the JSON carries the field, the REST JSON's."""

import json

import pytest
from google.cloud import tpu_v2

from tpuq.janitor.decide import is_queued_resource, state_of
from tpuq.runtime.ownership import name_and_labels
from tpuq.runtime.rawproto import raw_message

LABELS = {"tpuq-owner": "tpuq", "tpuq-fleet": "trc"}
QR_NAME = "projects/p/locations/us-central2-b/queuedResources/tpuq-a1"
NODE_NAME = "projects/p/locations/us-central2-b/nodes/tpuq-a1"


def _qr(state, labels=LABELS):
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent="projects/p/locations/us-central2-b", node_id="tpuq-a1",
                                               node=tpu_v2.Node(labels=labels))
    return tpu_v2.QueuedResource(name=QR_NAME, tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
                                 state=tpu_v2.QueuedResourceState(state=state))


CASES = {
    "active queued resource": _qr(tpu_v2.QueuedResourceState.State.ACTIVE),
    "failed queued resource": _qr(tpu_v2.QueuedResourceState.State.FAILED),
    "queued resource without labels": _qr(tpu_v2.QueuedResourceState.State.WAITING_FOR_RESOURCES, labels={}),
    "queued resource without a node spec": tpu_v2.QueuedResource(name=QR_NAME),
    "ready node": tpu_v2.Node(name=NODE_NAME, labels=LABELS, state=tpu_v2.Node.State.READY),
    "preempted node": tpu_v2.Node(name=NODE_NAME, labels=LABELS, state=tpu_v2.Node.State.PREEMPTED),
    "empty node": tpu_v2.Node(),
    # States the API added after this google-cloud-tpu: parsed, kept as numbers.
    "node in a state unknown here": tpu_v2.Node.from_json(json.dumps(
        {"name": NODE_NAME, "state": 99, "labels": LABELS})),
    "queued resource in a state unknown here": tpu_v2.QueuedResource.from_json(json.dumps(
        {"name": QR_NAME, "state": {"state": 42}, "tpu": {"nodeSpec": [{"nodeId": "tpuq-a1",
                                                                          "node": {"labels": LABELS}}]}})),
}


class _Attributes:
    """The message seen only through proto-plus attribute access (not a message to rawproto)."""

    def __init__(self, message):
        self._message = message

    def __getattr__(self, name):
        return getattr(self._message, name)


@pytest.mark.parametrize("resource", CASES.values(), ids=CASES.keys())
def test_typed_resource_reads_as_its_attributes_and_its_rest_json_do(resource):
    assert raw_message(resource) is not None and raw_message(_Attributes(resource)) is None
    rest = json.loads(type(resource).to_json(resource, use_integers_for_enums=False))  # as the API sends it
    for other in (_Attributes(resource), rest):
        assert name_and_labels(resource) == name_and_labels(other)
        assert is_queued_resource(resource) == is_queued_resource(other)
    assert state_of(resource) == state_of(_Attributes(resource))
    if "state" in rest:
        assert state_of(resource) == state_of(rest)


def test_a_state_unknown_here_reads_as_its_number_and_decides_nothing():
    from tpuq.janitor.decide import decide_dead
    from tpuq.contracts.fleet import FleetFile

    fleet = FleetFile.model_validate({"name": "trc", "project": "p", "owner_prefix": "tpuq",
                                      "tpus": [{"id": "v4", "type": "v4-8", "zones": ["us-central2-b"]}]})
    node = CASES["node in a state unknown here"]
    assert state_of(node) == "99" and state_of(CASES["queued resource in a state unknown here"]) == "42"
    assert decide_dead([node, CASES["queued resource in a state unknown here"]], fleet) == []


def test_dicts_and_stand_ins_are_not_messages():
    assert raw_message({"name": NODE_NAME}) is None
    assert raw_message(object()) is None
