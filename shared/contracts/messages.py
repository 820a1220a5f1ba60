"""Every message on every topic, one pydantic model each.

`tpuq.contracts.topology` names the topic each model travels on. Messages are JSON
objects in the Pub/Sub `data` field; unknown fields are refused so that a typo
never silently drops an instruction.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from tpuq.contracts import store
from tpuq.contracts.documents import ClaimerQrState, NodeHealth, QueuedResourceState, WorkerEndpoint, short_node_name
from tpuq.contracts.errors import Permanent
from tpuq.contracts.jobspec import PublishedJob, PublishedJobFile, StrictModel
from tpuq.contracts.multislice import MAX_SLICES
from tpuq.contracts.notify import Notification  # noqa: F401 (the `notifications` topic's message, kept there)


class JobSubmission:
    """The `jobs` topic carries a PublishedJob, or a whole `jobs:` file (PublishedJobFile) pasted as one message."""

    @staticmethod
    def model_of(payload) -> type[PublishedJob] | type[PublishedJobFile]:
        """The model `payload` is validated as (its errors' field names are that model's)."""
        return PublishedJobFile if isinstance(payload, dict) and "jobs" in payload else PublishedJob

    @staticmethod
    def model_validate(payload) -> PublishedJob | PublishedJobFile:
        return JobSubmission.model_of(payload).model_validate(payload)

# Who submitted a job: the `owner` attribute of its `jobs` message, stored as the job's `owner`. Pub/Sub tells a
# subscriber nothing about the publisher (a push's OIDC token is the push subscription's account, the message has
# only data, attributes, id and publish time), so the publisher says who it is: `tpuq submit` sets the account of
# its credentials; with gcloud, `--attribute=owner=you@example.com`. A label for people, not an access check.
OWNER_ATTRIBUTE = "owner"
OWNER_MAX_LENGTH = 254  # an email address's limit


def message_owner(attributes: dict[str, str]) -> str | None:
    """The owner a `jobs` message names, or None; a malformed one is refused (Permanent, field `owner`)."""
    value = (attributes.get(OWNER_ATTRIBUTE) or "").strip()
    if not value:
        return None
    if len(value) > OWNER_MAX_LENGTH or not value.isprintable():
        raise Permanent(f"owner: the attribute must be printable text of at most {OWNER_MAX_LENGTH} characters "
                        "(an account like you@example.com)", field="owner")
    return value


def _document_id(value: str) -> str:
    problem = store.id_problem(value)
    if problem:
        raise ValueError(f"names a Firestore document, so it {problem}")
    return value


def _node_name(value: str) -> str:
    problem = store.id_problem(short_node_name(value))
    if problem:
        raise ValueError(f"the node's short name (after the last '/') names its tpus document, so it {problem}")
    return value


# A field whose value is a document's id (jobs/{job_id}, fleets/{fleet}, requests/{request_id}), or a node whose
# short name is (tpus/{node}): refused in the message, never sent on to Firestore as a path or a bad id.
DocumentId = Annotated[str, AfterValidator(_document_id)]
NodeName = Annotated[str, AfterValidator(_node_name)]


class CapacityAction(str, Enum):
    request = "request"
    withdraw = "withdraw"


class CapacityRequest(StrictModel):
    """Scheduler -> claimer: hold `count` slices of any of `types` (or stop asking)."""

    request_id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    action: CapacityAction = CapacityAction.request
    fleet: DocumentId
    types: list[str] = Field(default_factory=list)
    regions: list[str] = Field(default_factory=list, description="Empty: any region")
    zones: list[str] = Field(default_factory=list, description="Empty: any zone of the fleet")
    count: int = Field(default=1, ge=0, le=1000)
    # A gang (Cloud TPU Multislice): one queued resource of this many slices (`multisliceParams.nodeCount`), the
    # counts to try largest first (an elastic job's `slices: [4, 2]`). Empty: single slices, `count` of them. A gang
    # request holds one gang (`count` 1); the fleet's `count`, quota and budgets count its slices.
    slices: list[int] = Field(default_factory=list, max_length=MAX_SLICES)
    job_ids: list[str] = Field(default_factory=list, description="The jobs that asked, for status")
    at: datetime | None = None

    @field_validator("slices")
    @classmethod
    def _gang_sizes(cls, value: list[int]) -> list[int]:
        if value and (any(n < 1 or n > MAX_SLICES for n in value) or value != sorted(set(value), reverse=True)
                      or value[0] < 2):
            raise ValueError(f"{value}: gang sizes from 2 to {MAX_SLICES}, largest first, each once")
        return value


class FleetEventKind(str, Enum):
    """The queued-resource state the claimer saw; its value is that state's name. One kind is no such state:
    `node_health`, the health or upcoming maintenance of an ACTIVE slice's node changed (`FleetEvent.node_health`)."""

    active = QueuedResourceState.ACTIVE.value
    suspended = QueuedResourceState.SUSPENDED.value
    failed = QueuedResourceState.FAILED.value
    gone = ClaimerQrState.GONE.value
    provisioning = QueuedResourceState.PROVISIONING.value
    waiting = QueuedResourceState.WAITING_FOR_RESOURCES.value
    node_health = "NODE_HEALTH"


