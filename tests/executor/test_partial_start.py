"""Issue 35 §3, a partial start: one worker's supervisor could not start the command (its fork failed, say) while
the other workers' commands run. The attempt ends failed_setup at once, and the others are stopped: they would wait
for the missing worker in a collective, the slice idling under a job that has ended."""

from __future__ import annotations

from datetime import timedelta

from tpuq.contracts.messages import AttemptOutcome
from tpuq.executor import decide as executor_decide
from tpuq.executor.outcome import DEFAULT_FAILURE_GRACE, Decided, NodeState, WorkerStatus, decide_outcome

from .factories import T0

NOT_STARTED = "cannot start the command: [Errno 11] Resource temporarily unavailable"


def setup_failed(worker: int) -> WorkerStatus:
    return WorkerStatus(worker_id=worker, attempt_id="a1", ended_at=T0, phase="setup", setup_error=NOT_STARTED)


def decide(statuses: list[WorkerStatus], workers: int = 4):
    return decide_outcome(worker_count=workers, statuses={s.worker_id: s for s in statuses},
                          node_state=NodeState.ready, now=T0 + timedelta(seconds=1))


def test_a_worker_whose_command_never_started_stops_the_others():
    d = decide([setup_failed(3)])
    assert d.outcome is AttemptOutcome.failed_setup and f"worker 3: {NOT_STARTED}" in d.detail
    assert d.stop_workers and executor_decide.stop_after_end(d, None)
    assert executor_decide.stop_reason(d, None).startswith("stopped: setup failed: worker 3: cannot start")


def test_nothing_is_stopped_when_every_worker_has_ended():
    ended = [WorkerStatus(worker_id=w, attempt_id="a1", ended_at=T0, exit_code=0) for w in range(3)]
    assert not decide(ended + [setup_failed(3)]).stop_workers
    assert not decide([setup_failed(0)], workers=1).stop_workers


def test_workers_stopped_after_another_failed_to_launch_are_not_a_cancel():
    """The start stops the workers that did launch when another's launch failed, then publishes infra_failed. Their
    statuses may be judged first (a status notification, a tick): that is an infrastructure failure, retried
    elsewhere, never the job cancelled (on a loaded stack it was, and the job was lost)."""
    from tpuq.executor.executor import LAUNCH_FAILED_STOP

    stopped = [WorkerStatus(worker_id=w, attempt_id="a1", ended_at=T0, signal="SIGTERM", cancelled=True,
                            cancel_reason=LAUNCH_FAILED_STOP) for w in range(3)]
    # The start publishes its own, fuller end at once: a judge of the statuses waits for it, the failure grace.
    waiting = decide(stopped)
    assert not isinstance(waiting, Decided) and waiting.until == T0 + DEFAULT_FAILURE_GRACE, waiting
    # Its instance died before publishing: the attempt is ended here, an infrastructure failure.
    d = decide_outcome(worker_count=4, statuses={s.worker_id: s for s in stopped}, node_state=NodeState.ready,
                       now=T0 + DEFAULT_FAILURE_GRACE)
    assert d.outcome is AttemptOutcome.infra_failed, d
    assert d.detail == "worker 0 stopped: another worker failed to launch"
    # A person's cancel is still a cancel, whatever the reason they gave.
    asked = WorkerStatus(worker_id=3, attempt_id="a1", ended_at=T0, cancelled=True, cancel_reason="test over")
    assert decide([*stopped, asked]).outcome is AttemptOutcome.cancelled
    assert decide_outcome(worker_count=4, statuses={s.worker_id: s for s in stopped}, node_state=NodeState.ready,
                          now=T0, cancel_requested=True).outcome is AttemptOutcome.cancelled
