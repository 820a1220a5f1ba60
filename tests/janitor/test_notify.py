"""The janitor's /push/notifications (tpuq.janitor.notify) on the in-memory store, with a real webhook receiver
(tpuq_dev.webhooks) and the clock in the test's hand: each (event, destination) is POSTed once, retried on 5xx,
429 and no answer as Retry-After or backoff say, given up on other 4xx, a missing secret or too many tries, and
the URL is never stored."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from tpuq.contracts import store, topology
from tpuq.contracts.notify import Destination, Notification, NotifyEvent, event_id
from tpuq.janitor import notifydecide as nd
from tpuq.janitor.handlers import build_service
from tpuq.janitor.notify import Notifier
from tpuq.runtime.secretmanager import SecretNotFound
from tpuq.runtime.service import PushMessage
from tpuq.runtime.settings import Settings
from tpuq_dev.webhooks import WebhookReceiver, serve
from tests.janitor.conftest import memory_clients

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)
SUB = topology.subscription_by_path("janitor", "/push/notifications")


class Secrets:
    """Secret Manager as the janitor reads it: secret id -> URL."""

    def __init__(self):
        self.values: dict[str, str] = {}
        self.reads = 0

    def access(self, secret: str) -> str:
        self.reads += 1
        if secret not in self.values:
            raise SecretNotFound(f"secret {secret}: HTTP 404 NOT_FOUND")
        return self.values[secret]


@pytest.fixture(scope="module")
def receiver():
    server, url = serve()
    yield WebhookReceiver(url)
    server.shutdown()


class Harness:
    def __init__(self, receiver: WebhookReceiver, policy: nd.NotifyPolicy):
        self.receiver = receiver
        self.secrets = Secrets()
        self.clock = [T0]
        self.settings = Settings(project=f"p-{uuid.uuid4().hex[:8]}")
        self.clients = memory_clients(self.settings)
        self.db = self.clients.firestore
        self.notifier = Notifier(policy, lambda: self.secrets, monotonic=lambda: self.clock[0].timestamp())
        self.service = build_service(self.settings, self.clients, notifier=self.notifier)
        self.service.now = lambda: self.clock[0]

    def hook(self, name: str, answers: list[dict] | None = None) -> str:
        """A secret `name` holding the receiver's /hook/<name>, scripted with `answers`."""
        path = f"/hook/{name}-{uuid.uuid4().hex[:6]}"
        self.secrets.values[name] = self.receiver.hook_url(path)
        if answers:
            self.receiver.script(path, answers)
        return path

    def advance(self, seconds: float) -> None:
        self.clock[0] += timedelta(seconds=seconds)

    def deliver(self, n: Notification, message_id: str = "m1") -> int:
        msg = PushMessage(message_id, n.model_dump_json().encode(), {}, T0, SUB.name)
        return self.service.deliver(SUB, msg)[1]

    def records(self) -> list[dict]:
        return [s.to_dict() for s in self.db.collection(store.NOTIFICATIONS).stream()]

    def health(self, label: str) -> dict:
        return self.db.collection(store.NOTIFY_DESTINATIONS).document(store.doc_id(label)).get().to_dict() or {}

    def stored_text(self) -> str:
        return repr([s.to_dict() for c in (store.NOTIFICATIONS, store.NOTIFY_DESTINATIONS, store.DEAD_LETTERS)
                     for s in self.db.collection(c).stream()])


@pytest.fixture
def h(receiver):
    return Harness(receiver, nd.NotifyPolicy(timeout_seconds=0.5, max_tries=3))


def notification(*secrets: str, fmt: str | None = None, subject: str = "train-3") -> Notification:
    return Notification(event_id=event_id(NotifyEvent.failed, subject), event=NotifyEvent.failed, subject=subject,
                        title=f"{subject} failed (exit 4)", text="the worker exited 4", lines=["Traceback", "boom"],
                        fields={"attempts": "2"}, at=T0,
                        destinations=[Destination(secret=s, format=fmt) for s in secrets])


def test_each_destination_gets_one_post_in_its_format_and_a_redelivery_posts_nothing(h):
    slack, own = h.hook("team-slack"), h.hook("own-json")
    n = Notification(**{**notification("team-slack").model_dump(),
                        "destinations": [Destination(secret="team-slack", format="slack"),
                                         Destination(secret="own-json")]})
    assert h.deliver(n) == 204
    assert h.deliver(n, "m2") == 204  # redelivered, and republished under another message id
    got_slack, got_own = h.receiver.received(slack), h.receiver.received(own)
    assert len(got_slack) == 1 and len(got_own) == 1
    assert got_slack[0]["body"]["text"].startswith("train-3 failed (exit 4)\nthe worker exited 4")
    assert got_own[0]["body"]["id"] == n.event_id and got_own[0]["body"]["event"] == "failed"
    assert {r["state"] for r in h.records()} == {"delivered"}
    assert h.health("team-slack")["failing"] is False and h.health("team-slack")["last_ok_at"] == T0
    assert "/hook/" not in h.stored_text()


def test_discord_is_cut_to_2000_characters():
    n = Notification(**{**notification("d").model_dump(), "text": "x" * 2900})
    body = nd.body_for(n, nd.WebhookFormat.discord)
    assert set(body) == {"content"} and len(body["content"]) == 2000


