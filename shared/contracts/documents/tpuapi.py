"""The Cloud TPU API's states and a node's health: what the claimer reads, and tpus/ and queued_resources/ store."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import Field

from tpuq.contracts.documents.common import parse_timestamp
from tpuq.contracts.jobspec import StrictModel


class QueuedResourceState(StrEnum):
    """tpu_v2 `QueuedResourceState.State`, as the API reports it (STATE_UNSPECIFIED is never reported).

    The fake TPU API (`tpuq_dev.faketpu`) runs this same enum."""

    CREATING = "CREATING"
    ACCEPTED = "ACCEPTED"
    WAITING_FOR_RESOURCES = "WAITING_FOR_RESOURCES"
    PROVISIONING = "PROVISIONING"
    ACTIVE = "ACTIVE"
    FAILED = "FAILED"
    DELETING = "DELETING"
    SUSPENDING = "SUSPENDING"
    SUSPENDED = "SUSPENDED"


class ClaimerQrState(StrEnum):
    """The two states the claimer records in queued_resources/{id}.state that the API never reports."""

    REQUESTED = "REQUESTED"  # the create is recorded (with the zone claim) but the API's answer is not seen yet
    GONE = "GONE"  # the API says NOT_FOUND: the queued resource no longer exists


class TpuNodeState(StrEnum):
    """tpu_v2 `Node.State`, as the API reports it (STATE_UNSPECIFIED is never reported).

    The fake TPU API runs this same enum (it moves its nodes through CREATING, READY, DELETING, PREEMPTED)."""

    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REIMAGING = "REIMAGING"
    DELETING = "DELETING"
    REPAIRING = "REPAIRING"
    STOPPED = "STOPPED"
    STOPPING = "STOPPING"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    HIDING = "HIDING"
    HIDDEN = "HIDDEN"
    UNHIDING = "UNHIDING"
    UNKNOWN = "UNKNOWN"


class TpuHealth(StrEnum):
    """tpu_v2 `Node.Health` (HEALTH_UNSPECIFIED, what an absent field means, is None here)."""

    HEALTHY = "HEALTHY"
    TIMEOUT = "TIMEOUT"  # unresponsive
    UNHEALTHY_TENSORFLOW = "UNHEALTHY_TENSORFLOW"  # the in-guest ML stack is unhealthy
    UNHEALTHY_MAINTENANCE = "UNHEALTHY_MAINTENANCE"  # under maintenance; resumes once rescheduled


class SymptomType(StrEnum):
    """tpu_v2 `Symptom.SymptomType` (SYMPTOM_TYPE_UNSPECIFIED aside)."""

    LOW_MEMORY = "LOW_MEMORY"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    EXECUTE_TIMED_OUT = "EXECUTE_TIMED_OUT"
    MESH_BUILD_FAIL = "MESH_BUILD_FAIL"
    HBM_OUT_OF_MEMORY = "HBM_OUT_OF_MEMORY"
    PROJECT_ABUSE = "PROJECT_ABUSE"


class MaintenanceType(StrEnum):
    """tpu.v2 `UpcomingMaintenance.type` (the discovery document's; google-cloud-tpu's tpu_v2 has no such message)."""

    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    SCHEDULED = "SCHEDULED"  # seven days' notice
    UNSCHEDULED = "UNSCHEDULED"  # critical: less notice


class MaintenanceStatus(StrEnum):
    """tpu.v2 `UpcomingMaintenance.maintenanceStatus`."""

    UNKNOWN = "UNKNOWN"
    PENDING = "PENDING"  # scheduled, not started
    ONGOING = "ONGOING"  # under way


# A node whose maintenance window opens within this much of now takes no new job. Jobs declare no run time, so
# this stands for "before the job could end": the longest a TPU job usually runs between checkpoints and retries
# (a day), well inside the seven days' notice of SCHEDULED maintenance, so a node keeps working for most of it.
MAINTENANCE_HORIZON = timedelta(hours=24)


def _enum_or_none(enum: type[StrEnum], value: Any) -> Any:
    try:
        return enum(value) if value else None
    except ValueError:
        return None  # a value Google added since: known as "not one of ours", never a crash


class NodeSymptom(StrictModel):
    """tpu.v2 `Symptom`: something that happened to one worker."""

    symptom_type: SymptomType | None = None
    details: str | None = Field(default=None, max_length=2000)
    worker_id: str | None = None
    create_time: datetime | None = None

    def describe(self) -> str:
        what = self.symptom_type.value if self.symptom_type else "a symptom"
        where = f" on worker {self.worker_id}" if self.worker_id else ""
        return f"{what}{where}" + (f": {self.details}" if self.details else "")


class UpcomingMaintenance(StrictModel):
    """tpu.v2 `UpcomingMaintenance` (`upcomingMaintenance` of a node)."""

    type: MaintenanceType | None = None
    status: MaintenanceStatus | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    latest_window_start: datetime | None = None
    can_reschedule: bool | None = None

    def describe(self) -> str:
        kind = f" ({self.type.value})" if self.type and self.type is not MaintenanceType.UNKNOWN_TYPE else ""
        if self.status is MaintenanceStatus.ONGOING:
            return f"maintenance{kind} under way"
        when = f"from {_show_time(self.window_start)}" if self.window_start else "at a time not given"
        return f"maintenance{kind} {when}"


def _show_time(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M UTC")


class NodeHealth(StrictModel):
    """What the Cloud TPU API says of a node's health: tpu.v2 Node `health`, `healthDescription`, `symptoms` and
    `upcomingMaintenance`. Read by the claimer (every watch pass of an ACTIVE node, and `existing:` nodes), carried
    by fleet events, stored in tpus/{node}.node_health; the matcher and the executor judge it with the two rules
    below."""

    health: TpuHealth | None = None  # None: the API did not say (HEALTH_UNSPECIFIED): not evidence of anything
    description: str | None = Field(default=None, max_length=2000)
    symptoms: list[NodeSymptom] = Field(default_factory=list)
    upcoming_maintenance: UpcomingMaintenance | None = None

    @classmethod
    def from_api(cls, node: Mapping[str, Any]) -> "NodeHealth":
        """From a node as the REST API renders it (camelCase JSON); unknown enum values read as absent."""
        maintenance = node.get("upcomingMaintenance") or None
        return cls(
            health=_enum_or_none(TpuHealth, node.get("health")),
            description=(node.get("healthDescription") or None) and str(node["healthDescription"])[:2000],
            symptoms=[NodeSymptom(symptom_type=_enum_or_none(SymptomType, s.get("symptomType")),
                                  details=(s.get("details") or None) and str(s["details"])[:2000],
                                  worker_id=(str(s["workerId"]) if s.get("workerId") not in (None, "") else None),
                                  create_time=parse_timestamp(s.get("createTime")))
                      for s in node.get("symptoms") or () if isinstance(s, Mapping)],
            upcoming_maintenance=UpcomingMaintenance(
                type=_enum_or_none(MaintenanceType, maintenance.get("type")),
                status=_enum_or_none(MaintenanceStatus, maintenance.get("maintenanceStatus")),
                window_start=parse_timestamp(maintenance.get("windowStartTime")),
                window_end=parse_timestamp(maintenance.get("windowEndTime")),
                latest_window_start=parse_timestamp(maintenance.get("latestWindowStartTime")),
                can_reschedule=maintenance.get("canReschedule"),
            ) if isinstance(maintenance, Mapping) else None,
        )

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> "NodeHealth | None":
        """tpus/{node}.node_health as stored; None when never recorded (or unreadable: judged as unknown)."""
        stored = (doc or {}).get("node_health")
        if not stored:
            return None
        try:
            return cls.model_validate(stored)
        except ValueError:
            return None

    def to_doc(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def unhealthy(self) -> str | None:
        """Why a job must not run on the node (nor go on running there), or None. Only a health the API reports
        other than HEALTHY counts; an absent one (HEALTH_UNSPECIFIED) is not evidence, as tpu-runner reads it."""
        if self.health is None or self.health is TpuHealth.HEALTHY:
            return None
        why = self.health.value
        details = [self.description] if self.description else []
        details += [s.describe() for s in self.symptoms]
        return why + (f" ({'; '.join(details)})" if details else "")

    def maintenance_due(self, now: datetime, horizon: timedelta = MAINTENANCE_HORIZON) -> str | None:
        """Why the node's maintenance comes before a new job could end, or None: under way, or its window opens
        before `now + horizon` (a window whose start is not given counts as soon; one already over, not)."""
        m = self.upcoming_maintenance
        if m is None:
            return None
        if m.status is MaintenanceStatus.ONGOING:
            return m.describe()
        if m.window_end is not None and m.window_end <= now:
            return None
        if m.window_start is None or m.window_start <= now + horizon:
            return m.describe()
        return None

    def refuses_new_job(self, now: datetime, horizon: timedelta = MAINTENANCE_HORIZON) -> str | None:
        """The matcher's rule: why the node takes no new job now, or None."""
        return self.unhealthy() or self.maintenance_due(now, horizon)

