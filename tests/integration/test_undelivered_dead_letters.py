"""A submission no handler ever answers is dead-lettered, and the CLI shows it, as a user runs it.

On the session stack: the scheduler's container is killed (a crash), so every push of the message gets the front's
503, as Cloud Run answers with no instance to serve it; after the subscription's maxDeliveryAttempts the front
dead-letters it as Pub/Sub does (tpuq_dev.devstack.deadlettering), the hold subscription keeps it, and
`tpuq dead-letters` and `tpuq status` (subprocesses) show it with its subscription and delivery attempts.

The deployed policy (tpuq.contracts.topology) waits a backoff of 1 s doubling to 60 s between deliveries (the front's
dispatcher applies it as Pub/Sub does: 15 s of waits for 5 attempts); this test gives its scheduler-jobs
subscription 5 attempts (Pub/Sub's minimum) and a backoff of 0.1 s doubling to 0.5 s, about a second in all. What is
proved (dead-lettered after the policy's attempts, shown by the CLI) does not depend on the backoff.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import requests

from tests.helpers import wait_until
from tpuq.contracts import store
from tpuq.deploy.subscriptions import desired_subscription

ATTEMPTS = 5
BACKOFF = {"minimumBackoff": "0.1s", "maximumBackoff": "0.5s"}  # Pub/Sub allows 0 s to 600 s


def tpuq(stack, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **stack.env, "TPUQ_DEV_DIR": str(stack.state_dir), "COLUMNS": "250", "TZ": "UTC"}
    return subprocess.run(["tpuq", *args], env=env, capture_output=True, text=True, timeout=120)


def with_policy(stack, name: str, attempts: int, retry: dict[str, str]) -> None:
    """The subscription as the stack declares it (as deploy creates it), with another maxDeliveryAttempts and
    retryPolicy."""
    target, infra = stack.deployment()
    spec = next(s for s in infra.pubsub.subscriptions if s.name == name)
    body = desired_subscription(target, infra, spec)
    body["deadLetterPolicy"]["maxDeliveryAttempts"] = attempts
    body["retryPolicy"] = retry
    url = f"http://{stack.env['PUBSUB_EMULATOR_HOST']}/v1/projects/{stack.project}/subscriptions/{name}"
    requests.delete(url, timeout=10).raise_for_status()
    requests.put(url, json=body, timeout=10).raise_for_status()


def listed(stack, job_id: str) -> dict | None:
    done = tpuq(stack, "dead-letters", "--json")
    assert done.returncode == 0, done.stderr
    return next((r for r in json.loads(done.stdout) if r.get("job_id") == job_id), None)


def test_a_submission_no_handler_answers_is_shown_with_its_subscription_and_attempts(clean_stack, clients):
    stack = clean_stack
    with_policy(stack, "scheduler-jobs", ATTEMPTS, BACKOFF)
    job_id = f"undelivered-{uuid.uuid4().hex[:8]}"
    stack.kill_service("scheduler")
    try:
        message_id = clients.publish("jobs", {"id": job_id, "tpu": "v4-8", "command": "echo never"})
        subscription = f"projects/{stack.project}/subscriptions/scheduler-jobs"
        wait_until(lambda: stack.delivery_counts().get((subscription, message_id), 0) >= ATTEMPTS, timeout=90,
                   what=f"{ATTEMPTS} deliveries of the submission")
        record = wait_until(lambda: listed(stack, job_id), timeout=60, what="the dead letter in `tpuq dead-letters`")
    finally:
        stack.start_service_again("scheduler")
    assert record["subscription"] == "scheduler-jobs" and record["topic"] == "jobs"
    assert record["delivery_attempts"] == ATTEMPTS and record["reason_class"] == "never answered by a handler"
    assert json.loads(record["raw_data"])["id"] == job_id
    assert not clients.firestore.collection(store.JOBS).document(job_id).get().exists  # no trace but this one

    # Read, not consumed: the hold subscription still keeps it for the next reader (the table, then `tpuq status`).
    table = tpuq(stack, "dead-letters", "--topic", "jobs").stdout
    line = next(line for line in table.splitlines() if job_id in line)
    cells = line.split("\t")  # piped (not a terminal): tab-separated, the reason whole (tpuq.cli.views.tab_separated)
    assert cells[2] == "scheduler-jobs" and cells[5] == str(ATTEMPTS) and "never answered by a handler" in line

    shown = tpuq(stack, "status", job_id)
    assert shown.returncode == 0, shown.stderr
    assert (f"{job_id}: never stored as a job: never answered by a handler (Pub/Sub dead-lettered it from "
            f"subscription scheduler-jobs after {ATTEMPTS} delivery attempts") in shown.stdout
