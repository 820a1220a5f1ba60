"""Paramiko fan-out to every worker of a TPU: bounded connects, retries, host-key pins, SFTP.

SSH always goes to port 22 of the address the fleet's ssh_transport reaches (`ssh_address`), and only to a
host presenting the ed25519 key its guest attributes publish (`tpuq.executor.pins`).

    with WorkerPool(endpoints, user="tpuq", pkey=key, node=node, pin_store=pins,
                    host_keys=GuestAttributeHostKeys(tpu_client), transport=fleet.ssh_transport) as pool:
        failed = pool.connect()                # {worker_id: error} for workers that stayed unreachable
        results = pool.run(lambda conn: conn.exec(["uname", "-n"]))   # {worker_id: WorkerResult}

or in one call: `run_on_workers(endpoints, user, pkey, fn, node=..., pin_store=..., host_keys=...)`.

A multislice attempt's pool spans every slice: its endpoints carry the attempt's worker ids (slice * hosts + w,
tpuq.contracts.workers) and `slots` maps each to its node and id within that node, which is what host keys, pins
and kept connections are looked up by.

With a `ConnectionCache`, a pool takes authenticated connections left by an earlier pool of the same worker
(same node, address, user and pinned host key) and leaves its own there when it closes, so the attempts that
follow one another on a slice skip the handshake (`Executor` keeps one cache for as long as it lives).

Why connects are bounded: sshd's MaxStartups (10:30:100 on TPU VMs) drops a
share of connections that are not yet authenticated once 10 are pending, so at
most `batch_size` (default 8) handshakes are in flight at once. Authenticated
connections no longer count, so the commands themselves then run on all workers
in parallel.
"""

from __future__ import annotations

import base64
import hashlib
import io
import posixpath
import select
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import paramiko
import tenacity

from tpuq.runtime import logs
from tpuq.executor.budget import MIN_STEP_SECONDS, Deadline
from tpuq.executor.pins import HostKeyPinStore, HostKeySource, pins_for
from tpuq.contracts.fleet import SshTransport
from tpuq.contracts.messages import WorkerEndpoint

T = TypeVar("T")
DEFAULT_BATCH_SIZE = 8
MAX_PARALLEL = 64  # threads per pool: one per worker up to this
SSH_PORT = 22  # always: `networkEndpoints[].port` is the TPU runtime's port (8470), never SSH's


@dataclass(frozen=True)
class SshLogin:
    """How the executor logs in to a fleet's workers: as `user`, the name the claimer put the executor's key under
    in every node's `ssh-keys` metadata (the guest agent creates that user and no other), at the address
    `transport` reaches. Both come from the fleet in force (`of`): there is no second source for either."""

    user: str
    transport: SshTransport = SshTransport.vpc

    @classmethod
    def of(cls, fleet) -> "SshLogin":
        """The login a stored `tpuq.contracts.fleet.FleetFile` gives."""
        return cls(user=fleet.ssh_user, transport=fleet.ssh_transport)


class NoSshAddress(Exception):
    """The worker has no address the fleet's transport can use (a direct fleet's node without external IPs)."""


def ssh_address(endpoint: WorkerEndpoint, transport: SshTransport) -> str:
    """Where to SSH: the internal IP for vpc (and iap, served the same way), the external IP for direct."""
    if transport is SshTransport.direct:
        if not endpoint.external_ip:
            raise NoSshAddress(
                f"worker {endpoint.worker_id} has no external IP (networkEndpoints[{endpoint.worker_id}]"
                ".accessConfig.externalIp): ssh_transport: direct needs nodes created with enableExternalIps")
        return endpoint.external_ip
    return endpoint.ip


class HostKeyMismatch(Exception):
    """The worker presented a key other than the one pinned for it: never retried."""


class CommandTimeout(Exception):
    pass


@dataclass(frozen=True)
class ConnectPolicy:
    attempts: int = 5
    first_backoff: float = 0.5
    max_backoff: float = 8.0
    connect_timeout: float = 10.0
    batch_size: int = DEFAULT_BATCH_SIZE
    # How long to wait for host keys a node's guest agents have not published yet, and how often to ask
    # (after 0.5 s, then twice as long each time, at most every 8 s).
    host_key_wait_seconds: float = 180.0
    host_key_poll_seconds: float = 0.5
    host_key_max_poll_seconds: float = 8.0


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str


