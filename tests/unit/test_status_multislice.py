"""`tpuq status JOB` of a multislice job (issue 37): each attempt says the slices it ran on, from the attempt's
`gang`, and an elastic job that got fewer than it asked for says so ("2 slices of v4-32 (asked 4)")."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tpuq.contracts.documents import AttemptDoc
from tpuq.operations.runview import attempt_line
from tests.unit.test_run_life_views import printed

NOW = datetime(2026, 12, 1, 17, 34, 29, tzinfo=timezone.utc)
UTC = timezone.utc


def gang(prefix: str, n: int) -> list[str]:
    return [f"projects/p/locations/us-central2-b/nodes/{prefix}-{i}" for i in range(n)]


def attempt(n: int, nodes: list[str], **fields) -> dict:
    return {"attempt": n, "state": "ended", "outcome": "preempted", "tpu": nodes[0], "gang": nodes if len(nodes) > 1
            else [], "started_at": NOW - timedelta(minutes=30), "ended_at": NOW - timedelta(minutes=20), **fields}


def elastic_job(history: list[dict]) -> dict:
    return {"id": "ms-1", "state": "running", "priority": "normal", "owner": "ada@example.com",
            "spec": {"id": "ms-1", "tpu": ["v4-32"], "slices": [4, 2, 1], "command": "python train.py"},
            "submit_time": NOW - timedelta(minutes=40), "attempt": len(history), "attempts": len(history),
            "attempt_history": history}


def test_each_attempt_says_the_slices_it_got_and_what_the_job_asked():
    from tpuq.cli.views import print_job

    history = [attempt(1, gang("tpuq-a", 4)), attempt(2, gang("tpuq-b", 2)),
               attempt(3, gang("tpuq-c", 1), state="running", outcome=None, ended_at=None)]
    text = printed(print_job, "ms-1", elastic_job(history), [], now=NOW, tz=UTC)
    assert "tpu: v4-32   slices: 4, 2, 1" in text, text
    assert "attempt 1: ended preempted on 4 slices of v4-32: tpuq-a-0, tpuq-a-1, tpuq-a-2, tpuq-a-3," in text, text
    assert "attempt 2: ended preempted on 2 slices of v4-32 (asked 4): tpuq-b-0, tpuq-b-1, started" in text, text
    assert "attempt 3: running on 1 slice of v4-32 (asked 4): tpuq-c-0, started" in text, text


def test_a_fixed_count_job_says_its_slices_without_asked():
    line = attempt_line(AttemptDoc.from_doc(attempt(1, gang("tpuq-a", 2))), UTC, NOW, "v4-32", 2)
    assert line.startswith("attempt 1: ended preempted on 2 slices of v4-32: tpuq-a-0, tpuq-a-1, started"), line


def test_a_single_slice_attempt_reads_as_before():
    doc = AttemptDoc.from_doc(attempt(1, ["tpuq-one"]))
    assert attempt_line(doc, UTC, NOW).startswith("attempt 1: ended preempted on tpuq-one, started")
    assert attempt_line(doc, UTC, NOW, "v4-8", 1) == attempt_line(doc, UTC, NOW)
