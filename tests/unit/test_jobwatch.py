"""The live views' core (`tpuq.operations.jobwatch`) and its drawing (`tpuq.cli.views.watch_view`), from documents and
status objects as the scheduler and the workers write them: no stack."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from rich.console import Console

from tpuq.cli.views import watch_view
from tpuq.contracts.documents import AttemptDoc, JobDoc
from tpuq.operations.jobwatch import (STOPPED, LineAssembler, build_watch, change_lines, detach_message, duration, facts,
                                      job_exit_code, worker_count)

NOW = datetime(2026, 12, 1, 15, 0, 30, tzinfo=timezone.utc)
START = NOW - timedelta(seconds=30)
NODE = "projects/tpuq-local/locations/us-central2-a/nodes/tpuq-demo-pod-1"


def job(state="running", tpu=("v4-32",), **fields) -> JobDoc:
    doc = {"id": "pod-1", "state": state, "spec": {"tpu": list(tpu), "command": "x"}, "attempt": 1,
           "tpu": NODE, "zone": "us-central2-a", "submit_time": START - timedelta(seconds=5), "started_at": START,
           "job_bucket": "gs://b", **fields}
    if state == "pending":
        doc.update(attempt=0, tpu=None, zone=None, started_at=None)
    return JobDoc.from_doc(doc)


def attempt(**fields) -> AttemptDoc:
    return AttemptDoc.from_doc({"attempt": 1, "state": "running", "tpu": NODE, "zone": "us-central2-a",
                                "started_at": START, **fields})


def status(worker, code, ended_after=10, **fields) -> dict:
    return {"worker_id": worker, "worker_count": 4, "exit_code": code, "attempt_id": "a1",
            "started_at": "2026-12-01T15:00:00.000000Z",
            "ended_at": (START + timedelta(seconds=ended_after)).isoformat().replace("+00:00", "Z"), **fields}


TPU_DOC = {"type": "v4-32", "hosts": 4, "zone": "us-central2-a"}


@pytest.mark.parametrize("case, j, tpu, statuses, expected", [
    ("the node's tpus/ document", job(tpu=("v4-8", "v4-32")), TPU_DOC, {}, 4),
    ("the node's type when hosts is missing", job(tpu=("any",)), {"type": "v4-32"}, {}, 4),
    ("the status objects' worker_count", job(tpu=("any",)), None, {1: status(1, 0)}, 4),
    ("the one type the job asked for", job(), None, {}, 4),
    ("a v5e alias", job(tpu=("v5e-16",)), None, {}, 4),
    ("several types, nothing known yet", job(tpu=("v4-8", "v4-32")), None, {}, 0),
    ("never fewer than the workers that reported", job(tpu=("v4-8",)), None, {5: {"worker_id": 5}}, 6),
])
def test_worker_count(case, j, tpu, statuses, expected):
    assert worker_count(j, tpu, statuses) == expected, case


def test_running_slice_has_one_row_per_worker_before_any_status():
    # The bug this replaces: the job document has no tpu_type, so the view showed one row until all had exited.
    w = build_watch(job(), attempt(), TPU_DOC, {}, {2: "step 40"}, None, NOW)
    assert [(r.worker, r.state, r.exit_code) for r in w.workers] == [(i, "running", None) for i in range(4)]
    assert w.workers[2].last_line == "step 40" and w.workers[0].elapsed == 30
    assert w.node == "tpuq-demo-pod-1" and w.exit_code is None


def test_a_failing_workers_exit_code_shows_while_the_others_run():
    w = build_watch(job(), attempt(), TPU_DOC, {2: status(2, 3, tail="oops")}, {2: "oops"}, None, NOW)
    rows = {r.worker: r for r in w.workers}
    assert (rows[2].state, rows[2].exit_code, rows[2].elapsed) == ("failed", 3, 10)
    assert [rows[i].state for i in (0, 1, 3)] == ["running"] * 3


@pytest.mark.parametrize("case, state, statuses, reason, states, code", [
    ("all exited 0", "succeeded", {i: status(i, 0) for i in range(4)}, "all 4 workers exited 0",
     ["succeeded"] * 4, 0),
    ("the first failure's code; one stopped without a status", "failed",
     {0: status(0, 143, 20, signal="SIGTERM"), 1: status(1, 0), 2: status(2, 3, 5)}, "worker 2 exited 3",
     ["failed", "succeeded", "failed", STOPPED], 3),
    ("cancelled: workers without a status were cancelled", "cancelled", {0: status(0, 143, cancelled=True)},
     "cancelled by user", ["cancelled"] * 4, 1),
    ("setup failed", "failed", {i: status(i, None, phase="setup", setup_error="no bundle") for i in range(4)},
     "setup failed", ["failed_setup"] * 4, 1),
    ("130 would read as Ctrl-C", "failed", {0: status(0, 130)}, "worker 0 exited 130",
     ["failed", STOPPED, STOPPED, STOPPED], 1),
])
def test_an_ended_job(case, state, statuses, reason, states, code):
    w = build_watch(job(state, reason=reason, finished_at=NOW), attempt(state="ended"), TPU_DOC, statuses, {},
                    None, NOW)
    assert [r.state for r in w.workers] == states, case
    assert w.exit_code == code == job_exit_code(w), case


@pytest.mark.parametrize("case, state", [("rejected at intake", "rejected"), ("cancelled while pending", "cancelled")])
def test_a_job_that_never_had_a_tpu_has_no_worker_rows(case, state):
    never = JobDoc.from_doc({"id": "j", "state": state, "spec": {"tpu": ["v4-32"]}, "reason": "jobs[0].tpu: ..."})
    w = build_watch(never, None, None, {}, {}, None, NOW)
    assert w.workers == () and w.exit_code == 1, case
    assert facts(w) == {"job": f"{state}: jobs[0].tpu: ..."}, case


def test_pending_shows_why_and_the_rows_it_will_have():
    pending = job("pending", blocked="billing is disabled on project p")
    w = build_watch(pending, None, None, {}, {}, "racing v4-32 in us-central2-a, v4-32 in us-central2-c; "
                    "v4-32 in us-central2-b backed off until 15:10 UTC; blocked: billing is disabled on project p",
                    NOW)
    assert w.waiting == ("blocked: billing is disabled on project p",
                         "racing v4-32 in us-central2-a, v4-32 in us-central2-c",
                         "v4-32 in us-central2-b backed off until 15:10 UTC")
    assert [r.state for r in w.workers] == ["pending"] * 4 and w.elapsed == 35
    assert facts(w)["job"].startswith("pending: blocked: billing is disabled")


def test_a_racers_refusal_while_the_request_races_on_is_not_said_as_a_block():
    """A stockout in one zone while the others race: the reason as the scheduler wrote it, without "blocked:";
    with no request open (no entry can serve the job), "blocked:" as before."""
    racing = job("pending", blocked="v4-32 in us-central2-b: no capacity now (stockout); racing on in the other zones",
                 capacity_request={"id": "r-pod-1-1", "n": 1, "entry_id": "v4"})
    w = build_watch(racing, None, None, {}, {}, None, NOW)
    assert w.waiting == ("v4-32 in us-central2-b: no capacity now (stockout); racing on in the other zones",)
    assert facts(w)["job"].startswith("pending: v4-32 in us-central2-b: no capacity now")
    held = job("pending", blocked="no fleet entry offers v5p-8")
    assert build_watch(held, None, None, {}, {}, None, NOW).waiting == ("blocked: no fleet entry offers v5p-8",)
    # A refusal the request does not race on after is a block, request or not.
    refused = job("pending", blocked="v4-32 in us-central2-b: the project refuses new TPUs (`tpuq fleet` says why)",
                  capacity_request={"id": "r-pod-1-1", "n": 1, "entry_id": "v4"})
    assert build_watch(refused, None, None, {}, {}, None, NOW).waiting[0].startswith("blocked: v4-32 in us-central2-b")


def test_a_requeued_job_forgets_the_ended_attempts_statuses():
    requeued = job("pending", tpu=("v4-8", "v4-32"), attempt=1, reason="preempted: node preempted")
    w = build_watch(requeued, attempt(state="ended"), TPU_DOC, {0: status(0, 143)}, {}, None, NOW)
    assert w.workers == () and w.reason == "preempted: node preempted"


def piped_lines(*watches) -> list[str]:
    """What a piped watch prints over these successive reads: one line per new or changed fact."""
    seen, lines = None, []
    for w in watches:
        after = facts(w)
        lines += change_lines(seen, after)
        seen = after
    return lines


def test_a_job_pending_again_says_how_its_attempt_ended_once_and_waits_from_then():
    """A preempted run goes back to pending: the watch says why before it says what the job waits for (a trial
    saw `running` then `pending: ... backed off` with no word of the preemption), and counts the wait from the
    attempt's end, not from the submit."""
    preempted = attempt(state="ended", outcome="preempted", detail="node preempted\nmore",
                        ended_at=NOW - timedelta(seconds=10))
    requeued = job("pending", attempt=1)
    assert piped_lines(
        build_watch(job(), attempt(), TPU_DOC, {}, {}, None, NOW),
        build_watch(requeued, preempted, None, {}, {}, "racing v4-32 in us-central2-a", NOW),
        build_watch(requeued, preempted, None, {}, {}, "racing v4-32 in us-central2-b", NOW),
        build_watch(job(attempt=2), attempt(attempt=2), TPU_DOC, {}, {}, None, NOW),
    ) == [
        "running on tpuq-demo-pod-1 (us-central2-a, v4-32, 4 workers), attempt 1",
        "attempt 1 ended preempted: node preempted",
        "pending: racing v4-32 in us-central2-a",
        "pending: racing v4-32 in us-central2-b",
        "running on tpuq-demo-pod-1 (us-central2-a, v4-32, 4 workers), attempt 2",
    ]
    console = Console(width=160, record=True, force_terminal=False)
    console.print(watch_view(build_watch(requeued, preempted, None, {}, {}, "racing v4-32 in us-central2-a", NOW)))
    text = console.export_text()
    assert "attempt 1 ended preempted: node preempted; it runs again" in text and "waiting 10s" in text, text


