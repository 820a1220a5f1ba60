"""Where the simulator's CPU goes in the tpuq policy, beside the polling policy's (issue 34 §2: tpuq's CPU no more
than polling's in the same run).

    python benchmarks/bench_sim_handlings.py [--days 5] [--seed 0]

The standard scenario (`tpuq simulate --example`) for `--days`, the two policies one after the other in this
process. One JSON line:
- `cpu_seconds`: each policy's whole run, and their ratio;
- `tpuq_by_subscription`: the CPU seconds of each subscription's handlings, and how many pushes it was delivered
  (a tick skipped as quiet is delivered, not handled: its judging counts as the simulator's own);
- `tpuq_ticks`: by tick subscription, the handlings run (each with its quiet-tick judging) that changed something
  and those that did not (but could not be skipped), with their CPU seconds (the janitor's routing of the clock's
  tick publishes: a change);
- `floor_of_polling`: the CPU of every message handling, every tick handling that changed something (none of them
  can be skipped, however exactly quiet ticks are judged) and the simulator's own work outside handlings (the
  loop, the modelled cloud and workers) over the polling policy's whole run: what the tpuq policy would cost at
  best with its handlings as they are, as a fraction of polling's;
- `machine_reference_seconds` (bench_simulate's).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

from bench_simulate import DAY, _inputs, machine_reference_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the services' own log lines
    from tpuq_dev.simulate.run import simulate
    from tpuq_dev.simulate.storeops import OUTSIDE

    reference = machine_reference_seconds()
    inputs = _inputs(args.days, args.seed, None)
    cpu = {}
    for policy, options in (("tpuq", {"cpu_clock": time.process_time}), ("polling", {})):
        started = time.process_time()
        run = simulate(policy, fleet=inputs.fleet, scenario=inputs.scenario, jobs=inputs.jobs,
                       horizon=args.days * DAY, seed=args.seed, **options)
        cpu[policy] = time.process_time() - started
        if policy == "tpuq":
            driver = run.driver
            driver.store_ops.per_day(1.0)  # counts the simulator's own work after the last handling too
            by_subscription = {name: {"cpu_seconds": round(seconds, 2), "delivered": driver.bus.delivered[name]}
                               for name, seconds in sorted(driver.store_ops.cpu.items(), key=lambda kv: -kv[1])}
            ticks = {f"{name} {'changed' if changed else 'quiet'}": {"handlings": n, "cpu_seconds": round(s, 2)}
                     for (name, changed), (n, s) in sorted(driver.tick_cpu.items())}
            tick_names = {name for name, _ in driver.tick_cpu}
            outside = driver.store_ops.cpu.get(OUTSIDE, 0.0)
            messages = sum(s for name, s in driver.store_ops.cpu.items() if name not in tick_names) - outside
            changing = sum(s for (_, changed), (_, s) in driver.tick_cpu.items() if changed)
    print(json.dumps({
        "bench": "sim_handlings", "days": args.days, "seed": args.seed,
        "cpu_seconds": {k: round(v, 2) for k, v in cpu.items()},
        "tpuq_cpu_of_polling": round(cpu["tpuq"] / cpu["polling"], 2),
        "tpuq_by_subscription": by_subscription, "tpuq_ticks": ticks,
        "messages_cpu_seconds": round(messages, 2), "changing_ticks_cpu_seconds": round(changing, 2),
        "simulator_own_cpu_seconds": round(outside, 2),
        "floor_of_polling": round((messages + changing + outside) / cpu["polling"], 2),
        "load_average": round(os.getloadavg()[0], 1), "machine_reference_seconds": reference,
    }))


if __name__ == "__main__":
    main()
