"""Core (pure, no I/O): a multislice job's attempt on a gang of slices (issue 37).

The matcher places a multislice job on N idle slices of one type in one zone (`Match.tpu_names`, slice order). Its
assignment is one guarded write of the job, its attempt and every slice's TPU (all busy with the attempt, or none);
the job and the attempt name every slice (`gang`), and the Assignment lists each slice's node and workers
(`Assignment.slices`), so the executor runs the command on every worker of every slice. Whatever ends the attempt
(its end, a lost slice, a start that never came) frees every slice of it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from tpuq.contracts.documents import AttemptDoc, JobDoc, TpuState
from tpuq.contracts.multislice import slice_counts
from tpuq.contracts.messages import AssignedSlice, Assignment, WorkerEndpoint
from tpuq.scheduler import lifecycle
from tpuq.scheduler.plan import Match

Doc = dict[str, Any]


def gang_assignment(stored: Doc, tpus: list[Doc], match: Match, slices_wanted: int, runner_bucket: str | None,
                    now: datetime) -> lifecycle.AssignmentWrites | None:
    """Pending job + its gang of idle TPUs (slice order) -> one attempt on all of them; None when any has moved on."""
    if not tpus or any(t.get("state") != TpuState.idle for t in tpus):
        return None
    writes = lifecycle.assignment(stored, tpus[0], match, runner_bucket, now)
    if writes is None:
        return None
    names = [t["name"] for t in tpus]
    served = JobDoc.from_doc(stored).capacity_request_id
    message = with_slices(writes.message, tpus, slices_wanted)
    return replace(
        writes,
        job=writes.job | JobDoc.fields(gang=names),
        attempt=writes.attempt | AttemptDoc.fields(gang=names),
        message=message,
        gang_tpus=tuple(names[1:]),
        withdraw_request_id=served if served and served not in {t.get("request_id") for t in tpus} else None,
    )


def with_slices(message: Assignment, tpus: list[Doc], slices_wanted: int | None) -> Assignment:
    """The Assignment listing every slice's node and workers (the TPU documents, slice order)."""
    slices = [AssignedSlice(node=t["name"], endpoints=[WorkerEndpoint.model_validate(e) for e in t.get("endpoints") or []])
              for t in tpus]
    return message.model_copy(update={"slices": slices, "slices_wanted": slices_wanted})


def slices_wanted(job: JobDoc) -> int:
    """The largest slice count the job asks for (its `slices:`, elastic or not)."""
    return slice_counts((job.spec or {}).get("slices"))[0]


def other_slices(job: JobDoc) -> list[str]:
    """The nodes of the job's current attempt beyond slice 0 (`tpu`): [] on one slice."""
    return [name for name in job.gang if name != job.tpu]