@dataclass
class WorkerResult(Generic[T]):
    worker_id: int
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def key_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def _parse_key_line(line: str) -> tuple[str, paramiko.PKey]:
    key_type, b64 = line.split()[:2]
    return key_type, paramiko.PKey.from_type_string(key_type, base64.b64decode(b64))


@dataclass
class WorkerConnection:
    """An authenticated SSH connection to one worker."""

    endpoint: WorkerEndpoint
    client: paramiko.SSHClient
    _sftp: paramiko.SFTPClient | None = field(default=None, repr=False)
    reused: bool = False  # taken from a ConnectionCache: an earlier attempt's connection
    _home: str | None = field(default=None, repr=False)
    # path -> sha256 of what this connection wrote there (`put_file_once`)
    uploaded: dict[str, str] = field(default_factory=dict, repr=False)
    _io_timeout: float | None = field(default=None, repr=False)

    @property
    def worker_id(self) -> int:
        return self.endpoint.worker_id

    @property
    def host_key(self) -> str:
        return key_line(self.client.get_transport().get_remote_server_key())

    def exec(self, argv: Sequence[str], *, stdin: bytes | str | None = None, timeout: float = 120.0) -> ExecResult:
        """Run argv (quoted for the remote shell, so nothing in it is interpreted) and collect its output."""
        chan = self.client.get_transport().open_session(timeout=timeout)
        try:
            chan.exec_command(shlex.join(argv))
            if stdin is not None:
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while True:
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                # Data always precedes the exit status on a channel, so once it is here all output is too.
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    return ExecResult(chan.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace"))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommandTimeout(f"{argv[:3]} on worker {self.worker_id} did not finish in {timeout:.0f} s")
                # The channel's fd wakes on stdout data and on close; stderr alone does not wake it.
                select.select([chan], [], [], min(remaining, 0.05))
        finally:
            chan.close()

    def bound_io(self, seconds: float | None) -> None:
        """Bound the opening of the SFTP channel and each SFTP request to `seconds` (None: paramiko's defaults, an
        hour to open a channel and no limit on a request). A start passes what is left of its budget."""
        self._io_timeout = seconds
        if self._sftp is not None:
            self._sftp.get_channel().settimeout(seconds)

    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            # SSHClient.open_sftp, with a timeout: it opens its channel with none.
            channel = self.client.get_transport().open_session(timeout=self._io_timeout)
            channel.invoke_subsystem("sftp")
            channel.settimeout(self._io_timeout)
            self._sftp = paramiko.SFTPClient(channel)
        return self._sftp

    def home(self) -> str:
        """The login user's home: where SFTP and exec start (asked once per connection)."""
        if self._home is None:
            self._home = self.sftp.normalize(".")
        return self._home

    def makedirs(self, path: str) -> None:
        current = "" if not path.startswith("/") else "/"
        for part in [p for p in path.split("/") if p]:
            current = posixpath.join(current, part) if current else part
            try:
                self.sftp.stat(current)
            except FileNotFoundError:
                try:
                    self.sftp.mkdir(current)
                except OSError:
                    self.sftp.stat(current)  # created concurrently is fine; anything else raises

    def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write a file atomically (temp name, then rename), so a reader never sees half of it."""
        directory = posixpath.dirname(path)
        if directory:
            self.makedirs(directory)
        tmp = f"{path}.tmp-upload-{uuid.uuid4().hex[:12]}"  # two deliveries of one assignment upload at once
        self.sftp.putfo(io.BytesIO(data), tmp)
        self.sftp.chmod(tmp, mode)
        self.sftp.posix_rename(tmp, path)
        self.uploaded[path] = hashlib.sha256(data).hexdigest()

    def put_file_once(self, path: str, data: bytes, mode: int = 0o644) -> bool:
        """`put_file`, unless this connection already wrote exactly `data` there; returns whether it wrote."""
        if self.uploaded.get(path) == hashlib.sha256(data).hexdigest():
            return False
        self.put_file(path, data, mode)
        return True

    def alive(self, timeout: float) -> bool:
        """One round trip: the server confirms a new channel within `timeout`. A transport can look active
        long after its peer vanished (a preempted VM answers nothing); this never waits longer than asked."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            return False
        try:
            transport.open_session(timeout=timeout).close()
            return True
        except (paramiko.SSHException, socket.error, EOFError):
            return False

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
        self.client.close()


CacheKey = tuple[str, int, str, str, str]  # node, worker id, address, user, pinned host key


class ConnectionCache:
    """Authenticated connections between pools, one per worker, for as long as the executor instance lives.

    A pool takes a connection out (no two pools share one at a time) and gives it back when it closes,
    unless a command on it failed. A connection is used again only if the server answers a channel open
    within `check_timeout` (`WorkerConnection.alive`); one unused for `max_idle` seconds is closed: VPC
    firewalls drop idle TCP connections after 10 minutes, and a node that left takes its connections
    with it (`forget_nodes` closes them at once)."""

    def __init__(self, max_idle: float = 540.0, check_timeout: float = 2.0, max_connections: int = 1024,
                 monotonic: Callable[[], float] = time.monotonic):
        self.max_idle = max_idle
        self.check_timeout = check_timeout
        self.max_connections = max_connections
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._idle: dict[CacheKey, tuple[WorkerConnection, float]] = {}
        self.hits = 0
        self.misses = 0

    def take(self, key: CacheKey) -> WorkerConnection | None:
        with self._lock:
            self._expire()
            held = self._idle.pop(key, None)
        if held is not None and held[0].alive(self.check_timeout):
            self.hits += 1
            held[0].reused = True
            return held[0]
        if held is not None:
            _close_quietly(held[0])
        self.misses += 1
        return None

    def give(self, key: CacheKey, conn: WorkerConnection) -> None:
        with self._lock:
            replaced = self._idle.pop(key, None)
            self._idle[key] = (conn, self._monotonic())
            extra = len(self._idle) - self.max_connections
            oldest = sorted(self._idle, key=lambda k: self._idle[k][1])[:max(extra, 0)]
            dropped = [self._idle.pop(k)[0] for k in oldest]
        for old in ([replaced[0]] if replaced else []) + dropped:
            _close_quietly(old)

    def nodes(self) -> set[str]:
        with self._lock:
            return {key[0] for key in self._idle}

    def forget_nodes(self, nodes: set[str]) -> int:
        """Close the kept connections of these nodes (they left); returns how many were closed."""
        with self._lock:
            gone = [k for k in self._idle if k[0] in nodes]
            closing = [self._idle.pop(k)[0] for k in gone]
        for conn in closing:
            _close_quietly(conn)
        return len(closing)

    def close_all(self) -> None:
        self.forget_nodes(self.nodes())

    def __len__(self) -> int:
        return len(self._idle)

    def _expire(self) -> None:  # (holding the lock)
        now = self._monotonic()
        for key in [k for k, (_, at) in self._idle.items() if now - at > self.max_idle]:
            _close_quietly(self._idle.pop(key)[0])


def _close_quietly(conn: WorkerConnection) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing is best effort
        pass


class WorkerPool:
    """Connections to the workers of one node, or of several slices (`slots`). Use as a context manager;
    `connect()` first."""

    def __init__(
        self,
        endpoints: Sequence[WorkerEndpoint],
        *,
        user: str,
        pkey: paramiko.PKey,
        node: str,
        pin_store: HostKeyPinStore,
        host_keys: HostKeySource,
        transport: SshTransport = SshTransport.vpc,
        policy: ConnectPolicy = ConnectPolicy(),
        sleep: Callable[[float], None] = time.sleep,
        wait: tenacity.wait.wait_base | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        cache: ConnectionCache | None = None,
        deadline: Deadline | None = None,
        slots: Mapping[int, tuple[str, int]] | None = None,
    ):
        self.endpoints = {e.worker_id: e for e in endpoints}
        # Each worker's (node, id within the node); one node by default, the endpoints' own ids.
        self.slots = dict(slots) if slots is not None else {w: (node, w) for w in self.endpoints}
        self.user = user
        self.pkey = pkey
        self.node = node
        self.pin_store = pin_store
        self.host_keys = host_keys
        self.transport = transport
        self.policy = policy
        self._sleep = sleep
        self._monotonic = monotonic
        self._wait = wait or tenacity.wait_exponential_jitter(
            multiplier=policy.first_backoff, max=policy.max_backoff, jitter=policy.first_backoff
        )
        self._handshakes = threading.Semaphore(policy.batch_size)
        self._executor = ThreadPoolExecutor(max_workers=max(1, min(len(self.endpoints), MAX_PARALLEL)),
                                            thread_name_prefix="tpuq-ssh")
        self.connections: dict[int, WorkerConnection] = {}
        self.connect_attempts: dict[int, int] = {}
        self.cache = cache
        self._keys: dict[int, CacheKey] = {}
        self._broken: set[int] = set()  # a command on it raised: never given back to the cache
        # A start's: the host-key wait, each connect and the pauses between retries end by it (tpuq.executor.budget).
        self.deadline = deadline

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def connect(self, worker_ids: Sequence[int] | None = None) -> dict[int, BaseException]:
        """Connect to the workers (all by default); return the errors of those that stayed unreachable.

        Each worker's address must exist for the transport and its host key must be pinned (from the TPU
        API, waiting for it if need be) before any packet is sent to it."""
        ids = [w for w in (worker_ids if worker_ids is not None else sorted(self.endpoints)) if w not in self.connections]
        errors: dict[int, BaseException] = {}
        addresses: dict[int, str] = {}
        for w in ids:
            try:
                addresses[w] = ssh_address(self.endpoints[w], self.transport)
            except NoSshAddress as e:
                errors[w] = e
        by_node: dict[str, dict[int, int]] = {}  # node -> {id within the node: the pool's id}
        for w in addresses:
            node, own = self.slots[w]
            by_node.setdefault(node, {})[own] = w
        pins: dict[int, str] = {}
        unpinned: dict[int, BaseException] = {}
        for node, ids in by_node.items():  # host keys and pins are per node, by the node's own worker ids
            wait = self.policy.host_key_wait_seconds
            if self.deadline is not None:
                wait = min(wait, self.deadline.remaining())
            got, missing = pins_for(
                node, list(ids), self.pin_store, self.host_keys,
                wait_seconds=wait, poll_seconds=self.policy.host_key_poll_seconds,
                max_poll_seconds=self.policy.host_key_max_poll_seconds, sleep=self._sleep, monotonic=self._monotonic)
            pins.update({ids[own]: key for own, key in got.items() if own in ids})
            unpinned.update({ids[own]: e for own, e in missing.items()})
        errors.update(unpinned)
        for w, address in addresses.items():
            if w not in unpinned:
                self._keys[w] = (*self.slots[w], address, self.user, pins[w])
        futures = {w: logs.submit_in_context(self._executor, self._connect_or_reuse, w, address, pins[w])
                   for w, address in addresses.items() if w not in unpinned}
        for w, fut in futures.items():
            try:
                self.connections[w] = fut.result()
            except Exception as e:  # noqa: BLE001 - reported per worker
                errors[w] = e
        return errors

    def _connect_or_reuse(self, worker_id: int, address: str, pinned: str) -> WorkerConnection:
        kept = self.cache.take(self._keys[worker_id]) if self.cache is not None else None
        if kept is not None:
            kept.endpoint = self.endpoints[worker_id]  # this pool's id for it (another pool may number it otherwise)
            return kept
        return self._connect_with_retries(self.endpoints[worker_id], address, pinned)

    def _connect_with_retries(self, endpoint: WorkerEndpoint, address: str, pinned: str) -> WorkerConnection:
        attempt = 0

        def once() -> WorkerConnection:
            nonlocal attempt
            attempt += 1
            self.connect_attempts[endpoint.worker_id] = attempt
            with self._handshakes:
                return self._connect_once(endpoint, address, pinned)

        stop = tenacity.stop_after_attempt(self.policy.attempts)
        wait = self._wait
        if self.deadline is not None:
            deadline, backoff = self.deadline, self._wait
            stop = stop | (lambda state: deadline.expired)
            # Never pause past the point where a last try still fits.
            wait = lambda state: max(0.0, min(backoff(state), deadline.remaining() - MIN_STEP_SECONDS))  # noqa: E731
        retrying = tenacity.Retrying(
            stop=stop,
            wait=wait,
            retry=tenacity.retry_if_exception(lambda e: not isinstance(e, HostKeyMismatch)),
            sleep=self._sleep,
            reraise=True,
        )
        return retrying(once)

    def _connect_once(self, endpoint: WorkerEndpoint, address: str, pinned: str) -> WorkerConnection:
        timeout = self.policy.connect_timeout
        if self.deadline is not None:
            timeout = self.deadline.cap(timeout, f"connecting to worker {endpoint.worker_id}")
        client = paramiko.SSHClient()
        key_type, key = _parse_key_line(pinned)
        client.get_host_keys().add(address, key_type, key)  # port 22: known_hosts names the bare address
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                address,
                SSH_PORT,
                username=self.user,
                pkey=self.pkey,
                look_for_keys=False,
                allow_agent=False,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
            )
        except paramiko.BadHostKeyException:
            client.close()
            node, own = self.slots[endpoint.worker_id]
            raise HostKeyMismatch(
                f"worker {own} of {node} at {address}: host key differs from the one its guest attributes publish"
            ) from None
        except (paramiko.SSHException, socket.error, EOFError):
            client.close()
            raise
        transport = client.get_transport()
        transport.set_keepalive(15)  # long prepares must not look idle to NAT or sshd
        return WorkerConnection(endpoint, client)

    def run(
        self, fn: Callable[[WorkerConnection], T], worker_ids: Sequence[int] | None = None
    ) -> dict[int, WorkerResult[T]]:
        """Run fn on each connected worker in parallel; exceptions are captured per worker."""
        ids = [w for w in (worker_ids if worker_ids is not None else sorted(self.connections))]
        futures = {w: logs.submit_in_context(self._executor, fn, self.connections[w]) for w in ids}
        results: dict[int, WorkerResult[T]] = {}
        for w, fut in futures.items():
            try:
                results[w] = WorkerResult(w, value=fut.result())
            except Exception as e:  # noqa: BLE001 - reported per worker
                results[w] = WorkerResult(w, error=e)
                self._broken.add(w)
        return results

    def close(self) -> None:
        """Give healthy connections back to the cache (if any); close the rest."""
        for w, conn in self.connections.items():
            if self.cache is not None and w not in self._broken and w in self._keys:
                self.cache.give(self._keys[w], conn)
            else:
                _close_quietly(conn)
        self.connections.clear()
        self._executor.shutdown(wait=False)


