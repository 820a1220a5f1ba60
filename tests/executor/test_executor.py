"""Executor end to end: real sshd worker hosts, a fake GCS, the real supervisor on the hosts."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tpuq.contracts import gcslayout
from tpuq.executor.executor import Executor
from tpuq.executor.objects import GcsObjectStore
from tpuq.executor.outcome import Decided, NodeState, Wait
from tpuq.executor.pins import InMemoryPinStore
from tpuq.executor.ssh import ConnectPolicy, SshLogin
from tpuq.executor.workerspec import WorkerSettings
from tpuq.contracts.fleet import SshTransport
from tpuq.contracts.messages import AttemptOutcome, WorkerEndpoint

from .conftest import wait_until
from .factories import T0, make_assignment, upload_bundle


class FakeClock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def executor(fake_gcs, ssh_identity, clock, tmp_path, host_keys, ticks):
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": fake_gcs.base_url})
    return Executor(
        ssh_login=lambda: SshLogin(ssh_identity.user),
        ssh_key=lambda: ssh_identity.pkey,
        pin_store=InMemoryPinStore(),
        host_keys=host_keys,
        objects=GcsObjectStore(client),
        clock=clock,
        settings=WorkerSettings.for_emulator(
            fake_gcs.base_url, log_flush_seconds=0.2, cancel_grace_seconds=1.0, stale_grace_seconds=1.0,
            libtpu_lockfile="/tmp/libtpu_lockfile",
        ),
        connect_policy=ConnectPolicy(attempts=2, connect_timeout=5, host_key_wait_seconds=60,
                                     host_key_poll_seconds=5, host_key_max_poll_seconds=20),
        sleep=ticks.sleep,
        monotonic=ticks.monotonic,
        failure_grace=timedelta(seconds=30),
    )


def _decided(executor, assignment, **kw) -> Decided:
    return wait_until(lambda: _if_decided(executor.read_outcome(assignment, **kw)), 30, "an outcome")


def _if_decided(decision):
    return decision if isinstance(decision, Decided) else None


HOME = "/home/tpuqexec"


def test_attempt_runs_on_every_worker_and_succeeds(executor, start_hosts, fake_gcs, bucket):
    hosts, endpoints = start_hosts(2)
    bundle = upload_bundle(fake_gcs, bucket, {"main.sh": b'echo "worker $TPU_WORKER_ID of $TPU_WORKER_COUNT" | tee out.txt\n'})
    a = make_assignment(endpoints=endpoints, command="sh main.sh", bundle=bundle, bucket=bucket)

    result = executor.start_attempt(a)
    assert (result.started, result.outcome) == (True, None), result.outcome
    decision = _decided(executor, a, node_state=NodeState.ready)
    assert decision.outcome == AttemptOutcome.succeeded
    assert decision.exit_codes == {"0": 0, "1": 0}
    for i, host in enumerate(hosts):
        assert host.path_on_host(f"{HOME}/tpuq/job/out.txt").read_text() == f"worker {i} of 2\n"
        assert host.path_on_host(f"{HOME}/tpuq/supervisor.py").exists()
        log = fake_gcs.log_text(bucket, gcslayout.worker_log_prefix(a.job_id, a.attempt, i))
        assert log == f"worker {i} of 2\n"
    # Host keys were pinned on first contact.
    assert sorted(executor.pin_store.get_pins(a.node)) == [0, 1]


def test_job_outlives_the_executors_connections(executor, start_hosts, bucket):
    hosts, endpoints = start_hosts(2)
    a = make_assignment(endpoints=endpoints, bucket=bucket,
                        command="while [ ! -e /tmp/go ]; do sleep 0.05; done; echo done")
    assert executor.start_attempt(a).started  # returns with every SSH connection closed
    assert isinstance(executor.read_outcome(a), Wait)
    probes = executor.probe_attempt(a)
    assert all(p.supervisor_alive and p.job_alive and not p.lost for p in probes.values())
    for host in hosts:
        host.path_on_host("/tmp/go").touch()
    assert _decided(executor, a).outcome == AttemptOutcome.succeeded
    assert all(p.has_status and not p.lost for p in executor.probe_attempt(a).values())


def test_redelivered_assignment_is_a_no_op(executor, start_hosts, bucket):
    hosts, endpoints = start_hosts(1)
    a = make_assignment(endpoints=endpoints, bucket=bucket,
                        command="echo run >> runs.txt; while [ ! -e /tmp/go ]; do sleep 0.05; done")
    assert executor.start_attempt(a).already is False
    assert executor.start_attempt(a).already is True
    hosts[0].path_on_host("/tmp/go").touch()
    assert _decided(executor, a).outcome == AttemptOutcome.succeeded
    assert hosts[0].path_on_host(f"{HOME}/tpuq/job/runs.txt").read_text() == "run\n"


def test_one_worker_failing_waits_for_the_grace_then_fails(executor, start_hosts, fake_gcs, bucket, clock):
    _, endpoints = start_hosts(2)
    a = make_assignment(endpoints=endpoints, bucket=bucket,
                        command='if [ "$TPU_WORKER_ID" = 1 ]; then echo "out of memory?" >&2; exit 7; fi; sleep 300')
    assert executor.start_attempt(a).started
    status_name = gcslayout.worker_status_name(a.job_id, a.attempt, 1)
    wait_until(lambda: fake_gcs.read(bucket, status_name), 20, "worker 1's status")

    decision = executor.read_outcome(a, NodeState.ready)
    assert isinstance(decision, Wait) and decision.until is not None
    clock.now = decision.until
    decision = executor.read_outcome(a, NodeState.ready)
    assert decision.outcome == AttemptOutcome.failed
    assert decision.exit_codes == {"1": 7}
    assert "worker 1 exited 7" in decision.detail and "out of memory?" in decision.detail
    assert "no status yet from worker 0" in decision.detail
    executor.cancel_attempt(a, grace_seconds=0)


def test_preempted_node_decides_preempted(executor, start_hosts, bucket):
    _, endpoints = start_hosts(1)
    a = make_assignment(endpoints=endpoints, bucket=bucket, command="sleep 300")
    assert executor.start_attempt(a).started
    assert executor.read_outcome(a, NodeState.preempted).outcome == AttemptOutcome.preempted


def test_setup_failure_launches_nothing(executor, start_hosts, bucket):
    hosts, endpoints = start_hosts(2)
    a = make_assignment(endpoints=endpoints, bucket=bucket, bundle=f"gs://{bucket}/missing.tar.gz",
                        command="touch ran")
    result = executor.start_attempt(a)
    assert result.started is False and result.outcome.outcome == AttemptOutcome.failed_setup
    assert "does not exist" in result.outcome.detail
    assert executor.read_outcome(a).outcome == AttemptOutcome.failed_setup
    assert not any(h.path_on_host(f"{HOME}/tpuq/job/ran").exists() for h in hosts)


def test_cancel_stops_every_worker(executor, start_hosts, fake_gcs, bucket):
    _, endpoints = start_hosts(2)
    a = make_assignment(endpoints=endpoints, bucket=bucket, command="trap '' TERM; sleep 300")
    assert executor.start_attempt(a).started
    decision = executor.cancel_attempt(a, reason="user asked", grace_seconds=0.5)
    assert (decision.outcome, decision.detail) == (AttemptOutcome.cancelled, "user asked")
    for w in (0, 1):
        status = wait_until(lambda: fake_gcs.read_json(bucket, gcslayout.worker_status_name(a.job_id, a.attempt, w)),
                            20, f"worker {w}'s status")
        assert status["cancelled"] and status["signal"] == "SIGKILL"
    assert executor.read_outcome(a).outcome == AttemptOutcome.cancelled
    assert json.loads(fake_gcs.read(bucket, gcslayout.cancelled_marker_name(a.job_id, a.attempt)))["reason"] == "user asked"


def test_unreachable_worker_is_an_infra_failure(executor, start_hosts, bucket, host_keys, dead_address):
    _, endpoints = start_hosts(1)
    dead = WorkerEndpoint(worker_id=1, ip=dead_address, port=8470)
    host_keys.by_worker[1] = host_keys.by_worker[0]  # published, but nothing answers there
    a = make_assignment(endpoints=[*endpoints, dead], bucket=bucket)
    result = executor.start_attempt(a)
    assert result.outcome.outcome == AttemptOutcome.infra_failed
    assert result.outcome.detail.startswith("could not reach worker 1:")


def test_host_keys_not_yet_published_are_waited_for(executor, start_hosts, bucket, host_keys, ticks):
    _, endpoints = start_hosts(2)
    host_keys.unpublished_calls = 3
    a = make_assignment(endpoints=endpoints, bucket=bucket, command="true")
    assert executor.start_attempt(a).started
    assert host_keys.calls == 4 and ticks.slept == [5, 10, 20]  # backing off
    assert dict(executor.pin_store.get_pins(a.node)) == host_keys.by_worker


def test_host_keys_never_published_end_the_start_without_contacting_a_worker(executor, start_hosts, bucket,
                                                                             host_keys, ticks):
    hosts, endpoints = start_hosts(2)
    host_keys.by_worker = {0: host_keys.by_worker[0]}  # worker 1's guest agent never publishes
    a = make_assignment(endpoints=endpoints, bucket=bucket, command="true")
    result = executor.start_attempt(a)
    assert result.outcome.outcome == AttemptOutcome.infra_failed
    assert "worker 1: HostKeysUnavailable: no ssh-ed25519 host key of worker 1" in result.outcome.detail
    assert ticks.now == 60 and ticks.slept == [5, 10, 20, 20, 5]  # waited the whole deadline, no longer
    # Never trusted on first use: worker 1 saw no connection at all, and got no pin.
    assert hosts[1].connections_seen() == []
    assert 1 not in executor.pin_store.get_pins(a.node)


def test_a_direct_fleet_reaches_its_workers_at_their_external_ips(executor, start_hosts, bucket):
    # From the internet only the external addresses answer; the internal ones serve nothing.
    hosts, endpoints = start_hosts(2, external_ips=True, listen_on="external")
    a = make_assignment(endpoints=endpoints, bucket=bucket, command="true")
    direct = SshLogin(executor.ssh_login().user, SshTransport.direct)
    executor.ssh_login = lambda: direct
    assert executor.start_attempt(a).started
    assert all(h.address == h.external_address != h.internal_address for h in hosts)
    assert all({to for _, to in h.connections_seen()} == {h.external_address} for h in hosts)


def test_a_vpc_fleet_uses_the_internal_ip_even_when_there_is_an_external_one(executor, start_hosts, bucket):
    hosts, endpoints = start_hosts(1, external_ips=True, listen_on="external")
    a = make_assignment(endpoints=endpoints, bucket=bucket, command="true")
    result = executor.start_attempt(a)  # vpc: the internal address, where nothing answers here
    assert result.outcome.outcome == AttemptOutcome.infra_failed
    assert f"Unable to connect to port 22 on {hosts[0].internal_address}" in result.outcome.detail
    assert hosts[0].connections_seen() == []


def test_a_direct_fleet_node_without_external_ips_is_an_infra_failure(executor, start_hosts, bucket):
    hosts, endpoints = start_hosts(1)
    a = make_assignment(endpoints=endpoints, bucket=bucket, command="true")
    direct = SshLogin(executor.ssh_login().user, SshTransport.direct)
    executor.ssh_login = lambda: direct
    result = executor.start_attempt(a)
    assert result.outcome.outcome == AttemptOutcome.infra_failed
    assert "worker 0: NoSshAddress: worker 0 has no external IP" in result.outcome.detail
    assert hosts[0].connections_seen() == []