def test_piped_lines_one_per_change_in_order():
    assert piped_lines(
        build_watch(job("pending"), None, None, {}, {}, "racing v4-32 in us-central2-a", NOW),
        build_watch(job("pending"), None, None, {}, {}, "racing v4-32 in us-central2-a", NOW),  # no change
        build_watch(job("assigned"), attempt(state="assigned"), TPU_DOC, {}, {}, None, NOW),
        build_watch(job(), attempt(), TPU_DOC, {}, {0: "step 1"}, None, NOW),
        build_watch(job(), attempt(), TPU_DOC, {}, {0: "step 2"}, None, NOW),  # a log line is no state change
        build_watch(job(), attempt(), TPU_DOC, {2: status(2, 3)}, {2: "oops"}, None, NOW),
        build_watch(job("failed", reason="worker 2 exited 3\nlast lines...", finished_at=NOW),
                    attempt(state="ended"), TPU_DOC, {2: status(2, 3), **{i: status(i, 0) for i in (0, 1, 3)}},
                    {2: "oops"}, None, NOW),
    ) == [
        "pending: racing v4-32 in us-central2-a",
        "assigned to tpuq-demo-pod-1 (us-central2-a, v4-32, 4 workers), attempt 1",
        "running on tpuq-demo-pod-1 (us-central2-a, v4-32, 4 workers), attempt 1",
        "worker 2: failed, exited 3; last line: oops",
        "worker 0: succeeded, exited 0",
        "worker 1: succeeded, exited 0",
        "worker 3: succeeded, exited 0",
        "failed: worker 2 exited 3",  # the job's end comes last
    ]


