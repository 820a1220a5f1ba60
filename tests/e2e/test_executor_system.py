"""The executor on the whole local stack (issue 6): real push, real sshd workers of the fake TPU, real GCS."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tpuq.contracts import gcslayout, store
from tpuq.executor.budget import CLEANUP_SECONDS
from tpuq.executor.outcome import DEFAULT_FAILURE_GRACE
from tpuq.executor.worker import control as worker_control
from tpuq.executor.workerspec import WorkerSettings
from tpuq.runtime.settings import Settings
from tpuq_dev.devstack.stack import wait_for
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq.operations.queries import worker_log_chunks
from tests.e2e.conftest import demo_stack_with

DEADLINE = 300


def job(clients, job_id):
    snap = clients.firestore.collection(store.JOBS).document(job_id).get()
    return snap.to_dict() if snap.exists else {}


def wait_state(clients, job_id, states, timeout=DEADLINE):
    return wait_for(lambda: (j := job(clients, job_id)).get("state") in states and j, timeout=timeout,
                    what=f"{job_id} in {states}")


def publish(clients, **spec):
    job_id = spec.setdefault("id", f"x-{uuid.uuid4().hex[:8]}")
    clients.publish("jobs", spec)
    return job_id


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def logs_text(clients, j):
    return "".join(c.text for c in worker_log_chunks(clients.storage, j))


def test_logs_reach_gcs_while_the_job_runs(system_clients):
    job_id = publish(system_clients, tpu="v4-8",
                     command='echo first; i=0; while [ ! -e "$JOB_DIR/../stop" ] && [ $i -lt 1200 ]; do i=$((i+1)); sleep 0.5; done')
    running = wait_state(system_clients, job_id, ("running",))
    wait_for(lambda: "first" in logs_text(system_clients, job(system_clients, job_id)), timeout=DEADLINE,
             what="the first log line in GCS while running")
    assert job(system_clients, job_id)["state"] == "running"
    system_clients.publish("cancels", {"job_id": job_id})
    wait_state(system_clients, job_id, ("cancelled",))
    assert running["tpu"]


def test_exit_3_fails_with_the_log_tail(system_clients):
    job_id = publish(system_clients, tpu="v4-8", command="echo about to fail; echo oops >&2; exit 3")
    j = wait_state(system_clients, job_id, ("failed", "succeeded"))
    assert j["state"] == "failed"
    assert "oops" in j["reason"] and "3" in j["reason"]


def _host_commands(control, node):
    info = control.node_info(node)
    out = {}
    for host in info["hosts"]:
        cmds = []
        for pid in host.get("pids", []):
            try:
                cmds.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                pass
        out[host["worker"]] = cmds
    return out


def test_cancel_running_4_host_job_leaves_no_process(system, system_clients):
    marker = f"tpuq-cancel-me-{uuid.uuid4().hex[:6]}"
    job_id = publish(system_clients, tpu="v4-32", command=f"sh -c 'sleep 300; echo {marker}' & wait")
    j = wait_state(system_clients, job_id, ("running",))
    control = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"])
    wait_for(lambda: all(any("sleep 300" in c for c in cmds) for cmds in _host_commands(control, j["tpu"]).values())
             and len(_host_commands(control, j["tpu"])) == 4, timeout=DEADLINE, what="the job on all 4 hosts")
    r = subprocess.run(["tpuq", "cancel", job_id], env={**os.environ, **system.env}, capture_output=True, text=True,
                       timeout=DEADLINE)
    assert r.returncode == 0, r.stderr
    wait_state(system_clients, job_id, ("cancelled",))

    def leftovers():
        return {w: [c for c in cmds if "sleep 300" in c or marker in c]
                for w, cmds in _host_commands(control, j["tpu"]).items()}

    # TERM first, KILL after the grace: poll until every host is clean.
    wait_for(lambda: leftovers() == {0: [], 1: [], 2: [], 3: []}, timeout=DEADLINE, what="no process of the job on any host")


def test_a_worker_that_died_does_not_leave_the_others_running_on_the_slice(system, system_clients):
    """Issue 35 §3: worker 2 dies; the other three would wait in a collective for ever. After the failure grace the
    attempt ends failed and their processes are stopped on every host, so the slice is free for the next job."""
    marker = f"tpuq-collective-{uuid.uuid4().hex[:6]}"
    job_id = publish(system_clients, tpu="v4-32", command=(
        f'if [ "$TPU_WORKER_ID" = 2 ]; then echo "worker 2 dies" >&2; exit 1; fi; exec sleep 600 # {marker}'))
    j = wait_state(system_clients, job_id, ("running",))
    control = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"])
    done = wait_state(system_clients, job_id, ("failed", "succeeded", "cancelled"))
    assert done["state"] == "failed" and "worker 2 exited 1" in done["reason"], done.get("reason")
    assert "no status yet from worker 0, 1, 3" in done["reason"], done["reason"]
    ended = time.monotonic()
    wait_for(lambda: not any("sleep 600" in c for cmds in _host_commands(control, j["tpu"]).values() for c in cmds),
             timeout=DEADLINE, what="the other workers' processes stopped")
    stopped_after = time.monotonic() - ended
    bucket = system_clients.storage.bucket(system_clients.settings.runner_bucket)
    died = json.loads(bucket.blob(gcslayout.worker_status_name(job_id, 1, 2)).download_as_bytes())["ended_at"]
    gone_after_death = (datetime.now(timezone.utc) - _utc(died)).total_seconds()
    # The bound, from worker 2's end: the others are waited for the executor's failure grace; the decision deferred
    # to then is taken at the next tick (tickstate.judge_due, a tick every `tick_period` here); the stop sends TERM
    # at once and KILL after the cancel grace (`sleep` dies on TERM: the grace is the allowance for the SSH calls).
    grace = Settings.from_env(system.service_env).executor_failure_grace  # the stack's executor's (tests/e2e/conftest.py)
    assert grace < DEFAULT_FAILURE_GRACE, "the stack's grace is its own setting, not the default"
    bound = grace.total_seconds() + system.tick_period + WorkerSettings().cancel_grace_seconds
    assert gone_after_death <= bound, f"the others ran {gone_after_death:.1f} s after worker 2 died (bound {bound} s)"
    assert gone_after_death >= grace.total_seconds(), f"stopped {gone_after_death:.1f} s after, within the grace"
    tpu = system_clients.firestore.collection(store.TPUS).document(j["tpu"].rsplit("/", 1)[-1]).get().to_dict()
    assert tpu.get("job_id") != job_id, tpu  # free: idle, deleted, or already another pending job's
    # Stopped by the executor, not by the slice's deletion at its idle timeout: each of the three supervisors
    # recorded the stop in its status object.

    def stop_recorded(worker: int) -> str | None:
        blob = bucket.blob(gcslayout.worker_status_name(job_id, 1, worker))
        return blob.exists() and json.loads(blob.download_as_bytes()).get("cancel_reason")

    reasons = wait_for(lambda: all(r := [stop_recorded(w) for w in (0, 1, 3)]) and r, timeout=DEADLINE,
                       what="the stop in the other workers' status objects")
    assert all(r.startswith("stopped: worker 2 exited 1") for r in reasons), reasons
    print(f"the other workers stopped {stopped_after:.1f} s after the attempt ended, {gone_after_death:.1f} s after "
          f"worker 2 died (bound {bound:.0f} s)")


def test_executor_restart_mid_job_completes_once(system, system_clients):
    job_id = publish(system_clients, tpu="v4-8", command="sleep 3; echo finished")
    wait_state(system_clients, job_id, ("running",))
    system.restart_service("executor")  # SIGKILL, like a crash, then a new process on the same port
    j = wait_state(system_clients, job_id, ("succeeded", "failed"))
    assert j["state"] == "succeeded"
    attempts = list(system_clients.firestore.collection(store.JOBS).document(job_id)
                    .collection(store.ATTEMPTS).stream())
    assert len(attempts) == 1 and attempts[0].to_dict()["outcome"] == "succeeded"
    # The executor publishes the attempt's end, then records it in executions/: the job can succeed before that write.
    execution = wait_for(lambda: (e := system_clients.firestore.collection(store.EXECUTIONS).document(f"{job_id}:1")
                                  .get().to_dict() or {}).get("ended") and e, timeout=DEADLINE,
                         what="the attempt's end recorded in executions/")
    assert execution["ended"] and execution["outcome"] == "succeeded"


def test_cache_kept_for_same_key_on_same_tpu(system_clients):
    first = publish(system_clients, tpu="v4-8", caches=[{"key": "pip", "path": ".cache/pip"}],
                    command="echo cached > .cache/pip/wheel; echo workspace > leftover")
    j1 = wait_state(system_clients, first, ("succeeded", "failed"))
    assert j1["state"] == "succeeded"
    tpu_name = j1["tpu"].rsplit("/", 1)[-1]
    same = publish(system_clients, tpu="v4-8", tpu_name=tpu_name, caches=[{"key": "pip", "path": ".cache/pip"}],
                   command="cat .cache/pip/wheel; test ! -e leftover && echo clean-workspace")
    j2 = wait_state(system_clients, same, ("succeeded", "failed"))
    assert j2["state"] == "succeeded"
    assert "cached" in logs_text(system_clients, j2) and "clean-workspace" in logs_text(system_clients, j2)
    # Only after: a job with another key on that TPU discards the pip cache (and must not find it).
    other = publish(system_clients, tpu="v4-8", tpu_name=tpu_name, caches=[{"key": "conda", "path": ".cache/pip"}],
                    command="test ! -e .cache/pip/wheel && echo no-cache")
    j3 = wait_state(system_clients, other, ("succeeded", "failed"))
    assert j3["state"] == "succeeded" and "no-cache" in logs_text(system_clients, j3)


def test_supervisor_killed_without_a_status_is_noticed_as_lost(system, system_clients):
    job_id = publish(system_clients, tpu="v4-8", command="sleep 300")
    j = wait_state(system_clients, job_id, ("running",))
    control = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"])
    # Like the OOM killer or a host restart: the supervisor and the job die, and no status object is written.
    [host] = control.node_info(j["tpu"])["hosts"]
    for pid in host["pids"]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"sleep" in cmdline or b"supervisor" in cmdline or b"BOOTSTRAP" in cmdline or b"tpuq" in cmdline:
            if b"sshd" not in cmdline:
                os.kill(pid, 9)
    # The executor's tick asks the worker, finds the attempt gone, and ends it as preempted (retryable).
    wait_for(lambda: (system_clients.firestore.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS)
                      .document("1").get().to_dict() or {}).get("outcome") == "preempted",
             timeout=DEADLINE, what="the lost attempt ended as preempted")
    system_clients.publish("cancels", {"job_id": job_id})
    wait_state(system_clients, job_id, ("cancelled", "succeeded", "failed"))


def test_max_duration_ends_the_attempt_failed_and_timed_out(system_clients):
    job_id = publish(system_clients, tpu="v4-8", command="echo started; sleep 300", max_duration="3s")
    j = wait_state(system_clients, job_id, ("succeeded", "failed", "cancelled"))
    assert j["state"] == "failed" and j["reason"].startswith("timed out after 3s"), j.get("reason")
    assert j["attempts"] == 1  # terminal: not retried


def test_train_py_saves_on_the_preemption_notice_and_resumes_from_that_step(system, system_clients, tmp_path):
    """examples/train.py on a fake worker: the notice reaches it as SIGTERM while it runs, it saves its step to
    CHECKPOINT_GCS_DIR in fake GCS, and the retry on a new slice resumes from that step."""
    project = tmp_path / "proj"
    project.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "train.py", project / "train.py")
    job_id = f"train-{uuid.uuid4().hex[:8]}"
    (project / "job.yaml").write_text(json.dumps({"jobs": [{
        "id": job_id, "tpu": "v4-8", "bundle": ".", "buckets": ["gs://tpuq-demo-us-central2"],
        "command": "python3 train.py --steps 400 --step-seconds 0.2 --checkpoint-every 100"}]}))
    env = {**os.environ, **system.env}
    subprocess.run(["tpuq", "submit", str(project / "job.yaml")], env=env, check=True, capture_output=True,
                   timeout=120)
    wait_state(system_clients, job_id, ("running",))
    first = wait_for(lambda: re.search(r"^step [3-9] ", logs_text(system_clients, j := job(system_clients, job_id)),
                                       re.M) and j, timeout=DEADLINE, what="train.py's first steps")
    FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"]).preempt(first["tpu"], notice=20)
    saved = wait_for(lambda: re.search(r"stopped by SIGTERM at step (\d+)", logs_text(system_clients, first)),
                     timeout=60, what="train.py's save on SIGTERM")
    step = int(saved.group(1))
    # Its log reaches GCS in pieces: wait for the step after the resume, not only the resume's line.
    second = wait_for(lambda: (j := job(system_clients, job_id)).get("attempt") == 2
                      and "resuming from" in (t := logs_text(system_clients, j)) and f"step {step + 1} " in t and j,
                      timeout=DEADLINE, what="the second attempt's resume and its next step")
    text = logs_text(system_clients, second)
    assert f"resuming from step {step}" in text and f"step {step + 1} " in text, text
    assert "attempt 2, preemptions so far 1" in text  # TPUQ_ATTEMPT, TPUQ_PREEMPTIONS from the job document
    attempt = (system_clients.firestore.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS)
               .document("1").get().to_dict())
    assert attempt["outcome"] == "preempted", attempt
    system_clients.publish("cancels", {"job_id": job_id})
    wait_state(system_clients, job_id, ("cancelled", "succeeded", "failed"))


# -- a partial start: one worker of a 4-host slice never starts its command (issue 35 §3) --------------------------

PIDS_CGROUPS = Path("/sys/fs/cgroup/pids")
# Processes one command adds on a fake host whose SSH connection the executor kept: the shell sshd forks for the
# exec channel, and the supervisor's Python under it. `prepare` needs 2; `launch` then forks the detached supervisor
# (3), which forks the job's shell (4).
LAUNCH_FORK_FAILS = 2  # the host's fork fails in `launch`: the executor's "another worker failed to launch" path
COMMAND_FORK_FAILS = 3  # the fork fails in the supervisor: a status "cannot start the command", phase setup


@pytest.fixture(scope="module")
def idle_slice_stack(tmp_path_factory):
    """The demo fleet's one v4-32 in one zone, kept 10 minutes idle: a test finds the slice its first job left and
    makes one of its hosts unfit before the next job starts there."""
    with demo_stack_with(tmp_path_factory.mktemp("partial-start"), "v4-32", count=1, zones=["us-central2-a"],
                         idle_timeout_seconds=600) as (stack, clients):
        yield stack, clients


@contextmanager
def fork_limited(pids: list[int], headroom: int):
    """Put a fake host's processes in a pids cgroup that lets them fork `headroom` more: past it fork() fails with
    EAGAIN, as on a host out of process slots (a leaked process storm, a pid limit)."""
    group = PIDS_CGROUPS / f"tpuq-e2e-{uuid.uuid4().hex[:6]}"
    try:
        group.mkdir()
    except OSError as e:
        pytest.skip(f"no pids cgroup to limit a fake host with: {e}")
    try:
        for pid in pids:
            try:
                (group / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass  # gone meanwhile
        (group / "pids.max").write_text(str(int((group / "pids.current").read_text()) + headroom))
        yield group
    finally:
        # A process of the host may fork into the group while its members are moved out (the cgroup is then not
        # empty, EBUSY): move them out again until it is, with a deadline.
        deadline = time.monotonic() + 30
        while True:
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    (PIDS_CGROUPS / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def _status(clients, job_id: str, worker: int) -> dict | None:
    blob = clients.storage.bucket(clients.settings.runner_bucket).blob(gcslayout.worker_status_name(job_id, 1, worker))
    return json.loads(blob.download_as_bytes()) if blob.exists() else None


@pytest.mark.parametrize("headroom", [LAUNCH_FORK_FAILS, COMMAND_FORK_FAILS], ids=["launch-fails", "command-fails"])
def test_a_worker_that_never_starts_does_not_leave_the_others_running(idle_slice_stack, headroom):
    """Worker 3's host cannot fork when the job is launched; workers 0-2 start theirs. The attempt is decided naming
    worker 3, the other workers' processes are stopped within the bound, and the slice is free (idle, or deleted)."""
    system, clients = idle_slice_stack
    control = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"])
    first = publish(clients, tpu="v4-32", command="true")
    node = wait_state(clients, first, ("succeeded",))["tpu"]
    wait_for(lambda: (clients.firestore.collection(store.TPUS).document(node.rsplit("/", 1)[-1]).get().to_dict()
                      or {}).get("state") == "idle", timeout=DEADLINE, what="the slice idle")
    [host3] = [h for h in control.node_info(node)["hosts"] if h["worker"] == 3]
    marker = f"tpuq-partial-{uuid.uuid4().hex[:6]}"
    with fork_limited(host3["pids"], headroom):
        # Not pinned to the slice: the fleet's only v4-32, idle, takes it; a retry goes to a fresh one.
        job_id = publish(clients, tpu="v4-32",
                         command=f'if [ "$TPUQ_ATTEMPT" = 1 ]; then exec sleep 600; fi; echo "ran {marker}"')
        ref = clients.firestore.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS).document("1")
        attempt = wait_for(lambda: (a := ref.get().to_dict() or {}).get("outcome") and a, timeout=DEADLINE,
                           what="attempt 1 decided")
        decided = time.monotonic()
        print(f"attempt 1: {attempt['outcome']}: {attempt.get('detail')}")
        if headroom == LAUNCH_FORK_FAILS:
            assert attempt["outcome"] == "infra_failed", attempt
            assert attempt["detail"].startswith("could not launch worker 3: "), attempt["detail"]
            stop_reason = "stopped: another worker failed to launch"
            # The others were started; the start stopped them before it returned: once worker 3's launch failed
            # (at the latest when its supervisor had not started the job within launch's wait), within the time
            # the executor keeps for that cleanup.
            bound = inspect.signature(worker_control.launch).parameters["wait_seconds"].default + CLEANUP_SECONDS
        else:
            assert attempt["outcome"] == "failed_setup", attempt
            assert attempt["detail"].startswith("setup failed: worker 3: cannot start the command"), attempt["detail"]
            stop_reason = "stopped: setup failed: worker 3"
            # Decided on worker 3's status event, then stopped: TERM at once, KILL after the cancel grace; at the
            # latest at the next tick if the event were late.
            bound = system.tick_period + WorkerSettings().cancel_grace_seconds
        assert "Resource temporarily unavailable" in attempt["detail"], attempt["detail"]

        def others_left() -> list[str]:
            try:
                hosts = _host_commands(control, node)
            except Exception:  # noqa: BLE001 - the quarantined slice was deleted meanwhile: nothing runs there
                return []
            return [c for w, cmds in hosts.items() if w != 3 for c in cmds if "sleep 600" in c]

        wait_for(lambda: not others_left(), timeout=bound, what="the other workers' processes gone")
        print(f"the others' processes gone {time.monotonic() - decided:.1f} s after the attempt was decided")
        # Stopped by the executor, not by a deletion of the slice: each of them recorded why, and ran within the bound.
        stopped = wait_for(lambda: all(s := [_status(clients, job_id, w) for w in (0, 1, 2)]) and s,
                           timeout=DEADLINE, what="the other workers' status objects")
        ran = [(_utc(s["ended_at"]) - _utc(s["started_at"])).total_seconds() for s in stopped]
        print(f"workers 0, 1, 2 ran {', '.join(f'{r:.1f}' for r in ran)} s (bound {bound:.0f} s)")
        assert all(s["cancel_reason"].startswith(stop_reason) for s in stopped), [s["cancel_reason"] for s in stopped]
        assert max(ran) <= bound, (ran, bound)
    tpu_doc = clients.firestore.collection(store.TPUS).document(node.rsplit("/", 1)[-1])
    wait_for(lambda: (t := tpu_doc.get().to_dict() or {}).get("state") in ("idle", "deleting", "gone")
             and not t.get("job_id"), timeout=DEADLINE, what="the slice free: idle, or deleted")
    if headroom == LAUNCH_FORK_FAILS:  # an infrastructure failure: the job runs again, on a fresh slice
        assert wait_state(clients, job_id, ("succeeded", "failed"))["state"] == "succeeded"
        assert marker in logs_text(clients, job(clients, job_id))
