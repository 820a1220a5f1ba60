"""The job a user submits: `job.yaml` entries and the `jobs` topic message.

`JobSpec` is the single definition of a job. The CLI reads it from job.yaml
(where `bundle` is a local directory), uploads the bundle and publishes a
`JobSpec` whose `bundle` is a gs:// URI. A job published with gcloud uses the
same schema directly.
"""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    StrictBool,
    Field,
    field_validator,
    model_validator,
)

from tpuq.contracts import arrays, multislice
from tpuq.contracts.errors import shown_value
from tpuq.contracts.basics import (MAX_DURATION_LIMIT_SECONDS, StrictModel, format_duration,  # noqa: F401 (re-exported)
                                   parse_duration)
from tpuq.contracts.dependencies import (DependsOnAny, check_depends_on, dependency_names,  # noqa: F401 (re-exported)
                                         refuse_dependency_cycles)
from tpuq.contracts.notify import NotifyList, refuse_inline_urls
from tpuq.contracts.runtime_failures import MAX_PATTERNS, check_pattern
from tpuq.contracts.tputypes import UnknownAcceleratorType, parse_accelerator_type, zone_region

# Variables the runner sets on every worker; a job may not override them.
RUNNER_ENV = frozenset(
    {
        "JOB_ID",
        "ATTEMPT_ID",
        "TPU_WORKER_HOST",
        "TPU_WORKER_ID",
        "TPU_WORKER_COUNT",
        "TPU_WORKER_HOSTNAMES",
        "JOB_DIR",
        "JOB_BUCKET",
        "ATTEMPT_GCS_DIR",
        "CHECKPOINT_GCS_DIR",
    }
)
RESERVED_ENV_PREFIX = "TPUQ_"
# Where an attempt stands, set by the runner on every worker (names under RESERVED_ENV_PREFIX, so no job sets them):
# the attempt's number (1, 2, ...), the job's preemptions before this attempt, and "1" when an earlier attempt of the
# job started (absent otherwise), so that a job restores its checkpoint without guessing.
ATTEMPT_ENV = frozenset({"TPUQ_ATTEMPT", "TPUQ_PREEMPTIONS", "TPUQ_RESUMING"})
# A group's task (`array:` or `sweep:`, tpuq.contracts.arrays), set by the runner on every worker of a task: its index
# (Slurm's SLURM_ARRAY_TASK_ID) and the group's number of tasks. Absent on a job of no group.
ARRAY_ENV = frozenset({"TPUQ_ARRAY_INDEX", "TPUQ_ARRAY_SIZE"})
# A multislice attempt (tpuq.contracts.multislice, numbering in tpuq.contracts.workers), set on every worker of every
# slice: its slice's index, the attempt's number of slices, the most the job asked for (an elastic job may get fewer),
# and the worker's id across all slices. Set whenever the job asked for several slices; absent otherwise.
MULTISLICE_ENV = frozenset({"TPUQ_SLICE_ID", "TPUQ_SLICE_COUNT", "TPUQ_SLICES_WANTED", "TPUQ_WORKER_GLOBAL_ID"})
# The variables JAX and libtpu read for Multislice (jax/_src/clusters/cloud_tpu_cluster.py), set by the runner on a
# multislice attempt only. A job may set none of this prefix: a stray MEGASCALE_COORDINATOR_ADDRESS on one slice
# would make JAX wait for slices that do not exist.
MEGASCALE_ENV_PREFIX = "MEGASCALE_"
# `tpu: any` (tpu-runner's): any TPU type the fleet offers. Stored as the one-element list ["any"].
ANY_TPU = "any"

JOB_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CACHE_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_BUCKET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,221}[a-z0-9]$")
# A region at the end of a bucket name: my-data-us-central2, logs_europe-west4.
_REGION_SUFFIX_RE = re.compile(
    r"(?:^|[-_.])((?:us|europe|asia|australia|northamerica|southamerica|me|africa)-[a-z]+\d+)$"
)
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+\d+$")

# Size limits. Firestore stores at most 1 MiB per document and refuses a larger write with INVALID_ARGUMENT, on
# every retry (production-facts.md, "Firestore document size"): a job over it would be redelivered until Pub/Sub
# dead-letters it, with no reason given. The spec is stored whole in jobs/{id} (beside the scheduler's fields, a
# few KiB at most: reasons, the blocked sentence, times, counters) and again inside the assignment that
# executions/{job}:{n} keeps (beside one endpoint per worker), so it is held to a quarter of the limit: its two
# free-text fields by their own limits, every other field by the limit on the whole.
MAX_COMMAND_BYTES = 64 * 1024  # UTF-8
MAX_ENV_BYTES = 64 * 1024  # every name and value together, UTF-8
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_SPEC_BYTES = 256 * 1024  # the whole spec as JSON, as it travels on the jobs topic


