"""Worker hosts are real, isolated sshd hosts whose processes die with them."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap

from paramiko.ssh_exception import NoValidConnectionsError
import pytest

from tpuq_dev.faketpu.hosts import WorkerHostManager, parse_ssh_keys_metadata

from .conftest import ssh_run, wait_until


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.fixture
def manager(tmp_path):
    m = WorkerHostManager(tmp_path / "hosts")
    yield m
    m.stop_all()


def test_parse_ssh_keys_metadata():
    parsed = parse_ssh_keys_metadata("alice:ssh-ed25519 AAAA a\n\nbob:ssh-rsa BBBB b\nalice:ssh-ed25519 CCCC c")
    assert parsed == {"alice": ["ssh-ed25519 AAAA a", "ssh-ed25519 CCCC c"], "bob": ["ssh-rsa BBBB b"]}
    with pytest.raises(ValueError, match="ssh-keys"):
        parse_ssh_keys_metadata("no-colon-here")


def test_hosts_are_isolated_and_die_with_all_their_processes(manager, ssh_key):
    hosts = manager.start_hosts(2, parse_ssh_keys_metadata(ssh_key.metadata), label="iso")
    assert len({h.address for h in hosts}) == 2

    ssh_run(hosts[0].address, hosts[0].port, ssh_key, "echo zero > /tmp/marker; echo home0 > ~/h")
    assert hosts[0].path_on_host("/tmp/marker").read_text() == "zero\n"
    assert not hosts[1].path_on_host("/tmp/marker").exists()
    assert ssh_run(hosts[1].address, hosts[1].port, ssh_key, "ls /tmp; ls ~") == ""
    assert hosts[0].path_on_host(os.path.expanduser(f"~{ssh_key.user}/h")).read_text() == "home0\n"

    ssh_run(hosts[0].address, hosts[0].port, ssh_key, "setsid sleep 1000 >/dev/null 2>&1 </dev/null &")
    pids = wait_until(lambda: len(hosts[0].namespace_pids()) >= 2 and hosts[0].namespace_pids(), what="setsid job")
    manager.stop_hosts([hosts[0]])
    assert not any(_alive(p) for p in pids + [hosts[0].unshare_pid])
    with pytest.raises(NoValidConnectionsError):
        ssh_run(hosts[0].address, hosts[0].port, ssh_key, "true", timeout=3)
    # The other host is untouched.
    assert ssh_run(hosts[1].address, hosts[1].port, ssh_key, "echo ok") == "ok\n"


def test_a_host_stopped_twice_leaves_its_old_pid_to_its_new_owner_and_other_hosts_alone(manager, ssh_key):
    keys = parse_ssh_keys_metadata(ssh_key.metadata)
    [old] = manager.start_hosts(1, keys, label="twice")
    manager.stop_hosts([old])
    [newer] = manager.start_hosts(1, keys, label="newer")
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        # pids come round: by the second stop, the old host's init pid belongs to some other program.
        manager.stop_hosts([dataclasses.replace(old, init_pid=bystander.pid)])
        manager.stop_hosts([old])
        with pytest.raises(subprocess.TimeoutExpired):  # a signal lands a moment after it is sent
            bystander.wait(timeout=1)
        assert ssh_run(newer.address, newer.port, ssh_key, "echo ok") == "ok\n"
    finally:
        bystander.kill()
        bystander.wait()


def test_hosts_die_when_their_python_process_is_killed(tmp_path, ssh_key):
    script = textwrap.dedent(
        f"""
        import sys, time
        from tpuq_dev.faketpu.hosts import WorkerHostManager, parse_ssh_keys_metadata
        hosts = WorkerHostManager({str(tmp_path)!r}).start_hosts(2, parse_ssh_keys_metadata({ssh_key.metadata!r}))
        print(" ".join(str(p) for h in hosts for p in (h.unshare_pid, h.init_pid)), flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in child.stdout.readline().split()]
        assert pids and all(_alive(p) for p in pids)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    wait_until(lambda: not any(_alive(p) for p in pids), timeout=10, what="hosts to die with their parent")
