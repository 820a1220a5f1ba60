"""The capacity model's transition record (on_transition) and next_due(): every state change of a queued resource
or node, creation and removal included, reported once and stamped at its scheduled time, however lazily the
model is advanced."""

from __future__ import annotations

import random

import pytest

from tpuq_dev.capacitymodel.clock import ManualClock
from tpuq.contracts.documents import TpuHealth
from tpuq_dev.capacitymodel.model import FakeTpuWorld, NodeState, QrState, Transition
from tpuq_dev.capacitymodel.scenario import parse_scenario

P, Z = "proj", "us-central2-b"
QR = f"projects/{P}/locations/{Z}/queuedResources/"
NODE = f"projects/{P}/locations/{Z}/nodes/"
DELAYS = {"accepted": 1, "waiting": 5, "provisioning": 100, "suspending": 30, "deleting": 5}


def world(extra: dict | None = None, quota: int = 32):
    data = {"zones": {Z: {"quota": {"v4": {"spot": quota}}}}, "delays": DELAYS, **(extra or {})}
    seen: list[Transition] = []
    clock = ManualClock()
    return FakeTpuWorld(parse_scenario(data), clock, random.Random(7), on_transition=seen.append), clock, seen


def body(node_id: str, accelerator="v4-32", valid_until: str | None = None) -> dict:
    b = {"tpu": {"nodeSpec": [{"parent": f"projects/{P}/locations/{Z}", "nodeId": node_id,
                               "node": {"acceleratorType": accelerator, "runtimeVersion": "tpu-ubuntu2204-base"}}]},
         "spot": {}}
    if valid_until:
        b["queueingPolicy"] = {"validUntilDuration": valid_until}
    return b


def create(w, qr_id="qr1", node_id="n1", **kw):
    return w.create_queued_resource(P, Z, qr_id, body(node_id, **kw), None)


def brief(seen: list[Transition]) -> list[tuple]:
    return [(t.kind, t.name.rsplit("/", 1)[1], t.state.value if t.state else "gone", t.at) for t in seen]


NORMAL_LIFE = [
    ("queued_resource", "qr1", "ACCEPTED", 0),
    ("queued_resource", "qr1", "WAITING_FOR_RESOURCES", 1),
    ("queued_resource", "qr1", "PROVISIONING", 6),
    ("node", "n1", "CREATING", 6),
    ("node", "n1", "READY", 106),
    ("queued_resource", "qr1", "ACTIVE", 106),
    ("queued_resource", "qr1", "DELETING", 10_000),
    ("node", "n1", "DELETING", 10_000),
    ("node", "n1", "gone", 10_005),
    ("queued_resource", "qr1", "gone", 10_005),
]


def test_a_whole_life_is_reported_once_each_at_its_scheduled_time_after_long_pauses():
    w, clock, seen = world()
    create(w)
    clock.advance(10_000)
    w.advance()
    w.advance()  # a second look reports nothing again
    w.delete_queued_resource(P, Z, "qr1", force=True)
    clock.advance(50_000)
    w.advance()
    assert brief(seen) == NORMAL_LIFE
    node = next(t for t in seen if t.kind == "node")
    assert (node.accelerator_type, node.zone, node.queued_resource, node.chips, node.spot) == (
        "v4-32", Z, QR + "qr1", 16, True)
    assert w.queued_resources == {} and w.nodes == {} and w.next_due() is None


def test_stepping_to_each_next_due_gives_the_same_record_as_one_long_pause():
    w, clock, seen = world()
    create(w)
    dues = []
    while (due := w.next_due()) is not None:
        dues.append(due)
        clock.advance(due - clock.now())
        w.advance()
    assert dues == [1, 6, 106]  # ACTIVE with no preemption: nothing more happens by itself
    clock.advance(10_000 - clock.now())
    w.delete_queued_resource(P, Z, "qr1", force=True)
    assert w.next_due() == 10_005
    clock.advance(5)
    w.advance()
    assert brief(seen) == NORMAL_LIFE


