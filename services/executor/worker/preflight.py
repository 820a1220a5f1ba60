"""The preflight: before the command starts, is this host fit to run it?

`prepare` runs it on every worker once the earlier attempt's processes are stopped and a stale libtpu lockfile is
removed, before the bundle is fetched. It looks for what would make the job fail where a fresh slice would run it
(marin-community/marin#4783: after 13 preemptions, `open(/dev/vfio/0): Device or resource busy` until the VM was
deleted; marin#5258: a host reused before libtpu released /dev/vfio):

- a TPU device file held by another process: every /proc/PID/fd link whose target matches the device globs
  (/dev/accel* and /dev/vfio/*, the files libtpu opens: openxla/xla tpu_initialize_util.cc, GetTpuDriverFile). As
  libtpu's own check, it sees the processes this user may read (all of them as root); others are skipped;
- libtpu's lock file held: libtpu opens /tmp/libtpu_lockfile and takes `lockf(fd, F_TLOCK, 0)`, a POSIX record lock
  it keeps until the process exits (same file, TryAcquireTpuLock); a second libtpu then aborts with "The TPU is
  already in use by process with pid N". An open file without the lock stops nobody, and a file left behind by a
  killed process without its lock is removed by `prepare`. So the check is the lock, read from /proc/locks (which
  lists every process's locks, whoever owns them, with the holder's pid); flock and OFD locks are named too. A lock
  file this user cannot open (another user's, mode 0600) stops libtpu as well ("The TPU is already in use by another
  process probably owned by another user");
- too little free disk for the bundle and the caches: the bundle's size is not known before its download, so a
  floor (`min_free_bytes`, WorkerSettings.preflight_min_free_bytes).

Each check returns findings (sentences naming the device, the pid and its command); none is a failure of the job's
own. `run_preflight` raises `PreflightFailed` (an InfraError) with them: the attempt ends `infra_failed`, and the
slice is quarantined. The checks read the /proc root, device globs, lock path and disk floor from the worker spec's
`preflight` object (built from WorkerSettings), so tests and the fake hosts point them elsewhere.
"""

from __future__ import annotations

import fcntl
import fnmatch
import os

from .errors import InfraError

COMMAND_CHARS = 120  # of a holder's command line, in a finding
MAX_HOLDERS_NAMED = 5


class PreflightFailed(InfraError):
    """The host is not fit to run a job: retrying on another slice helps, and this one is not to be used again."""


def process_command(proc_root: str, pid: int) -> str:
    """A process's command line as `ps` shows it (its name when the command line is empty or unreadable)."""
    try:
        with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
        if words:
            text = " ".join(words)
            return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 3] + "..."
    except OSError:
        pass
    try:
        with open(os.path.join(proc_root, str(pid), "comm")) as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


def _pids(proc_root: str) -> list[int]:
    try:
        return sorted(int(name) for name in os.listdir(proc_root) if name.isdigit())
    except OSError:
        return []