class FailureClass(str, Enum):
    """Why a queued resource failed, as `tpuq.claimer.classify` reads it; `tpuq.claimer.decide` acts on it."""

    capacity = "capacity"  # stocked out: back off that zone, race elsewhere
    zone_quota = "zone_quota"  # no quota for that type there: drop the zone until the fleet file changes
    external_ip_quota = "external_ip_quota"  # the region's IN_USE_ADDRESSES quota: one retry, then stop (use vpc)
    expired = "expired"  # validUntil reached while queued: request again in the same zone, no penalty
    project = "project"  # billing, permission, API disabled: stop everywhere until a person acts
    network = "network"  # the fleet's subnetwork is not in that region (subnets are regional): drop the region
    unknown = "unknown"  # anything else: one retry after a back-off, then stop that target for a long back-off


class FleetEvent(StrictModel):
    """Claimer -> scheduler, janitor: an owned queued resource changed state."""

    kind: FleetEventKind
    fleet: DocumentId
    queued_resource: str  # full name projects/P/locations/Z/queuedResources/ID
    request_id: DocumentId | None = None
    zone: str
    type: str
    node: NodeName | None = None  # full node name when it exists
    entry_id: str | None = None
    chips: int = 0
    hosts: int = 0
    spot: bool = True
    endpoints: list[WorkerEndpoint] = Field(default_factory=list)
    failure_class: FailureClass | None = None
    failure_message: str | None = None
    # The node's health, symptoms and upcoming maintenance as the claimer last read them (ACTIVE, NODE_HEALTH).
    node_health: NodeHealth | None = None
    # A slice of a multislice queued resource: its index (the node `<prefix>-<index>`) and the gang's size. Every
    # event of such a request is sent once per slice, each naming its node.
    slice_index: int | None = Field(default=None, ge=0)
    slice_count: int = Field(default=1, ge=1, le=MAX_SLICES)
    at: datetime


class AssignmentAction(str, Enum):
    assign = "assign"
    cancel = "cancel"


class AssignedSlice(StrictModel):
    """One slice of a multislice attempt: its node and workers."""

    node: NodeName
    endpoints: list[WorkerEndpoint] = Field(default_factory=list)


