"""What tpuq relies on Firestore to do, checked on both stores (see conftest.py).

Every operation the services use: get and get_all, set (with merge), update
with a precondition, create-if-absent, delete, atomic batches, transactions,
the transforms, and queries with ==, in, array_contains, <=, order_by, limit
and count(). A difference between the two stores fails here first.
"""

from __future__ import annotations

import enum
from datetime import datetime, timedelta, timezone

import pytest
from google.api_core.exceptions import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from google.cloud import firestore
from google.cloud.firestore import FieldFilter, Query

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Colour(str, enum.Enum):
    red = "red"


def ids(query) -> list[str]:
    return [s.id for s in query.stream()]


def count(query) -> int:
    return int(query.count().get()[0][0].value)


# ------------------------------------------------------------------ documents


def test_snapshot_of_a_missing_and_of_a_stored_document(db, col):
    ref = col.document("a")
    missing = ref.get()
    assert not missing.exists and missing.to_dict() is None and missing.id == "a"
    assert missing.update_time is None and missing.create_time is None
    ref.set({"n": 1})
    snap = ref.get()
    assert snap.exists and snap.to_dict() == {"n": 1} and snap.id == "a" and snap.reference.path == ref.path
    assert snap.create_time == snap.update_time is not None and snap.get("n") == 1


def test_values_come_back_as_firestore_stores_them(db, col):
    ref = col.document("v")
    ref.set({"tuple": (1, 2), "enum": Colour.red, "naive": datetime(2026, 1, 1, 12), "aware": T0,
             "nested": {"a": [{"b": None}]}, "float": 1.5, "bool": True})
    doc = ref.get().to_dict()
    assert doc["tuple"] == [1, 2] and type(doc["enum"]) is str and doc["enum"] == "red"
    assert doc["naive"] == datetime(2026, 1, 1, 12, tzinfo=timezone.utc) and doc["aware"] == T0
    assert doc["naive"].tzinfo is not None
    assert doc["nested"] == {"a": [{"b": None}]} and doc["float"] == 1.5 and doc["bool"] is True
    ref.set({"set": {3}})  # the client sends a set as an array
    assert ref.get().to_dict() == {"set": [3]}
    with pytest.raises(TypeError):
        ref.set({"bad": object()})


def test_a_read_document_is_a_copy(db, col):
    ref = col.document("c")
    ref.set({"m": {"k": [1]}, "a": [{"x": 1}], "n": 1})
    for snap in (ref.get(), next(iter(col.where(filter=FieldFilter("n", "==", 1)).stream()))):
        doc = snap.to_dict()
        doc["m"]["k"].append(2)
        doc["a"][0]["x"] = 2
        doc["n"] = 5
        assert snap.to_dict() == ref.get().to_dict() == {"m": {"k": [1]}, "a": [{"x": 1}], "n": 1}


def test_get_all_reads_several_documents_including_missing_ones(db, col):
    col.document("a").set({"n": 1})
    col.document("b").set({"n": 2})
    snaps = {s.id: s for s in db.get_all([col.document("a"), col.document("b"), col.document("nope")])}
    assert {k: s.exists for k, s in snaps.items()} == {"a": True, "b": True, "nope": False}
    assert snaps["b"].to_dict() == {"n": 2}


def test_set_replaces_and_set_with_merge_merges_nested_maps(db, col):
    ref = col.document("s")
    ref.set({"a": 1, "m": {"x": 1, "y": 1}})
    ref.set({"m": {"y": 2, "z": 3}, "b": 2}, merge=True)
    assert ref.get().to_dict() == {"a": 1, "b": 2, "m": {"x": 1, "y": 2, "z": 3}}
    ref.set({"m": {}}, merge=True)  # an empty map is a value of its own
    assert ref.get().to_dict()["m"] == {}
    ref.set({"only": True})
    assert ref.get().to_dict() == {"only": True}


def test_update_needs_the_document_and_takes_field_paths(db, col):
    with pytest.raises(NotFound):
        col.document("u").update({"n": 1})
    ref = col.document("u")
    ref.set({"n": 1, "m": {"x": 1, "y": 1}, "gone": 1})
    ref.update({"m.y": 2, "n": 5, "gone": firestore.DELETE_FIELD})
    assert ref.get().to_dict() == {"n": 5, "m": {"x": 1, "y": 2}}
    ref.update({"m": {"z": 1}})  # a map given whole replaces the map
    assert ref.get().to_dict()["m"] == {"z": 1}


