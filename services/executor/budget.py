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

While a delivery starts an attempt it holds a lease on the attempt's record (`tpuq.executor.decide.start_underway`):
`START_LEASE_SECONDS` long and renewed every `LEASE_RENEW_SECONDS` for as long as the start runs, so a delivery
that dies (its instance killed, its container out of memory) leaves a lease that ends within a minute, not one as
long as the whole budget. A copy of the assignment that arrives meanwhile starts nothing beside it: it waits, up to
`UNDERWAY_WAIT_SECONDS`, for the start to end or the lease to run out (then it starts the attempt itself).
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


START_LEASE_SECONDS = 60.0  # a start's lease on its attempt, renewed while the start runs
LEASE_RENEW_SECONDS = 15.0  # renewed this often: three renewals may fail (a slow Firestore) before it lapses
UNDERWAY_POLL_SECONDS = 2.0  # a copy that found the attempt leased reads the record again this often
# ... for at most this long: enough to see a dead holder's lease run out; a holder that is still renewing after it is
# alive, and the copy is acknowledged (were the holder to die later, the scheduler's tick sends the assignment again).
UNDERWAY_WAIT_SECONDS = START_LEASE_SECONDS + 2 * UNDERWAY_POLL_SECONDS


def start_lease_seconds() -> float:
    """How long one lease (or one renewal) of a starting delivery keeps other copies of its assignment from starting
    the attempt."""
    return START_LEASE_SECONDS


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
