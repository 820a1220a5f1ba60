"""The worker preflight (tpuq.executor.worker.preflight): TPU devices held by another process, libtpu's lock held,
too little disk. Against a fake /proc tree, and against real processes holding temp files (the "devices" and the
lock file are temp files, so nothing on the machine is touched and no other test's process is seen)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuq.contracts import gcslayout
from tpuq.executor.supervisor_bundle import build_supervisor_script
from tpuq.executor.worker.control import bootstrap_argv
from tpuq.executor.worker.preflight import (PreflightFailed, disk_findings, parse_proc_locks, preflight_findings,
                                            run_preflight)
from tpuq.executor.workerspec import AttemptPlan, WorkerSettings

from .factories import make_assignment

WORKER_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def fake_proc(root: Path, pid: int, cmdline: bytes, fds: dict[str, str]) -> None:
    """/proc/PID with a command line and fd symlinks, as the kernel shows them."""
    (root / str(pid) / "fd").mkdir(parents=True)
    (root / str(pid) / "cmdline").write_bytes(cmdline)
    for fd, target in fds.items():
        os.symlink(target, root / str(pid) / "fd" / fd)


@pytest.fixture
def devices(tmp_path) -> tuple[Path, tuple[str, ...]]:
    """A host's TPU device files (as C's fake hosts have them) and the globs that find them."""
    dev = tmp_path / "dev"
    (dev / "vfio").mkdir(parents=True)
    for name in ("vfio/0", "vfio/vfio", "accel0", "accel1"):
        (dev / name).write_text("")
    return dev, (f"{dev}/accel*", f"{dev}/vfio/*")


def findings(proc, globs, lock, min_free=0, home="/"):
    return preflight_findings(str(proc), globs, str(lock), [home], min_free)


def test_a_held_device_names_its_pid_and_command(tmp_path, devices):
    dev, globs = devices
    proc = tmp_path / "proc"
    fake_proc(proc, 4711, b"python3\x00train.py\x00--steps\x00100\x00", {"0": "/dev/null", "7": f"{dev}/vfio/0"})
    fake_proc(proc, 4712, b"sshd: tpu\x00", {"3": "socket:[123]"})
    assert findings(proc, globs, tmp_path / "nolock") == [
        f"{dev}/vfio/0 is held by pid 4711 (python3 train.py --steps 100)"]


def test_every_device_and_holder_is_named_and_the_comm_stands_in_for_an_empty_cmdline(tmp_path, devices):
    dev, globs = devices
    proc = tmp_path / "proc"
    fake_proc(proc, 20, b"", {"3": f"{dev}/accel0", "4": f"{dev}/accel0"})  # a kernel thread-like empty cmdline
    (proc / "20" / "comm").write_text("tpu_runtime\n")
    fake_proc(proc, 30, b"python3\x00serve.py\x00", {"5": f"{dev}/accel0", "6": f"{dev}/accel1"})
    assert findings(proc, globs, tmp_path / "nolock") == [
        f"{dev}/accel0 is held by pid 20 (tpu_runtime), pid 30 (python3 serve.py)",
        f"{dev}/accel1 is held by pid 30 (python3 serve.py)",
    ]


def test_our_own_pid_unreadable_entries_and_other_files_are_skipped(tmp_path, devices):
    dev, globs = devices
    proc = tmp_path / "proc"
    fake_proc(proc, os.getpid(), b"python3\x00", {"3": f"{dev}/vfio/0"})  # the preflight itself
    (proc / "99").mkdir()
    (proc / "99" / "fd").write_text("not a directory")  # what another user's /proc/PID/fd is to us: unreadable
    (proc / "self").mkdir()
    fake_proc(proc, 50, b"cat\x00", {"3": f"{dev}/notatpu"})
    os.symlink(str(dev / "vfio/0"), proc / "50" / "cmdline-link")  # not under fd/: ignored
    assert findings(proc, globs, tmp_path / "nolock") == []


def test_a_real_process_holding_a_device_file_is_found_in_the_real_proc(tmp_path, devices):
    dev, globs = devices
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; f = open(sys.argv[1]); print('open', flush=True); sys.stdin.read()",
         str(dev / "vfio/0")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        [found] = findings("/proc", globs, tmp_path / "nolock")
        assert found.startswith(f"{dev}/vfio/0 is held by pid {holder.pid} ({sys.executable} -c import sys")
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert findings("/proc", globs, tmp_path / "nolock") == []  # released: the host is fit again


# /proc/locks as the kernel writes it (fs/locks.c lock_get_status): major:minor in hex, then the inode.
PROC_LOCKS = """\
1: POSIX  ADVISORY  WRITE 4711 fd:01:1048577 0 EOF
1: -> POSIX  ADVISORY  WRITE 4800 fd:01:1048577 0 EOF
2: FLOCK  ADVISORY  WRITE 812 00:1a:77 0 EOF
3: OFDLCK ADVISORY  READ  -1 00:06:9 0 EOF
garbage line
"""


def test_proc_locks_are_parsed_held_locks_only():
    assert parse_proc_locks(PROC_LOCKS) == [
        ("POSIX", 4711, 0xFD, 0x01, 1048577),
        ("FLOCK", 812, 0x00, 0x1A, 77),
        ("OFDLCK", -1, 0x00, 0x06, 9),
    ]


def test_the_lock_file_locked_in_a_fake_proc_names_the_holder(tmp_path):
    lock = tmp_path / "libtpu_lockfile"
    lock.write_text("")
    st = os.stat(lock)
    proc = tmp_path / "proc"
    fake_proc(proc, 4711, b"python3\x00train.py\x00", {})
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    # (the other file's inode is never the lock file's: changing its last digit to 0 was, for an inode ending in 0)
    (proc / "locks").write_text(f"1: POSIX  ADVISORY  WRITE 4711 {device}:{st.st_ino} 0 EOF\n"
                                f"2: POSIX  ADVISORY  WRITE 4712 {device}:{st.st_ino + 1} 0 EOF\n")  # another file
    assert findings(proc, (), lock) == [f"libtpu's lock file {lock} is locked by pid 4711 (python3 train.py) (POSIX)"]


@pytest.mark.parametrize("how", ["lockf", "flock"])
def test_a_real_lock_on_the_lock_file_is_found_and_an_open_file_without_it_is_not(tmp_path, how):
    lock = tmp_path / "libtpu_lockfile"
    take = {"lockf": "fcntl.lockf(fd, fcntl.LOCK_EX)", "flock": "fcntl.flock(fd, fcntl.LOCK_EX)"}[how]
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDWR|os.O_CREAT); {take};"
         " print('locked', flush=True); sys.stdin.read()", str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        [finding] = findings("/proc", (), lock)
        kind = {"lockf": "POSIX", "flock": "FLOCK"}[how]
        assert finding.startswith(f"libtpu's lock file {lock} is locked by pid {holder.pid} (")
        assert finding.endswith(f"({kind})")
    finally:
        holder.stdin.close()
        holder.wait(10)
    opener = subprocess.Popen([sys.executable, "-c", "import sys; f=open(sys.argv[1]); print('open', flush=True);"
                               " sys.stdin.read()", str(lock)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert opener.stdout.readline().strip() == "open"
        assert findings("/proc", (), lock) == []  # open without the lock: libtpu's lockf succeeds
    finally:
        opener.stdin.close()
        opener.wait(10)


def test_too_little_disk_is_a_finding():
    assert disk_findings({"/home/u": 300 * 2**20, "/data": 5 * 2**30}, 2**30) == [
        "only 0.3 GiB free on /home/u (the preflight asks for 1.0 GiB, for the bundle and the caches)"]
    [finding] = preflight_findings("/nonexistent-proc", (), "/nonexistent-lock", ["/"], 2**62)
    assert finding.startswith("only ") and "free on / " in finding


def test_run_preflight_reads_its_checks_from_the_spec_and_raises_an_infra_error(tmp_path, devices):
    dev, globs = devices
    proc = tmp_path / "proc"
    fake_proc(proc, 4711, b"python3\x00train.py\x00", {"7": f"{dev}/vfio/0"})
    spec = {"preflight": {"proc_root": str(proc), "device_globs": list(globs), "min_free_bytes": 0}}
    with pytest.raises(PreflightFailed, match=r"vfio/0 is held by pid 4711 \(python3 train.py\)"):
        run_preflight(spec, str(tmp_path / "nolock"), [str(tmp_path)])
    run_preflight({}, str(tmp_path / "nolock"), [str(tmp_path)])  # a spec without checks: none run


def test_the_worker_spec_carries_the_checks_from_worker_settings():
    settings = WorkerSettings(proc_root="/host/proc", tpu_device_globs=("/d/accel*",), preflight_min_free_bytes=5)
    spec = AttemptPlan.from_assignment(make_assignment()).worker_spec(0, "/home/u", settings)
    assert spec["preflight"] == {"proc_root": "/host/proc", "device_globs": ["/d/accel*"], "min_free_bytes": 5}
    assert WorkerSettings().tpu_device_globs == ("/dev/accel*", "/dev/vfio/*")  # libtpu's device files


def test_prepare_on_a_dirty_host_writes_a_preflight_status_and_launches_nothing(tmp_path, devices, fake_gcs, bucket):
    """The bundled supervisor, as the executor runs it over SSH: `prepare` answers kind `preflight` (not `setup`,
    which is terminal), names what held the device, and writes the status object with phase `preflight`."""
    dev, globs = devices
    script = tmp_path / "bin" / Path(gcslayout.WORKER_SUPERVISOR).name
    script.parent.mkdir()
    script.write_bytes(build_supervisor_script())
    home = tmp_path / "home"
    home.mkdir()
    settings = WorkerSettings.for_emulator(fake_gcs.base_url, libtpu_lockfile=str(tmp_path / "lock"),
                                           tpu_device_globs=globs, gcs_retry_delay_seconds=0.01)
    a = make_assignment(bucket=bucket)
    spec = AttemptPlan.from_assignment(a).worker_spec(1, str(home), settings)

    def run(*args, stdin=""):
        out = subprocess.run(bootstrap_argv(WORKER_PYTHON, str(script), "--home", str(home), *args),
                             input=stdin, capture_output=True, text=True, timeout=60)
        return json.loads(out.stdout)

    holder = subprocess.Popen(["sleep", "300"], stdin=open(dev / "vfio/0"))  # fd 0 holds the device
    try:
        result = run("prepare", stdin=json.dumps(spec))
        assert (result["ok"], result["kind"]) == (False, "preflight")
        assert result["reason"] == f"{dev}/vfio/0 is held by pid {holder.pid} (sleep 300)"
        status = fake_gcs.read_json(bucket, gcslayout.worker_status_name(a.job_id, a.attempt, 1))
        assert (status["phase"], status["preflight_error"], status["setup_error"]) == (
            "preflight", result["reason"], None)
        assert run("launch", "--attempt-id", a.attempt_id)["ok"] is False
    finally:
        holder.kill()
        holder.wait(10)


def test_without_a_proc_locks_the_lock_is_tried_and_its_holder_reported_unnamed(tmp_path):
    lock = tmp_path / "libtpu_lockfile"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDWR|os.O_CREAT);"
         " fcntl.lockf(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()", str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert findings(tmp_path / "no-proc", (), lock) == [
            f"libtpu's lock file {lock} is locked by a process outside this host's view of processes (lockf or flock)"]
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert findings(tmp_path / "no-proc", (), lock) == []  # and the try let go of it
    assert findings("/proc", (), lock) == []
