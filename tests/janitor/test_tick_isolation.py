"""The janitor's tick: one fleet's failure never stops the others' pass (no emulators: the reads are stubbed)."""

from __future__ import annotations

import pytest

from tpuq.contracts.errors import Retryable
from tpuq.janitor import handlers
from tests.helpers import fleets_only_context
from tests.janitor.factories import fleet


@pytest.mark.parametrize("broken", [
    "tpu_docs raises",  # an error the janitor does not classify (not Retryable)
    "unreadable fleet document",
])
def test_one_fleet_failing_never_stops_the_others(monkeypatch, broken):
    ctx = fleets_only_context({"bad": {"name": "bad"} if broken == "unreadable fleet document" else fleet("bad"),
                               "good": fleet("good")})
    passes = []

    def tpu_docs(self, live_only=False):
        if self.fleet.name == "bad":
            raise RuntimeError("tpus query failed")
        return []

    monkeypatch.setattr(handlers.Janitor, "tpu_docs", tpu_docs)
    for step in ("sweep", "reap_idle"):
        monkeypatch.setattr(handlers.Janitor, step,
                            lambda self, tpus, step=step: passes.append((self.fleet.name, step)))
    monkeypatch.setattr(handlers.Janitor, "scan_orphans", lambda self, every: passes.append((self.fleet.name, "scan")))
    on_tick = handlers.make_handlers(orphan_scan_seconds=600, adapter_factory=lambda ctx, f: None)["/push/ticks"]

    with pytest.raises(Retryable, match="bad"):  # redelivered for the fleet that failed
        on_tick(None, ctx)
    assert passes == [("good", "sweep"), ("good", "reap_idle"), ("good", "scan")]
