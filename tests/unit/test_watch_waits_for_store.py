"""`tpuq watch` right after `tpuq submit`: the job is stored only once the scheduler has taken its message in, so
the watch waits for it (a bounded grace, said on stderr) instead of calling a just-submitted id unknown."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest

from tpuq.contracts import store
from tpuq.cli.console import CliError
from tpuq.cli.live import _await_stored
from tpuq_dev.inmemory import MemoryFirestore


def _store_later(db, collection: str, doc_id: str, doc: dict, after: float) -> threading.Timer:
    timer = threading.Timer(after, lambda: db.collection(collection).document(doc_id).set(doc))
    timer.start()
    return timer


@pytest.mark.parametrize("arrives, grace, says", [
    (None, 0.3, None),  # never stored, no refusal: unknown after the grace
    ((store.DEAD_LETTERS, "dl-1", {"job_id": "j1", "message_id": "9", "topic": "jobs",
                                      "recorded_at": datetime(2026, 12, 1, tzinfo=timezone.utc)}), 30.0, "was refused"),
    ((store.JOBS, "j1", {"state": "pending"}), 30.0, ""),  # stored a moment later: the watch goes on
])
def test_a_just_submitted_job_is_waited_for(arrives, grace, says):
    db = MemoryFirestore()
    timer = _store_later(db, *arrives, after=0.2) if arrives else None
    try:
        if says == "":
            _await_stored(db, "j1", grace=grace, poll=0.05)
            return
        with pytest.raises(CliError) as refused:
            _await_stored(db, "j1", grace=grace, poll=0.05)
        assert (says or "no job 'j1'") in str(refused.value)
    finally:
        if timer:
            timer.cancel()
