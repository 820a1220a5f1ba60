"""A failing notification destination in `tpuq fleet` (issue 36 §3: "a failed destination shows in `tpuq fleet`
and the dashboard"): the sender's `notify_destinations/{label}` documents (tpuq.contracts.notify.DestinationHealth),
read here, one line per failing destination and nothing when none fails. In this process, through typer's runner,
on the in-memory Firestore. (The dashboard's Fleet page: tests/ui/test_ui_groups.py.)"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import yaml
from typer.testing import CliRunner

from tpuq.contracts import store
from tpuq.contracts.notify import DestinationHealth
from tpuq.operations.notifyhealth import failing_destinations, failing_line, health_of
from tests.ui.test_ui_routes import FakeClients

def utcnow() -> datetime:
    """Read when a test runs, not when the module is collected: `tpuq fleet` ages from its own clock, and the
    suite may reach this test many minutes after collecting it."""
    return datetime.now(timezone.utc)


def failing(label="slack-alerts", minutes=12, now: datetime | None = None, **over) -> dict:
    fields = {"last_error": "HTTP 500", "failed_event_id": "failed:train-3"} | over
    at = (now or utcnow()) - timedelta(minutes=minutes)
    return DestinationHealth(label=label, failing=True, last_failure_at=at, **fields).model_dump()


def test_the_line_names_the_destination_since_when_the_error_and_the_event():
    now = utcnow()
    assert failing_line(health_of("x", failing(now=now)), now) == \
        "notify: slack-alerts failing since 12m ago: HTTP 500 (event failed:train-3)"
    bare = health_of("chat", {"label": "chat", "failing": True})
    assert failing_line(bare, now) == "notify: chat failing"


def test_a_field_this_reader_does_not_know_is_left_out_and_an_unreadable_document_skipped():
    assert health_of("x", failing() | {"attempts": 7}).failing is True  # a newer sender's extra field
    assert health_of("x", {"label": "x", "failing": "sometimes"}) is None


@pytest.fixture
def cli(monkeypatch):
    from tpuq.cli import connecting, fleet
    from tpuq.cli.app import app
    from tpuq.contracts.fleet import FleetFile
    from tpuq.operations.examples import EXAMPLE_FLEET
    from tpuq.runtime.fleetstore import save_fleet

    clients = FakeClients()
    save_fleet(clients.firestore, FleetFile.model_validate(yaml.safe_load(EXAMPLE_FLEET)), utcnow())
    monkeypatch.setattr(connecting, "CURRENT", None)
    monkeypatch.setattr(fleet, "cli_clients", lambda: clients)
    monkeypatch.setattr(fleet, "local_zone", lambda: timezone.utc)

    def run(*args: str):
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"}, catch_exceptions=False)

    run.clients = clients
    return run


def test_tpuq_fleet_prints_a_line_per_failing_destination_and_none_for_a_healthy_one(cli):
    col = cli.clients.firestore.collection(store.NOTIFY_DESTINATIONS)
    quiet = cli("fleet")
    assert quiet.exit_code == 0, quiet.output
    assert "notify:" not in quiet.stdout
    col.document("slack-alerts").set(failing())
    col.document("discord").set(failing("discord", minutes=3, last_error="no answer in 10s", failed_event_id=None))
    col.document("chat-ok").set(DestinationHealth(label="chat-ok", last_ok_at=utcnow()).model_dump())
    shown = cli("fleet")
    assert shown.exit_code == 0, shown.output
    lines = [line for line in shown.stdout.splitlines() if line.startswith("notify:")]
    assert lines == ["notify: discord failing since 3m ago: no answer in 10s",
                     "notify: slack-alerts failing since 12m ago: HTTP 500 (event failed:train-3)"]
    as_json = cli("fleet", "--json")
    import json

    assert [d["label"] for d in json.loads(as_json.stdout)["notify_failing"]] == ["discord", "slack-alerts"]
    assert [h.label for h in failing_destinations(cli.clients.firestore)] == ["discord", "slack-alerts"]
