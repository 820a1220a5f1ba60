"""Notifications on a whole stack: a Notification published to `notifications` reaches the local webhook receiver
through Pub/Sub push (the front's dispatcher, with janitor-notifications' retry policy), the janitor as a process,
the fake Secret Manager holding the URL (`tpuq-dev-webhook` and secrets the tests store), and `tpuq dev
notifications`. The receiver's log is the witness; Firestore must never hold a URL.

The janitor runs with a 2 s POST timeout and 2 tries (TPUQ_NOTIFY_*), so that a receiver that never answers is
given up within one redelivery (janitor-notifications' minimum backoff, 10 s)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
import requests

from tests.helpers import wait_until
from tpuq.contracts import store
from tpuq.contracts.notify import Destination, Notification, NotifyEvent, event_id
from tpuq.runtime.clients import Clients
from tpuq.runtime.secretmanager import SecretManager
from tpuq.runtime.service import utcnow
from tpuq.runtime.settings import ENV_SECRETMANAGER_ENDPOINT, Settings
from tpuq_dev.devstack.notifystack import DEV_WEBHOOK_SECRET, ENV_WEBHOOK_URL
from tpuq_dev.devstack.stack import DEMO_DIR, DevStack
from tpuq_dev.webhooks import WebhookReceiver


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = Path(tmp_path_factory.mktemp("notify-stack"))
    s = DevStack(state_dir=root / "dev", services=("janitor",), scenario=DEMO_DIR / "scenario.yaml",
                 fleet_file=DEMO_DIR / "fleet.yaml",
                 service_env={"TPUQ_NOTIFY_TIMEOUT_SECONDS": "2", "TPUQ_NOTIFY_MAX_TRIES": "2"})
    with s.running():
        yield s


@pytest.fixture(scope="module")
def parts(stack):
    clients = Clients(Settings.from_env(stack.env))
    receiver = WebhookReceiver(stack.env[ENV_WEBHOOK_URL])
    secrets = SecretManager(stack.project, stack.env[ENV_SECRETMANAGER_ENDPOINT])
    return clients, receiver, secrets


def hook(stack, parts, answers: list[dict] | None = None) -> tuple[str, str]:
    """A secret of its own naming the receiver's /hook/<id>, readable by the janitor (as `tpuq submit` stores an
    inline URL), and that path scripted with `answers`."""
    _, receiver, secrets = parts
    name = f"hook-{uuid.uuid4().hex[:8]}"
    path = f"/hook/{name}"
    secrets.put(name, receiver.hook_url(path))
    secrets.grant_accessor(name, f"serviceAccount:{stack.service_account('janitor')}")
    if answers:
        receiver.script(path, answers)
    return name, path


def publish_with_id(parts, secret: str, subject: str | None = None) -> tuple[Notification, str]:
    clients = parts[0]
    subject = subject or f"job-{uuid.uuid4().hex[:6]}"
    n = Notification(event_id=event_id(NotifyEvent.succeeded, subject), event=NotifyEvent.succeeded, subject=subject,
                     title=f"{subject} succeeded", text="in 3m on v4-8", at=utcnow(),
                     destinations=[Destination(secret=secret, format="json")])
    return n, clients.publish("notifications", n)


def push_times(stack, message_id: str) -> list[float]:
    """When the front's dispatcher pushed this message (its delivery log)."""
    import json

    lines = stack.delivery_log_file.read_text().splitlines()
    return [e["at"] for e in map(json.loads, lines) if e.get("message_id") == message_id]


def all_acknowledged(stack, *message_ids: str) -> bool:
    """Each of these messages was pushed on janitor-notifications, and the front's dispatcher holds none of that
    subscription's messages: each was acknowledged, so its handling, and any POST in it, is over (a message nacked
    is held until its redelivery is acknowledged)."""
    pushed = {message_id for (subscription, message_id) in stack.delivery_counts()
              if subscription.endswith("/janitor-notifications")}
    if not pushed >= set(message_ids):
        return False
    stats = requests.get(f"http://127.0.0.1:{stack.front_control_port}/stats", timeout=10).json()
    return all(queue["held"] == 0 for service in stats.values() for name, queue in service.items()
               if name.endswith("/janitor-notifications"))


def stored_text(clients) -> str:
    db = clients.firestore
    return repr([s.to_dict() for c in (store.NOTIFICATIONS, store.NOTIFY_DESTINATIONS, store.DEAD_LETTERS)
                 for s in db.collection(c).stream()])


