"""The supervisor stops the job itself: on the preemption or maintenance notice (read from a metadata server while
the job runs) and at the job's max_duration; and the job's environment says where its attempt stands.

The supervisor runs as the executor ships it (tests/executor/test_worker_supervisor.py's `Worker`); an in-process
HTTP server stands in for the metadata server, as strict as Google's about the Metadata-Flavor header.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tpuq.executor.worker.notice import notice_from

from .conftest import wait_until
from .factories import make_assignment
from .test_worker_supervisor import Worker, supervisor_script  # noqa: F401 - the fixture, for this module

PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
MAINTENANCE_PATH = "/computeMetadata/v1/instance/maintenance-event"


class FakeMetadata:
    """instance/preempted and instance/maintenance-event, with values a test changes."""

    def __init__(self):
        self.values = {PREEMPTED_PATH: "FALSE", MAINTENANCE_PATH: "NONE"}
        self.requests = 0
        values, outer = self.values, self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.requests += 1
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403, "Missing Metadata-Flavor:Google header.")
                    return
                body = values.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metadata():
    m = FakeMetadata()
    yield m
    m.close()


@pytest.fixture
def worker(supervisor_script, tmp_path, fake_gcs, metadata):  # noqa: F811 - the imported fixture
    w = Worker(supervisor_script, tmp_path / "home", fake_gcs, tmp_path / "libtpu_lockfile")
    w.settings = dataclasses.replace(w.settings, preempted_url=metadata.base + PREEMPTED_PATH,
                                     maintenance_event_url=metadata.base + MAINTENANCE_PATH,
                                     preemption_grace_seconds=0.5)
    yield w
    w.kill_everything()


@pytest.mark.parametrize("preempted, event, notice", [
    ("FALSE", "NONE", None),
    ("TRUE", "NONE", "preempted"),
    ("true\n", None, "preempted"),
    ("FALSE", "TERMINATE_ON_HOST_MAINTENANCE", "host maintenance (TERMINATE_ON_HOST_MAINTENANCE)"),
    ("FALSE", "MIGRATE_ON_HOST_MAINTENANCE", None),  # a live migration keeps the VM running
    (None, None, None),  # no answer is no evidence
])
def test_notice_from_the_two_answers(preempted, event, notice):
    assert notice_from(preempted, event) == notice


def _job_running(worker) -> None:
    wait_until(lambda: "ready" in (worker.home / "tpuq/attempt/output.log").read_text(errors="replace")
               if (worker.home / "tpuq/attempt/output.log").exists() else False, 10, "the job to start")


# The job saves on SIGTERM: it writes when it got the signal, then exits 0, as a checkpointing job does.
CHECKPOINT_ON_TERM = ("trap 'python3 -c \"import time; print(time.time())\" > term-at; echo saved; exit 0' TERM; "
                      "echo ready; while :; do sleep 0.05; done")


@pytest.mark.parametrize("path, value, notice", [
    (PREEMPTED_PATH, "TRUE", "preempted"),
    (MAINTENANCE_PATH, "TERMINATE_ON_HOST_MAINTENANCE", "host maintenance (TERMINATE_ON_HOST_MAINTENANCE)"),
], ids=["preempted", "maintenance"])
def test_the_notice_reaches_the_running_job_as_sigterm_at_once(worker, metadata, bucket, path, value, notice):
    a = make_assignment(command=CHECKPOINT_ON_TERM, bucket=bucket)
    worker.start(a)
    _job_running(worker)
    time.sleep(1.5)  # the supervisor has asked the metadata server at least once by now, and the job runs on
    assert worker.status_object(bucket, a) is None and metadata.requests >= 1

    metadata.values[path] = value
    noticed_at = time.time()
    term_file = worker.home / "tpuq/job/term-at"
    wait_until(lambda: term_file.exists() and term_file.read_text().strip(), 10, "the job's SIGTERM")
    assert float(term_file.read_text()) - noticed_at < 2.0
    status = worker.wait_status(bucket, a)
    assert (status["preempted"], status["preemption_notice"], status["cancelled"]) == (True, notice, False)
    assert status["exit_code"] == 0 and "saved" in status["tail"]


def test_a_job_that_ignores_the_notice_is_killed_after_the_preemption_grace(worker, metadata, bucket):
    a = make_assignment(command="trap '' TERM; echo ready; sleep 300", bucket=bucket)
    worker.start(a)
    _job_running(worker)
    metadata.values[PREEMPTED_PATH] = "TRUE"
    started = time.monotonic()
    status = worker.wait_status(bucket, a)
    assert (status["signal"], status["preempted"]) == ("SIGKILL", True)
    assert time.monotonic() - started < 8


def test_sigterm_from_the_shutting_down_vm_is_a_preemption_not_a_cancel(worker, metadata, bucket):
    """A preempted VM's shutdown sends every process SIGTERM, the supervisor too, with no cancel request."""
    a = make_assignment(command=CHECKPOINT_ON_TERM, bucket=bucket)
    launched = worker.start(a)
    _job_running(worker)
    metadata.values[PREEMPTED_PATH] = "TRUE"
    os.kill(launched["state"]["supervisor_pid"], signal.SIGTERM)
    status = worker.wait_status(bucket, a)
    assert (status["cancelled"], status["preempted"], status["exit_code"]) == (False, True, 0)


