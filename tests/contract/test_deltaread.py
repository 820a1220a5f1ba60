"""`tpuq.runtime.deltaread.DeltaView` on both stores: the server's commit-time stamp, a range query on it, and a
document leaving the set are seen alike; a view reads the whole set once, then only what was written since."""

from __future__ import annotations

from datetime import timedelta

from google.cloud.firestore import FieldFilter

from tpuq.runtime import deltaread
from tpuq.runtime.deltaread import WRITTEN_AT, DeltaView, stamped
from tpuq.runtime.service import utcnow


def _view(col) -> DeltaView:
    return DeltaView(scope=lambda db: col.where(filter=FieldFilter("fleet", "==", "f")),
                     keep=lambda doc: doc.get("live") is True, full_every=timedelta(hours=1))


def test_a_view_reads_only_what_was_written_since_and_drops_what_left(db, col, monkeypatch):
    monkeypatch.setattr(deltaread, "OVERLAP", timedelta(0))  # the writes below are a moment apart
    for i in range(5):
        col.document(f"q{i}").set(stamped({"fleet": "f", "live": True, "n": i}))
    col.document("other").set(stamped({"fleet": "g", "live": True}))
    view = _view(col)

    first = view.read(db, utcnow())
    assert sorted(s.id for s in first) == ["q0", "q1", "q2", "q3", "q4"]
    assert all(s.to_dict()[WRITTEN_AT] is not None for s in first)  # the server's time, not a sentinel

    col.document("q1").set(stamped({"fleet": "f", "live": True, "n": 10}))  # changed
    col.document("q2").set(stamped({"fleet": "f", "live": False, "n": 2}))  # left the set
    col.document("q5").set(stamped({"fleet": "f", "live": True, "n": 5}))  # new
    seen = {s.id: s.to_dict()["n"] for s in view.read(db, utcnow())}
    assert seen == {"q0": 0, "q1": 10, "q3": 3, "q4": 4, "q5": 5}


def test_a_write_without_the_stamp_is_seen_at_the_next_whole_read(db, col, monkeypatch):
    """A writer that does not stamp (an older version during a deploy, a console edit) is caught by the whole read
    on the view's cadence, or at once after `forget` (a nudge)."""
    monkeypatch.setattr(deltaread, "OVERLAP", timedelta(0))
    col.document("q0").set(stamped({"fleet": "f", "live": True, "n": 0}))
    view = _view(col)
    now = utcnow()
    view.read(db, now)
    col.document("q0").set({"fleet": "f", "live": True, "n": 1, WRITTEN_AT: now - timedelta(days=1)})
    assert [s.to_dict()["n"] for s in view.read(db, utcnow())] == [0]
    view.forget()
    assert [s.to_dict()["n"] for s in view.read(db, utcnow())] == [1]


def test_a_missing_index_reads_the_whole_set(monkeypatch):
    """Right after a deploy Firestore answers FAILED_PRECONDITION ("The query requires an index") until the
    composite index is built: the view reads the whole set meanwhile."""
    from google.api_core.exceptions import FailedPrecondition

    from tpuq_dev.inmemory import MemoryFirestore

    monkeypatch.setattr(deltaread, "OVERLAP", timedelta(0))
    db = MemoryFirestore()
    col = db.collection("qrs")
    col.document("q0").set(stamped({"fleet": "f", "live": True, "n": 0}))
    view = _view(col)
    view.read(db, utcnow())
    col.document("q0").set(stamped({"fleet": "f", "live": True, "n": 1}))

    class Unindexed:
        def __init__(self, query):
            self.query = query

        def where(self, **_):
            raise FailedPrecondition("The query requires an index. You can create it here: ...")

        def stream(self):
            return self.query.stream()

    view.scope = lambda db: Unindexed(col.where(filter=FieldFilter("fleet", "==", "f")))
    assert [s.to_dict()["n"] for s in view.read(db, utcnow())] == [1]
    assert not view.settled
