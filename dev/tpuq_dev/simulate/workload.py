"""The jobs a simulation runs: each one's arrival, acceptable TPU types, priority, regions and work.

A workload file (YAML) either generates jobs:

    jobs: 2000                      # how many
    arrivals: {rate_per_hour: 3}    # Poisson; or {bursts: [{at_hours: 2, count: 50}, ...]}; absent: uniform
    duration: {dist: lognormal, median: 7200, sigma: 1.0, max: 86400}   # work seconds
    priority: {high: 0.1, normal: 0.7, low: 0.2}                       # weights, normalised
    types:
      - {tpu: [v4-8], weight: 0.5, regions: [us-central2]}
      - {tpu: [v4-32], weight: 0.1}    # weight absent: 1
      - {tpu: [v5litepod-16], slices: 4}   # Multislice: 4 slices at once, one queued resource (one type only)
    checkpoint_every: 1800          # seconds; null (the default): no checkpoints

or reads a trace, one JSON object a line, its path relative to the workload file (a `.jsonl` file given as the
workload is read as that trace):

    trace: jobs.jsonl   # {"id": "a", "submit_at": 0, "tpu": ["v4-8"], "priority": "normal", "work_seconds": 3600,
                        #  "checkpoint_seconds": 600, "regions": ["us-central2"], "slices": 4}

`load_workload(path)` validates (one line per error, naming the field: `workload.duration.sigma: must be > 0`);
`generate(spec, seed, horizon_seconds)` makes the jobs, a function of the spec, the seed and the horizon alone.

The `{dist: ...}` distributions here are the workload's; the capacity model's scenario spells its delay
distributions the same way (one of the two will own the shape).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, PrivateAttr, Tag, ValidationError,
                      field_validator, model_validator)

from tpuq.contracts import multislice, yamltext
from tpuq.contracts.jobspec import JOB_ID_RE, Priority
from tpuq.contracts.tputypes import UnknownAcceleratorType, parse_accelerator_type


@dataclass(frozen=True)
class SimJob:
    job_id: str
    submit_at: float  # simulation seconds
    types: tuple[str, ...]  # acceptable accelerator types, as a job file's `tpu:` lists them
    priority: str  # a tpuq priority name (tpuq.contracts.jobspec)
    work_seconds: float  # the work itself, once the workers have set up
    checkpoint_seconds: float | None = None  # a preempted attempt keeps the work up to its last checkpoint
    regions: tuple[str, ...] | None = None  # None: any region the fleet has
    # Multislice (issue 37): `slices:` as a job file stores it (tpuq.contracts.multislice): None for one slice, N
    # slices of its one type, or the elastic counts to try, largest first.
    slices: int | tuple[int, ...] | None = None

    @property
    def multislice(self) -> bool:
        return multislice.is_multislice(list(self.slices) if isinstance(self.slices, tuple) else self.slices)


class WorkloadError(ValueError):
    """A workload file that cannot be used: one line, naming the field and the reason."""


_REGION = re.compile(r"^[a-z]+-[a-z]+\d+$")
GENERATED_ID_PREFIX = "job-"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- distributions (seconds) -----------------------------------------------------------------


class _Dist(_Strict):
    max: float | None = Field(None, gt=0)  # a cap on every draw

    def _draw(self, rng: random.Random) -> float:
        raise NotImplementedError

    def sample(self, rng: random.Random) -> float:
        value = max(0.0, self._draw(rng))
        return min(value, self.max) if self.max is not None else value


class Lognormal(_Dist):
    """exp(N(ln median, sigma^2)): half the draws are under `median`; sigma 1 puts p90 at about 3.6x it."""

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(gt=0)

    def _draw(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.median), self.sigma)


class Uniform(_Dist):
    dist: Literal["uniform"]
    low: float = Field(ge=0)
    high: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high <= self.low:
            raise ValueError(f"high: must be > low ({self.low:g})")
        return self

    def _draw(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)


class Exponential(_Dist):
    dist: Literal["exponential"]
    mean: float = Field(gt=0)

    def _draw(self, rng: random.Random) -> float:
        return rng.expovariate(1.0 / self.mean)


class Fixed(_Dist):
    dist: Literal["fixed"]
    value: float = Field(gt=0)

    def _draw(self, rng: random.Random) -> float:
        return self.value


DISTRIBUTIONS = ("lognormal", "uniform", "exponential", "fixed")
Distribution = Annotated[Union[Lognormal, Uniform, Exponential, Fixed], Field(discriminator="dist")]


# -- the generated workload ----------------------------------------------------------------------


class Burst(_Strict):
    at_hours: float = Field(ge=0)
    count: int = Field(gt=0)


class PoissonArrivals(_Strict):
    rate_per_hour: float = Field(gt=0)


class BurstArrivals(_Strict):
    bursts: list[Burst] = Field(min_length=1)


def _uniform_is_none(value: object) -> object:
    if isinstance(value, dict) and "rate_per_hour" in value and "bursts" in value:
        raise ValueError("give either rate_per_hour or bursts, not both")
    return None if value == "uniform" else value


def _arrival_kind(value: object) -> str | None:
    if isinstance(value, dict):
        return "poisson" if "rate_per_hour" in value else "burst" if "bursts" in value else None
    return "poisson" if isinstance(value, PoissonArrivals) else "burst" if isinstance(value, BurstArrivals) else None


Arrivals = Annotated[
    Union[Annotated[PoissonArrivals, Tag("poisson")], Annotated[BurstArrivals, Tag("burst")]],
    Discriminator(_arrival_kind, custom_error_type="arrivals_kind",
                  custom_error_message="give rate_per_hour: (Poisson), bursts: [...], or leave arrivals out "
                                       "(uniform over the run)"),
]


def _as_list(value: object) -> object:
    return [value] if isinstance(value, str) else value


def _accelerator_names(names: list[str]) -> list[str]:
    """Canonical API names (v5e-64 is v5litepod-64), each once, in the order given."""
    try:
        return list(dict.fromkeys(parse_accelerator_type(name).name for name in names))
    except UnknownAcceleratorType as e:
        raise ValueError(str(e)) from None


def _region_names(regions: list[str] | None) -> list[str] | None:
    for region in regions or ():
        if not _REGION.match(region):
            raise ValueError(f"{region!r} is not a region (expected e.g. us-central2)")
    return regions


def _stored_slices(value: int | list[int] | None) -> int | tuple[int, ...] | None:
    return tuple(value) if isinstance(value, list) else value


Slices = Annotated[int | list[int] | None, BeforeValidator(multislice.parse_slices)]


class _SlicesRule:
    """`slices:` with the job file's rules tying it to `tpu:` (one type, v4 or later)."""

    @model_validator(mode="after")
    def _slices_rule(self):
        multislice.refuse_with(self.slices, list(self.tpu), False, None)
        return self


