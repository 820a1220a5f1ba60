"""SSH connections kept between attempts (ConnectionCache): real sshd hosts, the real supervisor.

A slice's next attempt reuses the connections its previous attempt left, and skips writing the supervisor
it already wrote; a connection whose host went away is never used, and the start fails (or succeeds) exactly
as it would on a new connection.
"""

from __future__ import annotations

import dataclasses

import pytest

from tpuq.executor.outcome import Decided, NodeState
from tpuq.executor.ssh import ConnectionCache
from tpuq.contracts.messages import AttemptOutcome

from .conftest import wait_until
from .factories import make_assignment
from .test_executor import clock, executor  # noqa: F401 - the same executor as test_executor.py

HOME = "/home/tpuqexec"


@pytest.fixture
def keeping(executor):
    """The module's executor, keeping its connections (what the service does by default)."""
    executor.connection_cache = ConnectionCache()
    yield executor
    executor.connection_cache.close_all()


def _outcome(executor, assignment):
    decided = wait_until(lambda: (lambda d: d if isinstance(d, Decided) else None)(
        executor.read_outcome(assignment, node_state=NodeState.ready)), 30, "an outcome")
    return decided.outcome


def test_the_next_attempt_on_a_slice_reuses_its_connections(keeping, start_hosts, bucket):
    hosts, endpoints = start_hosts(2)
    cache = keeping.connection_cache
    first = make_assignment(job_id="one", endpoints=endpoints, bucket=bucket, command="echo one > out.txt")
    assert keeping.start_attempt(first).started
    assert _outcome(keeping, first) == AttemptOutcome.succeeded
    assert len(cache) == 2 and cache.hits == 0
    kept = {w: c.client.get_transport() for (_, w, *_), (c, _) in cache._idle.items()}

    second = make_assignment(job_id="two", endpoints=endpoints, bucket=bucket, command="echo two > out.txt")
    assert keeping.start_attempt(second).started
    assert cache.hits == 2  # no new handshake
    assert {w: c.client.get_transport() for (_, w, *_), (c, _) in cache._idle.items()} == kept
    assert _outcome(keeping, second) == AttemptOutcome.succeeded
    for host in hosts:
        assert host.path_on_host(f"{HOME}/tpuq/job/out.txt").read_text() == "two\n"


def test_a_job_that_deletes_the_supervisor_does_not_break_the_next_attempt(keeping, start_hosts, bucket):
    hosts, endpoints = start_hosts(1)
    wipe = make_assignment(job_id="wipe", endpoints=endpoints, bucket=bucket, command="rm -rf ~/tpuq/supervisor.py")
    assert keeping.start_attempt(wipe).started
    assert _outcome(keeping, wipe) == AttemptOutcome.succeeded
    wait_until(lambda: not hosts[0].path_on_host(f"{HOME}/tpuq/supervisor.py").exists(), 30, "the script removed")
    after = make_assignment(job_id="after", endpoints=endpoints, bucket=bucket, command="echo fine > out.txt")
    result = keeping.start_attempt(after)
    assert result.started, result.outcome
    assert keeping.connection_cache.hits == 1
    assert _outcome(keeping, after) == AttemptOutcome.succeeded
    assert hosts[0].path_on_host(f"{HOME}/tpuq/job/out.txt").read_text() == "fine\n"


def test_a_kept_connection_to_a_host_that_went_away_is_never_used(keeping, start_hosts, host_manager, bucket):
    hosts, endpoints = start_hosts(1)
    first = make_assignment(job_id="before", endpoints=endpoints, bucket=bucket, command="true")
    assert keeping.start_attempt(first).started
    assert _outcome(keeping, first) == AttemptOutcome.succeeded
    assert len(keeping.connection_cache) == 1
    host_manager.stop_hosts(hosts)  # the node is gone: its address answers nothing
    later = make_assignment(job_id="later", endpoints=endpoints, bucket=bucket, command="true")
    result = keeping.start_attempt(later)
    assert not result.started and result.outcome.outcome == AttemptOutcome.infra_failed
    assert "could not reach" in result.outcome.detail
    assert keeping.connection_cache.hits == 0 and len(keeping.connection_cache) == 0


def test_connections_of_a_node_that_left_are_closed(keeping, start_hosts, bucket):
    _, endpoints = start_hosts(1)
    a = make_assignment(job_id="left", endpoints=endpoints, bucket=bucket, command="true")
    assert keeping.start_attempt(a).started
    [(conn, _)] = keeping.connection_cache._idle.values()
    assert keeping.forget_nodes({a.node}) == 1
    assert len(keeping.connection_cache) == 0 and not conn.client.get_transport()


def test_idle_connections_expire():
    now = [0.0]
    cache = ConnectionCache(max_idle=60, monotonic=lambda: now[0])
    closed = []

    @dataclasses.dataclass
    class Conn:
        name: str

        def close(self):
            closed.append(self.name)

    cache.give(("n", 0, "a", "u", "k"), Conn("old"))
    now[0] = 61
    assert cache.take(("n", 0, "a", "u", "k")) is None and closed == ["old"]
