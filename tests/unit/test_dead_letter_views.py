"""What `tpuq dead-letters` and `tpuq status job-<message id>` show of a refused message (tpuq.operations.deadletters)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from tpuq.operations import deadletters

PARIS = ZoneInfo("Europe/Paris")
AT = datetime(2026, 12, 1, 14, 3, 7, tzinfo=timezone.utc)
REFUSED = {"message_id": "1234", "topic": "jobs", "subscription": "scheduler-jobs", "field": "tpu",
           "reason": "tpu: unknown accelerator type 'v9-8'", "raw_data": '{"tpu": "v9-8",\n "command": "x"}',
           "job_id": None, "recorded_at": AT, "kind": "invalid"}


@pytest.mark.parametrize("job_id, message_id", [("job-1234", "1234"), ("job-", None), ("train-1", None),
                                                 ("1234", None)])
def test_the_message_id_a_job_id_was_made_from(job_id, message_id):
    assert deadletters.message_id_of(job_id) == message_id


def test_a_row_has_the_time_with_its_zone_topic_message_field_and_reason():
    assert deadletters.row(REFUSED, PARIS) == {
        "time": "2026-12-01 15:03:07 CET", "topic": "jobs", "message_id": "1234", "what": "job-1234", "field": "tpu",
        "reason": "tpu: unknown accelerator type 'v9-8'", "kind": "invalid", "subscription": "scheduler-jobs",
        "attempts": "", "class": "refused by its handler"}


@pytest.mark.parametrize("record, what", [
    ({**REFUSED, "job_id": "train-1"}, "job train-1"),
    ({**REFUSED, "topic": "gcs-events", "raw_data": json.dumps({"bucket": "b", "name": "submit/x.yaml"})},
     "gs://b/submit/x.yaml"),
    ({**REFUSED, "topic": "gcs-events", "raw_data": "not json"}, ""),
])
def test_what_was_refused(record, what):
    assert deadletters.what(record) == what


def test_newest_first():
    older = {**REFUSED, "message_id": "1", "recorded_at": AT.replace(hour=1)}
    assert [r["message_id"] for r in deadletters.newest_first([older, REFUSED])] == ["1234", "1"]


def test_status_of_a_refused_message_names_it_field_reason_and_payload():
    lines = deadletters.status_lines("job-1234", REFUSED, PARIS)
    assert lines[0] == ("job-1234: refused, never stored as a job (message 1234 on topic jobs, "
                        "2026-12-01 15:03:07 CET)")
    assert "  field: tpu" in lines and "  reason: tpu: unknown accelerator type 'v9-8'" in lines
    assert lines[-1] == '  message: {"tpu": "v9-8", "command": "x"}'
    reused = deadletters.status_lines("job-1234", {**REFUSED, "job_id": "train-1"}, PARIS)
    assert "  it asked for job id train-1" in reused


def test_json_has_iso_times_with_their_offset():
    assert deadletters.as_json(REFUSED)["recorded_at"] == "2026-12-01T14:03:07+00:00"


def test_status_of_an_id_that_is_no_job(capsys):
    """`tpuq status` finds a refused message by `job-<message id>` or the id it asked for, and the jobs a `jobs:`
    file message stored; a stored job is left to the job view (on the in-memory Firestore)."""
    from tpuq.contracts import store
    from tpuq.cli.deadletters import status_of_no_job
    from tpuq_dev.inmemory import MemoryFirestore

    db = MemoryFirestore(project="p")
    db.collection(store.DEAD_LETTERS).document("scheduler-jobs:1234").set(REFUSED)
    db.collection(store.DEAD_LETTERS).document("scheduler-jobs:77").set({**REFUSED, "message_id": "77",
                                                                        "job_id": "taken"})
    for job_id in ("job-88-0", "mine", "taken"):
        db.collection(store.JOBS).document(job_id).set({"id": job_id, "state": "pending", "message_id": "88"})
    assert status_of_no_job(db, "job-1234", as_json=False)
    assert "job-1234: refused, never stored as a job (message 1234" in capsys.readouterr().out
    assert status_of_no_job(db, "job-77", as_json=True)
    assert json.loads(capsys.readouterr().out)["dead_letters"][0]["job_id"] == "taken"
    assert status_of_no_job(db, "job-88", as_json=False)
    assert capsys.readouterr().out.strip() == "job-88 is no job: message 88 submitted job-88-0, mine, taken (tpuq status ID)"
    assert not status_of_no_job(db, "taken", as_json=False)  # a stored job: shown as a job, with its refusal under it
    assert not status_of_no_job(db, "job-999", as_json=False)  # unknown: the usual "no job" error follows


def test_refused_submissions_are_counted_over_a_day_of_both_submission_topics():
    """`tpuq list`'s note: refused jobs messages and uploaded files since a time, at most `look_at` read a topic."""
    from datetime import timedelta

    from tpuq_dev.inmemory import MemoryFirestore
    from tpuq.contracts import store

    db = MemoryFirestore()
    letters = db.collection(store.DEAD_LETTERS)
    for i, (topic, subscription, kind, hours_ago) in enumerate([
            ("jobs", "scheduler-jobs", "invalid", 1), ("jobs", "scheduler-jobs", "invalid", 30),
            ("gcs-events", "scheduler-gcs-submit", "invalid", 2),
            ("gcs-events", "executor-gcs-status", "invalid", 1),  # a worker's status object: no submission
            ("jobs", "scheduler-jobs", "exhausted", 3),  # failed in its handler: not refused
            ("ticks", "scheduler-ticks", "invalid", 1)]):
        letters.document(f"d{i}").set({**REFUSED, "message_id": str(i), "topic": topic, "subscription": subscription,
                                       "kind": kind, "recorded_at": AT - timedelta(hours=hours_ago)})
    assert deadletters.refused_submissions_since(db, AT - timedelta(hours=24)) == (2, False)
    # Reading only the newest of each topic: the day had more than it counted.
    assert deadletters.refused_submissions_since(db, AT - timedelta(hours=48), look_at=1) == (1, True)
    assert deadletters.refused_submissions_since(db, AT) == (0, False)
