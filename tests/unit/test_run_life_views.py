"""Issue 35 §5, what a person sees of a run's life in the CLI: `tpuq status JOB` (each time with its own age, each
attempt's start and end, no `None`), `tpuq logs` (which attempt, `--attempt N`, the header off the piped log),
and the list commands piped (`tpuq dead-letters`, `tpuq fleet`: tab-separated lines, nothing wrapped).

In this process, through typer's runner (stdout is not a terminal there: the piped case) on the in-memory
Firestore and a GCS stand-in holding log chunks."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tpuq.contracts import gcslayout, store
from tpuq_dev.inmemory import MemoryFirestore

NOW = datetime(2026, 12, 1, 17, 34, 29, tzinfo=timezone.utc)
UTC = timezone.utc


@dataclass
class Blob:
    name: str
    data: bytes
    time_created: datetime | None = None

    def download_as_bytes(self) -> bytes:
        return self.data


@dataclass
class Storage:
    blobs: dict[str, list[Blob]] = field(default_factory=dict)  # bucket -> blobs

    def list_blobs(self, bucket, prefix=""):
        return [b for b in self.blobs.get(bucket, []) if b.name.startswith(prefix)]

    def put(self, bucket: str, name: str, text: str, at: datetime | None = None) -> None:
        self.blobs.setdefault(bucket, []).append(Blob(name, text.encode(), at))


@dataclass
class Clients:
    firestore: MemoryFirestore = field(default_factory=MemoryFirestore)
    storage: Storage = field(default_factory=Storage)


def retried_job(clients: Clients) -> None:
    """Job `train-1`: attempt 1 preempted, attempt 2 running; each attempt's worker logs in its bucket."""
    jobs = clients.firestore.collection(store.JOBS)
    jobs.document("train-1").set({
        "id": "train-1", "state": "running", "priority": "normal", "source": "cli", "owner": "ada@example.com",
        "spec": {"id": "train-1", "tpu": ["v4-16"], "command": "python train.py"}, "job_bucket": "gs://tpuq-jobs",
        "submit_time": NOW - timedelta(minutes=30), "started_at": NOW - timedelta(minutes=25),
        "attempt": 2, "attempts": 2, "tpu": "projects/p/locations/z/nodes/tpuq-two"})
    attempts = jobs.document("train-1").collection(store.ATTEMPTS)
    attempts.document("1").set({"attempt": 1, "state": "ended", "outcome": "preempted", "tpu": "tpuq-one",
                                "assigned_at": NOW - timedelta(minutes=26), "started_at": NOW - timedelta(minutes=25),
                                "ended_at": NOW - timedelta(minutes=10), "detail": "TPU tpuq-one preempted"})
    attempts.document("2").set({"attempt": 2, "state": "running", "tpu": "tpuq-two",
                                "assigned_at": NOW - timedelta(minutes=6), "started_at": NOW - timedelta(minutes=5)})
    for n in (1, 2):
        for w in (0, 1):
            clients.storage.put("tpuq-jobs", gcslayout.log_chunk_name("train-1", n, w, 0), f"attempt {n} worker {w}\n")


def printed(fn, *args, **kwargs) -> str:
    """What a `tpuq.cli.views` printer wrote, on a wide console."""
    from tpuq.cli import views

    buffer = io.StringIO()
    saved = views.out
    views.out = Console(file=buffer, width=300, soft_wrap=True)
    try:
        fn(*args, **kwargs)
    finally:
        views.out = saved
    return buffer.getvalue()


def test_status_gives_each_time_its_own_age_and_each_attempt_its_start_and_end():
    from tpuq.cli.views import print_job

    clients = Clients()
    retried_job(clients)
    stored = clients.firestore.collection(store.JOBS).document("train-1").get().to_dict()
    stored |= {"state": "succeeded", "finished_at": NOW - timedelta(minutes=2)}
    stored["attempt_history"] = [clients.firestore.collection(store.JOBS).document("train-1")
                                 .collection(store.ATTEMPTS).document(str(n)).get().to_dict() for n in (1, 2)]
    stored["attempt_history"][1] |= {"state": "ended", "outcome": "succeeded", "ended_at": NOW - timedelta(minutes=2)}
    text = printed(print_job, "train-1", stored, [], now=NOW, tz=UTC)
    assert ("submitted 17:04:29 UTC (30m ago), started 17:09:29 UTC (25m ago), finished 17:32:29 UTC (2m ago)"
            in text), text
    assert ("attempt 1: ended preempted on tpuq-one, started 17:09:29 UTC, ended 17:24:29 UTC (ran 15m00s) "
            "- TPU tpuq-one preempted") in text, text
    assert "attempt 2: ended succeeded on tpuq-two, started 17:29:29 UTC, ended 17:32:29 UTC (ran 3m00s)" in text


