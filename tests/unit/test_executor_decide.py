"""The executor's pure decisions, without emulators or workers: dedup, the end, preemption, probe throttling."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from tpuq.executor import decide
from tpuq.executor.outcome import Decided, NodeState
from tpuq.contracts.messages import Assignment, AttemptOutcome

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
EVERY = timedelta(seconds=60)
ASSIGNMENT = Assignment(job_id="j1", attempt=1, attempt_id="j1-1", node="projects/p/locations/z/nodes/n1",
                        zone="us-central2-b", endpoints=[], at=NOW)


@pytest.mark.parametrize("execution, over, judgeable", [
    (None, False, False),
    ({}, False, False),
    ({"ended": False}, False, False),  # never started here: nothing to judge
    ({"ended": False, "assignment": {"job_id": "j1"}}, False, True),
    ({"ended": True, "assignment": {"job_id": "j1"}}, True, False),
])
def test_which_attempts_are_still_ours(execution, over, judgeable):
    assert decide.is_over(execution) is over
    assert decide.judgeable(execution) is judgeable


def test_an_end_is_published_once_with_its_detail_cut_to_the_limits():
    decided = Decided(AttemptOutcome.failed, "x" * 9000, {"0": 1})
    first = decide.end({"ended": False}, ASSIGNMENT, decided, NOW)
    assert first.event.outcome is AttemptOutcome.failed and len(first.event.detail) == 8000
    assert first.event.exit_codes == {"0": 1} and first.event.attempt_id == "j1-1"
    assert first.record["ended"] and len(first.record["detail"]) == 2000
    assert decide.end({"ended": False, **first.record}, ASSIGNMENT, decided, NOW) is None


@pytest.mark.parametrize("outcome, node, expected", [
    (AttemptOutcome.infra_failed, NodeState.preempted, AttemptOutcome.preempted),
    (AttemptOutcome.infra_failed, NodeState.ready, AttemptOutcome.infra_failed),
    (AttemptOutcome.infra_failed, NodeState.unknown, AttemptOutcome.infra_failed),
    (AttemptOutcome.failed_setup, NodeState.preempted, AttemptOutcome.failed_setup),
    (AttemptOutcome.infra_failed, NodeState.gone, AttemptOutcome.preempted),
])
def test_a_start_that_failed_on_a_lost_node_is_a_preemption(outcome, node, expected):
    assert decide.start_failure(Decided(outcome, "unreachable"), node).outcome is expected


@pytest.mark.parametrize("tpu, state", [
    (None, NodeState.unknown), ({"state": "busy"}, NodeState.ready),
    # Issue 35: preempted only when the record proves it (its queued resource seen SUSPENDED); else gone.
    ({"state": "gone", "gone_reason": "SUSPENDED"}, NodeState.preempted),
    ({"state": "gone", "gone_reason": "GONE"}, NodeState.gone),
    ({"state": "gone", "gone_reason": "not found when the janitor deleted it"}, NodeState.gone),
])
def test_node_state_from_the_scheduler_record(tpu, state):
    assert decide.node_state(tpu) is state


@pytest.mark.parametrize("started, probed, due", [
    (None, None, False),  # not started
    (NOW - timedelta(seconds=30), None, False),  # started too recently
    (NOW - timedelta(seconds=90), None, True),
    (NOW - timedelta(seconds=300), NOW - timedelta(seconds=30), False),  # asked recently
    (NOW - timedelta(seconds=300), NOW - timedelta(seconds=61), True),
])
def test_probes_are_throttled_per_attempt(started, probed, due):
    assert decide.probe_due({"started_at": started, "probed_at": probed}, NOW, EVERY) is due


def test_probe_answers_become_lost_workers_and_unwritable_statuses():
    answers = {0: SimpleNamespace(lost=True, status_error=None), 1: SimpleNamespace(lost=False, status_error="403"),
               2: SimpleNamespace(lost=False, status_error=None)}
    assert decide.probed(answers) == decide.Probed(frozenset({0}), {1: "403"})


def test_cannot_start_is_a_setup_failure():
    assert decide.cannot_start("no endpoints").outcome is AttemptOutcome.failed_setup


# -------------------------------------------------------- the tick's isolation


class _Query:
    def __init__(self, snaps):
        self.snaps = snaps

    def where(self, **_):
        return self

    def limit(self, _):
        return self

    def stream(self):
        return iter(self.snaps)


def test_one_attempt_that_cannot_be_judged_never_stops_the_tick_for_the_others(monkeypatch):
    from tpuq.executor import handlers

    snaps = [SimpleNamespace(id=f"j{i}:1", reference=None,
                             to_dict=lambda i=i: {"ended": False, "assignment": {"job_id": f"j{i}"}})
             for i in range(3)]
    from tpuq.executor.state import ExecutorState

    unbuilt = ExecutorState(lambda: None, probe_every=None)  # this instance never connected anywhere
    from tpuq.runtime.settings import Settings

    ctx = SimpleNamespace(clients=SimpleNamespace(firestore=SimpleNamespace(collection=lambda _: _Query(snaps))),
                          state=unbuilt, settings=Settings(project="p"))
    judged = []

    def judge(ctx, stored, probed, **_):
        if stored["assignment"]["job_id"] == "j0":
            raise RuntimeError("workers unreachable")
        judged.append(stored["assignment"]["job_id"])

    monkeypatch.setattr(handlers, "_judge", judge)
    monkeypatch.setattr(handlers, "_probe", lambda ctx, ref, stored: decide.Probed())
    handlers._tick_attempts(ctx, judge_all=True, state={}, now=None)  # a tick that judges every running attempt
    assert judged == ["j1", "j2"]


def test_a_worker_unreachable_at_every_probe_for_the_grace_ends_its_attempt():
    from dataclasses import dataclass as _dc
    from datetime import datetime as _dt, timedelta as _td, timezone as _tz

    from tpuq.executor import decide as _decide

    @_dc(frozen=True)
    class Probe:
        reachable: bool
        lost: bool = False
        status_error: str | None = None

    t0 = _dt(2026, 1, 1, tzinfo=_tz.utc)
    grace = _td(seconds=180)
    down = _decide.probed({0: Probe(True), 1: Probe(False)})
    assert down.unreachable == frozenset({1})
    since = _decide.unreachable_since({}, down, t0)
    assert since == t0
    assert _decide.unreachable_problem(down, since, t0 + _td(seconds=179), grace).problem is None
    later = _decide.unreachable_since({"unreachable_since": t0}, down, t0 + _td(seconds=200))
    assert later == t0
    problem = _decide.unreachable_problem(down, later, t0 + _td(seconds=200), grace).problem
    assert problem == "worker 1 unreachable over SSH for 200 s (its host is down)"
    # Every worker answered again: the clock starts over.
    up = _decide.probed({0: Probe(True), 1: Probe(True)})
    assert _decide.unreachable_since({"unreachable_since": t0}, up, t0 + _td(seconds=300)) is None
