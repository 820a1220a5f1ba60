"""`tpuq watch` of a multislice job (issue 37): one row per worker of every slice, in the attempt's numbering
(tpuq.contracts.workers), labelled `s1/w0` and grouped by slice; the piped lines name workers the same way. From
documents and status objects as the scheduler and the workers write them: no stack."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from rich.console import Console

from tpuq.cli.views import watch_view
from tpuq.contracts.documents import AttemptDoc, JobDoc
from tpuq.operations.jobwatch import build_watch, change_lines, facts, where

NOW = datetime(2026, 12, 1, 15, 0, 30, tzinfo=timezone.utc)
START = NOW - timedelta(seconds=30)
NODES = tuple(f"projects/tpuq-local/locations/us-central2-b/nodes/tpuq-demo-ms-{i}" for i in range(2))
TPU_DOC = {"type": "v4-32", "hosts": 4, "zone": "us-central2-b"}  # slice 0's tpus/ document


def job(state="running", slices=2, gang=NODES, **fields) -> JobDoc:
    return JobDoc.from_doc({"id": "ms-1", "state": state, "spec": {"tpu": ["v4-32"], "slices": slices, "command": "x"},
                            "attempt": 1, "tpu": gang[0] if gang else NODES[0], "gang": list(gang),
                            "zone": "us-central2-b", "submit_time": START, "started_at": START, "job_bucket": "gs://b",
                            **fields})


def attempt(gang=NODES, **fields) -> AttemptDoc:
    return AttemptDoc.from_doc({"attempt": 1, "state": "running", "tpu": gang[0] if gang else NODES[0],
                                "gang": list(gang), "zone": "us-central2-b", "started_at": START, **fields})


def status(worker, code, **fields) -> dict:
    return {"worker_id": worker, "worker_count": 8, "exit_code": code, "attempt_id": "a1",
            "started_at": "2026-12-01T15:00:00.000000Z", "ended_at": "2026-12-01T15:00:10.000000Z", **fields}


def test_every_worker_of_every_slice_has_a_row_labelled_by_slice():
    w = build_watch(job(), attempt(), TPU_DOC, {5: status(5, 3)}, {5: "oops", 0: "step 4"}, None, NOW)
    assert [(r.worker, r.label, r.slice_id, r.state) for r in w.workers] == [
        (0, "s0/w0", 0, "running"), (1, "s0/w1", 0, "running"), (2, "s0/w2", 0, "running"),
        (3, "s0/w3", 0, "running"), (4, "s1/w0", 1, "running"), (5, "s1/w1", 1, "failed"),
        (6, "s1/w2", 1, "running"), (7, "s1/w3", 1, "running")]
    assert w.slices == 2 and w.nodes == ("tpuq-demo-ms-0", "tpuq-demo-ms-1")
    assert where(w) == ("tpuq-demo-ms-0, tpuq-demo-ms-1 (us-central2-b, 2 slices of v4-32, 8 workers), attempt 1")


def test_the_status_objects_count_every_slice_when_no_tpu_document_is_read():
    w = build_watch(job(), attempt(), None, {6: status(6, 0)}, {}, None, NOW)
    assert len(w.workers) == 8 and w.workers[6].label == "s1/w2"


def test_the_view_groups_rows_by_slice():
    w = build_watch(job(), attempt(), TPU_DOC, {5: status(5, 3)}, {5: "Traceback: oops"}, None, NOW)
    console = Console(width=160, record=True, force_terminal=False)
    console.print(watch_view(w))
    text = console.export_text()
    lines = [line for line in text.splitlines() if line.strip()]
    rows = [line.split() for line in lines if "/w" in line]
    labels = [next(cell for cell in r if "/w" in cell) for r in rows]
    assert labels == [f"s{s}/w{i}" for s in (0, 1) for i in range(4)]
    assert rows[0][:2] == ["s0", "tpuq-demo-ms-0"] and rows[4][:2] == ["s1", "tpuq-demo-ms-1"]
    assert rows[5][:3] == ["s1/w1", "failed", "3"] and "Traceback: oops" in " ".join(rows[5])
    # the slices apart: the line after s0/w3 separates them, before s1's first row
    every = text.splitlines()
    i = next(n for n, line in enumerate(every) if "s0/w3" in line)
    assert not every[i + 1].strip() and "s1/w0" in every[i + 2]


def test_an_elastic_job_that_got_fewer_slices_says_so():
    w = build_watch(job(slices=[4, 2]), attempt(), TPU_DOC, {}, {}, None, NOW)
    assert len(w.workers) == 8 and "2 slices of v4-32 (asked 4)" in where(w)
    one = build_watch(job(slices=[4, 1], gang=()), attempt(gang=()), TPU_DOC, {}, {}, None, NOW)
    assert [r.label for r in one.workers] == ["s0/w0", "s0/w1", "s0/w2", "s0/w3"]  # as `tpuq logs` labels them
    assert "1 slice of v4-32 (asked 4)" in where(one)


def test_a_pending_multislice_job_shows_the_rows_it_asks_for():
    pending = job("pending", attempt=0, tpu=None, gang=(), started_at=None)
    w = build_watch(pending, None, None, {}, {}, "racing a 2-slice v4-32 request in us-central2-b", NOW)
    assert [r.label for r in w.workers][3:5] == ["s0/w3", "s1/w0"] and len(w.workers) == 8
    assert w.nodes == () and w.node is None


def test_piped_lines_name_the_worker_by_slice():
    ended = job("failed", reason="worker 5 exited 3", finished_at=NOW)
    statuses = {5: status(5, 3), **{i: status(i, 143, signal="SIGTERM") for i in (0, 1, 2, 3, 4, 6, 7)}}
    w = build_watch(ended, attempt(state="ended"), TPU_DOC, statuses, {5: "oops"}, None, NOW)
    lines = change_lines(None, facts(w))
    assert "worker s1/w1: failed, exited 3; last line: oops" in lines
    assert "worker s0/w0: failed, exited 143 (SIGTERM)" in lines and lines[-1] == "failed: worker 5 exited 3"


def test_a_single_slice_job_is_shown_as_before():
    single = JobDoc.from_doc({"id": "j", "state": "running", "spec": {"tpu": ["v4-32"], "command": "x"},
                              "attempt": 1, "tpu": NODES[0], "zone": "us-central2-b", "started_at": START})
    w = build_watch(single, attempt(gang=()), TPU_DOC, {}, {}, None, NOW)
    assert [(r.label, r.slice_id, r.name) for r in w.workers] == [("", None, str(i)) for i in range(4)]
    assert where(w) == "tpuq-demo-ms-0 (us-central2-b, v4-32, 4 workers), attempt 1"


def test_the_reader_finds_the_gang_in_the_stored_documents():
    """What `tpuq watch` reads each poll (tpuq.operations.jobreader), on the documents as the scheduler stores them."""
    from tpuq.contracts import store
    from tpuq.operations.jobreader import JobReader
    from tpuq_dev.inmemory import MemoryFirestore

    class Clients:
        firestore = MemoryFirestore()

    jobs = Clients.firestore.collection(store.JOBS)
    jobs.document("ms-1").set({"id": "ms-1", "state": "running", "attempt": 1, "tpu": NODES[0], "gang": list(NODES),
                               "zone": "us-central2-b", "started_at": START,
                               "spec": {"tpu": ["v4-32"], "slices": [4, 2], "command": "x"}})
    jobs.document("ms-1").collection(store.ATTEMPTS).document("1").set(
        {"attempt": 1, "state": "running", "tpu": NODES[0], "gang": list(NODES), "started_at": START})
    Clients.firestore.collection(store.TPUS).document("tpuq-demo-ms-0").set(TPU_DOC)
    w = JobReader(Clients(), "ms-1", timezone.utc, details=False).read(NOW)
    assert [r.label for r in w.workers] == [f"s{s}/w{i}" for s in (0, 1) for i in range(4)]
    assert "2 slices of v4-32 (asked 4)" in where(w) and w.nodes == ("tpuq-demo-ms-0", "tpuq-demo-ms-1")
