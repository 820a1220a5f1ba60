"""A dirty worker host, end to end through the executor: real sshd hosts with their own /proc and TPU device files
(tpuq_dev.faketpu.hostsetup), a process left holding /dev/vfio/0 on one of them (tpuq_dev.faketpu.holders, what
`tpuq dev dirty` starts), and the production WorkerSettings' preflight (/proc, /dev/accel*, /dev/vfio/*)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tpuq.contracts.messages import AttemptOutcome
from tpuq.executor.executor import Executor
from tpuq.executor.objects import GcsObjectStore
from tpuq.executor.pins import InMemoryPinStore
from tpuq.executor.ssh import ConnectPolicy, SshLogin
from tpuq.executor.workerspec import WorkerSettings

from .factories import T0, make_assignment

holders = pytest.importorskip("tpuq_dev.faketpu.holders")


@pytest.fixture
def executor(fake_gcs, ssh_identity, host_keys, ticks):
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": fake_gcs.base_url})
    return Executor(
        ssh_login=lambda: SshLogin(ssh_identity.user), ssh_key=lambda: ssh_identity.pkey,
        pin_store=InMemoryPinStore(), host_keys=host_keys, objects=GcsObjectStore(client), clock=lambda: T0,
        settings=WorkerSettings.for_emulator(fake_gcs.base_url, log_flush_seconds=0.2, stale_grace_seconds=1.0),
        connect_policy=ConnectPolicy(attempts=2, connect_timeout=5, host_key_wait_seconds=60,
                                     host_key_poll_seconds=5, host_key_max_poll_seconds=20),
        sleep=ticks.sleep, monotonic=ticks.monotonic, failure_grace=timedelta(seconds=30),
    )


@pytest.mark.parametrize("count", [1, 2], ids=["one-worker-start", "two-workers-prepare"])
def test_a_held_device_on_one_worker_ends_the_attempt_infra_failed_naming_worker_and_holder(
        executor, start_hosts, bucket, count):
    hosts, endpoints = start_hosts(count, label="dirty")
    dirty = count - 1
    held = holders.hold_device(hosts[dirty], "/dev/vfio/0")
    a = make_assignment(endpoints=endpoints, bucket=bucket, command="echo never")

    result = executor.start_attempt(a)

    assert not result.started
    assert result.outcome.outcome is AttemptOutcome.infra_failed
    assert result.outcome.detail == f"preflight failed: worker {dirty}: /dev/vfio/0 is held by pid {held['pid']} " \
                                    "(sleep infinity)"
    # The other worker is clean (its /proc shows only its own processes), and the command was launched on none.
    probes = executor.probe_attempt(a)
    assert [(p.current, p.launched) for p in probes.values()] == [(True, False)] * count
