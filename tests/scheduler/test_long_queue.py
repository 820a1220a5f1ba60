"""A long queue starves nothing, and a pass reads per type, bounded: its reads grow with the fleet, not the queue.

Thousands of high-priority jobs wait for a type nothing can run; a low-priority job of another type is
assigned as soon as a TPU of its type idles. The stored jobs are written as intake writes them
(`intake.job_document`), so the pass reads exactly what it would after thousands of submissions.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from tpuq.contracts import store, topology
from tpuq.contracts.documents import JobState
from tpuq.contracts.jobspec import PublishedJob
from tpuq.contracts.messages import Tick
from tpuq.scheduler import intake
from tpuq.scheduler.passreads import PER_TYPE_EXTRA
from tpuq.scheduler.scheduling import scheduling_pass
from tpuq.runtime.service import Context

from tests.scheduler.conftest import active, fleet_file, utc

NOW = utc(2026, 1, 1)


def store_pending(db, n: int, tpu: str, priority: str, prefix: str) -> None:
    batch = db.batch()
    for i in range(n):
        job = PublishedJob.model_validate({"id": f"{prefix}-{i:05d}", "tpu": tpu, "command": "train",
                                           "priority": priority})
        doc = intake.job_document(job, job.id, "cli", f"m-{prefix}-{i}", NOW + timedelta(milliseconds=i))
        batch.set(db.collection(store.JOBS).document(job.id), doc)
        if i % 400 == 399:
            batch.commit()
            batch = db.batch()
    batch.commit()


def context(sched) -> Context:
    return Context(clients=sched.clients, now=lambda: NOW + timedelta(hours=1), rng=random.Random(0),
                   message_id="pass", attributes={}, publish_time=None,
                   subscription=topology.subscription_by_path("scheduler", "/push/ticks"), service="scheduler",
                   settings=sched.clients.settings)


def test_high_priority_jobs_for_a_type_without_capacity_hide_no_job_an_idle_tpu_can_run(sched):
    store_pending(sched.db, 2500, "v6e-8", "high", "v6e")  # more than a pass ever read before
    sched.deliver("jobs", {"id": "small", "tpu": "v4-8", "command": "train", "priority": "low"})
    sched.deliver("fleet-events", active("n1"))
    job = sched.job("small")
    assert job["state"] == JobState.assigned and job["tpu"].endswith("/nodes/n1")
    assert sched.job("v6e-00000")["state"] == JobState.pending


@pytest.mark.parametrize("queued", [100, 1000, 3000])
def test_a_pass_reads_the_same_number_of_jobs_however_long_the_queue(sched, queued):
    store_pending(sched.db, queued, "v4-8", "normal", "v4")
    store_pending(sched.db, queued, "v6e-8", "high", "v6e")
    sched.deliver("fleet-events", active("n1"))  # one idle v4 TPU: one job assigned
    sched.deliver("ticks", Tick(seq=1))
    report = scheduling_pass(context(sched), fleet_file())
    # The fleet offers v4-8 only (no TPU idles now): one bounded read of v4 jobs, none of the v6e queue.
    assert report.jobs_read == min(queued - 1, PER_TYPE_EXTRA)
    assert sched.job("v4-00000")["state"] == JobState.assigned


def test_a_job_of_any_type_is_read_for_every_idle_type(sched):
    store_pending(sched.db, 200, "v6e-8", "high", "v6e")
    sched.deliver("jobs", {"id": "anything", "tpu": "any", "command": "train", "priority": "low"})
    sched.deliver("fleet-events", active("n1"))
    assert sched.job("anything")["state"] == JobState.assigned


def test_a_new_job_s_second_round_reads_the_queue_again_but_not_the_idle_tpus(sched):
    """A new job that fits an idle TPU makes the pass read the whole queue (an older job may be owed that TPU); the
    idle TPUs the first round read a moment ago are reused, not read again, and the older job still gets it."""
    sched.deliver("fleet-events", active("n1"))  # idle, nothing pending
    store_pending(sched.db, 1, "v4-8", "normal", "old")  # as if its pass had not run yet
    job = PublishedJob.model_validate({"id": "new", "tpu": "v4-8", "command": "train"})
    sched.db.collection(store.JOBS).document("new").set(
        intake.job_document(job, "new", "cli", "m-new", NOW + timedelta(minutes=1)))

    report = scheduling_pass(context(sched), fleet_file(), trigger_job_ids=["new"])

    assert (report.rounds, report.tpus_read, report.assigned) == (2, 1, 1)
    assert sched.job("old-00000")["state"] == JobState.assigned
    assert sched.job("new")["state"] == JobState.pending