def test_the_view_draws_a_row_per_worker_with_the_failing_exit_code():
    w = build_watch(job(), attempt(), TPU_DOC, {2: status(2, 3)}, {1: "loss 0.25", 2: "Traceback: oops"}, None, NOW)
    console = Console(width=160, record=True, force_terminal=False)
    console.print(watch_view(w))
    text = console.export_text()
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert [r[:2] for r in rows] == [["0", "running"], ["1", "running"], ["2", "failed"], ["3", "running"]]
    assert rows[2][2] == "3" and "Traceback: oops" in text and "loss 0.25" in text
    assert "pod-1" in text and "tpuq-demo-pod-1" in text and "30s" in text


def test_the_view_of_a_pending_job_says_why():
    w = build_watch(job("pending"), None, None, {}, {}, "racing v4-32 in us-central2-a", NOW)
    console = Console(width=160, record=True, force_terminal=False)
    console.print(watch_view(w))
    text = console.export_text()
    assert "pending" in text and "racing v4-32 in us-central2-a" in text and "waiting 35s" in text


def test_log_lines_across_chunks():
    lines = LineAssembler()
    assert lines.feed(0, "one\ntw") == ["one"] and lines.last(0) == "tw"
    assert lines.feed(0, "o\n") == ["two"] and lines.last(0) == "two"
    assert lines.feed(1, "10%\r50%\r") == [] and lines.last(1) == "50%"
    assert lines.feed(0, "\n\n") == ["", ""] and lines.last(0) == "two"  # blank lines keep the last one shown
    lines.feed(1, "three")
    assert lines.flush() == [(1, "10%\r50%\rthree")] and lines.flush() == []


