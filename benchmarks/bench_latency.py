"""End-to-end latencies on the local stack (issue 8), one JSON line each:

- publish on `jobs` → the command running on an idle ACTIVE 1-host TPU (p50, p95 over N jobs);
- a spot preemption → the job's command running again on another idle TPU;
- the race winner going ACTIVE → the losing queued resources deleted.

"Running" is the time the command itself prints (`date +%s.%N` on the worker), read back from the
job's log in GCS, so log flushing does not count. Where the time goes, per job (medians in `stages_p50_s`), from
the front's delivery log: publish → the scheduler's push (the publish RPC, the emulator's push, the front), →
the executor's push (the scheduler's intake and pass, its publish, the second push), → running (the executor's
Firestore record, its SSH exec, the worker's supervisor and the command's shell). The stack is the real one: emulators, fake GCS,
the fake Cloud TPU with sshd workers, the four services receiving Pub/Sub push.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path


from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq_dev.devstack.stack import wait_for
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq.operations.queries import worker_log_chunks

from bench_simulate import machine_reference_seconds
from stackbench import whole_stack

SCENARIO = {
    "seed": 1,
    "zones": {
        "us-central2-a": {"quota": {"v4": {"spot": 256}}},
        "us-central2-b": {"quota": {"v4": {"spot": 256}}, "stockouts": [{"family": "v4", "start": 0, "effect": "fail"}]},
        # Zone c queues forever: its request is a race loser that is still WAITING when a wins.
        "us-central2-c": {"quota": {"v4": {"spot": 256}}, "stockouts": [{"family": "v4", "start": 0, "effect": "wait"}]},
    },
    "delays": {"accepted": 1, "waiting": 5, "provisioning": 60, "suspending": 10, "deleting": 5},
}
FLEET = {
    "name": "bench", "project": "tpuq-local", "idle_timeout_seconds": 3600,
    "retry": {"preemptions": 5, "backoff_base_seconds": 0.0, "backoff_max_seconds": 0.0},
    "claim": {"watch_interval_seconds": 0.5},
    "tpus": [{"id": "v4-single", "type": "v4-8", "zones": ["us-central2-a", "us-central2-b", "us-central2-c"],
              "count": 20}],
}
SCALE = 60.0
STAMP = 'echo "RUNNING_AT=$(date +%s.%N)"'


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def job(clients: Clients, job_id: str) -> dict:
    snap = clients.firestore.collection(store.JOBS).document(job_id).get()
    return snap.to_dict() if snap.exists else {}


def running_at(clients: Clients, job_id: str, attempt: int | None = None) -> float:
    def stamp():
        j = job(clients, job_id)
        if not j.get("state"):
            return None  # not stored yet
        for chunk in worker_log_chunks(clients.storage, j, attempt):
            for line in chunk.text.splitlines():
                if line.startswith("RUNNING_AT="):
                    return float(line.split("=", 1)[1])
        return None

    return wait_for(stamp, timeout=60, interval=0.1, what=f"{job_id} to log its start")


def stages(deliveries: Path, jobs: list[tuple[float, float]]) -> dict[str, float]:
    """Median seconds of each stage of publish → running, from the front's delivery log: for each job (published
    at t0, running at t1, one at a time), the first push to the scheduler's `jobs` subscription and the first to the
    executor's `assignments` subscription between the two."""
    pushes = [json.loads(line) for line in deliveries.read_text().splitlines() if line.strip()]
    parts: dict[str, list[float]] = {"publish_to_scheduler_push": [], "scheduler_push_to_executor_push": [],
                                     "executor_push_to_running": []}
    for t0, t1 in jobs:
        within = [p for p in pushes if t0 <= p["at"] <= t1]
        to_scheduler = next((p["at"] for p in within if p["subscription"].endswith("/scheduler-jobs")), None)
        to_executor = next((p["at"] for p in within if p["subscription"].endswith("/executor-assignments")), None)
        if to_scheduler is None or to_executor is None:
            continue
        parts["publish_to_scheduler_push"].append(to_scheduler - t0)
        parts["scheduler_push_to_executor_push"].append(to_executor - to_scheduler)
        parts["executor_push_to_running"].append(t1 - to_executor)
    return {k: round(statistics.median(v), 3) for k, v in parts.items() if v}


def submit(clients: Clients, job_id: str, command: str) -> float:
    t = time.time()
    clients.publish("jobs", {"id": job_id, "tpu": "v4-8", "command": command})
    return t


def wait_state(clients, job_id, states, timeout=120):
    return wait_for(lambda: job(clients, job_id).get("state") in states, timeout=timeout, interval=0.05,
                    what=f"{job_id} in {states}")


def idle_tpus(clients) -> list[dict]:
    return [d.to_dict() for d in clients.firestore.collection(store.TPUS).stream() if d.to_dict().get("state") == "idle"]