class Priority(str, Enum):
    low = "low"
    normal = "normal"
    high = "high"

    @property
    def rank(self) -> int:
        """Higher runs first."""
        return {"low": 0, "normal": 1, "high": 2}[self.value]


def split_gs_uri(uri: str) -> tuple[str, str]:
    """`gs://b/a/b.tgz` -> ("b", "a/b.tgz"). Raises ValueError with a reason."""
    if not isinstance(uri, str) or not uri.startswith("gs://"):
        raise ValueError(f"{uri!r} is not a gs:// URI")
    bucket, _, path = uri[len("gs://") :].partition("/")
    if not _BUCKET_NAME_RE.match(bucket):
        raise ValueError(f"{uri!r} does not name a valid bucket")
    return bucket, path


class BucketRef(StrictModel):
    """One of a job's buckets. `region` is inferred from a name ending in a region."""

    uri: str
    region: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"uri": value}
        return value

    @field_validator("uri")
    @classmethod
    def _bucket_uri(cls, uri: str) -> str:
        bucket, path = split_gs_uri(uri)
        if path.strip("/"):
            raise ValueError(f"{uri!r} must be a bucket URI like gs://my-bucket, without a path")
        return f"gs://{bucket}"

    @model_validator(mode="after")
    def _infer_region(self) -> "BucketRef":
        if self.region is None:
            m = _REGION_SUFFIX_RE.search(self.name)
            if m:
                object.__setattr__(self, "region", m.group(1))
        elif not _REGION_RE.match(self.region):
            raise ValueError(f"region {self.region!r} is not a region name like us-central2")
        return self

    @property
    def name(self) -> str:
        return self.uri[len("gs://") :]


