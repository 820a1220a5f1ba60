"""What a worker host's mount namespace holds besides its /tmp and homes: its own /proc, /dev and /etc/hosts.

`namespace_setup(root, internal_address, devices)` returns the shell commands that hosts.py runs inside
`unshare --pid --fork --mount` before sshd starts, and writes the files they bind. Pure but for those files.

- /proc: a fresh proc for the host's pid namespace, so `ps` on worker 1 lists worker 1's processes only, and a
  process reading /proc/*/fd (the worker preflight looking for device holders) sees its own host's.
- /dev: a fresh tmpfs with the machine's basic nodes (null, zero, random, tty, ptmx...; /dev/pts bound from the
  machine, a /dev/shm of its own) plus the TPU's device files of a TPU VM: /dev/accel0..N-1 (v2-v4's driver)
  and /dev/vfio/0..N-1 with /dev/vfio/vfio (v5e and later), N the chips of one host. They are plain files (no
  driver behind them) that any user may open: what matters to the fake is that a process can hold one open and
  another can see it holding it.
- /etc/hosts: the machine's, plus `metadata.google.internal` and `metadata` at the host's internal address, where
  its metadata server (metadata.py) listens on port 80.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from .metadata import METADATA_HOST_NAMES

RUN_DIR = Path("/run/tpuq-faketpu")
# The machine's /dev is bound here inside a host's namespace while its own /dev is built, then unmounted.
MACHINE_DEV_MOUNT = RUN_DIR / "machine-dev"
# Nodes (and /proc/self links) a process expects in /dev; those the machine has are copied.
BASIC_DEV_ENTRIES = ("null", "zero", "full", "random", "urandom", "tty", "ptmx", "fd", "stdin", "stdout", "stderr")
MACHINE_HOSTS_FILE = Path("/etc/hosts")


def prepare_machine() -> None:
    """Mount points the namespaces need (once, on the machine; empty directories)."""
    MACHINE_DEV_MOUNT.mkdir(parents=True, exist_ok=True)


def device_paths(devices: int) -> list[str]:
    """The TPU device files a host of `devices` chips has."""
    return [*(f"/dev/accel{i}" for i in range(devices)), "/dev/vfio/vfio", *(f"/dev/vfio/{i}" for i in range(devices))]


def hosts_file_text(machine_hosts: str, internal_address: str) -> str:
    return machine_hosts.rstrip("\n") + f"\n{internal_address} {' '.join(METADATA_HOST_NAMES)}\n"


def namespace_setup(root: Path, internal_address: str, devices: int) -> list[str]:
    hosts_file = root / "etc-hosts"
    try:
        machine_hosts = MACHINE_HOSTS_FILE.read_text()
    except OSError:
        machine_hosts = "127.0.0.1 localhost\n"
    hosts_file.write_text(hosts_file_text(machine_hosts, internal_address))
    stash = shlex.quote(str(MACHINE_DEV_MOUNT))
    basics = [e for e in BASIC_DEV_ENTRIES if os.path.lexists(f"/dev/{e}")]
    files = device_paths(devices)
    return [
        "mount -t proc proc /proc",
        f"mount --rbind /dev {stash}",
        "mount -t tmpfs -o mode=755,size=1m tpuq-dev /dev",
        *([f"(cd {stash} && cp -a {' '.join(basics)} /dev/)"] if basics else []),
        "mkdir /dev/pts /dev/shm /dev/vfio",
        f"mount --rbind {stash}/pts /dev/pts",
        "mount -t tmpfs -o mode=1777 shm /dev/shm",
        f"umount -l {stash}",
        f"touch {' '.join(files)}",
        f"chmod 666 {' '.join(files)}",
        f"mount --bind {shlex.quote(str(hosts_file))} /etc/hosts",
    ]
