"""Documents a scheduling pass reads, and its CPU-seconds, against the queue's length (issue 17), on the
Firestore emulator: `python benchmarks/bench_pass_reads.py [--sizes 1000,10000,100000]`.

For each size N: N pending jobs (nine in ten v6e-8 at high priority, which no TPU and no room can serve, the
rest v4-8 at normal priority), 16 idle v4-8 TPUs, a fleet offering both types. One JSON line per size and
pass: a pass with the 16 idle TPUs (it assigns 16 jobs), then a pass with none idle (a tick's). Documents
are counted, not timed: the emulator has no real indexes, so its query time is not production's. `before`
is what the earlier pass read (the first 2,000 pending jobs in priority order) on the same data.
"""

from __future__ import annotations

import argparse
import tempfile
import json
import random
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from google.cloud.firestore import FieldFilter, Query

from tpuq.contracts import store, topology
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.contracts.documents import JobState
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import save_fleet
from tpuq.contracts.jobspec import PublishedJob
from tpuq.scheduler import intake
from tpuq.scheduler.scheduling import scheduling_pass
from tpuq.runtime.service import Context
from tpuq_dev.devstack.stack import DevStack, firestore_clear


ZONE = "us-central2-b"
IDLE = 16
OLD_PENDING_LIMIT = 2000


def fleet() -> FleetFile:
    return FleetFile.model_validate({"name": "bench", "project": "tpuq-local", "tpus": [
        {"id": "v4", "type": "v4-8", "zones": [ZONE], "count": 64},
        {"id": "v6e", "type": "v6e-8", "zones": ["us-east1-d"], "count": 0}]})


def store_jobs(db, n: int, now: datetime) -> None:
    batch, written = db.batch(), 0
    for i in range(n):
        v6e = i % 10 != 9
        job = PublishedJob.model_validate({"id": f"j{i:06d}", "tpu": "v6e-8" if v6e else "v4-8", "command": "train",
                                           "priority": "high" if v6e else "normal"})
        batch.set(db.collection(store.JOBS).document(job.id),
                  intake.job_document(job, job.id, "cli", f"m{i}", now - timedelta(seconds=n - i)))
        written += 1
        if written == 500:
            batch.commit()
            batch, written = db.batch(), 0
    if written:
        batch.commit()


def store_idle_tpus(db, n: int) -> None:
    for i in range(n):
        name = f"projects/tpuq-local/locations/{ZONE}/nodes/n{i}"
        db.collection(store.TPUS).document(f"n{i}").set({
            "name": name, "short": f"n{i}", "fleet": "bench", "zone": ZONE, "region": "us-central2", "type": "v4-8",
            "entry_id": "v4", "state": "idle", "job_id": None, "attempt_id": None, "chips": 4, "hosts": 1,
            "endpoints": [{"worker_id": 0, "ip": f"10.0.0.{i + 2}", "port": 8470}]})


def old_pass_reads(db) -> int:
    q = (db.collection(store.JOBS).where(filter=FieldFilter("state", "==", JobState.pending))
         .order_by("priority_rank", direction=Query.DESCENDING).order_by("submit_time").limit(OLD_PENDING_LIMIT))
    return sum(1 for _ in q.stream())


def measured_pass(clients: Clients, fleet_file: FleetFile, now: datetime) -> dict:
    ctx = Context(clients=clients, now=lambda: now, rng=random.Random(0), message_id="bench", attributes={},
                  publish_time=None, subscription=topology.subscription_by_path("scheduler", "/push/ticks"),
                  service="scheduler", settings=clients.settings)
    cpu, wall = time.process_time(), time.perf_counter()
    report = scheduling_pass(ctx, fleet_file)
    return {"jobs_read": report.jobs_read, "tpus_read": report.tpus_read, "assigned": report.assigned,
            "scheduler_cpu_s": round(time.process_time() - cpu, 3), "wall_s": round(time.perf_counter() - wall, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    args = parser.parse_args()
    stack = DevStack(state_dir=Path(tempfile.mkdtemp(prefix="tpuq-bench-reads-")), services=())
    env = stack.up()
    try:
        clients = Clients(Settings.from_env(env))
        db, fleet_file = clients.firestore, fleet()
        for n in (int(s) for s in args.sizes.split(",")):
            firestore_clear(env["FIRESTORE_EMULATOR_HOST"], stack.project)
            now = datetime.now(timezone.utc)
            save_fleet(db, fleet_file, now)
            store_jobs(db, n, now)
            store_idle_tpus(db, IDLE)
            before = old_pass_reads(db)
            for label in ("16 idle TPUs", "none idle"):
                print(json.dumps({"bench": "pass_reads", "pending": n, "pass": label, "before_jobs_read": before,
                                  **measured_pass(clients, fleet_file, now)}), flush=True)
    finally:
        stack.down()


if __name__ == "__main__":
    main()
