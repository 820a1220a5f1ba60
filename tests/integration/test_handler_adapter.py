"""The handler adapter, through functions-framework's test client with real push envelopes."""

from __future__ import annotations

import base64
import json
import textwrap

import functions_framework
import pytest

from tpuq.contracts import store
from tpuq.runtime.entrypoints import source_file

SCHEDULER = str(source_file("scheduler"))


def envelope(data: bytes | dict, message_id: str, attributes: dict | None = None) -> dict:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return {
        "message": {"data": base64.b64encode(raw).decode(), "messageId": message_id, "attributes": attributes or {},
                    "publishTime": "2026-11-29T12:00:00Z"},
        "subscription": "projects/tpuq-local/subscriptions/scheduler-jobs",
    }


@pytest.fixture
def scheduler_client(clean_stack):
    return functions_framework.create_app("handle", SCHEDULER, "http").test_client()


def jobs(clients):
    return {d.id: d.to_dict() for d in clients.firestore.collection(store.JOBS).stream()}


def test_same_message_twice_stores_one_job(scheduler_client, clients):
    body = envelope({"tpu": "v4-8", "command": "echo 1"}, "m-100", {"source": "cli"})
    first = scheduler_client.post("/push/jobs", json=body)
    second = scheduler_client.post("/push/jobs", json=body)
    assert first.status_code == 204 and second.status_code == 204
    stored = jobs(clients)
    assert list(stored) == ["job-m-100"]
    assert stored["job-m-100"]["state"] == "pending" and stored["job-m-100"]["source"] == "cli"


def test_cloudevent_form_is_accepted(scheduler_client, clients):
    ce = {"specversion": "1.0", "id": "ce-1", "source": "//pubsub.googleapis.com/projects/p/topics/jobs",
          "type": "google.cloud.pubsub.topic.v1.messagePublished",
          "data": envelope({"id": "ce-job", "tpu": "v4-8", "command": "x"}, "m-ce")}
    assert scheduler_client.post("/push/jobs", json=ce).status_code == 204
    assert jobs(clients)["ce-job"]["state"] == "pending"


def test_reused_id_keeps_the_stored_job(scheduler_client, clients):
    scheduler_client.post("/push/jobs", json=envelope({"id": "same", "tpu": "v4-8", "command": "first"}, "m-1"))
    r = scheduler_client.post("/push/jobs", json=envelope({"id": "same", "tpu": "v4-8", "command": "second"}, "m-2"))
    assert r.status_code == 200
    assert jobs(clients)["same"]["spec"]["command"] == "first"
    dead = [d.to_dict() for d in clients.firestore.collection(store.DEAD_LETTERS).stream()]
    assert dead[0]["field"] == "id" and "already used" in dead[0]["reason"]


@pytest.mark.parametrize(
    "payload,field,reason",
    [
        (b"{not json", "(message)", "not JSON"),
        (b"[1, 2]", "(message)", "not an object"),
        (json.dumps({"id": "r1", "tpu": "v4-8"}).encode(), "command", "required"),
        (json.dumps({"id": "r2", "tpu": "v4-8", "command": "x", "env": {"JOB_ID": "1"}}).encode(), "env", "reserved"),
        (json.dumps({"id": "r3", "tpu": "v4-8", "command": "x", "buckets": ["http://b"]}).encode(), "buckets[0].uri",
         "gs://"),
    ],
)
def test_invalid_payloads_are_acked_and_recorded(scheduler_client, clients, payload, field, reason):
    r = scheduler_client.post("/push/jobs", json=envelope(payload, "bad-1"))
    assert r.status_code == 200  # acknowledged: Pub/Sub will not redeliver
    dead = [d.to_dict() for d in clients.firestore.collection(store.DEAD_LETTERS).stream()]
    assert len(dead) == 1 and dead[0]["field"] == field and reason in dead[0]["reason"]
    assert dead[0]["raw_data"] == payload.decode()


def test_request_that_is_not_an_envelope_is_refused(scheduler_client):
    assert scheduler_client.post("/push/jobs", data=b"hello").status_code == 400
    assert scheduler_client.post("/push/jobs", json={"nomessage": 1}).status_code == 400
    assert scheduler_client.post("/push/nowhere", json=envelope({}, "x")).status_code == 404


@pytest.fixture
def failing_service(clean_stack, tmp_path):
    source = tmp_path / "main.py"
    source.write_text(textwrap.dedent("""
        from tpuq.contracts.errors import Retryable
        from tpuq.runtime.clients import Clients
        from tpuq.runtime.service import Service
        from tpuq.runtime.settings import Settings

        def always_fails(tick, ctx):
            raise Retryable("the TPU API is unavailable")

        settings = Settings.from_env()  # the session stack's emulators
        SERVICE = Service(name="scheduler", routes={"/push/ticks": always_fails}, settings=settings,
                          clients=Clients(settings))

        def handle(request):
            return SERVICE.dispatch(request)
    """))
    return functions_framework.create_app("handle", str(source), "http").test_client()


def test_transient_failure_is_retried_then_dead_lettered(failing_service, clients):
    body = envelope({"seq": 1}, "tick-1")
    codes = [failing_service.post("/push/ticks", json=body).status_code for _ in range(10)]
    assert codes[:9] == [503] * 9  # redelivered by Pub/Sub while under the subscription's limit
    assert codes[9] == 200  # then recorded and acknowledged: it never loops forever
    dead = [d.to_dict() for d in clients.firestore.collection(store.DEAD_LETTERS).stream()]
    assert dead[0]["kind"] == "exhausted" and "unavailable" in dead[0]["reason"]


def test_a_rejection_is_logged_with_the_job_it_names(scheduler_client, clients):
    """On Cloud Run the line is a WARNING entry carrying the job: a filter on jsonPayload.job_id finds it."""
    import io
    import logging

    from tpuq.runtime import logs

    stream = io.StringIO()
    handler = logs.make_handler({"K_SERVICE": "tpuq-scheduler"}, stream)
    logging.getLogger().addHandler(handler)
    try:
        body = envelope({"id": "named-job", "tpu": "v4-8"}, "bad-2")  # no command
        assert scheduler_client.post("/push/jobs", json=body).status_code == 200
    finally:
        logging.getLogger().removeHandler(handler)
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    [rejected] = [e for e in entries if "rejected message" in e["message"]]
    assert rejected["severity"] == "WARNING"
    assert (rejected["job_id"], rejected["message_id"], rejected["subscription"]) == ("named-job", "bad-2",
                                                                                      "scheduler-jobs")
