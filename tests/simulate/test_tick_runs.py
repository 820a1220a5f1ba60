"""Why the tick handlings that run were not skipped (`TpuqPolicy.tick_runs`), and the in-memory store's answers
staying copies after its copy-saving paths (issue 34 §2: where the simulator's CPU goes)."""

from __future__ import annotations

import random
from datetime import datetime, timezone

from tpuq_dev.capacitymodel.scenario import parse_scenario
from tpuq_dev.inmemory import MemoryFirestore
from tpuq.contracts.fleet import FleetFile
from tpuq_dev.simulate.run import simulate
from tpuq_dev.simulate.tpuq_policy import RUN_REASONS
from tpuq_dev.simulate.workload import SimJob

FLEET = {"name": "runs", "project": "tpuq-sim", "tpus": [
    {"id": "v4", "type": "v4-8", "zones": ["us-central2-b", "us-central2-c"], "count": 2}]}
SCENARIO = {
    "seed": 3,
    "zones": {"us-central2-b": {"quota": {"v4": {"spot": 8}}, "stockouts": [{"start": 1200, "end": 4000}]},
              "us-central2-c": {"quota": {"v4": {"spot": 8}}}},
    "delays": {"accepted": 2, "waiting": 30, "provisioning": 300, "suspending": 30, "deleting": 20},
}


def test_every_tick_handling_that_ran_says_why():
    rng = random.Random(1)
    jobs = sorted((SimJob(f"job-{i}", rng.uniform(0, 2 * 3600), ("v4-8",), "normal", rng.uniform(600, 2400), 600)
                   for i in range(5)), key=lambda j: j.submit_at)
    run = simulate("tpuq", fleet=FleetFile.model_validate(FLEET), scenario=parse_scenario(SCENARIO), jobs=jobs,
                   horizon=4 * 3600, seed=2)
    policy = run.driver
    counted = {sub: sum(reasons.values()) for sub, reasons in policy.tick_runs.items()}
    assert sum(counted.values()) == policy.service_ticks_run > 0  # each handling run, one reason
    assert {r for reasons in policy.tick_runs.values() for r in reasons} <= set(RUN_REASONS)
    # The backstops' cadence: its instant comes (a time rule), and the claim it writes makes the next tick run too.
    assert any(r["time_rule"] > 0 and r["last_changed"] > 0 for r in policy.tick_runs.values()), policy.tick_runs


def _db() -> MemoryFirestore:
    return MemoryFirestore(now=lambda: datetime(2026, 1, 5, tzinfo=timezone.utc))


def test_a_read_document_is_a_copy_whatever_its_arrays_and_maps_hold():
    db = _db()
    ref = db.collection("docs").document("a")
    ref.set({"flat": [1, "x"], "map": {"k": 1}, "nested": [{"n": [1]}], "deep": {"m": {"v": [2]}}, "s": "t"})
    got = ref.get().to_dict()
    got["flat"].append(2)
    got["map"]["k"] = 5
    got["nested"][0]["n"].append(3)
    got["deep"]["m"]["v"].append(4)
    assert ref.get().to_dict() == {"flat": [1, "x"], "map": {"k": 1}, "nested": [{"n": [1]}],
                                   "deep": {"m": {"v": [2]}}, "s": "t"}


def test_a_stored_time_written_back_changes_nothing_and_commits_stay_strictly_later():
    db = _db()
    ref = db.collection("docs").document("a")
    first = ref.set({"at": datetime(2026, 1, 1, tzinfo=timezone.utc)}).update_time
    stored = ref.get().to_dict()["at"]
    assert ref.set({"at": stored}).update_time == first  # the same value: no change, the update time stays
    second = ref.set({"at": stored, "n": 1}).update_time
    third = ref.update({"n": 2}).update_time
    assert first < second < third  # a frozen clock: each commit a microsecond after the last
    assert ref.get().read_time > third


def test_a_cpu_clock_splits_the_runs_cpu_by_subscription_and_by_what_a_tick_changed():
    """benchmarks/bench_sim_handlings.py's figures: the run's CPU is counted once, under the subscription handled
    or the simulator's own (`OUTSIDE`), and each tick handling run under whether it changed something."""
    import time

    from tpuq_dev.simulate.storeops import OUTSIDE

    rng = random.Random(1)
    jobs = sorted((SimJob(f"job-{i}", rng.uniform(0, 2 * 3600), ("v4-8",), "normal", rng.uniform(600, 2400), 600)
                   for i in range(5)), key=lambda j: j.submit_at)
    started = time.process_time()
    run = simulate("tpuq", fleet=FleetFile.model_validate(FLEET), scenario=parse_scenario(SCENARIO), jobs=jobs,
                   horizon=4 * 3600, seed=2, cpu_clock=time.process_time)
    policy = run.driver
    policy.store_ops.per_day(1.0)  # counts the last stretch
    whole = time.process_time() - started
    counted = policy.store_ops.cpu
    assert 0.8 * whole <= sum(counted.values()) <= whole
    assert {OUTSIDE, "claimer-ticks", "scheduler-jobs", "executor-assignments"} <= set(counted)
    assert {changed for _, changed in policy.tick_cpu} == {True, False}
    for name in {name for name, _ in policy.tick_cpu}:  # the tick handlings run: their subscription's (and the
        # judging of each around its push)
        ticks = sum(s for (n, _), (_, s) in policy.tick_cpu.items() if n == name)
        assert 0.5 * counted[name] <= ticks <= 1.5 * counted[name] + 0.01
