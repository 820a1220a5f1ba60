"""Quiet ticks: skipping, service by service, the tick handlings that would change nothing, exactly.

A month of production's one-a-minute ticks is 43,200 ticks of four services. Most handlings change nothing:
every job runs, every slice is busy, every request waits. A service's handling of a tick can be skipped when,
at the instant the tick reaches it,

1. its handling of the tick before was quiet (it wrote no document, published nothing, created or deleted no
   queued resource, answered no 5xx), and nothing it read has changed since: no document it got, no document any
   of its queries matched before or after the change (order and limit only pick among the matches), if it read
   the cloud no create, delete or transition there, nor one due by now, if it read the workers no attempt started
   or ended, and no state its service keeps in process (the services keep theirs in the store, but for the
   claimer's pre-check cache, which says when it hands out a new read); and
2. no instant at which one of its time rules would decide otherwise has come.

(1) is tracked by `tpuq_dev.simulate.tpuq_policy` through the in-memory Firestore's observer and the bus's. (2) is
found without knowing the rules: during a tick the services' clock (`ctx.now()`) hands out a `TracedNow`, a
datetime that notes where each comparison involving it would flip. `now - t > limit`, `until <= now`,
`(now - t).total_seconds() >= n`, `min(now + d, x)`: each records the virtual instant at which its answer
changes, in that service's own `Deadlines`. A query's range filter against such a time (`updated_at <= now -
2 min`) is compared, document by document, the same way (`TpuqPolicy._note_moving_filters`).

The judgement is made when the tick reaches the service, not when it is published: the other services'
handling of the same tick, a few milliseconds earlier, counts. A skipped handling's API reads are counted as its
last quiet handling's reads (a quiet handling's reads are a function of an unchanged state). `verify=True` runs
every handling anyway and counts those skipping would have skipped but that did something (`violations`): the
test of this module runs a busy scenario that way, and another compares outcomes with and without skipping.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from google.api_core.datetime_helpers import DatetimeWithNanoseconds

_EPS = 1e-6


class Deadlines:
    """The earliest future instant (virtual seconds) at which a traced comparison flips."""

    def __init__(self) -> None:
        self.earliest = math.inf
        self.opaque = 0  # uses the trace cannot follow (a conversion to text or a number): no skipping then

    def note(self, at: float, now: float) -> None:
        if at > now + _EPS / 2 and at < self.earliest:
            self.earliest = at

    def reset(self) -> None:
        self.earliest, self.opaque = math.inf, 0


class _Trace:
    """What a traced value knows: the recorder, the event's now (seconds) and the clock that moves on.

    A value is live while the clock still reads its event's now; after that it is a constant from the past
    (a cache's `read_at`, kept by a handler for a later message) and compares as a plain datetime."""

    __slots__ = ("deadlines", "now", "origin", "clock")

    def __init__(self, deadlines: Deadlines, now: float, origin: datetime, clock) -> None:
        self.deadlines, self.now, self.origin, self.clock = deadlines, now, origin, clock

    @property
    def live(self) -> bool:
        return self.clock() == self.now

    def seconds(self, when: datetime) -> float:
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return (when - self.origin).total_seconds() if not isinstance(when, TracedNow) else \
            datetime.__sub__(when, self.origin).total_seconds()


def _flip(trace: _Trace, value_now: float, rate: float, other: float, strict_after: bool) -> None:
    """A quantity that is `value_now` now and changes by `rate` per second crosses `other`: note when."""
    if rate == 0 or not trace.live:
        return  # a value kept from an earlier event is a constant now
    at = trace.now + (other - value_now) / rate
    trace.deadlines.note(at + (_EPS if strict_after else 0.0), trace.now)


class TracedNow(DatetimeWithNanoseconds):
    """The services' now: a datetime (a Firestore timestamp, as stored values are) that notes its flips."""

    _trace: _Trace | None = None  # None: made by a datetime method, not by the clock: a plain value

    @classmethod
    def make(cls, when: datetime, trace: _Trace | None) -> "TracedNow":
        value = cls(when.year, when.month, when.day, when.hour, when.minute, when.second, when.microsecond,
                    tzinfo=when.tzinfo or timezone.utc)
        value._trace = trace
        return value

    def _offset(self) -> float:
        """Seconds from the event's now to this value (now + offset)."""
        return datetime.__sub__(self, self._trace.origin).total_seconds() - self._trace.now

    def _moves(self) -> bool:
        return self._trace is not None and self._trace.live

    def _compare(self, other, strict_after: bool, mirrored_strict: bool | None = None) -> None:
        if not self._moves():
            if isinstance(other, TracedNow) and other._moves():
                # `stale < now` is `now > stale`: the live one notes it.
                other._compare(self, strict_after if mirrored_strict is None else mirrored_strict)
            return
        if isinstance(other, TracedNow) and other._moves():
            return  # both move with now: their order never changes
        if isinstance(other, datetime):
            # self(t) = t + offset reaches x at t = x - offset.
            _flip(self._trace, self._trace.now + self._offset(), 1.0, self._trace.seconds(other), strict_after)

    # a < b flips when b > a does; strictness by the live one's own operator.
    def __lt__(self, other):
        self._compare(other, False, True)
        return datetime.__lt__(self, other)

    def __ge__(self, other):
        self._compare(other, False, True)
        return datetime.__ge__(self, other)

    def __gt__(self, other):
        self._compare(other, True, False)
        return datetime.__gt__(self, other)

    def __le__(self, other):
        self._compare(other, True, False)
        return datetime.__le__(self, other)

    def __eq__(self, other):
        self._compare(other, False, False)
        self._compare(other, True, True)
        return datetime.__eq__(self, other)

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal  # `!= None` is True, as for a datetime

    __hash__ = datetime.__hash__

    def __add__(self, other):
        if isinstance(other, TracedDelta):
            if self._moves():
                self._trace.deadlines.opaque += 1  # now + (now - t) moves at twice the clock's rate: not followed
            other = timedelta(seconds=timedelta.total_seconds(other))
        result = datetime.__add__(self, other)
        if isinstance(result, datetime) and self._moves():
            return TracedNow.make(result, self._trace)
        return result

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, datetime):
            value = datetime.__sub__(self, other)
            mine, theirs = self._moves(), isinstance(other, TracedNow) and other._moves()
            if mine == theirs:
                return value  # both move with now, or neither does: a constant
            return TracedDelta.make(value, 1.0 if mine else -1.0, self._trace if mine else other._trace)
        result = datetime.__sub__(self, other)
        if isinstance(result, datetime) and self._moves():
            return TracedNow.make(result, self._trace)
        return result

    def __rsub__(self, other):
        if isinstance(other, datetime) and not isinstance(other, TracedNow):
            value = datetime.__sub__(_plain(other), _plain(self))
            return TracedDelta.make(value, -1.0, self._trace) if self._moves() else value
        return NotImplemented

    def astimezone(self, tz=None):
        return TracedNow.make(datetime.astimezone(self, tz), self._trace)

    def replace(self, *args, **kwargs):
        result = datetime.replace(_plain(self), *args, **kwargs)
        if "tzinfo" in kwargs and len(kwargs) == 1 and not args:
            return TracedNow.make(result, self._trace)
        self._opaque()
        return result

    def _opaque(self) -> None:
        if self._moves():
            self._trace.deadlines.opaque += 1

    # What the trace cannot follow: a value that stops moving with now, compared elsewhere.
    def timestamp(self):
        self._opaque()
        return datetime.timestamp(self)

    def date(self):
        self._opaque()
        return datetime.date(self)


