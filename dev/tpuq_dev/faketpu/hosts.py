"""Real SSH worker hosts for the fake Cloud TPU: one OpenSSH sshd per TPU worker.

Every worker of an ACTIVE fake node is a real `sshd` listening on its own
loopback address (127.0.x.y, all of 127/8 routes to lo) with its own
filesystem root for `/tmp` and the login users' homes, so that "a file written
on worker 0 is not on worker 1" and "a preempted host kills every process"
hold like on real TPU VMs.

How a host is isolated (we run as root):

    setpriv --pdeathsig KILL \\
      unshare --pid --fork --kill-child --mount --propagation private \\
        sh -c 'mount -t proc proc /proc && ... (hostsetup.py: its own /proc, /dev, /etc/hosts) &&
               mount --bind ROOT/sshd /run/tpuq-faketpu/host &&
               mount --bind ROOT/home/<user> /home/<user> && ... &&
               mount --bind ROOT/tmp /tmp &&
               exec /usr/sbin/sshd -D -e -f /run/tpuq-faketpu/host/sshd_config'

- sshd is pid 1 of a new pid namespace; SIGKILL to it (the forked child of
  `unshare`, not `unshare` itself) kills every process of that host, setsid'd
  ones included.
- The sshd files are bound onto one fixed path outside /tmp first, because
  ROOT may itself live under /tmp, which the last mount hides.
- `--pdeathsig KILL` plus `--kill-child` mean the hosts die with the Python
  process even on SIGKILL. The death signal fires when the *thread* that
  spawned the process exits, so all hosts are spawned from one long-lived
  launcher thread.
- Addresses are unique across processes: each one is held by an flock on
  /run/tpuq-faketpu/addresses/<ip>.lock for the host's life, and handed out
  only when its port 22 is free. sshd always listens on port 22.
- A host has an internal address (127.0.x.y, standing for the VPC IP) and,
  with external_ips, an external one (127.1.x.y). sshd listens on one of them
  (`listen_on`); the other is held but serves nothing, so a client that uses
  the wrong one is refused.
- Host keys: ed25519 and ecdsa, like a VM has several; `host_keys()` gives
  what the guest agent would publish in guest attributes.
- Each host has its own /proc (its processes only), /dev with the TPU device files
  (/dev/accel*, /dev/vfio/*) and /etc/hosts naming its metadata server
  (metadata.py: `metadata.google.internal` on the internal address, port 80,
  served by this process; `host.metadata` is what it answers). See hostsetup.py.

Public API:

    parse_ssh_keys_metadata(text) -> dict[str, list[str]]
        "user:ssh-ed25519 AAAA... comment" lines -> {user: [public key lines]}.
    WorkerHostManager(state_dir, *, max_startups="10:30:100")
        .start_hosts(count, authorized_keys, *, label="node", env=None,
                     timeout=15.0, external_ips=False, listen_on="internal", devices=4,
                     metadata=None) -> list[WorkerHost]
            Starts `count` hosts concurrently and returns once every sshd accepts
            TCP connections. authorized_keys: {user: [key lines]}; the users are
            created (shell /bin/sh, unlocked) when missing. env: SetEnv for sessions. devices: TPU chips
            of one host (device files). metadata: worker index -> InstanceMetadata (default: empty).
        .stop_hosts(hosts)       kill every process of those hosts, free addresses
        .stop_all()              the same for every host this manager started
        .hosts -> list[WorkerHost]
    WorkerHost (frozen): worker_index, address (where sshd listens), port (22),
        root_dir, users, unshare_pid, init_pid, internal_address, external_address, metadata (what its
        metadata server answers: InstanceMetadata);
        .host_keys() -> {"ssh-ed25519": base64, "ecdsa-sha2-nistp256": base64};
        .connections_seen() -> [(client address, address connected to)] (not the readiness probes);
        .path_on_host("/tmp/x") -> the real path of that file (tmp and homes
            are per host; other paths are the machine's own);
        .namespace_pids() -> pids of every process on the host (sshd included);
        .is_running() -> bool.
"""

from __future__ import annotations

import concurrent.futures
import errno
import fcntl
import os
import pwd
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tpuq.contracts.fleet import POSIX_USER_NAME_RE

from .hostsetup import RUN_DIR, namespace_setup, prepare_machine
from .metadata import METADATA_PORT, InstanceMetadata, MetadataServer

