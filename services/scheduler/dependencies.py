"""`depends_on`: a job waits for other jobs or groups (issue 36 §2). Core (pure) first, then the shell.

A job's spec names job ids or group ids (`group`: the id of an array or sweep, whose tasks carry it). A name with
a `jobs/{name}` document is that job; otherwise it is the jobs whose `group` is the name. By default a dependency
is met when every job it names succeeded, and can never be met once one of them failed, was cancelled or was
rejected: the waiting job is then cancelled at once, naming that job, and so are the jobs waiting on it.
`{any: [...]}` is met when every one has ended, however.

Where it acts:
- intake refuses a name that is neither stored nor in the same message (`unknown_names`);
- the pass holds back waiting jobs before it matches or asks (`hold_waiting`): a waiting job takes no TPU and
  asks for no capacity, and its `waiting` reason says why, written when it changes;
- when a job starts or ends (an attempt event, a cancel), the jobs naming it or its group are looked at at once
  (`look_at_waiters`), found by an array-contains query on `depends_on_ids`, so the cost follows the change, not the
  queue. A query on one array field is served by Firestore's automatic single-field index: "Cloud Firestore
  automatically creates ... single-field indexes ... array-contains" (https://firebase.google.com/docs/firestore/
  query-data/index-overview, "Single-field indexes"; the operator: https://firebase.google.com/docs/firestore/
  query-data/queries#array_membership).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from google.cloud.firestore import FieldFilter

from tpuq.contracts import store
from tpuq.contracts.documents import TERMINAL_JOB_STATES, JobDoc, JobState
from tpuq.contracts.errors import Permanent
from tpuq.contracts.jobstate import JobEvent, transition
from tpuq.runtime.guarded import WriteSet, commit_if_unchanged, read_decide_commit

log = logging.getLogger("tpuq.scheduler")

# The states after which a default (succeeded) dependency can never be met.
NEVER_MET_STATES = frozenset({JobState.failed, JobState.cancelled, JobState.rejected})
# Bounds per message: the names one pass reads (the jobs it reads bound it too), the jobs a cascade of cancels visits (a longer one goes on at the next pass that reads its jobs).
MAX_NAMES_PER_PASS = 500
MAX_CASCADE = 1_000
_READ_CHUNK = 100  # refs per batched read
# How long after a cascade cancelled a waiter a later look at its dependencies tells of it again (a crash between
# the cancel and its notification; tpuq.scheduler.notices): the sender dedups the event id.
RETELL_WINDOW = timedelta(minutes=10)
Told = Callable[[Mapping[str, Any]], None]

Found = Mapping[str, list[tuple[str, str]]]  # name -> [(job id, state)]; empty: nothing stored under it


# ------------------------------------------------------------------------------------------------------ core


@dataclass(frozen=True)
class Needs:
    names: tuple[str, ...]
    any_end: bool  # `{any: [...]}`: ended is enough


@dataclass(frozen=True)
class Verdict:
    met: bool
    never: str | None = None  # why it can never be met: "dependency train-3 failed"
    waiting: str | None = None  # why it waits: "waiting for train-3 (running)"


def needs_of(spec: Mapping[str, Any] | None) -> Needs | None:
    """The stored spec's `depends_on` (a list, or {any: [...]}), or None without one."""
    value = (spec or {}).get("depends_on")
    if not value:
        return None
    if isinstance(value, Mapping):
        return Needs(tuple(value.get("any") or ()), any_end=True)
    return Needs(tuple(value), any_end=False)


def judge(needs: Needs, found: Found) -> Verdict:
    """Met, never met (the first job that failed it), or waiting (the first job not there yet)."""
    unmet: list[str] = []
    for name in needs.names:
        jobs = found.get(name) or []
        if not jobs:
            unmet.append(f"{name} (not stored yet)")
            continue
        for job_id, state in sorted(jobs):
            if not needs.any_end and state in NEVER_MET_STATES:
                return Verdict(False, never=f"dependency {job_id} {state}")
            if state not in TERMINAL_JOB_STATES or (not needs.any_end and state != JobState.succeeded):
                unmet.append(f"{job_id} ({state})")
    if not unmet:
        return Verdict(True)
    more = f" and {len(unmet) - 1} more" if len(unmet) > 1 else ""
    return Verdict(False, waiting=f"waiting for {unmet[0]}{more}")


def cancel_reason(never: str) -> str:
    return f"cancelled: {never}"


# ----------------------------------------------------------------------------------------------------- shell


def _jobs(db):
    return db.collection(store.JOBS)


