"""A group (`array:` / `sweep:`, tpuq.contracts.arrays) as users act on it: `tpuq status GROUP`, `tpuq cancel GROUP`.

A group is no document: its tasks are the jobs whose `group` is its id (one equality query, served by Firestore's
single-field index). `summary` is pure."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from google.cloud.firestore import FieldFilter

from tpuq.contracts import store
from tpuq.contracts.documents import JobDoc, JobState, TERMINAL_JOB_STATES

BAR_WIDTH = 30


def group_tasks(db, group: str) -> list[dict[str, Any]]:
    """The stored tasks of `group`, in index order; [] when the id names no group."""
    q = db.collection(store.JOBS).where(filter=FieldFilter(JobDoc.field("group"), "==", group))
    docs = [s.to_dict() or {} for s in q.stream()]
    return sorted(docs, key=lambda d: d.get(JobDoc.field("array_index")) or 0)


@dataclass(frozen=True)
class GroupSummary:
    group: str
    size: int  # tasks the group holds (array_size); more than `stored` only for a submission not wholly stored
    stored: int
    counts: dict[str, int]  # state -> tasks
    failed: list[tuple[str, str, str]] = field(default_factory=list)  # (task id, state, reason) of failed/cancelled/rejected
    limit: int | None = None

    @property
    def ended(self) -> int:
        return sum(n for s, n in self.counts.items() if JobState(s) in TERMINAL_JOB_STATES)

    def bar(self, width: int = BAR_WIDTH) -> str:
        """`[#########.....]  3/6 ended`: the share of tasks that ended."""
        done = round(width * self.ended / self.size) if self.size else width
        return f"[{'#' * done}{'.' * (width - done)}] {self.ended}/{self.size} ended"


def summary(group: str, tasks: list[dict[str, Any]]) -> GroupSummary:
    views = [JobDoc.from_doc(t) for t in tasks]
    counts = Counter(v.state.value for v in views)
    size = max([v.array_size or 0 for v in views] + [len(views)])
    failed = [(v.id, v.state.value, v.reason or "") for v in views
              if v.state in (JobState.failed, JobState.cancelled, JobState.rejected)]
    limit = next((v.array_limit for v in views if v.array_limit), None)
    return GroupSummary(group, size, len(views), dict(sorted(counts.items())), failed, limit)


def summary_lines(s: GroupSummary) -> list[str]:
    """What `tpuq status GROUP` prints."""
    by_state = ", ".join(f"{n} {state}" for state, n in s.counts.items())
    lines = [f"group {s.group}: {s.size} tasks" + (f", at most {s.limit} at once" if s.limit else ""),
             f"  {s.bar()}", f"  {by_state}"]
    if s.stored < s.size:
        lines.append(f"  only {s.stored} of {s.size} tasks are stored: the submission was not completed")
    for task_id, state, reason in s.failed:
        lines.append(f"  {state}: {task_id}" + (f": {reason}" if reason else ""))
    return lines


def unfinished(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tasks `tpuq cancel GROUP` cancels."""
    return [t for t in tasks if JobDoc.from_doc(t).state not in TERMINAL_JOB_STATES]


# The state a group's line shows in `tpuq list`: the first its tasks are in, in this order (a group runs while one
# task runs, waits while one waits, and has failed when one failed and none is left to run).
_GROUP_STATE_ORDER = (JobState.running, JobState.assigned, JobState.pending, JobState.failed, JobState.cancelled,
                      JobState.rejected, JobState.succeeded)


def group_row(first: dict[str, Any], s: GroupSummary) -> dict[str, Any]:
    """One `tpuq list` row standing for a group: its newest listed task's fields, the group's id and state, and its
    counts as the reason."""
    state = next(st for st in _GROUP_STATE_ORDER if s.counts.get(st.value))
    counts = ", ".join(f"{n} {st}" for st, n in s.counts.items())
    return {**first, "id": s.group, "state": state.value, "waiting": None, "blocked": None,
            "reason": f"group of {s.size} tasks: {counts}"}


