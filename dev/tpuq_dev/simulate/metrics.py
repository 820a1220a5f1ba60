"""What a run achieved, from its records alone: utilization, waste by cause, waits, API calls, and time series.

Pure functions over the records of one run: the slices' lives (`SliceLife`, from the capacity model's transition
record), the attempts (`workers.AttemptRun`), the jobs, the cloud's call counts and the horizon.

Every second of every slice's life (created, i.e. PROVISIONING began, to removed or the horizon) is billed and
falls in exactly one bucket, so useful + the waste causes = billed, in chip-hours and in VM-hours (hosts x hours):

- useful: work an attempt kept (finished work, work up to the last checkpoint of a stopped attempt, and work in
  progress at the horizon);
- provisioning_for_nothing: the whole life of a slice that never reached READY;
- losers_active: the whole life of a slice that reached READY and never ran an attempt (a race loser, or a
  slice kept warm for no one);
- provisioning: PROVISIONING time of the slices that were used (what any policy pays);
- setup: attempts' setup before their work;
- lost_to_preemption: work a stop threw away (after the last checkpoint; all of it without checkpoints);
- idle: READY time of a used slice with no attempt running.

An attempt's time on its slice is cut to the slice's READY window, and two attempts on one slice never count the
same second twice (the earlier one keeps it). A multislice attempt counts on each of its slices (`AttemptRun.nodes`),
so its useful time is counted over every slice's chips. Waits are nearest-rank percentiles, as the bound computes them.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel

from tpuq.contracts.jobspec import Priority

from .workers import AttemptRun, RunEnd
from .workload import SimJob

HOUR = 3600.0
SERIES_POINTS = 500


class WasteCause(str, Enum):
    losers_active = "losers_active"
    provisioning_for_nothing = "provisioning_for_nothing"
    idle = "idle"
    lost_to_preemption = "lost_to_preemption"
    setup = "setup"
    provisioning = "provisioning"


class SliceState(str, Enum):
    """A slice's state in the time series."""

    provisioning = "provisioning"
    busy = "busy"
    idle = "idle"


@dataclass(frozen=True)
class SliceLife:
    name: str  # the node's full name, as AttemptRun.node gives it
    zone: str
    accelerator_type: str  # the API name, e.g. v5litepod-64
    chips: int
    hosts: int
    created_at: float  # the node's creation: PROVISIONING began
    active_at: float | None  # READY; None: never
    ended_at: float  # removed, or the horizon if still there
    preempted_at: float | None = None


# -- the figures ---------------------------------------------------------------------------------


class Percentiles(BaseModel):
    count: int = 0
    p50: float | None = None  # seconds
    p95: float | None = None
    max: float | None = None


class JobMetrics(BaseModel):
    submitted: int
    started: int
    finished: int
    wait: dict[str, Percentiles]  # "all" and each priority: first attempt's start - submit, over started jobs
    turnaround: dict[str, Percentiles]  # finish - submit, over finished jobs
    makespan_seconds: float | None  # first submit to last finish
    attempts_mean: float | None  # over started jobs
    attempts_max: int


class Series(BaseModel):
    """Sampled at `t` (seconds, evenly from 0 to just before the horizon): slices in each state, and jobs
    submitted, not finished and not running."""

    t: list[float]
    provisioning: list[int]
    busy: list[int]
    idle: list[int]
    queue: list[int]


