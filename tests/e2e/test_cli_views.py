"""The CLI's views of a real run: status, list, logs (per worker, follow), watch's exit codes, fleet."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

from tpuq.contracts import store


def tpuq(system, *args, timeout=600):  # a bound for a hung command; a loaded machine is slow, not hung
    return subprocess.run(["tpuq", *args], env={**os.environ, **system.env}, capture_output=True, text=True,
                          timeout=timeout)


def test_status_list_logs_watch_fleet(system, system_clients):
    ok_id, bad_id = f"v-ok-{uuid.uuid4().hex[:6]}", f"v-bad-{uuid.uuid4().hex[:6]}"
    system_clients.publish("jobs", {"id": ok_id, "tpu": "v4-32",
                                    "command": "echo line-one; sleep 1; echo line-two from $TPU_WORKER_ID"})
    system_clients.publish("jobs", {"id": bad_id, "tpu": "v4-8", "command": "echo bad; exit 7"})

    watched = tpuq(system, "watch", ok_id, "--interval", "0.3")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert "succeeded" in watched.stdout and "exited" in watched.stdout
    assert tpuq(system, "watch", bad_id, "--interval", "0.3").returncode == 7  # the failed worker's exit code

    status = json.loads(tpuq(system, "status", ok_id, "--json").stdout)
    assert status["state"] == "succeeded" and status["attempt_history"][0]["outcome"] == "succeeded"
    human = tpuq(system, "status", bad_id).stdout
    assert "failed" in human and "exit" in human.lower()

    listed = tpuq(system, "list").stdout
    assert ok_id in listed and bad_id in listed

    logs = tpuq(system, "logs", ok_id).stdout.splitlines()
    for w in range(4):
        assert f"[w{w}] line-one" in logs and f"[w{w}] line-two from {w}" in logs
    only_2 = tpuq(system, "logs", ok_id, "--worker", "2").stdout.splitlines()
    assert only_2 and all(line.startswith("[w2] ") for line in only_2)
    followed = tpuq(system, "logs", ok_id, "-f")  # the job has ended: follow prints everything and stops
    assert followed.returncode == 0 and "[w3] line-two from 3" in followed.stdout

    fleet = json.loads(tpuq(system, "fleet", "--json").stdout)
    assert fleet["fleet"] == "demo" and not fleet["blocked"]
    # The job's TPU is listed unless it was already gone when the view was read: the janitor deletes an idle
    # TPU after the demo's short timeout, however slow the calls above were. `gone` is final, so a TPU the view
    # left out must read as gone now (read after the view).
    job = system_clients.firestore.collection(store.JOBS).document(ok_id).get().to_dict()
    short = job["tpu"].rsplit("/", 1)[-1]
    if short not in {t.get("short") for t in fleet["tpus"]}:
        tpu_now = system_clients.firestore.collection(store.TPUS).document(short).get().to_dict()
        assert tpu_now["state"] == "gone", (short, tpu_now, fleet["tpus"])

    unknown = tpuq(system, "status", "no-such-job")
    assert unknown.returncode == 1 and "no job 'no-such-job'" in unknown.stderr
