"""Processes and their liveness: flocks, process groups, signals, reaping.

Liveness is judged by flocks rather than pids: a flock dies with its holders,
cannot be fooled by pid reuse, and works whichever pid namespace's /proc a
process sees.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time

from .files import WorkerPaths, read_json, write_json_atomic

# Shell convention for "killed by signal N".
SIGNAL_EXIT_BASE = 128


CONTROL_LOCK_WAIT_SECONDS = 600.0


def control_lock(home: str, wait_seconds: float = CONTROL_LOCK_WAIT_SECONDS) -> int | None:
    """Take the worker's control flock (`prepare` and `launch` hold it), waiting for another holder: two
    deliveries of one assignment then run one after the other, and the second finds the first's work done
    instead of removing its workspace or launching a second supervisor. The fd to close, or None when the
    holder kept it past the wait. Outside the attempt directory, which `prepare` replaces."""
    os.makedirs(home, exist_ok=True)
    fd = os.open(os.path.join(home, ".tpuq-control.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def lock_is_held(path: str) -> bool:
    """True when some live process holds an flock on `path`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def signal_group(pgid: int, sig: int) -> None:
    # Never our own group or session: a stale pgid may have been reused by this very SSH session.
    if pgid <= 1 or pgid in (os.getpgid(0), os.getsid(0)):
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)



def current_state(paths: WorkerPaths) -> dict | None:
    return read_json(paths.attempt_file("state.json"))


def supervisor_alive(paths: WorkerPaths) -> bool:
    return lock_is_held(paths.attempt_file("supervisor.lock"))


def job_alive(paths: WorkerPaths, state: dict | None) -> bool:
    if lock_is_held(paths.attempt_file("job.lock")):
        return True
    pgid = (state or {}).get("job_pgid")
    return bool(pgid) and supervisor_alive(paths) and group_exists(pgid)


def request_cancel(paths: WorkerPaths, reason: str, grace: float) -> None:
    write_json_atomic(paths.attempt_file("cancel"), {"reason": reason, "grace_seconds": grace})




def exit_code_and_signal(returncode: int) -> tuple[int, str | None]:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return SIGNAL_EXIT_BASE - returncode, name
    return returncode, None



def become_subreaper() -> None:
    """Adopt the job's orphans so they are reaped at once (PR_SET_CHILD_SUBREAPER).

    Otherwise a killed grandchild stays a zombie until init gets to it, and its
    process group looks alive to `stop_stale` and `cancel` for that long.
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except Exception:  # noqa: BLE001 - an optimisation only
        pass


class Reaper:
    """Reaps every child (the job's leader and adopted orphans) and remembers the leader's status."""

    def __init__(self, leader_pid: int):
        self.leader_pid = leader_pid
        self.leader_returncode: int | None = None

    def reap(self) -> None:
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.leader_pid:
                self.leader_returncode = os.waitstatus_to_exitcode(wait_status)
