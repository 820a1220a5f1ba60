"""One simulation run: a policy, a fleet, a scenario and a workload, on one seed, for a horizon."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from tpuq.capacitymodel.scenario import Scenario
from tpuq.documents import TpuNodeState
from tpuq.fleet import FleetFile

from .cloud import SimCloud
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


def _policy_driver(name: str, **kwargs):
    if name == "tpuq":
        from .tpuq_policy import TpuqPolicy

        return TpuqPolicy(**kwargs)
    if name == "polling":
        from .polling import PollingPolicy

        return PollingPolicy(**kwargs)
    raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}")


def simulate(policy: str, *, fleet: FleetFile, scenario: Scenario, jobs: list[SimJob], horizon: float,
             seed: int = 0, on_progress: Callable[[float], None] | None = None, **policy_options) -> Run:
    loop = EventLoop()
    cloud = SimCloud(scenario, loop)
    workers = SimWorkers(loop, {j.job_id: j for j in jobs})
    run = Run(policy, loop, cloud, workers, jobs, horizon)
    workers.before_end = lambda: sync_workers(run)
    run.driver = _policy_driver(policy, loop=loop, cloud=cloud, workers=workers, jobs=jobs, fleet=fleet,
                                rng=random.Random(seed), **policy_options)
    run.driver.start()
    loop.every(60.0, lambda: sync_workers(run), first=0.0)
    loop.run(horizon, on_progress=on_progress)
    return run


def sync_workers(run: Run) -> None:
    """Stop the attempts whose hosts went away, at the time they went (the model stamps every change)."""
    world = run.cloud.world
    world.advance()
    for node_name in list(run.workers._by_node):
        if not run.workers._by_node[node_name]:
            continue
        node = world.nodes.get(node_name)
        if node is None:
            run.workers.node_gone(node_name, run.loop.now())
        elif node.state != TpuNodeState.READY:
            qr = world.queued_resources.get(node.queued_resource)
            at = qr.state_since if qr is not None else run.loop.now()
            run.workers.node_gone(node_name, at, RunEnd.preempted)
