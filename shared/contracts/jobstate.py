"""Core (pure, no I/O): the job lifecycle, one transition table, and the retry decision after an attempt.

    pending ──assign──► assigned ──start──► running ──succeed──► succeeded
       ▲                   │                   │──fail──────► failed
       └──────requeue──────┴───────────────────┘
    pending | assigned | running ──cancel──► cancelled
    pending ──reject──► rejected   (an invalid submission; intake stores it already rejected)
    pending ──reprioritize──► pending   (`tpuq set-priority`: only a job that has not started)

The states themselves, and which are terminal, are `tpuq.contracts.documents.JobState`.
`TRANSITIONS` is the only place that says which edges exist; `transition` refuses
everything else with `IllegalTransition`. `retry_decision` turns an attempt's
outcome into the next state (pending with a back-off, or a terminal state) and is
pure: the clock and the random source are passed in.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from enum import Enum
from typing import NamedTuple

from tpuq.contracts.documents import JobDoc, JobState
from tpuq.contracts.errors import Permanent
from tpuq.contracts.fleet import RetryBudgets
from tpuq.contracts.jobspec import Priority
from tpuq.contracts.messages import AttemptOutcome


class JobEvent(str, Enum):
    assign = "assign"  # the scheduler paired the job with an idle TPU
    unassign = "unassign"  # the assignment was undone before the attempt started (TPU gone, lost race)
    start = "start"  # the executor reported the attempt started
    succeed = "succeed"
    fail = "fail"  # terminal failure: application error, setup error, or retry budget spent
    requeue = "requeue"  # preempted or infra-failed attempt with budget left: back to the queue
    cancel = "cancel"
    reject = "reject"  # the submission is invalid
    reprioritize = "reprioritize"  # `tpuq set-priority`: a new priority for a job that has not started


_S, _E = JobState, JobEvent

# Every allowed edge. An attempt's `ended` event may overtake its `started` event
# (Pub/Sub does not order them), so an attempt may end straight from `assigned`.
TRANSITIONS: dict[tuple[JobState, JobEvent], JobState] = {
    (_S.pending, _E.assign): _S.assigned,
    (_S.pending, _E.cancel): _S.cancelled,
    (_S.pending, _E.reject): _S.rejected,
    (_S.pending, _E.reprioritize): _S.pending,
    (_S.assigned, _E.unassign): _S.pending,
    (_S.assigned, _E.start): _S.running,
    (_S.assigned, _E.succeed): _S.succeeded,
    (_S.assigned, _E.fail): _S.failed,
    (_S.assigned, _E.requeue): _S.pending,
    (_S.assigned, _E.cancel): _S.cancelled,
    (_S.running, _E.succeed): _S.succeeded,
    (_S.running, _E.fail): _S.failed,
    (_S.running, _E.requeue): _S.pending,
    (_S.running, _E.cancel): _S.cancelled,
}


class IllegalTransition(Permanent):
    """The table has no edge for (state, event); the caller should drop the event, not retry it."""

    def __init__(self, state: JobState, event: JobEvent):
        super().__init__(f"job in state {state.value!r} cannot take event {event.value!r}", field="state")
        self.state = state
        self.event = event


def transition(state: JobState | str, event: JobEvent | str) -> JobState:
    """The state after `event`, or IllegalTransition when the table has no such edge."""
    state, event = JobState(state), JobEvent(event)
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(state, event) from None


def allowed_events(state: JobState | str) -> frozenset[JobEvent]:
    state = JobState(state)
    return frozenset(e for (s, e) in TRANSITIONS if s is state)


def reprioritized(job: dict, priority: Priority, now: datetime) -> dict | None:
    """The fields `tpuq set-priority` writes to a stored job: the priority the matcher reads (`spec.priority`)
    and the one the pending query orders by (`priority_rank`). None: it has that priority already (a repeat
    writes nothing). IllegalTransition for a job that is not pending (assigned, running, ended)."""
    view = JobDoc.from_doc(job)
    transition(view.state, JobEvent.reprioritize)
    if (view.spec or {}).get("priority", view.priority) == priority.value and view.priority_rank == priority.rank:
        return None
    return JobDoc.fields(priority=priority.value, priority_rank=priority.rank, updated_at=now) | {
        JobDoc.field("spec", "priority"): priority.value}


def still_unstarted(job: dict, expected_attempt: int | None) -> bool:
    """`tpuq cancel --if-pending`'s guard: pending, and no attempt begun since the CLI read the job when it had
    `expected_attempt` attempts (None: any number)."""
    if job.get("state") != JobState.pending:
        return False
    return expected_attempt is None or int(job.get("attempt") or 0) == expected_attempt


class RetryDecision(NamedTuple):
    next_state: JobState
    not_before: datetime | None  # earliest time the job may be scheduled again; None: now / never
    reason: str

    @property
    def event(self) -> JobEvent:
        """The table edge that takes the job of a finished attempt to `next_state`."""
        return _EVENT_INTO[self.next_state]


_EVENT_INTO = {
    JobState.pending: JobEvent.requeue,
    JobState.succeeded: JobEvent.succeed,
    JobState.failed: JobEvent.fail,
    JobState.cancelled: JobEvent.cancel,
}


# Terminal outcomes need no budget: the outcome itself decides.
_TERMINAL_OUTCOMES: dict[AttemptOutcome, tuple[JobState, str]] = {
    AttemptOutcome.succeeded: (JobState.succeeded, "succeeded"),
    AttemptOutcome.failed: (JobState.failed, "the job's command failed"),
    AttemptOutcome.failed_setup: (JobState.failed, "setting up the workers failed"),
    AttemptOutcome.cancelled: (JobState.cancelled, "cancelled"),
}


def backoff_seconds(retries_used: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential back-off with 'equal jitter': half fixed, half random, within [d/2, d].

    d = min(cap, base * 2**retries_used). The fixed half keeps a retry storm from
    landing on the same instant as the failure; the random half spreads jobs that
    were preempted together.
    """
    if base <= 0 or cap <= 0:
        return 0.0
    # 2**64 is already far past any cap; bounding the exponent avoids huge floats.
    delay = min(cap, base * 2.0 ** min(max(retries_used, 0), 64))
    return delay / 2 + rng.uniform(0.0, delay / 2)


