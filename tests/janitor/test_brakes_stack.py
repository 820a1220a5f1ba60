"""The janitor's side of the brakes (in-memory store, fake Cloud TPU API): a paused fleet's idle TPUs, and a drain.

Every message is delivered twice; the fixture checks that the foreign resources in every zone (no labels, our
prefix without our labels, our labels without our prefix) survived every pass."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.janitor.conftest import ACTIVE_AFTER, THIRD_ZONE, WAIT_ZONE, WIN_ZONE
from tpuq.runtime.fleetstore import load_control, request_drain, set_paused


@pytest.mark.fleet(idle_timeout_seconds=3600, entry={"keep_warm_count": 1})
def test_paused_fleet_loses_its_idle_tpus_at_once_and_keeps_the_busy_one(janitor_stack):
    s = janitor_stack
    idle = s.create_owned("p1", WIN_ZONE)
    busy = s.create_owned("p2", THIRD_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    idle_id = s.record_tpu(idle, idle_since=datetime.now(timezone.utc) - timedelta(seconds=5))
    busy_id = s.record_tpu(busy, state="busy")
    s.tick()
    assert s.deletes() == []  # an hour's timeout, and keep_warm_count 1

    set_paused(s.db, s.fleet.name, True, datetime.now(timezone.utc))
    s.tick()
    assert s.deleted_ids() == [idle_id]
    assert s.tpu_doc(idle_id)["state"] in ("deleting", "gone") and s.tpu_doc(busy_id)["state"] == "busy"
    assert s.state(busy) == "ACTIVE"


def test_drain_deletes_everything_owned_waits_out_provisioning_and_records_it_once(janitor_stack):
    s = janitor_stack
    s.record_request("d1", count=1)
    winner = s.create_owned("d1", WIN_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    waiting = s.create_owned("d1", WAIT_ZONE)
    provisioning = s.create_owned("d2", THIRD_ZONE)
    s.advance(10)
    unrecorded = s.create_owned("d3", WIN_ZONE, record=False)  # Firestore never heard of it
    busy_id = s.record_tpu(winner, state="busy")
    owned = [winner, waiting, provisioning, unrecorded]
    assert [s.state(n) for n in owned] == ["ACTIVE", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACCEPTED"]

    request_drain(s.db, s.fleet.name, "drain-1", datetime.now(timezone.utc))
    s.tick()  # twice: the redelivery finds nothing more to delete

    gone = [winner, waiting, unrecorded]
    assert sorted(s.deleted_ids()) == sorted(n.rsplit("/", 1)[-1] for n in gone)  # never PROVISIONING
    assert [s.state(n) for n in owned] == [None, None, "PROVISIONING", None]
    control = load_control(s.db, s.fleet.name)
    assert control.drain_pending and control.paused and sorted(control.drain_deleted) == sorted(gone)
    assert s.tpu_doc(busy_id)["state"] in ("deleting", "gone")

    s.advance(ACTIVE_AFTER)  # it leaves PROVISIONING: the next tick deletes it and the drain is done
    s.tick()
    assert s.state(provisioning) is None
    control = load_control(s.db, s.fleet.name)
    assert control.drain_done_id == "drain-1" and sorted(control.drain_deleted) == sorted(owned)
    before = len(s.deletes())
    s.tick()  # a later tick: the drain is done, nothing more
    assert len(s.deletes()) == before
