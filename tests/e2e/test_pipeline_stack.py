"""A pipeline on the local stack (issue 36's done-when): a 6-task sweep with `%2` and an eval that depends on it,
submitted as a user does (`tpuq submit`), each telling a webhook of its own of its end. At most 2 tasks run at once
although 4 slices could hold more; the eval starts only after the last task succeeded; with one task made to fail,
the eval is cancelled naming that task. The stack's webhook receiver gets one notification per event: the group's
end (not one per task) and the eval's. Its own stack: the demo fleet with 4 v4-8 slots, so the limit, not the
fleet, is what holds."""

from __future__ import annotations

import os
import subprocess
import uuid
from datetime import datetime

import pytest
import yaml

from tpuq.contracts import store
from tpuq.operations.notifysecrets import secret_id_for
from tpuq.runtime.secretmanager import SecretManager
from tpuq.runtime.settings import ENV_SECRETMANAGER_ENDPOINT
from tpuq_dev.devstack.notifystack import ENV_WEBHOOK_URL
from tpuq_dev.devstack.stack import wait_for
from tpuq_dev.webhooks import WebhookReceiver

from tests.e2e.conftest import demo_stack_with

DEADLINE = 300
TERMINAL = ("succeeded", "failed", "cancelled", "rejected")


@pytest.fixture(scope="module")
def pipeline_stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("pipeline")
    with demo_stack_with(work, "v4-8", count=4, idle_timeout_seconds=600) as (stack, clients):
        yield stack, clients, work


def submit(stack, work, jobs: list[dict]) -> None:
    path = work / f"pipeline-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump({"jobs": jobs}))
    done = subprocess.run(["tpuq", "submit", str(path)], env={**os.environ, **stack.env}, capture_output=True,
                          text=True, timeout=DEADLINE)
    assert done.returncode == 0, done.stdout + done.stderr


def job(clients, job_id: str) -> dict:
    return clients.firestore.collection(store.JOBS).document(job_id).get().to_dict() or {}


def first_attempt(clients, job_id: str) -> dict:
    return (clients.firestore.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS).document("1")
            .get().to_dict() or {})


def started_attempt(clients, job_id: str) -> dict:
    """The job's first attempt once its start is recorded: Pub/Sub does not order, and an attempt's `ended` may be
    handled before its `started` (which then records `started_at` on the ended attempt)."""
    return wait_for(lambda: (a := first_attempt(clients, job_id)).get("started_at") and a, timeout=DEADLINE,
                    what=f"{job_id}'s start recorded")


def wait_ended(clients, job_id: str) -> dict:
    return wait_for(lambda: (j := job(clients, job_id)).get("state") in TERMINAL and j, timeout=DEADLINE,
                    what=f"{job_id} ended")


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def webhook(stack, tag: str) -> tuple[str, WebhookReceiver, str]:
    """A secret of the test's own naming the receiver's /hook/<tag>, readable by the janitor (as `tpuq submit`
    leaves one it stores from an inline URL): (secret, receiver, path)."""
    receiver, path = WebhookReceiver(stack.env[ENV_WEBHOOK_URL]), f"/hook/{tag}"
    secrets = SecretManager(stack.project, stack.env[ENV_SECRETMANAGER_ENDPOINT])
    secrets.put(f"hook-{tag}", receiver.hook_url(path))
    secrets.grant_accessor(f"hook-{tag}", f"serviceAccount:{stack.service_account('janitor')}")
    return f"hook-{tag}", receiver, path


def told(receiver: WebhookReceiver, path: str, count: int) -> dict[str, dict]:
    """The notifications at `path` once `count` arrived, by event id; each id must come once."""
    bodies = wait_for(lambda: len(got := [r["body"] for r in receiver.received(path)]) >= count and got,
                      timeout=DEADLINE, what=f"{count} notifications at {path}")
    ids = [b["event_id"] for b in bodies]
    assert len(ids) == len(set(ids)) == count, ids
    return {b["event_id"]: b for b in bodies}


def sweep_then_eval(tag: str, task_command: str, notify: list[dict]) -> list[dict]:
    return [{"id": f"train-{tag}", "tpu": "v4-8", "sweep": {"LR": ["1e-3", "3e-4"], "SEED": [0, 1, 2]},
             "max_running": 2, "command": task_command, "notify": notify},
            {"id": f"eval-{tag}", "tpu": "v4-8", "depends_on": [f"train-{tag}"], "command": "echo evaluated",
             "notify": notify}]


def test_a_sweep_limited_to_two_then_its_eval(pipeline_stack):
    stack, clients, work = pipeline_stack
    tag = uuid.uuid4().hex[:6]
    # The URL inline, as a user may write it: `tpuq submit` keeps it in Secret Manager and publishes the secret.
    receiver, path = WebhookReceiver(stack.env[ENV_WEBHOOK_URL]), f"/hook/{tag}"
    notify = [{"url": receiver.hook_url(path), "format": "json"}]
    submit(stack, work, sweep_then_eval(tag, 'echo "lr=$LR seed=$SEED task $TPUQ_ARRAY_INDEX"; sleep 2', notify))
    tasks = [wait_ended(clients, f"train-{tag}-{i}") for i in range(6)]
    assert [t["state"] for t in tasks] == ["succeeded"] * 6, [t.get("reason") for t in tasks]
    spans = [(a["started_at"], a["ended_at"]) for a in (started_attempt(clients, t["id"]) for t in tasks)]
    assert most_at_once(spans) == 2, spans
    evaluated = wait_ended(clients, f"eval-{tag}")
    assert evaluated["state"] == "succeeded", evaluated.get("reason")
    assert started_attempt(clients, evaluated["id"])["started_at"] >= max(end for _, end in spans)
    notices = told(receiver, path, 2)
    assert set(notices) == {f"succeeded:group:train-{tag}", f"succeeded:eval-{tag}"}, notices
    stored = [job(clients, f"eval-{tag}"), *tasks]
    assert path not in str(stored) and "/hook/" not in str(stored)  # only the secret's name is stored
    assert stored[0]["spec"]["notify"][0]["secret"] == secret_id_for(receiver.hook_url(path))


def test_a_failed_task_cancels_the_eval_naming_it(pipeline_stack):
    stack, clients, work = pipeline_stack
    tag = uuid.uuid4().hex[:6]
    secret, receiver, path = webhook(stack, tag)
    submit(stack, work, sweep_then_eval(tag, 'if [ "$TPUQ_ARRAY_INDEX" = 3 ]; then exit 4; fi; sleep 1',
                                        [{"secret": secret, "format": "json"}]))
    failed = wait_ended(clients, f"train-{tag}-3")
    assert failed["state"] == "failed", failed.get("reason")
    evaluated = wait_ended(clients, f"eval-{tag}")
    assert evaluated["state"] == "cancelled" and f"train-{tag}-3" in evaluated["reason"], evaluated.get("reason")
    assert not first_attempt(clients, evaluated["id"])  # it never ran
    notices = told(receiver, path, 2)
    assert set(notices) == {f"failed:group:train-{tag}", f"cancelled:eval-{tag}"}, notices
    assert f"train-{tag}-3" in notices[f"failed:group:train-{tag}"]["text"]
    assert f"train-{tag}-3" in notices[f"cancelled:eval-{tag}"]["text"]
