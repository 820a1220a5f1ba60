"""The executor's start budget (tpuq.executor.budget): derived from the assignment push's time, passed down as a
deadline, and every waiting step of a start (host keys, connects and their retries) ends by it. On a fake clock."""

from __future__ import annotations

import socket

import pytest
import yaml

from tpuq.deploy.infra import load_infra
from tpuq.deploy.plan import Target
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.executor import budget
from tpuq.executor.budget import BudgetExhausted, Deadline
from tpuq.executor.pins import HostKeysUnavailable, InMemoryPinStore
from tpuq.executor.ssh import ConnectPolicy, WorkerPool
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.messages import WorkerEndpoint
from tpuq.scheduler import lifecycle

NODE = "projects/p/locations/us-central2-b/nodes/n1"
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHUbTHxzDD1Ow3Qh6gLKSKbR9ojIP1E9gf6qrYY+X7ni"


class Ticks:
    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_budget_is_the_assignment_push_less_a_margin_and_fits_the_deployed_request_timeout():
    assert budget.request_seconds() == 600  # the assignments subscription's ack deadline, Pub/Sub's maximum
    assert budget.start_budget_seconds() == 600 - budget.START_MARGIN_SECONDS
    fleet = FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh"})
    deployed = load_infra(Target(fleet=fleet).variables()).request_timeout_seconds("executor")
    assert budget.start_lease_seconds() < min(deployed, budget.request_seconds())
    # The scheduler counts a `starting` record this young as a start still under way: never one whose lease ran out.
    assert budget.start_lease_seconds() <= lifecycle.STARTING_FOR.total_seconds()
    with pytest.raises(ValueError):
        budget.start_budget_seconds(request=100, margin=120)


def test_a_deadline_caps_each_step_and_refuses_one_with_nothing_left():
    ticks = Ticks()
    deadline = Deadline.after(480, ticks.monotonic)
    assert deadline.cap(900, "prepare") == 480
    ticks.now = 400
    assert deadline.cap(900, "launch") == 80 and deadline.cap(10, "connecting") == 10
    ticks.now = 479.5
    assert deadline.expired
    with pytest.raises(BudgetExhausted, match=r"the start's time budget of 480 s ran out before launch"):
        deadline.cap(900, "launch")


def _pool(ticks: Ticks, deadline: Deadline, host_keys, policy: ConnectPolicy, workers: int = 1) -> WorkerPool:
    endpoints = [WorkerEndpoint(worker_id=i, ip=f"10.0.0.{i + 2}") for i in range(workers)]
    return WorkerPool(endpoints, user="tpuq", pkey=None, node=NODE, pin_store=InMemoryPinStore(), host_keys=host_keys,
                      policy=policy, sleep=ticks.sleep, monotonic=ticks.monotonic, deadline=deadline)


class NoKeys:
    def published(self, node):
        return {}


class AnyKeys:
    def published(self, node):
        return {i: ED25519 for i in range(8)}


def test_the_host_key_wait_ends_with_the_budget():
    ticks = Ticks()
    ticks.now = 1000.0
    deadline = Deadline.after(30, ticks.monotonic)  # what an earlier step left
    with _pool(ticks, deadline, NoKeys(), ConnectPolicy(host_key_wait_seconds=180)) as pool:
        errors = pool.connect()
    assert isinstance(errors[0], HostKeysUnavailable)
    assert ticks.now - 1000.0 <= 30


def test_connect_retries_end_with_the_budget_and_each_try_gets_what_is_left(monkeypatch):
    ticks = Ticks()
    timeouts: list[float] = []

    def refused_after_its_timeout(pool, endpoint, address, pinned):
        timeout = pool.deadline.cap(pool.policy.connect_timeout, "connecting")
        timeouts.append(timeout)
        ticks.now += timeout  # a black-holed address: the connect waits its whole timeout
        raise socket.timeout("timed out")

    monkeypatch.setattr(WorkerPool, "_connect_once", refused_after_its_timeout)
    deadline = Deadline.after(60, ticks.monotonic)
    policy = ConnectPolicy(attempts=100, connect_timeout=10, first_backoff=0.5, max_backoff=8)
    with _pool(ticks, deadline, AnyKeys(), policy) as pool:
        errors = pool.connect()
    assert isinstance(errors[0], socket.timeout), errors  # the last real error, not the budget's
    assert ticks.now <= 60 and 3 <= len(timeouts) < 100
    assert all(t >= budget.MIN_STEP_SECONDS for t in timeouts) and timeouts[-1] <= 10
