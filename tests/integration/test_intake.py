"""A published job lands in Firestore: through the Python client and through the real gcloud CLI."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tpuq.contracts import store
from tpuq_dev.devstack.stack import wait_for

VALID_JOB = {"id": "hello-1", "tpu": "v4-8", "command": "echo hello", "priority": "high"}


def _job(clients, job_id):
    snap = clients.firestore.collection(store.JOBS).document(job_id).get()
    return snap.to_dict() if snap.exists else None


def _dead_letters(clients):
    return [d.to_dict() for d in clients.firestore.collection(store.DEAD_LETTERS).stream()]


def test_published_job_is_stored_pending(clients):
    clients.publish("jobs", VALID_JOB, source="cli")
    job = wait_for(lambda: _job(clients, "hello-1"), what="job stored")
    assert job["state"] == "pending"
    assert job["source"] == "cli"
    assert job["spec"]["command"] == "echo hello"
    assert job["spec"]["tpu"] == ["v4-8"]
    assert job["priority"] == "high"
    assert job["submit_time"] is not None


def test_job_without_id_gets_one_from_the_message(clients):
    message_id = clients.publish("jobs", {"tpu": ["v4-8"], "command": "true"})
    job = wait_for(lambda: _job(clients, f"job-{message_id}"), what="job stored")
    assert job["state"] == "pending" and job["source"] == "pubsub"


def test_invalid_message_is_recorded_with_the_field_and_not_redelivered(clients):
    clients.publish("jobs", {"id": "bad-1", "tpu": "v4-8", "command": "x", "priority": "urgent"})
    dead = wait_for(lambda: _dead_letters(clients), what="dead letter")
    assert len(dead) == 1
    assert dead[0]["field"] == "priority"
    assert "priority" in dead[0]["reason"]
    assert json.loads(dead[0]["raw_data"])["priority"] == "urgent"
    job = wait_for(lambda: _job(clients, "bad-1"), what="rejected job")
    assert job["state"] == "rejected" and "priority" in job["reason"]
    # Acknowledged, not redelivered: a later valid message is processed and the dead letter stays single.
    clients.publish("jobs", VALID_JOB)
    wait_for(lambda: _job(clients, "hello-1"), what="next job")
    assert len(_dead_letters(clients)) == 1


def test_payload_that_is_not_json_is_recorded(clients):
    future = clients.publisher.publish(clients.settings.topic_path("jobs"), b"this is not json")
    future.result()
    dead = wait_for(lambda: _dead_letters(clients), what="dead letter")
    assert "not JSON" in dead[0]["reason"] and dead[0]["field"] == "(message)"


@pytest.fixture
def gcloud_env(clean_stack, tmp_path):
    config = tmp_path / "gcloud"
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": str(config),
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": f"http://{clean_stack.env['PUBSUB_EMULATOR_HOST']}/",
        "CLOUDSDK_CORE_PROJECT": clean_stack.project,
    }
    subprocess.run(["gcloud", "config", "set", "auth/disable_credentials", "true"], env=env, check=True,
                   capture_output=True)
    return env


def test_gcloud_publish_valid_and_invalid(gcloud_env, clients):
    ok = subprocess.run(
        ["gcloud", "pubsub", "topics", "publish", "jobs", "--message", json.dumps({**VALID_JOB, "id": "from-gcloud"})],
        env=gcloud_env, capture_output=True, text=True, timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    job = wait_for(lambda: _job(clients, "from-gcloud"), what="gcloud job stored")
    assert job["state"] == "pending"

    bad = subprocess.run(
        ["gcloud", "pubsub", "topics", "publish", "jobs", "--message", json.dumps({"id": "no-command", "tpu": "v4-8"})],
        env=gcloud_env, capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 0, bad.stderr
    dead = wait_for(lambda: _dead_letters(clients), what="dead letter")
    assert dead[0]["field"] == "command" and "required" in dead[0]["reason"]
    # The dead letter is written first, the rejected job after it: wait for the job, do not read between the two.
    assert wait_for(lambda: _job(clients, "no-command"), what="rejected job")["state"] == "rejected"
