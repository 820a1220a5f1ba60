"""The outcome decision over per-worker statuses and the node's state."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tpuq.executor.outcome import Decided, NodeState, Wait, WorkerStatus, decide_outcome
from tpuq.contracts.messages import AttemptOutcome

from .factories import T0

GRACE = timedelta(seconds=30)


def st(worker: int, exit_code: int | None = 0, at: int = 0, **kw) -> WorkerStatus:
    return WorkerStatus(worker_id=worker, attempt_id="a1", ended_at=T0 + timedelta(seconds=at), exit_code=exit_code, **kw)


def decide(statuses, *, workers=4, node=NodeState.ready, now_s=0, **kw):
    return decide_outcome(
        worker_count=workers,
        statuses={s.worker_id: s for s in statuses},
        node_state=node,
        now=T0 + timedelta(seconds=now_s),
        failure_grace=GRACE,
        **kw,
    )


def test_all_zero_is_success_with_exit_codes():
    d = decide([st(i) for i in range(4)])
    assert isinstance(d, Decided) and d.outcome == AttemptOutcome.succeeded
    assert d.exit_codes == {"0": 0, "1": 0, "2": 0, "3": 0}


def test_success_stands_even_if_the_node_went_away_afterwards():
    assert decide([st(i) for i in range(4)], node=NodeState.preempted).outcome == AttemptOutcome.succeeded


def test_nothing_ended_waits_without_deadline():
    assert decide([]) == Wait("0 of 4 workers ended")
    assert decide([st(0), st(1)]) == Wait("2 of 4 workers ended")


def test_all_ended_with_a_non_zero_exit_fails_with_diagnostic():
    bad = st(2, 1, tail="".join(f"line {i}\n" for i in range(100)),
             disk={"free_bytes": 2**30, "total_bytes": 100 * 2**30},
             memory={"available_bytes": 3 * 2**30, "total_bytes": 8 * 2**30})
    d = decide([st(0), st(1), bad, st(3)])
    assert d.outcome == AttemptOutcome.failed
    assert d.exit_codes["2"] == 1
    assert "worker 2 exited 1" in d.detail
    assert "disk 1.0 GiB free of 100.0 GiB" in d.detail
    assert "memory 3.0 GiB available of 8.0 GiB" in d.detail
    assert "line 99" in d.detail and "line 79" not in d.detail  # last 20 lines only


def test_partial_failure_waits_for_the_grace_then_fails():
    statuses = [st(0, 0), st(1, 137, at=10, signal="SIGKILL")]
    d = decide(statuses, now_s=20)
    assert isinstance(d, Wait) and d.until == T0 + timedelta(seconds=40)
    d = decide(statuses, now_s=40)
    assert d.outcome == AttemptOutcome.failed
    assert "worker 1 exited 137 (SIGKILL)" in d.detail and "no status yet from worker 2, 3" in d.detail
    assert d.stop_workers  # 2 and 3 still run (blocked in a collective, say): stopped, the slice freed
    assert not decide(statuses + [st(2, 0, at=11), st(3, 0, at=12)], now_s=12).stop_workers  # all ended


def test_grace_runs_from_the_first_failure():
    d = decide([st(1, 1, at=10), st(2, 1, at=25)], now_s=30)
    assert d.until == T0 + timedelta(seconds=40)


def test_setup_failure_is_terminal_at_once():
    d = decide([st(3, None, phase="setup", setup_error="bundle gs://b/x does not exist")])
    assert d.outcome == AttemptOutcome.failed_setup
    assert "worker 3: bundle gs://b/x does not exist" in d.detail


def test_preempted_or_gone_node_is_retryable_even_after_failures():
    for node in (NodeState.preempted, NodeState.gone):
        assert decide([st(0, 1)], node=node).outcome == AttemptOutcome.preempted
        assert decide([], node=node).outcome == AttemptOutcome.preempted


def test_unknown_node_state_is_not_evidence():
    assert isinstance(decide([st(0, 1)], node=NodeState.unknown), Wait)


def test_preemption_notice_seen_by_a_worker_is_preempted():
    assert decide([st(0, 143, preempted=True)], workers=1).outcome == AttemptOutcome.preempted


def test_the_others_are_given_the_notice_to_save_before_the_attempt_ends():
    """Worker 0, the one that writes the checkpoint, is still saving when the others have stopped: the attempt does
    not end (and free its slice for deletion) before it has, or before the notice's 30 s are over."""
    others = [st(i, 143, at=2, preempted=True) for i in (1, 2, 3)]
    waiting = decide(others, now_s=10)
    assert isinstance(waiting, Wait) and waiting.until == T0 + timedelta(seconds=32), waiting
    assert decide(others + [st(0, 143, at=12, preempted=True)], now_s=12).outcome == AttemptOutcome.preempted
    assert decide(others, now_s=32).outcome == AttemptOutcome.preempted  # worker 0 never reported: gone with its VM
    assert decide(others, now_s=10, node=NodeState.preempted).outcome == AttemptOutcome.preempted


