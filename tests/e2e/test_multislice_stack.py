"""Issue 37's whole-system test: a multislice job on the local stack, end to end.

A job of `slices: 2` on 4-host v4-32 slices: the claimer claims one multislice queued resource (the fake's call log:
one create with multisliceParams), the scheduler assigns both slices at once, and all 8 workers start, each seeing
its slice id, its worker id within the slice, the coordinator's address (slice 0's worker 0) and the slice count.
A preemption of one slice suspends the whole request (as the API does); the attempt ends preempted on every slice,
and the job runs again on 2 new slices in the same region with the same CHECKPOINT_GCS_DIR: a second queued
resource. Afterwards every node is deleted. Its own stack, one zone: a race over several zones could claim a second
gang (kept for the pending retry), and the call log's "one queued resource per attempt" would not hold."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid

import pytest

from tpuq.contracts import store
from tpuq.contracts.documents import JobState, short_node_name
from tpuq.contracts.messages import CancelRequest
from tpuq_dev.faketpu.control import FakeTpuControl
from tests.e2e.conftest import demo_stack_with
from tests.helpers import wait_until

DEADLINE = 420  # past the 5-minute backstop for a lost event: a missed pass costs time here, not the outcome
ZONE = "us-central2-a"
# Every worker says where it stands, once; attempt 1 then waits to be preempted, attempt 2 ends at once.
COMMAND = ('echo "where slice=$MEGASCALE_SLICE_ID worker=$TPU_WORKER_ID slices=$MEGASCALE_NUM_SLICES '
           'coordinator=$MEGASCALE_COORDINATOR_ADDRESS tpuq_slice=$TPUQ_SLICE_ID attempt=$TPUQ_ATTEMPT '
           'checkpoints=$CHECKPOINT_GCS_DIR"; if [ "$TPUQ_ATTEMPT" = 1 ]; then sleep 900; fi')
WHERE = re.compile(r"^\[s(\d)/w(\d)\] where slice=(\d) worker=(\d) slices=(\d) coordinator=(\S+) tpuq_slice=(\d) "
                   r"attempt=(\d) checkpoints=(\S+)$")


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory):
    with demo_stack_with(tmp_path_factory.mktemp("multislice"), "v4-32", count=4, zones=[ZONE]) as (stack, clients):
        yield stack, clients


def test_a_two_slice_job_runs_on_all_eight_workers_and_survives_a_preempted_slice(own_stack):
    system, clients = own_stack
    env = {**os.environ, **system.env}
    db = clients.firestore
    control = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"])
    job_id = f"gang-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f} s  {what}")

    def job() -> dict:
        return db.collection(store.JOBS).document(job_id).get().to_dict() or {}

    def attempts() -> dict[str, dict]:
        return {s.id: s.to_dict() for s in db.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS)
                .stream()}

    def where_lines(attempt: int) -> list[tuple]:
        out = subprocess.run(["tpuq", "logs", job_id, "--attempt", str(attempt)], env=env, capture_output=True,
                             text=True, timeout=60).stdout
        return [m.groups() for m in map(WHERE.match, out.splitlines()) if m]

    try:
        clients.publish("jobs", {"id": job_id, "tpu": "v4-32", "slices": 2, "command": COMMAND})
        running = wait_until(lambda: job() if job().get("state") == JobState.running else None, timeout=DEADLINE,
                             what=f"{job_id} running")
        first_gang = running["gang"]
        assert len(first_gang) == 2 and running["tpu"] == first_gang[0]
        mark(f"running on {[short_node_name(n) for n in first_gang]}")
        lines = wait_until(lambda: where_lines(1) if len(where_lines(1)) == 8 else None, timeout=DEADLINE,
                           what="all 8 workers' first lines")
        mark("all 8 workers started")
        coordinator = {line[5] for line in lines}
        assert len(coordinator) == 1
        slice0_worker0 = next(e for e in db.collection(store.TPUS).document(short_node_name(first_gang[0])).get()
                              .to_dict()["endpoints"] if e["worker_id"] == 0)
        assert coordinator.pop().split(":")[0] == slice0_worker0["ip"]
        seen = sorted((int(s), int(w)) for s, w, *_ in lines)
        assert seen == [(s, w) for s in range(2) for w in range(4)]
        for label_s, label_w, slice_id, worker, slices, _, tpuq_slice, attempt, _ in lines:
            assert (slice_id, worker, slices, tpuq_slice, attempt) == (label_s, label_w, "2", label_s, "1")
        checkpoints = {line[8] for line in lines}
        assert len(checkpoints) == 1

        # Slice 1 preempted, as a user does it on the local stack: the fake suspends the whole request; the job runs
        # again on a new gang.
        preempt = subprocess.run(["tpuq", "dev", "preempt", job_id, "--slice", "1", "--notice", "0"], env=env,
                                 capture_output=True, text=True, timeout=60)
        assert preempt.returncode == 0 and short_node_name(first_gang[1]) in preempt.stdout, preempt.stderr
        mark("slice 1 preempted")
        done = wait_until(lambda: job() if job().get("state") == JobState.succeeded else None, timeout=DEADLINE,
                          what=f"{job_id} re-run on a new gang and succeeded")
        mark(f"succeeded on attempt {done['attempts']}")
        tried = attempts()
        assert tried["1"]["outcome"] == "preempted" and tried["2"]["outcome"] == "succeeded"
        second_gang = tried["2"]["gang"]
        assert len(second_gang) == 2 and not set(second_gang) & set(first_gang)
        assert tried["2"]["region"] == tried["1"]["region"] and done["preemptions"] == 1
        again = where_lines(2)
        assert sorted((int(s), int(w)) for s, w, *_ in again) == [(s, w) for s in range(2) for w in range(4)]
        assert {line[8] for line in again} == checkpoints  # the same checkpoint directory
        assert {line[7] for line in again} == {"2"}

        # The call log: one multislice queued resource per attempt.
        made = [c for c in control.calls(method="POST", path_contains="/queuedResources")
                if (c.get("body") or {}).get("tpu")]
        specs = [c["body"]["tpu"]["nodeSpec"][0] for c in made]
        assert len(made) == 2 and all(s.get("multisliceParams", {}).get("nodeCount") == 2 for s in specs), specs
        # Every node deleted afterwards (the fleet's idle timeout, then the janitor): the TPUs' records gone.
        for node in first_gang + second_gang:
            wait_until(lambda node=node: (db.collection(store.TPUS).document(short_node_name(node)).get().to_dict()
                                          or {}).get("state") == "gone", timeout=DEADLINE, what=f"{node} gone")
        mark("every slice gone")
        deleted = {c["path"].rsplit("/", 1)[1] for c in control.calls(method="DELETE", path_contains="/queuedResources/")}
        assert {n.rsplit("/", 1)[1].rsplit("-", 1)[0] for n in first_gang + second_gang} <= deleted
    finally:
        clients.publish("cancels", CancelRequest(job_id=job_id, reason="test over"))