def test_max_duration_stops_the_job_term_then_kill(worker, bucket):
    a = make_assignment(command="trap 'echo got-term' TERM; echo ready; while :; do sleep 0.05; done",
                        bucket=bucket, max_duration=1)
    started = time.monotonic()
    worker.start(a)
    status = worker.wait_status(bucket, a)
    assert (status["timed_out"], status["max_duration_seconds"], status["preempted"]) == (True, 1, False)
    assert status["signal"] == "SIGKILL" and "got-term" in status["tail"]  # TERM first, KILL after the grace
    assert time.monotonic() - started < 10


def test_a_job_that_ends_in_time_is_not_timed_out(worker, bucket):
    a = make_assignment(command="echo done", bucket=bucket, max_duration="1h")
    worker.start(a)
    status = worker.wait_status(bucket, a)
    assert (status["exit_code"], status["timed_out"], status["preempted"]) == (0, False, False)


@pytest.mark.parametrize("attempt, preemptions, resuming, expected", [
    (1, 0, False, {"TPUQ_ATTEMPT": "1", "TPUQ_PREEMPTIONS": "0"}),
    (3, 2, True, {"TPUQ_ATTEMPT": "3", "TPUQ_PREEMPTIONS": "2", "TPUQ_RESUMING": "1"}),
])
def test_the_command_sees_where_its_attempt_stands(worker, bucket, attempt, preemptions, resuming, expected):
    a = make_assignment(attempt=attempt, preemptions=preemptions, resuming=resuming, command="env > env.txt",
                        bucket=bucket)
    worker.start(a)
    assert worker.wait_status(bucket, a)["exit_code"] == 0
    lines = (worker.home / "tpuq/job/env.txt").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines if line.startswith("TPUQ_") and "=" in line)
    assert env == expected | {"TPUQ_ATTEMPT_ID": a.attempt_id}


SLOW_SAVER = ('python3 -c "import signal, sys, time\n'
              'def save(*_):\n'
              '    signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1.5); open(\'saved\', \'w\').write(\'ok\')\n'
              '    sys.exit(0)\n'
              'signal.signal(signal.SIGTERM, save); print(\'ready\', flush=True)\n'
              'while True: time.sleep(0.05)"; echo "the shell, not exec\'d into python"')


def test_a_save_under_a_shell_keeps_the_grace_after_the_shell_is_gone(worker, metadata, bucket):
    """`sh -c "python3 train.py; ..."`: the shell (the group's leader) dies at the TERM; the python it started,
    still saving, keeps the rest of the grace instead of being TERM'd and KILLed half a second later."""
    worker.settings = dataclasses.replace(worker.settings, preemption_grace_seconds=10.0)
    a = make_assignment(command=SLOW_SAVER, bucket=bucket)
    worker.start(a)
    _job_running(worker)
    metadata.values[PREEMPTED_PATH] = "TRUE"
    status = worker.wait_status(bucket, a)
    assert (worker.home / "tpuq/job/saved").read_text() == "ok"
    assert (status["preempted"], status["signal"]) == (True, "SIGTERM")  # the shell's end
