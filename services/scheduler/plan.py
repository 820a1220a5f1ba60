"""Core (pure, no I/O): which pending job runs on which idle TPU, a deterministic matcher.

`plan(pending_jobs, idle_tpus, fleet, now)` returns a maximum matching that is
best in scheduling order: jobs are taken one by one in `order_key` order, and
each one is added if *some* rearrangement of the jobs already matched lets it
in (an augmenting path: a flexible job may move to another idle TPU). A job
matched earlier is never dropped for a later one. Because the sets of jobs that
can run together form a (transversal) matroid, this greedy rule yields the
unique lexicographically-best set of matched jobs, and it is also maximum.

Scheduling order (`order_key`):
  1. priority, high before normal before low;
  2. fewest *fleet options* first: the most slices the fleet file could ever
     hold at once that the job can run on (see `fleet_options`). Counting the
     fleet rather than the TPUs idle in this pass keeps a job's place in the
     queue stable between passes, and it measures what "constrained" is for:
     a job that can run in few places gets scarce capacity, because a flexible
     job has more chances elsewhere later;
  3. submit time, earliest first;
  4. job id, so that the order is total and the plan deterministic.

Why it is fast: idle TPUs of one (type, zone, region) are interchangeable, so
they are grouped into classes with a count; a TPU that some job names exactly
gets a class of its own. Jobs with the same constraints (a *signature*) are
twins. Augmenting paths then run over the few signature and class nodes of a
b-matching, not over individual jobs and TPUs. Two facts keep the total work
near-linear: a search that fails marks every class and signature it visited
dead (from them no free TPU can ever be reached again in this pass: augmenting
elsewhere never adds a residual edge out of that closed set), and once every
idle TPU is taken the remaining jobs are unmatched without a search.

Multislice jobs (`slices: N`, or elastic `[4, 2]`) need N idle TPUs of one class
(type, zone, region) at once: `tpuq.scheduler.plan_gangs` places such a gang in
its turn, moving earlier single jobs elsewhere when that frees enough, and pins
it. Its Match lists every node (`tpu_names`). A queue without multislice jobs
never enters that code, and its plan is the one described above.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable

from tpuq.contracts.documents import short_node_name
from tpuq.contracts.fleet import FleetEntry, FleetFile
from tpuq.contracts.jobspec import ANY_TPU, JobSpec, Priority
from tpuq.contracts.tputypes import canonical_name, zone_region
from tpuq.scheduler.plan_gangs import place_gang
from tpuq.scheduler.residual import Residual, shortest_path


@dataclass(frozen=True, slots=True)
class PendingJob:
    """What the matcher needs to know about one pending job."""

    job_id: str
    priority: Priority
    types: tuple[str, ...]  # acceptable TPU types, canonical names (v5e-8 becomes v5litepod-8)
    submit_time: datetime
    zone: str | None = None  # run only in this zone
    tpu_name: str | None = None  # run only on this node
    regions: frozenset[str] = frozenset()  # regions of the job's buckets; empty: any region
    pinned_region: str | None = None  # set once an attempt started: retries stay in that region
    not_before: datetime | None = None  # retry back-off: not schedulable before this time
    slices: tuple[int, ...] = (1,)  # the slice counts to try at once, largest first (tpuq.contracts.multislice)

    def __post_init__(self) -> None:
        # Accept lists/sets and friendly type names, but store one canonical, hashable form.
        object.__setattr__(self, "priority", Priority(self.priority))
        object.__setattr__(self, "slices", tuple(self.slices))
        object.__setattr__(self, "types", tuple(dict.fromkeys(canonical_name(t) for t in self.types)))
        object.__setattr__(self, "regions", frozenset(self.regions))
        if self.tpu_name is not None:
            object.__setattr__(self, "tpu_name", short_node_name(self.tpu_name))

    @classmethod
    def from_spec(
        cls,
        spec: JobSpec,
        submit_time: datetime,
        *,
        job_id: str | None = None,
        pinned_region: str | None = None,
        not_before: datetime | None = None,
    ) -> "PendingJob":
        """The matcher's view of a stored job. `job_id` defaults to `spec.id`."""
        job_id = job_id or spec.id
        if not job_id:
            raise ValueError("a pending job needs an id: the spec has none and none was given")
        return cls(
            job_id=job_id,
            priority=spec.priority,
            types=tuple(spec.tpu),
            submit_time=submit_time,
            zone=spec.zone,
            tpu_name=spec.tpu_name,
            regions=frozenset(spec.regions),
            pinned_region=pinned_region,
            not_before=not_before,
            slices=spec.slice_counts,
        )

    @property
    def multislice(self) -> bool:
        return self.slices[0] > 1

    @property
    def any_type(self) -> bool:
        """`tpu: any`: every type the fleet offers."""
        return self.types == (ANY_TPU,)

    def accepts(self, tpu_type: str) -> bool:
        return self.any_type or tpu_type in self.types

    def region_allowed(self, region: str) -> bool:
        if self.pinned_region is not None and region != self.pinned_region:
            return False
        return not self.regions or region in self.regions

    def schedulable_at(self, now: datetime) -> bool:
        return self.not_before is None or self.not_before <= now


