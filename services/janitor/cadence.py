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
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tpuq.runtime.cadence import is_due

SWEEP_AT = "sweep_at"  # janitor/{fleet}: when the last full sweep was claimed


def sweep_due(last: datetime | None, now: datetime, every: timedelta) -> bool:
    """Whether the full sweep is due at `now` (the backstops' one rule, `tpuq.runtime.cadence.is_due`)."""
    return is_due(last, now, every)


def needs_every_live_tpu(expired: list, keep_warm_of, paused: bool) -> bool:
    """Whether the idle rule, given the idle TPUs past their timeout (`expired`), must count every live TPU of
    their entries: only when one of them is healthy and its entry keeps some warm (`keep_warm_of(entry_id)`),
    and the fleet is not paused. Otherwise the idle TPUs alone decide it (`decide.decide_idle`'s room is at
    least the expired count)."""
    return not paused and any(not t.quarantined and keep_warm_of(t.entry_id) > 0 for t in expired)