class FirestoreOps(BaseModel):
    """The four tpuq services' Firestore operations over a run, as Firestore bills them (document reads, writes
    and deletes; its free tier: 50,000 reads, 20,000 writes and 20,000 deletes a day). The dashboard's reads, a
    person's, are not in it."""

    reads: int  # handlings run, and each quiet tick skipped counted as its last handling's
    writes: int  # the same, and `probe_writes`
    deletes: int
    probe_writes: int  # the executor's probe of a started attempt each tick: not simulated, estimated (at most)
    reads_per_day: float
    writes_per_day: float
    # subscription -> its handlings' reads, writes, deletes, reads_per_day, writes_per_day (simulate.storeops)
    by_subscription: dict[str, dict[str, int | float]] = {}

    @classmethod
    def of(cls, reads: int, writes: int, deletes: int, probe_writes: int, horizon: float,
           by_subscription: dict[str, dict[str, float]] | None = None) -> "FirestoreOps":
        days = horizon / 86400 if horizon > 0 else 1.0
        return cls(reads=reads, writes=writes + probe_writes, deletes=deletes, probe_writes=probe_writes,
                   reads_per_day=reads / days, writes_per_day=(writes + probe_writes) / days,
                   by_subscription=by_subscription or {})


class Metrics(BaseModel):
    policy: str
    horizon_seconds: float
    utilization: float | None  # useful / billed chip-hours; None when nothing was billed
    useful_chip_hours: float
    billed_chip_hours: float
    useful_vm_hours: float
    billed_vm_hours: float
    waste_chip_hours: dict[str, float]  # by WasteCause
    waste_vm_hours: dict[str, float]
    wasted_vm_hours: float  # all causes
    slices: int
    slices_never_ready: int
    slices_never_used: int
    runs_without_slice: int  # attempts on a node no SliceLife names: their time is in no figure above
    jobs: JobMetrics
    api_calls: dict[str, int]
    api_calls_total: int
    creates_per_zone: dict[str, int]
    firestore: FirestoreOps | None = None  # the tpuq policy's only: the others keep no Firestore
    series: Series | None = None

    def to_json(self, series: bool = True) -> str:
        return json.dumps(self.model_dump(mode="json", exclude=None if series else {"series"}), sort_keys=True)


# -- computing them --------------------------------------------------------------------------------


def nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def percentiles(values: Sequence[float]) -> Percentiles:
    if not values:
        return Percentiles()
    return Percentiles(count=len(values), p50=nearest_rank(values, 0.5), p95=nearest_rank(values, 0.95),
                       max=max(values))


def _by_priority(values: Mapping[str, list[float]]) -> dict[str, Percentiles]:
    out = {"all": percentiles([v for vs in values.values() for v in vs])}
    for p in Priority:
        out[p.value] = percentiles(values.get(p.value, []))
    return out


def _run_end(run: AttemptRun, horizon: float) -> float:
    return min(run.ended_at, horizon) if run.ended_at is not None else horizon


def _pieces(run: AttemptRun, horizon: float) -> list[tuple[str, float, float]]:
    """The attempt's time in order: setup, kept work, lost work ("useful" for work in progress at the horizon)."""
    end = _run_end(run, horizon)
    setup_end = min(run.started_at + run.setup_seconds, end)
    if run.ended_at is None or run.end is None:
        kept, lost = max(0.0, end - setup_end), 0.0
    else:
        kept, lost = run.kept_seconds, run.lost_seconds
    kept_end = min(setup_end + kept, end)
    return [(WasteCause.setup.value, run.started_at, setup_end), ("useful", setup_end, kept_end),
            (WasteCause.lost_to_preemption.value, kept_end, min(kept_end + lost, end))]


def _slice_seconds(life: SliceLife, runs: list[AttemptRun], horizon: float,
                   busy: list[tuple[float, float]]) -> dict[str, float]:
    """Seconds of this slice's life by bucket; `busy` gets the intervals an attempt ran on it."""
    ended = min(life.ended_at, horizon)
    total = max(0.0, ended - life.created_at)
    if life.active_at is None or life.active_at >= ended:
        return {WasteCause.provisioning_for_nothing.value: total}
    if not runs:
        return {WasteCause.losers_active.value: total}
    out = {WasteCause.provisioning.value: life.active_at - life.created_at}
    taken_until = life.active_at  # no second counted twice
    for run in sorted(runs, key=lambda r: (r.started_at, r.job_id, r.attempt)):
        for bucket, start, end in _pieces(run, horizon):
            start, end = max(start, taken_until), min(end, ended)
            if end > start:
                out[bucket] = out.get(bucket, 0.0) + end - start
                busy.append((start, end))
                taken_until = end
    out[WasteCause.idle.value] = max(0.0, ended - life.active_at - sum(e - s for s, e in busy))
    return out


