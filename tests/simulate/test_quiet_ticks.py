"""Skipping quiet ticks is exact: the traced clock finds where the services' time rules flip, and a busy run in
verify mode (every tick runs, and each one skipping would have skipped is checked) finds no tick that did
something. Outcomes with and without skipping agree job by job."""

from __future__ import annotations

import random
from datetime import timedelta, timezone

import pytest

from tpuq_dev.capacitymodel.scenario import parse_scenario
from tpuq.contracts.fleet import FleetFile
from tpuq_dev.simulate.events import EventLoop
from tpuq_dev.simulate.quiet import Deadlines, TracedClock
from tpuq_dev.simulate.run import simulate
from tpuq_dev.simulate.workload import SimJob

NOW = 100.0


def _at(loop: EventLoop, seconds: float):
    return loop.wall(seconds)


CASES = [  # (what the rule computes, the instant its answer changes)
    ("now - t > 600 s", lambda now, w: now - w(50) > timedelta(seconds=600), 650),
    ("t + 600 s <= now", lambda now, w: w(50) + timedelta(seconds=600) <= now, 650),
    ("(now - t).total_seconds() >= 900", lambda now, w: (now - w(50)).total_seconds() >= 900, 950),
    ("until > now", lambda now, w: w(400) > now, 400),
    ("now < until", lambda now, w: now < w(300), 300),
    ("min(now + 30 s, x)", lambda now, w: min(now + timedelta(seconds=30), w(1000)), 970),
    ("t - now < -700 s", lambda now, w: (w(50) - now) < timedelta(seconds=-700), 750),
    ("2 * (now - t) > 1000 s", lambda now, w: 2 * (now - w(50)) > timedelta(seconds=1000), 550),
    ("(now - t) / 1 min >= 20", lambda now, w: (now - w(50)) / timedelta(minutes=1) >= 20, 1250),
    ("now.astimezone(utc) >= t", lambda now, w: now.astimezone(timezone.utc) >= w(200), 200),
    ("a time from the past is a constant", lambda now, w: w(10) < w(20), None),
]


@pytest.mark.parametrize("name,rule,flips_at", CASES, ids=[c[0] for c in CASES])
def test_the_traced_clock_notes_where_a_rule_flips(name, rule, flips_at):
    loop = EventLoop()
    deadlines = Deadlines()
    loop.at(NOW, lambda: rule(TracedClock(loop, deadlines)(), loop.wall))
    loop.run(NOW + 1)
    if flips_at is None:
        assert deadlines.earliest == float("inf")
    else:
        assert deadlines.earliest == pytest.approx(flips_at, abs=1e-3)


def test_a_now_kept_for_a_later_event_is_a_constant_then():
    loop = EventLoop()
    deadlines = Deadlines()
    clock = TracedClock(loop, deadlines)
    kept = {}
    loop.at(10.0, lambda: kept.setdefault("read_at", clock()))
    # 50 s later a cache compares its old read time with the new now: the old one no longer moves.
    loop.at(60.0, lambda: clock() - kept["read_at"] < timedelta(seconds=300))
    loop.run(61.0)
    assert deadlines.earliest == pytest.approx(310.0, abs=1e-3)


FLEET = {"name": "quiet", "project": "tpuq-sim", "tpus": [
    {"id": "v4", "type": "v4-8", "zones": ["us-central2-b", "us-central2-c"], "count": 3},
    {"id": "v5e", "type": "v5litepod-8", "zones": ["europe-west4-b"], "count": 1}]}
SCENARIO = {
    "seed": 5,
    "zones": {
        "us-central2-b": {"quota": {"v4": {"spot": 8}}, "stockouts": [{"start": 3000, "end": 9000}]},
        "us-central2-c": {"quota": {"v4": {"spot": 8}}},
        "europe-west4-b": {"quota": {"v5litepod": {"spot": 8}}},
    },
    "delays": {"accepted": 2, "waiting": 30, "provisioning": 300, "suspending": 30, "deleting": 20},
    "preemption": {"mean_spot_lifetime": 7200},
}


