"""Benchmark of the capacity model's clock-driven core: what `advance()` and `next_due()` cost after many
records came and went (the simulator calls them on every event).

`python benchmarks/bench_capacitymodel.py [--records 5000]`: one world on a manual clock; a request is created
every 60 scenario seconds and deleted an hour later (so about 60 are live at a time, with spot preemptions and
stochastic stockouts and provisioning delays in the scenario); the clock is moved to each `next_due()` and to
each create/delete. Prints one JSON line: records, transitions seen, wall seconds in total, and microseconds
per `advance()` call that had nothing due (the common case), per `advance()` that applied something, and per
`next_due()`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from tpuq_dev.capacitymodel.clock import ManualClock
from tpuq_dev.capacitymodel.model import FakeTpuWorld
from tpuq_dev.capacitymodel.scenario import parse_scenario

P, Z = "bench", "us-central2-b"


def scenario():
    return parse_scenario({
        "seed": 1,
        "zones": {Z: {"quota": {"v4": {"spot": 100_000}},
                      "stockout_model": {"v4": {"fraction": 0.2, "mean_window": 3600, "effect": "wait"}}}},
        "delays": {"provisioning": {"dist": "lognormal", "median": 600, "sigma": 0.5}},
        "preemption": {"mean_spot_lifetime": 7200},
    })


def body(node_id: str) -> dict:
    return {"tpu": {"nodeSpec": [{"parent": f"projects/{P}/locations/{Z}", "nodeId": node_id,
                                  "node": {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}}]},
            "spot": {}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=5000)
    args = parser.parse_args()
    clock = ManualClock()
    seen = []
    world = FakeTpuWorld(scenario(), clock, random.Random(0), on_transition=seen.append)
    # (time, kind, index): a create every 60 s, its delete an hour later.
    actions = sorted([(i * 60.0, 0, i) for i in range(args.records)] + [(i * 60.0 + 3600, 1, i) for i in range(args.records)])
    idle = busy = nexts = 0
    t_idle = t_busy = t_next = 0.0
    started = time.perf_counter()
    for at, kind, i in actions:
        while True:
            t0 = time.perf_counter()
            due = world.next_due()
            t_next += time.perf_counter() - t0
            nexts += 1
            if due is None or due > at:
                break
            clock.advance(due - clock.now())
            before = len(seen)
            t0 = time.perf_counter()
            world.advance()
            spent = time.perf_counter() - t0
            if len(seen) > before:
                busy, t_busy = busy + 1, t_busy + spent
            else:
                idle, t_idle = idle + 1, t_idle + spent
        clock.advance(at - clock.now())
        t0 = time.perf_counter()
        world.advance()
        idle, t_idle = idle + 1, t_idle + (time.perf_counter() - t0)
        if kind == 0:
            world.create_queued_resource(P, Z, f"q{i}", body(f"n{i}"), None)
        else:
            qr = world.queued_resources.get(f"projects/{P}/locations/{Z}/queuedResources/q{i}")
            if qr is not None and qr.state.value != "PROVISIONING":
                world.delete_queued_resource(P, Z, f"q{i}", force=True)
    total = time.perf_counter() - started
    print(json.dumps({
        "bench": "capacitymodel", "records": args.records, "transitions": len(seen),
        "live_at_end": len(world.queued_resources), "total_s": round(total, 3),
        "advance_idle_us": round(1e6 * t_idle / max(idle, 1), 2), "advance_idle_calls": idle,
        "advance_busy_us": round(1e6 * t_busy / max(busy, 1), 2), "advance_busy_calls": busy,
        "next_due_us": round(1e6 * t_next / max(nexts, 1), 2),
        "load_avg": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
