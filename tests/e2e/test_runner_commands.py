"""The commands a tpu-runner user types, driven as they type them against the whole local stack:
`validate-fleet`, `validate-jobs`, `set-priority`, `cancel --if-pending` and `cancel` with several ids, and
`status` without a job (the fleet overview). Witness: the job documents in Firestore."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import yaml
from google.cloud.firestore_v1.base_query import FieldFilter

from tpuq.contracts import store
from tpuq_dev.devstack.stack import DEMO_DIR
from tests.helpers import wait_until

DEADLINE = 300


def tpuq(system, *args):
    return subprocess.run(["tpuq", *args], env={**os.environ, **system.env}, capture_output=True, text=True,
                          timeout=DEADLINE + 60)


def job(clients, job_id):
    snap = clients.firestore.collection(store.JOBS).document(job_id).get()
    return (snap.to_dict() or {}) if snap.exists else {}


def wait_state(clients, job_id, *states):
    return wait_until(lambda: (j := job(clients, job_id)).get("state") in states and j, timeout=DEADLINE,
                      what=f"job {job_id} in {states}")


def test_validate_aliases(system, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({"jobs": [{"tpu": "v4-8", "command": "echo hi"}]}))
    fleet = tpuq(system, "validate-fleet", str(DEMO_DIR / "fleet.yaml"))
    assert fleet.returncode == 0 and "ok" in fleet.stdout and "fleet" in fleet.stdout, fleet.stderr
    jobs = tpuq(system, "validate-jobs", str(job_file))
    assert jobs.returncode == 0 and "ok: 1 job" in jobs.stdout, jobs.stderr
    wrong = tpuq(system, "validate-jobs", str(DEMO_DIR / "fleet.yaml"))  # a fleet is no job file
    assert wrong.returncode == 1 and "invalid job file" in wrong.stderr and "Traceback" not in wrong.stderr


def test_set_priority_cancel_if_pending_and_status_overview(system, system_clients):
    c = system_clients
    tag = uuid.uuid4().hex[:6]
    # Pending for good: they name a TPU that does not exist, so nothing is claimed for them.
    waiting = [f"r-wait{i}-{tag}" for i in range(3)]
    for job_id in waiting:
        c.publish("jobs", {"id": job_id, "tpu": "v4-8", "tpu_name": f"nowhere-{tag}", "priority": "low",
                           "command": "true"})
    running = f"r-run-{tag}"
    c.publish("jobs", {"id": running, "tpu": "v4-8", "command": "sleep 900"})
    for job_id in waiting:
        wait_state(c, job_id, "pending")
    wait_state(c, running, "running")

    # set-priority: the stored order changes at once, in every field the scheduler reads.
    done = tpuq(system, "set-priority", waiting[0], "high")
    assert done.returncode == 0, done.stderr
    stored = job(c, waiting[0])
    assert (stored["priority"], stored["priority_rank"], stored["spec"]["priority"]) == ("high", 2, "high")
    # The scheduler's order, among this test's jobs (an earlier test on this stack may leave others pending).
    ordered = (c.firestore.collection(store.JOBS).where(filter=FieldFilter("state", "==", "pending"))
               .order_by("priority_rank", direction="DESCENDING").order_by("submit_time").stream())
    assert [d.id for d in ordered if d.id in waiting][0] == waiting[0]
    again = tpuq(system, "set-priority", waiting[0], "high")
    assert again.returncode == 0 and "already" in again.stdout
    refused = tpuq(system, "set-priority", running, "high")
    assert refused.returncode == 2 and "running" in refused.stderr and "only a pending job" in refused.stderr
    assert job(c, running)["priority"] == "normal"
    assert tpuq(system, "set-priority", f"nope-{tag}", "low").returncode == 1
    bad = tpuq(system, "set-priority", waiting[0], "urgent")
    assert bad.returncode == 1 and "priority" in bad.stderr and "Traceback" not in bad.stderr

    # cancel --if-pending: the pending one is cancelled, the running one is skipped and keeps running.
    cancelled = tpuq(system, "cancel", "--if-pending", waiting[0], running)
    assert cancelled.returncode == 2, cancelled.stdout + cancelled.stderr
    assert f"cancelled {waiting[0]}" in cancelled.stdout and f"skipped {running}" in cancelled.stdout
    assert job(c, waiting[0])["state"] == "cancelled"
    assert job(c, running)["state"] == "running"

    # status without a job: the fleet overview.
    overview = json.loads(tpuq(system, "status", "--json").stdout)
    demo = next(f for f in overview["fleets"] if f["fleet"] == "demo")
    assert demo["entries"] and all({"id", "type", "zones", "count"} <= set(e) for e in demo["entries"])
    assert demo["tpus"].get("busy", 0) >= 1
    assert overview["jobs"]["cancelled"] >= 1 and overview["jobs"]["pending"] >= 2
    assert overview["jobs"]["running"] + overview["jobs"]["assigned"] >= 1
    human = tpuq(system, "status", "--deployment", "deployment.yaml")
    assert human.returncode == 0 and "fleet demo" in human.stdout and "TPUs:" in human.stdout, human.stderr
    assert "jobs:" in human.stdout and "pending" in human.stdout

    # cancel with several ids: the pending ones at once, the running one stopped; unknown ids exit 1.
    several = tpuq(system, "cancel", waiting[1], waiting[2], running, f"nope-{tag}")
    assert several.returncode == 1 and f"no job 'nope-{tag}'" in several.stderr
    for job_id in (waiting[1], waiting[2], running):
        wait_state(c, job_id, "cancelled")
