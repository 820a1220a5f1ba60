"""When the janitor's tick runs its full sweep: core (pure, no I/O).

The full sweep (an exact GET of every live queued resource and TPU Firestore knows for a fleet) is the backstop
for lost fleet events: a dead queued resource, a loser that left PROVISIONING, whose event never arrived. Run on
every tick it reads every live slice each minute to catch events that are rarely lost. It runs on a cadence
instead (`Settings.backstop_every`, the lost-event cadence the scheduler's backstops use: 15 minutes; the chaos
soak shortens it), recorded in `janitor/{fleet}.sweep_at` beside `orphan_scan_at`, so that every instance agrees:
a tick reads that one document, `sweep_due` says whether the sweep is due, and the tick claims it (and a due
orphan scan) with one guarded write. Between sweeps a tick reads only what can need action now: the fleet's TPUs
idle or marked deleting (one indexed query), and all its live TPUs only when an idle one has passed its timeout
(the idle rule's keep-warm count needs them).

The janitor's tick work is due (`tick_due/janitor`, `tpuq.runtime.tickdue`, which the clock's tick reads to route
itself: issue 34 §1) at every tick while a TPU of any fleet is idle or marked deleting or a drain is pending
(every commit that writes a TPU idle or deleting sets it so, whoever writes it: `tpuq.runtime.guarded`), else at
the first fleet's next run on its cadence (`runs_due_at`). A quiet minute costs the router's one query.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tpuq.janitor.decide import orphan_scan_due_at
from tpuq.runtime.cadence import due_at, is_due

SWEEP_AT = "sweep_at"  # janitor/{fleet}: when the last full sweep was claimed
ORPHAN_SCAN_AT = "orphan_scan_at"  # janitor/{fleet}: when the last orphan scan was claimed


def sweep_due(last: datetime | None, now: datetime, every: timedelta) -> bool:
    """Whether the full sweep is due at `now` (the backstops' one rule, `tpuq.runtime.cadence.is_due`)."""
    return is_due(last, now, every)


def needs_every_live_tpu(expired: list, keep_warm_of, paused: bool) -> bool:
    """Whether the idle rule, given the idle TPUs past their timeout (`expired`), must count every live TPU of
    their entries: only when one of them is healthy and its entry keeps some warm (`keep_warm_of(entry_id)`),
    and the fleet is not paused. Otherwise the idle TPUs alone decide it (`decide.decide_idle`'s room is at
    least the expired count)."""
    return not paused and any(not t.quarantined and keep_warm_of(t.entry_id) > 0 for t in expired)



def runs_due_at(doc: dict, now: datetime, sweep_every: timedelta, orphan_scan_seconds: float) -> datetime | None:
    """The first instant at which the full sweep or the orphan scan of the fleet whose `janitor/{fleet}` reads
    `doc` (as claimed at `now`) is due (None: one is due now)."""
    sweep = due_at(doc.get(SWEEP_AT), now, sweep_every)
    orphans = orphan_scan_due_at(doc.get(ORPHAN_SCAN_AT), now, orphan_scan_seconds)
    return None if sweep is None or orphans is None else min(sweep, orphans)
