#!/usr/bin/python3
"""tpuq's worker-side agent: prepares the workspace, runs the job detached, reports to GCS.

This file is copied to every TPU worker over SFTP on every attempt and run with
the system python (`/usr/bin/python3`, 3.9+: Ubuntu 22.04 TPU images have 3.10), so it uses the standard library
only and imports nothing from tpuq. The executor talks to it with one JSON
object on stdin (`prepare`) or command-line flags, and reads one JSON object
from its stdout.

Subcommands (HOME is the login user's home, or --home for tests):

    prepare            spec JSON on stdin. Stops what an earlier attempt left
                       running, replaces the workspace, downloads and checks the
                       bundle, sorts the caches, removes a stale libtpu lockfile.
                       Idempotent for the attempt that is already there.
    launch --attempt-id ID
                       starts `supervise` detached (own session) and returns once
                       the job's process group exists.
    cancel --attempt-id ID [--reason R] [--grace S]
                       asks the supervisor to TERM the job's group (KILL after the
                       grace); stops an orphaned group itself.
    status [--attempt-id ID]
                       what is running here, and the local copy of the final status.
    supervise          (internal) the detached supervisor.

Worker file layout:

    ~/tpuq/supervisor.py          this file (replaced atomically each attempt)
    ~/tpuq/attempt/               control files of the latest attempt on this worker
        spec.json                 the spec `prepare` received
        prepared                  the attempt id, once the workspace is ready
        state.json                supervisor pid, job process group, attempt id
        supervisor.lock           flock held by the live supervisor
        job.lock                  flock held (inherited) by the job's processes
        cancel                    cancel request: {"reason", "grace_seconds"}
        output.log                the job's stdout+stderr as the supervisor read them
        status.json               local copy of the final status object
        supervisor.err            the supervisor's own stderr
    ~/tpuq/job/                   JOB_DIR: the extracted bundle; cache paths are
                                  symlinks into ~/tpuq-cache/<key>
    ~/tpuq-cache/<key>/           caches; `.ready` marks a cache a job finished
                                  writing (its supervisor saw exit code 0)
    /tmp/libtpu_lockfile          removed by `prepare` when no process holds it

Liveness is judged by flocks rather than pids: a flock dies with its holders,
cannot be fooled by pid reuse, and works in pid namespaces whose /proc is the
parent's (as on the fake TPU hosts).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse

# urllib.request (with http.client, email, ssl) is imported where it is used: it is most of
# this script's start-up time, and `status`, `cancel` and the job's start do not need it.

# How the executor (and `launch`) run this file: imported as a module, so that its bytecode is
# cached in __pycache__ after the first run of an attempt; -I -S: no user site, no site-packages.
# argv: [DIR, MODULE, subcommand args...]
BOOTSTRAP = "import sys; d, m = sys.argv[1:3]; sys.path.insert(0, d); sys.exit(__import__(m).main(sys.argv[3:]))"
SPEC_VERSION = 1
STATUS_VERSION = 1
# Shell convention for "killed by signal N".
SIGNAL_EXIT_BASE = 128
MAX_SYMLINK_HOPS = 40
LOG_BUFFER_LIMIT = 16 * 1024 * 1024  # output kept in memory while GCS is unreachable
LOG_CHUNK_LIMIT = 8 * 1024 * 1024  # one simple upload
TAIL_BYTES = 4096
STATUS_UPLOAD_DEADLINE_SECONDS = 900.0  # the status object is how the system learns the end: insist
EOF_AFTER_EXIT_SECONDS = 0.5  # then background children still holding the output pipe are stopped


# ---------------------------------------------------------------------------
# Errors


class SetupError(Exception):
    """The job's own inputs are wrong (bundle, caches, spec): the attempt fails terminally."""


class UnsafeBundle(SetupError):
    pass


class InfraError(Exception):
    """Something outside the job failed (GCS unreachable, disk): retrying may help."""


# ---------------------------------------------------------------------------
# Paths


class WorkerPaths:
    """Where everything lives on one worker, from the login user's home."""

    def __init__(self, home: str, libtpu_lockfile: str = "/tmp/libtpu_lockfile"):
        self.home = home
        self.root = os.path.join(home, "tpuq")
        self.attempt_dir = os.path.join(self.root, "attempt")
        self.job_dir = os.path.join(self.root, "job")
        self.cache_root = os.path.join(home, "tpuq-cache")
        self.libtpu_lockfile = libtpu_lockfile

    def attempt_file(self, name: str) -> str:
        return os.path.join(self.attempt_dir, name)


# ---------------------------------------------------------------------------
# Bundle safety (pure: runs over tar members before anything is written)


