"""Core (pure, no I/O) and its read (`read_cost`): what the fleet cost, from what tpuq records in Firestore.

VM-hours, as `tpuq.capacity.brakes` counts them: a slice of H hosts alive T hours is H x T. From the scheduler's
`tpus/{node}` documents (alive from `created_at`, when the scheduler recorded it ACTIVE, until `gone_at`) and
the jobs' `attempts/{n}` (each ran on one node from `started_at`, else `assigned_at`, until `ended_at`):

- billed: every slice's hours, per UTC day and TPU type;
- running jobs: the hours of the attempts on those slices (an attempt's hours count on its slice's type);
- waste, by cause:
  - race losers that reached ACTIVE: slices that never ran an attempt and that the janitor deleted as surplus
    of a race already won (its `delete_reason`, `SURPLUS_REASON`);
  - idle: every other billed hour no attempt used (waiting for a job, the idle timeout, keep-warm slices);
  - lost to preemption: the hours of attempts that ended preempted (their work since the last checkpoint is
    lost; tpuq does not know when that was, so the whole attempt is counted).

Times are split at 00:00 UTC, as the budget counts days. Nothing here reads a clock: `now` ends what is alive.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tpuq.capacity.brakes import HOUR, day_start, hosts_of
from tpuq.contracts.documents import AttemptDoc, TpuDoc, TpuState, short_node_name
from tpuq.contracts.messages import AttemptOutcome

# The start of the janitor's `delete_reason` on a racer deleted because its race was already won
# (tpuq.janitor.handlers.settle_race); tests/ui/test_ui_cost.py checks the janitor still writes it.
SURPLUS_REASON = "surplus"
CAUSES = ("race losers", "idle", "lost to preemption")


@dataclass
class CostRow:
    day: str  # YYYY-MM-DD, UTC
    type: str
    billed: float = 0.0
    running: float = 0.0
    waste: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))


def split_by_day(start: datetime, end: datetime) -> list[tuple[str, float]]:
    """(UTC day, hours) of the interval [start, end), cut at each 00:00 UTC."""
    out = []
    while end > start:
        cut = min(end, day_start(start) + timedelta(days=1))
        out.append((day_start(start).date().isoformat(), (cut - start) / HOUR))
        start = cut
    return out


def _tpu_span(tpu: Mapping[str, Any], now: datetime) -> tuple[datetime, datetime] | None:
    begin = tpu.get("created_at")
    if not isinstance(begin, datetime):
        return None
    end = (tpu.get(TpuDoc.field("gone_at")) or tpu.get("updated_at")) if tpu.get("state") == TpuState.gone else now
    return (begin, min(end, now)) if isinstance(end, datetime) else None


def _attempt_span(a: AttemptDoc, now: datetime) -> tuple[datetime, datetime] | None:
    begin = a.started_at or a.assigned_at
    if not isinstance(begin, datetime):
        return None
    return begin, min(a.ended_at or now, now)


def cost_rows(tpus: Iterable[Mapping[str, Any]], attempts: Iterable[Mapping[str, Any]], now: datetime,
              since: datetime | None = None) -> list[CostRow]:
    """Per UTC day and TPU type, oldest first: billed and running VM-hours and the waste by cause.
    `tpus`: `tpus/{node}` documents (gone ones included); `attempts`: attempt documents of any job;
    `since`: leave out the days before it."""
    rows: dict[tuple[str, str], CostRow] = {}

    def add(day: str, tpu_type: str, what: str, hours: float) -> None:
        row = rows.setdefault((day, tpu_type), CostRow(day, tpu_type))
        if what in CAUSES:
            row.waste[what] += hours
        else:
            setattr(row, what, getattr(row, what) + hours)

    by_node: dict[str, Mapping[str, Any]] = {}
    for t in tpus:
        key = t.get("short") or short_node_name(t.get("name") or "")
        if key:
            by_node[key] = t
    used: dict[str, dict[str, float]] = {}  # node -> day -> hours its attempts ran (in VM-hours)
    for doc in attempts:
        try:
            a = AttemptDoc.from_doc(doc)
        except Exception:  # noqa: BLE001 - one unreadable attempt is left out of the sums, not the page
            continue
        span = _attempt_span(a, now)
        if span is None:
            continue
        for node in (short_node_name(n) for n in (a.gang or ((a.tpu,) if a.tpu else ()))):  # a gang: every slice
            if node not in by_node:
                continue
            tpu = by_node[node]
            hosts = int(tpu.get("hosts") or hosts_of(tpu.get("type")))
            for day, hours in split_by_day(*span):
                add(day, tpu.get("type") or "?", "running", hours * hosts)
                used.setdefault(node, {}).setdefault(day, 0.0)
                used[node][day] += hours * hosts
                if a.outcome == AttemptOutcome.preempted.value:
                    add(day, tpu.get("type") or "?", "lost to preemption", hours * hosts)
    for node, tpu in by_node.items():
        span = _tpu_span(tpu, now)
        if span is None:
            continue
        hosts = int(tpu.get("hosts") or hosts_of(tpu.get("type")))
        loser = node not in used and str(tpu.get(TpuDoc.field("delete_reason")) or "").startswith(SURPLUS_REASON)
        for day, hours in split_by_day(*span):
            billed = hours * hosts
            add(day, tpu.get("type") or "?", "billed", billed)
            unused = max(0.0, billed - used.get(node, {}).get(day, 0.0))
            add(day, tpu.get("type") or "?", "race losers" if loser else "idle", unused)
    first = since and day_start(since).date().isoformat()
    return [r for _, r in sorted(rows.items()) if not first or r.day >= first]


def totals(rows: Iterable[CostRow]) -> dict[str, Any]:
    """The sums over the rows: billed, running, and waste by cause."""
    rows = list(rows)
    return {"billed": sum(r.billed for r in rows), "running": sum(r.running for r in rows),
            "waste": {c: sum(r.waste[c] for r in rows) for c in CAUSES}}


def chart_data(rows: Iterable[CostRow]) -> dict[str, Any]:
    """What the page's chart draws per day (all types): one bar of the billed VM-hours, and beside it where they
    went, stacked: jobs' work kept, work lost to preemption, idle, race losers (together the billed hours again).
    `series`: [{name, stack, values}], in drawing order."""
    days: dict[str, dict[str, float]] = {}
    for r in rows:
        d = days.setdefault(r.day, {"billed": 0.0, "running": 0.0, **dict.fromkeys(CAUSES, 0.0)})
        d["billed"] += r.billed
        d["running"] += r.running
        for c in CAUSES:
            d[c] += r.waste[c]
    labels = sorted(days)

    def values(of) -> list[float]:
        return [round(of(days[day]), 4) for day in labels]

    return {"labels": labels, "series": [
        {"name": "billed", "stack": "billed", "values": values(lambda d: d["billed"])},
        {"name": "jobs' work kept", "stack": "use", "values": values(lambda d: d["running"] - d["lost to preemption"])},
        {"name": "lost to preemption", "stack": "use", "values": values(lambda d: d["lost to preemption"])},
        {"name": "idle", "stack": "use", "values": values(lambda d: d["idle"])},
        {"name": "race losers", "stack": "use", "values": values(lambda d: d["race losers"])},
    ]}


def read_cost(db, now: datetime, days: int = 14, job_limit: int = 1000) -> list[CostRow]:
    """Read `tpus/` and the attempts of the jobs submitted in the last `days` days (at most `job_limit` jobs),
    then `cost_rows`."""
    from google.cloud import firestore

    from tpuq.contracts import store
    from tpuq.contracts.documents import JobDoc

    since = day_start(now) - timedelta(days=days - 1)
    tpus = [s.to_dict() or {} for s in db.collection(store.TPUS).stream()]
    jobs = (db.collection(store.JOBS)
            .where(filter=firestore.FieldFilter(JobDoc.field("submit_time"), ">=", since - timedelta(days=1)))
            .order_by(JobDoc.field("submit_time"), direction=firestore.Query.DESCENDING).limit(job_limit).stream())
    attempts = []
    for job in jobs:
        attempts += [a.to_dict() or {} for a in job.reference.collection(store.ATTEMPTS).stream()]
    return cost_rows(tpus, attempts, now, since)