def main(n_jobs: int = 50, n_preemptions: int = 5) -> None:
    with whole_stack(SCENARIO, FLEET, SCALE, prefix="bench-latency") as (stack, env):
        clients = Clients(Settings.from_env(env))
        control = FakeTpuControl(env["TPUQ_TPU_API_ENDPOINT"])

        # Warm up, and measure the race: every request races zones a (wins) and c (waits forever),
        # so each warm-up job's request leaves one loser that must be deleted once a's slice is ACTIVE.
        warm = [f"warm-{i}-{uuid.uuid4().hex[:6]}" for i in range(n_preemptions + 2)]
        for w in warm:
            submit(clients, w, "sleep 8")  # long enough that each holds its own TPU
        for w in warm:
            wait_state(clients, w, ("succeeded",))
        wait_for(lambda: len(idle_tpus(clients)) >= 2, timeout=60, what="two idle TPUs")
        # The fake stamps each transition with its scheduled time, so the winner (zone a) went ACTIVE exactly
        # accepted + waiting + provisioning scenario seconds after its create; the call log stamps calls in
        # scenario seconds too. Map both to real time.
        health, now_real = control.health(), time.time()
        scenario_origin = now_real - health["scenario_time"] / SCALE
        to_active = sum(SCENARIO["delays"][k] for k in ("accepted", "waiting", "provisioning"))
        calls = control.calls()
        active_at = {}
        for call in calls:
            name = (call.get("args") or {}).get("queuedResourceId", "")
            if call["method"] == "POST" and name.endswith("-us-central2-a") and call.get("status", 200) < 300:
                active_at[name[: -len("-us-central2-a")]] = scenario_origin + (call["scenario_time"] + to_active) / SCALE
        deltas = []
        for call in calls:
            if call["method"] != "DELETE" or "/queuedResources/" not in call["path"]:
                continue
            name = call["path"].rsplit("/", 1)[-1].split("?")[0]
            if name.endswith("-us-central2-c") and name[: -len("-us-central2-c")] in active_at:
                deltas.append(scenario_origin + call["scenario_time"] / SCALE - active_at[name[: -len("-us-central2-c")]])
        # A loser deleted before its winner turned ACTIVE was withdrawn (its job took another idle TPU first): not
        # a race's clean-up, counted apart.
        withdrawn = sum(1 for d in deltas if d < 0)
        deltas = [d for d in deltas if d >= 0]
        print(json.dumps({"bench": "winner_active_to_losers_deleted", "races": len(deltas),
                          "p50_s": round(percentile(deltas, 50), 3) if deltas else None,
                          "max_s": round(max(deltas), 3) if deltas else None,
                          "withdrawn_before_winner_active": withdrawn}), flush=True)

        # 1. publish -> running on an idle ACTIVE TPU.
        latencies, spans = [], []
        for i in range(n_jobs):
            job_id = f"lat-{i}-{uuid.uuid4().hex[:6]}"
            t0 = submit(clients, job_id, STAMP)
            spans.append((t0, running_at(clients, job_id)))
            latencies.append(spans[-1][1] - t0)
            wait_state(clients, job_id, ("succeeded",))
            wait_for(lambda: len(idle_tpus(clients)) >= 2, timeout=30, what="the TPU idle again")
        print(json.dumps({"bench": "publish_to_running", "jobs": n_jobs, "p50_s": round(percentile(latencies, 50), 3),
                          "p95_s": round(percentile(latencies, 95), 3), "max_s": round(max(latencies), 3),
                          "stages_p50_s": stages(stack.delivery_log_file, spans),
                          "load_average": [round(x, 1) for x in os.getloadavg()],
                          "machine_reference_seconds": machine_reference_seconds()}),
              flush=True)

        # 2. preemption -> running again on another idle TPU (the freed capacity is re-requested meanwhile).
        recoveries = []
        for i in range(n_preemptions):
            wait_for(lambda: len(idle_tpus(clients)) >= 2, timeout=60, what="two idle TPUs")
            job_id = f"pre-{i}-{uuid.uuid4().hex[:6]}"
            submit(clients, job_id, f"{STAMP}; sleep 30")
            running_at(clients, job_id, 1)
            node = job(clients, job_id)["tpu"]
            t0 = time.time()
            control.preempt(node)
            recoveries.append(running_at(clients, job_id, 2) - t0)
            clients.publish("cancels", {"job_id": job_id})
            wait_state(clients, job_id, ("cancelled", "succeeded", "failed"))
        print(json.dumps({"bench": "preemption_to_running_again", "runs": n_preemptions,
                          "p50_s": round(percentile(recoveries, 50), 3), "max_s": round(max(recoveries), 3)}),
              flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
