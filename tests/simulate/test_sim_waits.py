"""A handler that waits (the claimer's fast watch) holds only its own push: what is due meanwhile runs at its own
time (tpuq_dev.simulate.waits). Found by tests/e2e/test_simulate_fidelity.py: before, jobs submitted during a fast watch
reached the scheduler when it ended, all at once and out of order."""

from __future__ import annotations

import pytest

from tpuq_dev.capacitymodel.scenario import parse_scenario
from tpuq.contracts.documents import JobDoc
from tpuq.contracts.fleet import FleetFile
from tpuq_dev.simulate.events import EventLoop
from tpuq_dev.simulate.run import simulate
from tpuq_dev.simulate.waits import Waits
from tpuq_dev.simulate.workload import SimJob

FLEET = FleetFile.model_validate({
    "name": "w", "project": "tpuq-sim", "claim": {"watch_interval_seconds": 5},
    "tpus": [{"id": "small", "type": "v4-8", "zones": ["us-central2-b"], "count": 1}]})
SCENARIO = parse_scenario({"zones": {"us-central2-b": {"quota": {"v4": {"spot": 4}}}},
                           "delays": {"accepted": 1, "waiting": 1, "provisioning": 60}})


def test_jobs_submitted_during_a_fast_watch_are_stored_at_their_own_time_in_order():
    # j0's request starts a 5 s fast watch at about t=1; the others arrive during it.
    jobs = [SimJob(f"j{i}", 1.0 + 0.5 * i, ("v4-8",), "normal", 10) for i in range(6)]
    run = simulate("tpuq", fleet=FLEET, scenario=SCENARIO, jobs=jobs, horizon=30.0, seed=3, tick_seconds=60.0)
    stored = {s.id: JobDoc.from_doc(s.to_dict(), s.id).submit_time for s in run.driver.db.collection("jobs").stream()}
    at = {job_id: (t - run.loop.wall(0)).total_seconds() for job_id, t in stored.items()}
    assert sorted(at, key=at.get) == [j.job_id for j in jobs]
    assert all(0 <= at[j.job_id] - j.submit_at < 0.5 for j in jobs), at


@pytest.mark.parametrize("use_greenlets", [True, False], ids=["greenlets", "threads"])
def test_a_waiting_task_resumes_at_its_wake_time_between_other_events(use_greenlets):
    loop = EventLoop()
    waits = Waits(loop, use_greenlets=use_greenlets)
    seen = []

    def handler():
        seen.append(("start", loop.now()))
        waits.sleep(2.0)
        seen.append(("woke", loop.now()))
        return "answer"

    loop.at(1.0, lambda: waits.run(handler, lambda answer: seen.append((answer, loop.now()))))
    loop.at(2.0, lambda: seen.append(("other", loop.now())))
    loop.run(10.0)
    assert seen == [("start", 1.0), ("other", 2.0), ("woke", 3.0), ("answer", 3.0)]


@pytest.mark.parametrize("use_greenlets", [True, False], ids=["greenlets", "threads"])
def test_a_failing_waiting_task_raises_in_the_loop(use_greenlets):
    loop = EventLoop()
    waits = Waits(loop, use_greenlets=use_greenlets)

    def handler():
        waits.sleep(1.0)
        raise RuntimeError("boom")

    loop.at(1.0, lambda: waits.run(handler, lambda answer: None))
    with pytest.raises(RuntimeError, match="boom"):
        loop.run(10.0)


def test_greenlets_and_threads_give_the_same_run(monkeypatch):
    from tpuq_dev.simulate import waits as waits_module

    def run(use_greenlets: bool):
        monkeypatch.setattr(waits_module.Waits.__init__, "__defaults__", (use_greenlets,))
        jobs = [SimJob(f"j{i}", 1.0 + 40 * i, ("v4-8",), "normal", 30) for i in range(8)]
        run = simulate("tpuq", fleet=FLEET, scenario=SCENARIO, jobs=jobs, horizon=900.0, seed=3)
        return [(r.job_id, r.attempt, r.started_at, r.ended_at) for r in run.workers.runs], dict(run.cloud.calls)

    with_greenlets, with_threads = run(True), run(False)
    assert with_greenlets == with_threads
    assert len(with_greenlets[0]) >= 4
