"""The in-memory Firestore counts operations as Firestore bills them (https://cloud.google.com/firestore/pricing):
a document got is one read, found or not; a query one read per document returned or skipped by an offset, and
one when it returns none; a count aggregation one per 1,000 index entries, at least one; each write or delete of
a commit one. The simulator reports a month of the services' Firestore use from these counts."""

from __future__ import annotations

from google.cloud.firestore import FieldFilter

from tpuq_dev.inmemory import MemoryFirestore


def _db() -> MemoryFirestore:
    db = MemoryFirestore()
    for i, state in enumerate(["pending", "pending", "pending", "running"]):
        db.collection("jobs").document(f"j{i}").set({"state": state, "n": i})
    return db


def _reads(db: MemoryFirestore, read) -> int:
    before = db.billed.reads
    read()
    return db.billed.reads - before


def test_gets_bill_one_read_each_found_or_not():
    db = _db()
    assert _reads(db, lambda: db.collection("jobs").document("j0").get()) == 1
    assert _reads(db, lambda: db.collection("jobs").document("missing").get()) == 1
    refs = [db.collection("jobs").document(i) for i in ("j0", "j1", "missing")]
    assert _reads(db, lambda: list(db.get_all(refs))) == 3


def test_queries_bill_the_documents_returned_and_one_when_none():
    db = _db()
    pending = db.collection("jobs").where(filter=FieldFilter("state", "==", "pending"))
    assert _reads(db, lambda: list(pending.stream())) == 3
    assert _reads(db, lambda: list(pending.order_by("n").limit(2).stream())) == 2
    assert _reads(db, lambda: list(pending.order_by("n").offset(1).limit(1).stream())) == 2  # skipped ones too
    assert _reads(db, lambda: list(db.collection("jobs").where(
        filter=FieldFilter("state", "==", "gone")).stream())) == 1
    assert _reads(db, lambda: pending.count().get()) == 1
    assert _reads(db, lambda: db.collection("jobs").list_documents()) == 4


def test_commits_bill_each_write_and_delete():
    db = _db()
    before = db.billed.copy()
    batch = db.batch()
    batch.update(db.collection("jobs").document("j0"), {"state": "running"})
    batch.set(db.collection("jobs").document("j9"), {"state": "pending"})
    batch.delete(db.collection("jobs").document("j3"))
    batch.commit()
    spent = db.billed - before
    assert (spent.reads, spent.writes, spent.deletes) == (0, 2, 1)
