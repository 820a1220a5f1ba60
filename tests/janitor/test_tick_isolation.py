"""The janitor's tick: one fleet's failure never stops the others' pass (in-memory store, steps stubbed)."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from tpuq.contracts.messages import Tick
from tpuq.contracts import store
from tpuq.contracts.errors import Retryable
from tpuq.janitor import handlers
from tpuq.runtime.fleetstore import save_fleet
from tpuq.runtime.settings import Settings
from tests.janitor.conftest import memory_clients
from tests.janitor.factories import fleet


@pytest.mark.parametrize("broken", [
    "tpu_docs raises",  # an error the janitor does not classify (not Retryable)
    "unreadable fleet document",
])
def test_one_fleet_failing_never_stops_the_others(monkeypatch, broken):
    clients = memory_clients(Settings(project="tpuq-local"))
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    if broken == "unreadable fleet document":
        clients.firestore.collection(store.FLEETS).document("bad").set({"fleet": {"name": "bad"}})
    else:
        save_fleet(clients.firestore, fleet("bad"), now)
    save_fleet(clients.firestore, fleet("good"), now)
    ctx = SimpleNamespace(clients=clients, now=lambda: now, publish=clients.publish,
                          state=handlers.JanitorState(orphan_scan_seconds=600, adapter_factory=lambda ctx, f: None))
    monkeypatch.setattr(handlers.Janitor, "claim_due_runs", lambda self, every, sweep_every: handlers.DueRuns(
        True, True, {"every": every}))
    passes = []

    def tpu_docs(self, live_only=False, states=None):
        if self.fleet.name == "bad":
            raise RuntimeError("tpus query failed")
        return []

    monkeypatch.setattr(handlers.Janitor, "tpu_docs", tpu_docs)
    for step in ("sweep", "reap_idle"):
        monkeypatch.setattr(handlers.Janitor, step,
                            lambda self, tpus, step=step: passes.append((self.fleet.name, step)))
    monkeypatch.setattr(handlers.Janitor, "scan_orphans",
                        lambda self, doc: passes.append((self.fleet.name, "scan", doc["every"])))

    with pytest.raises(Retryable, match="bad"):  # redelivered for the fleet that failed
        handlers.on_tick(Tick(), ctx)
    assert passes == [("good", "sweep"), ("good", "reap_idle"), ("good", "scan", 600)]
