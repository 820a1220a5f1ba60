"""The offline bound (tpuq_dev.simulate.bound): hand-checkable cases, then a month of 2,000 jobs."""

from __future__ import annotations

import random
import time

import pytest

from tpuq_dev.capacitymodel.scenario import parse_scenario, stockout_windows
from tpuq.contracts.fleet import FleetFile
from tpuq_dev.simulate.bound import compute_bound
from tpuq_dev.simulate.workload import SimJob

Z, Z2, Z3 = "us-central2-b", "europe-west4-a", "us-east1-d"
HOUR, DAY = 3600.0, 86400.0


def scenario(**extra):
    data = {"seed": 5, "zones": {Z: {"quota": {"v4": {"spot": 64}}}}, "delays": {"provisioning": 600}}
    data.update(extra)
    return parse_scenario(data)


def fleet(*entries):
    return FleetFile.model_validate({"name": "f", "project": "p", "tpus": list(entries) or [
        {"id": "v4", "type": "v4-8", "zones": [Z], "count": 10}]})


def job(i, submit=0.0, work=HOUR, types=("v4-8",), priority="normal", ckpt=None, regions=None):
    return SimJob(f"j{i}", submit, tuple(types), priority, work, ckpt, regions)


def test_always_in_stock_bills_work_plus_one_provisioning_per_job():
    jobs = [job(i, submit=i * 100.0) for i in range(3)]
    r = compute_bound(scenario(), fleet(), jobs, 10 * DAY)
    chips = 4  # v4-8
    assert r.jobs_finished == 3 and r.jobs_started == 3
    assert r.useful_chip_hours == pytest.approx(3 * chips * 1.0)
    assert r.billed_chip_hours == pytest.approx(3 * chips * (HOUR + 600) / HOUR)
    assert r.utilization == pytest.approx(HOUR / (HOUR + 600))
    assert r.provisioning_chip_hours == pytest.approx(3 * chips * 600 / HOUR)
    assert r.wait_p50 == r.wait_p95 == r.wait_max == {"normal": 600}
    assert r.makespan == 200 + 600 + HOUR
    assert [a.start for a in r.attempts] == [0, 100, 200]


def test_setup_is_billed_and_delays_the_work():
    r = compute_bound(scenario(), fleet(), [job(0)], DAY, setup_seconds=30)
    assert r.billed_chip_hours == pytest.approx(4 * (HOUR + 630) / HOUR)
    assert r.wait_max == {"normal": 630}


def test_a_stockout_window_delays_placement_to_its_end_and_another_zone_wins_if_sooner():
    s = scenario(zones={Z: {"quota": {"v4": {"spot": 64}}, "stockouts": [{"start": 0, "end": 5000}]},
                        Z2: {"quota": {"v4": {"spot": 64}}, "stockouts": [{"start": 0, "end": 3000, "effect": "wait"}]}})
    alone = compute_bound(s, fleet(), [job(0, submit=10)], DAY)
    assert alone.attempts[0].start == 5000 and alone.wait_max == {"normal": 5000 - 10 + 600}
    both = compute_bound(s, fleet({"id": "v4", "type": "v4-8", "zones": [Z, Z2]}), [job(0, submit=10)], DAY)
    assert (both.attempts[0].zone, both.attempts[0].start) == (Z2, 3000)
    # Regions narrow the candidates: only us-central2 allowed.
    narrowed = compute_bound(s, fleet({"id": "v4", "type": "v4-8", "zones": [Z, Z2]}),
                             [job(0, submit=10, regions=("us-central2",))], DAY)
    assert narrowed.attempts[0].zone == Z


def test_generated_stockout_windows_are_the_ones_the_model_sees():
    s = scenario(zones={Z: {"quota": {"v4": {"spot": 64}},
                            "stockout_model": {"v4": {"fraction": 0.5, "mean_window": HOUR}}}})
    window = next(w for w in stockout_windows(s, Z, "v4", 30 * DAY) if w.end - w.start > 60)
    r = compute_bound(s, fleet(), [job(0, submit=window.start + 1)], 60 * DAY)
    assert r.attempts[0].start == window.end


def test_quota_forces_serialization():
    s = scenario(zones={Z: {"quota": {"v4": {"spot": 4}}}})  # one v4-8 at a time
    r = compute_bound(s, fleet(), [job(i) for i in range(3)], DAY)
    slot = HOUR + 600
    assert [a.start for a in r.attempts] == [0, slot, 2 * slot]
    assert r.wait_max == {"normal": 2 * slot + 600} and r.wait_p50 == {"normal": slot + 600}


def test_the_entry_count_serializes_too_and_priority_goes_first():
    jobs = [job(0, submit=0), job(1, submit=0, priority="high"), job(2, submit=50, priority="low")]
    r = compute_bound(scenario(), fleet({"id": "v4", "type": "v4-8", "zones": [Z], "count": 1}), jobs, DAY)
    slot = HOUR + 600
    assert [(a.job_id, a.start) for a in r.attempts] == [("j1", 0), ("j0", slot), ("j2", 2 * slot)]
    assert set(r.wait_max) == {"high", "normal", "low"}


def test_a_lower_priority_job_fills_a_gap_before_a_placed_one():
    s = scenario(zones={Z: {"quota": {"v4": {"spot": 4}}}})
    jobs = [job(0, submit=10 * HOUR, priority="high"), job(1, submit=0, work=HOUR, priority="low"),
            job(2, submit=0, work=20 * HOUR, priority="low")]
    r = compute_bound(s, fleet(), jobs, 3 * DAY)
    starts = {a.job_id: a.start for a in r.attempts}
    assert starts["j0"] == 10 * HOUR and starts["j1"] == 0  # fits before j0
    assert starts["j2"] == 10 * HOUR + HOUR + 600  # too long for the gap: after j0


