"""The liveness rule (tpuq.contracts.liveness), pure: which pending jobs nothing holds."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpuq.contracts.documents import JobDoc
from tpuq.contracts.liveness import LIVENESS_BOUND, nothing_holds

NOW = datetime(2026, 12, 3, 18, 30, tzinfo=timezone.utc)
LATE = NOW - LIVENESS_BOUND - timedelta(seconds=1)


def job(**fields) -> JobDoc:
    doc = {"id": "j", "state": "pending", "submit_time": LATE, "updated_at": LATE, **fields}
    return JobDoc.from_doc(doc)


@pytest.mark.parametrize("case, fields, open_ids, broken", [
    ("assigned: not pending", {"state": "assigned"}, set(), False),
    ("an open request holds it", {"capacity_request": {"id": "r-j-2"}}, {"r-j-2"}, False),
    ("a stated reason holds it", {"blocked": "waiting for a TPU: the fleet holds its maximum"}, set(), False),
    ("nothing at all", {}, set(), True),
    ("a request the claimer does not hold open, whatever the reason shown",
     {"capacity_request": {"id": "r-j-2"}, "blocked": "v4-8 in us-central2-b: no capacity now"}, {"r-j-3"}, True),
    ("still within the bound after its back-off", {"not_before": NOW - timedelta(seconds=30)}, set(), False),
    ("within the bound after its last change", {"updated_at": NOW - timedelta(seconds=5)}, set(), False),
    ("the back-off ended longer ago than the bound", {"not_before": LATE}, set(), True),
])
def test_nothing_holds(case, fields, open_ids, broken):
    reason = nothing_holds(job(**fields), open_ids, NOW)
    assert bool(reason) is bool(broken), (case, reason)
    if broken:
        assert "a tpuq bug" in reason and "nothing holds it for 2 min" in reason


def test_the_reason_names_the_request_nobody_serves():
    reason = nothing_holds(job(capacity_request={"id": "r-j-2"}), set(), NOW)
    assert "its capacity request r-j-2 is not open at the claimer" in reason
