"""The run's figures from hand-built records: every billed second in exactly one bucket, waits by priority."""

from __future__ import annotations

import json

import pytest

from tpuq_dev.simulate.metrics import (Metrics, SliceLife, WasteCause, bound_records, nearest_rank, percentiles,
                                       summarize)
from tpuq_dev.simulate.workers import AttemptRun, RunEnd
from tpuq_dev.simulate.workload import SimJob

H = 10 * 3600.0  # the horizon
C = WasteCause


def life(name, created, active, ended, chips=4, hosts=1, preempted=None) -> SliceLife:
    return SliceLife(name, "us-central2-b", "v4-8" if hosts == 1 else "v4-32", chips, hosts, created, active, ended,
                     preempted)


def run(job, node, started, ended, end, kept=0.0, lost=0.0, attempt=1, setup=30.0, chips=4) -> AttemptRun:
    return AttemptRun(job, attempt, node, chips, started, setup, 0.0, ends_at=ended or H + 1, ended_at=ended,
                      end=end, kept_seconds=kept, lost_seconds=lost)


def job(job_id, submit=0.0, priority="normal", work=3600.0) -> SimJob:
    return SimJob(job_id, submit, ("v4-8",), priority, work)


# Each case: slices, runs, and the seconds expected in each bucket (times the slices' chips: all 4 here).
CASES = {
    "a slice that never reached READY": (
        [life("a", 0, None, 1200)], [], {C.provisioning_for_nothing: 1200}),
    "a race loser that turned READY": (
        [life("a", 0, 600, 4200)], [], {C.losers_active: 4200}),
    "READY after the horizon is never READY": (
        [life("a", 0, H + 5, H)], [], {C.provisioning_for_nothing: H}),
    "one finished attempt, then idle until deleted": (
        [life("a", 0, 600, 6000)], [run("j1", "a", 1000, 1000 + 30 + 3600, RunEnd.finished, kept=3600)],
        {C.provisioning: 600, C.idle: 400 + 6000 - 4630, C.setup: 30, "useful": 3600}),
    "preempted: kept to the checkpoint, lost after it": (
        [life("a", 0, 600, 3000, preempted=2600)],
        [run("j1", "a", 600, 2600, RunEnd.preempted, kept=1800, lost=170)],
        {C.provisioning: 600, C.setup: 30, "useful": 1800, C.lost_to_preemption: 170, C.idle: 400}),
    "stopped during setup": (
        [life("a", 0, 600, 700)], [run("j1", "a", 600, 610, RunEnd.stopped)],
        {C.provisioning: 600, C.setup: 10, C.idle: 90}),
    "in progress at the horizon: its work so far is useful": (
        [life("a", 0, 600, H)], [run("j1", "a", 1000, None, None)],
        {C.provisioning: 600, C.idle: 400, C.setup: 30, "useful": H - 1030}),
    "two attempts in turn on one slice": (
        [life("a", 0, 600, 10000)],
        [run("j2", "a", 5000, 8000, RunEnd.finished, kept=2970),
         run("j1", "a", 1000, 4630, RunEnd.finished, kept=3600)],
        {C.provisioning: 600, C.idle: 400 + 370 + 2000, C.setup: 60, "useful": 6570}),
    "overlapping attempts never count a second twice": (
        [life("a", 0, 600, 5000)],
        [run("j1", "a", 1000, 4630, RunEnd.finished, kept=3600),
         run("j2", "a", 2000, 4000, RunEnd.stopped, lost=1970)],
        {C.provisioning: 600, C.idle: 400 + 370, C.setup: 30, "useful": 3600}),
}


@pytest.mark.parametrize("slices, runs, expect", CASES.values(), ids=CASES.keys())
def test_every_billed_second_is_useful_or_one_waste_cause(slices, runs, expect):
    m = summarize("p", [job("j1"), job("j2")], runs, slices, {}, {}, H)
    got = {"useful": m.useful_chip_hours, **{c: m.waste_chip_hours[c.value] for c in C}}
    assert got == pytest.approx({str(k.value if isinstance(k, C) else k): 0.0 for k in got} |
                                {(k.value if isinstance(k, C) else k): 4 * v / 3600 for k, v in expect.items()})
    assert m.useful_chip_hours + sum(m.waste_chip_hours.values()) == pytest.approx(m.billed_chip_hours)
    assert m.useful_vm_hours + sum(m.waste_vm_hours.values()) == pytest.approx(m.billed_vm_hours)


def test_sums_hold_over_a_mixed_fleet_and_vm_hours_count_hosts():
    slices = [life("small", 0, 600, H), life("pod", 100, 1300, 9000, chips=16, hosts=4), life("lost", 0, None, 900),
              life("loser", 0, 700, 2000, chips=16, hosts=4)]
    runs = [run("j1", "small", 1000, 4630, RunEnd.finished, kept=3600),
            run("j2", "pod", 1300, 5000, RunEnd.preempted, kept=1800, lost=1870, chips=16),
            run("j2", "pod", 5000, None, None, attempt=2, chips=16), run("j3", "elsewhere", 100, 200, RunEnd.stopped)]
    m = summarize("p", [job("j1"), job("j2", priority="high"), job("j3")], runs, slices, {}, {}, H)
    assert m.billed_chip_hours == pytest.approx((4 * H + 16 * 8900 + 4 * 900 + 16 * 2000) / 3600)
    assert m.billed_vm_hours == pytest.approx((H + 4 * 8900 + 900 + 4 * 2000) / 3600)
    assert m.useful_chip_hours + sum(m.waste_chip_hours.values()) == pytest.approx(m.billed_chip_hours)
    assert m.useful_vm_hours + sum(m.waste_vm_hours.values()) == pytest.approx(m.billed_vm_hours)
    assert m.waste_vm_hours[C.losers_active.value] == pytest.approx(4 * 2000 / 3600)
    assert m.wasted_vm_hours == pytest.approx(sum(m.waste_vm_hours.values()))
    assert m.utilization == pytest.approx(m.useful_chip_hours / m.billed_chip_hours)
    assert (m.slices, m.slices_never_ready, m.slices_never_used, m.runs_without_slice) == (4, 1, 1, 1)