# Each host's namespace binds its own sshd dir here; outside /tmp on purpose.
HOST_SSHD_MOUNT = RUN_DIR / "host"
ADDRESS_LOCK_DIR = RUN_DIR / "addresses"
SSHD_BINARY = "/usr/sbin/sshd"
DEFAULT_MAX_STARTUPS = "10:30:100"  # what TPU VMs use
HOST_KEY_TYPES = ("ed25519", "ecdsa")  # TPU VMs also have rsa; two are enough to make the choice matter

# The names a TPU VM's guest agent can create (useradd's portable rule); the fleet file's ssh_user is checked
# against the same rule.
_USER_RE = POSIX_USER_NAME_RE
_user_lock = threading.Lock()


class WorkerHostError(RuntimeError):
    pass


def parse_ssh_keys_metadata(text: str | None) -> dict[str, list[str]]:
    """Parse GCE `ssh-keys` metadata: one `user:<public key>` per line."""
    keys: dict[str, list[str]] = {}
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, key = line.partition(":")
        user, key = user.strip(), key.strip()
        if not sep or not key or not _USER_RE.match(user):
            raise ValueError(f"bad ssh-keys line {raw!r}: expected 'user:ssh-ed25519 AAAA... comment'")
        keys.setdefault(user, []).append(key)
    return keys


def ensure_login_user(name: str) -> pwd.struct_passwd:
    """Create `name` (shell /bin/sh, home /home/name) if missing and make sure it may log in."""
    if not _USER_RE.match(name):
        raise ValueError(f"invalid user name {name!r}")
    if name == "root":
        # root's home holds pyenv and the machine's own keys: never hand it to a fake host.
        raise ValueError("worker hosts do not log in as root; use an ordinary user in ssh-keys")
    with _user_lock:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            result = subprocess.run(
                ["useradd", "--create-home", "--shell", "/bin/sh", name], capture_output=True, text=True
            )
            # 9 = already exists: another process won the race, which is fine.
            if result.returncode not in (0, 9):
                raise WorkerHostError(f"useradd {name} failed: {result.stderr.strip()}")
            entry = pwd.getpwnam(name)
        if _password_field(name).startswith("!"):
            # With UsePAM no, sshd refuses locked accounts even for key logins.
            subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        Path(entry.pw_dir).mkdir(parents=True, exist_ok=True)
        return entry


def _password_field(name: str) -> str:
    try:
        with open("/etc/shadow") as f:
            for line in f:
                parts = line.split(":")
                if parts[0] == name:
                    return parts[1]
    except OSError:
        pass
    return ""


SSH_PORT = 22  # every worker host listens here, as on a TPU VM: clients never need another port