def retry_decision(
    outcome: AttemptOutcome | str,
    preemptions_used: int,
    infra_failures_used: int,
    budgets: RetryBudgets,
    max_preemptions: int | None,
    max_infra_retries: int | None,
    now: datetime,
    rng: random.Random,
    retry_on_infrastructure_failure: bool = True,
) -> RetryDecision:
    """What happens to a job whose attempt ended with `outcome`.

    `preemptions_used` / `infra_failures_used` count the retries already granted
    for earlier attempts, not this one. The job's own `max_preemptions` /
    `max_infra_retries` override the fleet's budgets when set, and its
    `retry_on_infrastructure_failure: false` (tpu-runner's field) fails the job at
    its first preemption or infrastructure failure. A retry goes back
    to pending with `not_before = now + backoff`; a spent budget fails the job
    with a reason that names the budget.
    """
    outcome = AttemptOutcome(outcome)
    if outcome in _TERMINAL_OUTCOMES:
        state, reason = _TERMINAL_OUTCOMES[outcome]
        return RetryDecision(state, None, reason)

    if outcome is AttemptOutcome.preempted:
        used, limit = preemptions_used, budgets.preemptions if max_preemptions is None else max_preemptions
        what, budget_name = "preempted", "max_preemptions"
    else:
        used, limit = infra_failures_used, budgets.infra_failures if max_infra_retries is None else max_infra_retries
        what, budget_name = "infrastructure failure", "max_infra_retries"

    if not retry_on_infrastructure_failure:
        return RetryDecision(JobState.failed, None, f"{what}: not retried (retry_on_infrastructure_failure: false)")
    if used >= limit:
        return RetryDecision(
            JobState.failed,
            None,
            f"{what}: retry budget spent ({budget_name}={limit}, used {used})",
        )
    delay = backoff_seconds(used, budgets.backoff_base_seconds, budgets.backoff_max_seconds, rng)
    return RetryDecision(
        JobState.pending,
        now + timedelta(seconds=delay),
        f"{what}: retry {used + 1} of {limit}",
    )
