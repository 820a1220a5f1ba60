"""Where a running local stack publishes its environment for clients (shell: reads one file).

`tpuq dev up` (tpuq_dev.devstack.stack) writes `<state dir>/env`; the CLI reads it to find the emulators. It lives
outside tpuq_dev.devstack so that finding a backend never imports dev tooling.
"""

from __future__ import annotations

import os
from pathlib import Path

from tpuq.errors import TpuqError

ENV_FILE_NAME = "env"


class StackError(TpuqError, RuntimeError):
    """The stack could not be started or reached; the message says what to do."""


def default_state_dir() -> Path:
    return Path(os.environ.get("TPUQ_DEV_DIR") or Path.home() / ".tpuq" / "dev")


def load_env(state_dir: Path | None = None) -> dict[str, str]:
    """The environment of a running stack, or StackError saying how to start one."""
    path = (state_dir or default_state_dir()) / ENV_FILE_NAME
    if not path.exists():
        raise StackError("the local stack is not running: start it with `tpuq dev up`")
    env = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        if key:
            env[key] = value
    return env


def local_job_bucket(owner_prefix: str, fleet: str, region: str) -> str:
    """The job bucket `tpuq dev up` creates for each region of its fleet (the demo's fleet: tpuq-demo-us-central2);
    `tpuq init --local` writes a job.yaml that uses it."""
    return f"{owner_prefix}-{fleet}-{region}"


# What `tpuq dev up` runs by default (its demo fleet): `tpuq init --local` writes a job for it.
LOCAL_DEFAULT_TYPE = "v4-8"
LOCAL_DEFAULT_BUCKET = local_job_bucket("tpuq", "demo", "us-central2")