class AddressPool:
    """Hands out 127.N.x.y addresses that no other process on the machine holds and whose ports 22 (sshd) and 80
    (the metadata server) are free.

    An address is held by an flock (so parallel stacks and test processes never share one) and is handed out
    only if binding its ports succeeds (so nothing else, ours or not, already serves there).
    """

    FIRST_OCTET3, LAST_OCTET3 = 16, 250  # 127.0.0.x and 127.0.1.1 are the machine's own

    def __init__(self, lock_dir: Path = ADDRESS_LOCK_DIR, second_octet: int = 0):
        self._lock_dir = lock_dir
        self._second = second_octet
        self._held: dict[str, int] = {}
        self._mutex = threading.Lock()
        self._next = (self.FIRST_OCTET3 + os.getpid() % 64, 1)  # spread processes apart

    def acquire(self) -> str:
        self._lock_dir.mkdir(parents=True, exist_ok=True)
        with self._mutex:
            total = (self.LAST_OCTET3 - self.FIRST_OCTET3 + 1) * 254
            x, y = self._next
            for _ in range(total):
                address = f"127.{self._second}.{x}.{y}"
                y += 1
                if y > 254:
                    x, y = (x + 1 if x < self.LAST_OCTET3 else self.FIRST_OCTET3), 1
                if address in self._held:
                    continue
                fd = os.open(self._lock_dir / f"{address}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue
                if not all(_port_is_free(address, port) for port in (SSH_PORT, METADATA_PORT)):
                    os.close(fd)
                    continue
                self._held[address] = fd
                self._next = (x, y)
                return address
        raise WorkerHostError(f"no free loopback address 127.{self._second}.x.y for a worker host (each needs its "
                              f"ports {SSH_PORT} and {METADATA_PORT} free: is something listening on 0.0.0.0 there?)")

    def release(self, address: str) -> None:
        with self._mutex:
            fd = self._held.pop(address, None)
        if fd is not None:
            os.close(fd)


# Internal addresses stand for `networkEndpoints[].ipAddress` (10.x in a real VPC), external ones for
# `accessConfig.externalIp`: two ranges, so the two can never be confused.
INTERNAL_SECOND_OCTET, EXTERNAL_SECOND_OCTET = 0, 1
_default_pools: dict[int, AddressPool] = {}
_default_pool_lock = threading.Lock()


def default_address_pool(second_octet: int = INTERNAL_SECOND_OCTET) -> AddressPool:
    with _default_pool_lock:
        if second_octet not in _default_pools:
            _default_pools[second_octet] = AddressPool(second_octet=second_octet)
        return _default_pools[second_octet]


class _Launcher:
    """One long-lived thread that spawns every host process (see module docstring: pdeathsig)."""

    def __init__(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="faketpu-launcher")

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return self._executor.submit(subprocess.Popen, argv, **kwargs).result()


_launcher: _Launcher | None = None


def _get_launcher() -> _Launcher:
    global _launcher
    with _default_pool_lock:
        if _launcher is None:
            _launcher = _Launcher()
        return _launcher


@dataclass(frozen=True)
class WorkerHost:
    worker_index: int
    address: str  # where sshd listens (port 22): internal_address or external_address
    port: int
    root_dir: Path
    users: tuple[str, ...]
    unshare_pid: int
    init_pid: int  # sshd: pid 1 of the host's pid namespace
    _process: subprocess.Popen = field(repr=False, compare=False)
    _pidns: str = field(repr=False, compare=False)
    internal_address: str = ""
    external_address: str | None = None  # held, and served only when the host listens on it
    metadata: InstanceMetadata = field(default_factory=InstanceMetadata, compare=False)
    _metadata_server: MetadataServer | None = field(default=None, repr=False, compare=False)

    def host_keys(self) -> dict[str, str]:
        """algorithm -> base64 of this host's public host keys (what a guest agent publishes)."""
        keys = {}
        for pub in sorted((self.root_dir / "sshd").glob("host_key_*.pub")):
            algorithm, b64 = pub.read_text().split()[:2]
            keys[algorithm] = b64
        return keys

    def path_on_host(self, path: str) -> Path:
        """Where a path as seen on the host lives on this machine (tmp and homes are per host)."""
        p = Path(path)
        if p == Path("/tmp") or Path("/tmp") in p.parents:
            return self.root_dir / "tmp" / p.relative_to("/tmp")
        for user in self.users:
            home = Path(pwd.getpwnam(user).pw_dir)
            if p == home or home in p.parents:
                return self.root_dir / "home" / user / p.relative_to(home)
        return p

    def namespace_pids(self) -> list[int]:
        return sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit() and self._in_namespace(entry))

    def _in_namespace(self, pid: int | str) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/ns/pid") == self._pidns
        except OSError:  # gone, or a zombie
            return False

    def is_running(self) -> bool:
        return self._process.poll() is None

    def init_is_alive(self) -> bool:
        """Whether `init_pid` is still this host's init (the process of that pid is in the host's namespace)."""
        return self._in_namespace(self.init_pid)

    def connections_seen(self) -> list[tuple[str, str]]:
        """(client address, address it connected to) of every TCP connection sshd accepted, from its log
        (LogLevel VERBOSE), leaving out the manager's own readiness probes."""
        try:
            text = (self.root_dir / "sshd.log").read_text()
        except OSError:
            return []
        return [(m.group(1), m.group(2)) for m in _CONNECTION_LOG_RE.finditer(text) if m.group(1) != m.group(2)]


def published_host_keys(hosts: Sequence[WorkerHost]) -> dict[int, str]:
    """worker index -> "ssh-ed25519 BASE64" of hosts started without the fake API (tests, benchmarks): what
    their guest agents would publish, in the form `tpuq.executor.pins.HostKeySource.published` returns."""
    return {i: f"ssh-ed25519 {h.host_keys()['ssh-ed25519']}" for i, h in enumerate(hosts)}


def _tcp_accepts(address: str, port: int) -> bool:
    # From the host's own address, so `WorkerHost.connections_seen()` can leave this probe out.
    try:
        with socket.create_connection((address, port), timeout=0.5, source_address=(address, 0)):
            return True
    except OSError:
        return False


_CONNECTION_LOG_RE = re.compile(r"Connection from (\S+) port \d+ on (\S+) port (\d+)")