def fold_groups(rows: list[dict[str, Any]], summaries: dict[str, GroupSummary]) -> list[dict[str, Any]]:
    """`tpuq list` rows with each group's tasks folded into one line, where its first listed task was (pure)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for row in rows:
        group = row.get(JobDoc.field("group"))
        if not group or group not in summaries:
            out.append(row)
        elif group not in seen:
            seen.add(group)
            out.append(group_row(row, summaries[group]))
    return out


def tasks_if_group(db, some_id: str) -> list[dict[str, Any]]:
    """The tasks of `some_id` when it is a group's id; [] when it names a job (a job's own id wins) or nothing."""
    if db.collection(store.JOBS).document(some_id).get().exists:
        return []
    return group_tasks(db, some_id)


def group_exit_code(s: GroupSummary) -> int | None:
    """`tpuq watch GROUP`'s exit status, as `tpuq submit --wait`'s: None while a task has not ended (or is not
    stored yet), 0 when every task succeeded, else 1."""
    if s.stored < s.size or s.ended < s.size:
        return None
    return 0 if s.counts.get(JobState.succeeded.value, 0) == s.size else 1


def watch_facts(s: GroupSummary) -> dict[str, str]:
    """What a piped `tpuq watch GROUP` prints a line for when it changes: the progress and counts, and each failed
    task once (the `jobwatch.facts` of a group)."""
    by_state = ", ".join(f"{n} {state}" for state, n in s.counts.items())
    facts = {"group": f"{s.bar()}: {by_state}"}
    for task_id, state, reason in s.failed:
        facts[f"task {task_id}"] = f"{state}: {task_id}" + (f": {reason}" if reason else "")
    return facts


def group_detach_message(group: str) -> str:
    """What Ctrl-C in `tpuq watch GROUP` prints: the tasks keep running, and how to watch or cancel them."""
    return (f"stopped watching; the tasks of group {group} keep running (tpuq did not cancel them).\n"
            f"  watch it:    tpuq watch {group}\n"
            f"  its tasks:   tpuq list --tasks\n"
            f"  cancel it:   tpuq cancel {group}")


def sweep_keys(tasks: list[dict[str, Any]]) -> list[str]:
    """The environment variables a sweep set: those whose value differs between the group's tasks (the stored
    tasks keep no `sweep:`, only each task's env, the job's own plus its sweep values). None for an array, or a
    sweep of one combination."""
    envs = [((t.get("spec") or {}).get("env") or {}) for t in tasks]
    names = dict.fromkeys(k for env in envs for k in env)
    return [k for k in names if len({env.get(k) for env in envs}) > 1]


# The guarded writes of one `set-priority GROUP` commit: Firestore's limit per commit (tpuq.scheduler.arrays cites it).
PRIORITY_WRITES_PER_COMMIT = 500
PRIORITY_COMMIT_ATTEMPTS = 6


def priority_changes(docs: list[dict[str, Any]], wanted, now) -> tuple[dict[str, dict], Counter]:
    """`set-priority GROUP` on some of its tasks (pure): the fields to write per task id, and how many tasks were
    changed, already had the priority, had started (they keep theirs, as one job does) or had ended."""
    from tpuq.contracts.jobstate import IllegalTransition, reprioritized

    writes: dict[str, dict] = {}
    tally: Counter = Counter()
    for doc in docs:
        view = JobDoc.from_doc(doc)
        try:
            fields = reprioritized(doc, wanted, now)
        except IllegalTransition:
            tally["ended" if view.state in TERMINAL_JOB_STATES else "started"] += 1
            continue
        if fields:
            writes[view.id] = fields
            tally["changed"] += 1
        else:
            tally["same"] += 1
    return writes, tally


def change_group_priority(clients, tasks: list[dict[str, Any]], wanted, now) -> Counter:
    """Set the priority of every pending task of a group: one guarded commit per PRIORITY_WRITES_PER_COMMIT tasks
    (each write only if the task is unchanged since read, so a task the scheduler assigns meanwhile keeps its
    priority; a lost race reads that chunk again), then one nudge. The tally of `priority_changes`."""
    from tpuq.contracts.errors import Retryable
    from tpuq.operations.jobs import nudge
    from tpuq.runtime.guarded import WriteSet, commit_guarded

    db = clients.firestore
    jobs = db.collection(store.JOBS)
    ids = [JobDoc.from_doc(t).id for t in unfinished(tasks)]
    tally: Counter = Counter({"ended": len(tasks) - len(ids)})
    for start in range(0, len(ids), PRIORITY_WRITES_PER_COMMIT):
        chunk = ids[start:start + PRIORITY_WRITES_PER_COMMIT]
        for _ in range(PRIORITY_COMMIT_ATTEMPTS):
            snaps = [s for s in db.get_all([jobs.document(i) for i in chunk]) if s.exists]
            fields, counted = priority_changes([s.to_dict() or {} for s in snaps], wanted, now)
            writes = WriteSet()
            for snap in snaps:
                writes.update(snap, fields.get(snap.id))
            if commit_guarded(db, writes) is not None:
                tally += counted
                break
        else:
            raise Retryable(f"tasks {chunk[0]} ... {chunk[-1]} kept changing; run set-priority again")
    if tally["changed"]:
        nudge(clients, "set-priority")  # the scheduler's next pass, now, takes the queue in the new order
    return tally


def priority_line(group: str, size: int, wanted: str, tally: Counter) -> str:
    """What `tpuq set-priority GROUP` prints (pure)."""
    line = f"group {group}: priority {wanted} set on {tally['changed']} of {size} tasks"
    notes = [f"{n} {what}" for what, n in (("already had it", tally["same"]),
                                           ("started and keep their priority", tally["started"]),
                                           ("ended", tally["ended"])) if n]
    line += f" ({'; '.join(notes)})" if notes else ""
    return line + ("; the scheduler re-plans now" if tally["changed"] else "")