def read_found(db, names: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """Each name's jobs and states: batched reads by id, then a `group` query for each name not a job."""
    names = list(dict.fromkeys(names))
    found: dict[str, list[tuple[str, str]]] = {}
    for i in range(0, len(names), _READ_CHUNK):
        refs = [_jobs(db).document(n) for n in names[i:i + _READ_CHUNK]]
        for snap in db.get_all(refs):
            if snap.exists:
                found[snap.id] = [(snap.id, (snap.to_dict() or {}).get("state"))]
    for name in names:
        if name not in found:
            found[name] = _group_sample(db, name)
    return found


# A group's tasks, by what they say of a dependency on it: one task of each kind is enough to judge it.
_GROUP_SAMPLES = (sorted(NEVER_MET_STATES), [JobState.pending, JobState.assigned, JobState.running],
                  [JobState.succeeded])


def _group_sample(db, name: str) -> list[tuple[str, str]]:
    """What judging a dependency on group `name` needs, in at most three one-document reads whatever the group's
    size (index: group, state): a task that failed, was cancelled or rejected; one not ended; else one that
    succeeded (the group exists and every task succeeded). Empty: no task is stored under the name."""
    sample: list[tuple[str, str]] = []
    for states in _GROUP_SAMPLES:
        if states == [JobState.succeeded] and sample:
            break
        q = (_jobs(db).where(filter=FieldFilter(JobDoc.field("group"), "==", name))
             .where(filter=FieldFilter(JobDoc.field("state"), "in", [str(x) for x in states])).limit(1))
        sample += [(snap.id, (snap.to_dict() or {}).get("state")) for snap in q.stream()]
    return sample


def unknown_names(db, jobs: list, in_message: set[str], prefix: str | None) -> None:
    """At intake: Permanent naming the field (`jobs[2].depends_on[0]`) for a name neither stored (a job or a
    group's task) nor in `in_message` (the ids of the message's jobs)."""
    from tpuq.contracts.jobspec import DependsOnAny, dependency_names

    outside = {n for job in jobs for n in dependency_names(job.depends_on)} - in_message
    if not outside:
        return
    found = read_found(db, sorted(outside))
    for i, job in enumerate(jobs):
        where = f"{prefix}[{i}]." if prefix else ""
        key = "depends_on.any" if isinstance(job.depends_on, DependsOnAny) else "depends_on"
        for k, name in enumerate(dependency_names(job.depends_on)):
            if name in outside and not found.get(name):
                raise Permanent(f"no job or group {name!r} is stored or in the same submission",
                                field=f"{where}{key}[{k}]")


def waiting_count(snaps: list) -> int:
    """How many of a per-type read's jobs an earlier pass found waiting (`waiting` set): they take no place among
    the jobs the pass reads (`tpuq.scheduler.grouplimit.read_past_held` reads on past them), so a pipeline waiting
    at the head of the queue (a 1,000-task sweep after its `prepare`) hides no runnable job behind it."""
    return sum(1 for s in snaps if _waits(s))


def _waits(snap) -> bool:
    return bool(_stored_waiting(snap))


def _stored_waiting(snap) -> str | None:
    try:
        return snap.get(JobDoc.field("waiting"))
    except KeyError:  # the field is absent (google.cloud.firestore raises KeyError too)
        return None


def _needs_of_snap(snap) -> Needs | None:
    """The stored job's needs, read from its snapshot without copying the whole document."""
    try:
        return needs_of({"depends_on": snap.get("spec.depends_on")})
    except KeyError:
        return None


def hold_waiting(db, job_snaps: list, now: datetime, told: Told | None = None) -> list:
    """The pass's filter: the pending jobs whose dependencies are met (or who have none). A waiting job's
    `waiting` reason is written when it changes; one that can never be met is cancelled (and its waiters after
    it: `look_at_waiters`); a met one with a stale reason has it cleared and is read again (its guarded writes are
    checked against what it is now)."""
    needs = {s.id: n for s in job_snaps if (n := _needs_of_snap(s))}
    if not needs:
        return job_snaps
    names: list[str] = []
    readable: set[str] = set()
    for job_id, n in needs.items():
        if len(set(names) | set(n.names)) <= MAX_NAMES_PER_PASS:
            names += [x for x in n.names if x not in names]
            readable.add(job_id)
    found = read_found(db, names)
    out, ended = [], []
    for snap in job_snaps:
        n = needs.get(snap.id)
        if n is None:
            out.append(snap)
            continue
        if snap.id not in readable:
            continue  # beyond this pass's bound: held, judged by a later pass
        verdict = judge(n, found)
        if verdict.never:
            if _cancel_pending(db, snap.reference, cancel_reason(verdict.never), now, told):
                ended.append(snap.id)
        elif verdict.waiting:
            if _stored_waiting(snap) != verdict.waiting:
                commit_if_unchanged(db, WriteSet().update(snap, JobDoc.fields(waiting=verdict.waiting,
                                                                               updated_at=now)))
        elif _stored_waiting(snap):
            if commit_if_unchanged(db, WriteSet().update(snap, JobDoc.fields(waiting=None, updated_at=now))):
                out.append(snap.reference.get())
        else:
            out.append(snap)
    if ended:  # their waiters: cancelled down the chain, or (`{any: ...}`) met now and planned in this pass
        released = [r for r in dict.fromkeys(_cascade(db, ended, now, told)) if r not in {o.id for o in out}]
        refs = [_jobs(db).document(r) for r in released]
        out += hold_waiting(db, [s for s in (db.get_all(refs) if refs else []) if s.exists
                                 and (s.to_dict() or {}).get("state") == JobState.pending], now, told)
    return out


def look_at_waiters(db, job_id: str, now: datetime, told: Told | None = None, stored: dict | None = None) -> list[str]:
    """`job_id` ended (or started): look at once at the jobs waiting on it or its group. Those now met are
    returned (for a pass to run them); those never to be met are cancelled, naming the job, and so on down the
    chain; the others' `waiting` reason is brought up to date ("waiting for train-3 (running)"). `told`: called
    with each cancelled job's document (tpuq.scheduler.notices). `stored`: the job's document, when the caller
    just read it (its group never changes), else it is read."""
    return _cascade(db, [job_id], now, told, {job_id: stored} if stored is not None else {})


def _cascade(db, ended: list[str], now: datetime, told: Told | None = None,
             known: dict[str, dict] | None = None) -> list[str]:
    queue = list(ended)
    asked: set[str] = set()
    released: list[str] = []
    visited = 0
    while queue and visited < MAX_CASCADE:
        job_id = queue.pop(0)
        doc = (known or {}).get(job_id)
        if doc is None:
            doc = _jobs(db).document(job_id).get().to_dict() or {}
        names = {job_id} | ({g} if (g := doc.get(JobDoc.field("group"))) else set())
        waiters = {}
        for name in sorted(names - asked):
            asked.add(name)
            q = _jobs(db).where(filter=FieldFilter(JobDoc.field("depends_on_ids"), "array_contains", name))
            for w in q.limit(MAX_CASCADE).stream():
                if (w.to_dict() or {}).get("state") == JobState.pending:
                    waiters[w.id] = w
                elif told is not None and _lately_cancelled_here(w.to_dict() or {}, now):
                    told(w.to_dict() or {})  # a crash may have come between its cancel and the telling
        if not waiters:
            continue
        visited += len(waiters)
        needs = {w.id: needs_of((w.to_dict() or {}).get("spec")) for w in waiters.values()}
        found = read_found(db, [x for n in needs.values() if n for x in n.names])
        for w in waiters.values():
            n = needs[w.id]
            if n is None:
                continue
            verdict = judge(n, found)
            if verdict.never:
                if _cancel_pending(db, w.reference, cancel_reason(verdict.never), now, told):
                    log.info("job %s %s", w.id, cancel_reason(verdict.never))
                    queue.append(w.id)
            elif verdict.met:
                released.append(w.id)
            elif verdict.waiting != (w.to_dict() or {}).get(JobDoc.field("waiting")):
                commit_if_unchanged(db, WriteSet().update(w, JobDoc.fields(waiting=verdict.waiting, updated_at=now)))
    if queue:
        log.warning("dependencies: %d ended jobs' waiters left for the next pass (over %d visited)", len(queue),
                    MAX_CASCADE)
    return released


def _lately_cancelled_here(doc: Mapping[str, Any], now: datetime) -> bool:
    """A waiter a cascade cancelled lately (a redelivery's window): told of again, under the same event id."""
    finished = doc.get(JobDoc.field("finished_at"))
    return (doc.get("state") == JobState.cancelled and str(doc.get("reason") or "").startswith(cancel_reason(""))
            and isinstance(finished, datetime) and now - finished <= RETELL_WINDOW)


def _cancel_pending(db, ref, reason: str, now: datetime, told: Told | None = None) -> bool:
    """Cancel a job still pending (guarded on it as read); True when this write cancelled it. A waiting job holds
    no TPU and no capacity request; only its notification is told (`told`, after the commit)."""

    def decide(snap):
        stored = snap.to_dict() or {}
        if stored.get("state") != JobState.pending:
            return WriteSet(), False
        fields = JobDoc.fields(state=transition(JobState.pending, JobEvent.cancel), reason=reason, waiting=None, capacity_request=None,
                               finished_at=now, updated_at=now)
        return WriteSet().update(snap, fields), {**stored, **fields}

    cancelled = read_decide_commit(db, [ref], decide)
    if cancelled and told is not None:
        told(cancelled)
    return bool(cancelled)
