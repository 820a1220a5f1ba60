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
