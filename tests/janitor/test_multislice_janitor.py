"""The janitor and multislice queued resources (issue 37, "Ownership"): a gang's slices go together, never one."""

from __future__ import annotations

from dataclasses import replace

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
