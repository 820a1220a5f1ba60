"""The claimer's health poll on the claim stack (claimer + janitor, Firestore, the fake Cloud TPU on a manual clock):
one exact node GET per ACTIVE slice per tick (per delivery of it), and one NODE_HEALTH event per change, carrying what the API says."""

from __future__ import annotations

import pytest

from tests.integration.claimstack import PROJECT, ClaimStack
from tpuq.contracts.documents import MaintenanceStatus, SymptomType, TpuHealth, qr_from_doc
from tpuq.contracts.messages import FleetEventKind

ZONE = "us-central2-b"
TICK = 60.0


@pytest.fixture
def health_stack(clients, tmp_path):
    s = ClaimStack(clients.firestore,
                   {"zones": {ZONE: {"quota": {"v4": {"spot": 256}}}},
                    "delays": {"accepted": 1, "waiting": 5, "provisioning": 600, "deleting": 5}},
                   {"name": "health", "project": PROJECT, "owner_prefix": "tq", "claim": {"watch_interval_seconds": 3},
                    "quota": {ZONE: {"v4": {"spot": 256}}},
                    "tpus": [{"id": "v4", "type": "v4-32", "zones": [ZONE], "count": 1}]},
                   tmp_path / "fake")
    yield s
    s.close()


def health_events(s: ClaimStack):
    return [e for e in s.events if e.kind is FleetEventKind.node_health]


def test_each_tick_reads_each_active_node_once_and_a_change_is_announced_once(health_stack):
    s = health_stack
    s.request("r1")
    while not any(e.kind is FleetEventKind.active for e in s.events):
        s.tick(TICK)
    [active] = [e for e in s.events if e.kind is FleetEventKind.active]
    assert active.node_health.health is TpuHealth.HEALTHY  # read with the node, carried by ACTIVE
    node = active.node

    s.control.clear_calls()
    s.tick(TICK)
    gets = [c["path"] for c in s.control.calls(method="GET")]
    # The health poll: one exact GET of the node per watch pass. The stack delivers every tick twice (at least
    # once), and each delivery is a pass.
    assert gets.count(f"/v2/{node}") == 2, gets
    assert not any(p.endswith("/nodes") for p in gets)  # never a list
    assert health_events(s) == []  # nothing changed: nothing announced

    noticed_at = s.scenario_time
    s.control.schedule_maintenance(node, 7 * 86400, duration=3600)
    s.tick(TICK)
    s.tick(TICK)  # read again, unchanged: still one event
    [notice] = health_events(s)
    maintenance = notice.node_health.upcoming_maintenance
    assert maintenance.status is MaintenanceStatus.PENDING
    assert maintenance.window_start == s.clock.real_wall(noticed_at + 7 * 86400)
    stored = qr_from_doc(s.qr_doc(node.rsplit("/", 1)[-1]))
    assert stored.node_health == notice.node_health  # kept, so the next tick compares with it

    s.control.set_health(node, TpuHealth.UNHEALTHY_TENSORFLOW.value, symptom=SymptomType.OUT_OF_MEMORY.value, worker=2)
    s.control.clear_calls()
    s.tick(TICK)
    [_, sick] = health_events(s)
    assert sick.node_health.unhealthy() == "UNHEALTHY_TENSORFLOW (OUT_OF_MEMORY on worker 2)"
    # The janitor takes no part in a health event: no delete, and no race settled for it.
    assert s.control.calls(method="DELETE") == []