class CacheSpec(StrictModel):
    key: str
    path: str

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        if not _CACHE_KEY_RE.match(key):
            raise ValueError("must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return key

    @field_validator("path")
    @classmethod
    def _relative_path(cls, path: str) -> str:
        if not path or path.startswith("/") or path.startswith("~"):
            raise ValueError(f"{path!r} must be a relative path inside the job directory")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ValueError(f"{path!r} must not contain '..'")
        if not parts:
            raise ValueError(f"{path!r} must name a directory inside the job directory")
        return "/".join(parts)


def _refuse_megascale(name: str) -> None:
    if name.startswith(MEGASCALE_ENV_PREFIX):
        raise ValueError(f"{name!r} is reserved: tpuq sets the {MEGASCALE_ENV_PREFIX}* variables on a multislice job "
                         "(slices: N) and never on one slice")


def _utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


def _tpu_types_given(value: Any) -> Any:
    """`tpu: v4-8` or a list of types; anything else (`tpu: 8`) is told what a TPU type looks like, not "a list"."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
        return value
    raise ValueError(f"a TPU type such as v4-8 or v5litepod-8, or a list of them: got {shown_value(value)}")


def _array_value(value: Any) -> Any:
    if value is not None:
        arrays.parse_array(value)  # the value is kept as given (the topic carries it); this checks it
    return value


class JobSpec(StrictModel):
    """One job. Field names follow tpu-runner's job.yaml; the rest are tpuq additions."""

    id: str | None = Field(default=None, description="Job id; generated when absent")
    name: str | None = Field(default=None, max_length=200, description="Free-form label")
    tpu: Annotated[list[str], BeforeValidator(_tpu_types_given)] = Field(
        min_length=1, description="One TPU type or a list of compatible types to race"
    )
    buckets: list[BucketRef] = Field(
        default_factory=list, description="At most one bucket per region; the winner is JOB_BUCKET"
    )
    bundle: str | None = Field(
        default=None,
        description="In job.yaml: a directory relative to the file. On the topic: a gs:// URI or none",
    )
    priority: Priority = Priority.normal
    caches: list[CacheSpec] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    command: str = Field(min_length=1)
    zone: str | None = None
    tpu_name: str | None = None
    max_preemptions: int | None = Field(default=None, ge=0, le=1000)
    max_infra_retries: int | None = Field(default=None, ge=0, le=100)
    retry_on_infrastructure_failure: StrictBool = Field(
        default=True, description="tpu-runner's: false makes a preemption or infrastructure failure end the job"
    )
    # `max_duration` (dstack's name for it): the longest one attempt may run. A number of seconds, or a duration
    # such as 90m, 2h, 1h30m, 1d. Bounded by a year so that a typo like 2000d is caught rather than stored.
    max_duration: Annotated[int | None, BeforeValidator(lambda v: None if v is None else parse_duration(v))] = Field(
        default=None, description="dstack's: the longest one attempt may run (seconds, or 90m, 2h, 1h30m); then "
        "it is stopped (TERM, then KILL after the grace) and ends failed, 'timed out after ...'. None: no limit",
    )
    infra_failure_patterns: list[Annotated[str, AfterValidator(check_pattern)]] = Field(
        default_factory=list, max_length=MAX_PATTERNS,
        description="Regular expressions: an exit whose last lines match one is an infrastructure failure of the "
        "slice (retried on a fresh one, from max_infra_retries), not the job's own (tpuq.contracts.runtime_failures)",
    )
    builtin_infra_failure_patterns: StrictBool = Field(
        default=True, description="false: the known TPU runtime failure texts (device busy, backend initialization "
        "timeout, coordination service unreachable, libtpu in use) no longer count as infrastructure failures",
    )
    array: Annotated[int | str | None, BeforeValidator(_array_value)] = Field(
        default=None, description="A group of tasks <id>-<index>: a number (8), or Slurm's indices (\"0-15\", "
        "\"1,3,5\"), with \"%K\" to run at most K at once (tpuq.contracts.arrays)",
    )
    sweep: dict[str, list[Any]] | None = Field(
        default=None, description="A group of one task per combination: {NAME: [values], ...}; each task's env has "
        "its values (tpuq.contracts.arrays)",
    )
    max_running: int | None = Field(
        default=None, ge=1, le=arrays.MAX_ARRAY_TASKS, description="A group's: at most this many of its tasks assigned "
        "or running at once (what array's %K says)",
    )
    notify: NotifyList | None = Field(
        default=None, description="Destinations told of this job's events (a group's: of the group's end, and of "
        "each task's preemptions and long waits); with the fleet file's (tpuq.contracts.notify)",
    )
    slices: Annotated[int | list[int] | None, BeforeValidator(multislice.parse_slices)] = Field(
        default=None, description="Multislice: run on this many slices of the type at once (2..64), or the largest "
        "count it can get of a descending list such as [4, 2]; absent or 1: one slice (tpuq.contracts.multislice)",
    )
    depends_on: list[str] | DependsOnAny | None = Field(
        default=None, description="Job or group ids this job waits for: a list waits until each has succeeded "
        "(one failed, cancelled or rejected cancels this job), {any: [...]} until each has ended",
    )

    @model_validator(mode="before")
    @classmethod
    def _depends_on_entries(cls, value: Any) -> Any:
        if isinstance(value, dict):
            check_depends_on(value.get("depends_on"), JOB_ID_RE)
        return value

    @model_validator(mode="after")
    def _not_on_itself(self) -> "JobSpec":
        names = dependency_names(self.depends_on)
        if self.id and self.id in names:
            raise ValueError(f"depends_on[{names.index(self.id)}]: a job cannot depend on itself ({self.id!r})")
        own_task = [n for n in names if self.id and self.is_group and n.startswith(f"{self.id}-")
                    and n[len(self.id) + 1:].isdigit()]
        if own_task:
            raise ValueError(f"depends_on[{names.index(own_task[0])}]: {own_task[0]!r} is a task of this group: its "
                             "tasks would wait for each other")
        return self

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        if value is not None and not JOB_ID_RE.match(value):
            raise ValueError("must be 1-63 lowercase letters, digits or '-', starting with a letter or digit")
        return value

    @field_validator("tpu")
    @classmethod
    def _tpu_types(cls, types: list[str]) -> list[str]:
        if any(isinstance(t, str) and t.strip().lower() == ANY_TPU for t in types):
            if len(types) > 1:
                raise ValueError(f"{ANY_TPU!r} means every type the fleet offers: give it alone, not in a list")
            return [ANY_TPU]
        out: list[str] = []
        for t in types:
            try:
                name = parse_accelerator_type(t).name
            except UnknownAcceleratorType as e:
                raise ValueError(str(e)) from None
            if name not in out:
                out.append(name)
        return out

    @field_validator("command")
    @classmethod
    def _command(cls, command: str) -> str:
        if not command.strip():
            raise ValueError("must not be empty")
        size = _utf8_bytes(command)
        if size > MAX_COMMAND_BYTES:
            raise ValueError(f"is {size:,} bytes; a command may hold at most {MAX_COMMAND_BYTES:,} (the job is stored "
                             "in one Firestore document, at most 1 MiB): put a longer script in the bundle and run it")
        return command

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not _ENV_NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name in RUNNER_ENV:
                raise ValueError(f"{name!r} is reserved: the runner sets it")
            if name.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"{name!r} is reserved: names starting with {RESERVED_ENV_PREFIX} belong to tpuq")
            _refuse_megascale(name)
        stored_in_one_document = ("(the job is stored in one Firestore document, at most 1 MiB): put large values "
                                  "in the bundle or a bucket and pass their path")
        for name, value in env.items():
            size = _utf8_bytes(value)
            if size > MAX_ENV_VALUE_BYTES:
                raise ValueError(f"the value of {name!r} is {size:,} bytes; a value may hold at most "
                                 f"{MAX_ENV_VALUE_BYTES:,} {stored_in_one_document}")
        total = sum(_utf8_bytes(name) + _utf8_bytes(value) for name, value in env.items())
        if total > MAX_ENV_BYTES:
            raise ValueError(f"names and values are {total:,} bytes together; env may hold at most {MAX_ENV_BYTES:,} "
                             f"{stored_in_one_document}")
        return env

    @field_validator("zone")
    @classmethod
    def _zone(cls, zone: str | None) -> str | None:
        if zone is not None:
            zone_region(zone)
        return zone

    @field_validator("caches")
    @classmethod
    def _unique_cache_keys(cls, caches: list[CacheSpec]) -> list[CacheSpec]:
        keys = [c.key for c in caches]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"cache key {dupes[0]!r} is declared twice")
        return caches

    @model_validator(mode="after")
    def _retry_choice(self) -> "JobSpec":
        if not self.retry_on_infrastructure_failure:
            given = [f for f in ("max_preemptions", "max_infra_retries") if (getattr(self, f) or 0) > 0]
            if given:
                raise ValueError(f"retry_on_infrastructure_failure: false retries nothing, so {given[0]} cannot "
                                 "grant retries; drop one of the two")
        return self

    @model_validator(mode="after")
    def _group(self) -> "JobSpec":
        """`array:` / `sweep:` / `max_running:` (tpuq.contracts.arrays), each refusal naming its field."""
        if self.array is not None and self.sweep is not None:
            raise ValueError("array: give array or sweep, not both: a sweep already makes one task per combination; "
                             "to repeat each, add a variable to the sweep (e.g. SEED: [0, 1, 2])")
        if self.sweep is not None:
            try:
                for name in self.sweep:
                    _refuse_megascale(name)
                checked = arrays.check_sweep(self.sweep, self.env, RUNNER_ENV, RESERVED_ENV_PREFIX, _ENV_NAME_RE,
                                             MAX_ENV_VALUE_BYTES, MAX_ENV_BYTES)
            except ValueError as e:
                raise ValueError(f"sweep: {e}") from None
            object.__setattr__(self, "sweep", checked)
        if not self.is_group:
            if self.max_running is not None:
                raise ValueError("max_running: limits the tasks of a group running at once; give it with array or "
                                 "sweep")
            return self
        limit = self.array_shape.limit if self.array is not None else None
        if limit is not None and self.max_running is not None and limit != self.max_running:
            raise ValueError(f"max_running: {self.max_running} and array's %{limit} disagree; give one")
        if self.id is not None:
            room = 63 - arrays.longest_task_suffix(self.array, self.sweep)
            if len(self.id) > room:
                raise ValueError(f"id: {self.id!r} leaves no room for the task suffix: a group's id may be at most "
                                 f"{room} characters here (task ids are <id>-<index>, at most 63)")
        return self

    @model_validator(mode="after")
    def _slices(self) -> "JobSpec":
        multislice.refuse_with(self.slices, self.tpu, self.any_tpu, self.tpu_name)
        return self

    @property
    def slice_counts(self) -> tuple[int, ...]:
        """The slice counts to try, largest first: (1,) for one slice."""
        return multislice.slice_counts(self.slices)

    @property
    def is_group(self) -> bool:
        return self.array is not None or self.sweep is not None

    @property
    def array_shape(self) -> arrays.ArrayShape:
        return arrays.parse_array(self.array)

    @property
    def group_limit(self) -> int | None:
        """At most this many tasks of the group assigned or running at once; None: no limit."""
        if self.max_running is not None:
            return self.max_running
        return self.array_shape.limit if self.array is not None else None

    @model_validator(mode="after")
    def _fits_one_document(self) -> "JobSpec":
        """Every other field is free in size too (buckets, caches, bundle, tpu_name): the whole spec is bounded."""
        total = len(self.model_dump_json(exclude_none=True).encode())
        if total > MAX_SPEC_BYTES:
            sizes = {name: len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
                     for name, value in self.model_dump(mode="json", exclude_none=True).items()}
            largest = max(sizes, key=sizes.__getitem__)
            raise ValueError(f"{largest}: the job is {total:,} bytes as JSON ({largest}: {sizes[largest]:,}); a job "
                             f"may hold at most {MAX_SPEC_BYTES:,} (it is stored in one Firestore document, at most "
                             "1 MiB)")
        return self

    @property
    def any_tpu(self) -> bool:
        return self.tpu == [ANY_TPU]

    @model_validator(mode="after")
    def _one_bucket_per_region(self) -> "JobSpec":
        seen: dict[str, str] = {}
        for b in self.buckets:
            if b.region is None:
                if len(self.buckets) > 1:
                    raise ValueError(
                        f"buckets: cannot tell the region of {b.uri}; write it as "
                        f"{{uri: {b.uri}, region: REGION}} or end the bucket name with the region"
                    )
                continue
            if b.region in seen:
                raise ValueError(
                    f"buckets: {seen[b.region]} and {b.uri} are both in region {b.region}; list one bucket per region"
                )
            seen[b.region] = b.uri
        if self.zone and self.regions and zone_region(self.zone) not in self.regions:
            raise ValueError(f"zone: {self.zone} is not in a region of the job's buckets {sorted(self.regions)}")
        return self

    @property
    def regions(self) -> set[str]:
        """Regions the job may run in; empty means anywhere."""
        return {b.region for b in self.buckets if b.region}

    def bucket_for_region(self, region: str) -> str | None:
        for b in self.buckets:
            if b.region == region:
                return b.uri
        if len(self.buckets) == 1 and self.buckets[0].region is None:
            return self.buckets[0].uri
        return None