def _step_counts(intervals: Iterable[tuple[float, float]], grid: Sequence[float]) -> list[int]:
    """How many [start, end) intervals hold each grid time."""
    kept = [(s, e) for s, e in intervals if e > s]
    starts, ends = sorted(s for s, _ in kept), sorted(e for _, e in kept)
    return [bisect.bisect_right(starts, t) - bisect.bisect_right(ends, t) for t in grid]


def summarize(policy: str, jobs: Sequence[SimJob], runs: Sequence[AttemptRun], slices: Sequence[SliceLife],
              calls: Mapping[str, int], creates_per_zone: Mapping[str, int], horizon: float,
              series_points: int = SERIES_POINTS, firestore: FirestoreOps | None = None) -> Metrics:
    runs_by_node: dict[str, list[AttemptRun]] = {}
    for run in runs:
        if run.started_at < horizon:
            for node in run.all_nodes:  # a multislice attempt keeps every one of its slices busy
                runs_by_node.setdefault(node, []).append(run)
    names = {s.name for s in slices}
    seconds = {"useful": 0.0, **{c.value: 0.0 for c in WasteCause}}
    chip_seconds = dict(seconds)
    host_seconds = dict(seconds)
    billed_chip = billed_host = 0.0
    provisioning_iv: list[tuple[float, float]] = []
    ready_iv: list[tuple[float, float]] = []
    busy_iv: list[tuple[float, float]] = []
    never_ready = never_used = 0
    for life in slices:
        ended = min(life.ended_at, horizon)
        busy: list[tuple[float, float]] = []
        parts = _slice_seconds(life, runs_by_node.get(life.name, []), horizon, busy)
        for bucket, s in parts.items():
            chip_seconds[bucket] += s * life.chips
            host_seconds[bucket] += s * life.hosts
        billed_chip += max(0.0, ended - life.created_at) * life.chips
        billed_host += max(0.0, ended - life.created_at) * life.hosts
        never_ready += WasteCause.provisioning_for_nothing.value in parts
        never_used += WasteCause.losers_active.value in parts
        ready_at = life.active_at if life.active_at is not None and life.active_at < ended else ended
        provisioning_iv.append((life.created_at, ready_at))
        ready_iv.append((ready_at, ended))
        busy_iv.extend(busy)

    causes = [c.value for c in WasteCause]
    waste_vm = {c: host_seconds[c] / HOUR for c in causes}
    grid = [horizon * i / series_points for i in range(max(1, series_points))]  # [0, horizon): all still there
    busy_counts = _step_counts(busy_iv, grid)
    series = Series(t=grid, provisioning=_step_counts(provisioning_iv, grid), busy=busy_counts,
                    idle=[r - b for r, b in zip(_step_counts(ready_iv, grid), busy_counts)],
                    queue=_queue(jobs, runs, horizon, grid))
    return Metrics(
        policy=policy, horizon_seconds=horizon,
        utilization=chip_seconds["useful"] / billed_chip if billed_chip else None,
        useful_chip_hours=chip_seconds["useful"] / HOUR, billed_chip_hours=billed_chip / HOUR,
        useful_vm_hours=host_seconds["useful"] / HOUR, billed_vm_hours=billed_host / HOUR,
        waste_chip_hours={c: chip_seconds[c] / HOUR for c in causes}, waste_vm_hours=waste_vm,
        wasted_vm_hours=sum(waste_vm.values()), slices=len(slices), slices_never_ready=never_ready,
        slices_never_used=never_used,
        runs_without_slice=sum(1 for r in runs if r.started_at < horizon and not names.issuperset(r.all_nodes)),
        jobs=job_metrics(jobs, runs, horizon), api_calls=dict(sorted(calls.items())),
        api_calls_total=sum(calls.values()), creates_per_zone=dict(sorted(creates_per_zone.items())),
        firestore=firestore, series=series)