@dataclass(frozen=True, slots=True)
class IdleTpu:
    """An idle TPU the scheduler may assign. `region` defaults to the zone's region."""

    name: str
    type: str
    zone: str
    region: str = ""
    entry_id: str | None = None  # the fleet entry it belongs to, if any

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", canonical_name(self.type))
        if not self.region:
            object.__setattr__(self, "region", zone_region(self.zone))


@dataclass(frozen=True, slots=True)
class Match:
    job_id: str
    tpu_name: str
    tpu_type: str
    zone: str
    region: str  # the caller picks the job's bucket for this region (JobSpec.bucket_for_region)
    entry_id: str | None = None
    # A multislice job's gang: every node, in slice order (slice 0 is `tpu_name`), all of one type in one zone.
    # Empty for a single slice, so callers that read `tpu_name` alone keep working for single-slice jobs.
    tpu_names: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node the job runs on: its gang, or its one node."""
        return self.tpu_names or (self.tpu_name,)


@dataclass(frozen=True, slots=True)
class Plan:
    matches: tuple[Match, ...] = ()  # in scheduling order
    unmatched_job_ids: tuple[str, ...] = ()  # schedulable now but no idle TPU fits: capacity demand
    deferred_job_ids: tuple[str, ...] = ()  # still backing off (not_before > now)
    # job id -> fleet options, for every job given; explains the order and sizes capacity requests.
    fleet_options: dict[str, int] = field(default_factory=dict, compare=False, repr=False)


def compatible(job: PendingJob, tpu: IdleTpu) -> bool:
    """May `job` run on `tpu`? Type, zone, exact name, bucket regions and region pinning."""
    return (
        job.accepts(tpu.type)
        and (job.zone is None or job.zone == tpu.zone)
        and (job.tpu_name is None or job.tpu_name == short_node_name(tpu.name))
        and job.region_allowed(tpu.region)
    )


def fleet_options(job: PendingJob, fleet: FleetFile | None) -> int:
    """How many slices the fleet could hold at once that `job` can run on.

    The sum of `max_slices` over fleet entries whose type the job accepts and
    that have at least one zone the job may use (its zone, bucket regions and
    pinned region). A job that names one TPU has exactly 1 option. Without a
    fleet every job has 0, so the order falls back to priority and submit time.
    """
    if job.tpu_name is not None:
        return 1
    return sum(entry.max_slices for entry in eligible_entries(job, fleet))


# (fleet id, what of a job `eligible_entries` reads) -> (the fleet, its answer). A pass asks for every queued job,
# several times; jobs share a few constraints and a fleet is one parse per version (FleetFile is frozen, and kept
# here, so its id is not reused while its answers are).
_ELIGIBLE: dict[tuple, tuple[FleetFile, tuple[FleetEntry, ...]]] = {}
_ELIGIBLE_MAX = 4_096


def eligible_entries(job: PendingJob, fleet: FleetFile | None) -> list[FleetEntry]:
    """The fleet entries whose slices `job` could run on: its type, in a zone it may use."""
    if fleet is None:
        return []
    key = (id(fleet), job.types, job.zone, job.regions, job.pinned_region)
    kept = _ELIGIBLE.get(key)
    if kept is None or kept[0] is not fleet:
        if len(_ELIGIBLE) >= _ELIGIBLE_MAX:
            _ELIGIBLE.clear()
        kept = _ELIGIBLE[key] = (fleet, tuple(
            entry
            for entry in fleet.tpus
            if job.accepts(entry.type)
            and any(
                (job.zone is None or job.zone == zone) and job.region_allowed(zone_region(zone))
                for zone in entry.zones
            )
        ))
    return list(kept[1])


def order_key(job: PendingJob, options: int) -> tuple:
    """Sort key of the scheduling order; `options` is `fleet_options(job, fleet)`."""
    return (-job.priority.rank, options, job.submit_time, job.job_id)


def scheduling_order(jobs: Iterable[PendingJob], fleet: FleetFile | None) -> list[PendingJob]:
    """The jobs in the order `plan` considers them."""
    return [job for _, job in _ordered(list(jobs), fleet)[0]]


def _signature(job: PendingJob) -> tuple:
    """Jobs with equal signatures can run on exactly the same TPUs."""
    return (job.types, job.zone, job.tpu_name, job.regions, job.pinned_region, job.slices)


def _ordered(
    jobs: list[PendingJob], fleet: FleetFile | None
) -> tuple[list[tuple[int, PendingJob]], list[tuple], dict[str, int]]:
    """(signature index, job) in scheduling order, the signatures, and each job's fleet options."""
    sig_index: dict[tuple, int] = {}
    signatures: list[tuple] = []
    sig_options: list[int] = []
    keyed = []
    options_by_job: dict[str, int] = {}
    for job in jobs:
        sig = _signature(job)
        s = sig_index.get(sig)
        if s is None:
            s = sig_index[sig] = len(signatures)
            signatures.append(sig)
            sig_options.append(fleet_options(job, fleet))
        options = sig_options[s]
        options_by_job[job.job_id] = options
        keyed.append((order_key(job, options), s, job))
    keyed.sort(key=lambda item: item[0])
    return [(s, job) for _, s, job in keyed], signatures, options_by_job