def test_a_rejected_job_prints_no_none():
    from tpuq.cli.views import print_job

    rejected = {"id": "job-77", "state": "rejected", "reason": "jobs[0].tpu: unknown TPU type v9-8",
                "submit_time": NOW - timedelta(seconds=5), "attempt_history": []}
    text = printed(print_job, "job-77", rejected, [], now=NOW, tz=UTC)
    assert "None" not in text and "priority" not in text, text
    assert "state: rejected" in text and "owner: unknown" in text and "submitted 17:34:24 UTC (5s ago)" in text


@pytest.fixture
def cli(monkeypatch):
    """`tpuq ARGS` on these clients, as a person runs it with stdout piped; times in UTC."""
    from tpuq.cli import connecting, deadletters, fleet, jobs
    from tpuq.cli.app import app

    clients = Clients()
    monkeypatch.setattr(connecting, "CURRENT", None)
    for module in (jobs, deadletters):
        monkeypatch.setattr(module, "cli_clients", lambda: clients)
    monkeypatch.setattr(fleet, "local_zone", lambda: UTC)

    def run(*args: str):
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "80"}, catch_exceptions=False)

    run.clients = clients
    return run


def test_logs_name_their_attempt_on_stderr_when_piped_and_attempt_picks_an_earlier_one(cli):
    retried_job(cli.clients)
    latest = cli("logs", "train-1")
    assert latest.exit_code == 0, latest.output
    assert latest.stdout.splitlines() == ["[w0] attempt 2 worker 0", "[w1] attempt 2 worker 1"]  # the log alone
    assert latest.stderr.startswith("attempt 2 of 2 of job train-1 (started "), latest.stderr
    assert " on tpuq-two)" in latest.stderr.splitlines()[0]
    earlier = cli("logs", "train-1", "--attempt", "1", "--worker", "1")
    assert earlier.stdout.splitlines() == ["[w1] attempt 1 worker 1"]
    assert "attempt 1 of 2 of job train-1 (started " in earlier.stderr and "ended preempted)" in earlier.stderr
    from tpuq.cli.console import CliError

    with pytest.raises(CliError, match=r"job train-1 has no attempt 3: it has had 2 \(1 to 2\)"):
        cli("logs", "train-1", "--attempt", "3")  # `tpuq` prints it as one line and exits 1 (tpuq.cli.app)


def test_dead_letters_piped_are_tab_separated_lines_with_the_whole_reason(cli, monkeypatch):
    from tpuq.operations import deadletters

    reason = ("jobs[0].tpu: unknown TPU type v9-8; known types: " + ", ".join(f"v{n}-8" for n in range(2, 40)))
    record = {"topic": "jobs", "message_id": "1234", "field": "tpu", "reason": reason, "kind": "invalid",
              "recorded_at": NOW}
    monkeypatch.setattr(deadletters, "read_merged", lambda clients, topic, limit: ([record], None))
    shown = cli("dead-letters")
    assert shown.exit_code == 0, shown.output
    header, line = shown.stdout.splitlines()
    assert header.split("\t") == ["time", "topic", "subscription", "message id", "about", "attempts", "field", "reason"]
    assert line.split("\t") == ["2026-12-01 17:34:29 UTC", "jobs", "", "1234", "job-1234", "", "tpu", reason]
    assert "─" not in shown.stdout and "│" not in shown.stdout  # no box drawing


def test_fleet_tables_piped_are_tab_separated():
    from tpuq.cli.views import print_fleet

    view = {"fleet": "f", "tpus": [{"short": "tpuq-abc", "zone": "us-central2-b", "type": "v4-8", "state": "busy",
                                     "job_id": "train-1", "idle_for": "", "health": "HEALTHY"}]}
    from tpuq.cli import views

    buffer = io.StringIO()
    saved = views.out
    views.out = Console(file=buffer, width=80, soft_wrap=True, force_terminal=False)
    try:
        with contextlib.redirect_stdout(buffer):
            print_fleet(view)
    finally:
        views.out = saved
    text = buffer.getvalue()
    assert "TPUs:\ntpu\tzone\ttype\tstate\tjob\tidle for\thealth\n" in text, text
    assert "tpuq-abc\tus-central2-b\tv4-8\tbusy\ttrain-1\t\tHEALTHY" in text


def test_set_priority_on_a_rejected_job_names_no_none_priority():
    from tpuq.operations.jobs import priority_refusal

    assert priority_refusal("job-77", {"state": "rejected", "priority": None}) == \
        "job-77 is rejected: set-priority changes only a pending job"
    assert priority_refusal("t", {"state": "running", "priority": "high"}).endswith("(its priority stays high)")


def test_an_ended_attempt_without_logs_says_none_were_written_not_none_yet(cli):
    retried_job(cli.clients)
    empty = cli("logs", "train-1", "--attempt", "1", "--worker", "3")  # a worker that wrote nothing
    assert "no logs for attempt 1 of train-1: it wrote none" in empty.stderr and "yet" not in empty.stderr
