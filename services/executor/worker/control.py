"""`launch`, `cancel` and `status`: what the executor asks of a prepared worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from .files import WorkerPaths, read_json
from .processes import current_state, job_alive, lock_is_held, request_cancel, signal_group, supervisor_alive, wait_for
from .spec import paths_for
from .status import tail
from .supervision import supervise

# How the executor (and `launch`) run this file: imported as a module, so that its bytecode is
# cached in __pycache__ after the first run of an attempt; -I -S: no user site, no site-packages.
# argv: [DIR, MODULE, subcommand args...]
BOOTSTRAP = "import sys; d, m = sys.argv[1:3]; sys.path.insert(0, d); sys.exit(__import__(m).main(sys.argv[3:]))"


def bootstrap_argv(python: str, script_path: str, *args: str) -> list[str]:
    """argv that runs `script_path`'s main(args) with `python` through BOOTSTRAP."""
    directory, filename = os.path.split(os.path.abspath(script_path))
    return [python, "-I", "-S", "-c", BOOTSTRAP, directory, os.path.splitext(filename)[0], *args]


def launch(home: str, attempt_id: str, script_path: str, wait_seconds: float = 20.0) -> dict:
    paths = WorkerPaths(home)
    spec = read_json(paths.attempt_file("spec.json"))
    if not spec or spec.get("attempt_id") != attempt_id:
        return {"ok": False, "kind": "infra", "reason": f"attempt {attempt_id} is not prepared on this worker"}
    paths = paths_for(home, spec)
    state = current_state(paths)
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
    exited = _start_supervisor(home, script_path, paths.root, paths.attempt_file("supervisor.err"))

    def started():
        s = current_state(paths)
        return s if s and s.get("attempt_id") == attempt_id and s.get("job_pgid") else None

    if not wait_for(lambda: started() or exited() is not None, wait_seconds, interval=0.01):
        return {"ok": False, "kind": "infra", "reason": "the supervisor did not start the job in time"}
    state = started()
    if state is None:
        if os.path.exists(paths.attempt_file("status.json")):
            return {"ok": True, "already": False, "state": None, "ended": True}
        return {"ok": False, "kind": "infra", "reason": f"the supervisor exited with {exited()}: "
                + tail(paths.attempt_file("supervisor.err"))[-500:]}
    return {"ok": True, "already": False, "state": state}


def _start_supervisor(home: str, script_path: str, cwd: str, err_path: str):
    """`supervise`, detached: a session of its own (no controlling terminal, so closing the SSH channel sends it
    nothing), stdin from /dev/null, stdout and stderr to supervisor.err, none of this process's other descriptors
    (the SSH channel's pipes, the control lock). Returns a function that says the supervisor's exit code once it
    has exited, else None.

    A fork of this process, not a new interpreter: the job starts one Python start and the bundle's imports sooner
    (50-60 ms of a ~170 ms start measured on the local stack's hosts). Forking is safe only with one thread, which
    `launch` and `start` have; with more, a new interpreter as before."""
    if threading.active_count() > 1:
        err = open(err_path, "ab")
        try:
            proc = subprocess.Popen(bootstrap_argv(sys.executable, script_path, "--home", home, "supervise"),
                                    stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
                                    close_fds=True, cwd=cwd)
        finally:
            err.close()
        return proc.poll
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_supervisor(home, cwd, err_path)  # never returns
    status: list[int] = []

    def exit_code() -> int | None:
        if not status:
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                status.append(os.waitstatus_to_exitcode(wait_status))
        return status[0] if status else None

    return exit_code


def _become_supervisor(home: str, cwd: str, err_path: str) -> None:
    code = 1
    try:
        os.setsid()
        os.chdir(cwd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        err = os.open(err_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(devnull, 0)
        os.dup2(err, 1)
        os.dup2(err, 2)
        for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
            if fd > 2:
                try:
                    os.close(fd)
                except OSError:
                    pass  # the listing's own descriptor, closed already
        code = supervise(home)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback  # here: its imports would delay every job's start

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def cancel(home: str, attempt_id: str, reason: str, grace: float | None) -> dict:
    paths = WorkerPaths(home)
    state = current_state(paths) or {}
    spec = read_json(paths.attempt_file("spec.json")) or {}
    if spec.get("attempt_id") != attempt_id:
        return {"ok": True, "state": "not_current", "current": spec.get("attempt_id")}
    if grace is None:
        grace = float(spec.get("cancel_grace_seconds", 30))
    if supervisor_alive(paths):
        request_cancel(paths, reason, grace)
        spid = state.get("supervisor_pid")
        if spid:
            try:
                os.kill(spid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass  # it also polls the cancel file
        return {"ok": True, "state": "signalled"}
    if lock_is_held(paths.attempt_file("job.lock")) and state.get("job_pgid"):
        # The supervisor died (e.g. killed by hand): stop the orphaned group ourselves.
        pgid = state["job_pgid"]
        signal_group(pgid, signal.SIGTERM)
        if not wait_for(lambda: not lock_is_held(paths.attempt_file("job.lock")), grace):
            signal_group(pgid, signal.SIGKILL)
        return {"ok": True, "state": "stopped_orphan"}
    # Not launched yet (or already over): make sure a later launch of this attempt does nothing.
    request_cancel(paths, reason, grace)
    try:
        os.unlink(paths.attempt_file("prepared"))
    except FileNotFoundError:
        pass
    return {"ok": True, "state": "not_running"}


def status(home: str, attempt_id: str | None) -> dict:
    paths = WorkerPaths(home)
    spec = read_json(paths.attempt_file("spec.json")) or {}
    current = spec.get("attempt_id")
    if attempt_id is not None and current != attempt_id:
        return {"ok": True, "attempt_id": current, "current": False, "supervisor_alive": False,
                "job_alive": False, "status": None}
    state = current_state(paths)
    return {
        "ok": True,
        "attempt_id": current,
        "current": True,
        "prepared": os.path.exists(paths.attempt_file("prepared")),
        "launched": state is not None,
        "supervisor_alive": supervisor_alive(paths),
        "job_alive": job_alive(paths, state),
        "status": read_json(paths.attempt_file("status.json")),
    }