def plan(
    pending_jobs: Iterable[PendingJob],
    idle_tpus: Iterable[IdleTpu],
    fleet: FleetFile | None,
    now: datetime,
) -> Plan:
    """Pair pending jobs with idle TPUs: a maximum matching, best in scheduling order.

    Pure: reads only its arguments. Raises ValueError when a job id or a TPU
    name appears twice, since either would let one job or one TPU be used twice.
    """
    jobs = list(pending_jobs)
    tpus = list(idle_tpus)
    if len({j.job_id for j in jobs}) != len(jobs):
        raise ValueError("plan: a job id appears twice among the pending jobs")
    if len({short_node_name(t.name) for t in tpus}) != len(tpus):
        raise ValueError("plan: a TPU name appears twice among the idle TPUs")

    ordered, signatures, options_by_job = _ordered(jobs, fleet)
    representative: list[PendingJob | None] = [None] * len(signatures)
    for s, job in ordered:
        if representative[s] is None:
            representative[s] = job

    # TPU classes: interchangeable TPUs. A TPU some job names gets a class of its own.
    named = {sig[2] for sig in signatures if sig[2] is not None}
    class_index: dict[tuple, int] = {}
    class_tpus: list[list[IdleTpu]] = []
    for tpu in sorted(tpus, key=lambda t: t.name):
        short = short_node_name(tpu.name)
        key = (tpu.type, tpu.zone, tpu.region, short if short in named else None)
        c = class_index.get(key)
        if c is None:
            c = class_index[key] = len(class_tpus)
            class_tpus.append([])
        class_tpus[c].append(tpu)
    classes_by_type: dict[str, list[int]] = {}
    class_by_name: dict[str, int] = {}
    for key, c in class_index.items():
        classes_by_type.setdefault(key[0], []).append(c)
        if key[3] is not None:
            class_by_name[key[3]] = c

    def compatible_classes(s: int) -> list[int]:
        job = representative[s]
        assert job is not None
        if job.tpu_name is not None:
            candidates = [class_by_name[job.tpu_name]] if job.tpu_name in class_by_name else []
        else:
            types = list(classes_by_type) if job.any_type else job.types
            candidates = [c for t in types for c in classes_by_type.get(t, ())]
        return [c for c in candidates if compatible(job, class_tpus[c][0])]

    compat: list[list[int] | None] = [None] * len(signatures)
    free = [len(members) for members in class_tpus]
    free_total = len(tpus)
    # flow[c][s]: how many jobs of signature s hold a TPU of class c.
    flow: list[dict[int, int]] = [{} for _ in class_tpus]
    class_dead = [False] * len(class_tpus)
    sig_dead = [False] * len(signatures)
    residual = Residual(compat, compatible_classes, free, flow, class_dead, sig_dead)
    named_classes = set(class_by_name.values())

    matched: list[tuple[int, PendingJob]] = []
    gangs: dict[str, tuple[int, int]] = {}  # job id -> (class, slices taken): a multislice job's pinned gang
    unmatched: list[str] = []
    deferred: list[str] = []
    for s, job in ordered:
        if not job.schedulable_at(now):
            deferred.append(job.job_id)
            continue
        if free_total == 0 or sig_dead[s]:
            unmatched.append(job.job_id)
            continue
        if job.multislice:
            gang = _place_gang(s, job, residual, named_classes)
            if gang is not None:
                gangs[job.job_id] = gang
                free_total -= gang[1]
                matched.append((s, job))
                continue
            if job.slices[-1] > 1:
                unmatched.append(job.job_id)
                continue  # (an elastic list ending in 1 may still run on one slice: below)
        if _augment(s, residual):
            free_total -= 1
            matched.append((s, job))
        else:
            unmatched.append(job.job_id)

    # Turn per-(class, signature) counts into concrete pairs: jobs in scheduling
    # order take their signature's classes in order, TPUs within a class by name.
    next_tpu = [0] * len(class_tpus)
    matches = []
    for s, job in matched:
        if job.job_id in gangs:
            c, n = gangs[job.job_id]
            gang = class_tpus[c][next_tpu[c]:next_tpu[c] + n]
            next_tpu[c] += n
            first = gang[0]
            matches.append(Match(job.job_id, first.name, first.type, first.zone, first.region, first.entry_id,
                                 tuple(t.name for t in gang)))
            continue
        c = next(c for c in compat[s] or () if flow[c].get(s, 0) > 0)  # compat[s] is set once matched
        flow[c][s] -= 1
        tpu = class_tpus[c][next_tpu[c]]
        next_tpu[c] += 1
        matches.append(Match(job.job_id, tpu.name, tpu.type, tpu.zone, tpu.region, tpu.entry_id))
    return Plan(tuple(matches), tuple(unmatched), tuple(deferred), options_by_job)


