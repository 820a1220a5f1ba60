"""Benchmark of the scheduler's whole pass decision: `python benchmarks/bench_pass.py`.

Prints one JSON line per size: pending jobs, idle TPUs, the best wall time of a few runs of
`queue_of` (parsing every stored job once) and of `decide_pass` (matching, building every
assignment's writes, sizing the capacity asks), and what it decided. Stored documents are
built outside the timed part; no emulator is involved (the decision is pure).
`parse_again_seconds`: the same read in the next pass, the stored versions unchanged, as the scheduler
reads it (`tpuq.runtime.versioned`: each snapshot's update_time names its version, parsed once).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

from tpuq.contracts.fleet import FleetFile
from tpuq.scheduler.decide import PassSnapshot, decide_pass, entries_to_count, queue_from, queue_of, queued
from tpuq.runtime.versioned import Versioned

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
ZONES = ["us-central2-b", "us-central2-a", "us-east1-d"]
SIZES = [(1000, 100), (10000, 1000)]
RUNS = 3


def stored_jobs(n: int) -> list[tuple[str, dict]]:
    return [(f"j{i}", {"id": f"j{i}", "state": "pending", "attempt": 0, "submit_time": NOW - timedelta(seconds=i),
                       "spec": {"id": f"j{i}", "tpu": ["v4-8"], "command": "train"}}) for i in range(n)]


def stored_idle_tpus(n: int) -> list[dict]:
    return [{"name": f"projects/p/locations/{ZONES[i % 3]}/nodes/n{i}", "type": "v4-8", "zone": ZONES[i % 3],
             "entry_id": f"v4-{i % 3}", "state": "idle", "endpoints": []} for i in range(n)]


class StoredSnapshot:
    """What a Firestore read hands the pass: an id, an update_time, a copy of the document per `to_dict`."""

    def __init__(self, doc_id: str, doc: dict, update_time: datetime) -> None:
        self.id, self._doc, self.update_time = doc_id, doc, update_time

    def to_dict(self) -> dict:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self._doc.items()}


def parse_twice(jobs: list[tuple[str, dict]]) -> tuple[float, float]:
    """Seconds of a pass's read through the kept versions: the first pass (each parsed), the next (none)."""
    snaps = [StoredSnapshot(i, doc, NOW) for i, doc in jobs]
    kept = Versioned(queued)
    times = []
    for _ in range(2):
        started = time.perf_counter()
        read = [(s, *kept.get(s)) for s in snaps]
        queue_from([(s.id, p) for s, _, p in read])
        times.append(time.perf_counter() - started)
    return times[0], times[1]


def main() -> None:
    fleet = FleetFile.model_validate({"name": "bench", "project": "p", "tpus": [
        {"id": f"v4-{i}", "type": "v4-8", "zones": [z], "count": 1000} for i, z in enumerate(ZONES)]})
    for n_jobs, n_tpus in SIZES:
        jobs, tpus = stored_jobs(n_jobs), stored_idle_tpus(n_tpus)
        parse, decide = float("inf"), float("inf")
        for _ in range(RUNS):
            started = time.perf_counter()
            queue = queue_of(jobs)
            entries = entries_to_count(queue, fleet)
            parsed = time.perf_counter()
            snapshot = PassSnapshot(queue, tpus, {e: 1000 - n_tpus // 3 - 100 for e in entries}, {})
            decision = decide_pass(snapshot, fleet, "bench-runner", NOW)
            parse, decide = min(parse, parsed - started), min(decide, time.perf_counter() - parsed)
        twice = [parse_twice(jobs) for _ in range(RUNS)]
        first, again = min(t[0] for t in twice), min(t[1] for t in twice)
        print(json.dumps({"bench": "pass", "jobs": n_jobs, "idle_tpus": n_tpus, "parse_seconds": round(parse, 3),
                          "parse_first_kept_seconds": round(first, 3), "parse_again_seconds": round(again, 3),
                          "decide_seconds": round(decide, 3), "assigned": len(decision.assignments),
                          "asks": len(decision.asks), "blocked": len(decision.blocked)}))


if __name__ == "__main__":
    main()
