"""A multislice job's life in the scheduler (issue 37), on the in-memory store through the real handler: stored once
(delivered twice and concurrently), one gang request (one queued resource of N slices), one assignment naming every
slice when the gang's slices turn ACTIVE, and one lost slice ending the attempt on every slice."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

from tpuq.contracts.messages import AttemptEvent, AttemptEventKind, AttemptOutcome, FleetEvent, FleetEventKind, WorkerEndpoint
from tpuq.runtime.fleetstore import save_fleet

from .conftest import PROJECT_ZONE, fleet_file

QR = f"projects/tpuq-local/locations/{PROJECT_ZONE}/queuedResources/tq-gang"


def gang_fleet(sched) -> None:
    fleet = fleet_file(tpus=[{"id": "v4", "type": "v4-32", "zones": [PROJECT_ZONE], "count": 8}])
    save_fleet(sched.db, fleet, datetime(2026, 1, 2, tzinfo=timezone.utc))


def slice_event(i: int, n: int, kind=FleetEventKind.active, request_id: str | None = None) -> FleetEvent:
    return FleetEvent(kind=kind, fleet="test", queued_resource=QR, request_id=request_id, zone=PROJECT_ZONE,
                      type="v4-32", node=f"projects/tpuq-local/locations/{PROJECT_ZONE}/nodes/tq-gang-{i}",
                      entry_id="v4", chips=16, hosts=4,
                      endpoints=[WorkerEndpoint(worker_id=w, ip=f"10.0.{i}.{w}") for w in range(4)],
                      slice_index=i, slice_count=n, at=datetime(2026, 1, 3, tzinfo=timezone.utc))


def test_a_multislice_job_asks_one_gang_and_runs_on_every_slice(sched):
    gang_fleet(sched)
    message = {"id": "gang", "tpu": "v4-32", "slices": [4, 2], "command": "train"}
    threads = [threading.Thread(target=sched.deliver, args=("jobs", message), kwargs={"message_id": "9"})
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    job = sched.job("gang")
    assert job["state"] == "pending" and job["spec"]["slices"] == [4, 2]
    asks = sched.drain("capacity")
    assert [(a["count"], a["slices"]) for a in asks] == [(1, [4, 2])]
    request_id = asks[0]["request_id"]
    assert job["capacity_request"]["gang_entry_id"] == "v4" and job["capacity_request"]["slices"] == 4
    # Three of the four slices ACTIVE: no assignment yet (never a part of a gang).
    for i in range(3):
        sched.deliver("fleet-events", slice_event(i, 4, request_id=request_id))
    assert sched.drain("assignments") == []
    sched.deliver("fleet-events", slice_event(3, 4, request_id=request_id))
    [assignment] = sched.drain("assignments")
    nodes = [s["node"] for s in assignment["slices"]]
    assert [n.rsplit("/", 1)[1] for n in nodes] == [f"tq-gang-{i}" for i in range(4)]
    assert assignment["node"] == nodes[0] and assignment["slices_wanted"] == 4
    assert all(len(s["endpoints"]) == 4 for s in assignment["slices"])
    job = sched.job("gang")
    assert job["state"] == "assigned" and job["gang"] == nodes
    assert {sched.tpu(f"tq-gang-{i}")["state"] for i in range(4)} == {"busy"}
    assert {sched.tpu(f"tq-gang-{i}")["attempt_id"] for i in range(4)} == {"gang-1"}
    # One slice preempted: the attempt ends on all of them, the job goes back to the queue in its region.
    sched.deliver("attempt-events", AttemptEvent(kind=AttemptEventKind.started, job_id="gang", attempt=1,
                                                 attempt_id="gang-1", node=nodes[0],
                                                 at=datetime(2026, 1, 3, 0, 1, tzinfo=timezone.utc)))
    sched.deliver("fleet-events", slice_event(2, 4, kind=FleetEventKind.suspended, request_id=request_id))
    job = sched.job("gang")
    assert job["state"] == "pending" and job["preemptions"] == 1 and job["gang"] == []
    assert sched.tpu("tq-gang-2")["state"] == "gone"
    # The others are free but quarantined (their queued resource is lost as a whole): the retry asks for a new gang
    # in the attempt's region instead of running on slices about to go.
    assert {sched.tpu(f"tq-gang-{i}")["state"] for i in (0, 1, 3)} == {"idle"}
    assert all(sched.tpu(f"tq-gang-{i}")["quarantined"] for i in (0, 1, 3))
    assert sched.attempts("gang")["1"]["outcome"] == AttemptOutcome.preempted.value
    assert sched.drain("assignments") == []
    [retry] = [a for a in sched.drain("capacity") if a["action"] == "request"]
    assert retry["slices"] == [4, 2] and retry["regions"] == ["us-central2"] and retry["request_id"] != request_id


def assigned_gang(sched, job_id: str) -> dict:
    """A 2-slice job submitted, its gang's slices ACTIVE: its one Assignment."""
    gang_fleet(sched)
    sched.deliver("jobs", {"id": job_id, "tpu": "v4-32", "slices": 2, "command": "train"}, message_id="1")
    for i in range(2):
        sched.deliver("fleet-events", slice_event(i, 2))
    [assignment] = sched.drain("assignments")
    return assignment


def test_the_attempts_end_frees_every_slice(sched):
    assignment = assigned_gang(sched, "g2")
    nodes = [s["node"] for s in assignment["slices"]]
    sched.deliver("attempt-events", AttemptEvent(kind=AttemptEventKind.ended, job_id="g2", attempt=1,
                                                 attempt_id="g2-1", node=nodes[0], outcome=AttemptOutcome.succeeded,
                                                 exit_codes={str(g): 0 for g in range(8)},
                                                 at=datetime(2026, 1, 3, 0, 5, tzinfo=timezone.utc)))
    assert sched.job("g2")["state"] == "succeeded"
    assert {sched.tpu(f"tq-gang-{i}")["state"] for i in range(2)} == {"idle"}


