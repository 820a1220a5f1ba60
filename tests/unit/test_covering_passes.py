"""Whole-queue passes per instance: a request is answered by a pass that began after it, never by an earlier one."""

from __future__ import annotations

import threading

import pytest

from tpuq.scheduler.grouping import CoveringPasses
from tests.helpers import wait_until


def test_requests_made_while_a_pass_runs_share_the_next_pass_and_each_waits_for_one_that_began_after_it():
    covering = CoveringPasses()
    first_running, release_first = threading.Event(), threading.Event()
    began: list[int] = []  # the number of requests made when each pass began
    ended_passes = [0]
    asked = [0]
    lock = threading.Lock()

    def run_pass(batch):
        with lock:
            began.append(asked[0])
        if len(began) == 1:
            first_running.set()
            release_first.wait(30)
        with lock:
            ended_passes[0] += 1

    answered_by_a_later_pass: dict[int, bool] = {}

    def request(n, job_ids=()):
        with lock:
            asked[0] += 1
            made_before = len(began)  # passes that had begun before this request
        covering.run(job_ids, run_pass)
        with lock:
            answered_by_a_later_pass[n] = ended_passes[0] > made_before

    first = threading.Thread(target=request, args=(0,))
    first.start()
    assert first_running.wait(30)
    others = [threading.Thread(target=request, args=(i, [f"j{i}"] if i % 2 else [])) for i in range(1, 20)]
    for t in others:
        t.start()
    wait_until(lambda: covering._asked == 20, 30, "the other requests to wait")
    release_first.set()
    for t in [first, *others]:
        t.join(30)
    assert len(began) == 2 and covering.passes == 2  # not 20: the second covered all 19
    assert len(answered_by_a_later_pass) == 20 and all(answered_by_a_later_pass.values())


def test_the_jobs_requests_name_are_planned_in_the_pass_that_covers_them():
    covering, batches = CoveringPasses(), []
    covering.run(["a"], batches.append)
    covering.run([], batches.append)
    assert batches == [["a"], []]  # one after another: each its own pass, the second began after the first


def test_a_failed_pass_covers_nothing_and_keeps_its_jobs_for_the_next():
    covering = CoveringPasses()

    def failing(batch):
        raise RuntimeError("Firestore unavailable")

    with pytest.raises(RuntimeError):
        covering.run(["a"], failing)
    batches = []
    assert covering.run(["b"], batches.append) is True
    assert batches == [["a", "b"]]
