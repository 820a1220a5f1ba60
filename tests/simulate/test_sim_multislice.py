"""The simulator's tpuq policy on multislice jobs (issue 37): a gang is one queued resource of N slices, provisioned
all or none; one slice's preemption stops the attempt on every slice; utilization counts every slice's chips."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tpuq.contracts.fleet import FleetFile
from tpuq_dev.capacitymodel.scenario import parse_scenario
from tpuq_dev.simulate.metrics import summarize
from tpuq_dev.simulate.run import simulate
from tpuq_dev.simulate.workers import RunEnd
from tpuq_dev.simulate.workload import SimJob, parse_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "dev" / "tpuq_dev" / "simulate" / "examples"
ZONE = "europe-west4-b"
HORIZON = 8 * 3600.0
FLEET = FleetFile.model_validate({
    "name": "ms", "project": "p", "idle_timeout_seconds": 300,
    "tpus": [{"id": "v5e-16", "type": "v5litepod-16", "zones": [ZONE], "count": 4}]})  # one gang of 4 at a time
SCENARIO = {
    "seed": 3,
    "zones": {ZONE: {"quota": {"v5litepod": {"spot": 64}}}},
    "delays": {"accepted": 2, "waiting": 30, "provisioning": 300, "suspending": 30, "deleting": 60},
    # Slice 1 of the first gang only: the whole request is suspended, and the attempt stops on all four slices.
    "preemption": {"scripted": [{"node_id": "tpuq-r-ms-a-1-europe-west4-b-1", "after_active": 1800}]},
}
JOBS = [SimJob("ms-a", 0.0, ("v5litepod-16",), "normal", 3600.0, checkpoint_seconds=600.0, slices=4),
        SimJob("ms-b", 60.0, ("v5litepod-16",), "normal", 3600.0, checkpoint_seconds=600.0, slices=4)]


def test_multislice_jobs_run_as_gangs_of_one_queued_resource_and_count_every_slice():
    run = simulate("tpuq", fleet=FLEET, scenario=parse_scenario(SCENARIO), jobs=JOBS, horizon=HORIZON, seed=1,
                   tick_seconds=30.0)
    runs = run.workers.runs
    # Both jobs finish; ms-a after its first attempt was preempted (one slice of four) and resumed from a checkpoint.
    assert run.workers.done == {"ms-a", "ms-b"}
    first = runs[0]
    assert (first.job_id, first.attempt, first.end) == ("ms-a", 1, RunEnd.preempted)
    assert first.kept_seconds % 600.0 == 0 and 0 < first.kept_seconds < 1800.0 < first.ended_at  # last checkpoint
    assert first.lost_seconds > 0

    # Every attempt runs on the four slices of one queued resource, `<its id>-0` .. `-3`, its chips over all four.
    qrs_of_attempts = []
    for r in runs:
        assert len(r.all_nodes) == 4 and r.chips == 64, r
        prefixes = {n.rsplit("/", 1)[1].rsplit("-", 1)[0] for n in r.all_nodes}
        assert len(prefixes) == 1 and [n.rsplit("-", 1)[1] for n in r.all_nodes] == ["0", "1", "2", "3"]
        qrs_of_attempts.append(prefixes.pop())
    # A gang outlives its attempt (the next job may run on it, as on any slice): never more requests than attempts.
    assert len(runs) == 3 and len(set(qrs_of_attempts)) in (2, 3)

    # The call log: one create per queued resource (not one per slice), each of four nodes, and no other.
    created = {t.name for t in run.cloud.transitions if t.kind == "queued_resource" and t.state is not None}
    nodes = Counter(name.rsplit("/", 1)[1].rsplit("-", 1)[0]
                    for name in {t.name for t in run.cloud.transitions if t.kind == "node"})
    assert run.cloud.calls["queuedResources.create"] == len(created) == len(set(qrs_of_attempts))
    assert {qr.rsplit("/", 1)[1] for qr in created} == set(qrs_of_attempts) == set(nodes)
    assert set(nodes.values()) == {4}  # four nodes (slices) each
    assert len(run.slices) == 4 * len(created)
    # One slice's preemption: all four of that request's nodes PREEMPTED together (gang, all or none).
    preempted = {t.name for t in run.cloud.transitions if t.kind == "node" and t.state is not None
                 and t.state.value == "PREEMPTED"}
    assert preempted == set(first.all_nodes)

    # Utilization over every slice: useful chip-hours are the kept work times all 64 chips.
    m = summarize("tpuq", JOBS, runs, run.slices, run.cloud.calls, run.cloud.creates_per_zone, HORIZON)
    assert m.runs_without_slice == 0 and m.jobs.finished == 2
    assert abs(m.useful_chip_hours - sum(r.kept_seconds for r in runs) * 64 / 3600) < 1e-6
    assert m.useful_chip_hours >= 2 * 64.0  # both jobs' hour of work, on 64 chips each
    assert 0.5 < m.utilization < 1.0
    assert abs(m.billed_chip_hours - sum((min(s.ended_at, HORIZON) - s.created_at) * s.chips
                                         for s in run.slices) / 3600) < 1e-6


def test_a_workload_file_carries_slices_and_refuses_what_a_job_file_refuses():
    spec = parse_workload({"jobs": 2, "duration": {"dist": "fixed", "value": 60},
                           "types": [{"tpu": ["v5e-16"], "slices": [4, 2]}]})
    assert spec.types[0].slices == [4, 2] and spec.types[0].tpu == ["v5litepod-16"]
    from tpuq_dev.simulate.workload import WorkloadError, generate

    assert all(j.slices == (4, 2) and j.multislice for j in generate(spec, 0, 3600.0))
    for kind, reason in (({"tpu": ["v4-8", "v4-16"], "slices": 2}, "one TPU type"),
                         ({"tpu": ["v2-8"], "slices": 2}, "v4 or later")):
        try:
            parse_workload({"jobs": 1, "duration": {"dist": "fixed", "value": 60}, "types": [kind]})
        except WorkloadError as e:
            assert reason in str(e) and "workload.types[0]" in str(e)
        else:
            raise AssertionError(f"{kind} was accepted")


def test_compare_takes_two_workload_files_on_one_fleet_and_other_policies_say_they_do_not_model_gangs(capsys):
    """The documented example (docs/SIMULATING.md), a day of it: `--compare` of the two shapes of the same jobs."""
    from tpuq.cli import main

    files = ["--fleet", str(EXAMPLES / "multislice-fleet.yaml"), "--scenario", str(EXAMPLES / "multislice-scenario.yaml")]
    code = main(["simulate", "--compare", str(EXAMPLES / "multislice-4x16.yaml"), str(EXAMPLES / "multislice-1x64.yaml"),
                 *files, "--days", "1", "--json", "--policy", "tpuq", "--policy", "polling"])
    out, err = capsys.readouterr()
    assert code in (0, None), err
    data = json.loads(out)
    assert data["workloads"] == ["multislice-4x16.yaml", "multislice-1x64.yaml"]
    (pair,) = data["compare"]  # polling: a note, not figures
    assert "polling: does not model multislice jobs" in err
    gangs, whole = pair["results"]
    assert gangs["jobs"]["submitted"] == whole["jobs"]["submitted"] > 0  # the same jobs, seed and arrivals
    # Slices come four to a gang's request (a stocked-out request makes none), one to a v5litepod-64's.
    assert gangs["slices"] % 4 == 0 and 0 < gangs["slices"] <= 4 * gangs["api_calls"]["queuedResources.create"]
    assert 0 < whole["slices"] <= whole["api_calls"]["queuedResources.create"]
    assert gangs["useful_chip_hours"] > 0 and whole["useful_chip_hours"] > 0
