"""The simulator against the real system (issue 18, "Fidelity"): one small workload, run on the local stack (the
four services as processes, the fake Cloud TPU at time_scale 1, real sshd workers) and in `tpuq_dev.simulate` (the
same handlers in process, the capacity model in virtual time), must end the same way: every job's final state,
its number of attempts and the zone of each attempt. Timing may differ within the bound the simulator's
docstring ("Fidelity") states, which is asserted here too.

The workload (20 jobs, 3 fleet entries, 2 stockouts, a quota-0 zone, 2 scripted preemptions) and why each
choice is forced are in tests/e2e/fidelity/scenario.yaml. On the stack the jobs are submitted one at a time, each
once the one before is stored, with the fleet paused (`tpuq fleet pause`), and the fleet is resumed once all are
in: so both runs see the same queue order, and no job's intake runs while a new slice waits for its first job
(see "Not modelled" in the simulator's Fidelity notes). The simulator, which has no pause, gets the same jobs in the
same order at the instant it starts claiming; both runs' times count from that instant.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime, timezone
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tpuq.contracts import store
from tpuq_dev.capacitymodel.scenario import load_scenario
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.contracts.documents import AttemptDoc, JobDoc
from tpuq.contracts.jobspec import Priority
from tpuq_dev.simulate.bus import Delivery
from tpuq_dev.simulate.run import simulate
from tpuq_dev.simulate.workload import SimJob
from tpuq.operations.tpurunner import read_fleet
from tpuq_dev.devstack.stack import ALL_SERVICES_AVAILABLE, DevStack

from tests.helpers import wait_until

HERE = Path(__file__).resolve().parent / "fidelity"
FLEET, SCENARIO = HERE / "fleet.yaml", HERE / "scenario.yaml"
TICK_SECONDS = 1.0  # the stack's tick period and the simulator's tick_seconds (scenario seconds = real seconds)
SETUP_SECONDS = 3.0  # the simulator's setup per attempt: about what an attempt's SSH, bundle and launch take here
DEADLINE = 600.0  # for the whole workload on a loaded machine; a healthy run takes about a minute


@dataclass(frozen=True)
class Job:
    job_id: str
    tpu: str
    priority: str
    work_seconds: float


# Submit order. s01 and m01 go first, alone on their entries, so the requests for their first slices are
# r-s01-1 and r-m01-1 and the scenario's preemptions hit their nodes; high priority keeps them first in the
# queue for the slice that replaces it. Their work (11 s) outlasts the preemption (10 s after ACTIVE).
WORKLOAD = [
    Job("s01", "v4-8", "high", 11), Job("m01", "v4-16", "high", 11),
    *[job for i in range(2, 6) for job in (Job(f"s0{i}", "v4-8", "normal", 1), Job(f"m0{i}", "v4-16", "normal", 1))],
    *[Job(f"v{i:02d}", "v5litepod-4", "low" if i % 2 else "normal", 2) for i in range(1, 11)],
]
EXPECTED_ZONES = {"v4-8": "us-central2-b", "v4-16": "us-central2-c", "v5litepod-4": "us-west4-a"}
PREEMPTED = {"s01", "m01"}
ONE_SLICE = ("v4-8", "v4-16")  # the entries with count 1


@dataclass(frozen=True)
class Outcome:
    state: str
    attempts: int
    zones: tuple[str, ...]  # the zone of each attempt, in order
    attempt_outcomes: tuple[str, ...]  # shown when the runs differ
    priority: str
    submitted: float  # seconds after the run's origin (the stack's resume, the simulator's start), as stored
    assigned: tuple[float, ...]  # each attempt's assignment, same clock
    finished: float | None


def outcomes(db, origin: datetime) -> dict[str, Outcome]:
    """Per job, from `jobs/{id}` and its attempts as the scheduler stored them: the emulator's Firestore or the
    simulator's in-memory one, read alike; times in seconds after `origin`."""
    jobs = {snap.id: (JobDoc.from_doc(snap.to_dict(), snap.id),
                      sorted((AttemptDoc.from_doc(a.to_dict(), a.id)
                              for a in snap.reference.collection(store.ATTEMPTS).stream()), key=lambda a: a.attempt))
            for snap in db.collection(store.JOBS).stream()}

    def since(t):
        return None if t is None else (t - origin).total_seconds()

    return {job_id: Outcome(job.state.value, job.attempts, tuple(a.zone or "" for a in attempts),
                            tuple(a.outcome or "" for a in attempts), job.priority or "", since(job.submit_time),
                            tuple(since(a.assigned_at) for a in attempts), since(job.finished_at))
            for job_id, (job, attempts) in jobs.items()}


def expected_decisions() -> dict[str, tuple]:
    """What the scenario forces: every job succeeds, the two preempted ones at their second attempt, each attempt
    in the one zone its entry can use."""
    return {j.job_id: ("succeeded", 2 if j.job_id in PREEMPTED else 1,
                       (EXPECTED_ZONES[j.tpu],) * (2 if j.job_id in PREEMPTED else 1)) for j in sorted(WORKLOAD, key=lambda j: j.job_id)}


def decided(o: dict[str, Outcome]) -> dict[str, tuple]:
    """What must match exactly: final state, attempts, the zone of each attempt."""
    return {k: (v.state, v.attempts, v.zones) for k, v in sorted(o.items())}


