"""One simulation run: a policy, a fleet, a scenario and a workload, on one seed, for a horizon."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from tpuq_dev.capacitymodel.scenario import Scenario
from tpuq.contracts.documents import TpuNodeState
from tpuq.contracts.fleet import FleetFile

from .cloud import SimCloud, slice_lives
from .events import EventLoop
from .workers import RunEnd, SimWorkers
from .workload import SimJob

POLICIES = ("tpuq", "polling", "bound")


@dataclass
class Run:
    policy: str
    loop: EventLoop
    cloud: SimCloud
    workers: SimWorkers
    jobs: list[SimJob]
    horizon: float
    driver: object = None

    @property
    def slices(self):
        """Every slice that existed, from the cloud's own transition record."""
        return slice_lives(self.cloud.transitions, self.horizon)


def _policy_driver(name: str, **kwargs):
    if name == "tpuq":
        from .tpuq_policy import TpuqPolicy

        return TpuqPolicy(**kwargs)
    if name == "polling":
        from .polling import PollingPolicy

        return PollingPolicy(**kwargs)
    raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}")


def simulate(policy: str, *, fleet: FleetFile, scenario: Scenario, jobs: list[SimJob], horizon: float,
             seed: int = 0, on_progress: Callable[[float], None] | None = None,
             setup_seconds: float = SimWorkers.setup_seconds, check_bodies: bool = False, **policy_options) -> Run:
    """`check_bodies`: the cloud renders every read afresh and checks its kept body against it (tests)."""
    loop = EventLoop()
    cloud = SimCloud(scenario, loop, check_bodies=check_bodies)
    workers = SimWorkers(loop, {j.job_id: j for j in jobs}, setup_seconds=setup_seconds)
    run = Run(policy, loop, cloud, workers, jobs, horizon)
    workers.before_end = cloud.world.advance  # a preemption stamped before the work's end comes first
    cloud.listeners.append(lambda t: _stop_lost_work(workers, t))
    run.driver = _policy_driver(policy, loop=loop, cloud=cloud, workers=workers, jobs=jobs, fleet=fleet,
                                rng=random.Random(seed), **policy_options)
    run.driver.start()
    loop.run(horizon, on_progress=on_progress)
    return run


def _stop_lost_work(workers: SimWorkers, t) -> None:
    """A node preempted or removed takes its running attempts' work with it, at the instant it went."""
    if t.kind == "node" and (t.state is None or t.state == TpuNodeState.PREEMPTED):
        workers.node_gone(t.name, t.at, RunEnd.preempted)
