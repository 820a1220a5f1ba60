"""Background processes of the local stack: start, wait for readiness, stop exactly what we started.

Each process runs in its own session (process group), so stopping it stops
its children too (gcloud's emulator wrappers spawn a JVM). The pids and
process-group ids are recorded in the state file as soon as a process starts,
so `tpuq dev down` can stop a half-started stack.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests

# Deadlines for a stack's start-up, generous on purpose: a loaded machine (two copies of the test suite on two
# cores, say) starts a JVM emulator in minutes, not seconds. They bound a broken start, never a healthy one.
START_TIMEOUT = 180.0  # seconds for a process to answer its readiness check
REQUEST_TIMEOUT = 60.0  # seconds for one set-up request (a topic, a subscription, a bucket) to be answered


# Listening ports. A process binds the port we chose for it only later (a JVM seconds later), so a port must
# stay free in between. Asking the kernel for one (bind to port 0) is not enough: it takes ports from the
# ephemeral range, as every outgoing connection does for its local end, and it hands back a port chosen a
# moment ago whose server has not bound it yet (the front's executor port once came back as the claimer's
# port, and the front could not start). So ports are chosen below the ephemeral range, never twice by
# one process, and only when nobody has bound them.
# Nor twice by two processes at once: two test workers, or a demo beside `tpuq dev up`, each start stacks, and a
# port one had chosen but not yet bound looked free to the other. Had the second's emulator lost the race to bind
# it, the second stack's readiness check would have been answered by the first's emulator (same project, same
# topics), and its jobs published into the wrong stack. So every process lists the ports it handed out in a file of
# its own in PORT_REGISTRY (one lock for choosing), and a file whose process has gone no longer counts.
LISTEN_PORTS_LOW = 10_000
PORT_REGISTRY = Path("/tmp/tpuq-dev-ports")
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()
_port_choice = random.Random()  # seeded from the OS: two stacks started together choose differently


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default range starts here


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port for a server this process is about to start: unbound now, outside the range the kernel gives
    outgoing connections, never returned before by this process, nor handed out by another live one."""
    high = _ephemeral_low() - 1
    with _handed_out_lock, _machine_registry() as others:
        taken = _handed_out | others.ports
        if high - LISTEN_PORTS_LOW >= 1_000:
            for _ in range(200):
                port = _port_choice.randint(LISTEN_PORTS_LOW, high)
                if port not in taken and _bindable(host, port):
                    return others.hand_out(port)
        # A machine whose ephemeral range leaves too little below it: the kernel's choice, still never twice.
        for _ in range(200):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in taken:
                return others.hand_out(port)
    raise RuntimeError(f"no free port to listen on at {host}")


@dataclass
class _Registry:
    """The ports other live processes handed out, read under the registry's lock; `hand_out` adds one of ours."""

    ports: set[int]
    own_file: Path | None

    def hand_out(self, port: int) -> int:
        _handed_out.add(port)
        if self.own_file is not None:
            try:
                with self.own_file.open("a") as f:
                    f.write(f"{port}\n")
            except OSError:
                pass  # a registry we cannot write: this process's own record still holds
        return port


@contextlib.contextmanager
def _machine_registry():
    """PORT_REGISTRY locked for this process while it chooses; a machine where it cannot be used (another user's
    directory, no /tmp) leaves each process to its own record, as before."""
    own_ticks = _proc_start_ticks(os.getpid())
    try:
        if own_ticks is None:
            raise OSError("no /proc: whether another process is alive cannot be told")
        if not PORT_REGISTRY.is_dir():
            PORT_REGISTRY.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                PORT_REGISTRY.chmod(0o1777)  # every user's stacks, each deleting only its own files
        lock = os.open(PORT_REGISTRY / ".lock", os.O_RDONLY | os.O_CREAT, 0o444)
    except OSError:
        yield _Registry(set(), None)
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        me = f"{os.getpid()}-{own_ticks}"
        others: set[int] = set()
        for entry in PORT_REGISTRY.iterdir():
            pid, _, ticks = entry.name.partition("-")
            if entry.name == me or not pid.isdigit():
                continue
            if _proc_start_ticks(int(pid)) != ticks:  # its process is gone (or the pid is someone else's now)
                with contextlib.suppress(OSError):
                    entry.unlink()
                continue
            with contextlib.suppress(OSError, ValueError):
                others.update(int(line) for line in entry.read_text().split())
        yield _Registry(others, PORT_REGISTRY / me)
    finally:
        os.close(lock)  # closing the descriptor releases the lock


@dataclass
class ProcRecord:
    name: str
    pid: int
    pgid: int
    port: int | None
    cmd: list[str]
    log: str
    url: str | None = None
    started_at: float = field(default_factory=time.time)
    # /proc/<pid>/stat start time: guards against killing an unrelated process that reused the pid
    start_ticks: str | None = None


