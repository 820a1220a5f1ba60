"""The scenario's random draws, each from its own RNG seeded by what it is about, never by call order.

Every stochastic thing in a scenario (a zone's stockout windows for a family, a request's provisioning delay,
a node's spot lifetime) has a key: (scenario seed, what, zone, family) or (seed, what, resource name). Its
RNG is seeded from that key alone (`keyed_rng`), so the capacity model, the offline bound and a rerun see the
same value whatever else happened, and however many API calls came before.

Pure arithmetic here; the scenario's pydantic types (scenario.py) use it.
"""

from __future__ import annotations

import bisect
import math
import random


def keyed_rng(seed: int, *key: object) -> random.Random:
    """An RNG determined by (seed, key...) alone. A str seed goes through SHA-512 (random.Random's version 2
    seeding): stable across runs and Python processes, unlike hash()."""
    return random.Random("|".join(str(part) for part in (seed, *key)))


def sample(dist: object, rng: random.Random) -> float:
    """One draw of a delay distribution (scenario.py: fixed, uniform, exponential, lognormal), in seconds."""
    kind = dist.dist  # type: ignore[attr-defined]
    if kind == "fixed":
        return float(dist.value)  # type: ignore[attr-defined]
    if kind == "uniform":
        return rng.uniform(dist.low, dist.high)  # type: ignore[attr-defined]
    if kind == "exponential":
        return rng.expovariate(1.0 / dist.mean)  # type: ignore[attr-defined]
    if kind == "lognormal":
        return rng.lognormvariate(math.log(dist.median), dist.sigma)  # type: ignore[attr-defined]
    raise ValueError(f"unknown distribution {kind!r}")


class AlternatingWindows:
    """Out-of-stock windows of one (zone, family): alternating in-stock and out-of-stock periods, both
    exponential, the out ones of mean `mean_out`, the in ones of mean mean_out * (1 - fraction) / fraction, so
    the long-run share of time out is `fraction`. The process starts in its stationary state (out with
    probability `fraction`, then memoryless), so t=0 is not special. Generated lazily as far as asked: a
    lookup at time t costs a bisection plus whatever windows before t were not drawn yet."""

    def __init__(self, rng: random.Random, fraction: float, mean_out: float) -> None:
        self._rng = rng
        self._fraction = fraction
        self._mean_out = mean_out
        self._mean_in = mean_out * (1 - fraction) / fraction if fraction > 0 else math.inf
        self.starts: list[float] = []
        self.ends: list[float] = []
        self._horizon = 0.0  # every window starting before this is drawn
        self._out_next = fraction > 0 and rng.random() < fraction

    def _extend(self, until: float) -> None:
        if self._fraction <= 0:
            return
        rng, t = self._rng, self._horizon
        while t <= until:
            if self._out_next:
                length = rng.expovariate(1.0 / self._mean_out)
                if t + length > t:  # never an empty window
                    self.starts.append(t)
                    self.ends.append(t + length)
                t += length
            else:
                t += rng.expovariate(1.0 / self._mean_in)
            self._out_next = not self._out_next
        self._horizon = t

    def index_at(self, t: float) -> int | None:
        """The index of the window holding t (start <= t < end), if any."""
        self._extend(t)
        i = bisect.bisect_right(self.starts, t) - 1
        return i if i >= 0 and t < self.ends[i] else None

    def upto(self, until: float) -> list[tuple[float, float]]:
        """Every window starting before `until`, in time order."""
        self._extend(until)
        n = bisect.bisect_left(self.starts, until)
        return list(zip(self.starts[:n], self.ends[:n]))