def run_order(o: dict[str, Outcome]) -> dict[str, list[tuple[str, int]]]:
    """Per TPU type (here: per fleet entry), the attempts in the order they were given a slice. Attempts given
    slices in one pass share an instant; the queue's own order (priority, then submit time) breaks the tie."""
    tpu = {j.job_id: j.tpu for j in WORKLOAD}
    attempts = sorted(((at, -Priority(v.priority).rank, v.submitted, job_id, n + 1)
                       for job_id, v in o.items() for n, at in enumerate(v.assigned)))
    order: dict[str, list[tuple[str, int]]] = {}
    for *_, job_id, n in attempts:
        order.setdefault(tpu[job_id], []).append((job_id, n))
    return order


@pytest.fixture(scope="module")
def fidelity_stack(tmp_path_factory):
    s = DevStack(state_dir=Path(tmp_path_factory.mktemp("tpuq-fidelity")), services=ALL_SERVICES_AVAILABLE(),
                 scenario=SCENARIO, fleet_file=FLEET, time_scale=1.0, tick_period=TICK_SECONDS)
    with s.running():
        yield s


def tpuq(stack, *args: str) -> str:
    done = subprocess.run(["tpuq", *args], env={**os.environ, **stack.env}, capture_output=True, text=True,
                          timeout=DEADLINE)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_on_stack(stack) -> dict[str, Outcome]:
    """Submit the workload as a user does (on `jobs`) to the paused fleet, each job once the one before is
    stored; resume; wait for every job to end."""
    clients = Clients(Settings.from_env(stack.env))
    jobs = clients.firestore.collection(store.JOBS)
    tpuq(stack, "fleet", "pause")
    for job in WORKLOAD:
        clients.publish("jobs", {"id": job.job_id, "tpu": job.tpu, "priority": job.priority,
                                 "command": f"sleep {job.work_seconds:g}"})
        wait_until(lambda: jobs.document(job.job_id).get().exists, timeout=DEADLINE, what=f"{job.job_id} stored")
    resumed = datetime.now(timezone.utc)
    tpuq(stack, "fleet", "resume")

    def all_ended():
        got = outcomes(clients.firestore, resumed)
        return got if all(got.get(j.job_id) and got[j.job_id].state in ("succeeded", "failed", "cancelled")
                          for j in WORKLOAD) else None

    return wait_until(all_ended, timeout=DEADLINE, what="every job of the workload ended")


def run_in_simulator(start: float = 2.0, spacing: float = 0.05) -> dict[str, Outcome]:
    """The workload in the simulator: the jobs `spacing` apart from `start`, in submit order (the push latency,
    5 ms on average as on loopback, never reorders them), times counted from `start`."""
    fleet = read_fleet(yaml.safe_load(FLEET.read_text())).fleet
    jobs = [SimJob(j.job_id, start + spacing * i, (j.tpu,), j.priority, j.work_seconds) for i, j in enumerate(WORKLOAD)]
    run = simulate("tpuq", fleet=fleet, scenario=load_scenario(SCENARIO), jobs=jobs, horizon=3600.0, seed=11,
                   tick_seconds=TICK_SECONDS, setup_seconds=SETUP_SECONDS, delivery=Delivery(latency=0.005))
    return outcomes(run.driver.db, run.loop.wall(start))


def test_simulator_agrees_with_the_stack(fidelity_stack):
    started = time.monotonic()
    stack = run_on_stack(fidelity_stack)
    stack_seconds = time.monotonic() - started
    sim = run_in_simulator()

    detail = "\n".join(f"{j.job_id}: stack {stack.get(j.job_id)}\n     sim   {sim.get(j.job_id)}" for j in WORKLOAD)
    assert decided(stack) == decided(sim), detail
    # ...and both are what the scenario forces, so two runs agreeing on something else would not pass.
    assert decided(sim) == expected_decisions(), detail
    # The timing bound the simulator's docstring states: each one-slice entry gives its slice to the same attempts
    # in the same order (a preempted job first again), whatever each step took. The two-slice entry's order is
    # printed, not asserted: once the stack gave a freed slice to a later low-priority job (v07 before v05, in the
    # pass that placed m01's second attempt), against the queue order the simulator keeps.
    stack_order, sim_order = run_order(stack), run_order(sim)
    assert {t: stack_order[t] for t in ONE_SLICE} == {t: sim_order[t] for t in ONE_SLICE}, detail
    print(json.dumps({"v5litepod-4 order": {"stack": stack_order["v5litepod-4"], "sim": sim_order["v5litepod-4"]}}))
    late = {j.job_id: round(stack[j.job_id].finished - sim[j.job_id].finished, 1) for j in WORKLOAD}
    print(json.dumps({"stack_workload_seconds": round(stack_seconds, 1),
                      "stack_minus_sim_finish_seconds": {"min": min(late.values()), "max": max(late.values())},
                      "per_job": late}))


def test_the_simulator_alone_gives_what_the_scenario_forces():
    """The simulator's half without the stack (seconds): a change to the simulator or the services that breaks
    the forced outcomes shows here first."""
    sim = run_in_simulator()
    assert decided(sim) == expected_decisions()
    assert run_order(sim)["v4-8"] == [("s01", 1), ("s01", 2), *[(f"s0{i}", 1) for i in range(2, 6)]]
