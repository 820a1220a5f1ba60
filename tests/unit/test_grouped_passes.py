"""New-job passes grouped per instance: every job is covered by a pass that ended before its push returned."""

from __future__ import annotations

import threading

import pytest

from tpuq.scheduler.grouping import GroupedPasses
from tests.helpers import wait_until


def test_jobs_stored_while_a_pass_runs_are_planned_together_and_each_push_waits_for_its_pass():
    grouped = GroupedPasses()
    first_running, release_first = threading.Event(), threading.Event()
    passes: list[list[str]] = []
    ended: set[str] = set()

    def run_pass(batch):
        passes.append(batch)
        if len(passes) == 1:
            first_running.set()
            release_first.wait(30)
        ended.update(batch)

    returned_after_its_pass: dict[str, bool] = {}

    def push(job_id):
        grouped.plan([job_id], run_pass)
        returned_after_its_pass[job_id] = job_id in ended

    first = threading.Thread(target=push, args=("j0",))
    first.start()
    assert first_running.wait(30)
    others = [threading.Thread(target=push, args=(f"j{i}",)) for i in range(1, 20)]
    for t in others:
        t.start()
    wait_until(lambda: len(grouped._waiting) == 19, 30, "the other pushes to wait")
    release_first.set()
    for t in [first, *others]:
        t.join(30)
    assert passes[0] == ["j0"] and len(passes) == 2 and sorted(passes[1]) == sorted(f"j{i}" for i in range(1, 20))
    assert len(returned_after_its_pass) == 20 and all(returned_after_its_pass.values())


def test_a_failed_pass_keeps_its_jobs_for_the_next_one():
    grouped = GroupedPasses()

    def failing(batch):
        raise RuntimeError("Firestore unavailable")

    with pytest.raises(RuntimeError):
        grouped.plan(["a"], failing)
    covered = []
    grouped.plan(["b"], covered.extend)
    assert sorted(covered) == ["a", "b"]


def test_a_redelivered_job_gets_a_pass_again():
    grouped, covered = GroupedPasses(), []
    grouped.plan(["a"], covered.extend)
    grouped.plan(["a"], covered.extend)
    assert covered == ["a", "a"]