def _proc_start_ticks(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def is_alive(rec: ProcRecord) -> bool:
    ticks = _proc_start_ticks(rec.pid)
    if ticks is None:
        return False
    if rec.start_ticks and ticks != rec.start_ticks:
        return False  # the pid now belongs to someone else
    try:
        state = Path(f"/proc/{rec.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def spawn(name: str, cmd: list[str], log_dir: Path, env: dict[str, str], port: int | None = None,
          url: str | None = None, cwd: str | None = None) -> ProcRecord:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            cmd,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    return ProcRecord(
        name=name, pid=proc.pid, pgid=proc.pid, port=port, cmd=cmd, log=str(log_path), url=url,
        start_ticks=_proc_start_ticks(proc.pid),
    )


def stop(rec: ProcRecord, grace: float = 5.0) -> None:
    """TERM the process group, then KILL what is left after `grace` seconds."""
    if not is_alive(rec):
        _signal_group(rec, signal.SIGKILL)  # leftovers of a dead leader
        return
    _signal_group(rec, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(rec)
        if not is_alive(rec) and not _group_alive(rec):
            break
        time.sleep(0.05)
    _signal_group(rec, signal.SIGKILL)
    # SIGKILL is asynchronous: return only once the group is empty, so that "stopped" means stopped.
    deadline = time.monotonic() + 5.0
    while True:
        _reap(rec)
        if not _group_alive(rec) or time.monotonic() > deadline:
            break
        time.sleep(0.02)


def _reap(rec: ProcRecord) -> None:
    """The leader may be our own child: reap it once it exits, or its zombie keeps the group "alive" and every
    stop waits its whole grace (5 s a stack, measured)."""
    try:
        os.waitpid(rec.pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_all(records: list[ProcRecord], grace: float = 5.0, graceful: Callable[[ProcRecord], bool] = lambda rec: True
             ) -> None:
    """TERM every group at once (KILL those not `graceful`: nothing of theirs outlives them), give them `grace`
    seconds together, then KILL what is left."""
    for rec in records:
        _signal_group(rec, signal.SIGTERM if graceful(rec) else signal.SIGKILL)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        for rec in records:
            _reap(rec)
        if not any(is_alive(r) or _group_alive(r) for r in records):
            break
        time.sleep(0.05)
    for rec in records:
        stop(rec, grace=0)


def _group_is_ours(rec: ProcRecord) -> bool:
    """Whether the process group numbered `rec.pgid` can still be the one we started.

    Our processes lead their own groups (pgid == pid). Linux keeps a group's number out of use while any
    member lives, so when a live process has our leader's pid but not its start time, the number was free
    once and is now someone else's group: a stale record (a killed service, a state file read later) must
    not signal it. pids come round quickly where pid_max is 32,768: the stack tests fork ~50 processes a
    second (11,232 in 231 s measured), so every pid is reused about every 11 minutes. Without a recorded
    start time nothing can be proven, so only a group without a leader is taken.
    """
    if rec.pgid != rec.pid:
        return False  # not a group we started
    ticks = _proc_start_ticks(rec.pgid)
    return ticks is None or (rec.start_ticks is not None and ticks == rec.start_ticks)


def _signal_group(rec: ProcRecord, sig: int) -> None:
    if not _group_is_ours(rec):
        return
    try:
        os.killpg(rec.pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(rec: ProcRecord) -> bool:
    if not _group_is_ours(rec):
        return False
    try:
        os.killpg(rec.pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return _has_live_member(rec.pgid)


def _has_live_member(pgid: int) -> bool:
    """Whether a process of the group is not a zombie. A member killed after its parent (the emulators' JVMs, a
    service's gunicorn worker) waits as a zombie until init reaps it, here about once a second: it holds no
    port, file or memory by then, and waiting for its reaping made every stack's stop 1-2 s longer (measured)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            state, _ppid, group = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if int(group) == pgid and state not in ("Z", "X"):
            return True
    return False


def wait_http(url: str, rec: ProcRecord, timeout: float = START_TIMEOUT, ok=lambda r: r.status_code < 500) -> None:
    """Poll `url` until it answers, failing fast if the process died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if not is_alive(rec):
            raise RuntimeError(_with_log(f"{rec.name} exited during start-up", rec))
        try:
            r = requests.get(url, timeout=1)
            if ok(r):
                return
        except requests.RequestException as e:
            last = e
        time.sleep(0.05)
    raise RuntimeError(_with_log(f"{rec.name} not ready at {url} after {timeout:.0f}s ({last})", rec))


def _with_log(what: str, rec: ProcRecord) -> str:
    """The log's last line on the first line (the CLI prints only that one: the reason, such as a port in use,
    must be there), then the log's tail."""
    lines = tail(rec.log).splitlines()
    last = lines[-1].strip() if lines else "its log is empty"
    return f"{what}: {last} (log: {rec.log})\n" + "\n".join(lines)


def tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def save_records(path: Path, records: list[ProcRecord], extra: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"processes": [asdict(r) for r in records], **extra}, indent=2))
    tmp.replace(path)


def load_records(path: Path) -> tuple[list[ProcRecord], dict]:
    data = json.loads(path.read_text())
    procs = [ProcRecord(**p) for p in data.pop("processes", [])]
    return procs, data
