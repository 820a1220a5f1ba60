"""Issue 35 §5 on the dashboard, through Flask's test client on the in-memory Firestore and a GCS stand-in that
keeps each log chunk's write time (GCS's timeCreated): the Jobs page has owner and attempts columns; a job's page
shows "all workers" merged by time, not worker after worker; an earlier attempt's logs are one link away, under a
line naming the attempt, and the live fragment keeps polling that attempt."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest

from tests.ui.test_ui_routes import FakeClients, client_of
from tpuq.contracts import gcslayout, store

NOW = datetime(2026, 12, 1, 15, 0, tzinfo=timezone.utc)
BUCKET = "tpuq-jobs"


@dataclass
class Blob:
    name: str
    data: bytes
    time_created: datetime

    def download_as_bytes(self) -> bytes:
        return self.data


@dataclass
class Storage:
    blobs: list[Blob] = field(default_factory=list)

    def list_blobs(self, bucket, prefix=""):
        return sorted((b for b in self.blobs if bucket == BUCKET and b.name.startswith(prefix)), key=lambda b: b.name)

    def chunk(self, attempt: int, worker: int, seq: int, text: str, seconds_ago: float) -> None:
        self.blobs.append(Blob(gcslayout.log_chunk_name("train-1", attempt, worker, seq), text.encode(),
                               NOW - timedelta(seconds=seconds_ago)))


@pytest.fixture
def world():
    clients = FakeClients()
    clients.storage = Storage()
    jobs = clients.firestore.collection(store.JOBS)
    jobs.document("train-1").set({
        "id": "train-1", "state": "running", "priority": "normal", "owner": "ada@example.com",
        "spec": {"id": "train-1", "tpu": ["v4-16"], "command": "python train.py"}, "job_bucket": f"gs://{BUCKET}",
        "submit_time": NOW - timedelta(minutes=30), "started_at": NOW - timedelta(minutes=25),
        "attempt": 2, "attempts": 2, "preemptions": 1, "tpu": "projects/p/locations/z/nodes/tpuq-two"})
    attempts = jobs.document("train-1").collection(store.ATTEMPTS)
    attempts.document("1").set({"attempt": 1, "state": "ended", "outcome": "preempted", "tpu": "tpuq-one",
                                "started_at": NOW - timedelta(minutes=25), "ended_at": NOW - timedelta(minutes=10)})
    attempts.document("2").set({"attempt": 2, "state": "running", "tpu": "tpuq-two",
                                "started_at": NOW - timedelta(minutes=5)})
    s = clients.storage
    # Attempt 2: worker 0 and worker 1 take turns; worker 1's second line spans two chunks.
    s.chunk(2, 0, 0, "w0 step 1\n", 40)
    s.chunk(2, 1, 0, "w1 step 1\nw1 st", 30)
    s.chunk(2, 0, 1, "w0 step 2\n", 20)
    s.chunk(2, 1, 1, "ep 2\n", 10)
    s.chunk(1, 0, 0, "first try, worker 0\n", 700)
    s.chunk(1, 1, 0, "first try, worker 1\n", 690)
    return clients


def log_lines(page: str) -> list[str]:
    block = re.search(r'<pre class="logs" id="logs">(.*?)</pre>', page, re.S).group(1)
    return [html.unescape(re.sub(r"<[^>]+>", "", line)).strip() for line in block.splitlines() if line.strip()]


def test_the_jobs_page_has_owner_and_attempts_columns(world):
    page = client_of(world).get("/jobs").get_data(as_text=True)
    assert "<th>owner</th><th>attempts</th>" in page
    row = re.search(r'<tr data-job="train-1"[^>]*>(.*?)</tr>', page, re.S).group(1)
    assert '<td class="owner">ada@example.com</td>' in row and '<td class="attempts">2 (1 preempted)</td>' in row


def test_all_workers_are_merged_by_time_and_the_page_names_the_attempt(world):
    page = client_of(world).get("/jobs/train-1").get_data(as_text=True)
    assert log_lines(page) == ["[w0] w0 step 1", "[w1] w1 step 1", "[w0] w0 step 2", "[w1] w1 step 2"]
    header = re.search(r'<p class="hint" id="log-header" data-attempt="2">(.*?)</p>', page).group(1)
    assert header.startswith("attempt 2 of 2 of job train-1 (started 14:55:00 UTC on tpuq-two")
    one = client_of(world).get("/jobs/train-1?worker=1").get_data(as_text=True)
    assert log_lines(one) == ["[w1] w1 step 1", "[w1] w1 step 2"]


def test_an_earlier_attempts_logs_are_a_link_away_and_stay_chosen_while_polling(world):
    client = client_of(world)
    page = client.get("/jobs/train-1").get_data(as_text=True)
    nav = re.search(r'<nav class="attempts-filter" id="log-attempts">(.*?)</nav>', page, re.S).group(1)
    assert re.findall(r'data-attempt="(\d)">attempt \d<', nav) == ["1", "2"]
    assert 'href="/jobs/train-1?attempt=1#logs"' in page  # the timeline's own link, per attempt
    earlier = client.get("/jobs/train-1?attempt=1").get_data(as_text=True)
    assert log_lines(earlier) == ["[w0] first try, worker 0", "[w1] first try, worker 1"]
    assert "attempt 1 of 2 of job train-1 (started 14:35:00 UTC on tpuq-one, ended preempted)" in earlier
    assert re.search(r'hx-get="/jobs/train-1/live\?[^"]*attempt=1', earlier)  # the poll keeps attempt 1
    live = client.get("/jobs/train-1/live?attempt=1&worker=1").get_data(as_text=True)
    assert log_lines(live) == ["[w1] first try, worker 1"]
