"""The claimer's watch observes a queued resource once per distinct set of API answers (`simulate.observed`):
through a whole life (created, waiting, ACTIVE with its node's health events and a maintenance window, deleted,
gone), every observation equals the real `observe`'s on an identical cloud, and the cloud counts the same calls."""

from __future__ import annotations

from datetime import datetime, timezone

from tpuq_dev.capacitymodel.scenario import parse_scenario
from tpuq_dev.simulate.cloud import SimCloud
from tpuq_dev.simulate.events import EventLoop
from tpuq_dev.simulate.inprocess import SimTpuClient
from tests.faketpu.test_model import P, Z, body
from tests.simulate.test_sim_bodies import SCENARIO


def _qr(state: str = "CREATING"):
    from tpuq.contracts.documents import QrRecord

    at = datetime(2026, 1, 5, tzinfo=timezone.utc)
    return QrRecord(qr_id="qr1", fleet="f", project=P, request_id="r", entry_id="v4", zone=Z, type="v4-8",
                    spot=True, generation=1, state=state, created_at=at, updated_at=at, node="qr1")


def test_a_repeated_observation_is_the_real_observe_and_makes_the_same_calls(monkeypatch):
    from tpuq.claimer.tpuapi import TpuApi
    from tpuq_dev.simulate.tpuq_policy import SimTpuApi

    afresh = []
    real_observe = TpuApi.observe
    monkeypatch.setattr(TpuApi, "observe", lambda self, qr: afresh.append(self) or real_observe(self, qr))

    loop = EventLoop()
    cloud = SimCloud(parse_scenario(SCENARIO), loop, project=P)
    client = SimTpuClient(cloud)
    repeating = SimTpuApi(client, {}, max_workers=1, attempts=1)
    plain = SimTpuClient(cloud)
    real = TpuApi(plain, node_json=plain.node_json, max_workers=1, attempts=1)
    records = [_qr()]
    seen: list[tuple] = []

    def create() -> None:
        b = body()
        b["tpu"]["nodeSpec"][0]["parent"] = f"projects/{P}/locations/{Z}"
        b["tpu"]["nodeSpec"][0]["nodeId"] = "qr1"
        cloud.create_queued_resource(Z, "qr1", b)

    def observed(api):
        before = cloud.calls.copy()
        return api.observe(records[-1]), cloud.calls - before

    def read() -> None:
        if loop.now() > 600 and records[-1].state != "ACTIVE":
            records.append(_qr("ACTIVE"))  # a record written again: another object, observed afresh
        mine, theirs = observed(repeating), observed(real)
        assert mine == theirs
        seen.append((mine[0].kind, mine[0].state, mine[0].node.health.health if mine[0].node else None))

    loop.at(0.0, create)
    loop.at(1200.0, lambda: cloud.delete_queued_resource(Z, "qr1", force=True))
    for t in [*range(1, 1200, 7), *range(1201, 1300, 3)]:
        loop.at(float(t), read)
    loop.run(1300.0)
    assert {kind for kind, _, _ in seen} == {"found", "not_found"}
    assert {"UNHEALTHY_TENSORFLOW", "HEALTHY"} <= {health for _, _, health in seen}
    assert sum(api is repeating for api in afresh) < len(seen) / 2  # most observations were repeats
