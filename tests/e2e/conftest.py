"""The whole system on the local stack: emulators, fake GCS, the fake Cloud TPU with real sshd workers,
the four services as real processes receiving Pub/Sub push, and the tick source."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tpuq.runtime.clients import Clients

from tpuq.runtime.settings import Settings
from tpuq_dev.devstack.stack import DEMO_DIR, DevStack


@pytest.fixture(scope="session")
def system(tmp_path_factory):
    s = DevStack(
        state_dir=Path(tmp_path_factory.mktemp("tpuq-e2e")),
        services=("scheduler", "claimer", "executor", "janitor"),
        scenario=DEMO_DIR / "scenario.yaml",
        fleet_file=DEMO_DIR / "fleet.yaml",
        time_scale=60.0,
        tick_period=1.0,
        extra_buckets=("tpuq-demo-us-central2",),
        # Ask the workers often, and wait for a slice's other workers 10 s after one failed, not 30: tests wait for it.
        service_env={"TPUQ_EXECUTOR_PROBE_SECONDS": "2", "TPUQ_EXECUTOR_FAILURE_GRACE_SECONDS": "10"},
    )
    with s.running():
        yield s


@pytest.fixture
def system_clients(system) -> Clients:
    return Clients(Settings.from_env(system.env))


@contextmanager
def demo_stack_with(work: Path, entry_type: str, **entry):
    """A whole-system stack of a module's own, on the demo fleet with its `entry_type` entry changed (`count`,
    `idle_timeout_seconds`, ...): for a test whose point needs another fleet than the session's. Yields the stack
    and its clients."""
    fleet = yaml.safe_load((DEMO_DIR / "fleet.yaml").read_text())
    next(t for t in fleet["tpus"] if t["type"] == entry_type).update(entry)
    (work / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    stack = DevStack(state_dir=work / "stack", services=("scheduler", "claimer", "executor", "janitor"),
                     scenario=DEMO_DIR / "scenario.yaml", fleet_file=work / "fleet.yaml", time_scale=60.0,
                     tick_period=1.0, extra_buckets=("tpuq-demo-us-central2",),
                     service_env={"TPUQ_EXECUTOR_PROBE_SECONDS": "2"})
    with stack.running():
        yield stack, Clients(Settings.from_env(stack.env))