def test_create_only_if_absent(db, col):
    ref = col.document("c")
    ref.create({"n": 1})
    with pytest.raises(AlreadyExists):
        ref.create({"n": 2})
    assert ref.get().to_dict() == {"n": 1}


def test_delete_is_idempotent(db, col):
    ref = col.document("d")
    ref.set({"n": 1})
    ref.delete()
    ref.delete()
    assert not ref.get().exists


# ------------------------------------------------------------------ size limits
# Firestore refuses a document over 1 MiB and a field value over 1 MiB - 89 bytes with INVALID_ARGUMENT, on every
# retry (production-facts.md, "Firestore document size"; Firestore's quotas page). A job over it must be refused by
# tpuq with a reason (tpuq.contracts.jobspec's limits), never found out by a write that fails for ever.
HALF_MIB_AND_MORE = 600_000


def test_a_document_over_one_mib_is_refused_and_nothing_is_written(db, col):
    ref = col.document("big")
    with pytest.raises(InvalidArgument):
        ref.set({"a": "x" * HALF_MIB_AND_MORE, "b": "y" * HALF_MIB_AND_MORE})  # each field alone would fit
    assert not ref.get().exists
    with pytest.raises(InvalidArgument):
        ref.set({"m": {"a": "x" * HALF_MIB_AND_MORE, "b": ["y" * HALF_MIB_AND_MORE]}})  # inside a map and an array
    assert not ref.get().exists
    ref.set({"a": "x" * 900_000})  # under the limit: stored whole
    assert len(ref.get().to_dict()["a"]) == 900_000


def test_a_write_that_grows_a_document_over_one_mib_is_refused_and_the_document_kept(db, col):
    ref = col.document("grows")
    ref.set({"a": "x" * HALF_MIB_AND_MORE})
    before = ref.get()
    with pytest.raises(InvalidArgument):
        ref.set({"b": "y" * HALF_MIB_AND_MORE}, merge=True)
    with pytest.raises(InvalidArgument):
        ref.update({"m.b": "y" * HALF_MIB_AND_MORE})
    after = ref.get()
    assert after.to_dict() == before.to_dict() and after.update_time == before.update_time
    ref.update({"a": "small", "b": "y" * HALF_MIB_AND_MORE})  # the size after the write is what counts
    assert len(ref.get().to_dict()["b"]) == HALF_MIB_AND_MORE


def test_a_batch_with_one_document_over_one_mib_writes_nothing(db, col):
    small, big = col.document("small"), col.document("big")
    batch = db.batch()
    batch.set(small, {"n": 1})
    batch.set(big, {"a": "x" * HALF_MIB_AND_MORE, "b": "y" * HALF_MIB_AND_MORE})
    with pytest.raises(InvalidArgument):
        batch.commit()
    assert not small.get().exists and not big.get().exists


def test_one_field_value_over_one_mib_less_89_bytes_is_refused(db, col):
    ref = col.document("v")
    ref.set({"a": "x" * 1_048_487})  # the longest a field value may be; the document is still under 1 MiB
    with pytest.raises(InvalidArgument):
        ref.set({"a": "x" * 1_048_488})
    assert len(ref.get().to_dict()["a"]) == 1_048_487


# ------------------------------------------------------------------ preconditions


def test_update_with_the_read_update_time_lands_once(db, col):
    ref = col.document("p")
    ref.set({"n": 1})
    snap = ref.get()
    ref.update({"n": 2}, option=db.write_option(last_update_time=snap.update_time))
    with pytest.raises(FailedPrecondition):
        ref.update({"n": 3}, option=db.write_option(last_update_time=snap.update_time))
    assert ref.get().to_dict() == {"n": 2}


def test_update_time_moves_on_every_change(db, col):
    ref = col.document("t")
    first = ref.set({"n": 1}).update_time
    assert ref.get().update_time == first
    second = ref.set({"n": 2}).update_time
    assert second > first and ref.get().update_time == second and ref.get().create_time == first


def test_a_write_that_changes_nothing_keeps_the_update_time(db, col):
    ref = col.document("same")
    first = ref.set({"n": 1}).update_time
    assert ref.set({"n": 1}).update_time == first and ref.get().update_time == first


def test_guard_on_a_document_deleted_since_it_was_read_fails(db, col):
    ref = col.document("g")
    ref.set({"n": 1})
    snap = ref.get()
    ref.delete()
    batch = db.batch()
    batch.update(ref, {"n": 2}, option=db.write_option(last_update_time=snap.update_time))
    with pytest.raises(FailedPrecondition):
        batch.commit()
    assert not ref.get().exists


