"""The one guarded-write primitive (`tpuq.runtime.guarded`), on both stores: racing writers get exactly one winner.

The scheduler's assignment and the janitor's `deleting` mark guard the same
`tpus/{node}` document the same way, so whichever commits first wins and the
other writes nothing, in either order.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from tpuq.contracts import store
from tpuq.runtime.guarded import Seen, WriteSet, commit_guarded, commit_if_unchanged, read_decide_commit
from tpuq.janitor.handlers import Janitor

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def janitor_on(db) -> Janitor:
    """A janitor whose mark_deleting runs on `db` (it needs only the store and a clock)."""
    return Janitor(ctx=SimpleNamespace(now=lambda: T0, clients=SimpleNamespace(firestore=db)), fleet=None, api=None)


@pytest.fixture
def tpu(db):
    """An idle tpus/{node} document, removed afterwards (the collection is the services' own)."""
    # Quarantined, so that no scheduler of the session stack assigns it while the test runs; the guard is the same.
    ref = db.collection(store.TPUS).document(f"contract-{uuid.uuid4().hex[:12]}")
    ref.set({"state": "idle", "quarantined": True, "job_id": None})
    yield ref
    ref.delete()


def assignment(job_snap, tpu_snap) -> WriteSet:
    return (WriteSet().update(job_snap, {"state": "assigned", "tpu": tpu_snap.id})
            .update(tpu_snap, {"state": "busy", "job_id": job_snap.id}))


def pending_job(col):
    ref = col.document("j1")
    ref.set({"state": "pending"})
    return ref


def test_an_assignment_that_commits_first_wins_over_the_deleting_mark(db, col, tpu):
    job = pending_job(col)

    def assigned_meanwhile(doc):
        assert commit_if_unchanged(db, assignment(job.get(), tpu.get()))  # between the janitor's read and write
        return doc is not None and doc["state"] == "idle"

    assert janitor_on(db).mark_deleting(tpu.id, assigned_meanwhile, "idle") is False
    assert tpu.get().to_dict()["state"] == "busy" and job.get().to_dict()["state"] == "assigned"


def test_a_deleting_mark_that_commits_first_wins_over_the_assignment(db, col, tpu):
    job = pending_job(col)
    job_snap, tpu_snap = job.get(), tpu.get()  # the scheduler read both and planned the pair
    assert janitor_on(db).mark_deleting(tpu.id, lambda doc: doc["state"] == "idle", "idle") is True
    assert commit_if_unchanged(db, assignment(job_snap, tpu_snap)) is False
    assert tpu.get().to_dict()["state"] == "deleting" and job.get().to_dict()["state"] == "pending"


def test_two_writers_deciding_on_the_same_snapshots_one_wins(db, col, tpu):
    job = pending_job(col)
    snaps = job.get(), tpu.get()
    assert commit_if_unchanged(db, assignment(*snaps)) is True
    assert commit_if_unchanged(db, assignment(*snaps)) is False


def test_a_guarded_create_loses_to_a_document_that_appeared(db, col):
    ref = col.document("new")
    absent = ref.get()
    ref.set({"by": "other"})
    assert commit_if_unchanged(db, WriteSet().update(absent, {"by": "me"})) is False
    assert ref.get().to_dict() == {"by": "other"}


def test_read_decide_commit_decides_again_on_fresh_reads(db, col):
    ref = col.document("counter")
    ref.set({"n": 0})
    decided_on = []

    def decide(snap):
        n = snap.to_dict()["n"]
        decided_on.append(n)
        if len(decided_on) == 1:
            ref.update({"n": 10})  # a concurrent writer wins the first round
        return WriteSet().update(snap, {"n": n + 1}), n

    assert read_decide_commit(db, [ref], decide) == 10
    assert decided_on == [0, 10] and ref.get().to_dict() == {"n": 11}


def test_a_kept_version_guards_like_a_snapshot_and_a_replaced_record_lands_only_with_it(db, col):
    """The claimer's slot claim: `Seen(ref, version)` loses once the slot changed; the queued resource's record
    written in the same commit then never lands. Absent (`Seen(ref)`): a create, which loses once it exists."""
    slot, record = col.document("zone~type"), col.document("qr-1")
    [first] = commit_guarded(db, WriteSet().update(Seen(slot), {"last_claim": "qr-0"}))
    assert commit_guarded(db, WriteSet().update(Seen(slot), {"last_claim": "again"})) is None  # it exists now
    won = commit_guarded(db, WriteSet().update(Seen(slot, first.update_time), {"last_claim": "qr-1"})
                         .replace(record, {"state": "REQUESTED"}))
    assert won is not None and record.get().to_dict() == {"state": "REQUESTED"}
    lost = WriteSet().update(Seen(slot, first.update_time), {"last_claim": "qr-2"}).replace(
        col.document("qr-2"), {"state": "REQUESTED"})
    assert commit_guarded(db, lost) is None  # decided from the old version
    assert slot.get().to_dict() == {"last_claim": "qr-1"} and not col.document("qr-2").get().exists
    assert won[0].update_time == slot.get().update_time  # the new version, for the next claim


def test_read_all_answers_in_the_order_asked_missing_documents_included(db, col):
    """read_decide_commit reads its documents in one round trip (`get_all` answers in any order, on both stores)."""
    from tpuq.runtime.guarded import read_all

    refs = [col.document(name) for name in ("c", "missing", "a", "b")]
    for ref in (refs[0], refs[2], refs[3]):
        ref.set({"name": ref.id})
    snaps = read_all(db, refs)
    assert [(s.id, s.exists) for s in snaps] == [("c", True), ("missing", False), ("a", True), ("b", True)]
    assert [s.to_dict() for s in snaps if s.exists] == [{"name": "c"}, {"name": "a"}, {"name": "b"}]


def test_read_decide_commit_reads_the_documents_the_first_ones_name_and_guards_them_too(db, col):
    """`then`: documents known only from those read (a multislice job's other slices), read next and guarded alike."""
    job, a, b = col.document("gang-job"), col.document("slice-a"), col.document("slice-b")
    job.set({"gang": ["slice-a", "slice-b"]})
    a.set({"state": "busy"})
    b.set({"state": "busy"})

    def free_all(job_snap, *slices):
        return WriteSet().update(job_snap, {"state": "ended"}).update(slices[0], {"state": "idle"}).update(
            slices[1], {"state": "idle"}), [s.id for s in slices]

    read = read_decide_commit(db, [job], free_all,
                              then=lambda snaps: [col.document(n) for n in snaps[0].to_dict()["gang"]])
    assert read == ["slice-a", "slice-b"]
    assert (a.get().to_dict(), b.get().to_dict()) == ({"state": "idle"}, {"state": "idle"})
