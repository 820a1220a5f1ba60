"""The fake's node health and maintenance: scenario events and notices (the capacity model), the control calls, and
the JSON it serves, which the claimer's reader sees whole while google-cloud-tpu's typed node drops the notice."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from tpuq_dev.capacitymodel.clock import ManualClock, ScaledClock
from tpuq_dev.capacitymodel.errors import ApiError
from tpuq_dev.capacitymodel.model import FakeTpuWorld, NodeState
from tpuq_dev.capacitymodel.scenario import ScenarioError, parse_scenario
from tpuq.claimer.tpuapi import NodeJsonReader, TpuApi
from tpuq.contracts.documents import MaintenanceStatus, NodeHealth, SymptomType, TpuHealth
from tpuq_dev.capacitymodel.render import render_node
from tpuq_dev.faketpu.control import FakeTpuControl, FakeTpuControlError
from tpuq_dev.faketpu.server import FakeTpuServer

from tests.faketpu.conftest import tpu_client
from tests.faketpu.test_model import P, Z, create

DELAYS = {"accepted": 1, "waiting": 5, "provisioning": 100, "suspending": 30, "deleting": 5}


def active_world(health: dict | None = None) -> tuple[FakeTpuWorld, ManualClock, str]:
    """One v4-32 node READY at scenario time 106."""
    scenario = parse_scenario({"zones": {Z: {"quota": {"v4": {"spot": 32}}}}, "delays": DELAYS,
                               "health": health or {}})
    clock = ManualClock()
    w = FakeTpuWorld(scenario, clock, random.Random(7))
    create(w)
    clock.advance(106)
    node = w.get_node(P, Z, "n1")
    assert node.state == NodeState.READY and node.active_since == 106
    return w, clock, node.name


def rendered(w: FakeTpuWorld) -> NodeHealth:
    return NodeHealth.from_api(render_node(w, w.get_node(P, Z, "n1")))


def test_a_scenario_health_event_turns_the_node_unhealthy_with_its_symptom_and_the_hosts_stay():
    w, clock, _ = active_world({"events": [
        {"after_active": 50, "health": "UNHEALTHY_TENSORFLOW", "symptom": "HBM_OUT_OF_MEMORY", "worker": 2,
         "details": "HBM is full", "description": "the ML stack failed"},
        {"at": 300, "health": "HEALTHY"}]})
    assert rendered(w).health is TpuHealth.HEALTHY and rendered(w).symptoms == []
    clock.advance(50)
    h = rendered(w)
    assert h.health is TpuHealth.UNHEALTHY_TENSORFLOW and h.description == "the ML stack failed"
    [symptom] = h.symptoms
    assert (symptom.symptom_type, symptom.worker_id, symptom.details) == (SymptomType.HBM_OUT_OF_MEMORY, "2", "HBM is full")
    assert w.get_node(P, Z, "n1").state == NodeState.READY  # unhealthy is not preempted: the node stays
    clock.advance(200)  # scenario time 356: the absolute HEALTHY event has fired
    assert rendered(w).health is TpuHealth.HEALTHY and rendered(w).symptoms == []


def test_a_scenario_maintenance_notice_then_its_window_then_healthy_again():
    w, clock, _ = active_world({"maintenance": [{"after_active": 10, "notice": 600, "duration": 300}]})
    assert rendered(w).upcoming_maintenance is None
    clock.advance(10)
    m = rendered(w).upcoming_maintenance
    assert m.status is MaintenanceStatus.PENDING and rendered(w).health is TpuHealth.HEALTHY
    assert m.window_start == clock.real_wall(116 + 600) and m.window_end == clock.real_wall(116 + 900)
    clock.advance(600)  # the window opened
    h = rendered(w)
    assert h.health is TpuHealth.UNHEALTHY_MAINTENANCE and h.upcoming_maintenance.status is MaintenanceStatus.ONGOING
    clock.advance(300)  # the window closed: healthy, nothing upcoming
    assert rendered(w).health is TpuHealth.HEALTHY and rendered(w).upcoming_maintenance is None


def test_the_control_calls_change_a_ready_node_only():
    w, clock, name = active_world()
    w.set_node_health(P, Z, "n1", TpuHealth.TIMEOUT, symptom=SymptomType.EXECUTE_TIMED_OUT, worker=3)
    assert rendered(w).unhealthy() == "TIMEOUT (EXECUTE_TIMED_OUT on worker 3)"
    with pytest.raises(ApiError):
        w.set_node_health(P, Z, "n1", TpuHealth.TIMEOUT, worker=4)  # a v4-32 has workers 0..3
    w.set_node_health(P, Z, "n1", TpuHealth.HEALTHY)
    w.schedule_maintenance(P, Z, "n1", starts_in=3600)
    assert rendered(w).maintenance_due(clock.real_wall(clock.now())) is not None
    w.schedule_maintenance(P, Z, "n1", starts_in=None)
    assert rendered(w).upcoming_maintenance is None
    w.preempt_node(P, Z, "n1")
    with pytest.raises(ApiError):
        w.set_node_health(P, Z, "n1", TpuHealth.TIMEOUT)


@pytest.mark.parametrize("health, words", [
    ({"events": [{"at": 1, "health": "SICK"}]}, "health.events.0.health"),
    ({"events": [{"health": "TIMEOUT"}]}, "exactly one of 'at' or 'after_active'"),
    ({"events": [{"at": 1, "health": "TIMEOUT", "symptom": "TIRED"}]}, "health.events.0.symptom"),
    ({"maintenance": [{"at": 1, "type": "SOMETIMES"}]}, "health.maintenance.0.type"),
    ({"maintenance": [{"at": 1, "duration": 0}]}, "health.maintenance.0.duration"),
])
def test_a_bad_health_scenario_names_the_field(health, words):
    with pytest.raises(ScenarioError, match=words.replace(".", r"\.").replace("(", r"\(")):
        parse_scenario({"health": health})


def test_a_maintenance_window_is_shown_in_real_time_on_a_scaled_clock():
    """Clients compare a window's start with their own clock: at 60x, a window 3600 scenario seconds away opens
    in one real minute, and that is what the fake reports."""
    ticks = iter([0.0, 10.0])
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    clock = ScaledClock(60.0, monotonic=lambda: next(ticks), start_wall=start)
    now = clock.now()  # 600 scenario seconds after 10 real ones
    assert clock.real_wall(now + 3600) == start + timedelta(seconds=10 + 60)
    assert clock.wall(now) == start + timedelta(seconds=600)  # createTime and the like keep scenario time


def test_over_http_the_json_reader_sees_the_notice_that_the_typed_client_drops(tmp_path):
    clock = ManualClock()
    server = FakeTpuServer({"zones": {Z: {"quota": {"v4": {"spot": 32}}}}, "delays": DELAYS}, clock=clock,
                           state_dir=tmp_path, worker_hosts=False)
    url = server.start()
    try:
        create(server.world)
        clock.advance(106)
        name = f"projects/{P}/locations/{Z}/nodes/n1"
        control = FakeTpuControl(url)
        control.schedule_maintenance(name, 7200, duration=600)
        control.set_health(name, "UNHEALTHY_TENSORFLOW", symptom="MESH_BUILD_FAIL", worker=1)
        with pytest.raises(FakeTpuControlError, match="unknown health"):
            control.set_health(name, "POORLY")

        node, health = TpuApi(tpu_client(url), node_json=NodeJsonReader(url), attempts=1).get_node(name)
        assert node.name == name and node.state.name == "READY"
        assert health.health is TpuHealth.UNHEALTHY_TENSORFLOW
        assert health.upcoming_maintenance.window_start == clock.real_wall(106 + 7200)

        # google-cloud-tpu's tpu_v2.Node has no upcoming_maintenance: its REST transport drops the field, so a
        # reader built on the typed client alone would never see a maintenance notice.
        _, typed = TpuApi(tpu_client(url), attempts=1).get_node(name)
        assert typed.health is TpuHealth.UNHEALTHY_TENSORFLOW and typed.upcoming_maintenance is None
        assert [c["path"] for c in control.calls(method="GET")].count(f"/v2/{name}") == 2
    finally:
        server.stop()
