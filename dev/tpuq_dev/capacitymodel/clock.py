"""Scenario time for the fake Cloud TPU.

Scenario time is seconds since the fake started, running `time_scale` times
faster than real time, so a 600 s provisioning takes 1 s with time_scale=600.
The state machine only ever sees `now()` values; tests pass a `ManualClock`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Scenario seconds since the start."""

    def wall(self, scenario_seconds: float) -> datetime:
        """The UTC wall time a scenario time is shown as in API responses."""

    def real_wall(self, scenario_seconds: float) -> datetime:
        """The real UTC time at which the fake reaches that scenario time: what a client's own clock will read
        then. Times a client compares with its clock (a maintenance window's start) are shown in it."""


class ScaledClock:
    def __init__(
        self,
        time_scale: float = 1.0,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        start_wall: datetime | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.time_scale = time_scale
        self._monotonic = monotonic
        self._start = monotonic()
        self._start_wall = start_wall or datetime.now(timezone.utc)

    def now(self) -> float:
        return (self._monotonic() - self._start) * self.time_scale

    def wall(self, scenario_seconds: float) -> datetime:
        return self._start_wall + timedelta(seconds=scenario_seconds)

    def real_seconds(self, scenario_seconds: float) -> float:
        return scenario_seconds / self.time_scale

    def real_wall(self, scenario_seconds: float) -> datetime:
        return self._start_wall + timedelta(seconds=self.real_seconds(scenario_seconds))


class ManualClock:
    """A clock that moves only when told to: for unit tests of the state machine."""

    def __init__(self, start: float = 0.0, start_wall: datetime | None = None) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._start_wall = start_wall or datetime(2025, 1, 1, tzinfo=timezone.utc)

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now

    def wall(self, scenario_seconds: float) -> datetime:
        return self._start_wall + timedelta(seconds=scenario_seconds)

    def real_wall(self, scenario_seconds: float) -> datetime:
        return self.wall(scenario_seconds)  # no scale: scenario time is the test's own time


def rfc3339(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
