"""Each golden envelope (tests/envelopes/) reaches the scheduler's job intake and stores the job it carries."""

from __future__ import annotations

import json

import pytest

from tests.helpers import golden_envelope

GOLDEN = ["pubsub-push.json", "cloudevent-structured.json", "cloudevent-binary.json"]


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_envelope_stores_its_job(sched, name):
    golden = golden_envelope(name)
    headers, body = (golden["headers"], golden["body"]) if "headers" in golden else ({}, golden)
    for _ in range(2):  # a redelivery stores nothing new
        r = sched.client.post("/push/jobs", data=json.dumps(body),
                              headers={"Content-Type": "application/json", **headers})
        assert r.status_code == 204, r.get_data(as_text=True)
    job = sched.job("golden-1")
    assert job["state"] == "pending" and job["message_id"] == "2070443601311540" and job["source"] == "pubsub"
    assert job["spec"]["command"] == "echo hello"
