"""The paramiko fan-out: against real sshd worker hosts, plus the connect bounds and retries in isolation."""

from __future__ import annotations

import threading

import paramiko
import pytest

from tpuq.executor.pins import HostKeysUnavailable, InMemoryPinStore, host_keys_from_guest_attributes
from tpuq.executor.ssh import (ConnectPolicy, HostKeyMismatch, NoSshAddress, WorkerPool, run_on_workers,
                               ssh_address)
from tpuq.contracts.fleet import SshTransport
from tpuq.contracts.messages import WorkerEndpoint

NODE = "projects/p/locations/us-central2-b/nodes/n1"


def test_runs_on_every_worker_with_separate_files(start_hosts, ssh_identity, host_keys):
    hosts, endpoints = start_hosts(3)

    def write_and_read(conn):
        conn.put_file("tpuq-test/who", f"worker {conn.worker_id}".encode())
        return conn.exec(["cat", "tpuq-test/who"]).stdout

    results = run_on_workers(endpoints, ssh_identity.user, ssh_identity.pkey, write_and_read,
                             node=NODE, pin_store=InMemoryPinStore(), host_keys=host_keys)
    assert {w: r.value for w, r in results.items()} == {0: "worker 0", 1: "worker 1", 2: "worker 2"}
    home = f"/home/{ssh_identity.user}"
    assert hosts[1].path_on_host(f"{home}/tpuq-test/who").read_text() == "worker 1"


def test_argv_is_not_interpreted_and_stdin_is_delivered(start_hosts, ssh_identity, host_keys):
    _, endpoints = start_hosts(1)
    with WorkerPool(endpoints, user=ssh_identity.user, pkey=ssh_identity.pkey, node=NODE,
                    pin_store=InMemoryPinStore(), host_keys=host_keys) as pool:
        assert pool.connect() == {}
        conn = pool.connections[0]
        assert conn.exec(["echo", "$(id) `id`; 'q'"]).stdout == "$(id) `id`; 'q'\n"
        result = conn.exec(["sh", "-c", "cat; echo err >&2; exit 4"], stdin=b"from stdin")
        assert (result.exit_code, result.stdout, result.stderr) == (4, "from stdin", "err\n")
        assert conn.home() == f"/home/{ssh_identity.user}"


def test_host_keys_come_from_the_published_ones_and_are_enforced(start_hosts, ssh_identity, host_keys):
    hosts, endpoints = start_hosts(2)
    pins = InMemoryPinStore()
    results = run_on_workers(endpoints, ssh_identity.user, ssh_identity.pkey, lambda c: c.host_key,
                             node=NODE, pin_store=pins, host_keys=host_keys)
    # The ed25519 keys the guest attributes publish are pinned, and each host presented exactly its own.
    assert dict(pins.get_pins(NODE)) == host_keys.by_worker == {w: r.value for w, r in results.items()}
    assert host_keys.calls == 1

    # Pinned already: connects again without asking the API.
    again = run_on_workers(endpoints, ssh_identity.user, ssh_identity.pkey, lambda c: c.worker_id,
                           node=NODE, pin_store=pins, host_keys=host_keys)
    assert all(r.ok for r in again.values()) and host_keys.calls == 1

    # Worker 1's published key is another host's: its host is refused, and that is never retried.
    host_keys.by_worker[1] = host_keys.by_worker[0]
    with WorkerPool(endpoints, user=ssh_identity.user, pkey=ssh_identity.pkey, node=NODE, pin_store=InMemoryPinStore(),
                    host_keys=host_keys, sleep=lambda s: None) as pool:
        errors = pool.connect()
        assert list(errors) == [1] and isinstance(errors[1], HostKeyMismatch)
        assert pool.connect_attempts[1] == 1


def test_a_worker_without_a_published_key_is_never_contacted(start_hosts, ssh_identity, host_keys, ticks):
    hosts, endpoints = start_hosts(1)
    host_keys.by_worker = {}
    with WorkerPool(endpoints, user=ssh_identity.user, pkey=ssh_identity.pkey, node=NODE, pin_store=InMemoryPinStore(),
                    host_keys=host_keys, policy=ConnectPolicy(host_key_wait_seconds=30, host_key_poll_seconds=10),
                    sleep=ticks.sleep, monotonic=ticks.monotonic) as pool:
        errors = pool.connect()
    assert isinstance(errors[0], HostKeysUnavailable) and "after 30 s" in str(errors[0])
    assert host_keys.calls == 4 and ticks.slept == [10, 10, 10]
    assert hosts[0].connections_seen() == []