class JobType(_SlicesRule, _Strict):
    tpu: Annotated[list[str], BeforeValidator(_as_list)] = Field(min_length=1)  # acceptable types, raced
    weight: float = Field(1.0, gt=0)  # relative to the other types' (absent: 1)
    regions: list[str] | None = Field(None, min_length=1)
    slices: Slices = None  # Multislice: N slices of the one type at once, or [4, 2] (tpuq.contracts.multislice)

    _tpu = field_validator("tpu")(lambda value: _accelerator_names(value))
    _regions = field_validator("regions")(lambda value: _region_names(value))

    @property
    def multi_host(self) -> bool:
        return any(parse_accelerator_type(t).hosts > 1 for t in self.tpu)


class GeneratedWorkload(_Strict):
    jobs: int | None = Field(None, gt=0)  # required unless arrivals are bursts (their counts) or a rate
    arrivals: Annotated[Arrivals | None, BeforeValidator(_uniform_is_none)] = None
    duration: Distribution
    priority: dict[str, float] = Field(default_factory=lambda: {Priority.normal.value: 1.0})
    types: list[JobType] = Field(min_length=1)
    checkpoint_every: float | None = Field(None, gt=0)

    @field_validator("priority")
    @classmethod
    def _priorities(cls, value: dict[str, float]) -> dict[str, float]:
        names = [p.value for p in Priority]
        for name, weight in value.items():
            if name not in names:
                raise ValueError(f"unknown priority {name!r}; expected {', '.join(names)}")
            if weight < 0:
                raise ValueError(f"{name}: must be >= 0")
        if not any(w > 0 for w in value.values()):
            raise ValueError("at least one priority needs a weight > 0")
        return value

    @model_validator(mode="after")
    def _count(self) -> GeneratedWorkload:
        if isinstance(self.arrivals, BurstArrivals):
            total = sum(b.count for b in self.arrivals.bursts)
            if self.jobs is not None and self.jobs != total:
                raise ValueError(f"jobs: {self.jobs} differs from the bursts' counts ({total}); give one of them")
        elif self.jobs is None and not isinstance(self.arrivals, PoissonArrivals):
            raise ValueError("jobs: is required (how many jobs to spread over the run)")
        return self


