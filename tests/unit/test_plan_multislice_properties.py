"""Properties of `plan()` on random mixed queues (single and multislice jobs), checked by brute force.

For every plan: each gang is of one type in one zone, a count the job listed, and never a TPU some job names; no TPU
is used twice; every match is compatible. And the greedy rule holds: a job left unmatched could not have been added
to the jobs matched before it in scheduling order, keeping each earlier gang where it is and rearranging the
earlier single jobs in any way; and an elastic job got the largest listed count it could (Kuhn's search on
individual TPUs, written here independently of the matcher).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuq.contracts.jobspec import Priority
from tpuq.scheduler.plan import IdleTpu, PendingJob, plan, scheduling_order

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
TYPES = ["v4-32", "v5litepod-16"]
ZONES = ["us-central2-b", "us-central2-f", "us-west4-a"]


def fits(job: PendingJob, tpu: IdleTpu) -> bool:
    return (tpu.type in job.types and (job.zone is None or job.zone == tpu.zone)
            and (job.tpu_name is None or job.tpu_name == tpu.name))


def singles_fit(singles: list[PendingJob], tpus: list[IdleTpu]) -> bool:
    owner: dict[str, PendingJob] = {}

    def place(job: PendingJob, seen: set[str]) -> bool:
        for t in tpus:
            if t.name not in seen and fits(job, t):
                seen.add(t.name)
                if t.name not in owner or place(owner[t.name], seen):
                    owner[t.name] = job
                    return True
        return False

    return all(place(j, set()) for j in singles)


def could_add(job: PendingJob, singles: list[PendingJob], tpus: list[IdleTpu], named: set[str]) -> bool:
    """Could `job` join `singles` on `tpus` (the TPUs earlier gangs left)?"""
    if not job.multislice:
        return singles_fit([*singles, job], tpus)
    for n in job.slices:
        if n == 1:
            if singles_fit([*singles, job], tpus):
                return True
            continue
        groups: dict[tuple[str, str], list[IdleTpu]] = {}
        for t in tpus:
            if t.name not in named and fits(job, t):
                groups.setdefault((t.type, t.zone), []).append(t)
        for members in groups.values():
            for gang in combinations(members, n):
                taken = {t.name for t in gang}
                if singles_fit(singles, [t for t in tpus if t.name not in taken]):
                    return True
    return False


@st.composite
def scenarios(draw):
    tpus = [IdleTpu(f"t{i}", draw(st.sampled_from(TYPES)), draw(st.sampled_from(ZONES)))
            for i in range(draw(st.integers(0, 8)))]
    jobs = []
    for i in range(draw(st.integers(0, 7))):
        kind = draw(st.sampled_from(["single", "single", "gang", "elastic"]))
        types = tuple(draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=2, unique=True)))
        kw = {}
        if kind == "gang":
            kw["slices"] = (draw(st.integers(2, 4)),)
            types = types[:1]
        elif kind == "elastic":
            kw["slices"] = tuple(sorted(draw(st.lists(st.integers(1, 4), min_size=2, max_size=3, unique=True)),
                                        reverse=True))
            types = types[:1]
        elif tpus and draw(st.booleans()) and draw(st.booleans()):
            kw["tpu_name"] = draw(st.sampled_from([t.name for t in tpus]))
        jobs.append(PendingJob(f"j{i}", draw(st.sampled_from(list(Priority))), types,
                               NOW - timedelta(seconds=draw(st.integers(0, 3))),
                               zone=draw(st.none() | st.none() | st.sampled_from(ZONES)), **kw))
    return jobs, tpus


@given(scenarios())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mixed_queue_plans_are_valid_and_greedy_in_scheduling_order(scenario):
    jobs, tpus = scenario
    result = plan(jobs, tpus, None, NOW)
    by_name = {t.name: t for t in tpus}
    by_id = {j.job_id: j for j in jobs}
    named = {j.tpu_name for j in jobs if j.tpu_name}
    used = [n for m in result.matches for n in m.nodes]
    assert len(used) == len(set(used))
    for m in result.matches:
        j, gang = by_id[m.job_id], [by_name[n] for n in m.nodes]
        assert all(fits(j, t) for t in gang)
        assert len(gang) in j.slices
        if len(gang) > 1:
            assert len({(t.type, t.zone) for t in gang}) == 1 and not named & set(m.nodes)

    matched = {m.job_id: m for m in result.matches}
    earlier_singles: list[PendingJob] = []
    free = list(tpus)
    for j in scheduling_order(jobs, None):
        if j.job_id in matched:
            m = matched[j.job_id]
            for larger in (k for k in j.slices if k > len(m.nodes)):  # elastic: the largest count it could get
                assert not could_add(replace(j, slices=(larger,)), earlier_singles, free, named), j.job_id
            if m.tpu_names:
                free = [t for t in free if t.name not in m.tpu_names]
            else:
                earlier_singles.append(j)
        elif j.job_id in result.unmatched_job_ids:
            assert not could_add(j, earlier_singles, free, named), f"{j.job_id} was passed over"
