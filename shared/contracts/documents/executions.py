"""executions/{job}:{attempt}: the executor's record of one attempt, its state and typed views."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from tpuq.contracts import store
from tpuq.contracts.documents.common import _View


class ExecutionState(StrEnum):
    """executions/{job}:{attempt}.state; whether its end was published is the separate `ended` flag."""

    starting = "starting"  # the assignment was received; the workers are being prepared
    started = "started"  # the command runs on every worker (the tick's backstop judges only these)


def execution_doc_id(job_id: str, attempt: int) -> str:
    """executions/{job}:{attempt}: the executor writes it, the scheduler's backstop reads it."""
    return store.doc_id(job_id, str(attempt))


@dataclass(frozen=True)
class ExecutionDoc(_View):
    """executions/{job}:{attempt}: the executor's record of one attempt (`tpuq.executor.decide` builds its writes);
    the scheduler's tick reads it (and writes it ended, `ended_by` scheduler, for an attempt it ended unstarted)."""

    COLLECTION: ClassVar[str] = store.EXECUTIONS

    job_id: str | None = None
    attempt: int | None = None
    attempt_id: str | None = None
    node: str | None = None  # the node's full name
    assignment: Mapping[str, Any] | None = None  # the Assignment message as received (JSON)
    state: str | None = None  # an ExecutionState value
    ended: bool = False  # the attempt's end was published
    received_at: datetime | None = None
    start_lease_until: datetime | None = None  # the starting delivery's lease (tpuq.executor.decide.start_underway)
    start_lease_by: str | None = None
    started_at: datetime | None = None
    probed_at: datetime | None = None
    unreachable_since: datetime | None = None
    outcome: str | None = None  # a tpuq.contracts.messages.AttemptOutcome value, once ended
    detail: str | None = None
    ended_at: datetime | None = None
    ended_by: str | None = None  # "scheduler" when the tick ended it

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> "ExecutionDoc":
        return cls._from_stored(doc)


@dataclass(frozen=True)
class ExecutionEnd:
    """What executions/{job}:{attempt} says about the attempt's end, once the executor published it.

    The scheduler's tick applies it when the `ended` event was lost."""

    outcome: str  # a tpuq.contracts.messages.AttemptOutcome value
    detail: str | None = None
    ended_at: datetime | None = None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> "ExecutionEnd | None":
        """None while the end is not published (or the document does not exist)."""
        if not doc or not doc.get("ended") or not doc.get("outcome"):
            return None
        return cls(outcome=doc["outcome"], detail=doc.get("detail"), ended_at=doc.get("ended_at"))

    def to_doc(self) -> dict[str, Any]:
        return ExecutionDoc.fields(ended=True, outcome=self.outcome, detail=self.detail, ended_at=self.ended_at)
