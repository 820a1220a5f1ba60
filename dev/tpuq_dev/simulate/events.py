"""Virtual time: one event heap; the clock moves only when the loop takes the next event.

Ties break by the order events were scheduled (a sequence number), so a run is a function of its inputs and
its seed alone."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

DEFAULT_START = datetime(2026, 1, 5, tzinfo=timezone.utc)  # a Monday; only ever shown, never compared with now


class EventLoop:
    def __init__(self, start_wall: datetime = DEFAULT_START) -> None:
        self._now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._seq = itertools.count()
        self.start_wall = start_wall
        self.events_run = 0
        self._wall_at: tuple[float, datetime, datetime] | None = None  # (seconds, start_wall, `wall(seconds)`)

    # -- the capacity model's Clock protocol ------------------------------------------------
    def now(self) -> float:
        return self._now

    def wall(self, seconds: float) -> datetime:
        # Asked for again and again at one instant (every read's time, every handler's now): converted once.
        # datetimes are immutable, so the one object serves every caller.
        kept = self._wall_at
        if kept is not None and kept[0] == seconds and kept[1] is self.start_wall:
            return kept[2]
        when = self.start_wall + timedelta(seconds=seconds)
        self._wall_at = (seconds, self.start_wall, when)
        return when

    def real_wall(self, seconds: float) -> datetime:
        return self.wall(seconds)  # no scale: the services' clock reads the same virtual time

    def utcnow(self) -> datetime:
        """The services' `now()`: virtual time as a UTC datetime."""
        return self.wall(self._now)

    # -- scheduling ---------------------------------------------------------------------------
    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        heapq.heappush(self._heap, (max(when, self._now), next(self._seq), fn, args))

    def after(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self._now + delay, fn, *args)

    def every(self, period: float, fn: Callable[..., Any], *, first: float | None = None) -> None:
        """Call fn at `first` (default: one period from now) and then every period, for the whole run."""
        def fire() -> None:
            fn()
            self.after(period, fire)
        self.at(self._now + period if first is None else first, fire)

    def advance_within_event(self, seconds: float) -> None:
        """The running event takes `seconds` (a handler that waits): events due meanwhile run after it."""
        self._now += max(0.0, seconds)

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run(self, until: float, on_progress: Callable[[float], None] | None = None,
            progress_every: float | None = None) -> None:
        """Run every event due before `until`; the clock ends at `until`. `on_progress(now)` is told at least
        every `progress_every` virtual seconds (default: a hundredth of the run, at most a day)."""
        if progress_every is None:
            progress_every = min(86400.0, max(1.0, (until - self._now) / 100))
        next_report = self._now + progress_every
        while self._heap and self._heap[0][0] < until:
            when, _, fn, args = heapq.heappop(self._heap)
            self._now = max(self._now, when)  # an event due while a handler waited runs when it returns
            if on_progress is not None and when >= next_report:
                on_progress(when)
                next_report = when + progress_every
            fn(*args)
            self.events_run += 1
        self._now = until
        if on_progress is not None:
            on_progress(until)
