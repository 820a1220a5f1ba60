"""The dashboard's routes through Flask's test client, on the in-memory Firestore: the pages render what is
stored (escaped), the filters, a 404 for an unknown job, and the guards on the two changes (CSRF token, an
authenticated user), whose witness is what was published and what Firestore holds afterwards."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from tpuq.contracts import store
from tpuq.runtime.settings import Settings
from tpuq_dev.inmemory import MemoryFirestore
from tpuq.ui.app import create_app
from tpuq.ui.identity import fixed_user

NOW = datetime(2026, 12, 1, 15, 0, tzinfo=timezone.utc)
ME = "ada@example.com"


@dataclass
class FakeSubscriber:
    """The hold subscription of what Pub/Sub dead-lettered (tpuq.operations.heldletters.read): one pull brings what it keeps,
    a nack gives it back."""

    held: list[Any] = field(default_factory=list)  # ReceivedMessage-shaped: .ack_id, .message
    out: set[str] = field(default_factory=set)

    def pull(self, request, timeout):
        given = [m for m in self.held if m.ack_id not in self.out]
        self.out |= {m.ack_id for m in given}
        return SimpleNamespace(received_messages=given)

    def modify_ack_deadline(self, request):
        assert request["ack_deadline_seconds"] == 0  # handed back, never acknowledged
        self.out -= set(request["ack_ids"])


@dataclass
class FakeClients:
    """What the dashboard uses of `tpuq.runtime.clients.Clients`: Firestore, GCS (no objects), publishing and the hold
    subscription."""

    firestore: MemoryFirestore = field(default_factory=MemoryFirestore)
    settings: Settings = field(default_factory=lambda: Settings(project="tpuq-local", firestore_emulator="x:1"))
    published: list[tuple[str, Any]] = field(default_factory=list)
    subscriber: FakeSubscriber = field(default_factory=FakeSubscriber)

    class storage:  # noqa: N801 - the client's attribute name
        @staticmethod
        def list_blobs(bucket, prefix=""):
            return []

    def publish(self, topic: str, message, **attributes) -> str:
        self.published.append((topic, message))
        return str(len(self.published))


def job_doc(job_id: str, state: str = "pending", priority: str = "normal", minutes_ago: int = 1, **extra) -> dict:
    spec = {"id": job_id, "tpu": ["v4-8"], "command": "echo hi", **extra.pop("spec", {})}
    return {"id": job_id, "state": state, "priority": priority, "spec": spec, "owner": extra.pop("owner", ME),
            "submit_time": NOW - timedelta(minutes=minutes_ago), **extra}


@pytest.fixture
def world():
    clients = FakeClients()
    jobs = clients.firestore.collection(store.JOBS)
    jobs.document("old-1").set(job_doc("old-1", "succeeded", minutes_ago=30, spec={"name": "resnet sweep"}))
    jobs.document("new-2").set(job_doc("new-2", "pending", "high", minutes_ago=2, spec={"name": "<script>alert(1)</script>"}))
    jobs.document("mid-3").set(job_doc("mid-3", "running", minutes_ago=10, zone="us-central2-a", owner="bob@example.com"))
    return clients


def client_of(clients, user: str | None = ME):
    app = create_app(lambda: clients, lambda: NOW, fixed_user(user))
    app.testing = True
    return app.test_client()


def csrf_of(client, path: str = "/jobs") -> str:
    page = client.get(path).get_data(as_text=True)
    return re.search(r'name="csrf-token" content="([^"]+)"', page).group(1)


def ids_in(page: str) -> list[str]:
    return re.findall(r'<tr data-job="([^"]+)"', page)


@pytest.mark.parametrize("query, expected", [
    ("", ["new-2", "mid-3", "old-1"]),  # newest first
    ("?state=running", ["mid-3"]),
    ("?priority=high", ["new-2"]),
    ("?q=RESNET", ["old-1"]),  # by name, case-insensitive
    ("?q=mid", ["mid-3"]),  # by id
    ("?state=pending&priority=low", []),
])
def test_jobs_filters(world, query, expected):
    page = client_of(world).get(f"/jobs/rows{query}").get_data(as_text=True)
    assert ids_in(page) == expected


def test_names_and_reasons_are_text_not_markup(world):
    page = client_of(world).get("/jobs").get_data(as_text=True)
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    job = client_of(world).get("/jobs/new-2").get_data(as_text=True)
    assert "<script>alert" not in job and "&lt;script&gt;alert(1)" in job


def test_an_unknown_job_is_404(world):
    client = client_of(world)
    for path in ("/jobs/nope", "/jobs/nope/live", "/jobs/nope/cancel"):
        assert client.get(path).status_code == 404


def test_every_page_renders(world):
    client = client_of(world)
    for path in ("/jobs", "/jobs/mid-3", "/jobs/mid-3/live", "/fleet", "/fleet/live", "/dead-letters", "/cost"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert "script-src 'self'" in response.headers["Content-Security-Policy"]


@pytest.mark.parametrize("token", [None, "wrong"])
def test_a_change_without_this_sessions_csrf_token_is_403_and_changes_nothing(world, token):
    client = client_of(world)
    csrf_of(client)  # the session has a token; the request does not carry it
    form = {"priority": "low", **({"csrf_token": token} if token else {})}
    assert client.post("/jobs/new-2/priority", data=form).status_code == 403
    assert client.post("/jobs/new-2/cancel", data=form).status_code == 403
    assert world.firestore.collection(store.JOBS).document("new-2").get().to_dict()["priority"] == "high"
    assert world.published == []


def test_another_sessions_token_is_refused(world):
    mine, theirs = client_of(world), client_of(world)
    token = csrf_of(theirs)
    csrf_of(mine)
    assert mine.post("/jobs/new-2/cancel", data={"csrf_token": token}).status_code == 403
    assert world.published == []


def test_no_authenticated_user_changes_nothing(world):
    client = client_of(world, user=None)
    token = csrf_of(client)
    assert client.post("/jobs/new-2/cancel", data={"csrf_token": token}).status_code == 401
    assert client.post("/jobs/new-2/priority", data={"csrf_token": token, "priority": "low"}).status_code == 401
    assert world.published == []


def test_set_priority_through_the_confirmation(world):
    client = client_of(world)
    confirm = client.get("/jobs/new-2/priority?priority=low").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', confirm).group(1)
    done = client.post("/jobs/new-2/priority", data={"csrf_token": token, "priority": "low"})
    assert done.status_code == 200, done.get_data(as_text=True)
    assert world.firestore.collection(store.JOBS).document("new-2").get().to_dict()["priority"] == "low"
    assert [topic for topic, _ in world.published] == ["ticks"]  # the scheduler is nudged, as set-priority does
    started = client.post("/jobs/mid-3/priority", data={"csrf_token": token, "priority": "low"})
    assert started.status_code == 409 and "changes only a pending job" in started.get_data(as_text=True)


def test_cancel_as_the_user_and_someone_elses_job_only_when_forced(world):
    client = client_of(world)
    token = csrf_of(client)
    assert client.post("/jobs/new-2/cancel", data={"csrf_token": token}).status_code == 200
    [(topic, request)] = world.published
    assert (topic, request.job_id, request.requested_by) == ("cancels", "new-2", ME)
    confirm = client.get("/jobs/mid-3/cancel").get_data(as_text=True)
    assert "bob@example.com" in confirm and 'name="force"' in confirm
    assert client.post("/jobs/mid-3/cancel", data={"csrf_token": token}).status_code == 409
    assert len(world.published) == 1
    assert client.post("/jobs/mid-3/cancel", data={"csrf_token": token, "force": "on"}).status_code == 200
    assert [r.job_id for _, r in world.published] == ["new-2", "mid-3"]
    assert client.post("/jobs/old-1/cancel", data={"csrf_token": token}).status_code == 409  # already ended


def test_dead_letters_show_topic_field_and_reason(world):
    world.firestore.collection(store.DEAD_LETTERS).document("jobs:7").set(
        {"topic": "jobs", "message_id": "7", "field": "tpu", "reason": "unknown TPU type <b>v9</b>",
         "recorded_at": NOW})
    page = client_of(world).get("/dead-letters").get_data(as_text=True)
    row = re.search(r'<tr data-message="7"[^>]*>(.*?)</tr>', page, re.S).group(1)
    assert ">jobs<" in row and ">tpu<" in row and "unknown TPU type &lt;b&gt;v9&lt;/b&gt;" in row


def test_dead_letters_show_what_pubsub_dead_lettered_with_subscription_and_attempts(world):
    """A submission no handler ever answered: only the hold subscription keeps it; the page shows it, and leaves it
    there."""
    from tpuq.operations import heldletters

    forwarded = SimpleNamespace(message_id="99", data=b'{"id": "train-1", "tpu": "v4-8"}', publish_time=NOW,
                                attributes={heldletters.SOURCE_SUBSCRIPTION: "scheduler-jobs",
                                            heldletters.SOURCE_DELIVERY_COUNT: "10",
                                            heldletters.SOURCE_TOPIC_PUBLISH_TIME: "2026-12-01T14:58:00Z"})
    world.subscriber.held.append(SimpleNamespace(ack_id="a-1", message=forwarded))
    for _ in range(2):  # read, not consumed
        page = client_of(world).get("/dead-letters?topic=jobs").get_data(as_text=True)
        row = re.search(r'<tr data-message="" data-kind="undelivered">(.*?)</tr>', page, re.S).group(1)
        assert ">scheduler-jobs<" in row and ">10<" in row and "job train-1" in row
        assert "never answered by a handler: Pub/Sub gave up after 10 delivery attempts" in row
    assert world.subscriber.out == set()


def test_the_fleet_page_shows_a_zones_backoff_and_the_project_block(world):
    """What `tpuq fleet` shows, from the claimer's documents: a zone backed off (until when) and a project-level
    block with the API's words (escaped)."""
    import yaml

    from tpuq.contracts.documents import FleetStatus, TargetRecord, status_to_doc, target_to_doc
    from tpuq.operations.examples import EXAMPLE_FLEET
    from tpuq.contracts.fleet import FleetFile
    from tpuq.runtime.fleetstore import save_fleet

    fleet = FleetFile.model_validate(yaml.safe_load(EXAMPLE_FLEET))
    version = save_fleet(world.firestore, fleet, NOW)
    entry = fleet.tpus[0]
    zone = entry.zones[0]
    world.firestore.collection(store.ZONES).document(f"{fleet.name}:{zone}:{entry.type}").set(target_to_doc(
        TargetRecord(fleet.name, zone, entry.type, capacity_failures=2, backoff_until=NOW + timedelta(minutes=5))))
    world.firestore.collection(store.FLEET_STATUS).document(fleet.name).set(status_to_doc(FleetStatus(
        fleet.name, blocked="billing is disabled on the project: enable it, then tpuq fleet unblock",
        blocked_version=version, blocked_message="<b>BILLING_DISABLED</b>", blocked_at=NOW)))
    page = client_of(world).get("/fleet/live").get_data(as_text=True)
    row = re.search(rf'<tr data-zone="{zone}" data-type="{entry.type}">(.*?)</tr>', page, re.S).group(1)
    assert "15:05:00 UTC" in row and "backed off until 15:05:00 UTC (in 5m) after 2 capacity failure(s)" in row
    assert "billing is disabled on the project: enable it, then tpuq fleet unblock" in page
    assert "&lt;b&gt;BILLING_DISABLED&lt;/b&gt;" in page


def test_dead_letters_say_when_the_hold_subscription_cannot_be_read(world):
    from google.api_core.exceptions import PermissionDenied

    def refused(request, timeout):
        raise PermissionDenied("User not authorized to perform this action.")

    world.subscriber.pull = refused
    page = client_of(world).get("/dead-letters").get_data(as_text=True)
    problem = re.search(r'<p class="warning" id="dead-letters-problem">(.*?)</p>', page, re.S).group(1)
    assert "dead-letters-hold" in problem and "roles/pubsub.subscriber" in problem and "not authorized" in problem
    assert "no refused messages" in page  # the handlers' records still show (none here)