@pytest.mark.parametrize("seconds, text", [(None, ""), (0, "0s"), (59.9, "59s"), (125, "2m05s"), (3725, "1h02m")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_ctrl_c_says_the_job_keeps_running_and_how_to_watch_it():
    one = detach_message({"pod-1": "pending"})
    assert "keeps running (now pending; tpuq did not cancel it)" in one
    for command in ("tpuq watch pod-1", "tpuq logs pod-1 -f", "tpuq cancel pod-1"):
        assert command in one
    several = detach_message({"a": "running", "b": None})
    assert "keep running" in several and "tpuq watch a" in several and "tpuq cancel b" in several


def test_status_labels_a_racers_refusal_racing_and_a_block_blocked(monkeypatch):
    from datetime import timezone

    from tpuq.cli import views

    def shown(**fields) -> str:
        console = Console(record=True, width=200)
        monkeypatch.setattr(views, "out", console)
        doc = {"id": "pod-1", "state": "pending", "spec": {"tpu": ["v4-32"], "command": "x"}, "submit_time": START,
               **fields}
        views.print_job("pod-1", doc, [], now=NOW, tz=timezone.utc)
        return console.export_text()

    racing = shown(blocked="v4-32 in us-central2-b: no capacity now (stockout); racing on in the other zones",
                   capacity_request={"id": "r-pod-1-1", "n": 1, "entry_id": "v4"})
    assert "racing: v4-32 in us-central2-b: no capacity now" in racing and "blocked:" not in racing
    assert "blocked: no fleet entry offers v4-32" in shown(blocked="no fleet entry offers v4-32")


def test_status_keeps_a_reasons_further_lines_indented_under_it(monkeypatch):
    """A failed job's reason holds the failing worker's last lines: each stays inside the job's block."""
    from datetime import timezone

    from tpuq.cli import views

    console = Console(record=True, width=200)
    monkeypatch.setattr(views, "out", console)
    reason = "worker 2 exited 1\nlast lines of worker 2:\nboom on 2"
    doc = {"id": "pod-1", "state": "failed", "spec": {"tpu": ["v4-32"], "command": "x"}, "submit_time": START,
           "finished_at": NOW, "reason": reason,
           "attempt_history": [{"attempt": 1, "state": "ended", "outcome": "failed", "detail": reason}]}
    views.print_job("pod-1", doc, [], now=NOW, tz=timezone.utc)
    lines = console.export_text().splitlines()
    at = lines.index("  reason: worker 2 exited 1")
    assert lines[at + 1:at + 3] == ["    last lines of worker 2:", "    boom on 2"], lines
    assert all(line.startswith("  ") for line in lines[1:]), lines
