"""Where everything lives on one worker, and the small file helpers every step uses."""

from __future__ import annotations

import json
import os
import shutil


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



def write_json_atomic(path: str, value) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None



def rmtree(path: str) -> None:
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