def device_holders(proc_root: str, device_globs, skip_pids) -> list[tuple[str, int]]:
    """(device, pid) for every open file descriptor whose target matches a glob, skipping `skip_pids` and the
    processes whose fds cannot be read (another user's, or gone meanwhile)."""
    held: list[tuple[str, int]] = []
    for pid in _pids(proc_root):
        if pid in skip_pids:
            continue
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        targets = set()
        for fd in fds:
            try:
                targets.add(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                continue
        held += [(t, pid) for t in sorted(targets) if any(fnmatch.fnmatchcase(t, g) for g in device_globs)]
    return held


def parse_proc_locks(text: str) -> list[tuple[str, int, int, int, int]]:
    """(kind, pid, major, minor, inode) of each lock HELD in /proc/locks, as the kernel writes it:
    `1: POSIX  ADVISORY  WRITE 4711 08:01:1234 0 EOF` (major and minor in hex). Waiters (`1: -> POSIX ...`) hold
    nothing; an OFD lock's pid is -1."""
    held = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":
            continue
        kind, pid, where = fields[1], fields[4], fields[5]
        try:
            major, minor, inode = where.split(":")
            held.append((kind, int(pid), int(major, 16), int(minor, 16), int(inode)))
        except ValueError:
            continue
    return held


def _locked(path: str) -> bool:
    """Whether some process holds a POSIX (lockf) or flock lock on `path`: tried without waiting, and let go."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # lets go of both


def lockfile_holders(proc_root: str, lock_path: str) -> list[tuple[str, int]]:
    """(kind, pid) of the locks held on `lock_path` (none when it does not exist). Without a /proc/locks to read, the
    lock is tried instead, and a holder is reported without its pid (0)."""
    try:
        st = os.stat(lock_path)
    except OSError:
        return []
    try:
        with open(os.path.join(proc_root, "locks")) as f:
            text = f.read()
    except OSError:
        return [("lockf or flock", 0)] if _locked(lock_path) else []
    dev = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    return [(kind, pid) for kind, pid, major, minor, inode in parse_proc_locks(text) if (major, minor, inode) == dev]


def _holder(proc_root: str, pid: int) -> str:
    if pid < 0:
        return "a process the kernel does not name (an open file description lock)"
    if pid == 0:
        return "a process outside this host's view of processes"
    return f"pid {pid} ({process_command(proc_root, pid)})"


def device_findings(proc_root: str, holders: list[tuple[str, int]]) -> list[str]:
    """'/dev/vfio/0 is held by pid 4711 (python3 train.py)', one sentence per device."""
    by_device: dict[str, list[int]] = {}
    for device, pid in holders:
        by_device.setdefault(device, []).append(pid)
    out = []
    for device, pids in sorted(by_device.items()):
        named = ", ".join(_holder(proc_root, p) for p in pids[:MAX_HOLDERS_NAMED])
        more = f" and {len(pids) - MAX_HOLDERS_NAMED} more" if len(pids) > MAX_HOLDERS_NAMED else ""
        out.append(f"{device} is held by {named}{more}")
    return out


def lock_findings(proc_root: str, lock_path: str, holders: list[tuple[str, int]], openable: bool) -> list[str]:
    if holders:
        named = ", ".join(f"{_holder(proc_root, pid)} ({kind})" for kind, pid in holders[:MAX_HOLDERS_NAMED])
        return [f"libtpu's lock file {lock_path} is locked by {named}"]
    if not openable:
        return [f"libtpu's lock file {lock_path} cannot be opened by this user (another user's): libtpu would "
                "refuse to start"]
    return []


def disk_findings(free_bytes: dict[str, int], min_free_bytes: int) -> list[str]:
    """One sentence per filesystem (named by a path on it) with less than `min_free_bytes` free."""
    return [f"only {_gib(free)} free on {path} (the preflight asks for {_gib(min_free_bytes)}, for the bundle and "
            "the caches)" for path, free in sorted(free_bytes.items()) if free < min_free_bytes]


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _free_bytes(paths) -> dict[str, int]:
    """Free bytes (for an unprivileged user) per filesystem, each named by the first of `paths` on it."""
    out: dict[str, int] = {}
    devices = set()
    for path in paths:
        probe = path
        while probe and not os.path.exists(probe):  # a cache root not made yet: its parent's filesystem
            probe = os.path.dirname(probe)
        try:
            st = os.stat(probe)
            vfs = os.statvfs(probe)
        except OSError:
            continue
        if st.st_dev not in devices:
            devices.add(st.st_dev)
            out[path] = vfs.f_bavail * vfs.f_frsize
    return out


def preflight_findings(proc_root: str, device_globs, lock_path: str, disk_paths, min_free_bytes: int,
                       skip_pids=()) -> list[str]:
    """Everything that makes this host unfit, as sentences; empty when it is fit."""
    skip = set(skip_pids) | {os.getpid()}
    findings = device_findings(proc_root, device_holders(proc_root, device_globs, skip))
    openable = not os.path.lexists(lock_path) or os.access(lock_path, os.R_OK | os.W_OK)
    findings += lock_findings(proc_root, lock_path, lockfile_holders(proc_root, lock_path), openable)
    findings += disk_findings(_free_bytes(disk_paths), min_free_bytes)
    return findings


def run_preflight(spec: dict, lock_path: str, disk_paths) -> None:
    """Raise PreflightFailed naming what the spec's `preflight` checks found (none in a spec without one)."""
    checks = spec.get("preflight")
    if not checks:
        return
    findings = preflight_findings(
        checks.get("proc_root") or "/proc",
        tuple(checks.get("device_globs") or ()),
        lock_path,
        disk_paths,
        int(checks.get("min_free_bytes") or 0),
    )
    if findings:
        raise PreflightFailed("; ".join(findings))
