"""tpus/{node}: one owned TPU node, its states and typed view."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import Field

from tpuq.contracts import store
from tpuq.contracts.documents.common import _View
from tpuq.contracts.jobspec import StrictModel


class TpuState(StrEnum):
    """tpus/{node}.state: the scheduler's view of an owned TPU node."""

    idle = "idle"  # ready for an assignment (scheduler: ACTIVE event, attempt freed it)
    busy = "busy"  # running an attempt (scheduler: assignment)
    deleting = "deleting"  # the janitor decided to delete it (a guarded write before the delete call)
    gone = "gone"  # lost or deleted (scheduler: SUSPENDED / FAILED / GONE event; janitor: delete done)


def lost_by_preemption(gone_reason: str | None) -> bool:
    """Whether a gone TPU's `gone_reason` says it was preempted: its queued resource was seen SUSPENDED (a spot or
    preemptible slice reclaimed; the node itself reads PREEMPTED). GONE (NOT_FOUND: deleted, perhaps after a
    preemption tpuq never saw), FAILED or a janitor's delete prove no preemption."""
    from tpuq.contracts.documents.tpuapi import QueuedResourceState

    return gone_reason == QueuedResourceState.SUSPENDED.value


def lost_node_detail(short: str | None, kind: str, failure_message: str | None = None) -> str:
    """Why an attempt's TPU is no more, in words, from the fleet event's kind (a queued-resource state) or the
    TPU's `gone_reason`: "TPU tpuq-abc preempted (its queued resource is SUSPENDED)", never a bare `GONE`."""
    from tpuq.contracts.documents.tpuapi import ClaimerQrState, QueuedResourceState

    node = f"TPU {short or '?'}"
    if lost_by_preemption(kind):
        return f"{node} preempted (its queued resource is {kind})"
    if kind == ClaimerQrState.GONE.value:
        return (f"{node} gone: its queued resource no longer exists (deleted outside tpuq, or a preempted TPU "
                "deleted before tpuq saw it SUSPENDED)")
    if kind == QueuedResourceState.FAILED.value:
        return f"{node} failed (its queued resource is FAILED" + (f": {failure_message})" if failure_message else ")")
    return f"{node} gone ({kind})"


# Two meanings, two names:
# still holds a slice of the fleet entry's `max_slices` (the scheduler's capacity cap): a TPU being deleted
# counts until it is gone, or the scheduler would ask for a replacement while the old one still holds quota;
TPU_STATES_HOLDING_A_SLICE = frozenset({TpuState.idle, TpuState.busy, TpuState.deleting})
# serves or can serve a job (the janitor's pool, of which `keep_warm_count` are kept).
TPU_STATES_IN_SERVICE = frozenset({TpuState.idle, TpuState.busy})


@dataclass(frozen=True)
class TpuDoc(_View):
    """tpus/{node}: one owned TPU node. Written by the scheduler (an ACTIVE event records it idle, an assignment
    makes it busy, a freed attempt idle again, a lost node gone), the janitor (deleting, gone) and the executor
    (`host_keys`); read by the janitor, the CLI, the fleet report and the UI.

    The first fields are the janitor's, in the order its callers construct the view."""

    COLLECTION: ClassVar[str] = store.TPUS

    id: str
    fleet: str | None = None
    entry_id: str | None = None  # the fleet entry it serves
    state: str | None = None  # a TpuState value (kept as stored: the janitor reads documents of any state)
    idle_since: datetime | None = None
    queued_resource: str | None = None  # the queued resource's full name
    name: str | None = None  # the node's full name
    deleting_since: datetime | None = None
    quarantined: bool = False  # its last attempt ended preempted / unreachable: never reused
    quarantine_reason: str | None = None
    # Who it is (the ACTIVE event's node, `tpuq.scheduler.lifecycle`)
    short: str | None = None  # the short node name, the document's id
    zone: str | None = None
    region: str | None = None
    type: str | None = None  # the canonical TPU type
    request_id: str | None = None  # the capacity request it served
    # A slice of a multislice queued resource (its node `<id>-<slice_index>`): deleted only with all its siblings,
    # as deleting the queued resource deletes every slice.
    slice_index: int | None = None
    slice_count: int = 1
    # Recorded before its gang's other slices: offered to no job until every slice is (a pass in between could give
    # part of the gang to another job). Cleared on all of them by the last slice's ACTIVE.
    gang_waiting: bool = False
    endpoints: tuple[Mapping[str, Any], ...] = ()  # WorkerEndpoint dumps
    chips: int | None = None
    hosts: int | None = None
    spot: bool | None = None
    node_health: Mapping[str, Any] | None = None  # NodeHealth.to_doc()
    node_health_at: datetime | None = None  # when the claimer read that health (the event's `at`): no older reading replaces it
    # What it does
    job_id: str | None = None  # the job holding it while busy
    attempt_id: str | None = None
    busy_since: datetime | None = None
    delete_reason: str | None = None
    gone_at: datetime | None = None
    gone_reason: str | None = None  # a fleet event kind, or the janitor's reason
    host_keys: Mapping[str, str] | None = None  # worker -> pinned SSH host key (the executor's, first writer wins)
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], doc_id: str | None = None) -> "TpuDoc":
        """The view of a stored TPU; `doc_id` (the snapshot's id) is its id. Fields the view does not know are
        ignored; a state is kept as stored."""
        return cls._from_stored(doc, id=doc_id or doc.get("short") or "", quarantined=bool(doc.get("quarantined")))


class WorkerEndpoint(StrictModel):
    """One worker of a node, as the Cloud TPU API reports it (`networkEndpoints[worker_id]`).

    Stored in tpus/{node}.endpoints and queued_resources/{id}.endpoints, and carried by fleet events and
    assignments."""

    worker_id: int = Field(ge=0)
    ip: str = Field(description="The internal IP (`ipAddress`): the workers' peers, and SSH for vpc/iap fleets")
    external_ip: str | None = Field(default=None, description="`accessConfig.externalIp`: SSH for direct fleets")
    port: int | None = Field(default=None, description="The TPU runtime's port (8470) as reported; never SSH (22)")
    hostname: str | None = None

