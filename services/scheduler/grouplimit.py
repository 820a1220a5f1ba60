"""A group's limit on tasks at once (`array: "0-99%8"`, `max_running: 8`; tpuq.contracts.arrays).

The pass offers a group's pending tasks to the matcher only while fewer than the limit are assigned or running: the
rest are held back before matching, so they take no TPU and ask for no capacity, and each shows why it waits.
`hold_back` is the core (pure); `tasks_on_a_tpu` is the shell's read, one count query per limited group in the pass
(an index on group and state: infra/firestore.indexes.json).
"""

from __future__ import annotations

from collections.abc import Mapping

from google.cloud.firestore import FieldFilter

from tpuq.contracts import store
from tpuq.contracts.documents import JOB_STATES_ON_A_TPU, JobDoc
from tpuq.scheduler import dependencies  # (jobs waiting for theirs take no place either)


def held_reason(group: str, limit: int) -> str:
    """Stable for the group (no count in it): a held task's `blocked` is written once, not on every pass."""
    return (f"waiting for a place in group {group}: at most {limit} of its tasks run at once; the next starts when "
            "one ends")


def limited_groups(jobs: Mapping[str, JobDoc]) -> dict[str, int]:
    """Group -> its limit, for the groups with a limit among these pending jobs."""
    return {j.group: j.array_limit for j in jobs.values() if j.group and j.array_limit}


def hold_back(order: list[str], jobs: Mapping[str, JobDoc], on_a_tpu: Mapping[str, int]) -> dict[str, str]:
    """Job id -> why it is held back, for the pending tasks past their group's room (`order`: the queue's order,
    which decides which tasks take the room). `on_a_tpu`: group -> its tasks assigned or running now."""
    room = {g: max(0, limit - on_a_tpu.get(g, 0)) for g, limit in limited_groups(jobs).items()}
    held: dict[str, str] = {}
    for job_id in order:
        job = jobs[job_id]
        if job.group not in room:
            continue
        if room[job.group] > 0:
            room[job.group] -= 1
        else:
            held[job_id] = held_reason(job.group, job.array_limit or 0)
    return held


def tasks_on_a_tpu(db, groups) -> dict[str, int]:
    """Group -> how many of its tasks are assigned or running: one count query each (an aggregation, billed one
    read per 1,000 index entries)."""
    out = {}
    for group in sorted(groups):
        q = (db.collection(store.JOBS).where(filter=FieldFilter(JobDoc.field("group"), "==", group))
             .where(filter=FieldFilter(JobDoc.field("state"), "in", [s.value for s in JOB_STATES_ON_A_TPU])))
        out[group] = int(q.count().get()[0][0].value)
    return out


def held_in_pass(db, parsed: list[tuple[str, object]]) -> tuple[set[str], dict[str, str]]:
    """The shell's step, on the pass's pending jobs in queue order ((job id, its `decide.queued`)): the ids held back,
    and the `blocked` reasons to write (those not already stored). No read at all without a limited group."""
    views = {job_id: q.view for job_id, q in parsed if not isinstance(q, str)}
    groups = limited_groups(views)
    if not groups:
        return set(), {}
    held = hold_back([job_id for job_id, _ in parsed if job_id in views], views, tasks_on_a_tpu(db, groups))
    return set(held), {job_id: why for job_id, why in held.items() if views[job_id].blocked != why}


# How far a pass's bounded read of one type's pending jobs goes past the tasks a group's limit holds back, so that
# they hide no job queued behind them: at most this many pages more (each of the type's usual size).
MAX_EXTRA_PAGES = 4


def surplus(snaps) -> int:
    """How many of these pending jobs (snapshots in queue order) are surely held back: a limited group's tasks past
    its limit's count (at most `limit` of a group are offered a TPU in a pass, whatever runs). Read field by field:
    the snapshot's whole document is copied once, later (tpuq.scheduler.passreads.read_snapshot)."""
    seen: dict[str, int] = {}
    held = 0
    for snap in snaps:
        group, limit = _field(snap, "group"), _field(snap, "array_limit")
        if group and limit:
            seen[group] = seen.get(group, 0) + 1
            held += seen[group] > limit
    return held


def _field(snap, name: str):
    try:
        return snap.get(JobDoc.field(name))
    except KeyError:
        return None


def read_past_held(query, limit: int) -> list:
    """The first `limit` results of `query` (pending jobs in queue order), and more while tasks a group's limit holds
    back took places among them: a group of many tasks hides no job queued behind it. (An offset's skipped
    documents are billed as read, as re-reading them would be.)"""
    snaps = list(query.limit(limit).stream())
    page = len(snaps)
    for _ in range(MAX_EXTRA_PAGES):
        if page < limit or len(snaps) - surplus(snaps) - dependencies.waiting_count(snaps) >= limit:
            break
        more = list(query.offset(len(snaps)).limit(limit).stream())
        snaps, page = snaps + more, len(more)
    return snaps
