"""Messages no handler ever answered, which Pub/Sub dead-lettered (tpuq.operations.heldletters), shown beside the handlers' own
records wherever a refused message shows (tpuq.operations.deadletters.merged, the CLI's `tpuq status`)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest

from tpuq.operations import deadletters, heldletters

PARIS = ZoneInfo("Europe/Paris")
PUBLISHED = datetime(2026, 12, 1, 14, 0, 0, tzinfo=timezone.utc)
FORWARDED = datetime(2026, 12, 1, 14, 1, 5, tzinfo=timezone.utc)
# As Pub/Sub (and the emulator) forward it: the original data and attributes, plus the four source attributes.
FORWARD_ATTRIBUTES = {"owner": "ada@example.com", "source": "cli",
                      heldletters.SOURCE_DELIVERY_COUNT: "10", heldletters.SOURCE_SUBSCRIPTION: "scheduler-jobs",
                      heldletters.SOURCE_SUBSCRIPTION_PROJECT: "tpuq-local",
                      heldletters.SOURCE_TOPIC_PUBLISH_TIME: "2026-12-01T14:00:00.000Z"}


def held(data: dict, attributes=FORWARD_ATTRIBUTES, forwarded_at=FORWARDED, message_id: str = "77") -> dict:
    return heldletters.held_record(message_id, json.dumps(data).encode(), attributes, forwarded_at)


def handler_record(message_id: str, at: datetime, topic: str = "jobs") -> dict:
    return {"message_id": message_id, "topic": topic, "subscription": f"scheduler-{topic}", "field": "tpu",
            "reason": "unknown TPU type", "job_id": None, "recorded_at": at, "kind": "invalid"}


def test_a_forwarded_message_becomes_a_record_with_its_subscription_attempts_and_reason_class():
    record = held({"id": "train-1", "tpu": "v4-8", "command": "x"})
    assert record["subscription"] == "scheduler-jobs" and record["topic"] == "jobs" and record["service"] == "scheduler"
    assert record["delivery_attempts"] == 10 and record["job_id"] == "train-1"
    assert record["published_at"] == PUBLISHED and record["recorded_at"] == FORWARDED
    assert record["attributes"] == {"owner": "ada@example.com", "source": "cli"}  # Pub/Sub's own left out
    assert record["message_id"] is None and record["dead_letter_message_id"] == "77"  # the copy's id, not the original's
    assert record["reason"] == "never answered by a handler: Pub/Sub gave up after 10 delivery attempts"
    assert deadletters.reason_class(record) == "never answered by a handler"
    assert held({"tpu": "v4-8"})["job_id"] is None  # published without an id


def test_a_full_subscription_name_and_an_unknown_subscription_are_read_as_well_as_can_be():
    odd = {**FORWARD_ATTRIBUTES, heldletters.SOURCE_SUBSCRIPTION: "projects/p/subscriptions/janitor-ticks",
           heldletters.SOURCE_DELIVERY_COUNT: "x"}
    record = heldletters.held_record("1", b"not json", odd, None)
    assert record["subscription"] == "janitor-ticks" and record["topic"] == "ticks" and record["job_id"] is None
    assert record["delivery_attempts"] is None and record["reason"] == "never answered by a handler"
    gone = heldletters.held_record("2", b"{}", {heldletters.SOURCE_SUBSCRIPTION: "retired-sub"}, None)
    assert gone["topic"] == "" and gone["subscription"] == "retired-sub"


def test_both_sources_merge_into_one_list_newest_first_filtered_and_limited():
    older = handler_record("5", FORWARDED.replace(minute=0))
    newer = handler_record("6", FORWARDED.replace(minute=2))
    ticks = handler_record("7", FORWARDED.replace(minute=3), topic="ticks")
    kept = held({"id": "train-1"})  # forwarded at 14:01:05
    assert [r.get("message_id") or r["job_id"] for r in deadletters.merged([older, newer, ticks], [kept])] == [
        "7", "6", "train-1", "5"]
    assert [r.get("message_id") or r["job_id"] for r in deadletters.merged([older, newer, ticks], [kept], "jobs", 2)] \
        == ["6", "train-1"]


def test_the_row_shows_subscription_attempts_and_when_it_was_published():
    row = deadletters.row(held({"id": "train-1"}), PARIS)
    assert row["subscription"] == "scheduler-jobs" and row["attempts"] == "10" and row["what"] == "job train-1"
    assert row["time"] == "2026-12-01 15:01:05 CET" and row["class"] == "never answered by a handler"
    assert row["reason"] == ("never answered by a handler: Pub/Sub gave up after 10 delivery attempts "
                             "(published 2026-12-01 15:00:00 CET)")
    assert deadletters.row(held({"tpu": "v4-8"}), PARIS)["what"] == "a job without an id"
    as_json = deadletters.as_json(held({"id": "train-1"}))
    assert as_json["delivery_attempts"] == 10 and as_json["reason_class"] == "never answered by a handler"
    assert as_json["published_at"] == "2026-12-01T14:00:00+00:00"


def test_status_finds_a_dead_lettered_submission_by_the_job_id_it_names():
    kept = [held({"id": "train-1"}), held({"tpu": "v4-8"}, message_id="78")]
    [found] = deadletters.held_for_job_id(kept, "train-1")
    lines = deadletters.status_lines("train-1", found, PARIS)
    assert lines[0] == ("train-1: never stored as a job: never answered by a handler (Pub/Sub dead-lettered it from "
                        "subscription scheduler-jobs after 10 delivery attempts, 2026-12-01 15:01:05 CET)")
    assert "  published: 2026-12-01 15:00:00 CET" in lines and lines[-1] == '  message: {"id": "train-1"}'


def test_job_message_id_can_only_be_offered_the_dead_lettered_submissions_naming_no_job():
    """Pub/Sub's forwarded copy is a new message: the original id is gone, so `job-<message id>` can't be matched."""
    kept = [held({"id": "train-1"}), held({"tpu": "v4-8"}, message_id="78")]
    assert deadletters.held_for_job_id(kept, "job-1234") == []
    [candidate] = deadletters.unnamed_held(kept, "job-1234")
    assert deadletters.unnamed_held(kept, "train-2") == []  # not a job-<message id>: nothing to offer
    lines = deadletters.unnamed_lines("job-1234", [candidate], PARIS)
    assert "Pub/Sub dead-lettered 1 submission(s) naming no job id" in lines[0]
    assert lines[1] == ("  published 2026-12-01 15:00:00 CET, dead-lettered 2026-12-01 15:01:05 CET from subscription "
                        "scheduler-jobs after 10 delivery attempts")


def test_tpuq_status_reads_the_hold_subscription_only_when_nothing_else_names_the_id(capsys):
    from tpuq.contracts import store
    from tpuq.cli.deadletters import status_of_no_job
    from tpuq_dev.inmemory import MemoryFirestore

    db = MemoryFirestore(project="p")
    db.collection(store.DEAD_LETTERS).document("scheduler-jobs:1234").set(handler_record("1234", FORWARDED))
    reads = []

    def read_held():
        reads.append(1)
        return [held({"id": "train-1"}), held({"tpu": "v4-8"}, message_id="78")], None

    assert status_of_no_job(db, "job-1234", as_json=False, held=read_held) and reads == []
    capsys.readouterr()
    assert status_of_no_job(db, "train-1", as_json=True, held=read_held) and reads == [1]
    [shown] = json.loads(capsys.readouterr().out)["dead_letters"]
    assert shown["subscription"] == "scheduler-jobs" and shown["delivery_attempts"] == 10
    assert not status_of_no_job(db, "job-999", as_json=False, held=read_held)  # the "no job" error follows ...
    assert "Pub/Sub dead-lettered 1 submission(s) naming no job id" in capsys.readouterr().err  # ... after a hint
    assert not status_of_no_job(db, "job-999", as_json=False, held=lambda: ([], "could not read: 403"))
    assert "note: could not read: 403" in capsys.readouterr().err


class Subscriber:
    """Pub/Sub's pull and modifyAckDeadline for the hold subscription: `batches` are what successive pulls bring
    (an exception is raised instead), every nack is recorded."""

    def __init__(self, *batches):
        self.batches = list(batches)
        self.pulls: list[tuple[dict, float]] = []
        self.nacked: list[str] = []

    def pull(self, request, timeout):
        self.pulls.append((request, timeout))
        batch = self.batches.pop(0) if self.batches else []
        if isinstance(batch, Exception):
            raise batch
        return SimpleNamespace(received_messages=batch)

    def modify_ack_deadline(self, request):
        assert request["ack_deadline_seconds"] == 0 and request["subscription"].endswith("/dead-letters-hold")
        self.nacked += request["ack_ids"]


def received(ack_id: str, job_id: str) -> SimpleNamespace:
    return SimpleNamespace(ack_id=ack_id, message=SimpleNamespace(
        message_id=f"m-{ack_id}", data=json.dumps({"id": job_id}).encode(), attributes=FORWARD_ATTRIBUTES,
        publish_time=FORWARDED))


def clients_with(subscriber) -> SimpleNamespace:
    from tpuq.runtime.settings import Settings

    return SimpleNamespace(subscriber=subscriber, settings=Settings(project="tpuq-local"))


def test_a_read_pulls_until_nothing_more_and_hands_every_message_back():
    from google.api_core.exceptions import DeadlineExceeded

    subscriber = Subscriber([received("a", "j1"), received("b", "j2")], [received("c", "j3")], DeadlineExceeded("x"))
    records = heldletters.read(clients_with(subscriber))
    assert [r["job_id"] for r in records] == ["j1", "j2", "j3"]
    assert subscriber.nacked == ["a", "b", "c"]  # nothing acknowledged: the next reader sees them all again
    assert [t for _, t in subscriber.pulls] == [heldletters.FIRST_PULL_SECONDS] + [heldletters.MORE_PULL_SECONDS] * 2
    assert subscriber.pulls[0][0]["subscription"] == "projects/tpuq-local/subscriptions/dead-letters-hold"
    assert heldletters.read(clients_with(Subscriber([]))) == []  # an empty subscription


def test_a_read_that_fails_says_why_and_still_hands_back_what_it_pulled():
    from google.api_core.exceptions import NotFound, PermissionDenied

    subscriber = Subscriber([received("a", "j1")], PermissionDenied("User not authorized"))
    with pytest.raises(heldletters.HeldUnreadable, match="PermissionDenied.*roles/pubsub.subscriber"):
        heldletters.read(clients_with(subscriber))
    assert subscriber.nacked == ["a"]
    with pytest.raises(heldletters.HeldUnreadable, match="`tpuq deploy` creates it"):
        heldletters.read(clients_with(Subscriber(NotFound("no subscription"))))