def test_the_address_follows_the_transport():
    both = WorkerEndpoint(worker_id=3, ip="10.0.0.5", external_ip="34.1.2.3", port=8470)
    assert ssh_address(both, SshTransport.vpc) == "10.0.0.5"
    assert ssh_address(both, SshTransport.iap) == "10.0.0.5"  # iap means private IPs, reached over the VPC
    assert ssh_address(both, SshTransport.direct) == "34.1.2.3"
    with pytest.raises(NoSshAddress, match=r"worker 3 has no external IP .*accessConfig.externalIp"):
        ssh_address(WorkerEndpoint(worker_id=3, ip="10.0.0.5"), SshTransport.direct)


def test_guest_attributes_give_each_workers_ed25519_key_by_position():
    from google.cloud import tpu_v2

    def worker(*items):
        return tpu_v2.GuestAttributes(query_path="hostkeys/", query_value=tpu_v2.GuestAttributesValue(
            items=[tpu_v2.GuestAttributesEntry(namespace=ns, key=k, value=v) for ns, k, v in items]))

    ed = ED25519_BLOB
    ecdsa = "AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBA=="
    published = host_keys_from_guest_attributes([
        worker(("hostkeys", "ecdsa-sha2-nistp256", ecdsa), ("hostkeys", "ssh-ed25519", ed + "\n")),
        worker(),  # not published yet
        worker(("hostkeys", "ssh-ed25519", ecdsa)),  # not an ed25519 key: refused
        worker(("other", "ssh-ed25519", ed)),
        worker(("hostkeys", "ssh-ed25519", f"ssh-ed25519 {ed} root@host")),
    ])
    assert published == {0: f"ssh-ed25519 {ed}", 4: f"ssh-ed25519 {ed}"}


class _CountingPool(WorkerPool):
    """Connects that only count how many handshakes run at once; the first tries of some fail."""

    def __init__(self, *args, failures_before_success: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_flight = 0
        self.max_in_flight = 0
        self._mutex = threading.Lock()
        self._all_started = threading.Barrier(kwargs["policy"].batch_size, timeout=5)
        self._failures = failures_before_success

    def _connect_once(self, endpoint, address, pinned):
        with self._mutex:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.connect_attempts[endpoint.worker_id] <= self._failures:
                raise paramiko.SSHException("Error reading SSH protocol banner")
            try:
                self._all_started.wait()  # the first batch meets here: proves batch_size run at once
            except threading.BrokenBarrierError:
                pass
            return _FakeConnection(endpoint)
        finally:
            with self._mutex:
                self.in_flight -= 1


class _FakeConnection:
    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.worker_id = endpoint.worker_id
        self.host_key = f"ssh-ed25519 KEY{endpoint.worker_id}"

    def close(self):
        pass


def _endpoints(n):
    return [WorkerEndpoint(worker_id=i, ip=f"127.0.99.{i + 1}") for i in range(n)]


ED25519_BLOB = "AAAAC3NzaC1lZDI1NTE5AAAAIHUbTHxzDD1Ow3Qh6gLKSKbR9ojIP1E9gf6qrYY+X7ni"


class _AnyKeys:
    """Some valid ed25519 key for every worker: for connects that never reach a real host."""

    def published(self, node):
        return {i: f"ssh-ed25519 {ED25519_BLOB}" for i in range(64)}


def test_at_most_batch_size_handshakes_run_at_once():
    pool = _CountingPool(_endpoints(64), user="u", pkey=None, node=NODE, pin_store=InMemoryPinStore(),
                         host_keys=_AnyKeys(), policy=ConnectPolicy(batch_size=8))
    with pool:
        assert pool.connect() == {}
        assert len(pool.connections) == 64
        assert pool.max_in_flight == 8


def test_failed_connects_are_retried_with_backoff():
    sleeps = []
    pool = _CountingPool(_endpoints(3), user="u", pkey=None, node=NODE, pin_store=InMemoryPinStore(),
                         host_keys=_AnyKeys(), policy=ConnectPolicy(batch_size=3, attempts=5), failures_before_success=2,
                         sleep=sleeps.append)
    with pool:
        assert pool.connect() == {}
        assert pool.connect_attempts == {0: 3, 1: 3, 2: 3}
        assert len(sleeps) == 6 and all(s > 0 for s in sleeps)


def test_unreachable_worker_is_reported_after_the_last_attempt(dead_address):
    endpoint = WorkerEndpoint(worker_id=0, ip=dead_address, port=8470)
    sleeps = []
    with WorkerPool([endpoint], user="u", pkey=None, node=NODE, pin_store=InMemoryPinStore(), host_keys=_AnyKeys(),
                    policy=ConnectPolicy(attempts=3, connect_timeout=2), sleep=sleeps.append) as pool:
        errors = pool.connect()
    assert isinstance(errors[0], OSError)
    assert pool.connect_attempts[0] == 3 and len(sleeps) == 2
