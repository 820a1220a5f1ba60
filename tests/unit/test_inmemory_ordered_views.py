"""The in-memory Firestore answers a limited query (ordered, or in id order) with an equality filter from an ordered view kept up
to date by every write. Its answers must be exactly those of ordering every match (the path without a limit),
through creates, updates that move a document in or out of the view, and deletes."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from google.cloud.firestore import FieldFilter, Query

from tpuq_dev.inmemory import MemoryFirestore

T0 = datetime(2026, 1, 5, tzinfo=timezone.utc)
ORDERS = [
    [("rank", Query.DESCENDING), ("at", Query.ASCENDING)],
    [("at", Query.ASCENDING)],
    [("rank", Query.ASCENDING)],
    [("at", Query.DESCENDING)],
    [],  # none: in id order (a limited query's view then keeps the matches by id)
]


def _random_doc(rng: random.Random) -> dict:
    doc = {"state": rng.choice(["pending", "running", "done"]), "types": rng.sample(["a", "b", "c", "any"], 2),
           "rank": rng.choice([0, 1, 2, 2.0]), "at": T0 + timedelta(seconds=rng.randrange(50))}
    if rng.random() < 0.1:
        del doc["rank"]  # a document without an order field is never among an ordered query's results
    return doc


def _random_jobs(rng: random.Random, count: int = 120) -> tuple[MemoryFirestore, list[str]]:
    """A store with `count` random jobs, and their ids."""
    db = MemoryFirestore()
    ids = [f"j{i:03d}" for i in range(count)]
    for doc_id in ids:
        db.collection("jobs").document(doc_id).set(_random_doc(rng))
    return db, ids


def _rewrite_some(db, ids: list[str], rng: random.Random) -> None:
    """Eight writes between queries (a delete or a new version each): the views must follow them."""
    for _ in range(8):
        doc_id = rng.choice(ids)
        if rng.random() < 0.15:
            db.collection("jobs").document(doc_id).delete()
        else:
            db.collection("jobs").document(doc_id).set(_random_doc(rng))


def _query(db, orders, limit, types=None, states=None):
    q = db.collection("jobs").where(filter=FieldFilter("state", "in", states) if states
                                    else FieldFilter("state", "==", "pending"))
    if types:
        q = q.where(filter=FieldFilter("types", "array_contains_any", types))
    for field, direction in orders:
        q = q.order_by(field, direction=direction)
    return q.limit(limit) if limit is not None else q


@pytest.mark.parametrize("seed", range(6))
def test_a_limited_query_answers_as_ordering_every_match_would(seed):
    rng = random.Random(seed)
    db, ids = _random_jobs(rng)
    for _ in range(40):
        orders, limit, types = rng.choice(ORDERS), rng.choice([1, 5, 30, 500]), rng.choice([None, ["a", "any"]])
        states = rng.choice([None, ["pending", "running"]])
        everything = [s.id for s in _query(db, orders, None, types, states).stream()]
        assert [s.id for s in _query(db, orders, limit, types, states).stream()] == everything[:limit]
        for _ in range(8):  # writes between queries: the views follow them
            doc_id = rng.choice(ids)
            if rng.random() < 0.15:
                db.collection("jobs").document(doc_id).delete()
            elif rng.random() < 0.5 or not db.collection("jobs").document(doc_id).get().exists:
                db.collection("jobs").document(doc_id).set(_random_doc(rng))
            else:
                db.collection("jobs").document(doc_id).update({"state": rng.choice(["pending", "done"])})


def test_a_nan_order_key_does_not_corrupt_the_view():
    db = MemoryFirestore()
    for i, v in enumerate([1, 2, float("nan"), 3, 4]):
        db.collection("c").document(f"d{i}").set({"s": "p", "x": v})

    def first_ten():
        return [s.id for s in db.collection("c").where(filter=FieldFilter("s", "==", "p")).order_by("x").limit(10).stream()]

    first_ten()
    db.collection("c").document("d2").set({"s": "p", "x": 5})
    assert first_ten() == ["d0", "d1", "d3", "d4", "d2"]
    db.collection("c").document("d2").delete()
    assert first_ten() == ["d0", "d1", "d3", "d4"]


@pytest.mark.parametrize("seed", range(4))
def test_a_lower_bounded_query_answers_as_a_scan_would(seed):
    """`state == x and at > t` (what changed since t) is answered from the view from the bound on; the answer is
    the scan's: every match, in `at` order, through writes that move documents in and out of it."""
    rng = random.Random(seed)
    db, ids = _random_jobs(rng)
    for _ in range(40):
        since, op = T0 + timedelta(seconds=rng.randrange(-5, 55)), rng.choice([">", ">="])
        q = (db.collection("jobs").where(filter=FieldFilter("state", "==", "pending"))
             .where(filter=FieldFilter("at", op, since)))
        scanned = sorted(((s.to_dict()["at"], s.id) for s in db.collection("jobs").stream()
                          if s.to_dict()["state"] == "pending"
                          and (s.to_dict()["at"] > since if op == ">" else s.to_dict()["at"] >= since)))
        assert [s.id for s in q.stream()] == [doc_id for _, doc_id in scanned]
        _rewrite_some(db, ids, rng)


@pytest.mark.parametrize("seed", range(4))
def test_the_candidates_from_a_time_hold_every_match_at_or_after_it(seed):
    """`_candidates_from` (the simulator's moving range filters, `TpuqPolicy._note_moving_filters`): among the
    documents it gives, every one the filters match whose time is at or after the bound, through writes."""
    from tpuq_dev.inmemory.firestore import _Filter

    rng = random.Random(seed)
    db, ids = _random_jobs(rng)
    for _ in range(40):
        lower = T0 + timedelta(seconds=rng.randrange(-5, 55))
        states = rng.choice([["pending"], ["pending", "running"]])
        filters = ((_Filter("state", "==", states[0]),) if len(states) == 1
                   else (_Filter("state", "in", states),))
        wanted = {s.id for s in db.collection("jobs").stream()
                  if s.to_dict()["state"] in states and s.to_dict()["at"] >= lower}
        given = [doc_id for doc_id, _ in db._candidates_from("jobs", filters, "at", lower)]
        assert len(given) == len(set(given))
        assert wanted <= set(given)
        _rewrite_some(db, ids, rng)