def test_a_single_slice_job_with_slices_1_is_stored_as_before(sched):
    sched.deliver("jobs", {"id": "one", "tpu": "v4-32", "slices": 1, "command": "train"}, message_id="10")
    job = sched.job("one")
    assert job["state"] == "pending" and "slices" not in job["spec"]


def test_an_unstarted_gang_is_sent_again_with_every_slice_and_ended_on_every_slice(sched):
    from datetime import timedelta

    from tests.scheduler.test_unstarted_assignments import EVERY, tick

    first = assigned_gang(sched, "g3")
    for n in (1, 2, 3):
        tick(sched, n * EVERY + timedelta(seconds=1), seq=n)
        [again] = sched.drain("assignments")
        assert again["slices"] == first["slices"] and again["slices_wanted"] == 2, n
    tick(sched, timedelta(minutes=20, seconds=1), seq=4)
    job = sched.job("g3")
    assert job["state"] == "pending" and job["infra_failures"] == 1 and job["gang"] == []
    for i in range(2):
        tpu = sched.tpu(f"tq-gang-{i}")
        assert tpu["state"] == "idle" and tpu["quarantined"] is True and "g3-1" in tpu["quarantine_reason"]


def test_a_gangs_first_slices_take_no_job_before_the_last_is_recorded(sched):
    """A tick's pass between two slices' ACTIVE events must not give the first slice to a single-slice job (or part
    of the gang to an elastic one): a slice recorded before the others is `gang_waiting` until the last is."""
    gang_fleet(sched)
    sched.deliver("fleet-events", slice_event(0, 2))
    assert sched.tpu("tq-gang-0")["gang_waiting"] is True
    sched.deliver("jobs", {"id": "single", "tpu": "v4-32", "command": "x"}, message_id="1")
    sched.deliver("ticks", {"seq": 1})
    assert sched.drain("assignments") == [] and sched.job("single")["state"] == "pending"
    sched.deliver("fleet-events", slice_event(1, 2))
    assert [sched.tpu(f"tq-gang-{i}")["gang_waiting"] for i in range(2)] == [False, False]
    [assignment] = sched.drain("assignments")
    assert assignment["job_id"] == "single"


def claimer_saw(sched, events: list[FleetEvent], state: str) -> None:
    """The claimer's record of the gang `events` announce, in `state` (its queued_resources document)."""
    from tpuq.claimer.model import QrRecord, SliceNode
    from tpuq.claimer.statestore import qr_to_doc
    from tpuq.contracts import store

    now = datetime.now(timezone.utc)
    record = QrRecord(qr_id="tq-gang", fleet="test", project="tpuq-local", request_id=None, entry_id="v4",
                      zone=PROJECT_ZONE, type="v4-32", spot=True, generation=0, state=state, created_at=now,
                      updated_at=now, node=events[0].node, endpoints=tuple(events[0].endpoints), slices=len(events),
                      slice_nodes=tuple(SliceNode(e.node, tuple(e.endpoints)) for e in events))
    sched.db.collection(store.QUEUED_RESOURCES).document(record.qr_id).set(qr_to_doc(record))


def test_a_gang_slice_whose_active_event_was_lost_is_recorded_by_the_backstop(sched):
    """The tick's backstop for lost ACTIVE events reads a multislice record's every slice (`slice_nodes`)."""
    from datetime import timedelta

    from tpuq.contracts.messages import Tick
    from tpuq.scheduler import handlers

    from tests.scheduler.test_reconcile import tick_context

    gang_fleet(sched)
    events = [slice_event(i, 2) for i in range(2)]
    claimer_saw(sched, events, "ACTIVE")
    sched.deliver("fleet-events", events[0])  # slice 1's event was lost
    sched.deliver("jobs", {"id": "g4", "tpu": "v4-32", "slices": 2, "command": "train"}, message_id="1")
    assert sched.drain("assignments") == []
    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(seconds=1)))
    assert sched.tpu("tq-gang-1")["slice_index"] == 1
    [assignment] = sched.drain("assignments")
    assert [s["node"] for s in assignment["slices"]] == [e.node for e in events]


def test_a_gang_slice_whose_suspended_event_was_lost_is_ended_by_the_backstop(sched):
    """The tick's backstop for lost SUSPENDED events knows every slice of a multislice record, not only slice 0."""
    from datetime import timedelta

    from tpuq.contracts.messages import Tick
    from tpuq.scheduler import handlers

    from tests.scheduler.test_reconcile import tick_context

    gang_fleet(sched)
    events = [slice_event(i, 2) for i in range(2)]
    for e in events:
        sched.deliver("fleet-events", e)
    claimer_saw(sched, events, "SUSPENDED")
    handlers.on_tick(Tick(seq=1), tick_context(sched, timedelta(minutes=10)))
    assert [sched.tpu(f"tq-gang-{i}")["state"] for i in range(2)] == ["gone", "gone"]


def test_a_gang_no_entry_can_hold_says_so_and_not_that_the_fleet_is_full(sched):
    gang_fleet(sched)  # v4-32, count 8
    sched.deliver("jobs", {"id": "g9", "tpu": "v4-32", "slices": 9, "command": "train"}, message_id="1")
    sched.deliver("ticks", {"seq": 1})
    blocked = sched.job("g9")["blocked"]
    assert "entry v4 holds at most 8 slice(s) (count 8), below 9" in blocked and "maximum" not in blocked
    assert [m for m in sched.drain("capacity") if m.get("action", "request") == "request"] == []
