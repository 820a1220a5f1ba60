"""Load on the local stack (issue 17): N jobs published at once onto K single-host slices.

    python benchmarks/bench_load.py [--jobs 300] [--slices 8] [--seconds 2]

The K slices are claimed first (K warm-up jobs), so the figures are about the queue, not provisioning.
Then N jobs of D seconds each are published at once, from 16 threads. One JSON line:

- intake: seconds from the first publish until every job is stored, and jobs/s;
- makespan: from the first publish until the last job's command ended (its own stamp), the ideal
  ⌈N/K⌉ × D and their ratio;
- turnaround p50/p95: on one TPU, one job's command ending (its own stamp) to the next job's command
  starting there (its own stamp);
- attempts: in all (N means one each);
- cpu_s_per_job: CPU-seconds per job of every process of the stack (services, front, fake TPU, emulators,
  fake GCS) and of the worker hosts (sshd sessions, supervisors, the jobs), read from /proc over the
  measured part; `not the stack` is what else ran on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor


from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.contracts.documents import JobState
from tpuq.operations.queries import worker_log_chunks
from tpuq_dev.devstack.stack import wait_for

from bench_simulate import machine_reference_seconds
from stackbench import cpu_seconds_per, cpu_snapshot, whole_stack

ZONE = "us-central2-a"
SCALE = 60.0
TERMINAL = [s.value for s in JobState if s.terminal]


def scenario() -> dict:
    return {"seed": 1, "zones": {ZONE: {"quota": {"v4": {"spot": 4096}}}},
            "delays": {"accepted": 1, "waiting": 1, "provisioning": 10, "suspending": 10, "deleting": 5,
                       "host_keys": 1}}


def fleet(slices: int) -> dict:
    return {"name": "load", "project": "tpuq-local", "idle_timeout_seconds": 3600,
            "retry": {"preemptions": 3, "backoff_base_seconds": 0.0, "backoff_max_seconds": 0.0},
            "claim": {"watch_interval_seconds": 0.5},
            "tpus": [{"id": "v4-single", "type": "v4-8", "zones": [ZONE], "count": slices}]}


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))]


def count(clients: Clients, states: list[str] | None = None) -> int:
    """Stored jobs (in `states`): one count aggregation, so polling does not load the emulator it measures."""
    q = clients.firestore.collection(store.JOBS)
    if states:
        from google.cloud.firestore import FieldFilter

        q = q.where(filter=FieldFilter("state", "in", states))
    return int(q.count().get()[0][0].value)


def stamps(clients: Clients, job_id: str) -> dict:
    doc = clients.firestore.collection(store.JOBS).document(job_id).get().to_dict() or {}
    found = {"tpu": doc.get("tpu"), "attempts": doc.get("attempts", 0), "state": doc.get("state")}
    for chunk in worker_log_chunks(clients.storage, doc):
        for line in chunk.text.splitlines():
            key, _, value = line.partition("=")
            if key in ("START_AT", "END_AT"):
                found[key] = float(value)
    return found


def publish_all(clients: Clients, jobs: list[dict]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda j: clients.publish("jobs", j), jobs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    reference = machine_reference_seconds()  # before the stack: this machine's speed, to compare runs through
    with whole_stack(scenario(), fleet(args.slices), SCALE, prefix="bench-load") as (stack, env):
        clients = Clients(Settings.from_env(env))
        warm = f"warm-{uuid.uuid4().hex[:6]}"
        publish_all(clients, [{"id": f"{warm}-{i}", "tpu": "v4-8", "command": "sleep 5"} for i in range(args.slices)])
        wait_for(lambda: count(clients, TERMINAL) == args.slices, timeout=600, interval=0.5,
                 what="the warm-up jobs")
        idle = lambda: sum(1 for s in clients.firestore.collection(store.TPUS).stream()
                           if (s.to_dict() or {}).get("state") == "idle")
        try:
            wait_for(lambda: idle() == args.slices, timeout=120, interval=0.5, what=f"{args.slices} idle TPUs")
        except TimeoutError:
            pass  # a slice lost to the race or a failed request: measure on those that are there, and say so
        slices = idle()

        tag = f"load-{uuid.uuid4().hex[:6]}"
        command = f'echo "START_AT=$(date +%s.%N)"; sleep {args.seconds}; echo "END_AT=$(date +%s.%N)"'
        jobs = [{"id": f"{tag}-{i:05d}", "tpu": "v4-8", "command": command} for i in range(args.jobs)]
        cpu_before = cpu_snapshot(stack)
        t0 = time.time()
        publish_all(clients, jobs)
        published = time.time()
        wait_for(lambda: count(clients) == args.slices + args.jobs, timeout=3600, interval=0.2, what="every job stored")
        stored = time.time()
        wait_for(lambda: count(clients, TERMINAL) == args.slices + args.jobs, timeout=6 * 3600, interval=1.0,
                 what="every job finished")
        cpu_after = cpu_snapshot(stack)

        with ThreadPoolExecutor(8) as pool:
            runs = list(pool.map(lambda j: stamps(clients, j["id"]), jobs))
        ended = [r for r in runs if "END_AT" in r and "START_AT" in r]
        makespan = max(r["END_AT"] for r in ended) - t0 if ended else None
        ideal = math.ceil(args.jobs / slices) * args.seconds
        gaps: list[float] = []
        per_tpu: dict[str, list[dict]] = {}
        for r in ended:
            per_tpu.setdefault(r["tpu"], []).append(r)
        for on_one in per_tpu.values():
            on_one.sort(key=lambda r: r["START_AT"])
            gaps += [b["START_AT"] - a["END_AT"] for a, b in zip(on_one, on_one[1:])]
        print(json.dumps({
            "bench": "load", "jobs": args.jobs, "slices": slices, "job_seconds": args.seconds,
            "publish_s": round(published - t0, 2),
            "intake_s": round(stored - t0, 2), "intake_jobs_per_s": round(args.jobs / (stored - t0), 1),
            "makespan_s": round(makespan, 2) if makespan else None, "ideal_s": ideal,
            "makespan_over_ideal": round(makespan / ideal, 3) if makespan else None,
            "turnaround_p50_s": round(percentile(gaps, 50), 3) if gaps else None,
            "turnaround_p95_s": round(percentile(gaps, 95), 3) if gaps else None,
            "attempts": sum(r["attempts"] for r in runs),
            "succeeded": sum(1 for r in runs if r["state"] == JobState.succeeded),
            "cpu_s_per_job": cpu_seconds_per(cpu_before, cpu_after, args.jobs),
            "load_average": [round(x, 1) for x in os.getloadavg()], "machine_reference_seconds": reference,
        }), flush=True)


if __name__ == "__main__":
    main()
