"""The workload file: one line per mistake, naming the field; generation is a function of the spec, seed and horizon."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tpuq.contracts.jobspec import JOB_ID_RE
from tpuq_dev.simulate.workload import (GeneratedWorkload, SimJob, TraceWorkload, WorkloadError, generate, load_workload,
                                        parse_workload)

DAY = 86400.0
TYPES = [{"tpu": ["v4-8"], "weight": 1}]
FIXED = {"dist": "fixed", "value": 600}


def generated(**fields) -> dict:
    return {"jobs": 10, "duration": FIXED, "types": TYPES, **fields}


@pytest.mark.parametrize("data, message", [
    (generated(duration={"dist": "lognormal", "median": 7200, "sigma": 0}), "workload.duration.sigma: must be > 0"),
    (generated(duration={"dist": "lognormal", "median": -1, "sigma": 1}), "workload.duration.median: must be > 0"),
    (generated(duration={"dist": "lognormal", "median": 1, "sigma": 1, "mu": 2}), "workload.duration.mu: unknown field"),
    (generated(duration={"dist": "gamma", "k": 2}),
     "workload.duration: must be one of lognormal, uniform, exponential, fixed"),
    (generated(duration={"median": 3}), "workload.duration: needs dist: (one of lognormal, uniform, exponential, fixed)"),
    (generated(duration={"dist": "uniform", "low": 50, "high": 10}), "workload.duration.high: must be > low (50)"),
    (generated(duration={"dist": "exponential"}), "workload.duration.mean: is required"),
    (generated(duration={"dist": "fixed", "value": 10, "max": 0}), "workload.duration.max: must be > 0"),
    (generated(jobs=0), "workload.jobs: must be > 0"),
    (generated(jobs="many"), "workload.jobs: must be a whole number"),
    (generated(arrivals={"rate_per_hour": 0}), "workload.arrivals.rate_per_hour: must be > 0"),
    (generated(arrivals={"every": 3}), "workload.arrivals: give rate_per_hour: (Poisson), bursts: [...], or leave "
                                       "arrivals out (uniform over the run)"),
    (generated(arrivals={"rate_per_hour": 1, "bursts": []}), "workload.arrivals: give either rate_per_hour or bursts, "
                                                             "not both"),
    (generated(arrivals={"bursts": [{"at_hours": -1, "count": 3}]}), "workload.arrivals.bursts[0].at_hours: must be >= 0"),
    (generated(arrivals={"bursts": [{"at_hours": 1, "count": 3}]}),
     "workload.jobs: 10 differs from the bursts' counts (3); give one of them"),
    ({"duration": FIXED, "types": TYPES}, "workload.jobs: is required (how many jobs to spread over the run)"),
    (generated(priority={"urgent": 1}), "workload.priority: unknown priority 'urgent'; expected low, normal, high"),
    (generated(priority={"low": 0}), "workload.priority: at least one priority needs a weight > 0"),
    (generated(types=[]), "workload.types: must not be empty"),
    (generated(types=[{"tpu": ["v9-8"], "weight": 1}]),
     "workload.types[0].tpu: unknown TPU type 'v9-8': expected e.g. v4-32, v5litepod-64 (or v5e-64), v6e-8"),
    (generated(types=[{"tpu": ["v4-8"], "weight": 0}]), "workload.types[0].weight: must be > 0"),
    (generated(types=[{"tpu": ["v4-8"], "weight": 1, "regions": ["us"]}]),
     "workload.types[0].regions: 'us' is not a region (expected e.g. us-central2)"),
    (generated(checkpoint_every=0), "workload.checkpoint_every: must be > 0"),
    (generated(seed=3), "workload.seed: unknown field"),
    ({"trace": "t.jsonl", "jobs": 3}, "workload.jobs: unknown field"),
    ([1, 2], "workload: expected a mapping with jobs:, duration:, types: ... or trace:"),
])
def test_a_bad_workload_is_one_line_naming_the_field(data, message):
    with pytest.raises(WorkloadError) as caught:
        parse_workload(data)
    assert str(caught.value) == message


def write_trace(tmp_path, lines: list) -> None:
    (tmp_path / "jobs.jsonl").write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    (tmp_path / "w.yaml").write_text("trace: jobs.jsonl\n")


GOOD = {"id": "a", "submit_at": 10, "tpu": ["v4-8"], "priority": "high", "work_seconds": 60}


@pytest.mark.parametrize("lines, message", [
    (["{not json"], "workload.trace (jobs.jsonl line 1): not JSON: Expecting property name enclosed in double quotes"),
    ([GOOD, {**GOOD, "id": "Bad_Id"}], "workload.trace (jobs.jsonl line 2).id: must be 1-63 lowercase letters, "
                                       "digits or '-', starting with a letter or digit"),
    ([GOOD, GOOD], "workload.trace (jobs.jsonl line 2).id: 'a' is given twice"),
    ([{**GOOD, "work_seconds": 0}], "workload.trace (jobs.jsonl line 1).work_seconds: must be > 0"),
    ([{**GOOD, "priority": "urgent"}], "workload.trace (jobs.jsonl line 1).priority: must be one of low, normal or "
                                       "high"),
    ([{**GOOD, "zone": "x"}], "workload.trace (jobs.jsonl line 1).zone: unknown field"),
    ([{k: v for k, v in GOOD.items() if k != "tpu"}], "workload.trace (jobs.jsonl line 1).tpu: is required"),
])
def test_a_bad_trace_line_is_one_line_naming_line_and_field(tmp_path, lines, message):
    write_trace(tmp_path, lines)
    with pytest.raises(WorkloadError) as caught:
        load_workload(tmp_path / "w.yaml")
    assert str(caught.value) == message


def test_a_trace_is_read_relative_to_the_workload_file_and_cut_at_the_horizon(tmp_path, monkeypatch):
    write_trace(tmp_path, [
        {**GOOD, "id": "late", "submit_at": 2 * DAY},
        {"id": "b", "submit_at": 5, "tpu": "v5e-64", "work_seconds": 30, "checkpoint_seconds": 10,
         "regions": ["europe-west4"]},
        "",
        GOOD,
    ])
    monkeypatch.chdir("/")
    spec = load_workload(tmp_path / "w.yaml")
    assert isinstance(spec, TraceWorkload)
    assert generate(spec, seed=1, horizon_seconds=DAY) == [
        SimJob("b", 5, ("v5litepod-64",), "normal", 30, 10, ("europe-west4",)),
        SimJob("a", 10, ("v4-8",), "high", 60),
    ]


def test_a_missing_trace_file_says_so(tmp_path):
    (tmp_path / "w.yaml").write_text("trace: gone.jsonl\n")
    with pytest.raises(WorkloadError, match=r"^workload.trace: cannot read .*gone.jsonl: No such file"):
        load_workload(tmp_path / "w.yaml")


MIX = generated(
    jobs=4000, duration={"dist": "lognormal", "median": 7200, "sigma": 1.0, "max": 86400},
    priority={"high": 0.1, "normal": 0.7, "low": 0.2},
    types=[{"tpu": ["v4-8"], "weight": 0.6, "regions": ["us-central2"]}, {"tpu": "v5e-8", "weight": 0.2},
           {"tpu": ["v4-32", "v5litepod-64"], "weight": 0.2}],
    checkpoint_every=1800)


def test_generation_is_deterministic_for_a_seed_and_differs_between_seeds():
    spec = parse_workload(MIX)
    first = generate(spec, seed=7, horizon_seconds=30 * DAY)
    assert first == generate(parse_workload(MIX), seed=7, horizon_seconds=30 * DAY)
    assert first != generate(spec, seed=8, horizon_seconds=30 * DAY)


def test_generated_jobs_follow_the_mix():
    jobs = generate(parse_workload(MIX), seed=3, horizon_seconds=30 * DAY)
    assert len(jobs) == 4000
    assert all(JOB_ID_RE.match(j.job_id) for j in jobs) and len({j.job_id for j in jobs}) == 4000
    assert [j.submit_at for j in jobs] == sorted(j.submit_at for j in jobs)
    assert all(0 <= j.submit_at < 30 * DAY for j in jobs)
    priorities = Counter(j.priority for j in jobs)
    for name, share in {"high": 0.1, "normal": 0.7, "low": 0.2}.items():
        assert abs(priorities[name] / 4000 - share) < 0.03, priorities
    types = Counter(j.types for j in jobs)
    assert abs(types[("v4-8",)] / 4000 - 0.6) < 0.03 and abs(types[("v4-32", "v5litepod-64")] / 4000 - 0.2) < 0.03
    assert {j.regions for j in jobs if j.types == ("v4-8",)} == {("us-central2",)}
    assert {j.regions for j in jobs if j.types != ("v4-8",)} == {None}
    works = sorted(j.work_seconds for j in jobs)
    assert 6000 < works[2000] < 8500 and works[-1] <= 86400  # the median, and the cap
    assert {j.checkpoint_seconds for j in jobs} == {1800}


@pytest.mark.parametrize("arrivals, horizon, expect", [
    ({"bursts": [{"at_hours": 1, "count": 3}, {"at_hours": 0.5, "count": 2}, {"at_hours": 30, "count": 4}]}, DAY,
     [1800.0] * 2 + [3600.0] * 3),  # the burst after the horizon is not submitted
    (None, DAY, None),  # uniform: 10 jobs over the day
])
def test_arrivals(arrivals, horizon, expect):
    fields = {"arrivals": arrivals} if arrivals else {}
    if arrivals and "bursts" in arrivals:
        fields["jobs"] = None
    spec = parse_workload({k: v for k, v in generated(**fields).items() if v is not None})
    times = [j.submit_at for j in generate(spec, seed=1, horizon_seconds=horizon)]
    if expect is not None:
        assert times == expect
    else:
        assert len(times) == 10 and all(0 <= t < horizon for t in times)


def test_poisson_arrivals_come_at_the_rate_until_the_horizon_or_the_count():
    spec = parse_workload({"arrivals": {"rate_per_hour": 10}, "duration": FIXED, "types": TYPES})
    assert isinstance(spec, GeneratedWorkload)
    count = len(generate(spec, seed=5, horizon_seconds=10 * DAY))
    assert 2200 < count < 2600  # 2400 expected
    capped = parse_workload(generated(jobs=50, arrivals={"rate_per_hour": 10}))
    jobs = generate(capped, seed=5, horizon_seconds=10 * DAY)
    assert len(jobs) == 50 and jobs[-1].submit_at < 12 * 3600


def test_a_type_without_a_weight_weighs_one():
    spec = parse_workload(generated(jobs=2000, types=[{"tpu": ["v4-8"]}, {"tpu": ["v4-32"], "weight": 3}]))
    assert [t.weight for t in spec.types] == [1.0, 3.0]
    counts = Counter(j.types for j in generate(spec, seed=0, horizon_seconds=DAY))
    assert 0.2 < counts[("v4-8",)] / 2000 < 0.3


def test_a_trace_file_is_a_workload_of_its_own(tmp_path, monkeypatch):
    write_trace(tmp_path, [GOOD])
    monkeypatch.chdir("/")
    spec = load_workload(tmp_path / "jobs.jsonl")
    assert generate(spec, seed=0, horizon_seconds=DAY) == [SimJob("a", 10, ("v4-8",), "high", 60)]


def test_a_workload_that_is_not_yaml_says_where_and_why(tmp_path):
    (tmp_path / "w.yaml").write_text("jobs: 3\n  arrivals: [\n")
    with pytest.raises(WorkloadError) as caught:
        load_workload(tmp_path / "w.yaml")
    assert str(caught.value) == f"workload {tmp_path / 'w.yaml'}: not valid YAML at line 2, column 11: " \
                                "mapping values are not allowed here"
