"""Benchmark of the claim rules under a stockout: creates per stocked-out zone per hour, from the fake's call log.

`python benchmarks/bench_stockout.py [--minutes 60] [--tick 60]` runs the claim stack of the tests
(`tests/integration/claimstack.py`: the claimer's and the janitor's real services, the fake Cloud TPU on a
manual clock, here on the in-memory Firestore so no emulator is needed) through a scenario:
- us-central2-b is stocked out (`effect: fail`) for `--minutes` scenario minutes; us-central2-a has capacity;
- demand throughout: one open request for more slices than the fleet will ever get;
- a tick every `--tick` scenario seconds (Cloud Scheduler's minute by default), delivered to both services,
  in each order (the janitor's first, then the claimer's first);
- the fleet's default back-off: `capacity_backoff_base_seconds` 60, `capacity_backoff_max_seconds` 1800.

The figure is the number of queued resources created in the stocked-out zone during the window, read from the
fake's call log, per hour. The goal is what the back-off schedule allows: about log2(window / base delay); the
exact bound is printed too (each retry no sooner than half its back-off step after the failure).

Prints one JSON line per order: {"bench": "stockout_creates_per_zone_hour", "creates_per_hour": N, ...}.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the stack the tests use

from tests.integration.claimstack import PROJECT, ClaimStack  # noqa: E402
from tpuq.contracts.fleet import ClaimPolicy  # noqa: E402
from tpuq_dev.inmemory import MemoryFirestore  # noqa: E402
from tpuq.contracts.messages import FleetEventKind  # noqa: E402

HEALTHY, STOCKED_OUT = "us-central2-a", "us-central2-b"


def schedule_bound(window: float, base: float, cap: float) -> int:
    """Most creates the back-off schedule allows in `window`: the first, then one after each minimal delay."""
    creates, elapsed, failures = 1, 0.0, 1
    while True:
        elapsed += min(cap, base * 2 ** (failures - 1)) / 2
        if elapsed >= window:
            return creates
        creates, failures = creates + 1, failures + 1


def run(minutes: float, tick: float, janitor_first: bool, tmp: Path) -> dict:
    window = minutes * 60
    scenario = {"seed": 3, "zones": {
        HEALTHY: {"quota": {"v4": {"spot": 4096}}},
        STOCKED_OUT: {"quota": {"v4": {"spot": 4096}}, "stockouts": [{"start": 0, "end": window, "effect": "fail"}]},
    }}
    fleet = {"name": "bench", "project": PROJECT, "owner_prefix": "tq",
             "tpus": [{"id": "v4", "type": "v4-32", "zones": [HEALTHY, STOCKED_OUT], "count": 200}]}
    s = ClaimStack(MemoryFirestore(), scenario, fleet, tmp, janitor_first=janitor_first)
    try:
        s.request("demand", count=200)
        ticks = 0
        while s.scenario_time + tick < window:
            s.tick(tick)
            ticks += 1
        creates = [c for c in s.creates(STOCKED_OUT) if c["scenario_time"] < window]
        failed = [e for e in s.events if e.zone == STOCKED_OUT and e.kind is FleetEventKind.failed]
        classified = sum(1 for e in failed if e.failure_class is not None)
        healthy = len(s.creates(HEALTHY))
    finally:
        s.close()
    claim = ClaimPolicy()
    return {
        "bench": "stockout_creates_per_zone_hour",
        "order": "janitor first" if janitor_first else "claimer first",
        "creates_per_hour": round(len(creates) * 3600 / window, 1),
        "creates": len(creates),
        "failures_classified": classified,
        "allowed_by_schedule": schedule_bound(window, claim.capacity_backoff_base_seconds,
                                              claim.capacity_backoff_max_seconds),
        "log2_window_over_base": round(math.log2(window / claim.capacity_backoff_base_seconds), 1),
        "ticks": ticks,
        "healthy_zone_creates": healthy,
        "window_minutes": minutes,
        "tick_seconds": tick,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--tick", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for janitor_first in (True, False):
            print(json.dumps(run(args.minutes, args.tick, janitor_first, Path(tmp) / str(janitor_first))),
                  flush=True)


if __name__ == "__main__":
    main()
