"""The simulated cloud keeps each resource's rendered body until a field the renderer reads changes
(`SimCloud._body`). With `check_bodies` every read is rendered afresh too and compared: the fingerprints miss
nothing through a queued resource's whole life, a node's health events and a maintenance window."""

from __future__ import annotations

from tpuq_dev.capacitymodel.errors import ApiError
from tpuq_dev.capacitymodel.scenario import parse_scenario
from tpuq_dev.simulate.cloud import SimCloud
from tpuq_dev.simulate.events import EventLoop
from tests.faketpu.test_model import P, Z, body

SCENARIO = {
    "zones": {Z: {"quota": {"v4": {"spot": 32}}}},
    "delays": {"accepted": 1, "waiting": 5, "provisioning": 100, "suspending": 30, "deleting": 5},
    "health": {"events": [{"after_active": 50, "health": "UNHEALTHY_TENSORFLOW", "symptom": "HBM_OUT_OF_MEMORY",
                           "worker": 1, "description": "the ML stack failed"}, {"at": 400, "health": "HEALTHY"}],
               "maintenance": [{"after_active": 500, "notice": 200, "duration": 100}]},
}


def test_kept_bodies_always_equal_a_fresh_render():
    loop = EventLoop()
    cloud = SimCloud(parse_scenario(SCENARIO), loop, project=P, check_bodies=True)
    seen: list[tuple[str, str, str | None]] = []

    def read() -> None:
        try:
            qr = cloud.get_queued_resource(Z, "qr1")
        except ApiError:
            seen.append(("NOT_FOUND", "", None))
            return
        node = None
        if qr["state"]["state"] == "ACTIVE":
            node = cloud.get_node(Z, "qr1")
            seen.append((qr["state"]["state"], node.get("health", ""),
                         (node.get("upcomingMaintenance") or {}).get("maintenanceStatus")))
        else:
            seen.append((qr["state"]["state"], "", None))

    def create() -> None:
        b = body()
        b["tpu"]["nodeSpec"][0]["parent"] = f"projects/{P}/locations/{Z}"
        b["tpu"]["nodeSpec"][0]["nodeId"] = "qr1"
        cloud.create_queued_resource(Z, "qr1", b)

    loop.at(0.0, create)
    for t in range(1, 1200, 7):
        loop.at(float(t), read)
    kept: list[int] = []
    loop.at(1199.5, lambda: kept.append(len(cloud._bodies)))
    loop.at(1200.0, lambda: cloud.delete_queued_resource(Z, "qr1", force=True))
    for t in range(1201, 1300, 3):
        loop.at(float(t), read)
    loop.run(1300.0)
    states = {s for s, _, _ in seen}
    assert {"ACCEPTED", "ACTIVE"} <= states or {"WAITING_FOR_RESOURCES", "ACTIVE"} <= states, states
    health = [h for s, h, _ in seen if s == "ACTIVE"]
    assert "UNHEALTHY_TENSORFLOW" in health and "HEALTHY" in health
    assert {m for _, _, m in seen} >= {"PENDING", "ONGOING"}
    assert seen[-1][0] == "NOT_FOUND"
    # One body kept per live resource (the queued resource, its node); a removed resource's goes with it.
    assert kept == [2]
    assert cloud._bodies == {}


def test_a_busy_run_reads_no_kept_body_that_differs_from_a_fresh_render():
    from tests.simulate.test_quiet_ticks import _run

    run = _run(check_bodies=True)
    assert run.cloud.calls["queuedResources.get"] > 1000
