"""The live views as a person meets them (issue 16, items 1 and 2), on the e2e session's stack (the demo fleet:
v4-8 and a 4-host v4-32 in us-central2-a/b/c, zone b stocked out):

- `tpuq watch` on a 4-host job in a terminal (tmux): four worker rows while it runs, a failing worker's exit code,
  the job's exit status; the same watch piped prints one line per change;
- `tpuq submit --follow`: every worker's log lines, prefixed, and the job's exit status;
- a job that can only wait (pinned to the stocked-out zone): `submit --wait` says "pending" and why; Ctrl-C there
  (SIGINT) and in `tpuq watch` (tmux) says the job keeps running and how to watch it, exit 130.

The 4-host job waits at a gate the test opens (a file in /var/tmp, which the fake TPU's hosts share with this
machine), so "while it runs" never depends on how fast the machine is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from tests.helpers import Tmux, wait_until, worker_rows
from tpuq.contracts import store

DEADLINE = 300
BUCKET = "gs://tpuq-demo-us-central2"
GATES = Path("/var/tmp")  # the machine's own on every fake host (each has its own /tmp, homes, /dev, /proc)


def env_of(system) -> dict[str, str]:
    return {**os.environ, **system.env}


def tpuq(system, *args, timeout=DEADLINE):
    return subprocess.run(["tpuq", *args], env=env_of(system), capture_output=True, text=True, timeout=timeout)


def write_job(tmp_path: Path, name: str, **spec) -> tuple[str, Path]:
    job_id = f"{name}-{uuid.uuid4().hex[:6]}"
    folder = tmp_path / job_id
    folder.mkdir()
    (folder / "job.yaml").write_text(json.dumps({"jobs": [{"id": job_id, "bundle": ".", "buckets": [BUCKET],
                                                           **spec}]}))
    return job_id, folder / "job.yaml"


def job_state(system_clients, job_id) -> str | None:
    snap = system_clients.firestore.collection(store.JOBS).document(job_id).get()
    return (snap.to_dict() or {}).get("state") if snap.exists else None


@pytest.fixture
def tmux(system):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is missing: `make install-system` installs it (as root), or apt-get install tmux")
    t = Tmux(env_of(system))
    yield t
    t.kill()


def test_watch_a_4_host_job_in_a_terminal_and_piped(system, system_clients, tmp_path, tmux):
    gate = GATES / f"tpuq-live-gate-{uuid.uuid4().hex[:8]}"
    job_id, job_file = write_job(tmp_path, "live-pod", tpu="v4-32", command=(
        'echo "started $TPU_WORKER_ID"; i=0; '
        f'while [ ! -e {gate} ] && [ $i -lt 1800 ]; do i=$((i+1)); sleep 0.1; done; '
        'if [ "$TPU_WORKER_ID" = 2 ]; then echo "worker 2 gives up" >&2; exit 3; fi; echo "done $TPU_WORKER_ID"'))
    try:
        submitted = tpuq(system, "submit", str(job_file))
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        piped = subprocess.Popen(["tpuq", "watch", job_id, "--interval", "0.3"], env=env_of(system),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        piped_lines: list[str] = []  # read as printed: the gate opens only once the piped watch saw the job run
        reader = threading.Thread(target=lambda: piped_lines.extend(iter(piped.stdout.readline, "")), daemon=True)
        reader.start()
        tmux.type(f"tpuq watch {job_id} --interval 0.3; echo watch-exit=$?")

        # While it runs: one row per worker, each with its last log line.
        running = wait_until(lambda: (rows := worker_rows(tmux.screen())) and sorted(rows) == [0, 1, 2, 3]
                             and all(r[0] == "running" and f"started {w}" in " ".join(r) for w, r in rows.items())
                             and rows, timeout=DEADLINE, what="4 running worker rows in the watch view")
        assert job_state(system_clients, job_id) == "running", running
        screen = tmux.screen()
        assert job_id in screen and "v4-32" in screen and "4 workers" in screen

        wait_until(lambda: any("running on " in line for line in piped_lines), timeout=DEADLINE,
                   what="the piped watch to print the job running")
        gate.touch()
        final = wait_until(lambda: re.search(r"watch-exit=\d", s := tmux.screen()) and s, timeout=DEADLINE,
                           what="the watch to end")
        rows = worker_rows(final)
        assert rows[2][:2] == ["failed", "3"], final  # the failing worker's exit code
        assert all(rows[w][:2] == ["succeeded", "0"] for w in (0, 1, 3)), final
        assert "watch-exit=3" in final, final  # the job's exit status: its failing worker's code

        piped.wait(timeout=DEADLINE)
        reader.join(DEADLINE)
        out, errors = "".join(piped_lines), piped.stderr.read()
    finally:
        gate.unlink(missing_ok=True)
    assert piped.returncode == 3, out + errors
    lines = [line.split(f"{job_id}: ", 1)[1] for line in out.splitlines() if f"{job_id}: " in line]
    assert any(line.startswith("running on ") and "4 workers" in line for line in lines), out
    assert "worker 2: failed, exited 3; last line: worker 2 gives up" in lines, out
    assert lines[-1].startswith("failed"), out
    settled = [line for line in lines if not line.startswith("pending")]  # why it waits may change back and forth
    assert len(settled) == len(set(settled)), f"a state printed twice: {out}"  # one line per change


def test_watch_a_group_in_a_terminal_until_every_task_ended(system, system_clients, tmp_path, tmux):
    """`tpuq watch GROUP` (issue 36 §1) right after the submit: the group's counts by state and progress bar,
    redrawn while its tasks run, the failed task named, and exit 1 (one task failed) once every task ended."""
    gate = GATES / f"tpuq-live-gate-{uuid.uuid4().hex[:8]}"
    group, job_file = write_job(tmp_path, "live-arr", tpu="v4-8", array=3, command=(
        f'i=0; while [ ! -e {gate} ] && [ $i -lt 1800 ]; do i=$((i+1)); sleep 0.1; done; '
        'if [ "$TPUQ_ARRAY_INDEX" = 1 ]; then echo "task 1 gives up" >&2; exit 4; fi; echo ok'))
    try:
        submitted = tpuq(system, "submit", str(job_file))
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        tmux.type(f"tpuq watch {group} --interval 0.3; echo watch-exit=$?")
        running = wait_until(lambda: (s := tmux.screen()) and re.search(r"\b[1-3] running\b", s) and s,
                             timeout=DEADLINE, what="the group's running tasks in the watch view")
        assert f"group {group}: 3 tasks" in running and "0/3 ended" in running, running
        gate.touch()
        try:
            final = wait_until(lambda: re.search(r"watch-exit=\d", s := tmux.screen()) and s, timeout=DEADLINE,
                               what="the watch to end")
        except AssertionError:
            raise AssertionError(f"{tmux.screen()}\n{[job_state(system_clients, f'{group}-{i}') for i in range(3)]}")
    finally:
        gate.unlink(missing_ok=True)
    assert "[" + "#" * 30 + "] 3/3 ended" in final and "1 failed, 2 succeeded" in final, final
    assert f"failed: {group}-1" in final, final
    assert "watch-exit=1" in final, final
    assert [job_state(system_clients, f"{group}-{i}") for i in range(3)] == ["succeeded", "failed", "succeeded"]
    # A group's logs are its tasks': `tpuq logs GROUP` says so and names them (not "no job").
    logs = tpuq(system, "logs", group)
    assert logs.returncode == 1 and logs.stderr.strip() == (
        f"error: {group} is a group: its logs are its tasks' ({group}-0, {group}-1, {group}-2); "
        f"`tpuq logs {group}-0`"), logs.stderr


def test_submit_follow_prints_every_workers_logs_and_exits_with_the_jobs_status(system, tmp_path):
    # The job holds at a gate until --follow has said where it runs: on a fast machine a job this short used to
    # end between two of its reads, and the state line the test looks for never came.
    gate = GATES / f"tpuq-live-gate-{uuid.uuid4().hex[:8]}"
    job_id, job_file = write_job(tmp_path, "live-follow", tpu="v4-32", command=(
        'echo "hello from $TPU_WORKER_ID"; i=0; '
        f'while [ ! -e {gate} ] && [ $i -lt 1800 ]; do i=$((i+1)); sleep 0.1; done; '
        'echo "second line $TPU_WORKER_ID"; [ "$TPU_WORKER_ID" != 1 ] || exit 5'))
    following = subprocess.Popen(["tpuq", "submit", str(job_file), "--follow"], env=env_of(system),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    states: list[str] = []
    logs: list[str] = []
    readers = [threading.Thread(target=lambda: states.extend(iter(following.stderr.readline, "")), daemon=True),
               threading.Thread(target=lambda: logs.extend(iter(following.stdout.readline, "")), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        # The state lines go to stderr, as printed.
        wait_until(lambda: any(re.search(r"(assigned to|running on) \S+ \(", line) for line in states),
                   timeout=DEADLINE, what="--follow to say where the job runs")
        gate.touch()
        following.wait(timeout=DEADLINE + 60)
        for reader in readers:
            reader.join(30)
        out = "".join(logs)
    finally:
        gate.unlink(missing_ok=True)
        if following.poll() is None:
            following.kill()
    assert following.returncode == 5, out + "".join(states)
    lines = out.splitlines()
    for w in range(4):
        assert f"[w{w}] hello from {w}" in lines and f"[w{w}] second line {w}" in lines, out
    assert lines.index("[w0] hello from 0") < lines.index("[w0] second line 0")
    assert f"{job_id}: failed" in out


def test_a_waiting_job_says_pending_and_ctrl_c_leaves_it_running(system, system_clients, tmp_path, tmux):
    # Zone b of the demo is stocked out for good: a job pinned there can only wait.
    job_id, job_file = write_job(tmp_path, "live-wait", tpu="v4-8", zone="us-central2-b", command="echo never")
    # Ctrl-C as a terminal delivers it: a suite started in the background (`.ci/run &`) hands its children SIGINT
    # ignored, and Python then installs no KeyboardInterrupt for it (the process slept through the signal).
    waiting = subprocess.Popen(["tpuq", "submit", str(job_file), "--wait"], env=env_of(system),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    progress: list[str] = []

    def read_progress():
        for line in waiting.stderr:
            progress.append(line)

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    try:
        # stderr is a pipe: --wait prints its progress as lines.
        try:
            wait_until(lambda: any(f"{job_id}: pending" in line for line in progress), timeout=DEADLINE,
                       what="--wait to say the job is pending")
        except AssertionError as e:  # what it said instead, and whether the job was ever stored (seen once: neither)
            raise AssertionError(f"{e}; submit {'still running' if waiting.poll() is None else 'exited'}, said "
                                 f"{''.join(progress)!r}; job state {job_state(system_clients, job_id)!r}") from None
        assert job_state(system_clients, job_id) == "pending"
        waiting.send_signal(signal.SIGINT)  # Ctrl-C
        waiting.wait(timeout=60)
        reader.join(timeout=30)
        out = waiting.stdout.read()
        errors = "".join(progress)
        assert waiting.returncode == 130, out + errors
        assert "keeps running" in errors and f"tpuq watch {job_id}" in errors and f"tpuq cancel {job_id}" in errors
        assert job_state(system_clients, job_id) == "pending"

        tmux.type(f"tpuq watch {job_id}; echo watch-exit=$?")

        def says_why():
            s = tmux.screen()
            return s if "racing v4-8 in us-central2-b" in s or "v4-8 in us-central2-b backed off" in s else None

        screen = wait_until(says_why, timeout=DEADLINE, what="why the job waits, in the watch view")
        assert "pending" in screen and worker_rows(screen) == {0: ["pending"]}, screen
        tmux.keys("C-c")
        final = wait_until(lambda: re.search(r"watch-exit=\d", s := tmux.screen()) and s, timeout=DEADLINE, what="the watch to stop")
        assert "watch-exit=130" in final and "keeps running" in final and f"tpuq logs {job_id} -f" in final, final
        assert job_state(system_clients, job_id) == "pending"
    finally:
        if waiting.poll() is None:
            waiting.kill()
        tpuq(system, "cancel", job_id)
    wait_until(lambda: job_state(system_clients, job_id) == "cancelled", timeout=DEADLINE, what="the job cancelled")