def test_the_dev_webhook_secret_reaches_the_receiver_once_and_tpuq_dev_notifications_shows_it(stack, parts):
    clients, receiver, _ = parts
    n, first = publish_with_id(parts, DEV_WEBHOOK_SECRET)
    got = wait_until(lambda: [r for r in receiver.received("/hook") if r["body"]["id"] == n.event_id],
                     timeout=60, what="the POST at /hook")
    again = clients.publish("notifications", n)  # published again (a producer's redelivery): delivered already
    wait_until(lambda: all_acknowledged(stack, first, again), timeout=60, what="both messages handled")
    assert len([r for r in receiver.received("/hook") if r["body"]["id"] == n.event_id]) == len(got) == 1
    env = {**os.environ, **stack.env, "TPUQ_DEV_DIR": str(stack.state_dir)}
    done = subprocess.run(["tpuq", "dev", "notifications", "--state-dir", str(stack.state_dir)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "time\tpath\tevent\ttitle"
    assert any(line.split("\t")[1:] == ["/hook", "succeeded", n.title] for line in lines[1:])


@pytest.fixture(scope="module")
def begun(stack, parts) -> dict[str, tuple]:
    """The three cases below each wait out janitor-notifications' retry backoff (10 s after a nack): they are begun
    together, at the first of their tests, so that their backoffs run at once; each test then waits for its own
    outcome. Each has a secret and a receiver path of its own."""
    clients = parts[0]
    retried = hook(stack, parts, [{"status": 500}, {"status": 200}])
    never = hook(stack, parts)
    parts[1].script(never[1], [{"hang": True}], repeat_last=True)
    twice = hook(stack, parts, [{"status": 200, "delay_seconds": 1.0}])
    begun = {"retried": (*retried, publish_with_id(parts, retried[0])[1]),
             "never": (*never, publish_with_id(parts, never[0])[1])}
    n, first = publish_with_id(parts, twice[0])
    again = clients.publish("notifications", n)  # the same event twice at once: two messages, pushed concurrently
    begun["twice"] = (*twice, first, again)
    return begun


def test_500_then_200_is_delivered_once_on_the_retry(stack, parts, begun):
    clients, receiver, _ = parts
    name, path, message_id = begun["retried"]
    wait_until(lambda: len(receiver.received(path)) >= 2, timeout=90, what="the retry after the 500")
    record = wait_until(lambda: next((s.to_dict() for s in clients.firestore.collection(store.NOTIFICATIONS).stream()
                                      if (s.to_dict() or {}).get("destination") == name
                                      and s.to_dict().get("state") == "delivered"), None), timeout=30)
    assert record["tries"] == 2
    assert len(receiver.received(path)) == 2  # one 500, one 200: delivered once
    # Pub/Sub's retry policy, as the front's dispatcher applies it: janitor-notifications waits 10 s after a nack.
    first, second = push_times(stack, message_id)[:2]
    assert second - first >= 9.5


def test_a_receiver_that_never_answers_is_failing_with_no_url_in_firestore(stack, parts, begun):
    clients, receiver, _ = parts
    name, path, _ = begun["never"]
    health = wait_until(lambda: (clients.firestore.collection(store.NOTIFY_DESTINATIONS).document(store.doc_id(name))
                                 .get().to_dict() or {}).get("failing") and
                        clients.firestore.collection(store.NOTIFY_DESTINATIONS).document(store.doc_id(name)).get()
                        .to_dict(), timeout=90, what="the destination failing")
    assert health["last_error"].startswith("no answer in 2s")
    assert len(receiver.received(path)) == 2
    assert stack.env[ENV_WEBHOOK_URL] not in stored_text(clients)


def test_delivered_twice_and_concurrently_posts_once(stack, parts, begun):
    clients, receiver, _ = parts
    name, path, first, again = begun["twice"]
    wait_until(lambda: sum(1 for s in clients.firestore.collection(store.NOTIFICATIONS).stream()
                           if (s.to_dict() or {}).get("destination") == name
                           and s.to_dict().get("state") == "delivered"), timeout=60)
    # The message that found the lease held comes back after the backoff (10 s), and must not POST.
    wait_until(lambda: all_acknowledged(stack, first, again), timeout=60,
               what="both messages handled, the one that found the lease held redelivered")
    assert len(receiver.received(path)) == 1
