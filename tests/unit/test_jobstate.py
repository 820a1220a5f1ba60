"""The job lifecycle table and the retry decision."""

from __future__ import annotations

import itertools
import random
from datetime import datetime, timedelta, timezone

import pytest

from tpuq.contracts.errors import Permanent
from tpuq.contracts.fleet import RetryBudgets
from tpuq.contracts.jobstate import (
    TRANSITIONS,
    IllegalTransition,
    JobEvent,
    JobState,
    allowed_events,
    backoff_seconds,
    retry_decision,
    transition,
)
from tpuq.contracts.messages import AttemptOutcome

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)

# Written out independently of the module: every edge that must exist.
EXPECTED_EDGES = {
    ("pending", "assign"): "assigned",
    ("pending", "cancel"): "cancelled",
    ("pending", "reject"): "rejected",
    ("pending", "reprioritize"): "pending",
    ("assigned", "unassign"): "pending",
    ("assigned", "start"): "running",
    ("assigned", "succeed"): "succeeded",  # ended overtook started
    ("assigned", "fail"): "failed",
    ("assigned", "requeue"): "pending",
    ("assigned", "cancel"): "cancelled",
    ("running", "succeed"): "succeeded",
    ("running", "fail"): "failed",
    ("running", "requeue"): "pending",
    ("running", "cancel"): "cancelled",
}
ALL_PAIRS = list(itertools.product(JobState, JobEvent))
REFUSED = [(s, e) for s, e in ALL_PAIRS if (s.value, e.value) not in EXPECTED_EDGES]


@pytest.mark.parametrize(("state", "event"), sorted(EXPECTED_EDGES), ids=lambda v: v)
def test_allowed_edge_leads_to_expected_state(state, event):
    assert transition(state, event) is JobState(EXPECTED_EDGES[(state, event)])


@pytest.mark.parametrize(("state", "event"), REFUSED, ids=lambda v: v.value)
def test_refused_edge_raises_illegal_transition(state, event):
    with pytest.raises(IllegalTransition) as info:
        transition(state, event)
    assert isinstance(info.value, Permanent)
    assert (info.value.state, info.value.event) == (state, event)
    assert state.value in str(info.value) and event.value in str(info.value)


def test_table_is_exactly_the_expected_edges():
    assert {(s.value, e.value): n.value for (s, e), n in TRANSITIONS.items()} == EXPECTED_EDGES


def test_terminal_states_take_no_event():
    for state in (JobState.succeeded, JobState.failed, JobState.cancelled, JobState.rejected):
        assert state.terminal
        assert allowed_events(state) == frozenset()
    for state in (JobState.pending, JobState.assigned, JobState.running):
        assert not state.terminal
        assert JobEvent.cancel in allowed_events(state)


def test_unknown_state_or_event_is_a_value_error():
    with pytest.raises(ValueError):
        transition("sleeping", "assign")
    with pytest.raises(ValueError):
        transition("pending", "explode")


# ---- retry_decision -------------------------------------------------------

BUDGETS = RetryBudgets(preemptions=3, infra_failures=1, backoff_base_seconds=10.0, backoff_max_seconds=100.0)


def decide(outcome, preempted=0, infra=0, budgets=BUDGETS, max_preemptions=None, max_infra=None, seed=0):
    return retry_decision(outcome, preempted, infra, budgets, max_preemptions, max_infra, NOW, random.Random(seed))


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        (AttemptOutcome.succeeded, JobState.succeeded),
        (AttemptOutcome.failed, JobState.failed),
        (AttemptOutcome.failed_setup, JobState.failed),
        (AttemptOutcome.cancelled, JobState.cancelled),
    ],
)
def test_terminal_outcomes_ignore_budgets(outcome, state):
    next_state, not_before, reason = decide(outcome, preempted=99, infra=99)
    assert next_state is state and not_before is None and reason


