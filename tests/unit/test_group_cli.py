"""`tpuq status GROUP` and `tpuq cancel GROUP` (issue 36 §1): a group's id, which is no job, stands for its tasks.
In this process, through typer's runner, on the in-memory Firestore."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from tpuq.contracts import store
from tpuq_dev.inmemory import MemoryFirestore

STATES = ["succeeded", "succeeded", "failed", "running", "pending", "pending"]


@dataclass
class Clients:
    firestore: MemoryFirestore = field(default_factory=MemoryFirestore)
    published: list = field(default_factory=list)

    def publish(self, topic, message):
        self.published.append((topic, json.loads(message.model_dump_json())))


@pytest.fixture
def cli(monkeypatch):
    from tpuq.cli import connecting, deadletters, identity, jobs
    from tpuq.cli.app import app

    clients = Clients()
    monkeypatch.setattr(connecting, "CURRENT", None)
    monkeypatch.setattr(identity, "current_owner", lambda: "ada@example.com")
    for module in (jobs, deadletters):
        monkeypatch.setattr(module, "cli_clients", lambda: clients)
    col = clients.firestore.collection(store.JOBS)
    for i, state in enumerate(STATES):
        col.document(f"tr-{i}").set({"id": f"tr-{i}", "state": state, "owner": "ada@example.com", "group": "tr",
                                     "array_index": i, "array_size": 6, "array_limit": 2, "priority": "normal",
                                     "submit_time": datetime(2026, 12, 1, 17, 0, i, tzinfo=timezone.utc),
                                     "reason": "worker 0 exited 3" if state == "failed" else None,
                                     "spec": {"id": f"tr-{i}", "tpu": ["v4-8"], "command": "x"}})

    def run(*args: str):
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "100"}, catch_exceptions=False)

    run.clients = clients
    return run


def test_status_of_a_group_counts_its_tasks_by_state_and_names_the_failed(cli):
    result = cli("status", "tr")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "group tr: 6 tasks, at most 2 at once"
    assert lines[1].strip() == "[" + "#" * 15 + "." * 15 + "] 3/6 ended"
    assert lines[2].strip() == "1 failed, 2 pending, 1 running, 2 succeeded"
    assert lines[3].strip() == "failed: tr-2: worker 0 exited 3"


def test_cancel_of_a_group_asks_for_every_unfinished_task(cli):
    result = cli("cancel", "tr")
    assert result.exit_code == 0, result.output
    asked = sorted(m["job_id"] for topic, m in cli.clients.published if topic == "cancels")
    assert asked == ["tr-3", "tr-4", "tr-5"]
    assert "group tr: 3 unfinished of 6 tasks" in result.stdout


def test_list_folds_a_group_into_one_line_unless_asked_for_its_tasks(cli):
    folded = cli("list")
    assert folded.exit_code == 0, folded.output
    lines = folded.stdout.splitlines()[1:]
    assert len(lines) == 1 and lines[0].split()[:2] == ["tr", "running"], folded.stdout
    assert "group of 6 tasks: 1 failed, 2 pending, 1 running, 2 succeeded" in lines[0]
    every = cli("list", "--tasks")
    assert len(every.stdout.splitlines()) == 1 + 6, every.stdout


def test_an_empty_filtered_list_says_what_it_filtered_not_that_there_are_no_jobs(cli):
    none = cli("list", "--state", "cancelled")
    assert none.exit_code == 0, none.output
    assert none.stdout.strip() == "no jobs in state cancelled"


def _ending_one_task_per_sleep(monkeypatch, clients, outcome):
    """`tpuq watch GROUP`'s sleeps, each ending the next unfinished task (`outcome(task id)`: its end state)."""
    from tpuq.cli import live

    col = clients.firestore.collection(store.JOBS)

    def sleep(_seconds):
        left = sorted(s.id for s in col.stream() if s.to_dict()["state"] in ("pending", "running"))
        if left:
            col.document(left[0]).update({"state": outcome(left[0])})
    monkeypatch.setattr(live.time, "sleep", sleep)


def test_watch_of_a_group_prints_its_progress_until_every_task_ended_and_exits_1_for_a_failed_one(cli, monkeypatch):
    _ending_one_task_per_sleep(monkeypatch, cli.clients, lambda task: "failed" if task == "tr-4" else "succeeded")
    result = cli("watch", "tr", "--interval", "0.2")
    assert result.exit_code == 1, result.output  # tr-2 and tr-4 failed: as `submit --wait`, 1
    lines = [line.split("  tr: ", 1)[1] for line in result.stdout.splitlines()]
    assert lines[0] == "[" + "#" * 15 + "." * 15 + "] 3/6 ended: 1 failed, 2 pending, 1 running, 2 succeeded"
    assert lines[1] == "failed: tr-2: worker 0 exited 3"  # each failed task named once, as it fails
    assert lines.count("failed: tr-2: worker 0 exited 3") == 1 and "failed: tr-4" in lines
    assert lines[-1] == "[" + "#" * 30 + "] 6/6 ended: 2 failed, 4 succeeded"
    assert len([line for line in lines if "ended:" in line]) == 4  # one line per change: 3, 4, 5, 6 ended


