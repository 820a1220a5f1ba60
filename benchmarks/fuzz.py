"""The fuzzer at full size: `python benchmarks/fuzz.py [--scale 14]`.

Runs tests/fuzz/test_fuzz_entry_points.py (every push path of every service, every topic model, envelopes that
are no push, job files to `tpuq validate` and to the bucket's submit/ path) with its budgets multiplied by
`--scale` (the suite runs scale 1), and prints one JSON line: payloads per entry point and in all, crashes,
outcomes by kind, whether every assertion held, the wall time and the load average when it started.
Derandomized: every run sends the same payloads. No emulator: the in-memory stand-ins.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "fuzz" / "test_fuzz_entry_points.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=14.0, help="multiplies the suite's per-test budgets")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="tpuq-fuzz-") as tmp:
        report = Path(tmp) / "report.json"
        env = {**os.environ, "TPUQ_FUZZ_SCALE": str(args.scale), "TPUQ_FUZZ_REPORT": str(report)}
        start = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SUITE)],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - start
        tally = json.loads(report.read_text()) if report.exists() else {}
    if run.returncode != 0:
        sys.stderr.write(run.stdout[-4000:] + run.stderr[-2000:])
    print(json.dumps({"benchmark": "fuzz", "scale": args.scale, "payloads": tally.get("payloads"),
                      "crashes": tally.get("crashes"), "outcomes": tally.get("outcomes"),
                      "per_entry_point": tally.get("per_entry_point"), "all_assertions_held": run.returncode == 0,
                      "seconds": round(seconds, 1), "load_average": round(load, 1)}))
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
