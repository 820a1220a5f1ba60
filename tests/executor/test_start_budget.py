"""A start ends well inside the assignment push's time (issue 32 §5).

Pub/Sub waits the assignments subscription's ack deadline (600 s, tpuq.contracts.topology) for the executor's answer and then
delivers the push again; a start that outlasted it ran a second `prepare` beside the first. Here every step of a
start takes simulated time on a fake clock (no sshd): the wait for a host key the guest agent publishes late, and
SSH commands that take minutes. The whole start must end inside the push, and say why it gave up.
"""

from __future__ import annotations

import json
import os
import threading
import time

from tpuq.contracts import topology
from tpuq.executor.executor import Executor
from tpuq.executor.pins import InMemoryPinStore
from tpuq.executor.ssh import CommandTimeout, ConnectPolicy, ExecResult, SshLogin, WorkerPool
from tpuq.executor.worker.main import main as supervisor_main
from tpuq.executor.worker.processes import control_lock
from tpuq.executor.workerspec import WorkerSettings
from tpuq.contracts.messages import AttemptOutcome

from .factories import T0, make_assignment

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHUbTHxzDD1Ow3Qh6gLKSKbR9ojIP1E9gf6qrYY+X7ni"
REQUEST_SECONDS = topology.subscription_by_path("executor", "/push/assignments").ack_deadline_seconds


class Clock:
    """Monotonic seconds that only sleeps and simulated commands move. Commands on several workers run at once: each
    ends at its own start plus its duration, and the clock shows the latest end."""

    def __init__(self):
        self.now = 0.0
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds

    def reach(self, at: float) -> None:
        with self._lock:
            self.now = max(self.now, at)


class LateKeys:
    """The guest agents publish every worker's key `after` seconds into the start."""

    def __init__(self, clock: Clock, after: float):
        self.clock, self.after = clock, after

    def published(self, node):
        return {w: ED25519 for w in range(8)} if self.clock.now >= self.after else {}


class SlowWorker:
    """A connected worker whose supervisor steps take `seconds[step]` of the fake clock, as `exec` would: a step
    longer than the command's timeout raises CommandTimeout once the timeout has passed."""

    def __init__(self, endpoint, clock: Clock, seconds: dict[str, float], together: threading.Barrier):
        self.endpoint, self.worker_id, self.clock, self.seconds = endpoint, endpoint.worker_id, clock, seconds
        self.together = together  # the slice's workers run each step at once: all read the clock, then all move it
        self.commands: list[tuple[str, list[str], float]] = []

    def bound_io(self, seconds):
        pass

    def home(self):
        return "/home/tpuq"

    def put_file_once(self, path, data, mode=0o644):
        return True

    def put_file(self, path, data, mode=0o644):
        pass

    def exec(self, argv, *, stdin=None, timeout=120.0):
        step = next(a for a in argv if a in ("prepare", "start", "launch", "cancel", "status"))
        self.commands.append((step, list(argv), timeout))
        self.together.wait()
        began, takes = self.clock.now, self.seconds.get(step, 0.0)
        self.together.wait()
        if takes > timeout:
            self.clock.reach(began + timeout)
            raise CommandTimeout(f"{step} on worker {self.worker_id} did not finish in {timeout:.0f} s")
        self.clock.reach(began + takes)
        prepared = {"ok": True, "already": False, "notes": []}
        launched = {"ok": True, "already": False, "state": {"job_pgid": 4242}}
        answer = {"prepare": prepared, "launch": launched, "cancel": {"ok": True},
                  "start": {"ok": True, "prepared": prepared, "launched": launched}}[step]
        return ExecResult(0, json.dumps(answer) + "\n", "")

    def close(self):
        pass


def slow_start(monkeypatch, *, hosts: int, keys_after: float, seconds: dict[str, float]):
    clock = Clock()
    workers: dict[int, SlowWorker] = {}
    together = threading.Barrier(hosts, timeout=10)

    def connect_once(pool, endpoint, address, pinned):
        workers[endpoint.worker_id] = SlowWorker(endpoint, clock, seconds, together)
        return workers[endpoint.worker_id]

    monkeypatch.setattr(WorkerPool, "_connect_once", connect_once)
    executor = Executor(
        ssh_login=lambda: SshLogin("tpuq"), ssh_key=lambda: None, pin_store=InMemoryPinStore(),
        host_keys=LateKeys(clock, keys_after), objects=None, clock=lambda: T0, settings=WorkerSettings(),
        connect_policy=ConnectPolicy(), sleep=clock.sleep, monotonic=clock.monotonic)
    return executor, clock, workers


def test_a_start_whose_host_key_wait_and_command_outlast_the_push_ends_inside_it(monkeypatch):
    """Host keys after 170 s (the wait allows 180), then a one-worker `start` (bundle download, extract) of 500 s:
    before, the command had 900 s and the start ended at 670 s, after Pub/Sub had delivered the push again."""
    executor, clock, workers = slow_start(monkeypatch, hosts=1, keys_after=170, seconds={"start": 500})
    result = executor.start_attempt(make_assignment(hosts=1))

    assert clock.now < REQUEST_SECONDS - 60, f"the start took {clock.now:.0f} s of a {REQUEST_SECONDS} s push"
    assert not result.started and result.outcome.outcome is AttemptOutcome.infra_failed
    assert "time budget" in result.outcome.detail and "ran out" in result.outcome.detail, result.outcome.detail
    ((step, argv, timeout),) = workers[0].commands
    assert step == "start" and 170 <= clock.now - timeout <= 180  # the command got what the key wait left


def test_every_command_of_a_slice_gets_what_is_left_and_the_worker_waits_no_longer_for_its_lock(monkeypatch):
    executor, clock, workers = slow_start(monkeypatch, hosts=2, keys_after=100, seconds={"prepare": 200, "launch": 400})
    result = executor.start_attempt(make_assignment(hosts=2))

    assert clock.now < REQUEST_SECONDS - 60
    assert result.outcome.outcome is AttemptOutcome.infra_failed and "could not launch" in result.outcome.detail
    for worker in workers.values():
        (_, prepare, prepare_timeout), (_, launch, launch_timeout) = worker.commands
        assert launch_timeout <= executor.start_budget - 300  # 100 s of key wait and 200 s of prepare spent
        for argv, timeout in ((prepare, prepare_timeout), (launch, launch_timeout)):
            lock_wait = float(argv[argv.index("--lock-wait") + 1])
            assert 0 < lock_wait < timeout


def test_a_start_that_fits_is_untouched(monkeypatch):
    executor, clock, workers = slow_start(monkeypatch, hosts=2, keys_after=10, seconds={"prepare": 120, "launch": 5})
    result = executor.start_attempt(make_assignment(hosts=2))
    assert (result.started, result.outcome) == (True, None)
    assert clock.now < 150  # the key came at the poll after 10 s (15.5 s), then 125 s of commands


def test_the_worker_waits_for_its_control_lock_only_as_long_as_the_executor_says(tmp_path, capsys):
    """A `prepare` the executor gave up on may still hold the worker's lock: the next one answers within its own
    command's time instead of waiting the worker's default (600 s) and preparing after the executor left."""
    held = control_lock(str(tmp_path))
    try:
        began = time.monotonic()
        assert supervisor_main(["--home", str(tmp_path), "launch", "--lock-wait", "0.3", "--attempt-id", "a1"]) == 1
        assert time.monotonic() - began < 5
    finally:
        os.close(held)
    assert "another prepare or launch holds this worker" in capsys.readouterr().out