def test_exists_option(db, col):
    ref = col.document("e")
    with pytest.raises(ValueError):  # update already requires the document: the client refuses the option
        ref.update({"n": 1}, option=db.write_option(exists=True))
    with pytest.raises(NotFound):
        ref.delete(option=db.write_option(exists=True))
    ref.set({"n": 1})
    with pytest.raises(FailedPrecondition):
        ref.delete(option=db.write_option(last_update_time=T0))
    assert ref.get().exists


# ------------------------------------------------------------------ batches


def test_batch_is_all_or_nothing_on_a_stale_guard(db, col):
    guarded, other = col.document("guarded"), col.document("other")
    guarded.set({"state": "idle"})
    snap = guarded.get()
    guarded.update({"state": "busy"})  # someone else won meanwhile
    batch = db.batch()
    batch.set(other, {"written": True}, merge=True)
    batch.update(guarded, {"state": "deleting"}, option=db.write_option(last_update_time=snap.update_time))
    with pytest.raises(FailedPrecondition):
        batch.commit()
    assert not other.get().exists and guarded.get().to_dict() == {"state": "busy"}


def test_batch_is_all_or_nothing_on_a_create_that_finds_the_document(db, col):
    fresh, taken = col.document("fresh"), col.document("taken")
    taken.set({"n": 1})
    batch = db.batch()
    batch.create(fresh, {"n": 1})
    batch.create(taken, {"n": 2})
    with pytest.raises(AlreadyExists):
        batch.commit()
    assert not fresh.get().exists and taken.get().to_dict() == {"n": 1}


def test_batch_commit_shares_one_update_time(db, col):
    a, b = col.document("a"), col.document("b")
    batch = db.batch()
    batch.set(a, {"n": 1})
    batch.create(b, {"n": 1})
    results = batch.commit()
    assert len(results) == 2 and results[0].update_time == results[1].update_time == a.get().update_time


def test_transaction_reads_then_writes(db, col):
    ref = col.document("tx")
    ref.set({"keys": {"0": "a"}})

    @firestore.transactional
    def add_key(tx):
        current = ref.get(transaction=tx).to_dict()["keys"]
        current.setdefault("1", "b")
        tx.set(ref, {"keys": current}, merge=True)
        return current

    assert add_key(db.transaction()) == {"0": "a", "1": "b"}
    assert ref.get().to_dict() == {"keys": {"0": "a", "1": "b"}}


# ------------------------------------------------------------------ transforms


def test_increment_on_a_missing_field_a_number_and_in_a_merge(db, col):
    ref = col.document("i")
    ref.set({"failures": firestore.Increment(1)}, merge=True)
    ref.set({"failures": firestore.Increment(1), "at": T0}, merge=True)
    assert ref.get().to_dict() == {"failures": 2, "at": T0}
    ref.update({"failures": firestore.Increment(0.5), "other": firestore.Increment(3)})
    assert ref.get().to_dict() == {"failures": 2.5, "at": T0, "other": 3}


def test_server_timestamp_and_array_transforms(db, col):
    ref = col.document("x")
    ref.set({"tags": ["a"], "at": firestore.SERVER_TIMESTAMP})
    snap = ref.get()
    # The commit's time (the emulator stores it at millisecond precision).
    assert abs(snap.to_dict()["at"] - snap.update_time) < timedelta(seconds=1)
    ref.update({"tags": firestore.ArrayUnion(["a", "b"])})
    ref.update({"tags": firestore.ArrayRemove(["a"])})
    assert ref.get().to_dict()["tags"] == ["b"]


# ------------------------------------------------------------------ queries


@pytest.fixture
def jobs(col):
    docs = {
        "a": {"state": "pending", "rank": 1, "submit": T0, "types": ["v4-8"], "req": {"id": "r1"}},
        "b": {"state": "pending", "rank": 3, "submit": T0 + timedelta(seconds=2), "types": ["v4-8", "v5e-8"]},
        "c": {"state": "pending", "rank": 3, "submit": T0 + timedelta(seconds=1), "types": ["v5e-8"]},
        "d": {"state": "running", "rank": 2, "submit": T0, "types": [], "req": {"id": "r2"}},
        "e": {"state": "done", "rank": "3", "types": ["v4-8"], "flag": True},
        "f": {"rank": 3, "flag": 1},  # no state, no submit
    }
    for doc_id, doc in docs.items():
        col.document(doc_id).set(doc)
    return col