def test_500_then_200_is_delivered_once_on_the_retry_after_the_backoff(h):
    path = h.hook("flaky", [{"status": 500}, {"status": 200}])
    n = notification("flaky")
    assert h.deliver(n) == 503
    [record] = h.records()
    assert (record["state"], record["tries"], record["last_error"]) == ("pending", 1, "HTTP 500")
    assert record["next_try_at"] == T0 + timedelta(seconds=10)
    h.advance(5)
    assert h.deliver(n) == 503  # before next_try_at: no POST
    assert len(h.receiver.received(path)) == 1
    h.advance(6)
    assert h.deliver(n) == 204
    h.advance(60)
    assert h.deliver(n) == 204
    assert len(h.receiver.received(path)) == 2
    [record] = h.records()
    assert (record["state"], record["tries"]) == ("delivered", 2)
    assert h.health("flaky")["failing"] is False


@pytest.mark.parametrize("retry_after,wait", [("30", 30), ("Fri, 04 Dec 2026 12:02:00 GMT", 120)])
def test_429_waits_out_retry_after(h, retry_after, wait):
    path = h.hook("limited", [{"status": 429, "retry_after": retry_after}])
    n = notification("limited")
    assert h.deliver(n) == 503
    assert h.records()[0]["next_try_at"] == T0 + timedelta(seconds=wait)
    h.advance(wait - 1)
    assert h.deliver(n) == 503 and len(h.receiver.received(path)) == 1
    h.advance(1)
    assert h.deliver(n) == 204 and len(h.receiver.received(path)) == 2


def test_a_4xx_or_a_missing_secret_gives_up_at_once_and_a_success_clears_failing(h):
    path = h.hook("gone-hook", [{"status": 404}])
    assert h.deliver(notification("gone-hook")) == 204
    assert h.deliver(notification("no-such-secret", subject="j2")) == 204
    assert len(h.receiver.received(path)) == 1
    health = h.health("gone-hook")
    assert (health["failing"], health["last_error"]) == (True, "HTTP 404")
    assert health["failed_event_id"] == "failed:train-3"
    assert h.health("no-such-secret")["failing"] is True
    assert "not found" in h.health("no-such-secret")["last_error"]
    assert {r["state"] for r in h.records()} == {"failed"}
    h.advance(60)
    assert h.deliver(notification("gone-hook", subject="train-4")) == 204  # the script is used up: 200
    assert h.health("gone-hook")["failing"] is False and h.health("gone-hook")["last_error"] == "HTTP 404"


def test_a_receiver_that_never_answers_is_tried_boundedly_then_failing_with_no_url_stored(h):
    path = h.hook("silent", [{"hang_seconds": 3}] * 3)
    n = notification("silent")
    for i in range(2):
        assert h.deliver(n) == 503
        assert h.records()[0]["tries"] == i + 1 and h.records()[0]["last_error"] == "no answer in 0.5s"
        h.advance(10 * 2 ** i)
    assert h.deliver(n) == 204  # the third try: given up, acknowledged
    assert len(h.receiver.received(path)) == 3
    [record] = h.records()
    assert record["state"] == "failed" and record["tries"] == 3
    health = h.health("silent")
    assert health["failing"] is True and "no answer" in health["last_error"]
    assert "127.0.0.1" not in h.stored_text()


def test_a_refused_connection_records_no_url(h):
    h.secrets.values["closed"] = "http://127.0.0.1:9/hook/secret-token-xyz"
    assert h.deliver(notification("closed")) == 503
    assert h.records()[0]["last_error"].startswith("could not connect")
    assert "secret-token-xyz" not in h.stored_text()


def test_two_concurrent_deliveries_post_once(h):
    path = h.hook("busy", [{"status": 200, "delay_seconds": 0.3}])
    n = notification("busy")
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(h.deliver(n))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [204, 503]  # one posted; the other found the lease held
    assert h.deliver(n) == 204
    assert len(h.receiver.received(path)) == 1


def test_the_secret_is_read_once_a_minute():
    secrets = Secrets()
    secrets.values["s"] = "http://x/hook"
    clock = [0.0]
    notifier = Notifier(nd.NotifyPolicy(), lambda: secrets, monotonic=lambda: clock[0])
    for _ in range(3):
        notifier.url_of("s")
    clock[0] += 61
    notifier.url_of("s")
    assert secrets.reads == 2


def test_claim_and_after_post_rules():
    policy = nd.NotifyPolicy(max_tries=2)
    first = nd.claim(None, T0, policy, "e", "d")
    assert first.post and first.record["state"] == "sending"
    assert not nd.claim(first.record, T0 + timedelta(seconds=1), policy, "e", "d").post  # leased
    assert nd.claim(first.record, T0 + timedelta(seconds=policy.lease_seconds + 1), policy, "e", "d").post
    out = nd.after_post(first.record, nd.PostResult(status=503), T0, policy)
    assert out.retry and out.record["next_try_at"] == T0 + timedelta(seconds=10)
    out = nd.after_post(out.record, nd.PostResult(status=503), T0 + timedelta(seconds=10), policy)
    assert not out.retry and out.record["state"] == "failed" and out.health["failing"]
    assert nd.retry_after_seconds("soon", T0) is None
