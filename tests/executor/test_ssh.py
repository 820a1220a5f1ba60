"""The paramiko fan-out: against real sshd worker hosts, plus the connect bounds and retries in isolation."""

from __future__ import annotations

import socket
import threading

import paramiko

from tpuq.executor.pins import InMemoryPinStore
from tpuq.executor.ssh import ConnectPolicy, HostKeyMismatch, WorkerPool, run_on_workers
from tpuq.messages import WorkerEndpoint

NODE = "projects/p/locations/us-central2-b/nodes/n1"


def test_runs_on_every_worker_with_separate_files(start_hosts, ssh_identity):
    hosts, endpoints = start_hosts(3)

    def write_and_read(conn):
        conn.put_file("tpuq-test/who", f"worker {conn.worker_id}".encode())
        return conn.exec(["cat", "tpuq-test/who"]).stdout

    results = run_on_workers(endpoints, ssh_identity.user, ssh_identity.pkey, write_and_read,
                             node=NODE, pin_store=InMemoryPinStore())
    assert {w: r.value for w, r in results.items()} == {0: "worker 0", 1: "worker 1", 2: "worker 2"}
    home = f"/home/{ssh_identity.user}"
    assert hosts[1].path_on_host(f"{home}/tpuq-test/who").read_text() == "worker 1"


def test_argv_is_not_interpreted_and_stdin_is_delivered(start_hosts, ssh_identity):
    _, endpoints = start_hosts(1)
    with WorkerPool(endpoints, user=ssh_identity.user, pkey=ssh_identity.pkey, node=NODE,
                    pin_store=InMemoryPinStore()) as pool:
        assert pool.connect() == {}
        conn = pool.connections[0]
        assert conn.exec(["echo", "$(id) `id`; 'q'"]).stdout == "$(id) `id`; 'q'\n"
        result = conn.exec(["sh", "-c", "cat; echo err >&2; exit 4"], stdin=b"from stdin")
        assert (result.exit_code, result.stdout, result.stderr) == (4, "from stdin", "err\n")
        assert conn.home() == f"/home/{ssh_identity.user}"


def test_host_keys_are_pinned_on_first_contact_and_enforced(start_hosts, ssh_identity):
    _, endpoints = start_hosts(2)
    pins = InMemoryPinStore()
    results = run_on_workers(endpoints, ssh_identity.user, ssh_identity.pkey, lambda c: c.host_key,
                             node=NODE, pin_store=pins)
    assert dict(pins.get_pins(NODE)) == {w: r.value for w, r in results.items()}

    # Same pins: connects again.
    again = run_on_workers(endpoints, ssh_identity.user, ssh_identity.pkey, lambda c: c.worker_id,
                           node=NODE, pin_store=pins)
    assert all(r.ok for r in again.values())

    # Worker 1's host now presents another key than the pinned one (pins of worker 0 swapped in).
    forged = InMemoryPinStore()
    forged.add_pins(NODE, {0: pins.get_pins(NODE)[0], 1: pins.get_pins(NODE)[0]})
    with WorkerPool(endpoints, user=ssh_identity.user, pkey=ssh_identity.pkey, node=NODE, pin_store=forged,
                    sleep=lambda s: None) as pool:
        errors = pool.connect()
        assert list(errors) == [1] and isinstance(errors[1], HostKeyMismatch)
        assert pool.connect_attempts[1] == 1  # a mismatch is never retried


class _CountingPool(WorkerPool):
    """Connects that only count how many handshakes run at once; the first tries of some fail."""

    def __init__(self, *args, failures_before_success: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_flight = 0
        self.max_in_flight = 0
        self._mutex = threading.Lock()
        self._all_started = threading.Barrier(kwargs["policy"].batch_size, timeout=5)
        self._failures = failures_before_success

    def _connect_once(self, endpoint, pinned):
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


def test_at_most_batch_size_handshakes_run_at_once():
    pool = _CountingPool(_endpoints(64), user="u", pkey=None, node=NODE, pin_store=InMemoryPinStore(),
                         policy=ConnectPolicy(batch_size=8))
    with pool:
        assert pool.connect() == {}
        assert len(pool.connections) == 64
        assert pool.max_in_flight == 8


def test_failed_connects_are_retried_with_backoff():
    sleeps = []
    pool = _CountingPool(_endpoints(3), user="u", pkey=None, node=NODE, pin_store=InMemoryPinStore(),
                         policy=ConnectPolicy(batch_size=3, attempts=5), failures_before_success=2,
                         sleep=sleeps.append)
    with pool:
        assert pool.connect() == {}
        assert pool.connect_attempts == {0: 3, 1: 3, 2: 3}
        assert len(sleeps) == 6 and all(s > 0 for s in sleeps)


def test_unreachable_worker_is_reported_after_the_last_attempt():
    with socket.socket() as closed:  # bound, never listening: connection refused
        closed.bind(("127.0.0.1", 0))
        endpoint = WorkerEndpoint(worker_id=0, ip="127.0.0.1", port=closed.getsockname()[1])
        sleeps = []
        with WorkerPool([endpoint], user="u", pkey=None, node=NODE, pin_store=InMemoryPinStore(),
                        policy=ConnectPolicy(attempts=3, connect_timeout=2), sleep=sleeps.append) as pool:
            errors = pool.connect()
    assert isinstance(errors[0], OSError)
    assert pool.connect_attempts[0] == 3 and len(sleeps) == 2