@pytest.mark.parametrize("form", ["keyword", "positional"])
def test_equality_in_and_array_contains(jobs, form):
    def where(q, field, op, value):
        return q.where(filter=FieldFilter(field, op, value)) if form == "keyword" else q.where(field, op, value)

    assert sorted(ids(where(jobs, "state", "==", "pending"))) == ["a", "b", "c"]
    assert sorted(ids(where(jobs, "state", "in", ["running", "done"]))) == ["d", "e"]
    assert sorted(ids(where(jobs, "types", "array_contains", "v4-8"))) == ["a", "b", "e"]
    assert ids(where(jobs, "req.id", "==", "r1")) == ["a"]  # a nested field
    assert sorted(ids(where(where(jobs, "state", "==", "pending"), "rank", "==", 3))) == ["b", "c"]


@pytest.mark.parametrize("form", ["keyword", "positional"])
def test_null_equality_matches_stored_nulls_only(col, form):
    """`== None` (a FieldFilter makes it the unary IS_NULL) matches a stored null, never a missing field; `!= None`
    matches every other stored value (fleetreport.unheld_jobs asks `blocked == None`)."""
    col.document("null").set({"blocked": None})
    col.document("set").set({"blocked": "why"})
    col.document("missing").set({"other": 1})

    def where(field, op, value):
        return col.where(filter=FieldFilter(field, op, value)) if form == "keyword" else col.where(field, op, value)

    assert ids(where("blocked", "==", None)) == ["null"]
    assert ids(where("blocked", "!=", None)) == ["set"]


def test_comparisons_only_match_values_of_the_same_type(jobs):
    assert sorted(ids(jobs.where(filter=FieldFilter("rank", "==", 3)))) == ["b", "c", "f"]  # not the string "3"
    assert ids(jobs.where(filter=FieldFilter("flag", "==", True))) == ["e"]  # not the number 1
    assert sorted(ids(jobs.where(filter=FieldFilter("rank", "<=", 2)))) == ["a", "d"]
    at_or_before = jobs.where(filter=FieldFilter("submit", "<=", T0 + timedelta(seconds=1)))
    assert sorted(ids(at_or_before)) == ["a", "c", "d"]  # documents without `submit` never match


def test_order_by_limit_and_ties(jobs):
    pending = jobs.where(filter=FieldFilter("state", "==", "pending"))
    queue = pending.order_by("rank", direction=Query.DESCENDING).order_by("submit")
    assert ids(queue) == ["c", "b", "a"]
    assert ids(queue.limit(2)) == ["c", "b"]
    assert ids(jobs.order_by("submit")) == ["a", "d", "c", "b"]  # without the field: left out; ties by id
    assert ids(jobs.limit(2)) == ["a", "b"]


def test_descending_order_sorts_across_types_and_breaks_ties_by_id_descending(jobs):
    # A string sorts after every number; equal ranks come in document-id order, in the last order's direction.
    assert ids(jobs.order_by("rank", direction=Query.DESCENDING)) == ["e", "f", "c", "b", "d", "a"]


def test_count(jobs):
    assert count(jobs) == 6
    assert count(jobs.where(filter=FieldFilter("state", "==", "pending"))) == 3
    live = jobs.where(filter=FieldFilter("state", "in", ["pending", "running"])).where(
        filter=FieldFilter("rank", "==", 3))
    assert count(live) == 2
    assert count(jobs.where(filter=FieldFilter("state", "==", "nothing"))) == 0


def test_subcollections_are_their_own_collections(db, col):
    parent = col.document("j1")
    parent.set({"n": 1})
    parent.collection("attempts").document("1").set({"outcome": "ok"})
    assert ids(col) == ["j1"]
    assert {s.id: s.to_dict() for s in parent.collection("attempts").stream()} == {"1": {"outcome": "ok"}}


def test_not_equal_and_not_in_skip_missing_and_null_fields(col):
    for doc_id, doc in {"a": {"s": "x"}, "b": {"s": "y"}, "c": {"s": None}, "d": {}, "e": {"s": 1}}.items():
        col.document(doc_id).set(doc)
    # Ordered by the inequality's field first (a number sorts before a string).
    assert ids(col.where(filter=FieldFilter("s", "!=", "x"))) == ["e", "b"]
    assert ids(col.where(filter=FieldFilter("s", "not-in", ["x", "y"]))) == ["e"]