def test_preemption_with_budget_left_requeues_with_backoff():
    decision = decide(AttemptOutcome.preempted, preempted=2)
    assert decision.next_state is JobState.pending
    assert decision.event is JobEvent.requeue
    # third retry: delay = min(100, 10 * 2**2) = 40, equal jitter -> [20, 40]
    assert NOW + timedelta(seconds=20) <= decision.not_before <= NOW + timedelta(seconds=40)
    assert "retry 3 of 3" in decision.reason


def test_preemption_budget_spent_fails_with_reason():
    decision = decide(AttemptOutcome.preempted, preempted=3)
    assert decision.next_state is JobState.failed
    assert decision.event is JobEvent.fail
    assert decision.not_before is None
    assert "max_preemptions=3" in decision.reason


def test_infra_failures_have_their_own_budget():
    assert decide(AttemptOutcome.infra_failed, preempted=3, infra=0).next_state is JobState.pending
    spent = decide(AttemptOutcome.infra_failed, preempted=0, infra=1)
    assert spent.next_state is JobState.failed and "max_infra_retries=1" in spent.reason


def test_job_overrides_replace_fleet_budgets():
    assert decide(AttemptOutcome.preempted, preempted=3, max_preemptions=5).next_state is JobState.pending
    assert decide(AttemptOutcome.preempted, preempted=0, max_preemptions=0).next_state is JobState.failed
    assert decide(AttemptOutcome.infra_failed, infra=1, max_infra=2).next_state is JobState.pending
    assert decide(AttemptOutcome.infra_failed, infra=0, max_infra=0).next_state is JobState.failed


def test_backoff_is_capped_and_deterministic_for_a_seed():
    budgets = RetryBudgets(preemptions=1000, backoff_base_seconds=10.0, backoff_max_seconds=100.0)
    late = decide(AttemptOutcome.preempted, preempted=500, budgets=budgets)
    assert NOW + timedelta(seconds=50) <= late.not_before <= NOW + timedelta(seconds=100)
    assert decide(AttemptOutcome.preempted, preempted=1, seed=7) == decide(AttemptOutcome.preempted, preempted=1, seed=7)


def test_backoff_grows_exponentially_within_jitter_bounds():
    rng = random.Random(3)
    for used in range(6):
        full = min(100.0, 10.0 * 2**used)
        delay = backoff_seconds(used, 10.0, 100.0, rng)
        assert full / 2 <= delay <= full


def test_zero_backoff_base_retries_immediately():
    budgets = RetryBudgets(preemptions=2, backoff_base_seconds=0.0)
    assert decide(AttemptOutcome.preempted, budgets=budgets).not_before == NOW


def test_decision_event_is_an_edge_from_running():
    for outcome in AttemptOutcome:
        decision = decide(outcome)
        assert transition(JobState.running, decision.event) is decision.next_state


# ---- set-priority and cancel --if-pending ------------------------------------

def test_reprioritized_only_a_pending_job():
    from tpuq.contracts.jobspec import Priority
    from tpuq.contracts.jobstate import reprioritized

    job = {"state": "pending", "priority": "low", "priority_rank": 0, "spec": {"priority": "low"}}
    assert reprioritized(job, Priority.high, NOW) == {"priority": "high", "priority_rank": 2,
                                                      "spec.priority": "high", "updated_at": NOW}
    assert reprioritized(job, Priority.low, NOW) is None
    for state in ("assigned", "running", "succeeded", "cancelled"):
        with pytest.raises(IllegalTransition):
            reprioritized({**job, "state": state}, Priority.high, NOW)


@pytest.mark.parametrize(("state", "attempt", "expected", "unstarted"), [
    ("pending", 0, 0, True),
    ("pending", 1, 1, True),
    ("pending", 1, 0, False),  # it ran and was requeued since the CLI read it
    ("pending", 3, None, True),
    ("assigned", 1, 0, False),
    ("running", 1, 1, False),
    ("cancelled", 0, 0, False),
])
def test_still_unstarted(state, attempt, expected, unstarted):
    from tpuq.contracts.jobstate import still_unstarted

    assert still_unstarted({"state": state, "attempt": attempt}, expected) is unstarted