def _split_member_name(name: str) -> list[str]:
    """Normalised path components of a tar member name, refusing absolute paths and '..'."""
    if name.startswith("/") or name.startswith("\\"):
        raise UnsafeBundle(f"bundle member {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeBundle(f"bundle member {name!r} contains '..'")
    return parts


def _resolve_virtual(parts: list[str], symlinks: dict[str, str], hops: list[int], what: str) -> list[str]:
    """Resolve `parts` (relative to the extraction root) through the archive's own symlinks.

    Raises UnsafeBundle as soon as any step leaves the root: a lexical check alone
    is not enough (`m -> .` then `l -> m/..` is lexically "." but really the parent).
    """
    out: list[str] = []
    for part in parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise UnsafeBundle(f"bundle {what} points outside the bundle")
            out.pop()
            continue
        out.append(part)
        target = symlinks.get("/".join(out))
        if target is None:
            continue
        hops[0] += 1
        if hops[0] > MAX_SYMLINK_HOPS:
            raise UnsafeBundle(f"bundle {what} goes through too many symlinks (a loop?)")
        if target.startswith("/"):
            raise UnsafeBundle(f"bundle {what} goes through a symlink to an absolute path {target!r}")
        out.pop()
        out = _resolve_virtual(out + target.split("/"), symlinks, hops, what)
    return out


def check_bundle_members(members: list[tarfile.TarInfo]) -> list[tarfile.TarInfo]:
    """Check every member of a bundle; return the members to extract (without the root entry).

    Refuses: absolute names, '..' in names, symlinks whose target (followed through
    the archive's other symlinks) leaves the bundle, hardlinks to anything but a
    regular file of the bundle, device files and FIFOs, and duplicate names (a
    later duplicate could turn a checked directory into a link).
    """
    symlinks: dict[str, str] = {}
    names: dict[str, tarfile.TarInfo] = {}
    checked: list[tuple[list[str], tarfile.TarInfo]] = []
    for member in members:
        parts = _split_member_name(member.name)
        if not parts:
            if not member.isdir():
                raise UnsafeBundle(f"bundle member {member.name!r} has an empty name")
            continue  # "./": the root itself
        key = "/".join(parts)
        if key in names:
            raise UnsafeBundle(f"bundle member {key!r} appears twice")
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise UnsafeBundle(f"bundle member {key!r} is a device, FIFO or other special file")
        names[key] = member
        if member.issym():
            symlinks[key] = member.linkname
        checked.append((parts, member))

    regular_files = set()
    for parts, member in checked:
        if member.isreg():
            resolved = _resolve_virtual(parts[:-1], symlinks, [0], f"member {member.name!r}") + parts[-1:]
            regular_files.add("/".join(resolved))

    for parts, member in checked:
        what = f"member {member.name!r}"
        # Where the member itself lands: its directory is followed through symlinks.
        parent = _resolve_virtual(parts[:-1], symlinks, [0], what)
        if member.issym():
            if not member.linkname or member.linkname.startswith("/"):
                raise UnsafeBundle(f"bundle symlink {member.name!r} points to an absolute path {member.linkname!r}")
            _resolve_virtual(parent + member.linkname.split("/"), symlinks, [0], f"symlink {member.name!r}")
        elif member.islnk():
            link_parts = _split_member_name(member.linkname)
            resolved = _resolve_virtual(link_parts, symlinks, [0], f"hardlink {member.name!r}")
            if "/".join(resolved) not in regular_files:
                raise UnsafeBundle(
                    f"bundle hardlink {member.name!r} must point to a regular file of the bundle, not {member.linkname!r}"
                )
    return [member for _, member in checked]


def extract_bundle(tar_path: str, dest: str) -> int:
    """Check then extract a bundle into the empty directory `dest`; return the member count."""
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            members = check_bundle_members(tar.getmembers())
            for member in members:
                # No setuid/setgid/sticky, and keep the owner able to read, write and delete it.
                extra = 0o700 if member.isdir() else 0o600
                member.mode = (member.mode & 0o777) | extra
                member.uid = member.gid = 0
                member.uname = member.gname = ""
            kwargs = {}
            if hasattr(tarfile, "data_filter"):
                # Defence in depth where the interpreter has PEP 706 filters; our checks ran first.
                kwargs["filter"] = "data"
            tar.extractall(dest, members=members, numeric_owner=True, **kwargs)
            return len(members)
    except _TAR_FILTER_ERRORS as e:
        raise UnsafeBundle(f"bundle refused by the tar filter: {e}") from None
    except tarfile.TarError as e:
        raise SetupError(f"bundle is not a readable tar archive: {e}") from None


# PEP 706 filter errors subclass TarError but mean "unsafe", so they are caught first.
_TAR_FILTER_ERRORS = (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()


# ---------------------------------------------------------------------------
# GCS over the JSON API, stdlib only


def _utcnow() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def _urllib_request():
    import urllib.request

    return urllib.request


class GcsError(Exception):
    def __init__(self, status: int | None, message: str):
        super().__init__(f"GCS {status}: {message}" if status else f"GCS: {message}")
        self.status = status


class Gcs:
    """Minimal GCS JSON API client: media uploads and downloads.

    `token_url` is the metadata server's token endpoint in production; None for an
    emulator that accepts unauthenticated requests.
    """

    def __init__(self, api_base: str, token_url: str | None = None, timeout: float = 30.0):
        self.api_base = api_base.rstrip("/")
        self.token_url = token_url
        self.timeout = timeout
        self._token: str | None = None
        self._token_expiry = 0.0

    def _auth_headers(self) -> dict[str, str]:
        if not self.token_url:
            return {}
        if self._token is None or time.monotonic() > self._token_expiry:
            request = _urllib_request()
            req = request.Request(self.token_url, headers={"Metadata-Flavor": "Google"})
            with request.urlopen(req, timeout=self.timeout) as resp:
                body = json.loads(resp.read().decode())
            self._token = body["access_token"]
            # Refresh a minute early so a long upload never starts with a dying token.
            self._token_expiry = time.monotonic() + max(0.0, float(body.get("expires_in", 300)) - 60.0)
        return {"Authorization": f"Bearer {self._token}"}

    def _open(self, req):
        request = _urllib_request()
        for name, value in self._auth_headers().items():
            req.add_header(name, value)
        try:
            return request.urlopen(req, timeout=self.timeout)
        except request.HTTPError as e:
            detail = e.read()[:500].decode(errors="replace")
            raise GcsError(e.code, detail) from None
        except (request.URLError, OSError) as e:
            raise GcsError(None, str(e)) from None

    def upload(self, bucket: str, name: str, data: bytes, content_type: str, if_absent: bool = False) -> bool:
        """Upload one object; with if_absent, returns False when it already existed."""
        query = {"uploadType": "media", "name": name}
        if if_absent:
            query["ifGenerationMatch"] = "0"
        url = (
            f"{self.api_base}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?"
            + urllib.parse.urlencode(query)
        )
        req = _urllib_request().Request(url, data=data, method="POST", headers={"Content-Type": content_type})
        try:
            with self._open(req) as resp:
                resp.read()
            return True
        except GcsError as e:
            if if_absent and e.status == 412:
                return False
            raise

    def download_to(self, bucket: str, name: str, path: str) -> int:
        url = (
            f"{self.api_base}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/"
            f"{urllib.parse.quote(name, safe='')}?alt=media"
        )
        size = 0
        with self._open(_urllib_request().Request(url)) as resp, open(path, "wb") as out:
            while True:
                block = resp.read(1 << 20)
                if not block:
                    return size
                out.write(block)
                size += len(block)


def _retry(fn, attempts: int, first_delay: float, retry_if=lambda e: True):
    delay = first_delay
    for i in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - the caller's predicate decides
            if i == attempts - 1 or not retry_if(e):
                raise
            time.sleep(delay)
            delay = min(delay * 2, 30.0)


def _transient_gcs_error(e: Exception) -> bool:
    return isinstance(e, GcsError) and (e.status is None or e.status == 429 or e.status >= 500)


# ---------------------------------------------------------------------------
# Small file and process helpers


def _write_json_atomic(path: str, value) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _lock_is_held(path: str) -> bool:
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


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _signal_group(pgid: int, sig: int) -> None:
    # Never our own group or session: a stale pgid may have been reused by this very SSH session.
    if pgid <= 1 or pgid in (os.getpgid(0), os.getsid(0)):
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _rmtree(path: str) -> None:
    """Remove a tree even when the job left read-only directories in it."""

    def make_writable_and_retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if not os.path.islink(p) and os.path.isdir(p):
                os.chmod(p, 0o700)
            func(p)
        except FileNotFoundError:
            pass

    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, onerror=make_writable_and_retry)


def _emit(result: dict) -> int:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result.get("ok") else 1


# ---------------------------------------------------------------------------
# Spec


def load_spec(text: str) -> dict:
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise SetupError(f"worker spec is not JSON: {e}") from None
    if not isinstance(spec, dict) or spec.get("version") != SPEC_VERSION:
        raise SetupError(f"worker spec version {spec.get('version') if isinstance(spec, dict) else None!r} "
                         f"is not {SPEC_VERSION}")
    for field in ("job_id", "attempt", "attempt_id", "worker_id", "worker_count", "command", "env", "gcs", "job_dir"):
        if field not in spec:
            raise SetupError(f"worker spec has no {field!r}")
    env = spec["env"]
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise SetupError("worker spec env must map strings to strings")
    return spec


def _paths_for(home: str, spec: dict | None) -> WorkerPaths:
    lockfile = (spec or {}).get("libtpu_lockfile") or "/tmp/libtpu_lockfile"
    return WorkerPaths(home, lockfile)


# ---------------------------------------------------------------------------
# Stopping what an earlier attempt left


def _current_state(paths: WorkerPaths) -> dict | None:
    return _read_json(paths.attempt_file("state.json"))


def _supervisor_alive(paths: WorkerPaths) -> bool:
    return _lock_is_held(paths.attempt_file("supervisor.lock"))


def _job_alive(paths: WorkerPaths, state: dict | None) -> bool:
    if _lock_is_held(paths.attempt_file("job.lock")):
        return True
    pgid = (state or {}).get("job_pgid")
    return bool(pgid) and _supervisor_alive(paths) and _group_exists(pgid)


def _request_cancel(paths: WorkerPaths, reason: str, grace: float) -> None:
    _write_json_atomic(paths.attempt_file("cancel"), {"reason": reason, "grace_seconds": grace})


def stop_stale(paths: WorkerPaths, reason: str, grace: float) -> list[str]:
    """Stop an earlier attempt's supervisor and job group; return what was done."""
    notes: list[str] = []
    state = _current_state(paths)
    supervisor_alive = _supervisor_alive(paths)
    pgid = (state or {}).get("job_pgid")
    job_alive = _lock_is_held(paths.attempt_file("job.lock")) or bool(pgid and supervisor_alive and _group_exists(pgid))
    if not (supervisor_alive or job_alive):
        return notes
    old = (state or {}).get("attempt_id")
    notes.append(f"stopping attempt {old} left running")
    if os.path.isdir(paths.attempt_dir):
        _request_cancel(paths, reason, grace)
    if pgid:
        _signal_group(pgid, signal.SIGTERM)
        if not _wait_for(lambda: not _group_exists(pgid), grace):
            _signal_group(pgid, signal.SIGKILL)
            _wait_for(lambda: not _group_exists(pgid), 5.0)
    # Give the old supervisor a moment to flush its logs and write its status, then insist.
    if not _wait_for(lambda: not _supervisor_alive(paths), grace + 5.0):
        spid = (state or {}).get("supervisor_pid")
        if spid:
            _signal_group(spid, signal.SIGKILL)  # the supervisor leads its own session and group
        _wait_for(lambda: not _supervisor_alive(paths), 5.0)
    if _lock_is_held(paths.attempt_file("job.lock")) or _supervisor_alive(paths):
        raise InfraError(f"could not stop attempt {old} left running on this worker")
    return notes


# ---------------------------------------------------------------------------
# libtpu lockfile and caches


def remove_stale_libtpu_lockfile(path: str) -> str | None:
    """Remove the lockfile unless a process holds it (libtpu takes a POSIX lock; flock checked too)."""
    if not os.path.lexists(path):
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return f"cannot open {path} to check it: {e.strerror}"
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return f"{path} is held by a running process; left in place"
        os.unlink(path)
        return f"removed stale {path}"
    except OSError as e:
        return f"cannot remove {path}: {e.strerror}"
    finally:
        os.close(fd)


def sort_caches(cache_root: str, declared: list[dict]) -> list[str]:
    """Keep a cache only if this job declares its key and it is `.ready`; create the missing ones."""
    notes: list[str] = []
    keys = {c["key"] for c in declared}
    os.makedirs(cache_root, exist_ok=True)
    for entry in sorted(os.listdir(cache_root)):
        path = os.path.join(cache_root, entry)
        is_dir = os.path.isdir(path) and not os.path.islink(path)
        if entry in keys and is_dir and os.path.exists(os.path.join(path, ".ready")):
            notes.append(f"cache {entry}: kept")
            continue
        why = "not declared by this job" if entry not in keys else "incomplete"
        _rmtree(path)
        notes.append(f"cache {entry}: deleted ({why})")
    for key in sorted(keys):
        os.makedirs(os.path.join(cache_root, key), exist_ok=True)
    return notes


def link_cache(job_dir: str, rel_path: str, cache_dir: str) -> None:
    """Make JOB_DIR/<rel_path> a symlink to the cache directory (outside the workspace)."""
    parts = [p for p in rel_path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or rel_path.startswith("/"):
        raise SetupError(f"cache path {rel_path!r} must be a relative path inside the job directory")
    target = os.path.join(job_dir, *parts)
    parent = os.path.dirname(target)
    real_job_dir = os.path.realpath(job_dir)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise SetupError(f"cache path {rel_path!r}: cannot create its directory: {e.strerror}") from None
    real_parent = os.path.realpath(parent)
    if real_parent != real_job_dir and not real_parent.startswith(real_job_dir + os.sep):
        raise SetupError(f"cache path {rel_path!r} leads outside the job directory through a bundle symlink")
    if os.path.lexists(target):
        raise SetupError(f"cache path {rel_path!r} already exists in the bundle; remove it from the bundle")
    os.symlink(cache_dir, target)


# ---------------------------------------------------------------------------
# Status objects


def _disk_and_memory(home: str) -> tuple[dict, dict]:
    disk: dict = {"path": home}
    try:
        st = os.statvfs(home)
        disk.update(free_bytes=st.f_bavail * st.f_frsize, total_bytes=st.f_blocks * st.f_frsize)
    except OSError:
        pass
    memory: dict = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    memory["total_bytes" if name == "MemTotal" else "available_bytes"] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return disk, memory


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    text = data.decode(errors="replace")
    if size > TAIL_BYTES and "\n" in text:
        text = text.split("\n", 1)[1]  # drop the cut first line
    return text


def build_status(spec: dict, paths: WorkerPaths, **fields) -> dict:
    disk, memory = _disk_and_memory(paths.home)
    status = {
        "version": STATUS_VERSION,
        "job_id": spec["job_id"],
        "attempt": spec["attempt"],
        "attempt_id": spec["attempt_id"],
        "worker_id": spec["worker_id"],
        "worker_count": spec["worker_count"],
        "phase": "run",
        "exit_code": None,
        "signal": None,
        "cancelled": False,
        "cancel_reason": None,
        "preempted": False,
        "setup_error": None,
        "started_at": None,
        "ended_at": _utcnow(),
        "log_chunks": 0,
        "log_bytes": 0,
        "log_error": None,  # set when the logs did not all reach GCS: "could not be written to gs://B: why"
        "tail": "",
        "disk": disk,
        "memory": memory,
    }
    status.update(fields)
    return status


def publish_status(spec: dict, status: dict, deadline_seconds: float | None = None) -> None:
    """Write the per-worker status object exactly once (ifGenerationMatch=0), retrying until the deadline."""
    gcs_cfg = spec["gcs"]
    if deadline_seconds is None:
        deadline_seconds = float(gcs_cfg.get("status_deadline_seconds") or STATUS_UPLOAD_DEADLINE_SECONDS)
    gcs = Gcs(gcs_cfg["api_base"], gcs_cfg.get("token_url"))
    data = json.dumps(status, indent=1).encode()
    deadline = time.monotonic() + deadline_seconds
    delay = 0.5
    while True:
        try:
            gcs.upload(gcs_cfg.get("status_bucket") or gcs_cfg["bucket"], gcs_cfg["status_object"], data,
                       "application/json", if_absent=True)
            return
        except Exception:  # noqa: BLE001 - any failure: retry until the deadline
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 30.0)


# ---------------------------------------------------------------------------
# prepare


def _already_here(paths: WorkerPaths, attempt_id: str) -> bool:
    """An earlier delivery of the same assignment prepared, launched or cancelled this attempt.

    A prepare that failed half-way (no `prepared`) is done again.
    """
    spec = _read_json(paths.attempt_file("spec.json")) or {}
    if spec.get("attempt_id") != attempt_id:
        return False
    return any(os.path.exists(paths.attempt_file(name)) for name in ("prepared", "state.json", "cancel"))


def prepare(paths_home: str, spec_text: str) -> dict:
    try:
        spec = load_spec(spec_text)
    except SetupError as e:
        return {"ok": False, "kind": "setup", "reason": str(e)}
    paths = _paths_for(paths_home, spec)
    try:
        if spec["job_dir"] != paths.job_dir:
            raise SetupError(f"spec JOB_DIR {spec['job_dir']!r} is not this worker's {paths.job_dir!r}")
        if _already_here(paths, spec["attempt_id"]):
            return {"ok": True, "already": True, "notes": []}
        notes = _prepare_workspace(paths, spec)
        return {"ok": True, "already": False, "notes": notes}
    except SetupError as e:
        reason = str(e)
        try:
            publish_status(spec, build_status(spec, paths, phase="setup", setup_error=reason), deadline_seconds=60.0)
        except Exception as upload_error:  # noqa: BLE001
            reason += f" (and the status object could not be written: {upload_error})"
        return {"ok": False, "kind": "setup", "reason": reason}
    except InfraError as e:
        return {"ok": False, "kind": "infra", "reason": str(e)}
    except OSError as e:
        return {"ok": False, "kind": "infra", "reason": f"{e.__class__.__name__}: {e}"}


def _prepare_workspace(paths: WorkerPaths, spec: dict) -> list[str]:
    notes = stop_stale(paths, f"superseded by attempt {spec['attempt_id']}", float(spec.get("stale_grace_seconds", 10)))
    _rmtree(paths.attempt_dir)
    _rmtree(paths.job_dir)
    os.makedirs(paths.attempt_dir)
    os.makedirs(paths.job_dir)
    _write_json_atomic(paths.attempt_file("spec.json"), spec)

    lock_note = remove_stale_libtpu_lockfile(paths.libtpu_lockfile)
    if lock_note:
        notes.append(lock_note)

    caches = spec.get("caches") or []
    for cache in caches:
        key = cache.get("key", "")
        if not key or "/" in key or key in (".", ".."):
            raise SetupError(f"cache key {key!r} is not a plain name")
    try:
        notes += sort_caches(paths.cache_root, caches)
    except OSError as e:
        raise SetupError(f"cache directory {paths.cache_root}: {e.strerror or e}") from None

    bundle = spec.get("bundle")
    if bundle:
        notes.append(_fetch_bundle(paths, spec, bundle))

    for cache in caches:
        link_cache(paths.job_dir, cache["path"], os.path.join(paths.cache_root, cache["key"]))

    with open(paths.attempt_file("prepared"), "w") as f:
        f.write(spec["attempt_id"])
    return notes


def _fetch_bundle(paths: WorkerPaths, spec: dict, bundle: dict) -> str:
    gcs_cfg = spec["gcs"]
    gcs = Gcs(gcs_cfg["api_base"], gcs_cfg.get("token_url"))
    tar_path = paths.attempt_file("bundle.tar")
    where = f"gs://{bundle['bucket']}/{bundle['object']}"
    try:
        size = _retry(
            lambda: gcs.download_to(bundle["bucket"], bundle["object"], tar_path),
            4,
            float(gcs_cfg.get("retry_delay_seconds", 0.5)),
            _transient_gcs_error,
        )
    except GcsError as e:
        if e.status == 404:
            raise SetupError(f"bundle {where} does not exist") from None
        if e.status in (401, 403):
            raise SetupError(f"bundle {where} cannot be read: {e}") from None
        raise InfraError(f"bundle {where} could not be downloaded: {e}") from None
    try:
        count = extract_bundle(tar_path, paths.job_dir)
    finally:
        os.unlink(tar_path)
    return f"bundle {where}: {size} bytes, {count} entries"


# ---------------------------------------------------------------------------
# launch


def bootstrap_argv(python: str, script_path: str, *args: str) -> list[str]:
    """argv that runs `script_path`'s main(args) with `python` through BOOTSTRAP."""
    directory, filename = os.path.split(os.path.abspath(script_path))
    return [python, "-I", "-S", "-c", BOOTSTRAP, directory, os.path.splitext(filename)[0], *args]


def launch(home: str, attempt_id: str, script_path: str, wait_seconds: float = 20.0) -> dict:
    paths = WorkerPaths(home)
    spec = _read_json(paths.attempt_file("spec.json"))
    if not spec or spec.get("attempt_id") != attempt_id:
        return {"ok": False, "kind": "infra", "reason": f"attempt {attempt_id} is not prepared on this worker"}
    paths = _paths_for(home, spec)
    state = _current_state(paths)
    if (state and state.get("attempt_id") == attempt_id) or os.path.exists(paths.attempt_file("status.json")):
        return {"ok": True, "already": True, "state": state}
    if os.path.exists(paths.attempt_file("cancel")):
        return {"ok": False, "kind": "cancelled", "reason": f"attempt {attempt_id} was cancelled before launch"}
    try:
        with open(paths.attempt_file("prepared")) as f:
            prepared = f.read().strip()
    except OSError:
        prepared = None
    if prepared != attempt_id:
        return {"ok": False, "kind": "infra", "reason": f"attempt {attempt_id} was not prepared completely"}
    err = open(paths.attempt_file("supervisor.err"), "ab")
    try:
        # A new session: no controlling terminal, so closing the SSH channel sends it nothing.
        proc = subprocess.Popen(
            bootstrap_argv(sys.executable, script_path, "--home", home, "supervise"),
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            start_new_session=True,
            close_fds=True,
            cwd=paths.root,
        )
    finally:
        err.close()

    def started():
        s = _current_state(paths)
        return s if s and s.get("attempt_id") == attempt_id and s.get("job_pgid") else None

    if not _wait_for(lambda: started() or proc.poll() is not None, wait_seconds, interval=0.01):
        return {"ok": False, "kind": "infra", "reason": "the supervisor did not start the job in time"}
    state = started()
    if state is None:
        if os.path.exists(paths.attempt_file("status.json")):
            return {"ok": True, "already": False, "state": None, "ended": True}
        return {"ok": False, "kind": "infra", "reason": f"the supervisor exited with {proc.returncode}: "
                + _tail(paths.attempt_file("supervisor.err"))[-500:]}
    return {"ok": True, "already": False, "state": state}


# ---------------------------------------------------------------------------
# supervise


class _OutputPump:
    """Reads the job's merged stdout/stderr into a local file and a buffer for GCS."""

    def __init__(self, fd: int, log_path: str):
        self._fd = fd
        self._log = open(log_path, "ab")
        self._buffer = bytearray()
        self._dropped = 0
        self._lock = threading.Lock()
        self.eof = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                try:
                    block = os.read(self._fd, 65536)
                except InterruptedError:
                    continue
                if not block:
                    break
                self._log.write(block)
                self._log.flush()
                with self._lock:
                    self._buffer += block
                    overflow = len(self._buffer) - LOG_BUFFER_LIMIT
                    if overflow > 0:
                        # GCS has been unreachable for a while: keep the newest output.
                        del self._buffer[:overflow]
                        self._dropped += overflow
        finally:
            os.close(self._fd)
            self._log.close()
            self.eof.set()

    def take(self) -> bytes:
        with self._lock:
            data = bytes(self._buffer[:LOG_CHUNK_LIMIT])
            if self._dropped:
                data = f"[tpuq: {self._dropped} bytes of output dropped while GCS was unreachable]\n".encode() + data
                self._dropped = 0
            del self._buffer[:LOG_CHUNK_LIMIT]
            return data

    def put_back(self, data: bytes) -> None:
        with self._lock:
            self._buffer[:0] = data

    def pending(self) -> bool:
        with self._lock:
            return bool(self._buffer) or bool(self._dropped)


class _LogUploader:
    def __init__(self, spec: dict):
        cfg = spec["gcs"]
        self._gcs = Gcs(cfg["api_base"], cfg.get("token_url"))
        self._bucket = cfg["bucket"]
        self._prefix = cfg["log_prefix"]
        self.chunks = 0
        self.bytes = 0
        self.last_error: str | None = None  # the latest failed upload's reason (e.g. "GCS 403: ...")

    def flush(self, pump: _OutputPump) -> bool:
        """Upload what is buffered as the next chunk; on failure keep it for the next try."""
        while pump.pending():
            data = pump.take()
            name = f"{self._prefix}{self.chunks:06d}.txt"
            try:
                # if_absent: a retried upload whose first try landed must not overwrite a later chunk.
                self._gcs.upload(self._bucket, name, data, "text/plain; charset=utf-8", if_absent=True)
            except Exception as e:  # noqa: BLE001 - keep the data, try again at the next interval
                pump.put_back(data)
                self.last_error = " ".join(str(e).split())[:160]
                return False
            self.chunks += 1
            self.bytes += len(data)
        return True

    def failure(self) -> str:
        """For the status: the logs did not all reach GCS (the job's output is still in the local output.log)."""
        return f"could not be written to gs://{self._bucket}: {self.last_error or 'unknown error'}"


def _exit_code_and_signal(returncode: int) -> tuple[int, str | None]:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return SIGNAL_EXIT_BASE - returncode, name
    return returncode, None


def _preempted(url: str | None) -> bool:
    if not url:
        return False
    try:
        request = _urllib_request()
        req = request.Request(url, headers={"Metadata-Flavor": "Google"})
        with request.urlopen(req, timeout=2.0) as resp:
            return resp.read().decode().strip().upper() == "TRUE"
    except Exception:  # noqa: BLE001 - no answer is "not known to be preempted"
        return False


def _become_subreaper() -> None:
    """Adopt the job's orphans so they are reaped at once (PR_SET_CHILD_SUBREAPER).

    Otherwise a killed grandchild stays a zombie until init gets to it, and its
    process group looks alive to `stop_stale` and `cancel` for that long.
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except Exception:  # noqa: BLE001 - an optimisation only
        pass


class _Reaper:
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


def supervise(home: str) -> int:
    paths = WorkerPaths(home)
    spec = load_spec(open(paths.attempt_file("spec.json")).read())
    paths = _paths_for(home, spec)
    supervisor_lock = os.open(paths.attempt_file("supervisor.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(supervisor_lock, fcntl.LOCK_EX)
    _become_subreaper()

    cancel_signalled = threading.Event()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: cancel_signalled.set())
    signal.signal(signal.SIGINT, lambda *_: cancel_signalled.set())

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SSH_", "TPUQ_"))}
    env.update(spec["env"])
    env["TPUQ_ATTEMPT_ID"] = spec["attempt_id"]

    # The job inherits this lock: while any of its processes keeps the fd, the job counts as alive.
    job_lock = os.open(paths.attempt_file("job.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(job_lock, fcntl.LOCK_EX)
    read_fd, write_fd = os.pipe()
    started_at = _utcnow()
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", spec["command"]],
            cwd=paths.job_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,
            pass_fds=(job_lock,),
        )
    except OSError as e:
        os.close(write_fd)
        os.close(read_fd)
        os.close(job_lock)
        status = build_status(spec, paths, phase="setup", setup_error=f"cannot start the command: {e}",
                              started_at=started_at)
        _write_and_publish_status(paths, spec, status)
        return 0
    os.close(write_fd)
    os.close(job_lock)  # the child holds it now
    pgid = proc.pid
    reaper = _Reaper(proc.pid)
    _write_json_atomic(
        paths.attempt_file("state.json"),
        {"attempt_id": spec["attempt_id"], "supervisor_pid": os.getpid(), "job_pgid": pgid, "started_at": started_at},
    )

    pump = _OutputPump(read_fd, paths.attempt_file("output.log"))
    uploader = _LogUploader(spec)
    flush_every = min(float(spec.get("log_flush_seconds", 2.0)), 5.0)
    cancel_file = paths.attempt_file("cancel")
    cancel_reason = None
    kill_at = None
    next_flush = time.monotonic() + flush_every

    while reaper.leader_returncode is None:
        reaper.reap()
        now = time.monotonic()
        if cancel_reason is None and (cancel_signalled.is_set() or os.path.exists(cancel_file)):
            request = _read_json(cancel_file) or {}
            cancel_reason = request.get("reason") or "cancelled"
            grace = float(request.get("grace_seconds", spec.get("cancel_grace_seconds", 30)))
            _signal_group(pgid, signal.SIGTERM)
            kill_at = now + grace
        if kill_at is not None and now >= kill_at:
            _signal_group(pgid, signal.SIGKILL)
            kill_at = None
        if now >= next_flush:
            uploader.flush(pump)
            next_flush = now + flush_every
        time.sleep(0.1)

    proc.returncode = reaper.leader_returncode  # we reaped it; keep Popen from waiting again
    # The leader is gone; background children may still hold the output pipe. End them too.
    if not pump.eof.wait(EOF_AFTER_EXIT_SECONDS):
        _signal_group(pgid, signal.SIGTERM)
        if not pump.eof.wait(EOF_AFTER_EXIT_SECONDS):
            _signal_group(pgid, signal.SIGKILL)
            pump.eof.wait(EOF_AFTER_EXIT_SECONDS)
    _wait_for(lambda: reaper.reap() or not _group_exists(pgid), EOF_AFTER_EXIT_SECONDS)
    if cancel_reason is None and os.path.exists(cancel_file):
        cancel_reason = (_read_json(cancel_file) or {}).get("reason") or "cancelled"

    exit_code, signal_name = _exit_code_and_signal(proc.returncode)
    if exit_code == 0 and cancel_reason is None:
        for cache in spec.get("caches") or []:
            ready = os.path.join(paths.cache_root, cache["key"], ".ready")
            try:
                with open(ready, "w") as f:
                    f.write(spec["attempt_id"])
            except OSError:
                pass
    preempted = exit_code != 0 and cancel_reason is None and _preempted(spec.get("preempted_url"))

    logs_written = False
    for _ in range(3):
        if uploader.flush(pump):
            logs_written = True
            break
        time.sleep(1.0)
    status = build_status(
        spec,
        paths,
        exit_code=exit_code,
        signal=signal_name,
        cancelled=cancel_reason is not None,
        cancel_reason=cancel_reason,
        preempted=preempted,
        started_at=started_at,
        log_chunks=uploader.chunks,
        log_bytes=uploader.bytes,
        log_error=None if logs_written else uploader.failure(),
        tail=_tail(paths.attempt_file("output.log")),
    )
    _write_and_publish_status(paths, spec, status)
    return 0


def _write_and_publish_status(paths: WorkerPaths, spec: dict, status: dict) -> None:
    """Keep the final status here, then in GCS. If GCS refuses it for good, the local copy says why, so that
    the executor's probe (`status`) can end the attempt with that reason instead of waiting for ever."""
    _write_json_atomic(paths.attempt_file("status.json"), status)
    try:
        publish_status(spec, status)
    except Exception as e:  # noqa: BLE001 - recorded, then raised: the supervisor ends with an error
        gcs_cfg = spec["gcs"]
        where = f"gs://{gcs_cfg.get('status_bucket') or gcs_cfg['bucket']}/{gcs_cfg['status_object']}"
        status = dict(status, status_upload_error=f"the status object {where} could not be written: "
                                                  + " ".join(str(e).split())[:300])
        _write_json_atomic(paths.attempt_file("status.json"), status)
        raise


# ---------------------------------------------------------------------------
# cancel and status


def cancel(home: str, attempt_id: str, reason: str, grace: float | None) -> dict:
    paths = WorkerPaths(home)
    state = _current_state(paths) or {}
    spec = _read_json(paths.attempt_file("spec.json")) or {}
    if spec.get("attempt_id") != attempt_id:
        return {"ok": True, "state": "not_current", "current": spec.get("attempt_id")}
    if grace is None:
        grace = float(spec.get("cancel_grace_seconds", 30))
    if _supervisor_alive(paths):
        _request_cancel(paths, reason, grace)
        spid = state.get("supervisor_pid")
        if spid:
            try:
                os.kill(spid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass  # it also polls the cancel file
        return {"ok": True, "state": "signalled"}
    if _lock_is_held(paths.attempt_file("job.lock")) and state.get("job_pgid"):
        # The supervisor died (e.g. killed by hand): stop the orphaned group ourselves.
        pgid = state["job_pgid"]
        _signal_group(pgid, signal.SIGTERM)
        if not _wait_for(lambda: not _lock_is_held(paths.attempt_file("job.lock")), grace):
            _signal_group(pgid, signal.SIGKILL)
        return {"ok": True, "state": "stopped_orphan"}
    # Not launched yet (or already over): make sure a later launch of this attempt does nothing.
    _request_cancel(paths, reason, grace)
    try:
        os.unlink(paths.attempt_file("prepared"))
    except FileNotFoundError:
        pass
    return {"ok": True, "state": "not_running"}


def status(home: str, attempt_id: str | None) -> dict:
    paths = WorkerPaths(home)
    spec = _read_json(paths.attempt_file("spec.json")) or {}
    current = spec.get("attempt_id")
    if attempt_id is not None and current != attempt_id:
        return {"ok": True, "attempt_id": current, "current": False, "supervisor_alive": False,
                "job_alive": False, "status": None}
    state = _current_state(paths)
    return {
        "ok": True,
        "attempt_id": current,
        "current": True,
        "prepared": os.path.exists(paths.attempt_file("prepared")),
        "launched": state is not None,
        "supervisor_alive": _supervisor_alive(paths),
        "job_alive": _job_alive(paths, state),
        "status": _read_json(paths.attempt_file("status.json")),
    }


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpuq-supervisor")
    parser.add_argument("--home", default=os.path.expanduser("~"))
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare")
    p_launch = sub.add_parser("launch")
    p_launch.add_argument("--attempt-id", required=True)
    p_cancel = sub.add_parser("cancel")
    p_cancel.add_argument("--attempt-id", required=True)
    p_cancel.add_argument("--reason", default="cancelled")
    p_cancel.add_argument("--grace", type=float, default=None)
    p_status = sub.add_parser("status")
    p_status.add_argument("--attempt-id", default=None)
    sub.add_parser("supervise")
    args = parser.parse_args(argv)
    home = os.path.abspath(args.home)

    if args.command == "prepare":
        return _emit(prepare(home, sys.stdin.read()))
    if args.command == "launch":
        return _emit(launch(home, args.attempt_id, os.path.abspath(__file__)))
    if args.command == "cancel":
        return _emit(cancel(home, args.attempt_id, args.reason, args.grace))
    if args.command == "status":
        return _emit(status(home, args.attempt_id))
    return supervise(home)


if __name__ == "__main__":
    sys.exit(main())
