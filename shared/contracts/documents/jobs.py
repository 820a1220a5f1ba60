"""jobs/{job_id} and jobs/{job_id}/attempts/{n}: their states and typed views."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from tpuq.contracts import store
from tpuq.contracts.documents.common import _state, _View


class JobState(StrEnum):
    """jobs/{id}.state. Which edges exist between them is `tpuq.contracts.jobstate.TRANSITIONS`."""

    pending = "pending"
    assigned = "assigned"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    rejected = "rejected"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES


# A job in one of these never changes state again (the CLI stops watching, the demo stops waiting).
TERMINAL_JOB_STATES = frozenset({JobState.succeeded, JobState.failed, JobState.cancelled, JobState.rejected})
# The job holds a TPU: an attempt was handed to the executor and has not ended.
JOB_STATES_ON_A_TPU = (JobState.assigned, JobState.running)
# How a `blocked` text ends when it is one racer's refusal while the job's request goes on (a stockout in one zone
# while the others race, a request that expired in the queue and is asked again): no block, and not shown as one
# (`tpuq.operations.jobs.blocked_label`). `tpuq.scheduler.lifecycle.request_failure_reason` writes them.
RACING_ON = "racing on in the other zones"
ASKING_AGAIN = "asking again"
STILL_RACING_ENDINGS = (RACING_ON, ASKING_AGAIN)


class AttemptState(StrEnum):
    """jobs/{id}/attempts/{n}.state; the attempt's result is its `outcome` (`tpuq.contracts.messages.AttemptOutcome`)."""

    assigned = "assigned"
    running = "running"
    ended = "ended"



@dataclass(frozen=True)
class JobDoc(_View):
    """jobs/{job_id}: one job. Written by the scheduler (intake, the pass, the lifecycle) and, for a submission
    refused before intake, by the push adapter (stored `rejected`); read by the CLI and the demo."""

    COLLECTION: ClassVar[str] = store.JOBS

    id: str
    state: JobState
    spec: Mapping[str, Any] | None = None  # the PublishedJob as stored; absent on a job rejected at intake
    priority: str | None = None
    priority_rank: int | None = None
    types: tuple[str, ...] = ()
    source: str | None = None  # cli, pubsub or gcs
    owner: str | None = None  # who submitted it: the `owner` attribute of its message (tpuq.contracts.messages.OWNER_ATTRIBUTE)
    message_id: str | None = None
    submit_time: datetime | None = None
    updated_at: datetime | None = None
    # The current attempt (0 before the first), and how many were ever made.
    attempt: int = 0
    attempts: int = 0
    attempt_id: str | None = None
    tpu: str | None = None  # the node's full name while assigned or running
    # A multislice attempt's nodes, slice order (slice 0 is `tpu`), while assigned or running; () on one slice.
    gang: tuple[str, ...] = ()
    zone: str | None = None
    region: str | None = None
    job_bucket: str | None = None
    attempt_gcs_dir: str | None = None
    checkpoint_gcs_dir: str | None = None
    pinned_region: str | None = None  # set once an attempt started: retries stay where its checkpoints are
    assigned_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    not_before: datetime | None = None  # the retry back-off
    preemptions: int = 0
    infra_failures: int = 0
    reason: str | None = None
    blocked: str | None = None  # why a pending job cannot get a TPU now
    # The job or group ids its spec's `depends_on` names (queried with array-contains when one of them ends), and
    # while one is not met, why it waits ("waiting for train-3 (running)"): it is then not matched and asks nothing.
    depends_on_ids: tuple[str, ...] = ()
    waiting: str | None = None
    capacity_request: Mapping[str, Any] | None = None  # the open request: {id, n, entry_id, at}
    capacity_requests: int = 0  # requests made so far (the next request's number)
    cancel_requested: bool = False
    cancel_reason: str | None = None
    assignment_republished_at: datetime | None = None
    assignment_republishes: int = 0  # how often the tick sent the current attempt's assignment again
    # A task of a group (`array:` / `sweep:`, tpuq.contracts.arrays): the group's id (the submitted job's; never a job
    # document itself), the task's index, the group's number of tasks, and its limit on tasks assigned or running at
    # once (None: none). All None on a job of no group.
    group: str | None = None
    array_index: int | None = None
    array_size: int | None = None
    array_limit: int | None = None
    # Notifications (tpuq.scheduler.notices): when the job last went back to the queue (an attempt retried; None:
    # pending since `submit_time`), and the `pending` notice sent in that spell: {attempt, after} (`after`: the
    # longest `pending_after` of a destination told).
    pending_since: datetime | None = None
    pending_notice: Mapping[str, Any] | None = None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], doc_id: str | None = None) -> "JobDoc":
        """The view of a stored job; `doc_id` (the snapshot's id) stands in for a missing `id`."""
        job_id = doc.get("id") or doc_id or ""
        return cls._from_stored(doc, id=job_id, state=_state(JobState, doc, f"{store.JOBS}/{job_id}"))

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def capacity_request_id(self) -> str | None:
        return (self.capacity_request or {}).get("id")

    @property
    def capacity_request_entry(self) -> str | None:
        return (self.capacity_request or {}).get("entry_id")

    @property
    def spec_tpu(self) -> list[str]:
        """The TPU types the job asked for, as stored in its spec."""
        return list((self.spec or {}).get("tpu") or [])

    @property
    def spec_slice_counts(self) -> tuple[int, ...]:
        """The slice counts the job asked for, largest first ((1,): one slice). Read from the stored spec, so a job
        stored before `slices:` existed reads as one slice, and no field was added to migrate
        (tpuq.contracts.multislice)."""
        from tpuq.contracts.multislice import slice_counts

        return slice_counts((self.spec or {}).get("slices"))


@dataclass(frozen=True)
class AttemptDoc(_View):
    """jobs/{job_id}/attempts/{n}: one attempt of a job (the scheduler writes it; the CLI and the demo read it)."""

    COLLECTION: ClassVar[str] = f"{store.JOBS}/{{job_id}}/{store.ATTEMPTS}"

    attempt: int
    state: AttemptState
    attempt_id: str | None = None
    tpu: str | None = None
    gang: tuple[str, ...] = ()  # a multislice attempt's nodes, slice order (slice 0 is `tpu`)
    zone: str | None = None
    region: str | None = None
    outcome: str | None = None  # a tpuq.contracts.messages.AttemptOutcome value, once ended
    detail: str | None = None
    assigned_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], doc_id: str | None = None) -> "AttemptDoc":
        """The view of a stored attempt; `doc_id` (its number, the snapshot's id) stands in for `attempt`."""
        n = doc.get("attempt")
        if n is None and doc_id and doc_id.isdigit():
            n = int(doc_id)
        where = f"{store.JOBS}/.../{store.ATTEMPTS}/{doc_id or n}"
        return cls._from_stored(doc, attempt=int(n or 0), state=_state(AttemptState, doc, where))

