"""Properties of `plan()` on small random cases, checked against a plain reference.

The reference matcher below works on individual TPUs (no classes, no pruning):
it takes the jobs in scheduling order and runs Kuhn's augmenting-path search
for each, keeping every job it already matched. Its compatibility predicate is
written here, independently of `tpuq.scheduler.plan.compatible`.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.jobspec import Priority
from tpuq.scheduler.plan import IdleTpu, PendingJob, plan, scheduling_order

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
TYPES = ["v4-8", "v5litepod-8", "v6e-8"]
ZONES = ["us-central2-b", "us-west4-a", "europe-west4-a", "europe-west4-b"]
REGIONS = ["us-central2", "us-west4", "europe-west4"]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def region_of(zone: str) -> str:
    return zone[: zone.rindex("-")]


def reference_compatible(job: PendingJob, tpu: IdleTpu) -> bool:
    region = region_of(tpu.zone)
    if tpu.type not in job.types:
        return False
    if job.zone and job.zone != tpu.zone:
        return False
    if job.tpu_name and job.tpu_name != tpu.name:
        return False
    if job.regions and region not in job.regions:
        return False
    return not (job.pinned_region and job.pinned_region != region)


def reference_matching(ordered_jobs: list[PendingJob], tpus: list[IdleTpu]) -> dict[str, str]:
    """Kuhn's algorithm on individual TPUs, jobs in the given order: job id -> TPU name."""
    owner: dict[str, PendingJob] = {}  # tpu name -> job

    def try_place(job: PendingJob, seen: set[str]) -> bool:
        for tpu in tpus:
            if tpu.name in seen or not reference_compatible(job, tpu):
                continue
            seen.add(tpu.name)
            if tpu.name not in owner or try_place(owner[tpu.name], seen):
                owner[tpu.name] = job
                return True
        return False

    for job in ordered_jobs:
        try_place(job, set())
    return {job.job_id: name for name, job in owner.items()}


@st.composite
def scenarios(draw):
    n_tpus = draw(st.integers(0, 7))
    tpus = [
        IdleTpu(f"t{i}", draw(st.sampled_from(TYPES)), draw(st.sampled_from(ZONES))) for i in range(n_tpus)
    ]
    names = [t.name for t in tpus] + ["t-missing"]
    jobs = []
    for i in range(draw(st.integers(0, 9))):
        jobs.append(
            PendingJob(
                job_id=f"j{i}",
                priority=draw(st.sampled_from(list(Priority))),
                types=tuple(draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True))),
                submit_time=NOW - timedelta(seconds=draw(st.integers(0, 3))),
                zone=draw(st.none() | st.sampled_from(ZONES)),
                tpu_name=draw(st.none() | st.none() | st.sampled_from(names)),
                regions=frozenset(draw(st.lists(st.sampled_from(REGIONS), max_size=2))),
                pinned_region=draw(st.none() | st.none() | st.sampled_from(REGIONS)),
                not_before=draw(st.none() | st.none() | st.integers(-5, 5).map(lambda s: NOW + timedelta(seconds=s))),
            )
        )
    fleet = None
    if draw(st.booleans()):
        entries = [
            {
                "id": f"e{i}",
                "type": draw(st.sampled_from(TYPES)),
                "zones": draw(st.lists(st.sampled_from(ZONES), min_size=1, max_size=2, unique=True)),
                "count": draw(st.integers(0, 4)),
            }
            for i in range(draw(st.integers(1, 4)))
        ]
        fleet = FleetFile(name="prop", project="p", tpus=entries)
    return jobs, tpus, fleet


@SETTINGS
@given(scenarios())
def test_every_match_is_compatible_and_nothing_is_used_twice(case):
    jobs, tpus, fleet = case
    result = plan(jobs, tpus, fleet, NOW)
    by_id = {j.job_id: j for j in jobs}
    by_name = {t.name: t for t in tpus}
    for m in result.matches:
        assert reference_compatible(by_id[m.job_id], by_name[m.tpu_name])
        assert by_id[m.job_id].not_before is None or by_id[m.job_id].not_before <= NOW
        assert (m.tpu_type, m.zone, m.region) == (by_name[m.tpu_name].type, by_name[m.tpu_name].zone, region_of(m.zone))
    assert len({m.tpu_name for m in result.matches}) == len(result.matches)
    assert len({m.job_id for m in result.matches}) == len(result.matches)
    # Every job lands in exactly one bucket of the plan.
    every = [m.job_id for m in result.matches] + list(result.unmatched_job_ids) + list(result.deferred_job_ids)
    assert sorted(every) == sorted(by_id)
    assert set(result.deferred_job_ids) == {j.job_id for j in jobs if j.not_before and j.not_before > NOW}


@SETTINGS
@given(scenarios())
def test_no_earlier_job_waits_while_a_later_one_holds_a_tpu_it_could_use(case):
    jobs, tpus, fleet = case
    result = plan(jobs, tpus, fleet, NOW)
    position = {j.job_id: i for i, j in enumerate(scheduling_order(jobs, fleet))}
    by_id = {j.job_id: j for j in jobs}
    by_name = {t.name: t for t in tpus}
    for waiting_id in result.unmatched_job_ids:
        waiting = by_id[waiting_id]
        for m in result.matches:
            if reference_compatible(waiting, by_name[m.tpu_name]):
                assert position[m.job_id] < position[waiting_id]
                # In particular never a lower priority job on a TPU a higher priority job could use.
                assert by_id[m.job_id].priority.rank >= waiting.priority.rank


@SETTINGS
@given(scenarios())
def test_matched_jobs_equal_the_in_order_maximum_matching_of_the_reference(case):
    jobs, tpus, fleet = case
    result = plan(jobs, tpus, fleet, NOW)
    eligible = [j for j in scheduling_order(jobs, fleet) if j.not_before is None or j.not_before <= NOW]
    expected = reference_matching(eligible, tpus)
    # The in-order greedy of a matroid has one answer: the same jobs, not only as many.
    assert {m.job_id for m in result.matches} == set(expected)
    # And it is a maximum matching: no order can run more jobs.
    assert len(result.matches) == len(reference_matching(sorted(eligible, key=lambda j: j.job_id), tpus))


@SETTINGS
@given(scenarios())
def test_plan_is_deterministic_and_ignores_input_order(case):
    jobs, tpus, fleet = case
    first = plan(jobs, tpus, fleet, NOW)
    again = plan(list(reversed(jobs)), list(reversed(tpus)), fleet, NOW)
    assert first == again


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_larger_cases_with_many_twins_match_the_reference(data):
    # Few distinct constraints, many jobs and TPUs: exercises class counts and long augmenting paths.
    n_tpus = data.draw(st.integers(5, 25))
    tpus = [
        IdleTpu(f"t{i:02d}", data.draw(st.sampled_from(TYPES)), data.draw(st.sampled_from(ZONES)))
        for i in range(n_tpus)
    ]
    type_list = st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True)
    type_sets = data.draw(st.lists(type_list, min_size=1, max_size=4))
    jobs = [
        PendingJob(
            f"j{i:02d}",
            data.draw(st.sampled_from(list(Priority))),
            tuple(data.draw(st.sampled_from(type_sets))),
            NOW,
            zone=data.draw(st.none() | st.sampled_from(ZONES[:2])),
        )
        for i in range(data.draw(st.integers(5, 35)))
    ]
    result = plan(jobs, tpus, None, NOW)
    expected = reference_matching(scheduling_order(jobs, None), tpus)
    assert {m.job_id for m in result.matches} == set(expected)
