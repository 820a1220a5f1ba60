"""The chaos soak's judges (benchmarks/chaos.py), pure: a job's attempt history against the transition table, and
overlapping attempts from the workers' own stamps."""

from __future__ import annotations

import pytest

from tpuq.contracts.documents import AttemptState, JobState
from tpuq.contracts.messages import AttemptOutcome

from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def chaos():
    return load_benchmark("chaos")


def _attempt(n: int, outcome: AttemptOutcome | None, started: bool = True, state=AttemptState.ended) -> dict:
    return {"attempt": n, "state": state.value, "outcome": outcome and outcome.value,
            "started_at": "2026-01-01T00:00:00Z" if started else None}


P, S, F, I = AttemptOutcome.preempted, AttemptOutcome.succeeded, AttemptOutcome.failed, AttemptOutcome.infra_failed


@pytest.mark.parametrize("state, attempts, problem", [
    (JobState.succeeded, [_attempt(1, S)], None),
    (JobState.succeeded, [_attempt(1, P), _attempt(2, I, started=False), _attempt(3, S)], None),
    (JobState.failed, [_attempt(1, F)], None),
    (JobState.failed, [_attempt(1, P), _attempt(2, P)], None),  # the budget spent on the last preemption
    (JobState.running, [_attempt(1, None, state=AttemptState.running)], "not terminal"),
    (JobState.succeeded, [_attempt(1, S), _attempt(2, S)], "ended the job"),
    (JobState.succeeded, [_attempt(1, P), _attempt(3, S)], "attempt numbers"),
    (JobState.succeeded, [_attempt(1, P, state=AttemptState.running), _attempt(2, S)], "never ended"),
    (JobState.failed, [_attempt(1, S)], "history leads to succeeded"),
])
def test_job_history(chaos, state, attempts, problem):
    job = {"id": "j", "state": state.value, "attempts": len(attempts)}
    problems = chaos.job_history_problems(job, attempts)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_a_missing_job_is_a_problem(chaos):
    assert chaos.job_history_problems(None, []) == ["missing"]


@pytest.mark.parametrize("stamps, overlapping", [
    ({1: [10.0, 10.5, 11.0], 2: [12.0, 13.0]}, False),
    ({1: [10.0, 11.0], 2: [10.9, 12.0]}, True),
    ({2: [10.0, 11.0], 1: [10.5]}, True),  # whatever the numbering
    ({1: [], 2: [10.0]}, False),  # an attempt that never ran its command
])
def test_overlaps(chaos, stamps, overlapping):
    assert bool(chaos.overlaps(stamps)) is overlapping


def test_stamps_are_read_from_the_command_output(chaos):
    text = f"noise\n{chaos.STAMP}12.5\n{chaos.STAMP}bad\n{chaos.STAMP}13.25\n"
    assert chaos.stamps_of(text) == [12.5, 13.25]