def _jobs(n: int, seed: int = 2) -> list[SimJob]:
    rng = random.Random(seed)
    return sorted((SimJob(f"job-{i}", rng.uniform(0, 8 * 3600), (rng.choice(["v4-8", "v5litepod-8"]),),
                          rng.choice(["low", "normal", "high"]), rng.uniform(600, 5400), 600) for i in range(n)),
                  key=lambda j: j.submit_at)


def _run(**options):
    return simulate("tpuq", fleet=FleetFile.model_validate(FLEET), scenario=parse_scenario(SCENARIO), jobs=_jobs(14),
                    horizon=12 * 3600, seed=4, **options)


def _outcomes(run) -> dict[str, tuple]:
    out = {}
    for job in run.jobs:
        doc = run.driver.db.collection("jobs").document(job.job_id).get().to_dict() or {}
        zones = tuple(r.node.split("/")[3] for r in run.workers.runs if r.job_id == job.job_id)
        out[job.job_id] = (doc.get("state"), len(zones), zones)
    return out


def test_no_tick_skipping_would_skip_does_anything_in_a_busy_run():
    run = _run(verify_quiet=True)
    policy = run.driver
    assert policy.ticks_skipped == 0 and policy.ticks_run == 12 * 60 - 1  # every minute before the horizon
    would_skip = policy.ticks_quiet_checked
    assert would_skip > 100, "the run must give skipping something to prove"
    assert policy.violations == []
    states = {s for s, _, _ in _outcomes(run).values()}
    assert "succeeded" in states


@pytest.fixture(scope="module")
def skipped_and_every_tick():
    """The two runs, each with its Firestore figures taken at the horizon (the tests' own reads of the store
    afterwards are billed too)."""
    return [(run, run.driver.firestore_ops(run.horizon)) for run in (_run(), _run(skip_quiet_ticks=False))]


def test_skipping_changes_no_job_outcome_attempt_count_or_zone(skipped_and_every_tick):
    (skipped, _), (every_tick, _) = skipped_and_every_tick
    assert skipped.driver.service_ticks_skipped > 100 and every_tick.driver.service_ticks_skipped == 0
    assert _outcomes(skipped) == _outcomes(every_tick)


def test_a_skipped_tick_counts_the_api_calls_and_firestore_reads_its_handling_would_make(skipped_and_every_tick):
    # The reported costs are production's, where every tick is handled: skipping must not change them.
    (skipped, ops), (every_tick, every_tick_ops) = skipped_and_every_tick
    assert skipped.cloud.calls == every_tick.cloud.calls
    assert ops == every_tick_ops
    assert ops.reads > skipped.driver.db.billed.reads + 1000  # the skipped ticks' reads are in it
    assert ops.writes > 0 and ops.probe_writes == 0  # a probe writes only when a worker turns unreachable


def test_a_quiet_handlings_reads_are_affected_only_by_changes_to_what_it_read():
    from google.cloud.firestore import FieldFilter

    from tpuq_dev.inmemory import MemoryFirestore
    from tpuq_dev.simulate.tpuq_policy import _ReadSet

    class Recorder:
        def __init__(self):
            self.reads, self.changes = _ReadSet(), []

        def read_document(self, path):
            self.reads.documents.add(path)

        def read_query(self, collection, filters):
            self.reads.queries.setdefault(collection, []).append(filters)

        def changed(self, path, before, after):
            self.changes.append(self.reads.affected_by(path, before, after))

    db = MemoryFirestore()
    db.collection("jobs").document("a").set({"state": "pending"})
    db.collection("jobs").document("b").set({"state": "running"})
    db.observer = recorder = Recorder()
    list(db.collection("jobs").where(filter=FieldFilter("state", "==", "pending")).limit(1).stream())
    db.collection("tpus").document("t").get()
    # The handling is over: from here on only changes are judged.
    db.observer = type("Judge", (), {"read_document": lambda *_: None, "read_query": lambda *_: None,
                                     "changed": recorder.changed})()
    db.collection("jobs").document("b").update({"attempt": 2})  # matched neither before nor after: unaffected
    db.collection("jobs").document("b").update({"state": "pending"})  # matches now: affected
    db.collection("jobs").document("a").update({"state": "running"})  # matched before: affected
    db.collection("tpus").document("t").set({"state": "idle"})  # a document it got (then missing): affected
    db.collection("tpus").document("u").set({"state": "idle"})  # another: unaffected
    assert recorder.changes == [False, True, True, True, False]


