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