def _place_gang(s: int, job: PendingJob, r: Residual, named: set[int]) -> tuple[int, int] | None:
    """(class, slices) for a multislice job, its counts above one tried largest first (tpuq.scheduler.plan_gangs).
    A class of TPUs some job names (`named`) is never a gang's."""
    classes = [c for c in r.classes_of(s) if c not in named and not r.class_dead[c]]
    return place_gang(tuple(n for n in job.slices if n > 1), classes, r)


def _augment(start: int, r: Residual) -> bool:
    """Find and apply a shortest augmenting path from signature `start`; False if none exists.

    The path (tpuq.scheduler.residual) ends at a class with a free TPU. Shortest paths move as few
    already-matched jobs as possible.
    """
    free, flow = r.free, r.flow
    for c in r.classes_of(start):  # the common case: a compatible TPU is simply free
        if free[c] > 0:
            free[c] -= 1
            flow[c][start] = flow[c].get(start, 0) + 1
            return True

    reached_from_class: dict[int, int] = {start: -1}  # signature -> class its moved job leaves
    end, reached_from_sig = shortest_path(r, deque([start]), reached_from_class)
    if end < 0:
        # Nothing reachable from here can reach a free TPU, now or after later augmentations.
        for c in reached_from_sig:
            r.class_dead[c] = True
        for s in reached_from_class:
            r.sig_dead[s] = True
        return False

    free[end] -= 1
    c = end
    while True:
        s = reached_from_sig[c]
        flow[c][s] = flow[c].get(s, 0) + 1
        if s == start:
            return True
        left = reached_from_class[s]
        flow[left][s] -= 1
        if not flow[left][s]:
            del flow[left][s]
        c = left
