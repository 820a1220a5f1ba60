"""Benchmark of the scheduler's matcher: `python benchmarks/bench_plan.py`.

Prints one JSON line per mix and size: jobs, idle TPUs, the best wall time of a few
runs of `plan()` (inputs are built outside the timed part) and how many jobs it
matched. The mix is seeded, so every run sees the same jobs and TPUs: 1-3
acceptable types per job, some zone- and region-bound jobs, a few pinned
retries, a few exact-name jobs, some jobs still backing off, all priorities
(see MIXES for the mixes; `multislice` adds gangs, issue 37).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from datetime import datetime, timedelta, timezone

from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.jobspec import Priority
from tpuq.scheduler.plan import IdleTpu, PendingJob, plan

SIZES = [(1000, 100), (2000, 200), (5000, 500), (10000, 1000), (20000, 2000)]
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)

# (type, zones where the fleet offers it)
OFFERINGS = [
    ("v4-8", ["us-central2-b"]),
    ("v4-16", ["us-central2-b"]),
    ("v4-32", ["us-central2-b"]),
    ("v5litepod-8", ["us-west4-a", "us-east5-b", "europe-west4-b"]),
    ("v5litepod-16", ["us-west4-a", "us-east5-b"]),
    ("v5litepod-4", ["us-west4-a", "europe-west4-b", "us-central1-a"]),
    ("v6e-8", ["us-east5-b", "europe-west4-a", "us-central1-b"]),
    ("v6e-4", ["us-east5-b", "europe-west4-a"]),
    ("v5p-8", ["us-east5-a", "europe-west4-b"]),
]
ALL_ZONES = sorted({z for _, zones in OFFERINGS for z in zones})
ALL_REGIONS = sorted({z.rsplit("-", 1)[0] for z in ALL_ZONES})


def make_fleet() -> FleetFile:
    return FleetFile(
        name="bench",
        project="bench-project",
        tpus=[
            {"id": f"e{i}", "type": t, "zones": zones, "count": 50 * (i + 1)}
            for i, (t, zones) in enumerate(OFFERINGS)
        ],
    )


def make_tpus(n: int, rng: random.Random) -> list[IdleTpu]:
    tpus = []
    for i in range(n):
        entry = rng.randrange(len(OFFERINGS))
        t, zones = OFFERINGS[entry]
        tpus.append(IdleTpu(f"tpu-{i:05d}", t, rng.choice(zones), entry_id=f"e{entry}"))
    return tpus


# mix -> (share of zone-bound jobs, of region-bound, of pinned, of exact-name; most types per job;
#         how many of the OFFERINGS types jobs ask for)
MIXES = {
    # Typical queue: more jobs than TPUs; every idle TPU usually finds a job.
    "mixed": (0.15, 0.25, 0.10, 0.02, 3, len(OFFERINGS)),
    # Narrow demand: jobs want only 4 of the 9 types, half are bound to a zone that often
    # lacks them, many name a TPU. Most idle TPUs stay unusable, so the matcher never
    # runs out of TPUs and searches all the way down the queue.
    "constrained": (0.50, 0.20, 0.10, 0.10, 2, 4),
    # The typical queue with multislice jobs (issue 37): see MULTISLICE_SHARE.
    "multislice": (0.15, 0.25, 0.10, 0.02, 3, len(OFFERINGS)),
}
# mix -> share of its jobs that are multislice: one type, 2 or 3 slices, or elastic [4, 2].
MULTISLICE_SHARE = {"multislice": 0.10}


def make_jobs(n: int, tpus: list[IdleTpu], rng: random.Random, mix: str = "mixed") -> list[PendingJob]:
    zone_share, region_share, pinned_share, name_share, most_types, type_pool = MIXES[mix]
    types = [t for t, _ in OFFERINGS[:type_pool]]
    jobs = []
    for i in range(n):
        chosen = rng.sample(types, rng.randint(1, most_types))
        zone = regions = pinned = name = not_before = None
        roll = rng.random()
        if roll < zone_share:
            zone = rng.choice(ALL_ZONES)
        elif roll < zone_share + region_share:
            regions = frozenset(rng.sample(ALL_REGIONS, rng.randint(1, 2)))
        elif roll < zone_share + region_share + pinned_share:
            pinned = rng.choice(ALL_REGIONS)
        elif roll < zone_share + region_share + pinned_share + name_share:
            target = rng.choice(tpus)
            name, chosen = target.name, [target.type]
        slices = (1,)
        share = MULTISLICE_SHARE.get(mix, 0)  # (no draw for the other mixes: their jobs stay as they were)
        if share and name is None and rng.random() < share:
            chosen, slices = chosen[:1], rng.choice([(2,), (3,), (4, 2)])
        if rng.random() < 0.10:
            not_before = NOW + timedelta(seconds=rng.randint(-300, 300))
        jobs.append(
            PendingJob(
                job_id=f"job-{i:06d}",
                priority=rng.choices(list(Priority), weights=[2, 6, 2])[0],
                types=tuple(chosen),
                submit_time=NOW - timedelta(seconds=rng.randint(0, 86400)),
                zone=zone,
                tpu_name=name,
                regions=regions or frozenset(),
                pinned_region=pinned,
                not_before=not_before,
                slices=slices,
            )
        )
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the best time is reported")
    parser.add_argument("--seed", type=int, default=20250601)
    parser.add_argument("--mix", choices=sorted(MIXES), action="append", help="default: every mix")
    args = parser.parse_args(argv)
    fleet = make_fleet()
    for mix, (n_jobs, n_tpus) in itertools.product(args.mix or list(MIXES), SIZES):
        rng = random.Random(args.seed + n_jobs)
        tpus = make_tpus(n_tpus, rng)
        jobs = make_jobs(n_jobs, tpus, rng, mix)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = plan(jobs, tpus, fleet, NOW)
            times.append(time.perf_counter() - start)
        line = {
            "bench": "plan",
            "mix": mix,
            "jobs": n_jobs,
            "tpus": n_tpus,
            "seconds": round(min(times), 4),
            "matched": len(result.matches),
            "unmatched": len(result.unmatched_job_ids),
            "deferred": len(result.deferred_job_ids),
        }
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
