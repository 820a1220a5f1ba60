"""The clock's tick reaches the janitor alone, which routes it to each service whose `tick_due/` document says its
tick has work (`tpuq.runtime.tickdue`): one query, one read when none has. A nudge, and an instance's first tick,
go to every service."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from tpuq.contracts import topology
from tpuq.contracts.messages import Tick
from tpuq.janitor import handlers
from tpuq.runtime import tickdue
from tpuq_dev.inmemory.firestore import MemoryFirestore

NOW = datetime(2026, 12, 5, 12, tzinfo=timezone.utc)


class Clock:
    def __init__(self):
        self.db, self.now, self.published = MemoryFirestore(project="p"), NOW, []
        self.ctx = SimpleNamespace(clients=SimpleNamespace(firestore=self.db), now=lambda: self.now,
                                   publish=lambda topic, message, **_: self.published.append(topic),
                                   state=handlers.JanitorState(orphan_scan_seconds=600))

    def tick(self, **fields) -> list[str]:
        """One clock tick; the topics it was routed to."""
        self.published.clear()
        handlers.on_tick(Tick(**fields), self.ctx)
        return sorted(self.published)

    def due(self, doc_id: str, at: datetime) -> None:
        tickdue.ref(self.db, doc_id).set({tickdue.DUE_AT: at})


EVERY_SERVICE = sorted(topology.tick_topic(s) for s in tickdue.ROUTED)


def test_a_tick_goes_only_to_the_services_whose_document_is_due():
    c = Clock()
    assert c.tick() == EVERY_SERVICE  # the instance's first: documents may not be written yet
    c.due(tickdue.SCHEDULER, NOW + timedelta(minutes=10))
    c.due(tickdue.EXECUTOR, NOW + timedelta(minutes=3))
    c.due(tickdue.claimer_doc_id("race"), NOW + timedelta(minutes=14))
    c.due(tickdue.JANITOR, NOW + timedelta(minutes=9))  # as its first tick wrote it (no fleet here)
    before = c.db.billed.reads
    assert c.tick() == []
    assert c.db.billed.reads - before == 1  # the router's query, which the janitor's own work is due by too
    c.now += timedelta(minutes=3)
    assert c.tick() == ["ticks-executor"]
    c.due(tickdue.claimer_doc_id("other"), tickdue.ALWAYS)  # a fleet watching a request: every tick
    assert c.tick() == ["ticks-claimer", "ticks-executor"]
    c.due(tickdue.EXECUTOR, c.now + timedelta(minutes=15))  # the executor's tick ran and wrote its next
    assert c.tick() == ["ticks-claimer"]


def test_a_nudge_goes_to_every_service_whatever_their_documents_say():
    c = Clock()
    c.tick()
    for doc_id in (tickdue.SCHEDULER, tickdue.EXECUTOR, tickdue.claimer_doc_id("race")):
        c.due(doc_id, NOW + timedelta(hours=1))
    assert c.tick() == []
    assert c.tick(nudge=True, source="fleet-apply") == EVERY_SERVICE


def test_the_services_documents_are_told_apart_from_others():
    assert tickdue.services_due(["scheduler", "claimer:a", "claimer:b", "router", "executor"]) == \
        ["scheduler", "claimer", "executor"]
    assert tickdue.service_of("janitor") is None and tickdue.service_of("claimer:x") == "claimer"