@pytest.mark.parametrize("statuses, kw, outcome, detail", [
    # A job that checkpoints on the notice's SIGTERM and exits 0 has not finished: preempted, retried.
    ([st(i, 0, preempted=True) for i in range(4)], {}, AttemptOutcome.preempted, "worker 0, 1, 2, 3 saw the preemption notice"),
    # Named by number, whichever noticed first.
    ([st(w, 0, at=n, preempted=True) for n, w in enumerate([1, 2, 0, 3])], {"now_s": 40}, AttemptOutcome.preempted,
     "worker 0, 1, 2, 3 saw the preemption notice"),
    ([st(0, 143, preempted=True, preemption_notice="host maintenance (TERMINATE_ON_HOST_MAINTENANCE)")], {"workers": 1},
     AttemptOutcome.preempted, "worker 0 saw the notice of host maintenance (TERMINATE_ON_HOST_MAINTENANCE)"),
    # max_duration: failed at once (terminal), whatever the exit codes, the node or the other workers.
    ([st(0, 143, timed_out=True, max_duration_seconds=7200, tail="step 99\n")], {}, AttemptOutcome.failed,
     "timed out after 2h (max_duration): worker 0 stopped\nlast lines of worker 0:\nstep 99"),
    ([st(i, 0, timed_out=True, max_duration_seconds=5400) for i in range(4)], {}, AttemptOutcome.failed,
     "timed out after 1h30m (max_duration): worker 0, 1, 2, 3 stopped"),
    ([st(1, 137, timed_out=True, max_duration_seconds=90)], {"node": NodeState.preempted}, AttemptOutcome.failed,
     "timed out after 1m30s (max_duration): worker 1 stopped"),
    ([st(0, 143, timed_out=True, max_duration_seconds=90)], {"cancel_requested": True}, AttemptOutcome.cancelled,
     "cancelled"),
], ids=["notice-then-exit-0", "noticed-out-of-order", "maintenance-notice", "timed-out-one", "timed-out-all-exit-0", "timed-out-beats-node",
        "cancel-beats-timeout"])
def test_preemption_notice_and_max_duration(statuses, kw, outcome, detail):
    d = decide(statuses, **kw)
    assert isinstance(d, Decided) and (d.outcome, d.detail) == (outcome, detail)


def test_timed_out_status_round_trip():
    data = {"worker_id": 0, "attempt_id": "a1", "ended_at": "2025-01-01T12:00:05Z", "exit_code": 143,
            "timed_out": True, "max_duration_seconds": 60, "preempted": False}
    s = WorkerStatus.from_json(data)
    assert (s.timed_out, s.max_duration_seconds, s.preempted) == (True, 60, False)


def test_lost_host_without_status_is_preempted():
    assert decide([st(0)], lost_workers=frozenset({2})).outcome == AttemptOutcome.preempted
    # A worker that did write its status is not lost.
    assert isinstance(decide([st(0)], lost_workers=frozenset({0})), Wait)


def test_cancel_wins():
    assert decide([st(0, 143)], cancel_requested=True).outcome == AttemptOutcome.cancelled
    assert decide([st(0, 143, cancelled=True)]).outcome == AttemptOutcome.cancelled


def test_status_json_round_trip_uses_storage_time():
    data = {"worker_id": 1, "attempt_id": "a1", "ended_at": "2025-01-01T12:00:05Z", "exit_code": 3, "phase": "run"}
    assert WorkerStatus.from_json(data).ended_at == T0 + timedelta(seconds=5)
    assert WorkerStatus.from_json(data, stored_at=T0).ended_at == T0
