"""The executor on the whole local stack (issue 6): real push, real sshd workers of the fake TPU, real GCS."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from tpuq.contracts import gcslayout, store
from tpuq_dev.devstack.stack import wait_for
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq.operations.queries import worker_log_chunks

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
    tpu = system_clients.firestore.collection(store.TPUS).document(j["tpu"].rsplit("/", 1)[-1]).get().to_dict()
    assert tpu["state"] in ("idle", "deleting", "gone") and tpu.get("job_id") in (None, ""), tpu
    # Stopped by the executor, not by the slice's deletion at its idle timeout: each of the three supervisors
    # recorded the stop in its status object.
    bucket = system_clients.storage.bucket(system_clients.settings.runner_bucket)

    def stop_recorded(worker: int) -> str | None:
        blob = bucket.blob(gcslayout.worker_status_name(job_id, 1, worker))
        return blob.exists() and json.loads(blob.download_as_bytes()).get("cancel_reason")

    reasons = wait_for(lambda: all(r := [stop_recorded(w) for w in (0, 1, 3)]) and r, timeout=DEADLINE,
                       what="the stop in the other workers' status objects")
    assert all(r.startswith("stopped: worker 2 exited 1") for r in reasons), reasons
    print(f"the other workers stopped {stopped_after:.1f} s after the attempt ended")


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
    second = wait_for(lambda: (j := job(system_clients, job_id)).get("attempt") == 2
                      and "resuming from" in logs_text(system_clients, j) and j, timeout=DEADLINE,
                      what="the second attempt's resume")
    text = logs_text(system_clients, second)
    assert f"resuming from step {step}" in text and f"step {step + 1} " in text, text
    assert "attempt 2, preemptions so far 1" in text  # TPUQ_ATTEMPT, TPUQ_PREEMPTIONS from the job document
    attempt = (system_clients.firestore.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS)
               .document("1").get().to_dict())
    assert attempt["outcome"] == "preempted", attempt
    system_clients.publish("cancels", {"job_id": job_id})
    wait_state(system_clients, job_id, ("cancelled", "succeeded", "failed"))
