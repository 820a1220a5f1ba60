"""The claimer's tick: one fleet's failure never stops the watch of the others (no emulators: reads stubbed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpuq.contracts.messages import Tick
from tpuq.claimer import handlers
from tpuq.contracts.errors import Retryable
from tpuq.runtime.settings import Settings
from tests.helpers import fleets_only_context
from tests.claimer.test_decide import make_fleet


def named(fleet, name: str):
    return fleet.model_copy(update={"name": name})


@pytest.mark.parametrize("broken", ["its state cannot be loaded", "its stored fleet file does not validate"])
def test_one_fleet_failing_never_stops_the_others(monkeypatch, broken):
    bad = {"name": "bad"} if broken == "its stored fleet file does not validate" else named(make_fleet(), "bad")
    ctx = fleets_only_context({"bad": bad, "good": named(make_fleet(), "good")})
    watched = []

    def tick(self, force=False):
        if self.fleet.name == "bad":
            raise RuntimeError("queued_resources query failed")
        watched.append(self.fleet.name)

    monkeypatch.setattr(handlers.Claimer, "tick", tick)
    ctx.state = handlers.build_service(Settings(project="p"), public_key=lambda fleet: "ssh-ed25519 AAAA",
                                       tpu_factory=lambda ctx: None, prechecks_factory=lambda ctx: None).state

    with pytest.raises(Retryable, match="bad"):  # redelivered for the fleet that failed
        handlers.on_tick(Tick(), ctx)
    assert watched == ["good"]


def test_fast_watch_rereads_only_the_requests_racers_not_yet_active():
    from tpuq.claimer.decide import fast_watch_targets

    qrs = {i: SimpleNamespace(request_id=r, state=s) for i, (r, s) in enumerate(
        [("r1", "ACCEPTED"), ("r1", "ACTIVE"), ("r2", "ACCEPTED"), ("r1", "REQUESTED")])}
    state = SimpleNamespace(qrs=qrs)
    assert [q.state for q in fast_watch_targets(state, "r1")] == ["ACCEPTED", "REQUESTED"]