def test_nothing_billed_has_no_utilization():
    m = summarize("p", [job("j1")], [], [], {"nodes.get": 2}, {}, H)
    assert m.utilization is None and m.billed_chip_hours == 0 and m.jobs.started == 0
    assert m.api_calls_total == 2


@pytest.mark.parametrize("values, p50, p95", [
    ([5.0], 5.0, 5.0),
    ([1.0, 2.0], 1.0, 2.0),
    (list(map(float, range(1, 21))), 10.0, 19.0),
    (list(map(float, range(100, 0, -1))), 50.0, 95.0),
])
def test_percentiles_are_nearest_rank(values, p50, p95):
    assert (nearest_rank(values, 0.5), nearest_rank(values, 0.95)) == (p50, p95)
    assert percentiles(values).max == max(values) and percentiles(values).count == len(values)
    assert percentiles([]).p50 is None


def test_waits_turnarounds_and_attempts_by_priority():
    jobs = [job("h1", 0, "high"), job("h2", 100, "high"), job("n1", 0), job("n2", 0), job("n3", 0),
            job("l1", 50, "low"), job("late", H + 1)]
    runs = [run("h1", "a", 10, 3640, RunEnd.finished, kept=3600),
            run("h2", "b", 400, 1000, RunEnd.preempted, lost=570), run("h2", "b", 2000, 5630, RunEnd.finished,
                                                                       kept=3600, attempt=2),
            run("n1", "c", 60, 3690, RunEnd.finished, kept=3600), run("n2", "d", 600, None, None),
            run("n3", "e", 1200, 4830, RunEnd.finished, kept=3600)]
    m = summarize("p", jobs, runs, [], {}, {}, H).jobs
    assert (m.submitted, m.started, m.finished) == (6, 5, 4)
    assert (m.wait["high"].p50, m.wait["high"].max, m.wait["high"].count) == (10, 300, 2)
    assert (m.wait["normal"].p50, m.wait["normal"].p95, m.wait["normal"].max) == (600, 1200, 1200)
    assert m.wait["low"].count == 0 and m.wait["low"].p50 is None
    assert (m.wait["all"].count, m.wait["all"].p50) == (5, 300)
    assert m.turnaround["high"].max == 5530 and m.turnaround["normal"].count == 2
    assert m.makespan_seconds == 5630
    assert (m.attempts_mean, m.attempts_max) == (6 / 5, 2)


def test_series_counts_slices_by_state_and_the_queue():
    slices = [life("a", 0, 1000, 9000)]
    runs = [run("j1", "a", 3000, 6000, RunEnd.finished, kept=2970)]
    jobs = [job("j1", 0), job("j2", 2000)]
    m = summarize("p", jobs, runs, slices, {}, {}, 10000.0, series_points=10)  # one point every 1000 s
    s = m.series
    assert s.t == [1000.0 * i for i in range(10)]
    assert s.provisioning == [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert s.busy == [0, 0, 0, 1, 1, 1, 0, 0, 0, 0]
    assert s.idle == [0, 1, 1, 0, 0, 0, 1, 1, 1, 0]  # the slice is gone at 9000
    assert s.queue == [1, 1, 2, 1, 1, 1, 1, 1, 1, 1]


def test_to_json_round_trips_and_can_leave_the_series_out():
    m = summarize("tpuq", [job("j1")], [], [life("a", 0, None, 100)], {"queuedResources.create": 1},
                  {"us-central2-b": 1}, H, series_points=5)
    data = json.loads(m.to_json())
    assert Metrics.model_validate(data) == m
    assert data["creates_per_zone"] == {"us-central2-b": 1} and len(data["series"]["t"]) == 5
    assert "series" not in json.loads(m.to_json(series=False))


class FakeBoundAttempt:
    def __init__(self, job_id, attempt, start, active_at, end, preempted, kept, lost, accel="v4-32", chips=16):
        self.job_id, self.attempt, self.zone, self.accelerator_type, self.chips = job_id, attempt, "z-a", accel, chips
        self.start, self.active_at, self.end, self.preempted = start, active_at, end, preempted
        self.kept_seconds, self.lost_seconds = kept, lost


def test_the_bounds_attempts_are_summarised_like_a_policys_records():
    attempts = [FakeBoundAttempt("j1", 0, 0, 600, 3000, True, 1800, 570),
                FakeBoundAttempt("j1", 1, 3000, 3600, 7230, False, 3600, 0),
                FakeBoundAttempt("j2", 0, H - 100, H + 500, H + 9000, False, 3600, 0)]
    runs, slices = bound_records(attempts, setup_seconds=30, horizon=H)
    m = summarize("bound", [job("j1", work=5400), job("j2")], runs, slices, {}, {}, H)
    assert m.useful_chip_hours == pytest.approx(16 * (1800 + 3600) / 3600)
    assert m.waste_chip_hours[C.idle.value] == pytest.approx(0)
    assert m.waste_chip_hours[C.provisioning_for_nothing.value] == pytest.approx(16 * 100 / 3600)
    assert m.waste_vm_hours[C.lost_to_preemption.value] == pytest.approx(4 * 570 / 3600)
    assert m.useful_chip_hours + sum(m.waste_chip_hours.values()) == pytest.approx(m.billed_chip_hours)
    assert (m.jobs.finished, m.jobs.started) == (1, 1)
