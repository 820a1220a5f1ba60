"""The scheduler's counting reads (Firestore count aggregations): TPUs that hold an entry's slices, the slices its open
requests ask for, and the slices of one queued resource recorded so far."""

from __future__ import annotations

from google.cloud.firestore import FieldFilter

from tpuq.contracts import store
from tpuq.contracts.documents import TPU_STATES_HOLDING_A_SLICE, JobDoc


def _count(query) -> int:
    return int(query.count().get()[0][0].value)


def live_tpus_of(db, entry_id: str) -> int:
    tpus = db.collection(store.TPUS)
    return _count(
        tpus.where(filter=FieldFilter("entry_id", "==", entry_id))
        .where(filter=FieldFilter("state", "in", sorted(TPU_STATES_HOLDING_A_SLICE)))
    )


def slices_recorded(db, queued_resource: str) -> int:
    """The TPUs recorded of one queued resource (a multislice request's slices so far)."""
    return _count(db.collection(store.TPUS).where(filter=FieldFilter("queued_resource", "==", queued_resource)))


def open_requests_of(db, entry_id: str) -> int:
    """Slices the entry's open requests ask for: one a job, and a multislice job's gang its size (those few are
    read, by an equality filter of their own: no composite index)."""
    jobs = db.collection(store.JOBS)
    requests = _count(jobs.where(filter=FieldFilter(JobDoc.field("capacity_request", "entry_id"), "==", entry_id)))
    gangs = jobs.where(filter=FieldFilter(JobDoc.field("capacity_request", "gang_entry_id"), "==", entry_id))
    return requests + sum(max(int((JobDoc.from_doc(s.to_dict() or {}, s.id).capacity_request or {}).get("slices")
                                  or 1) - 1, 0) for s in gangs.stream())