def run_on_workers(
    endpoints: Sequence[WorkerEndpoint],
    user: str,
    pkey: paramiko.PKey,
    fn: Callable[[WorkerConnection], T],
    *,
    node: str,
    pin_store: HostKeyPinStore,
    host_keys: HostKeySource,
    transport: SshTransport = SshTransport.vpc,
    batch_size: int = DEFAULT_BATCH_SIZE,
    policy: ConnectPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, WorkerResult[T]]:
    """Connect to every worker (at most `batch_size` handshakes at once), run fn on each, close.

    Workers that could not be reached get a WorkerResult with the connect error.
    """
    policy = policy or ConnectPolicy(batch_size=batch_size)
    with WorkerPool(endpoints, user=user, pkey=pkey, node=node, pin_store=pin_store, host_keys=host_keys,
                    transport=transport, policy=policy, sleep=sleep) as pool:
        errors = pool.connect()
        results: dict[int, WorkerResult[T]] = {w: WorkerResult(w, error=e) for w, e in errors.items()}
        results.update(pool.run(fn))
        return dict(sorted(results.items()))


def results_by_worker(results: Mapping[int, WorkerResult[T]]) -> tuple[dict[int, T], dict[int, BaseException]]:
    """Split results into values and errors."""
    values = {w: r.value for w, r in results.items() if r.ok}
    errors = {w: r.error for w, r in results.items() if not r.ok}
    return values, errors  # type: ignore[return-value]
