"""Run every benchmarks/bench_*.py in turn; each prints one JSON line per run."""

import subprocess
import sys
from pathlib import Path

failed = 0
for script in sorted(Path(__file__).parent.glob("bench_*.py")):
    print(f"# {script.name}", file=sys.stderr, flush=True)
    failed += subprocess.run([sys.executable, str(script)]).returncode != 0
sys.exit(1 if failed else 0)
