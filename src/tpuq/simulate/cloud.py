"""The cloud of a simulation: the capacity model on the virtual clock, answering in the REST API's JSON.

Every call is counted by kind (`queuedResources.create`, `nodes.get`...) and creates by zone, whichever policy
makes them. Errors are the model's `ApiError` (status, message, details: what the real API would answer).
"""

from __future__ import annotations

import random
from collections import Counter

from tpuq.capacitymodel.model import FakeTpuWorld
from tpuq.capacitymodel.render import render_node, render_operation, render_queued_resource
from tpuq.capacitymodel.scenario import Scenario

from .events import EventLoop

SIM_PROJECT = "tpuq-sim"


class SimCloud:
    def __init__(self, scenario: Scenario, loop: EventLoop, project: str = SIM_PROJECT, **world_options) -> None:
        self.loop = loop
        self.project = project
        self.world = FakeTpuWorld(scenario, clock=loop, rng=random.Random(scenario.seed), **world_options)
        self.calls: Counter[str] = Counter()
        self.creates_per_zone: Counter[str] = Counter()
        self.mutations = 0  # creates and deletes asked for

    def count(self, kind: str, zone: str | None = None) -> None:
        self.calls[kind] += 1
        if kind.endswith((".create", ".delete")):
            self.mutations += 1
        if kind == "queuedResources.create" and zone:
            self.creates_per_zone[zone] += 1

    def scenario_changes(self) -> list[float]:
        """The instants at which the scenario's billing changes (quota is fixed for a run)."""
        return sorted({t for w in self.world.scenario.billing.disabled_windows for t in (w.start, w.end)
                       if t is not None})

    def next_transition(self) -> float | None:
        """When the cloud next changes by itself (a request moving on, a preemption, a delete finishing)."""
        if hasattr(self.world, "next_due"):
            return self.world.next_due()
        return _next_due(self.world)

    # -- the REST API, in its JSON ------------------------------------------------------------
    def create_queued_resource(self, zone: str, qr_id: str, body: dict, request_id: str | None = None) -> dict:
        self.count("queuedResources.create", zone)
        self.world.check_call(self.project, zone, "POST", "queuedResources")
        op = self.world.create_queued_resource(self.project, zone, qr_id, body, request_id)
        return render_operation(self.world, op, "v2")

    def get_queued_resource(self, zone: str, qr_id: str) -> dict:
        self.count("queuedResources.get")
        self.world.check_call(self.project, zone, "GET", "queuedResources")
        return render_queued_resource(self.world, self.world.get_queued_resource(self.project, zone, qr_id))

    def list_queued_resources(self, zone: str) -> list[dict]:
        self.count("queuedResources.list")
        self.world.check_call(self.project, zone, "GET", "queuedResources")
        items, _ = self.world.list_queued_resources(self.project, zone)
        return [render_queued_resource(self.world, q) for q in items]

    def delete_queued_resource(self, zone: str, qr_id: str, force: bool = False) -> dict:
        self.count("queuedResources.delete")
        self.world.check_call(self.project, zone, "DELETE", "queuedResources")
        return render_operation(self.world, self.world.delete_queued_resource(self.project, zone, qr_id, force), "v2")

    def get_node(self, zone: str, node_id: str) -> dict:
        self.count("nodes.get")
        self.world.check_call(self.project, zone, "GET", "nodes")
        return render_node(self.world, self.world.get_node(self.project, zone, node_id))

    def list_nodes(self, zone: str) -> list[dict]:
        self.count("nodes.list")
        self.world.check_call(self.project, zone, "GET", "nodes")
        items, _ = self.world.list_nodes(self.project, zone)
        return [render_node(self.world, n) for n in items]

    def delete_node(self, zone: str, node_id: str) -> dict:
        self.count("nodes.delete")
        self.world.check_call(self.project, zone, "DELETE", "nodes")
        return render_operation(self.world, self.world.delete_node(self.project, zone, node_id), "v2")


def _next_due(world: FakeTpuWorld) -> float | None:
    """The earliest scheduled change of the model's live records (until the model says it itself)."""
    from tpuq.documents import QueuedResourceState as Qr, TpuNodeState as Node

    d = world.scenario.delays
    now = world.clock.now()
    times: list[float] = []
    for qr in world.queued_resources.values():
        since = qr.state_since
        if qr.state == Qr.ACCEPTED:
            times.append(since + d.accepted)
        elif qr.state == Qr.WAITING_FOR_RESOURCES:
            times.append(max(since + d.waiting, now))  # waiting on a stockout: asked again at every read
        elif qr.state == Qr.PROVISIONING:
            times.append(since + d.provisioning)
        elif qr.state == Qr.SUSPENDING:
            times.append(since + d.suspending)
        elif qr.state == Qr.DELETING and qr.delete_done_at is not None:
            times.append(qr.delete_done_at)
        if qr.valid_until is not None and qr.state in (Qr.ACCEPTED, Qr.WAITING_FOR_RESOURCES):
            times.append(qr.valid_until)
        node = qr.node
        if node is not None and node.state == Node.READY:
            if node.preempt_at is not None:
                times.append(node.preempt_at)
            for rule in world.scenario.preemption.scripted:
                if rule.at is not None and rule.at >= (node.active_since or 0):
                    times.append(rule.at)
    for node in world.nodes.values():
        if node.state == Node.DELETING and node.delete_done_at is not None:
            times.append(node.delete_done_at)
    times += [t for t in world.scenario.billing.disabled_windows and
              [e for w in world.scenario.billing.disabled_windows for e in (w.start, w.end) if e is not None]
              if t > now]
    return min(times) if times else None