def test_each_services_tick_is_judged_on_its_own():
    """The clock's tick reaches the janitor, which routes it to the services with work (`tpuq.runtime.tickdue`):
    what skipping still finds quiet is the janitor's minutes with nothing to route or do, and routed handlings whose
    work another handling did first. Each is judged on its own: a tick reaching one service is run there alone."""
    policy = _run().driver
    assert policy.service_ticks_skipped > 100
    assert policy.service_ticks_run < 4 * policy.ticks_published  # far from every service every minute


def test_a_range_filter_against_a_moving_now_notes_when_a_stored_document_starts_to_match():
    """`updated_at <= now - 2 min` (the scheduler's backstop): a query whose answer changes with time alone."""
    from types import SimpleNamespace

    from google.cloud.firestore import FieldFilter

    from tpuq_dev.inmemory import MemoryFirestore
    from tpuq_dev.simulate.tpuq_policy import TpuqPolicy

    loop = EventLoop()
    deadlines = Deadlines()
    clock = TracedClock(loop, deadlines)
    db = MemoryFirestore(now=loop.utcnow)
    db.collection("jobs").document("old").set({"state": "running", "updated_at": loop.wall(10)})
    db.collection("jobs").document("new").set({"state": "running", "updated_at": loop.wall(300)})
    db.collection("jobs").document("done").set({"state": "succeeded", "updated_at": loop.wall(50)})
    policy = SimpleNamespace(db=db, _reading=None)
    db.observer = SimpleNamespace(read_document=lambda path: None, changed=lambda *a: None,
                                  read_query=lambda c, f: TpuqPolicy._note_moving_filters(policy, c, f))

    def tick():
        query = (db.collection("jobs").where(filter=FieldFilter("state", "==", "running"))
                 .where(filter=FieldFilter("updated_at", "<=", clock() - timedelta(seconds=120))))
        assert [s.id for s in query.stream()] == ["old"]

    loop.at(NOW + 100, tick)  # now 200: "old" matches (10 <= 80); "new" will at 300 + 120
    loop.run(NOW + 101)
    assert deadlines.earliest == pytest.approx(420.0, abs=1e-3)


def test_a_document_written_after_a_moving_range_read_affects_it():
    """`updated_at <= now - 2 min` read at 200; a running job stamped 250 is written later. It does not match the
    filter's value as read (80), but starts to match at 370: the write must make the service run again."""
    from types import SimpleNamespace

    from google.cloud.firestore import FieldFilter

    from tpuq_dev.inmemory import MemoryFirestore
    from tpuq_dev.simulate.tpuq_policy import TpuqPolicy, _ReadSet

    loop = EventLoop()
    clock = TracedClock(loop, Deadlines())
    db = MemoryFirestore(now=loop.utcnow)
    policy = SimpleNamespace(db=db, _reading=_ReadSet())
    policy._note_moving_filters = lambda c, f: TpuqPolicy._note_moving_filters(policy, c, f)
    affected = []
    db.observer = SimpleNamespace(read_document=lambda path: None,
                                  read_query=lambda c, f: TpuqPolicy.read_query(policy, c, f),
                                  changed=lambda path, b, a: affected.append(reads.affected_by(path, b, a)))
    reads = policy._reading
    loop.at(200, lambda: list(db.collection("jobs").where(filter=FieldFilter("state", "==", "running"))
                              .where(filter=FieldFilter("updated_at", "<=", clock() - timedelta(seconds=120)))
                              .stream()))
    loop.run(201)
    policy._reading = None
    db.collection("jobs").document("late").set({"state": "running", "updated_at": loop.wall(250)})
    db.collection("jobs").document("other").set({"state": "succeeded", "updated_at": loop.wall(250)})
    assert affected == [True, False]