def test_a_preemption_loses_the_work_since_the_last_checkpoint_and_the_job_is_placed_again_at_once():
    s = scenario(preemption={"scripted": [{"at": 600 + 2500}]})  # every node READY then is preempted at 3100
    r = compute_bound(s, fleet(), [job(0, work=HOUR, ckpt=1000)], DAY)
    first, second = r.attempts
    assert first.preempted and first.end == 3100 and first.kept_seconds == 2000 and first.lost_seconds == 500
    assert second.start == 3100 and not second.preempted
    assert second.end == 3100 + 600 + (HOUR - 2000)
    assert r.useful_chip_hours == pytest.approx(4 * 1.0)
    assert r.lost_chip_hours == pytest.approx(4 * 500 / HOUR)
    assert r.billed_chip_hours == pytest.approx(4 * (3100 + 600 + HOUR - 2000) / HOUR)
    without = compute_bound(s, fleet(), [job(0, work=HOUR)], DAY)
    assert without.attempts[0].kept_seconds == 0 and without.attempts[0].lost_seconds == 2500
    assert without.attempts[1].end == 3100 + 600 + HOUR


def test_drawn_lifetimes_are_the_model_s_for_the_derived_node_name():
    s = scenario(preemption={"lifetimes": [{"zone": Z, "mean": 1800}]})
    r = compute_bound(s, fleet(), [job(0, work=2 * HOUR, ckpt=60)], 10 * DAY)
    for a in r.attempts:
        lifetime = s.spot_lifetime(Z, "v4", f"projects/p/locations/{Z}/nodes/bound-j0-{a.attempt}")
        if a.preempted:
            assert a.end == pytest.approx(a.active_at + lifetime)
        else:
            assert a.active_at + lifetime >= a.end
    assert len(r.attempts) > 1 and r.jobs_finished == 1
    on_demand = fleet({"id": "v4", "type": "v4-8", "zones": [Z], "provisioning_model": "on_demand"})
    s_od = scenario(zones={Z: {"quota": {"v4": {"on_demand": 8}}}}, preemption={"mean_spot_lifetime": 60})
    assert len(compute_bound(s_od, on_demand, [job(0, work=2 * HOUR)], DAY).attempts) == 1


def test_nothing_is_placed_past_the_horizon_and_figures_are_cut_there():
    r = compute_bound(scenario(), fleet(), [job(0, work=10 * HOUR), job(1, submit=2 * DAY)], DAY)
    assert r.jobs_finished == 1 and r.jobs_started == 1 and len(r.attempts) == 1
    done = compute_bound(scenario(), fleet(), [job(0, work=10 * HOUR)], 5 * HOUR)
    assert done.jobs_finished == 0
    assert done.billed_chip_hours == pytest.approx(4 * 5.0)
    assert done.useful_chip_hours == pytest.approx(4 * (5 * HOUR - 600) / HOUR)


def test_a_type_the_fleet_does_not_offer_is_never_placed_and_a_bad_priority_is_named():
    r = compute_bound(scenario(), fleet(), [job(0, types=("v6e-8",))], DAY)
    assert r.attempts == () and r.jobs_started == 0 and r.utilization == 0
    with pytest.raises(ValueError, match="job j0: unknown priority 'urgent'"):
        compute_bound(scenario(), fleet(), [job(0, priority="urgent")], DAY)


def test_a_month_of_two_thousand_jobs_is_cheap_and_deterministic():
    s = parse_scenario({
        "seed": 3,
        "zones": {
            Z: {"quota": {"v4": {"spot": 256}}, "stockout_model": {"v4": {"fraction": 0.3, "mean_window": 7200}}},
            Z2: {"quota": {"v5litepod": {"spot": 64}}, "stockout_model": {"v5litepod": {"fraction": 0.4, "mean_window": 3 * HOUR}}},
            Z3: {"quota": {"v6e": {"spot": 64}}, "stockout_model": {"v6e": {"fraction": 0.5, "mean_window": 4 * HOUR}}},
        },
        "delays": {"provisioning": {"dist": "lognormal", "median": 600, "sigma": 0.5}},
        "preemption": {"lifetimes": [{"family": "v4", "mean": 12 * HOUR}, {"mean": 6 * HOUR}]},
    })
    f = fleet({"id": "v4", "type": "v4-8", "zones": [Z], "count": 40},
              {"id": "v4big", "type": "v4-32", "zones": [Z], "count": 4},
              {"id": "v5e", "type": "v5litepod-64", "zones": [Z2], "count": 1},
              {"id": "v6e", "type": "v6e-64", "zones": [Z3], "count": 1})
    rng = random.Random(1)
    kinds = [("v4-8",)] * 10 + [("v4-8", "v4-32")] * 6 + [("v5litepod-64",), ("v6e-64",)] * 1 + [("v5litepod-64", "v6e-64")] * 2
    jobs = [SimJob(f"j{i}", rng.uniform(0, 28 * DAY), rng.choice(kinds), rng.choice(["low", "normal", "high"]),
                   rng.expovariate(1 / (2 * HOUR)), rng.choice([None, 600.0, 1800.0])) for i in range(2000)]
    started = time.process_time()
    r = compute_bound(s, f, jobs, 30 * DAY)
    spent = time.process_time() - started
    assert r.jobs_finished > 1800 and 0.5 < r.utilization < 1
    assert r == compute_bound(s, f, list(reversed(jobs)), 30 * DAY)  # input order does not matter
    print(f"bound: 2000 jobs / 30 days in {spent:.2f} s CPU, utilization {r.utilization:.3f}, "
          f"{len(r.attempts)} attempts, {r.jobs_finished} finished")
    assert spent < 30  # generous: the machine is shared; it takes about a second