def test_watch_of_a_group_whose_every_task_succeeds_exits_0(cli, monkeypatch):
    cli.clients.firestore.collection(store.JOBS).document("tr-2").update({"state": "succeeded", "reason": None})
    _ending_one_task_per_sleep(monkeypatch, cli.clients, lambda task: "succeeded")
    result = cli("watch", "tr", "--interval", "0.2")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].endswith("6/6 ended: 6 succeeded")


def test_set_priority_of_a_group_changes_every_pending_task_in_one_commit_and_says_how_many(cli, monkeypatch):
    from tpuq_dev.inmemory import firestore as memory

    commits = []
    real_commit = memory.MemoryBatch.commit
    monkeypatch.setattr(memory.MemoryBatch, "commit", lambda self: commits.append(1) or real_commit(self))
    result = cli("set-priority", "tr", "high")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == ("group tr: priority high set on 2 of 6 tasks (1 started and keep their priority; "
                                     "3 ended); the scheduler re-plans now")
    stored = {s.id: s.to_dict() for s in cli.clients.firestore.collection(store.JOBS).stream()}
    assert {i for i, d in stored.items() if d["priority"] == "high"} == {"tr-4", "tr-5"}
    assert all(stored[i]["spec"]["priority"] == "high" and stored[i]["priority_rank"] for i in ("tr-4", "tr-5"))
    assert len(commits) == 1
    assert [topic for topic, _ in cli.clients.published] == ["ticks"]  # one nudge
    again = cli("set-priority", "tr", "high")  # a repeat writes nothing, and says so
    assert again.exit_code == 0 and "set on 0 of 6 tasks (2 already had it;" in again.stdout, again.output
    assert len(commits) == 1 and len(cli.clients.published) == 1


def test_set_priority_of_a_group_with_no_pending_task_exits_2(cli):
    col = cli.clients.firestore.collection(store.JOBS)
    for i in (4, 5):
        col.document(f"tr-{i}").update({"state": "running"})
    result = cli("set-priority", "tr", "low")
    assert result.exit_code == 2, result.output
    assert "set on 0 of 6 tasks (3 started and keep their priority; 3 ended)" in result.stdout
    assert all(s.to_dict()["priority"] == "normal" for s in col.stream())


def test_set_priority_of_a_group_of_more_than_one_commit_changes_all(cli):
    """Firestore commits at most 500 writes (the in-memory store refuses more): 1,000 tasks are two commits."""
    col = cli.clients.firestore.collection(store.JOBS)
    for i in range(1000):
        col.document(f"big-{i}").set({"id": f"big-{i}", "state": "pending", "group": "big", "array_index": i,
                                      "array_size": 1000, "priority": "normal", "spec": {"id": f"big-{i}"}})
    result = cli("set-priority", "big", "low")
    assert result.exit_code == 0, result.output
    assert "priority low set on 1000 of 1000 tasks;" in result.stdout
    assert sum(s.to_dict()["priority"] == "low" for s in col.stream()) == 1000


def test_set_priority_of_a_group_racing_the_scheduler_leaves_a_task_it_assigned_meanwhile(cli):
    """The scheduler assigns tr-4 between the command's read and its commit: the guarded commit loses, the chunk is
    read again, and only the still pending tr-5 changes (an assigned job keeps its priority)."""
    db = cli.clients.firestore
    real_get_all = db.get_all
    reads = []

    def get_all(refs, **kw):
        snaps = list(real_get_all(refs, **kw))
        reads.append(len(snaps))
        if len(reads) == 1:
            db.collection(store.JOBS).document("tr-4").update({"state": "assigned"})
        return snaps
    db.get_all = get_all
    result = cli("set-priority", "tr", "high")
    assert result.exit_code == 0, result.output
    assert "set on 1 of 6 tasks (2 started and keep their priority; 3 ended)" in result.stdout
    stored = {s.id: s.to_dict() for s in db.collection(store.JOBS).stream()}
    assert (stored["tr-4"]["state"], stored["tr-4"]["priority"]) == ("assigned", "normal")
    assert stored["tr-5"]["priority"] == "high" and len(reads) == 2
