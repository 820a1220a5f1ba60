"""The worker spec: the one JSON object `prepare` reads on stdin (built by tpuq.executor.workerspec)."""

from __future__ import annotations

import json

from .errors import SetupError
from .files import WorkerPaths

SPEC_VERSION = 1


def load_spec(text: str) -> dict:
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise SetupError(f"worker spec is not JSON: {e}") from None
    if not isinstance(spec, dict) or spec.get("version") != SPEC_VERSION:
        raise SetupError(f"worker spec version {spec.get('version') if isinstance(spec, dict) else None!r} "
                         f"is not {SPEC_VERSION}")
    for field in ("job_id", "attempt", "attempt_id", "worker_id", "worker_count", "command", "env", "gcs", "job_dir"):
        if field not in spec:
            raise SetupError(f"worker spec has no {field!r}")
    env = spec["env"]
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise SetupError("worker spec env must map strings to strings")
    return spec


def paths_for(home: str, spec: dict | None) -> WorkerPaths:
    lockfile = (spec or {}).get("libtpu_lockfile") or "/tmp/libtpu_lockfile"
    return WorkerPaths(home, lockfile)