class PublishedJob(JobSpec):
    """A job on the `jobs` topic: the bundle, if any, is already in a bucket, and `notify` names secrets only."""

    @field_validator("notify")
    @classmethod
    def _notify_secrets_only(cls, notify):
        refuse_inline_urls(notify, "notify")
        return notify

    @field_validator("bundle")
    @classmethod
    def _bundle_uri(cls, bundle: str | None) -> str | None:
        if bundle is not None:
            if not bundle.startswith("gs://"):
                raise ValueError(f"{bundle!r}: on the jobs topic a bundle is a gs:// URI of a .tar.gz already in a "
                                 "bucket; `tpuq submit job.yaml` bundles and uploads a local directory")
            _, path = split_gs_uri(bundle)
            if not path or path.endswith("/"):
                raise ValueError(f"{bundle!r} must name an object, e.g. gs://bucket/bundles/x.tar.gz")
        return bundle


def _refuse_duplicate_ids(jobs) -> None:
    """A file's job ids are its jobs' names in the queue: one may not be given twice."""
    ids = [j.id for j in jobs if j.id]
    # A group's tasks are jobs too: `train` (array: 3) and `train-1` cannot both be in one file.
    ids += [t.id for j in jobs if j.id and j.is_group for t in arrays.group_tasks(j.id, j.array, j.sweep)]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"jobs: id {dupes[0]!r} is used twice")


class JobFile(StrictModel):
    """A job.yaml: `jobs: [...]`."""

    jobs: list[JobSpec] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _single_job(cls, value: Any) -> Any:
        # A file with one job at top level is accepted as a one-job list.
        if isinstance(value, dict) and "jobs" not in value and "command" in value:
            return {"jobs": [value]}
        return value

    @model_validator(mode="after")
    def _unique_ids(self) -> "JobFile":
        _refuse_duplicate_ids(self.jobs)
        refuse_dependency_cycles(self.jobs)
        return self


class PublishedJobFile(StrictModel):
    """A whole `jobs:` file published as one message (`gcloud pubsub topics publish jobs --message="$(cat f)"` of a
    JSON file): every job in it is submitted. Bundles must already be gs:// URIs, as for one job."""

    jobs: list[PublishedJob] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> "PublishedJobFile":
        _refuse_duplicate_ids(self.jobs)
        refuse_dependency_cycles(self.jobs)
        return self


def job_id_base(text: str) -> str:
    """The readable part of a job id tpuq makes up (`tpuq submit`, an uploaded job file): lower-case letters, digits
    and dashes, at most 40 characters; the callers append a random or derived hex suffix."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "job"
