"""`supervise`: the detached process that runs the job, streams its logs, obeys cancels and reports the end."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time

from .files import WorkerPaths, read_json, write_json_atomic
from .logs import LogUploader, OutputPump
from .notice import NoticeWatcher, read_notice
from .processes import Reaper, become_subreaper, exit_code_and_signal, group_exists, signal_group, wait_for
from .spec import load_spec, paths_for
from .status import build_status, tail, utcnow, write_and_publish_status

EOF_AFTER_EXIT_SECONDS = 0.5  # then background children still holding the output pipe are stopped
NOTICE_AFTER_EXIT_TIMEOUT_SECONDS = 2.0


def supervise(home: str) -> int:
    paths = WorkerPaths(home)
    spec = load_spec(open(paths.attempt_file("spec.json")).read())
    paths = paths_for(home, spec)
    supervisor_lock = os.open(paths.attempt_file("supervisor.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(supervisor_lock, fcntl.LOCK_EX)
    become_subreaper()

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
    started_at = utcnow()
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
        write_and_publish_status(paths, spec, status)
        return 0
    os.close(write_fd)
    os.close(job_lock)  # the child holds it now
    pgid = proc.pid
    reaper = Reaper(proc.pid)
    write_json_atomic(
        paths.attempt_file("state.json"),
        {"attempt_id": spec["attempt_id"], "supervisor_pid": os.getpid(), "job_pgid": pgid, "started_at": started_at},
    )

    pump = OutputPump(read_fd, paths.attempt_file("output.log"))
    uploader = LogUploader(spec)
    flush_every = min(float(spec.get("log_flush_seconds", 2.0)), 5.0)
    cancel_file = paths.attempt_file("cancel")
    cancel_reason = None
    notice = None  # the preemption or maintenance notice, once seen while the job ran
    timed_out = False
    kill_at = None
    next_flush = time.monotonic() + flush_every
    max_duration = spec.get("max_duration_seconds")
    time_limit_at = time.monotonic() + float(max_duration) if max_duration else None
    cancel_grace = float(spec.get("cancel_grace_seconds", 30))
    watcher = NoticeWatcher(spec).start()  # its own thread: this loop never waits on the metadata server

    def stop_job(now: float, grace: float) -> float:
        """TERM the job's group now (so it can checkpoint); the time to KILL it, kept if one is sooner."""
        signal_group(pgid, signal.SIGTERM)
        return min(kill_at, now + grace) if kill_at is not None else now + grace

    while reaper.leader_returncode is None:
        reaper.reap()
        now = time.monotonic()
        stopping = cancel_reason is not None or notice is not None or timed_out
        if cancel_reason is None and os.path.exists(cancel_file):
            request = read_json(cancel_file) or {}
            cancel_reason = request.get("reason") or "cancelled"
            kill_at = stop_job(now, float(request.get("grace_seconds", cancel_grace)))
        elif not stopping and cancel_signalled.is_set():
            # A SIGTERM with no cancel request (`cancel` writes one first): the VM shutting down, as on a
            # preemption, signals every process. Asked once: a notice makes it a preemption, not a cancel.
            notice = watcher.notice or read_notice(spec)
            if notice is None:
                cancel_reason = "cancelled"
            kill_at = stop_job(now, float(spec.get("preemption_grace_seconds", cancel_grace)) if notice
                               else cancel_grace)
        elif not stopping and watcher.notice:
            notice = watcher.notice
            kill_at = stop_job(now, float(spec.get("preemption_grace_seconds", cancel_grace)))
        elif not stopping and time_limit_at is not None and now >= time_limit_at:
            timed_out = True
            kill_at = stop_job(now, cancel_grace)
        if kill_at is not None and now >= kill_at:
            signal_group(pgid, signal.SIGKILL)
            kill_at = None
        if now >= next_flush:
            uploader.flush(pump)
            next_flush = now + flush_every
        time.sleep(0.02)  # how soon the job's end is noticed: the next job on this TPU waits for it

    watcher.stop()
    proc.returncode = reaper.leader_returncode  # we reaped it; keep Popen from waiting again
    # Stopping with a grace (a notice, a cancel, max_duration): the leader, often a shell (`sh -c "cd x && python
    # train.py"`), goes at the TERM while what it started still saves its checkpoint, which keeps the rest of the
    # grace before the KILL below.
    while kill_at is not None and not pump.eof.wait(0.05) and time.monotonic() < kill_at:
        reaper.reap()
        if time.monotonic() >= next_flush:
            uploader.flush(pump)
            next_flush = time.monotonic() + flush_every
    # The leader is gone; background children may still hold the output pipe. End them too.
    if not pump.eof.wait(EOF_AFTER_EXIT_SECONDS):
        signal_group(pgid, signal.SIGTERM)
        if not pump.eof.wait(EOF_AFTER_EXIT_SECONDS):
            signal_group(pgid, signal.SIGKILL)
            pump.eof.wait(EOF_AFTER_EXIT_SECONDS)
    wait_for(lambda: reaper.reap() or not group_exists(pgid), EOF_AFTER_EXIT_SECONDS)
    if cancel_reason is None and os.path.exists(cancel_file):
        cancel_reason = (read_json(cancel_file) or {}).get("reason") or "cancelled"

    exit_code, signal_name = exit_code_and_signal(proc.returncode)
    if exit_code == 0 and cancel_reason is None and notice is None and not timed_out:  # not stopped half-way
        for cache in spec.get("caches") or []:
            ready = os.path.join(paths.cache_root, cache["key"], ".ready")
            try:
                with open(ready, "w") as f:
                    f.write(spec["attempt_id"])
            except OSError:
                pass
    if notice is None and exit_code != 0 and cancel_reason is None and not timed_out:
        notice = read_notice(spec, NOTICE_AFTER_EXIT_TIMEOUT_SECONDS)  # the job may have died of the preemption

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
        preempted=notice is not None and cancel_reason is None,
        preemption_notice=notice,
        timed_out=timed_out,
        max_duration_seconds=max_duration,
        started_at=started_at,
        log_chunks=uploader.chunks,
        log_bytes=uploader.bytes,
        log_error=None if logs_written else uploader.failure(),
        tail=tail(paths.attempt_file("output.log")),
    )
    write_and_publish_status(paths, spec, status)
    return 0
