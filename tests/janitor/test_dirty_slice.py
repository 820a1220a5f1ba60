"""A slice quarantined for a dirty host (the worker preflight, a known TPU runtime failure) is deleted by the janitor
at once, through the ownership check: long before its idle timeout, and only when it carries tpuq's marks."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tests.janitor.conftest import ACTIVE_AFTER, WIN_ZONE

REASON = "attempt j1-1 ended infra_failed: preflight failed: worker 2: /dev/vfio/0 is held by pid 4711 (sleep 300)"


def quarantined_idle_tpu(s, qr: str) -> str:
    """The scheduler's record once it freed the slice of an attempt that ended infra_failed (lifecycle.tpu_freed)."""
    tpu_id = s.record_tpu(qr, state="idle", idle_since=datetime.now(timezone.utc))
    s.write_tpu(tpu_id, {"quarantined": True, "quarantine_reason": REASON})
    return tpu_id


@pytest.mark.fleet(idle_timeout_seconds=3600, entry={"keep_warm_count": 1})
def test_a_quarantined_dirty_slice_is_deleted_at_once_and_not_kept_warm(janitor_stack):
    s = janitor_stack
    qr = s.create_owned("r20", WIN_ZONE)
    s.advance(ACTIVE_AFTER + 1)
    tpu_id = quarantined_idle_tpu(s, qr)
    node = qr.replace("/queuedResources/", "/nodes/")
    s.post_twice("/push/attempt-events", {"kind": "ended", "job_id": "j1", "attempt": 1, "attempt_id": "j1-1",
                                          "node": node, "outcome": "infra_failed", "detail": REASON.split(": ", 1)[1],
                                          "at": datetime.now(timezone.utc).isoformat()})
    s.tick()
    assert s.deleted_ids() == [qr.rsplit("/", 1)[-1]]
    doc = s.tpu_doc(tpu_id)
    assert doc["state"] == "gone" and doc["delete_reason"] == f"quarantined: {REASON}"


@pytest.mark.fleet(idle_timeout_seconds=0)
def test_a_quarantined_slice_without_our_marks_is_left_alone(janitor_stack):
    s = janitor_stack
    name = s.create("tpuq-r21-" + WIN_ZONE, WIN_ZONE, {"tpuq-owner": "someone-else"})
    s.advance(ACTIVE_AFTER + 1)
    tpu_id = quarantined_idle_tpu(s, name)
    s.tick()
    assert s.deletes() == []
    assert "left alone" in s.tpu_doc(tpu_id)["gone_reason"]
