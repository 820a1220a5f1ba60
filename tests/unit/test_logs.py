"""Logs: one JSON object a line on Cloud Run (what Cloud Logging reads as a structured entry), text locally.

Every line logged while a push is handled carries its subscription, message id and, when the message names
them, job, attempt and node: one Cloud Logging filter then follows a job across the four services.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pytest
from werkzeug.test import EnvironBuilder

from tpuq.runtime import logs
from tpuq.runtime.auth import PushAuth
from tpuq.contracts.messages import AttemptEvent
from tpuq.runtime.service import Service
from tpuq.runtime.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CLOUD_RUN = {"K_SERVICE": "tpuq-scheduler"}
log = logging.getLogger("tpuq.test")


@pytest.fixture
def captured():
    """A handler of the given format on the root logger, and the lines it wrote."""
    handlers = []

    def attach(env: dict) -> io.StringIO:
        stream = io.StringIO()
        handler = logs.make_handler(env, stream)
        logging.getLogger().addHandler(handler)
        handlers.append(handler)
        return stream

    previous = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)
    yield attach
    for handler in handlers:
        logging.getLogger().removeHandler(handler)
    logging.getLogger().setLevel(previous)


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_on_cloud_run_each_record_is_one_json_object_with_severity_and_context(captured):
    out = captured(CLOUD_RUN)
    with logs.log_context(job_id="j-1", attempt=2, node="projects/p/locations/z/nodes/n", message_id="m-9"):
        log.warning("worker %d lost", 3)
    log.info("no context here")
    first, second = (json.loads(line) for line in lines(out))
    assert first["severity"] == "WARNING" and first["message"] == "worker 3 lost"
    assert (first["job_id"], first["attempt"], first["node"], first["message_id"]) == (
        "j-1", 2, "projects/p/locations/z/nodes/n", "m-9")
    assert first["logging.googleapis.com/sourceLocation"]["function"] == (
        "test_on_cloud_run_each_record_is_one_json_object_with_severity_and_context")
    assert second["severity"] == "INFO" and "job_id" not in second


def test_an_exception_is_an_error_with_its_traceback_in_the_message_on_one_line(captured):
    out = captured(CLOUD_RUN)
    try:
        raise RuntimeError("the TPU API is down")
    except RuntimeError:
        log.exception("handler failed")
    [line] = lines(out)  # a traceback never splits the entry
    entry = json.loads(line)
    assert entry["severity"] == "ERROR"
    assert entry["message"].startswith("handler failed\nTraceback") and "the TPU API is down" in entry["message"]


def test_locally_records_are_readable_text_with_the_context_in_brackets(captured):
    out = captured({})
    with logs.log_context(subscription="scheduler-jobs", job_id="j-1"):
        log.warning("stored")
    [line] = lines(out)
    assert line.endswith("tpuq.test WARNING stored [subscription=scheduler-jobs job_id=j-1]")
    with pytest.raises(ValueError):
        json.loads(line)


def test_setup_leaves_a_root_logger_someone_else_configured_alone():
    root = logging.getLogger()
    before = list(root.handlers)
    assert before  # pytest's capture handlers
    logs.setup(env=CLOUD_RUN)
    assert root.handlers == before


def test_a_push_is_logged_with_its_subscription_message_and_job(captured, monkeypatch):
    out = captured(CLOUD_RUN)

    def handler(event, ctx):
        log.info("attempt %s ended", event.attempt)

    # The project comes from the service's settings (GOOGLE_CLOUD_PROJECT, which deploy sets on Cloud Run).
    service = Service("scheduler", {"/push/attempt-events": handler}, Settings(project="p"), clients=None,
                      push_auth=PushAuth())
    event = AttemptEvent(kind="ended", job_id="j-7", attempt=3, attempt_id="j-7-3", node="projects/p/nodes/n-1",
                         outcome="succeeded", at=datetime(2026, 12, 1, tzinfo=timezone.utc))
    body = {"message": {"data": base64.b64encode(event.model_dump_json().encode()).decode(), "messageId": "m-42"},
            "subscription": "projects/p/subscriptions/scheduler-attempt-events"}
    request = EnvironBuilder(path="/push/attempt-events", method="POST", json=body, headers={
        "X-Cloud-Trace-Context": "105445aa7843bc8bf206b12000100000/1;o=1"}).get_request()
    assert service.dispatch(request) == ("", 204)
    [entry] = [json.loads(line) for line in lines(out) if "ended" in line]
    assert entry["message"] == "attempt 3 ended"
    assert {k: entry[k] for k in ("service", "subscription", "message_id", "job_id", "attempt", "node")} == {
        "service": "scheduler", "subscription": "scheduler-attempt-events", "message_id": "m-42", "job_id": "j-7",
        "attempt": 3, "node": "projects/p/nodes/n-1"}
    assert entry["logging.googleapis.com/trace"] == "projects/p/traces/105445aa7843bc8bf206b12000100000"


def test_a_service_process_on_cloud_run_writes_json_lines_to_stdout(tmp_path):
    """The services' entry points set logging up: with K_SERVICE set, what they log is JSON on stdout."""
    script = textwrap.dedent(f"""
        import functions_framework
        app = functions_framework.create_app("handle", {str(REPO / "services/janitor/main.py")!r}, "http")
        app.test_client().post("/push/ticks", data=b"not json")
    """)
    env = {"K_SERVICE": "tpuq-janitor", "PATH": "/usr/bin:/bin", "GOOGLE_CLOUD_PROJECT": "p"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    entries = [json.loads(line) for line in done.stdout.splitlines()]
    [bad] = [e for e in entries if "bad push envelope" in e["message"]]
    assert bad["severity"] == "WARNING" and bad["service"] == "janitor"
    assert "bad push envelope" not in done.stderr


def test_lines_logged_from_a_thread_pool_keep_the_push_context(captured):
    """The executor's SSH threads log inside the push's context, so their lines carry the job too."""
    from concurrent.futures import ThreadPoolExecutor

    out = captured(CLOUD_RUN)
    with ThreadPoolExecutor(max_workers=2) as pool, logs.log_context(job_id="j-7", attempt=1):
        futures = [logs.submit_in_context(pool, log.info, "worker %d connected", w) for w in range(4)]
        plain = pool.submit(log.info, "outside the context")
        for f in [*futures, plain]:
            f.result()
    entries = [json.loads(line) for line in lines(out)]
    kept = [e for e in entries if e["message"].startswith("worker")]
    assert len(kept) == 4 and all((e["job_id"], e["attempt"]) == ("j-7", 1) for e in kept)
    assert "job_id" not in next(e for e in entries if e["message"] == "outside the context")