def _plain(when: datetime) -> datetime:
    return datetime(when.year, when.month, when.day, when.hour, when.minute, when.second, when.microsecond,
                    tzinfo=when.tzinfo)


def flips_from(moving: "TracedNow") -> datetime:
    """A plain time before which no stored time's comparison with `moving` (a live traced now) flips later: one
    compared with `moving` by <, <=, > or >= notes an instant only if it is at least `moving`'s value less the
    trace's epsilon, so a document whose value is earlier than this can be left out of `_note_moving_filters`'
    comparisons (a second's margin)."""
    return _plain(moving) - timedelta(seconds=1)


class TracedDelta(timedelta):
    """`now - t`: a duration that grows (rate 1) or shrinks (rate -1) with the clock."""

    _trace: _Trace
    _rate: float

    @classmethod
    def make(cls, value: timedelta, rate: float, trace: _Trace) -> "TracedDelta":
        d = cls(days=value.days, seconds=value.seconds, microseconds=value.microseconds)
        d._rate, d._trace = rate, trace
        return d

    def _compare(self, other, strict_after: bool) -> None:
        if isinstance(other, TracedDelta):
            if other._rate == self._rate:
                return
            _flip(self._trace, timedelta.total_seconds(self) - timedelta.total_seconds(other),
                  self._rate - other._rate, 0.0, strict_after)
            return
        if isinstance(other, timedelta):
            _flip(self._trace, timedelta.total_seconds(self), self._rate, timedelta.total_seconds(other),
                  strict_after if self._rate > 0 else not strict_after)

    def __lt__(self, other):
        self._compare(other, False)
        return timedelta.__lt__(self, other)

    def __ge__(self, other):
        self._compare(other, False)
        return timedelta.__ge__(self, other)

    def __gt__(self, other):
        self._compare(other, True)
        return timedelta.__gt__(self, other)

    def __le__(self, other):
        self._compare(other, True)
        return timedelta.__le__(self, other)

    def __eq__(self, other):
        self._compare(other, False)
        self._compare(other, True)
        return timedelta.__eq__(self, other)

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal  # `!= None` is True, as for a datetime

    __hash__ = timedelta.__hash__

    def total_seconds(self):
        return TracedFloat.make(timedelta.total_seconds(self), self._rate, self._trace)

    def __add__(self, other):
        if isinstance(other, TracedDelta):
            return TracedDelta.make(timedelta.__add__(self, other), self._rate + other._rate, self._trace)
        result = timedelta.__add__(self, other)
        if isinstance(result, timedelta):
            return TracedDelta.make(result, self._rate, self._trace)
        return result  # a datetime + a moving duration: see TracedNow.__add__

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, TracedDelta):
            return TracedDelta.make(timedelta.__sub__(self, other), self._rate - other._rate, self._trace)
        result = timedelta.__sub__(self, other)
        return TracedDelta.make(result, self._rate, self._trace) if isinstance(result, timedelta) else result

    def __rsub__(self, other):
        if isinstance(other, timedelta):
            return TracedDelta.make(timedelta.__sub__(other, self), -self._rate, self._trace)
        return NotImplemented

    def __neg__(self):
        return TracedDelta.make(timedelta.__neg__(self), -self._rate, self._trace)

    def __mul__(self, k):
        if isinstance(k, (int, float)) and not isinstance(k, bool):
            return TracedDelta.make(timedelta.__mul__(self, k), self._rate * k, self._trace)
        return timedelta.__mul__(self, k)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, timedelta):
            return TracedFloat.make(timedelta.__truediv__(self, other),
                                    self._rate / timedelta.total_seconds(other), self._trace)
        return TracedDelta.make(timedelta.__truediv__(self, other), self._rate / other, self._trace)