@pytest.mark.parametrize("extra,expected", [
    pytest.param({"preemption": {"scripted": [{"after_active": 50}]}}, [
        ("node", "n1", "PREEMPTED", 156), ("queued_resource", "qr1", "SUSPENDING", 156),
        ("queued_resource", "qr1", "SUSPENDED", 186)], id="preemption"),
    pytest.param({"zones": {Z: {"quota": {"v4": {"spot": 32}}, "stockouts": [{"start": 0, "end": 500, "effect": "wait"}]}}}, [
        ("queued_resource", "qr1", "PROVISIONING", 500), ("node", "n1", "CREATING", 500),
        ("node", "n1", "READY", 600), ("queued_resource", "qr1", "ACTIVE", 600)], id="wait-stockout-ends"),
    pytest.param({"zones": {Z: {"quota": {"v4": {"spot": 32}}, "stockouts": [{"start": 0, "effect": "fail"}]}}}, [
        ("queued_resource", "qr1", "FAILED", 6)], id="fail-stockout"),
    pytest.param({"zones": {Z: {"quota": {"v4": {"spot": 8}}}}}, [
        ("queued_resource", "qr1", "FAILED", 1)], id="over-quota"),
])
def test_each_transition_kind_is_stamped_at_its_time_whether_stepped_or_paused(extra, expected):
    records = []
    for stepped in (True, False):
        w, clock, seen = world(extra)
        create(w)
        if stepped:
            while (due := w.next_due()) is not None and due < 100_000:
                clock.advance(due - clock.now())
                w.advance()
        else:
            clock.advance(100_000)
            w.advance()
        records.append(brief(seen))
        assert brief(seen)[-len(expected):] == expected
    assert records[0] == records[1]


def test_an_expiry_is_due_at_valid_until_and_stamped_there():
    w, clock, seen = world({"zones": {Z: {"quota": {"v4": {"spot": 32}}, "stockouts": [{"start": 0, "effect": "wait"}]}}})
    create(w, valid_until="3600s")
    clock.advance(1)
    w.advance()
    assert w.next_due() == 3600  # waiting in a stockout without end: only the expiry is scheduled
    clock.advance(90_000)
    w.advance()
    assert brief(seen)[-1] == ("queued_resource", "qr1", "FAILED", 3600)


def test_a_failed_request_deletes_its_node_and_the_removal_is_stamped():
    w, clock, seen = world()
    create(w)
    clock.advance(50)
    w.fail_queued_resource(P, Z, "qr1", "capacity")  # while PROVISIONING: its node goes
    clock.advance(1000)
    w.advance()
    assert brief(seen)[-3:] == [("queued_resource", "qr1", "FAILED", 50), ("node", "n1", "DELETING", 50),
                                ("node", "n1", "gone", 55)]
    assert w.queued_resources[QR + "qr1"].state == QrState.FAILED and w.nodes == {}


def test_one_advance_applies_every_record_s_transitions_in_time_order():
    """Two requests interleaved in time, and one advance long after: the record is in scenario-time order, not
    in the order the records were created (an earlier request's later steps come after a later request's
    earlier ones)."""
    w, clock, seen = world()
    create(w, "a", "na", accelerator="v4-8")
    clock.advance(3)
    create(w, "b", "nb", accelerator="v4-8")
    clock.advance(10_000)
    w.advance()
    times = [t.at for t in seen]
    assert times == sorted(times)
    assert [(k, n, s) for k, n, s, _ in brief(seen)][:4] == [
        ("queued_resource", "a", "ACCEPTED"), ("queued_resource", "a", "WAITING_FOR_RESOURCES"),
        ("queued_resource", "b", "ACCEPTED"), ("queued_resource", "b", "WAITING_FOR_RESOURCES")]
    assert brief(seen)[4] == ("queued_resource", "a", "PROVISIONING", 6)


def test_thousands_of_records_created_and_deleted_leave_nothing_to_scan():
    w, clock, seen = world(quota=10_000)
    for i in range(2000):
        create(w, f"q{i}", f"n{i}", accelerator="v4-8")
        clock.advance(60)
        if i >= 5:
            w.delete_queued_resource(P, Z, f"q{i - 5}", force=True)
    clock.advance(1000)
    for i in range(1995, 2000):
        w.delete_queued_resource(P, Z, f"q{i}", force=True)
    clock.advance(10)
    w.advance()
    assert w.queued_resources == {} and w.nodes == {} and w._due == {}
    assert w.next_due() is None and w._heap == []
    assert sum(1 for t in seen if t.removed and t.kind == "node") == 2000
    assert all(op.done for op in w.operations.values())
    assert not any(t.state == NodeState.PREEMPTED for t in seen)


def test_a_maintenance_the_control_api_scheduled_opens_and_closes_with_no_health_rules_in_the_scenario():
    """advance() skips the READY nodes' health scan when nothing can change health by itself; a control call's
    maintenance notice is such a thing."""
    w, clock, _ = world()
    create(w)
    clock.advance(106)
    w.schedule_maintenance(P, Z, "n1", starts_in=100, duration=50)
    clock.advance(120)
    assert w.get_node(P, Z, "n1").health is TpuHealth.UNHEALTHY_MAINTENANCE
    clock.advance(100)
    node = w.get_node(P, Z, "n1")
    assert node.health is TpuHealth.HEALTHY and node.maintenance is None
