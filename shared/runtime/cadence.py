"""Core (pure, no I/O): is a run on a cadence due? The one rule for the lost-event backstops that run every few
minutes rather than every tick (the scheduler's, `tpuq.scheduler.backstops`; the janitor's full sweep,
`tpuq.janitor.cadence`), whose last run is recorded in Firestore so that every instance agrees."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

# Ticks come once a minute, each a little early or late: a run counts as due up to this share of its period
# before the period is up, so that a 5-minute cadence is every fifth tick, not every sixth.
EARLY_SHARE = 0.1


def is_due(last: object, now: datetime, every: timedelta) -> bool:
    """Whether a run last made at `last` is due again at `now`: never run (not a time), a period gone (less the
    early share), or recorded further ahead than a period (a clock set wrong)."""
    return not isinstance(last, datetime) or now - last >= every * (1 - EARLY_SHARE) or last - now > every


def due_at(last: object, now: datetime, every: timedelta) -> datetime | None:
    """The instant from which `is_due` says yes for a run last made at `last` (None: due now). A later `now`
    answers the same until then: what an instance may remember instead of reading `last` again."""
    if is_due(last, now, every):
        return None
    assert isinstance(last, datetime)
    return last + every * (1 - EARLY_SHARE)


@dataclass
class TickMemory:
    """What one service instance remembers between ticks (the claimer's `remembered`): before
    `quiet_until` nothing runs on a cadence in any fleet, so that a tick asks only the one question that can still
    make it work (one query). Lost with the instance: a new one reads every fleet."""

    quiet_until: datetime | None = None

    def quiet_at(self, now: datetime) -> bool:
        return self.quiet_until is not None and now < self.quiet_until

    def remember(self, due: list[datetime | None]) -> None:
        """After a tick that read every fleet: the earliest instant one is due again (`due`, a fleet's; None for a
        fleet due now, or whose part failed: nothing remembered, the next tick reads every fleet again)."""
        self.quiet_until = None if not due or any(at is None for at in due) else min(due)  # type: ignore[type-var]
