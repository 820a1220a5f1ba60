"""The janitor and multislice queued resources (issue 37, "Ownership"): a gang's slices go together, never one."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from tpuq.janitor import decide as d
from tests.janitor.factories import fleet

from .test_decide import NOW, tpu

GANG = "projects/p/locations/z/queuedResources/tq-r1-z"


def slice_of(index: int, state: str, idle_for: float | None = None) -> d.TpuDoc:
    return replace(tpu(f"tq-r1-z-{index}", state, idle_for), queued_resource=GANG, slice_index=index, slice_count=2)


def test_a_gang_is_deleted_only_when_every_slice_may_go():
    f = fleet(idle=60)
    assert d.decide_idle([slice_of(0, "idle", 120), slice_of(1, "busy")], f, NOW) == []
    assert d.decide_idle([slice_of(0, "idle", 120), slice_of(1, "idle", 30)], f, NOW) == []
    got = d.decide_idle([slice_of(0, "idle", 120), slice_of(1, "idle", 61), tpu("single", "idle", 61)], f, NOW)
    assert sorted(t.id for t in got) == ["single", "tq-r1-z-0", "tq-r1-z-1"]
    # One queued resource, one delete (the janitor dedupes deletes by resource name).
    assert len({t.queued_resource for t in got if t.slice_count > 1}) == 1


def test_a_quarantined_slice_waits_for_its_busy_sibling():
    f = fleet(idle=60)
    dirty = replace(slice_of(0, "idle", 1), quarantined=True)
    assert d.decide_idle([dirty, slice_of(1, "busy")], f, NOW) == []
    assert [t.id for t in d.decide_idle([dirty, slice_of(1, "idle", 1)], f, NOW)] == []  # sibling not expired
    sick_too = replace(slice_of(1, "idle", 1), quarantined=True)
    assert sorted(t.id for t in d.decide_idle([dirty, sick_too], f, NOW)) == ["tq-r1-z-0", "tq-r1-z-1"]


def test_the_nodes_of_a_multislice_request_are_known_by_their_prefix():
    listed = {"name": GANG, "tpu": {"nodeSpec": [{"parent": "projects/p/locations/z",
                                                  "multisliceParams": {"nodeCount": 3, "nodeIdPrefix": "tq-r1-z"}}]}}
    assert d._node_ids_of(listed) == ["tq-r1-z-0", "tq-r1-z-1", "tq-r1-z-2"]
    no_prefix = {"name": GANG, "tpu": {"nodeSpec": [{"multisliceParams": {"nodeCount": 2}}]}}
    assert d._node_ids_of(no_prefix) == ["tq-r1-z-0", "tq-r1-z-1"]
    assert d.node_id_of(listed) == "tq-r1-z-0"


def _create_gang(s, request_id: str, zone: str, nodes: int = 2) -> str:
    """A multislice queued resource as the claimer makes it, on the fake: owner labels on its one node spec."""
    from google.cloud import tpu_v2

    from tpuq.claimer.model import queued_resource_id
    from tpuq.runtime.ownership import owner_labels

    qr_id = queued_resource_id(s.fleet.owner_prefix, request_id, zone)
    parent = f"projects/{s.fleet.project}/locations/{zone}"
    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base",
                       labels=owner_labels(s.fleet, request_id), scheduling_config=tpu_v2.SchedulingConfig(spot=True))
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node=node, multislice_params=(
        tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(node_count=nodes, node_id_prefix=qr_id)))
    s.tpu.create_queued_resource(request=tpu_v2.CreateQueuedResourceRequest(
        parent=parent, queued_resource_id=qr_id, queued_resource=tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), spot=tpu_v2.QueuedResource.Spot())))
    return f"{parent}/queuedResources/{qr_id}"


def _record_slices(s, qr: str, states: list[str]) -> list[str]:
    from datetime import datetime, timezone

    ids = []
    for i, state in enumerate(states):
        tpu_id = s.record_tpu(qr, state=state, idle_since=datetime(2020, 1, 1, tzinfo=timezone.utc))
        slice_id = f"{tpu_id}-{i}"
        doc = s.tpu_doc(tpu_id)
        s.db.collection("tpus").document(tpu_id).delete()
        s.db.collection("tpus").document(slice_id).set({**doc, "short": slice_id,
                                                        "name": doc["name"] + f"-{i}", "slice_index": i,
                                                        "slice_count": len(states)})
        ids.append(slice_id)
    return ids


def test_an_idle_gang_is_deleted_once_as_one_request_and_a_busy_slice_keeps_it(janitor_stack):
    """On a quiet tick, which reads idle TPUs only: the busy slice (a single-slice job on a slice of a gang's
    request) is read from the store and keeps the request; the all-idle gang is deleted once, read once."""
    from tests.janitor.conftest import ACTIVE_AFTER, WIN_ZONE
    from tests.janitor.test_quiet_tick import Ticker

    s = janitor_stack
    t = Ticker(s)
    kept = _create_gang(s, "r30", WIN_ZONE)
    gone = _create_gang(s, "r31", WIN_ZONE, nodes=4)
    t.advance(ACTIVE_AFTER + 1)
    busy_one = _record_slices(s, kept, ["busy", "busy"])
    idle_four = _record_slices(s, gone, ["busy"] * 4)
    t.tick()  # the full sweep: nothing to do
    for tpu_id in [busy_one[0], *idle_four]:  # then their jobs end, long ago
        s.write_tpu(tpu_id, {"state": "idle", "idle_since": t.now - timedelta(days=1)})
    t.advance(60)
    s.control.clear_calls()
    t.tick()  # a quiet tick
    assert s.deleted_ids() == [gone.rsplit("/", 1)[-1]]  # once, the whole request; never the busy slice's
    assert {s.tpu_doc(i)["state"] for i in idle_four} <= {"deleting", "gone"}
    assert [s.tpu_doc(i)["state"] for i in busy_one] == ["idle", "busy"]
    # One read of the request before its delete, not one per slice (4).
    reads = [c for c in s.control.calls(method="GET")
             if c["path"].endswith("/queuedResources/" + gone.rsplit("/", 1)[-1])]
    assert len(reads) == 1, reads


def _owned_gang_record(s, request_id: str, zone: str) -> str:
    """A 2-slice racer as the claimer makes it: on the fake, and its queued_resources record."""
    from datetime import datetime, timezone

    from tpuq.claimer.model import QrRecord
    from tpuq.claimer.statestore import qr_to_doc

    name = _create_gang(s, request_id, zone)
    qr_id, now = name.rsplit("/", 1)[1], datetime.now(timezone.utc)
    s.db.collection("queued_resources").document(qr_id).set(qr_to_doc(QrRecord(
        qr_id=qr_id, fleet=s.fleet.name, project=s.fleet.project, request_id=request_id, entry_id="v4pool", zone=zone,
        type="v4-8", spot=True, generation=0, state="ACCEPTED", created_at=now, updated_at=now, slices=2)))
    return name


def test_a_surplus_gang_with_a_busy_slice_is_kept_and_an_idle_one_deleted_whole(janitor_stack):
    """A gang request that won twice: the later winner is surplus (no job pending), deleted whole through every
    slice's guard, but not while any of its slices runs a job."""
    from tests.janitor.conftest import ACTIVE_AFTER, THIRD_ZONE, WIN_ZONE

    s = janitor_stack
    s.record_request("r40", count=1)
    winner = _owned_gang_record(s, "r40", WIN_ZONE)
    late = _owned_gang_record(s, "r40", THIRD_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    _record_slices(s, winner, ["busy", "busy"])
    late_slices = _record_slices(s, late, ["idle", "busy"])  # a single-slice job took its slice 1
    s.fleet_event("ACTIVE", late, "r40")
    assert s.deletes() == []
    s.write_tpu(late_slices[1], {"state": "idle", "job_id": None})
    s.fleet_event("ACTIVE", late, "r40")
    assert s.deleted_ids() == [late.rsplit("/", 1)[-1]]
    assert {s.tpu_doc(i)["state"] for i in late_slices} <= {"deleting", "gone"}


def test_a_surplus_gang_not_yet_recorded_is_recorded_deleting_so_no_job_is_put_on_it(janitor_stack):
    """Both zones granted a gang request and the scheduler has recorded neither: the later one is surplus. Its
    slices are recorded `deleting` before the delete goes out, so the scheduler's records of them keep that state
    and assign no job there (one was, and then lost it to the delete; the race's other gang went too)."""
    from tests.janitor.conftest import ACTIVE_AFTER, THIRD_ZONE, WIN_ZONE

    s = janitor_stack
    s.record_request("r41", count=1)
    first = _owned_gang_record(s, "r41", WIN_ZONE)
    second = _owned_gang_record(s, "r41", THIRD_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    s.fleet_event("ACTIVE", second, "r41")
    [deleted] = s.deleted_ids()
    kept = first if deleted == second.rsplit("/", 1)[1] else second
    slices = [f"{deleted}-{i}" for i in range(2)]
    assert [s.tpu_doc(i).get("state") for i in slices] == ["deleting", "deleting"]
    assert {s.tpu_doc(i).get("queued_resource") for i in slices} == {
        (first if kept == second else second)}
    s.fleet_event("ACTIVE", kept, "r41")
    assert s.deleted_ids() == [deleted]  # the other gang stays