def _finish_times(runs: Sequence[AttemptRun], horizon: float) -> dict[str, float]:
    return {r.job_id: r.ended_at for r in runs
            if r.end == RunEnd.finished and r.ended_at is not None and r.ended_at <= horizon}


def job_metrics(jobs: Sequence[SimJob], runs: Sequence[AttemptRun], horizon: float) -> JobMetrics:
    submitted = [j for j in jobs if j.submit_at < horizon]
    first_start: dict[str, float] = {}
    attempts: dict[str, int] = {}
    for run in runs:
        if run.started_at < horizon:
            first_start[run.job_id] = min(first_start.get(run.job_id, math.inf), run.started_at)
            attempts[run.job_id] = attempts.get(run.job_id, 0) + 1
    finished_at = _finish_times(runs, horizon)
    waits: dict[str, list[float]] = {}
    turnarounds: dict[str, list[float]] = {}
    for job in submitted:
        if job.job_id in first_start:
            waits.setdefault(job.priority, []).append(max(0.0, first_start[job.job_id] - job.submit_at))
        if job.job_id in finished_at:
            turnarounds.setdefault(job.priority, []).append(finished_at[job.job_id] - job.submit_at)
    started = [j for j in submitted if j.job_id in first_start]
    done = [j for j in submitted if j.job_id in finished_at]
    return JobMetrics(
        submitted=len(submitted), started=len(started), finished=len(done),
        wait=_by_priority(waits), turnaround=_by_priority(turnarounds),
        makespan_seconds=(max(finished_at[j.job_id] for j in done) - min(j.submit_at for j in submitted))
        if done else None,
        attempts_mean=sum(attempts[j.job_id] for j in started) / len(started) if started else None,
        attempts_max=max((attempts[j.job_id] for j in started), default=0))


def _queue(jobs: Sequence[SimJob], runs: Sequence[AttemptRun], horizon: float, grid: Sequence[float]) -> list[int]:
    """Jobs submitted, not finished and not running, at each grid time."""
    submitted = sorted(j.submit_at for j in jobs if j.submit_at < horizon)
    finished = sorted(_finish_times(runs, horizon).values())
    running = _step_counts(((r.started_at, _run_end(r, horizon)) for r in runs if r.started_at < horizon), grid)
    return [max(0, bisect.bisect_right(submitted, t) - bisect.bisect_right(finished, t) - n)
            for t, n in zip(grid, running)]


def bound_records(attempts: Iterable, setup_seconds: float, horizon: float) -> tuple[list[AttemptRun], list[SliceLife]]:
    """The offline bound's attempts (`bound.BoundAttempt`: one slice each, deleted when its work ends) as the
    records `summarize` reads, so the bound's figures are computed the same way as a policy's."""
    from tpuq.contracts.tputypes import parse_accelerator_type

    runs, slices = [], []
    for a in attempts:
        if a.start >= horizon:
            continue
        name = f"bound/{a.zone}/{a.job_id}-{a.attempt}"
        hosts = parse_accelerator_type(a.accelerator_type).hosts
        slices.append(SliceLife(name, a.zone, a.accelerator_type, a.chips, hosts, a.start, a.active_at,
                                min(a.end, horizon), a.end if a.preempted and a.end <= horizon else None))
        if a.active_at >= horizon:
            continue
        over = a.end > horizon  # in progress at the horizon
        runs.append(AttemptRun(
            a.job_id, a.attempt, name, a.chips, a.active_at, setup_seconds, 0.0, ends_at=a.end,
            ended_at=None if over else a.end,
            end=None if over else RunEnd.preempted if a.preempted else RunEnd.finished,
            kept_seconds=0.0 if over else a.kept_seconds, lost_seconds=0.0 if over else a.lost_seconds))
    return runs, slices