class Assignment(StrictModel):
    """Scheduler -> executor: run attempt `attempt` of a job on a TPU (or stop it)."""

    action: AssignmentAction = AssignmentAction.assign
    job_id: DocumentId
    attempt: int = Field(ge=1)
    attempt_id: str
    node: NodeName  # full node name
    zone: str
    endpoints: list[WorkerEndpoint] = Field(default_factory=list)
    job: PublishedJob | None = None
    job_bucket: str | None = None
    attempt_gcs_dir: str | None = None
    checkpoint_gcs_dir: str | None = None
    # Where the attempt stands, for the job's TPUQ_PREEMPTIONS and TPUQ_RESUMING (jobspec.ATTEMPT_ENV): the job's
    # preemptions before this attempt, and whether an earlier attempt of it started. Defaults: a message from before
    # these fields parses as a first run.
    preemptions: int = Field(default=0, ge=0)
    resuming: bool = False
    # A group's task (jobspec.ARRAY_ENV): its index and the group's number of tasks; None on a job of no group.
    array_index: int | None = Field(default=None, ge=0)
    array_size: int | None = Field(default=None, ge=1)
    # A multislice attempt (Cloud TPU Multislice): every slice in slice order, slice 0 being `node` and `endpoints`;
    # the job runs on every worker of every slice. Empty: one slice. `slices_wanted` is the largest count the job
    # asked for (an elastic job may run on fewer: TPUQ_SLICES_WANTED).
    slices: list[AssignedSlice] = Field(default_factory=list, max_length=MAX_SLICES)
    slices_wanted: int | None = Field(default=None, ge=1, le=MAX_SLICES)
    at: datetime


class AttemptOutcome(str, Enum):
    succeeded = "succeeded"
    failed = "failed"  # application exit != 0: terminal
    failed_setup = "failed_setup"  # bundle / cache / workspace: terminal
    preempted = "preempted"  # node preempted or host gone: retryable
    infra_failed = "infra_failed"  # could not reach hosts etc.: retryable, small budget
    cancelled = "cancelled"


class AttemptEventKind(str, Enum):
    started = "started"
    ended = "ended"


class AttemptEvent(StrictModel):
    """Executor -> scheduler, janitor: an attempt started or ended."""

    kind: AttemptEventKind
    job_id: DocumentId
    attempt: int = Field(ge=1)
    attempt_id: str
    node: NodeName
    outcome: AttemptOutcome | None = None
    detail: str | None = Field(default=None, max_length=8000)
    exit_codes: dict[str, int] = Field(default_factory=dict, description="worker id -> exit code")
    at: datetime


class Tick(StrictModel):
    """Ticks drive watches, timeouts and reconciles (Cloud Scheduler or the local tick source)."""

    at: datetime | None = None
    seq: int | None = None
    source: str = "tick"
    # A person changed something no event announces (`tpuq fleet apply`, `pause`, `resume`, `drain`,
    # `set-priority`: tpuq.operations.jobs.nudge): every service runs the work its quiet ticks skip until their
    # cadence (the scheduler's full pass, the claimer's watch) now, not minutes later.
    nudge: bool = False


class CancelRequest(StrictModel):
    """CLI -> scheduler: cancel a job."""

    job_id: DocumentId
    reason: str = "cancelled by user"
    requested_by: str | None = None
    at: datetime | None = None
    # `tpuq cancel --if-pending`: cancel only a job still pending at attempt `expected_attempt` (the number of
    # attempts it had when the CLI read it): one that was assigned meanwhile, even if requeued since, is left alone.
    if_pending: bool = False
    expected_attempt: int | None = None


class GcsObjectEvent(StrictModel):
    """A GCS object notification (JSON_API_V1 payload); only the fields tpuq reads."""

    model_config = StrictModel.model_config | {"extra": "ignore"}

    bucket: str
    name: str
    generation: str | int | None = None
    size: str | int | None = None
    contentType: str | None = None
    metageneration: str | int | None = None


class DeadLetterRecord(StrictModel):
    """What the handler adapter stores for a message it could never process."""

    message_id: str
    subscription: str | None = None
    topic: str | None = None
    reason: str
    field: str | None = None
    raw_data: str  # the payload, decoded as text where possible
    attributes: dict[str, str] = Field(default_factory=dict)
    job_id: str | None = None
    recorded_at: datetime
    kind: Literal["invalid", "poison", "exhausted"] = "invalid"
