"""A process on a worker host that holds a TPU device open: what a previous job's stuck process leaves on a TPU VM
(`open(/dev/vfio/0): Device or resource busy` for the next one, marin#4783). `tpuq dev dirty` starts one.

It is started inside the host's pid and mount namespaces (nsenter on the host's init), as the host's login user (the
user jobs run as, so it stands for a job's leftover), detached: it outlives the call and dies with the host.
"""

from __future__ import annotations

import pwd
import shlex
import subprocess

from .hosts import WorkerHost, WorkerHostError

DEFAULT_DEVICE = "/dev/vfio/0"


def holder_argv(init_pid: int, user: str | None, device: str) -> list[str]:
    """Pure: the command that starts the holder and prints its pid as the host sees it."""
    # Opened first, so that a missing device fails the call; the detached sleep inherits descriptor 3.
    inner = (f"exec 3<{shlex.quote(device)} || exit 1\n"
             "setsid sleep infinity </dev/null >/dev/null 2>&1 &\n"
             "echo $!")
    as_user = ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--init-groups"] if user else []
    return ["nsenter", f"--target={init_pid}", "--pid", "--mount", "--wd=/", "--", *as_user, "sh", "-c", inner]


def hold_device(host: WorkerHost, device: str = DEFAULT_DEVICE) -> dict:
    """Start the holder on `host`; {"worker", "device", "pid" (on the host), "user"}."""
    if not (device.startswith("/dev/accel") or device.startswith("/dev/vfio/")):
        raise ValueError(f"{device}: not a TPU device file (/dev/accel*, /dev/vfio/*)")
    user = host.users[0] if host.users else None
    result = subprocess.run(holder_argv(host.init_pid, user, device), capture_output=True, text=True, timeout=10)
    pid = result.stdout.strip()
    if result.returncode != 0 or not pid.isdigit():
        raise WorkerHostError(f"could not hold {device} on worker {host.worker_index}: "
                              f"{(result.stderr or result.stdout).strip() or result.returncode}")
    return {"worker": host.worker_index, "device": device, "pid": int(pid), "user": user}