class TracedFloat(float):
    """`(now - t).total_seconds()` and what is computed from it by + - * /: a number moving with the clock."""

    _trace: _Trace
    _rate: float

    @classmethod
    def make(cls, value: float, rate: float, trace: _Trace) -> "TracedFloat":
        f = cls(value)
        f._rate, f._trace = rate, trace
        return f

    def _compare(self, other, strict_after: bool) -> None:
        if isinstance(other, TracedFloat):
            if other._rate != self._rate:
                _flip(self._trace, float(self) - float(other), self._rate - other._rate, 0.0, strict_after)
            return
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            _flip(self._trace, float(self), self._rate, float(other), strict_after if self._rate > 0 else not strict_after)

    def __lt__(self, other):
        self._compare(other, False)
        return float.__lt__(self, other)

    def __ge__(self, other):
        self._compare(other, False)
        return float.__ge__(self, other)

    def __gt__(self, other):
        self._compare(other, True)
        return float.__gt__(self, other)

    def __le__(self, other):
        self._compare(other, True)
        return float.__le__(self, other)

    def __eq__(self, other):
        self._compare(other, False)
        self._compare(other, True)
        return float.__eq__(self, other)

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal  # `!= None` is True, as for a datetime

    __hash__ = float.__hash__

    def _moving(self, value: float, rate: float):
        return TracedFloat.make(value, rate, self._trace)

    def __add__(self, other):
        if isinstance(other, TracedFloat):
            return self._moving(float(self) + float(other), self._rate + other._rate)
        if isinstance(other, (int, float)):
            return self._moving(float(self) + other, self._rate)
        return NotImplemented

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, TracedFloat):
            return self._moving(float(self) - float(other), self._rate - other._rate)
        if isinstance(other, (int, float)):
            return self._moving(float(self) - other, self._rate)
        return NotImplemented

    def __rsub__(self, other):
        if isinstance(other, (int, float)):
            return self._moving(other - float(self), -self._rate)
        return NotImplemented

    def __mul__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, TracedFloat):
            return self._moving(float(self) * other, self._rate * other)
        self._trace.deadlines.opaque += 1
        return float(self) * float(other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, TracedFloat) and other != 0:
            return self._moving(float(self) / other, self._rate / other)
        self._trace.deadlines.opaque += 1
        return float(self) / float(other)

    def __neg__(self):
        return self._moving(-float(self), -self._rate)

    # Conversions that stop following the clock.
    def __int__(self):
        self._trace.deadlines.opaque += 1
        return int(float(self))

    def __round__(self, ndigits=None):
        self._trace.deadlines.opaque += 1
        return round(float(self), ndigits)

    def __floor__(self):
        self._trace.deadlines.opaque += 1
        return math.floor(float(self))

    def __ceil__(self):
        self._trace.deadlines.opaque += 1
        return math.ceil(float(self))


def seconds_of(when: datetime) -> float:
    """A traced now's virtual seconds (plain datetimes are not the simulator's)."""
    trace = getattr(when, "_trace", None)
    if trace is None:
        raise TypeError("not a simulator time")
    return trace.seconds(when)


class TracedClock:
    """`now()` for the services: the loop's virtual time, traced into `deadlines`."""

    def __init__(self, loop, deadlines: Deadlines) -> None:
        self.loop, self.deadlines = loop, deadlines
        self._last: tuple[float, Deadlines, TracedNow] | None = None

    def __call__(self) -> TracedNow:
        # A handler asks again and again at one instant: one value (immutable; its trace notes into the same
        # `deadlines`) serves them all, as long as the deadlines it notes into are still the ones in use.
        now, last = self.loop.now(), self._last
        if last is not None and last[0] == now and last[1] is self.deadlines:
            return last[2]
        value = TracedNow.make(self.loop.wall(now), _Trace(self.deadlines, now, self.loop.start_wall, self.loop.now))
        self._last = (now, self.deadlines, value)
        return value
