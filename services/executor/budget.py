"""How long one start of an attempt may take: one owner for the budget, passed down as a deadline.

An assignment reaches the executor as a Pub/Sub push. Pub/Sub waits the assignments subscription's ack deadline
(600 s, `tpuq.contracts.topology`) for the answer, "for push delivery, this value is also used to set the request timeout for
the call to the push endpoint" (pubsub v1 discovery, Subscription.ackDeadlineSeconds), and delivers the message
again after it. Cloud Run's request timeout for the executor is never shorter (`tpuq.deploy.infra` refuses less),
so the ack deadline is the bound. A start that outlasted it ran a second start beside the first.

So a start gets `start_budget_seconds()`: the ack deadline less START_MARGIN_SECONDS, which leaves room for what
the handler does around it (Firestore, publishing; the time the push waited for a thread) and for stopping the
workers that did launch when another did not (CLEANUP_SECONDS, outside the budget). Every step of the start takes
its timeout from what is left (`Deadline.cap`): the wait for host keys, each connect and the pauses between its
retries, each SFTP write and each SSH command. When nothing is left the step fails with `BudgetExhausted`, and the
attempt ends `infra_failed`, saying so (`tpuq.executor.executor`).

While a delivery starts an attempt it holds a lease on the attempt's record for `start_lease_seconds()`, the
budget and the cleanup: another copy of the assignment that arrives meanwhile starts nothing
(`tpuq.executor.decide.start_underway`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpuq.contracts import topology

EXECUTOR = "executor"
ASSIGNMENTS_PATH = "/push/assignments"
START_MARGIN_SECONDS = 120.0
CLEANUP_SECONDS = 30.0  # stopping workers that launched when another did not: after the budget, inside the margin
MIN_STEP_SECONDS = 1.0  # less than this left: the step is not begun


def request_seconds() -> int:
    """How long the executor has to answer an assignment push: its subscription's ack deadline."""
    sub = topology.subscription_by_path(EXECUTOR, ASSIGNMENTS_PATH)
    if sub is None:
        raise LookupError(f"tpuq.contracts.topology declares no subscription pushing to {EXECUTOR}{ASSIGNMENTS_PATH}")
    return sub.ack_deadline_seconds


def start_budget_seconds(request: float | None = None, margin: float = START_MARGIN_SECONDS) -> float:
    request = request_seconds() if request is None else request
    if margin >= request:
        raise ValueError(f"a start margin of {margin:.0f} s leaves nothing of a {request:.0f} s request")
    return request - margin


def start_lease_seconds(budget: float | None = None) -> float:
    """How long a delivery that starts an attempt keeps other copies of its assignment from starting it."""
    return (start_budget_seconds() if budget is None else budget) + CLEANUP_SECONDS


class BudgetExhausted(Exception):
    """The start's time ran out before a step could begin."""


@dataclass(frozen=True)
class Deadline:
    """A point on a monotonic clock (the executor's, so tests pass a fake one), and the budget it ends."""

    at: float
    seconds: float
    monotonic: Callable[[], float]

    @classmethod
    def after(cls, seconds: float, monotonic: Callable[[], float]) -> "Deadline":
        return cls(monotonic() + seconds, seconds, monotonic)

    def remaining(self) -> float:
        return max(0.0, self.at - self.monotonic())

    @property
    def expired(self) -> bool:
        return self.remaining() < MIN_STEP_SECONDS

    def cap(self, seconds: float, step: str) -> float:
        """`seconds`, or what is left of the budget when that is less; BudgetExhausted when nothing is left."""
        left = self.remaining()
        if left < MIN_STEP_SECONDS:
            raise BudgetExhausted(f"{self.describe()} ran out before {step}")
        return min(seconds, left)

    def describe(self) -> str:
        return f"the start's time budget of {self.seconds:.0f} s"
