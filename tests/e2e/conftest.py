"""The whole system on the local stack: emulators, fake GCS, the fake Cloud TPU with real sshd workers,
the four services as real processes receiving Pub/Sub push, and the tick source."""

from __future__ import annotations

from pathlib import Path

import pytest

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
        service_env={"TPUQ_EXECUTOR_PROBE_SECONDS": "2"},  # ask the workers often: tests wait for it
    )
    with s.running():
        yield s


@pytest.fixture
def system_clients(system) -> Clients:
    return Clients(Settings.from_env(system.env))
