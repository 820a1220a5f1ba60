"""The in-memory Firestore measures documents by Firestore's storage-size rules (cloud.google.com/firestore/docs/
storage-size), so it refuses what Firestore refuses (over 1 MiB; tests/contract has the refusals on both stores).
A merge or an update re-measures only the fields it names: the kept size must equal a full measure."""

from __future__ import annotations

from datetime import datetime, timezone

from google.cloud import firestore

from tpuq_dev.inmemory import MemoryFirestore
from tpuq_dev.inmemory.firestore import document_size


def test_the_documented_example_is_147_bytes():
    # users/jeff/tasks/my_task_id: name 44, fields 71, + 32 (the page's worked example)
    task = {"type": "Personal", "done": False, "priority": 1, "description": "Learn Cloud Firestore"}
    assert document_size("users/jeff/tasks/my_task_id", task) == 147


def test_sizes_kept_across_merges_updates_transforms_and_deletes_equal_a_full_measure():
    db = MemoryFirestore()
    ref = db.collection("jobs").document("j1")
    path = "jobs/j1"

    def kept() -> int:
        return db._stored(path).size

    ref.set({"spec": {"command": "train", "env": {"A": "1"}}, "n": 1, "tags": ["a", "b"], "é": None})
    steps = [
        lambda: ref.update({"spec.command": "x" * 100, "blocked": "why"}),
        lambda: ref.set({"spec": {"env": {"B": "2"}}, "at": datetime(2026, 1, 1, tzinfo=timezone.utc)}, merge=True),
        lambda: ref.update({"n": firestore.Increment(5), "tags": firestore.ArrayUnion(["c"])}),
        lambda: ref.update({"blocked": firestore.DELETE_FIELD, "spec.env.A": firestore.DELETE_FIELD}),
        lambda: ref.set({"only": b"\x00\x01"}),
    ]
    assert kept() == document_size(path, ref.get().to_dict())
    for step in steps:
        step()
        assert kept() == document_size(path, ref.get().to_dict())
