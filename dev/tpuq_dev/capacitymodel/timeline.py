"""The scenario's random draws, each from its own RNG seeded by what it is about, never by call order.

Every stochastic thing in a scenario (a zone's stockout windows for a family, a request's provisioning delay,
a node's spot lifetime) has a key: (scenario seed, what, zone, family) or (seed, what, resource name). Its
draws come from that key alone (`keyed_rng` for a sequence, `keyed_uniforms` for one value), so the capacity model, the offline bound and a rerun see the
same value whatever else happened, and however many API calls came before.

Pure arithmetic here; the scenario's pydantic types (scenario.py) use it.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random


def _key(seed: int, key: tuple) -> str:
    return "|".join(str(part) for part in (seed, *key))


def keyed_rng(seed: int, *key: object) -> random.Random:
    """An RNG determined by (seed, key...) alone, for a sequence of draws. A str seed goes through SHA-512
    (random.Random's version 2 seeding): stable across runs and Python processes, unlike hash(). Seeding one
    costs ~10 µs: for a single value, `keyed_uniforms` is ten times cheaper."""
    return random.Random(_key(seed, key))


def keyed_uniforms(seed: int, *key: object) -> tuple[float, float]:
    """Two independent uniforms in [0, 1), determined by (seed, key...) alone (BLAKE2b of the key, 53 bits each)."""
    digest = hashlib.blake2b(_key(seed, key).encode(), digest_size=16).digest()
    return ((int.from_bytes(digest[:8], "big") >> 11) * _TWO_TO_MINUS_53,
            (int.from_bytes(digest[8:], "big") >> 11) * _TWO_TO_MINUS_53)


_TWO_TO_MINUS_53 = 1.0 / (1 << 53)


def sample(dist: object, u: tuple[float, float]) -> float:
    """One draw of a delay distribution (scenario.py: fixed, uniform, exponential, lognormal), in seconds, from
    two uniforms in [0, 1) (inverse transform; Box-Muller for the lognormal's normal)."""
    kind = dist.dist  # type: ignore[attr-defined]
    if kind == "fixed":
        return float(dist.value)  # type: ignore[attr-defined]
    if kind == "uniform":
        return dist.low + u[0] * (dist.high - dist.low)  # type: ignore[attr-defined]
    if kind == "exponential":
        return exponential(dist.mean, u[0])  # type: ignore[attr-defined]
    if kind == "lognormal":
        normal = math.sqrt(-2.0 * math.log(1.0 - u[0])) * math.cos(2.0 * math.pi * u[1])
        return dist.median * math.exp(dist.sigma * normal)  # type: ignore[attr-defined]
    raise ValueError(f"unknown distribution {kind!r}")


def exponential(mean: float, u: float) -> float:
    """The exponential of that mean at uniform u in [0, 1)."""
    return -mean * math.log(1.0 - u)


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
