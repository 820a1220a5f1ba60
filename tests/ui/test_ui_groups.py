"""The dashboard's group page and the Jobs page's folded group row (issue 36 §1), and the failing notification
destinations on the Fleet page (§3), through Flask's test client on the in-memory Firestore."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from tests.ui.test_ui_routes import NOW, FakeClients, client_of, ids_in, job_doc
from tpuq.contracts import store

SWEEP = [("1e-3", "0"), ("1e-3", "1"), ("3e-4", "0"), ("3e-4", "1")]
STATES = ["succeeded", "failed", "running", "pending"]


@pytest.fixture
def world():
    clients = FakeClients()
    jobs = clients.firestore.collection(store.JOBS)
    jobs.document("solo").set(job_doc("solo", "running", minutes_ago=1))
    for i, ((lr, seed), state) in enumerate(zip(SWEEP, STATES)):
        jobs.document(f"sw-{i}").set(job_doc(
            f"sw-{i}", state, minutes_ago=5, group="sw", array_index=i, array_size=4, array_limit=2,
            attempts=1 if state != "pending" else 0, attempt=1 if state != "pending" else 0,
            reason="worker 0 exited 3 <b>" if state == "failed" else None,
            spec={"env": {"LR": lr, "SEED": seed, "DATA": "/data"}, "name": "sweep"}))
    return clients


def test_the_group_page_shows_counts_progress_the_failed_task_and_a_row_per_task_with_its_sweep_values(world):
    page = client_of(world).get("/groups/sw").get_data(as_text=True)
    assert 'id="group-progress" max="4" value="2"' in page and "2/4 ended" in page
    counts = dict(re.findall(r'<span class="count" data-state="(\w+)">(\d+) ', page))
    assert counts == {"failed": "1", "pending": "1", "running": "1", "succeeded": "1"}
    failed = re.search(r'<p class="warning failed-task" data-job="sw-1">(.*?)</p>', page, re.S).group(1)
    assert 'href="/jobs/sw-1"' in failed and "worker 0 exited 3 &lt;b&gt;" in failed  # text, not markup
    assert re.findall(r"<th>(\w+)</th>", page)[:5] == ["index", "task", "LR", "SEED", "state"]  # DATA is no sweep
    rows = dict(re.findall(r'<tr data-job="(sw-\d)" data-state="\w+">(.*?)</tr>', page, re.S))
    assert list(rows) == ["sw-0", "sw-1", "sw-2", "sw-3"]
    cells = re.findall(r'<td class="sweep">(.*?)</td>', rows["sw-2"])
    assert cells == ["3e-4", "0"] and 'href="/jobs/sw-2"' in rows["sw-2"]
    assert '<td class="attempts">1</td>' in rows["sw-1"] and "worker 0 exited 3" in rows["sw-1"]
    assert "hx-get=\"/groups/sw/live\"" in page  # polled while a task has not ended


def test_the_group_page_stops_polling_once_every_task_ended_and_a_job_or_nothing_is_404(world):
    jobs = world.firestore.collection(store.JOBS)
    for i in (2, 3):
        jobs.document(f"sw-{i}").update({"state": "succeeded"})
    live = client_of(world).get("/groups/sw/live").get_data(as_text=True)
    assert "4/4 ended" in live and "hx-get" not in live
    client = client_of(world)
    for path in ("/groups/nope", "/groups/nope/live", "/groups/solo"):  # a job's id names no group
        assert client.get(path).status_code == 404, path


def test_the_jobs_page_folds_a_group_into_one_row_linking_to_its_page(world):
    page = client_of(world).get("/jobs/rows").get_data(as_text=True)
    assert ids_in(page) == ["solo", "sw"]
    row = re.search(r'<tr data-job="sw" data-state="running" data-group="sw">(.*?)</tr>', page, re.S).group(1)
    assert 'href="/groups/sw"' in row and "group of 4 tasks: 1 failed, 1 pending, 1 running, 1 succeeded" in row
    every = client_of(world).get("/jobs/rows?tasks=1").get_data(as_text=True)
    assert sorted(ids_in(every)) == ["solo", "sw-0", "sw-1", "sw-2", "sw-3"] and "data-group" not in every
    task = client_of(world).get("/jobs/sw-2").get_data(as_text=True)
    assert re.search(r'<a href="/groups/sw" id="job-group">sw</a>, task 2', task)


def test_the_fleet_page_shows_each_failing_notification_destination_and_nothing_for_a_healthy_one(world):
    import yaml

    from tpuq.contracts.fleet import FleetFile
    from tpuq.contracts.notify import DestinationHealth
    from tpuq.operations.examples import EXAMPLE_FLEET
    from tpuq.runtime.fleetstore import save_fleet

    save_fleet(world.firestore, FleetFile.model_validate(yaml.safe_load(EXAMPLE_FLEET)), NOW)
    col = world.firestore.collection(store.NOTIFY_DESTINATIONS)
    col.document("slack-alerts").set(DestinationHealth(
        label="slack-alerts", failing=True, last_error="HTTP 500", last_failure_at=NOW - timedelta(minutes=12),
        failed_event_id="failed:train-3").model_dump())
    col.document("chat-ok").set(DestinationHealth(label="chat-ok", last_ok_at=NOW).model_dump())
    for path in ("/fleet", "/fleet/live"):
        page = client_of(world).get(path).get_data(as_text=True)
        shown = re.findall(r'<div class="block notify-failing" data-destination="([^"]+)">(.*?)</div>', page)
        assert shown == [("slack-alerts", "notify: slack-alerts failing since 12m ago: HTTP 500 "
                                          "(event failed:train-3)")], path
    col.document("slack-alerts").set({"label": "slack-alerts", "failing": False, "last_ok_at": NOW})
    assert "notify-failing" not in client_of(world).get("/fleet").get_data(as_text=True)
