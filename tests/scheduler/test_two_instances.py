"""Two scheduler processes fed the same events: no TPU or job is assigned twice, no job is lost.

Both instances get every job and every ACTIVE fleet event as real push
envelopes over HTTP, concurrently and in a shuffled order, then ticks. A
delivery that answers non-2xx is delivered again, as Pub/Sub would.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tpuq.contracts import store
from tpuq_dev.devstack import processes
from tpuq.runtime.fleetstore import save_fleet
from tpuq.contracts.messages import Tick

from tests.helpers import wait_until
from tests.scheduler.conftest import SCHEDULER_SOURCE, active, fleet_file, utc

JOBS, TPUS = 200, 30  # each delivered to both instances: 460 racing deliveries
OFFER = [("v4-8", "us-central2-b", "v4"), ("v5litepod-8", "us-west4-a", "v5e")]
JOB_TYPES = [["v4-8"], ["v5litepod-8"], ["v4-8", "v5litepod-8"]]


@pytest.fixture
def two_schedulers(stack_sched, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("two-schedulers")
    procs, urls = [], []
    for i in range(2):
        port = processes.free_port()
        log = open(tmp_path / f"scheduler-{i}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "functions_framework", "--source", SCHEDULER_SOURCE, "--target", "handle",
             "--signature-type", "http", "--host", "127.0.0.1", "--port", str(port)],
            env={**os.environ, "PYTHONUNBUFFERED": "1", "THREADS": "16"}, stdout=log, stderr=subprocess.STDOUT,
        ))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for url in urls:
            wait_until(lambda: _healthy(url), timeout=processes.START_TIMEOUT, what=f"scheduler at {url}")
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)  # finishing its in-flight requests, on a loaded machine
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _healthy(url: str) -> bool:
    try:
        return requests.get(url + "/", timeout=1).status_code == 200
    except requests.RequestException:
        return False


# 460 deliveries on the emulators: a few minutes on a loaded 2-core machine, more than the suite-wide 300 s.
@pytest.mark.timeout(900)
def test_two_instances_never_assign_twice_and_lose_nothing(stack_sched, two_schedulers):
    sched = stack_sched
    rng = random.Random(5)
    save_fleet(sched.db, fleet_file(tpus=[
        {"id": entry, "type": t, "zones": [zone], "count": TPUS} for t, zone, entry in OFFER
    ]), utc(2026, 1, 1))
    jobs = [("jobs", {"id": f"job-{i:03d}", "tpu": rng.choice(JOB_TYPES), "command": "train",
                      "priority": rng.choice(["low", "normal", "high"])}) for i in range(JOBS)]
    nodes = [("fleet-events", active(f"node-{i:02d}", zone=OFFER[i % 2][1], type_=OFFER[i % 2][0],
                                     entry_id=OFFER[i % 2][2])) for i in range(TPUS)]
    events = jobs + nodes
    rng.shuffle(events)
    deliveries = [(url, topic, msg, f"m-{n}") for n, (topic, msg) in enumerate(events) for url in two_schedulers]

    started = time.monotonic()
    redelivered = Counter()

    def deliver(args):
        url, topic, msg, message_id = args
        while sched.deliver_http(url, topic, msg, message_id) not in (200, 204):
            redelivered[topic] += 1  # as Pub/Sub would: again, until acknowledged

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(deliver, deliveries))
        list(pool.map(deliver, [(url, "ticks", Tick(seq=1), f"tick-{i}") for i, url in enumerate(two_schedulers)]))
    elapsed = time.monotonic() - started

    stored_jobs = sched.all(store.JOBS)
    tpus = sched.all(store.TPUS)
    assignments = [m for m in sched.drain("assignments") if m["action"] == "assign"]
    print(f"\n{len(deliveries)} deliveries to 2 instances in {elapsed:.1f}s; redelivered {dict(redelivered)}; "
          f"{len(assignments)} assignments")

    # No job lost: every job stored, and either assigned or still pending.
    assert len(stored_jobs) == JOBS
    assert Counter(j["state"] for j in stored_jobs.values()).keys() <= {"assigned", "pending"}
    assigned = {jid: j for jid, j in stored_jobs.items() if j["state"] == "assigned"}
    # Every TPU is used: there are far more jobs of each type than TPUs.
    assert len(tpus) == TPUS and all(t["state"] == "busy" for t in tpus.values())
    assert len(assigned) == TPUS

    # No double assignment: one Assignment per job attempt, one job per TPU.
    assert len(assignments) == len(assigned)
    assert len({m["attempt_id"] for m in assignments}) == len(assignments)
    assert len({m["node"] for m in assignments}) == len(assignments)
    assert all(m["attempt"] == 1 for m in assignments)
    assert {m["job_id"] for m in assignments} == set(assigned)
    for t in tpus.values():
        job = assigned[t["job_id"]]
        assert job["tpu"] == t["name"] and job["attempt_id"] == t["attempt_id"]
