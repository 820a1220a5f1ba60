"""The scheduling pass's first phase: what it reads (`read_snapshot`), through indexed queries (see
infra/firestore.indexes.json): idle TPUs, then, for each type an idle TPU or a fleet entry has, the first pending
jobs in queue order that accept that type (or, for a newly stored job, just that job), and the live TPUs and open
requests of the fleet entries its waiting jobs could ask from. Its reads grow with the fleet (types x idle TPUs + a
bound), never with the queue's length (tpuq.scheduler.scheduling has the pass)."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable

from google.cloud.firestore import FieldFilter, Query

from tpuq.contracts import store
from tpuq.contracts.documents import JobDoc, JobState, TpuState
from tpuq.contracts.errors import Permanent
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.jobspec import ANY_TPU
from tpuq.contracts.tputypes import canonical_name
from tpuq.runtime.fleetstore import paused_fleets
from tpuq.runtime.versioned import versioned
from tpuq.scheduler import dependencies, grouplimit
from tpuq.scheduler.counts import live_tpus_of, open_requests_of
from tpuq.scheduler.decide import PassSnapshot, entries_to_count, queue_from, queued

log = logging.getLogger("tpuq.scheduler")

# Pending jobs read per type beyond the idle TPUs of that type: room for jobs ahead in the queue that cannot
# take them (a zone, a region, a named node, a retry back-off) and for the type's capacity asks.
PER_TYPE_EXTRA = 64
IDLE_LIMIT = 2000


def idle_tpu_snapshots(db) -> list:
    q = db.collection(store.TPUS).where(filter=FieldFilter("state", "==", TpuState.idle)).limit(IDLE_LIMIT)
    return list(q.stream())


def pending_jobs_for_type(db, tpu_type: str, limit: int) -> list:
    """The first `limit` pending jobs in queue order that accept `tpu_type` (their stored `types` name it, or
    `any`): one indexed query (state, types, priority_rank, submit_time)."""
    q = (
        db.collection(store.JOBS)
        .where(filter=FieldFilter(JobDoc.field("state"), "==", JobState.pending))
        .where(filter=FieldFilter(JobDoc.field("types"), "array_contains_any", sorted({tpu_type, ANY_TPU})))
        .order_by(JobDoc.field("priority_rank"), direction=Query.DESCENDING)
        .order_by(JobDoc.field("submit_time"))
    )
    return grouplimit.read_past_held(q, limit)  # (a group's tasks past its limit hide no job behind them)


def pending_job_snapshots(db, tpu_docs: list[dict], fleet: FleetFile | None) -> list:
    """The pending jobs a pass over the whole queue considers: per type, bounded (`types_to_read`)."""
    found: dict[str, object] = {}
    for tpu_type, limit in types_to_read(tpu_docs, fleet).items():
        for snap in pending_jobs_for_type(db, tpu_type, limit):
            found.setdefault(snap.id, snap)
    return list(found.values())


def types_to_read(tpu_docs: list[dict], fleet: FleetFile | None) -> dict[str, int]:
    """TPU type -> how many pending jobs accepting it a pass reads: the idle TPUs of the type plus
    PER_TYPE_EXTRA, for every type an idle TPU has (what may be assigned now) or a fleet entry offers
    (what may ask for capacity)."""
    idle = Counter(canonical_name(d["type"]) for d in tpu_docs if d.get("type"))
    offered = {canonical_name(e.type) for e in fleet.tpus} if fleet else set()
    return {t: idle[t] + PER_TYPE_EXTRA for t in sorted(set(idle) | offered)}



def job_snapshots(db, job_ids: Iterable[str]) -> list:
    refs = [db.collection(store.JOBS).document(j) for j in dict.fromkeys(job_ids)]
    return [s for s in db.get_all(refs) if s.exists] if refs else []



@dataclass
class RoundReads:
    """What a round read that does not depend on the queue: the idle TPUs (paused fleets' left out), the jobs that
    triggered the pass, and each entry's live TPUs and open requests. A new job's second round (the whole queue,
    `scheduling_pass`) reuses them: read a few milliseconds before, and every write is guarded anyway."""

    tpus: list[tuple]
    triggered: list
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)


def read_round(db, trigger_job_ids: list[str]) -> RoundReads:
    paused = paused_fleets(db)  # `tpuq fleet pause`: its idle TPUs take no new job (the janitor deletes them)
    tpus = [(s, d) for s, d in _with_docs(idle_tpu_snapshots(db)) if d.get("fleet") not in paused]
    triggered = [s for s in job_snapshots(db, trigger_job_ids) if _is_pending(s)] if trigger_job_ids else []
    return RoundReads(tpus, triggered)


def read_snapshot(db, fleet: FleetFile | None, trigger_job_ids: list[str], full: bool, now: datetime | None = None,
                  told=None, reads: RoundReads | None = None) -> tuple[PassSnapshot, dict, dict, RoundReads]:
    """Phase 1: everything the pass decides on; and the snapshots its guarded writes are checked against.
    Each document is copied out of its snapshot once (`to_dict` copies the whole document, every time).
    `reads`: an earlier round's, reused (else read now); returned with what this round added to it."""
    reads = reads or read_round(db, trigger_job_ids)
    tpus, triggered = reads.tpus, reads.triggered
    if trigger_job_ids and not full:
        job_snaps = triggered
    else:
        job_snaps = pending_job_snapshots(db, [d for _, d in tpus], fleet)
        # The full read is bounded per type: the jobs that triggered this pass are planned in it all the same.
        read = {s.id for s in job_snaps}
        job_snaps += [s for s in triggered if s.id not in read]
    if now is not None:  # a job waiting for its dependencies takes no TPU and asks for none (its reason is written)
        job_snaps = dependencies.hold_waiting(db, job_snaps, now, told)
    kept = versioned(db, "queued job", queued)  # each stored version copied and parsed once (module docstring)
    jobs = sorted(((s, *kept.get(s)) for s in job_snaps), key=_queue_order)
    # A group's tasks past its limit (`%K`) take no TPU and ask for none (their reason is written).
    held, held_reasons = grouplimit.held_in_pass(db, [(s.id, parsed) for s, _, parsed in jobs])
    queue = queue_from([(s.id, parsed) for s, _, parsed in jobs if s.id not in held])
    entries = entries_to_count(queue, fleet)
    for entry in entries:
        if entry not in reads.counts:
            reads.counts[entry] = (live_tpus_of(db, entry), open_requests_of(db, entry))
    snapshot = PassSnapshot(
        queue=queue,
        idle_tpus=[d for _, d in tpus],
        live_tpus={e: reads.counts[e][0] for e in entries},
        open_requests={e: reads.counts[e][1] for e in entries},
        held=held_reasons,
    )
    return snapshot, {s.id: s for s, _, _ in jobs}, {d.get("name"): s for s, d in tpus}, reads


def _with_docs(snaps) -> list[tuple]:
    return [(s, s.to_dict() or {}) for s in snaps]


def _queue_order(snap_and_doc: tuple) -> tuple:
    """Priority, then submit time, then id: the order the per-type reads are merged in (the matcher orders
    them again by its own key)."""
    snap, doc = snap_and_doc[:2]
    submitted = doc.get(JobDoc.field("submit_time"))
    return (-(doc.get(JobDoc.field("priority_rank")) or 0), submitted.timestamp() if submitted else 0.0, snap.id)


def _is_pending(snap) -> bool:
    """A triggering job still pending; one whose stored state no enum has is not (logged, as the pass skips it)."""
    try:
        return JobDoc.from_doc(snap.to_dict() or {}, snap.id).state is JobState.pending
    except Permanent as e:
        log.error("%s", e)
        return False


