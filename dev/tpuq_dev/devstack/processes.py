"""Background processes of the local stack: start, wait for readiness, stop exactly what we started.

Each process runs in its own session (process group), so stopping it stops
its children too (gcloud's emulator wrappers spawn a JVM). The pids and
process-group ids are recorded in the state file as soon as a process starts,
so `tpuq dev down` can stop a half-started stack.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests

# Deadlines for a stack's start-up, generous on purpose: a loaded machine (two copies of the test suite on two
# cores, say) starts a JVM emulator in minutes, not seconds. They bound a broken start, never a healthy one.
START_TIMEOUT = 180.0  # seconds for a process to answer its readiness check
REQUEST_TIMEOUT = 60.0  # seconds for one set-up request (a topic, a subscription, a bucket) to be answered


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
        _kill_group(rec.pgid, signal.SIGKILL)  # leftovers of a dead leader
        return
    _kill_group(rec.pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_alive(rec) and not _group_alive(rec.pgid):
            break
        time.sleep(0.05)
    _kill_group(rec.pgid, signal.SIGKILL)
    # SIGKILL is asynchronous: return only once the group is empty, so that "stopped" means stopped.
    # The leader may be our own child: reap it, or its zombie would keep the group "alive".
    deadline = time.monotonic() + 5.0
    while True:
        try:
            os.waitpid(rec.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not _group_alive(rec.pgid) or time.monotonic() > deadline:
            break
        time.sleep(0.02)


def stop_all(records: list[ProcRecord], grace: float = 5.0) -> None:
    """TERM every group at once, give them `grace` seconds together, then KILL what is left."""
    for rec in records:
        _kill_group(rec.pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(is_alive(r) or _group_alive(r.pgid) for r in records):
        time.sleep(0.05)
    for rec in records:
        stop(rec, grace=0)


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def wait_http(url: str, rec: ProcRecord, timeout: float = START_TIMEOUT, ok=lambda r: r.status_code < 500) -> None:
    """Poll `url` until it answers, failing fast if the process died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if not is_alive(rec):
            raise RuntimeError(f"{rec.name} exited during start-up; see {rec.log}:\n{tail(rec.log)}")
        try:
            r = requests.get(url, timeout=1)
            if ok(r):
                return
        except requests.RequestException as e:
            last = e
        time.sleep(0.05)
    raise RuntimeError(f"{rec.name} not ready at {url} after {timeout:.0f}s ({last}); see {rec.log}:\n{tail(rec.log)}")


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
