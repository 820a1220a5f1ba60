"""Where a running local stack publishes its environment for clients (shell: reads one file).

`tpuq dev up` (tpuq_dev.devstack.stack) writes `<state dir>/env`; the CLI reads it to find the emulators. It lives
outside tpuq_dev.devstack so that finding a backend never imports dev tooling.
"""

from __future__ import annotations

import os
from pathlib import Path

from tpuq.contracts.errors import TpuqError

ENV_FILE_NAME = "env"
# `tpuq dev up` puts these in the stack's environment (and so in `tpuq dev env`'s exports): which stack, and where
# its state is. A shell that evaluated an earlier stack's `dev env` is told so, instead of "not running".
ENV_STACK_ID = "TPUQ_DEV_STACK_ID"
ENV_STACK_DIR = "TPUQ_DEV_STACK_DIR"
EMULATOR_HOSTS = ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST", "STORAGE_EMULATOR_HOST")
REEVAL = 'eval "$(tpuq dev env)"'


class StackError(TpuqError, RuntimeError):
    """The stack could not be started or reached; the message says what to do."""


def default_state_dir() -> Path:
    """`$TPUQ_DEV_DIR`; else the stack a shell's `eval "$(tpuq dev env)"` points at (`dev down` and `dev status` in
    that shell act on the stack its other commands use, wherever it was started); else ~/.tpuq/dev."""
    return Path(os.environ.get("TPUQ_DEV_DIR") or os.environ.get(ENV_STACK_DIR) or Path.home() / ".tpuq" / "dev")


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


def stale_env_problem(shell: dict[str, str], running: dict[str, str] | None) -> str | None:
    """Why a shell's environment, from an earlier `tpuq dev env`, no longer reaches the stack it names (pure).

    `shell`: the process environment; `running`: the env file of the stack in `shell[ENV_STACK_DIR]` now, None
    when no stack runs there. None: nothing to say (the environment names no dev stack, or still the running one).
    """
    stack_id, stack_dir = shell.get(ENV_STACK_ID), shell.get(ENV_STACK_DIR)
    if not stack_id or not stack_dir or not any(shell.get(k) for k in EMULATOR_HOSTS):
        return None
    if running is None:
        return (f"the local stack this shell's environment names ({ENV_STACK_ID}={stack_id}, in {stack_dir}) was "
                f"stopped: start one with `tpuq dev up`, then run `{REEVAL}`")
    moved = [k for k in EMULATOR_HOSTS if shell.get(k) and running.get(k) and shell[k] != running[k]]
    if running.get(ENV_STACK_ID) != stack_id or moved:
        where = f" ({moved[0]} is {running[moved[0]]} now, not {shell[moved[0]]})" if moved else ""
        return (f"this shell's environment is from an earlier `tpuq dev up` than the stack running in "
                f"{stack_dir}{where}: run `{REEVAL}` again")
    return None


def read_running_env(state_dir: Path) -> dict[str, str] | None:
    """The env file of the stack running in `state_dir`, or None without one."""
    try:
        return load_env(state_dir)
    except StackError:
        return None


def local_job_bucket(owner_prefix: str, fleet: str, region: str) -> str:
    """The job bucket `tpuq dev up` creates for each region of its fleet (the demo's fleet: tpuq-demo-us-central2);
    `tpuq init --local` writes a job.yaml that uses it."""
    return f"{owner_prefix}-{fleet}-{region}"


# What `tpuq dev up` runs by default (its demo fleet): `tpuq init --local` writes a job for it.
LOCAL_DEFAULT_TYPE = "v4-8"
LOCAL_DEFAULT_BUCKET = local_job_bucket("tpuq", "demo", "us-central2")
