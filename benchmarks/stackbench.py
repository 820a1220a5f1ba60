"""What the stack benchmarks share: a whole local stack from a scenario and a fleet, and CPU accounting."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import yaml

from tpuq_dev.devstack.stack import DevStack

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SERVICES = ("scheduler", "claimer", "executor", "janitor")


@contextmanager
def whole_stack(scenario: dict, fleet: dict, time_scale: float, tick_period: float = 1.0, prefix: str = "bench",
                service_env: dict | None = None):
    """The four services, the emulators, fake GCS and the fake TPU with sshd workers; yields (stack, env)."""
    work = Path(tempfile.mkdtemp(prefix=f"tpuq-{prefix}-"))
    (work / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    (work / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    stack = DevStack(state_dir=work / "dev", services=SERVICES, scenario=work / "scenario.yaml",
                     fleet_file=work / "fleet.yaml", time_scale=time_scale, tick_period=tick_period,
                     service_env=service_env or {})
    # A benchmark stopped with SIGTERM (`kill`, `timeout`) stops its stack too: the signal becomes SystemExit, so the
    # `finally` below runs (by default Python dies at once, leaving a dozen processes and sshd hosts running).
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        env = stack.up()
        os.environ.update(env)
        yield stack, env
    finally:
        stack.down()
        signal.signal(signal.SIGTERM, previous)


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _ticks(fields: list[str]) -> int:
    """utime + stime + cutime + cstime: the process and its children already reaped."""
    return sum(int(fields[i]) for i in (11, 12, 13, 14))


def _tree_ticks(root: int) -> int:
    """CPU ticks of `root` and every live process below it. A child that ended is in its parent's cutime."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))):
            stats[int(entry.name)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += _ticks(stats[pid])
        todo += children.get(pid, [])
    return total


def _machine_busy_ticks() -> int:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values) - values[3] - values[4]  # all but idle and iowait


def cpu_snapshot(stack: DevStack) -> dict[str, int]:
    """CPU ticks per stack process (with its children), the fake TPU's worker hosts (sshd, supervisors,
    jobs) apart from the fake TPU itself, and the whole machine."""
    out: dict[str, int] = {}
    for rec in stack.records:
        fields = _stat(rec.pid)
        whole = _tree_ticks(rec.pid)
        if rec.name == "fake-tpu":
            own = _ticks(fields) if fields else 0
            out["fake-tpu"], out["workers (sshd, supervisors, jobs)"] = own, whole - own
        else:
            out[rec.name] = whole
    out["_machine"] = _machine_busy_ticks()
    return out


def cpu_seconds_per(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    """CPU-seconds per unit (a job) of each process between two snapshots; what else ran is `not the stack`."""
    ticks = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    machine = ticks.pop("_machine")
    ticks["not the stack (other processes)"] = max(machine - sum(ticks.values()), 0)
    return {k: round(v / CLOCK_TICKS / n, 4) for k, v in sorted(ticks.items())}