class TraceJob(_SlicesRule, _Strict):
    id: str
    submit_at: float = Field(ge=0)
    tpu: Annotated[list[str], BeforeValidator(_as_list)] = Field(min_length=1)
    priority: Priority = Priority.normal
    work_seconds: float = Field(gt=0)
    checkpoint_seconds: float | None = Field(None, gt=0)
    regions: list[str] | None = Field(None, min_length=1)
    slices: Slices = None

    _tpu = field_validator("tpu")(lambda value: _accelerator_names(value))
    _regions = field_validator("regions")(lambda value: _region_names(value))

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not JOB_ID_RE.match(value):
            raise ValueError("must be 1-63 lowercase letters, digits or '-', starting with a letter or digit")
        return value

    def sim_job(self) -> SimJob:
        return SimJob(self.id, self.submit_at, tuple(self.tpu), self.priority.value, self.work_seconds,
                      self.checkpoint_seconds, tuple(self.regions) if self.regions else None,
                      _stored_slices(self.slices))


class TraceWorkload(_Strict):
    trace: str  # a JSON-lines file, relative to the workload file
    _jobs: list[SimJob] = PrivateAttr(default_factory=list)

    @property
    def trace_jobs(self) -> list[SimJob]:
        return self._jobs


WorkloadSpec = Union[GeneratedWorkload, TraceWorkload]


# -- reading -------------------------------------------------------------------------------------


def _message(e: dict) -> str:
    kind, ctx, msg = e.get("type", ""), e.get("ctx") or {}, e.get("msg", "invalid")
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "is required"
    if kind == "union_tag_invalid":
        return f"must be one of {', '.join(DISTRIBUTIONS)}"
    if kind == "union_tag_not_found":
        return f"needs dist: (one of {', '.join(DISTRIBUTIONS)})"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()), "")
        shown = f"{limit:g}" if isinstance(limit, (int, float)) else limit
        return f"must be {bounds[kind]} {shown}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "must be a whole number"
    if kind in ("float_parsing", "float_type"):
        return "must be a number"
    if kind == "too_short":
        return "must not be empty"
    if kind == "enum":
        return f"must be one of {ctx.get('expected', '')}".replace("'", "")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return msg


_UNION_TAGS = frozenset(DISTRIBUTIONS) | {"poisson", "burst"}


def describe_error(err: ValidationError, root: str) -> str:
    """The first problem as `root.field.path: reason` (the union's own tags left out of the path)."""
    e = err.errors(include_url=False)[0]
    path = root
    for part in e.get("loc", ()):
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in _UNION_TAGS or part.startswith("function-"):
            continue
        else:
            path += f".{part}"
    msg = _message(e)
    # a model-level check names its field first ("high: must be > low"): move it into the path
    named = re.match(r"^([a-z_]+): (.*)$", msg)
    if named:
        path, msg = f"{path}.{named.group(1)}", named.group(2)
    return f"{path}: {msg}"