def _port_is_free(address: str, port: int) -> bool:
    """Nothing listens there. SO_REUSEADDR as sshd sets it: a dead host's TIME_WAIT connections do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
            return True
        except OSError:
            return False


def _children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class WorkerHostManager:
    """Starts and stops worker hosts; see the module docstring."""

    def __init__(
        self,
        state_dir: str | os.PathLike,
        *,
        max_startups: str = DEFAULT_MAX_STARTUPS,
        address_pool: AddressPool | None = None,
        external_address_pool: AddressPool | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.max_startups = max_startups
        self._pool = address_pool or default_address_pool(INTERNAL_SECOND_OCTET)
        self._external_pool = external_address_pool or default_address_pool(EXTERNAL_SECOND_OCTET)
        self._hosts: dict[int, WorkerHost] = {}  # by unshare pid
        self._mutex = threading.Lock()
        self._counter = 0

    @property
    def hosts(self) -> list[WorkerHost]:
        with self._mutex:
            return list(self._hosts.values())

    def start_hosts(
        self,
        count: int,
        authorized_keys: Mapping[str, Sequence[str]],
        *,
        label: str = "node",
        env: Mapping[str, str] | None = None,
        timeout: float = 15.0,
        external_ips: bool = False,
        listen_on: str = "internal",
        devices: int = 4,
        metadata: Sequence[InstanceMetadata] | None = None,
    ) -> list[WorkerHost]:
        """listen_on: "internal" or "external" (see Network in scenario.py); a host without an external
        address listens on its internal one."""
        if count < 1:
            raise ValueError("count must be >= 1")
        if listen_on not in ("internal", "external"):
            raise ValueError(f"listen_on must be 'internal' or 'external', not {listen_on!r}")
        if metadata is not None and len(metadata) != count:
            raise ValueError(f"metadata for {len(metadata)} hosts, not {count}")
        _prepare_run_dirs()
        users = {name: ensure_login_user(name) for name in authorized_keys}
        with self._mutex:
            self._counter += 1
            base = self.state_dir / f"{_safe(label)}-{os.getpid()}-{self._counter}"
        hosts: list[WorkerHost] = []
        try:
            for index in range(count):
                hosts.append(self._spawn(index, base / f"worker-{index}", authorized_keys, users, env or {},
                                         external_ips, listen_on, devices,
                                         metadata[index] if metadata is not None else InstanceMetadata()))
            self._wait_listening(hosts, timeout)
        except BaseException:
            self.stop_hosts(hosts)
            raise
        return hosts

    def stop_hosts(self, hosts: Sequence[WorkerHost]) -> None:
        for host in hosts:
            # SIGKILL to the namespace's init takes every process of the host with it. Only while that pid is
            # still the host's init: a host stopped twice, or whose sshd died, left a pid another process may
            # have taken since (pids come round within minutes here).
            if host.init_is_alive():
                try:
                    os.kill(host.init_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        stopping = [threading.Thread(target=h._metadata_server.stop) for h in hosts if h._metadata_server]
        for thread in stopping:  # at once: each waits for its server's poll
            thread.start()
        for thread in stopping:
            thread.join()
        for host in hosts:
            try:
                host._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                host._process.kill()
                host._process.wait(timeout=10)
            with self._mutex:
                registered = self._hosts.get(host.unshare_pid) is host
                if registered:
                    del self._hosts[host.unshare_pid]
            if registered:  # a host stopped twice must not free the addresses a newer host holds by now
                self._pool.release(host.internal_address)
                if host.external_address:
                    self._external_pool.release(host.external_address)

    def stop_all(self) -> None:
        self.stop_hosts(self.hosts)

    # -- internals ---------------------------------------------------------

    def _spawn(
        self,
        index: int,
        root: Path,
        authorized_keys: Mapping[str, Sequence[str]],
        users: Mapping[str, pwd.struct_passwd],
        env: Mapping[str, str],
        external_ips: bool,
        listen_on: str,
        devices: int,
        metadata: InstanceMetadata,
    ) -> WorkerHost:
        internal = self._pool.acquire()
        external = None
        metadata_server = None
        try:
            external = self._external_pool.acquire() if external_ips else None
            address = external if listen_on == "external" and external else internal
            port = SSH_PORT
            sshd_dir = root / "sshd"
            (root / "tmp").mkdir(parents=True, exist_ok=True)
            os.chmod(root / "tmp", 0o1777)
            (sshd_dir / "authorized_keys").mkdir(parents=True, exist_ok=True)
            mounts = [*namespace_setup(root, internal, devices),
                      f"mount --bind {shlex.quote(str(sshd_dir))} {HOST_SSHD_MOUNT}"]
            for name, entry in users.items():
                home = root / "home" / name
                home.mkdir(parents=True, exist_ok=True)
                os.chown(home, entry.pw_uid, entry.pw_gid)
                (sshd_dir / "authorized_keys" / name).write_text("\n".join(authorized_keys[name]) + "\n")
                mounts.append(f"mount --bind {shlex.quote(str(home))} {shlex.quote(entry.pw_dir)}")
            mounts.append(f"mount --bind {shlex.quote(str(root / 'tmp'))} /tmp")
            for algorithm in HOST_KEY_TYPES:  # like a TPU VM, more than one: the client must pin ed25519
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", algorithm, "-N", "", "-C", f"worker-{index}",
                     "-f", str(sshd_dir / f"host_key_{algorithm}")],
                    check=True,
                    capture_output=True,
                )
            (sshd_dir / "sshd_config").write_text(self._sshd_config(address, port, env))
            script = " && ".join(mounts + [f"exec {SSHD_BINARY} -D -e -f {HOST_SSHD_MOUNT}/sshd_config"])
            log = open(root / "sshd.log", "ab")
            try:
                process = _get_launcher().popen(
                    ["setpriv", "--pdeathsig", "KILL", "unshare", "--pid", "--fork", "--kill-child", "--mount",
                     "--propagation", "private", "sh", "-c", script],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            finally:
                log.close()
            init_pid = self._wait_for_child(process, root)
            metadata_server = MetadataServer(internal, metadata)
            host = WorkerHost(
                worker_index=index,
                address=address,
                port=port,
                root_dir=root,
                users=tuple(users),
                unshare_pid=process.pid,
                init_pid=init_pid,
                _process=process,
                _pidns=os.readlink(f"/proc/{init_pid}/ns/pid"),
                internal_address=internal,
                external_address=external,
                metadata=metadata,
                _metadata_server=metadata_server,
            )
        except BaseException:
            if metadata_server is not None:
                metadata_server.stop()
            self._pool.release(internal)
            if external:
                self._external_pool.release(external)
            raise
        with self._mutex:
            self._hosts[host.unshare_pid] = host
        return host

    def _sshd_config(self, address: str, port: int, env: Mapping[str, str]) -> str:
        lines = [
            f"Port {port}",
            f"ListenAddress {address}",
            *(f"HostKey {HOST_SSHD_MOUNT}/host_key_{algorithm}" for algorithm in HOST_KEY_TYPES),
            "PidFile none",
            f"AuthorizedKeysFile {HOST_SSHD_MOUNT}/authorized_keys/%u",
            "StrictModes no",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin no",
            f"MaxStartups {self.max_startups}",
            "UseDNS no",
            "LogLevel VERBOSE",  # logs "Connection from A port P on B port 22": which address a client used
            "Subsystem sftp internal-sftp",
        ]
        if env:
            lines.append("SetEnv " + " ".join(f'{k}="{v}"' for k, v in env.items()))
        return "\n".join(lines) + "\n"

    @staticmethod
    def _wait_for_child(process: subprocess.Popen, root: Path) -> int:
        # unshare forks the namespace init right away; its pid is our kill handle.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children = _children_of(process.pid)
            if children:
                # setpriv execs unshare in place, so process.pid is unshare.
                return children[0]
            if process.poll() is not None:
                break
            time.sleep(0.002)
        process.kill()
        process.wait()
        raise WorkerHostError(f"worker host did not start: {_log_tail(root)}")

    @staticmethod
    def _wait_listening(hosts: Sequence[WorkerHost], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(hosts)
        while pending:
            for host in list(pending):
                if not host.is_running():
                    raise WorkerHostError(f"sshd for {host.address} exited: {_log_tail(host.root_dir)}")
                if _tcp_accepts(host.address, host.port):
                    pending.remove(host)
            if pending:
                if time.monotonic() > deadline:
                    raise WorkerHostError(f"{len(pending)} worker hosts not listening after {timeout}s")
                time.sleep(0.01)


def _prepare_run_dirs() -> None:
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd refuses to start without it
    HOST_SSHD_MOUNT.mkdir(parents=True, exist_ok=True)
    prepare_machine()


def _log_tail(root: Path) -> str:
    try:
        return (root / "sshd.log").read_text()[-2000:].strip() or "(no output)"
    except OSError as e:
        return f"(no log: {errno.errorcode.get(e.errno, e)})"


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:80] or "node"
