"""The local stack's process handling: the ports it hands out and the groups it signals.

Two things on a busy machine broke or could break a stack here: a port chosen for one server handed out
again before that server bound it (a CI run's front found its port taken by the claimer), and a pid or
process-group number that came round to another program while a stale record still named it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tpuq_dev.devstack import processes
from tpuq_dev.devstack.processes import ProcRecord

from tests.helpers import wait_until


def test_a_port_is_never_handed_out_twice_even_before_its_server_binds_it():
    # Nothing binds these ports, as nothing had bound the front's ports when the services' ports were chosen.
    ports = [processes.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_ports_come_from_below_the_range_outgoing_connections_take_theirs_from():
    low = processes._ephemeral_low()
    ports = [processes.free_port() for _ in range(50)]
    assert all(processes.LISTEN_PORTS_LOW <= p < low for p in ports), (low, ports)


class _Choices:
    """Stands in for the allocator's random choice: the ports to try, in order."""

    def __init__(self, ports):
        self._ports = list(ports)

    def randint(self, low, high):
        return self._ports.pop(0)


def test_a_port_someone_listens_on_is_passed_over(monkeypatch):
    with socket.socket() as taken:
        for candidate in range(processes.LISTEN_PORTS_LOW + 5_000, processes.LISTEN_PORTS_LOW + 6_000):
            try:
                taken.bind(("127.0.0.1", candidate))
                break
            except OSError:
                continue
        taken.listen()
        other = candidate + 1
        monkeypatch.setattr(processes, "_port_choice", _Choices([candidate, other, other + 1]))
        monkeypatch.setattr(processes, "_handed_out", set())
        assert processes.free_port() in (other, other + 1)



# Another process on the machine (a second test worker, a demo beside `tpuq dev up`): it hands out ports, prints
# them, and lives until its standard input closes. It uses the test's registry, as every process uses the same one.
_OTHER_PROCESS = """
import sys
from pathlib import Path
from tpuq_dev.devstack import processes
processes.PORT_REGISTRY = Path(sys.argv[1])
print(" ".join(str(processes.free_port()) for _ in range(int(sys.argv[2]))), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "PORT_REGISTRY", tmp_path / "ports")
    monkeypatch.setattr(processes, "_handed_out", set())
    return tmp_path / "ports"


def _other_process(registry, n: int) -> tuple[subprocess.Popen, list[int]]:
    other = subprocess.Popen([sys.executable, "-c", _OTHER_PROCESS, str(registry), str(n)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    return other, [int(p) for p in other.stdout.readline().split()]


def test_a_port_another_live_process_handed_out_is_passed_over_before_its_server_binds_it(registry, monkeypatch):
    other, theirs = _other_process(registry, 20)
    try:
        assert len(theirs) == 20
        # This process would try exactly their ports first: none of them is bound yet, so only the registry can
        # tell that they are taken.
        spare = [p for p in range(processes.LISTEN_PORTS_LOW + 7_000, processes.LISTEN_PORTS_LOW + 7_100)
                 if p not in theirs]
        monkeypatch.setattr(processes, "_port_choice", _Choices([*theirs, *spare]))
        mine = [processes.free_port() for _ in range(5)]
        assert not set(mine) & set(theirs), (mine, theirs)
    finally:
        other.stdin.close()
        other.wait(timeout=60)


def test_ports_a_process_handed_out_are_free_again_once_it_has_gone(registry, monkeypatch):
    other, theirs = _other_process(registry, 3)
    other.stdin.close()
    other.wait(timeout=60)
    monkeypatch.setattr(processes, "_port_choice", _Choices(theirs))
    assert [processes.free_port() for _ in range(3)] == theirs
    # and the gone process's list was cleared away; this process's own list names what it handed out
    assert [f.read_text().split() for f in registry.iterdir() if not f.name.startswith(".")] == [
        [str(p) for p in theirs]]

def _own_session(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(list(argv), start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def bystander():
    """A program that is not ours, leading its own process group, as one whose pid came round would be."""
    proc = _own_session("sleep", "300")
    yield proc
    proc.kill()
    proc.wait()


def _stale_record_for(proc: subprocess.Popen) -> ProcRecord:
    # Our record named this number once, for a process that started at another time.
    real = processes._proc_start_ticks(proc.pid)
    assert real is not None
    return ProcRecord(name="service", pid=proc.pid, pgid=proc.pid, port=None, cmd=["old"], log="/dev/null",
                      start_ticks=str(int(real) + 1))


def test_stopping_a_stale_record_leaves_the_program_that_took_its_number_alone(bystander):
    processes.stop(_stale_record_for(bystander), grace=0.2)
    processes.stop_all([_stale_record_for(bystander)], grace=0.2)
    with pytest.raises(subprocess.TimeoutExpired):  # a signal lands a moment after it is sent
        bystander.wait(timeout=1)


def test_a_dead_leaders_group_is_still_stopped():
    # The leader exits at once; its child keeps the group (and so its number) alive.
    leader = _own_session("sh", "-c", "sleep 300 & exit 0")
    ticks = processes._proc_start_ticks(leader.pid)
    rec = ProcRecord(name="emulator", pid=leader.pid, pgid=leader.pid, port=None, cmd=["sh"], log="/dev/null",
                     start_ticks=ticks)
    leader.wait()
    child = wait_until(lambda: _members_of(leader.pid), timeout=60, what="the leader's child in its group")
    processes.stop(rec, grace=0.2)
    wait_until(lambda: not _members_of(leader.pid), timeout=60, what="the orphaned group to be stopped")
    assert child


def _members_of(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[2]) == pgid and stat[0] != "Z":
                members.append(int(entry))
    return members


def test_a_server_that_dies_at_start_up_says_why_on_the_first_line(tmp_path):
    # The CLI prints an error's first line only; the reason is the log's last line.
    rec = processes.spawn("front", [sys.executable, "-c", "import sys; print('starting', flush=True); "
                                    "sys.exit('Port 38799 is in use by another program.')"], tmp_path, {})
    with pytest.raises(RuntimeError) as raised:
        processes.wait_http("http://127.0.0.1:9/", rec, timeout=60)
    first = str(raised.value).splitlines()[0]
    assert first.startswith("front exited during start-up: Port 38799 is in use by another program.")
    assert str(tmp_path / "front.log") in first