def parse_workload(data: object, base_dir: Path | None = None, root: str = "workload") -> WorkloadSpec:
    """A validated workload; a trace is read (relative to base_dir) and checked line by line."""
    if not isinstance(data, dict):
        raise WorkloadError(f"{root}: expected a mapping with jobs:, duration:, types: ... or trace:")
    model: type[BaseModel] = TraceWorkload if "trace" in data else GeneratedWorkload
    try:
        spec = model.model_validate(data)
    except ValidationError as err:
        raise WorkloadError(describe_error(err, root)) from None
    if isinstance(spec, TraceWorkload):
        spec._jobs = read_trace((base_dir or Path.cwd()) / spec.trace, f"{root}.trace")
    return spec


def read_trace(path: Path, root: str = "workload.trace") -> list[SimJob]:
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise WorkloadError(f"{root}: cannot read {path}: {e.strerror or e}") from None
    jobs: list[SimJob] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{root} ({path.name} line {number})"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{where}: not JSON: {e.msg}") from None
        try:
            job = TraceJob.model_validate(record).sim_job()
        except ValidationError as err:
            raise WorkloadError(describe_error(err, where)) from None
        if job.job_id in seen:
            raise WorkloadError(f"{where}.id: {job.job_id!r} is given twice")
        seen.add(job.job_id)
        jobs.append(job)
    if not jobs:
        raise WorkloadError(f"{root}: {path} has no jobs")
    return jobs


TRACE_SUFFIXES = (".jsonl", ".ndjson")


def load_workload(path: str | Path) -> WorkloadSpec:
    """A workload file (YAML), or a trace file (`.jsonl`) on its own."""
    path = Path(path)
    if path.suffix in TRACE_SUFFIXES:
        return parse_workload({"trace": path.name}, base_dir=path.parent)
    try:
        data = yamltext.load(path.read_text())
    except OSError as e:
        raise WorkloadError(f"workload {path}: {(e.strerror or str(e)).lower()}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"workload {path}: not a text file") from None
    except yaml.YAMLError as e:
        raise WorkloadError(f"workload {path}: {yamltext.error_text(e)}") from None
    return parse_workload(data, base_dir=path.parent)


# -- generating ----------------------------------------------------------------------------------


def _arrival_times(spec: GeneratedWorkload, rng: random.Random, horizon: float) -> list[float]:
    arrivals = spec.arrivals
    if isinstance(arrivals, BurstArrivals):
        return sorted(b.at_hours * 3600.0 for b in arrivals.bursts for _ in range(b.count))
    if isinstance(arrivals, PoissonArrivals):
        times, t, rate = [], 0.0, arrivals.rate_per_hour / 3600.0
        while spec.jobs is None or len(times) < spec.jobs:
            t += rng.expovariate(rate)
            if t >= horizon:
                break
            times.append(t)
        return times
    return sorted(rng.uniform(0.0, horizon) for _ in range(spec.jobs or 0))


def _pick(rng: random.Random, weights: list[float]) -> int:
    x = rng.random() * sum(weights)
    for i, w in enumerate(weights):
        x -= w
        if x < 0:
            return i
    return len(weights) - 1


def generate(spec: WorkloadSpec, seed: int, horizon_seconds: float) -> list[SimJob]:
    """The jobs submitted before the horizon, in submit order; the same spec, seed and horizon give the same jobs."""
    if isinstance(spec, TraceWorkload):
        return sorted((j for j in spec.trace_jobs if j.submit_at < horizon_seconds),
                      key=lambda j: (j.submit_at, j.job_id))
    rng = random.Random(seed)
    times = [t for t in _arrival_times(spec, rng, horizon_seconds) if t < horizon_seconds]
    priorities = list(spec.priority)
    priority_weights = [spec.priority[p] for p in priorities]
    type_weights = [t.weight for t in spec.types]
    width = max(5, len(str(len(times))))
    jobs = []
    for i, submit_at in enumerate(times):
        kind = spec.types[_pick(rng, type_weights)]
        jobs.append(SimJob(
            job_id=f"{GENERATED_ID_PREFIX}{i:0{width}d}", submit_at=submit_at, types=tuple(kind.tpu),
            priority=priorities[_pick(rng, priority_weights)], work_seconds=max(1.0, spec.duration.sample(rng)),
            checkpoint_seconds=spec.checkpoint_every, regions=tuple(kind.regions) if kind.regions else None,
            slices=_stored_slices(kind.slices)))
    return jobs
