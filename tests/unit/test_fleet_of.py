"""`fleet_of`: a stored fleet document's FleetFile, parsed once per content and never confused with another."""

from __future__ import annotations

from datetime import datetime, timezone

from tpuq.contracts import store
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import fleet_of, load_fleet, save_fleet
from tpuq_dev.inmemory import MemoryFirestore

AT = datetime(2026, 1, 5, tzinfo=timezone.utc)


def _fleet(count: int) -> FleetFile:
    return FleetFile.model_validate({"name": "f", "project": "p", "tpus": [
        {"id": "a", "type": "v4-8", "zones": ["us-central2-b"], "count": count}]})


def test_two_stores_with_the_same_path_and_time_get_their_own_fleet():
    # `tpuq simulate --compare` runs two fleets of one name in one process, both stored at virtual time 0.
    one, two = MemoryFirestore(now=lambda: AT), MemoryFirestore(now=lambda: AT)
    save_fleet(one, _fleet(1), AT)
    save_fleet(two, _fleet(2), AT)
    assert load_fleet(one, "f").tpus[0].count == 1
    assert load_fleet(two, "f").tpus[0].count == 2
    assert load_fleet(one, "f").tpus[0].count == 1


def test_the_same_content_is_parsed_once_and_a_change_is_read():
    db = MemoryFirestore(now=lambda: AT)
    save_fleet(db, _fleet(1), AT)
    assert load_fleet(db, "f") is load_fleet(db, "f")
    save_fleet(db, _fleet(3), AT)
    assert load_fleet(db, "f").tpus[0].count == 3


def test_a_version_that_does_not_match_the_content_is_not_trusted():
    db = MemoryFirestore(now=lambda: AT)
    ref = db.collection(store.FLEETS).document("f")
    ref.set({"name": "f", "fleet": _fleet(1).model_dump(mode="json"), "version": "written-by-hand"})
    assert fleet_of(ref.get()).tpus[0].count == 1
    ref.set({"name": "f", "fleet": _fleet(2).model_dump(mode="json"), "version": "written-by-hand"})
    assert fleet_of(ref.get()).tpus[0].count == 2


def test_a_hand_edit_that_leaves_the_version_is_read_all_the_same():
    db = MemoryFirestore(now=lambda: AT)
    save_fleet(db, _fleet(1), AT)
    assert load_fleet(db, "f").tpus[0].count == 1
    db.collection(store.FLEETS).document("f").update({"fleet": _fleet(5).model_dump(mode="json")})
    assert load_fleet(db, "f").tpus[0].count == 5
