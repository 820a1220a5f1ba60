"""The cloud of a simulation: the capacity model on the virtual clock, answering in the REST API's JSON.

Every call is counted by kind (`queuedResources.create`, `nodes.get`...) and creates by zone, whichever policy
makes them. Errors are the model's `ApiError` (status, message, details: what the real API would answer).
"""

from __future__ import annotations

import pickle
import random
from collections import Counter
from collections.abc import Callable

from tpuq_dev.capacitymodel.model import FakeTpuWorld, Transition
from tpuq_dev.capacitymodel.render import render_node, render_operation, render_queued_resource
from tpuq_dev.capacitymodel.scenario import Scenario

from .events import EventLoop

SIM_PROJECT = "tpuq-sim"


class SimCloud:
    def __init__(self, scenario: Scenario, loop: EventLoop, project: str = SIM_PROJECT, check_bodies: bool = False,
                 **world_options) -> None:
        self.loop = loop
        # Each resource's last rendered body, with what it was rendered from (`_body`). `check_bodies`: render
        # every read anyway and fail if the kept body differs (the test that the fingerprints miss nothing).
        self._bodies: dict[str, tuple] = {}
        self.check_bodies = check_bodies
        self.project = project
        self.transitions: list[Transition] = []  # every state change, stamped when it happened
        self.listeners: list = []  # called with each transition (the workers: a node that goes, goes with its work)
        self.world = FakeTpuWorld(scenario, clock=loop, rng=random.Random(scenario.seed),
                                  on_transition=self._transition, **world_options)
        self._scenario_changes = sorted({t for w in scenario.billing.disabled_windows for t in (w.start, w.end)
                                         if t is not None})
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
        return list(self._scenario_changes)

    def next_transition(self) -> float | None:
        """When the cloud next changes by itself (a request moving on, a preemption, a delete finishing, a
        billing window's edge)."""
        due = self.world.next_due()
        now = self.loop.now()
        edge = next((t for t in self._scenario_changes if t > now), None)
        if edge is None or (due is not None and due <= edge):
            return due
        return edge

    def _transition(self, t: Transition) -> None:
        self.transitions.append(t)
        if t.state is None:
            self._bodies.pop(t.name, None)  # removed: its kept body goes too (a name used again is another record)
        for listener in self.listeners:
            listener(t)

    # -- the REST API, in its JSON ------------------------------------------------------------
    def create_queued_resource(self, zone: str, qr_id: str, body: dict, request_id: str | None = None) -> dict:
        self.count("queuedResources.create", zone)
        self.world.check_call(self.project, zone, "POST", "queuedResources")
        op = self.world.create_queued_resource(self.project, zone, qr_id, body, request_id)
        return render_operation(self.world, op, "v2")

    def get_queued_resource(self, zone: str, qr_id: str) -> dict:
        return self.queued_resource_body(zone, qr_id)[0]

    def queued_resource_body(self, zone: str, qr_id: str) -> tuple[dict, bytes]:
        """The queued resource's JSON body (not to be changed: it is kept for the next read) and its `body_key`."""
        self.count("queuedResources.get")
        self.world.check_call(self.project, zone, "GET", "queuedResources")
        return self.queued_resource_record_body(self.world.get_queued_resource(self.project, zone, qr_id))

    def queued_resource_record_body(self, qr) -> tuple[dict, bytes]:
        """A queued resource record's body and key, uncounted and unchecked (the caller did both)."""
        return self._body(qr, (qr.state, qr.initiator, qr.failed_error), render_queued_resource)

    def list_queued_resources(self, zone: str) -> list[dict]:
        return [data for data, _ in self.queued_resource_bodies(zone)]

    def queued_resource_bodies(self, zone: str) -> list[tuple[dict, bytes]]:
        self.count("queuedResources.list")
        self.world.check_call(self.project, zone, "GET", "queuedResources")
        items, _ = self.world.list_queued_resources(self.project, zone)
        return [self.queued_resource_record_body(q) for q in items]

    def delete_queued_resource(self, zone: str, qr_id: str, force: bool = False) -> dict:
        self.count("queuedResources.delete")
        self.world.check_call(self.project, zone, "DELETE", "queuedResources")
        return render_operation(self.world, self.world.delete_queued_resource(self.project, zone, qr_id, force), "v2")

    def get_node(self, zone: str, node_id: str) -> dict:
        return self.node_body(zone, node_id)[0]

    def node_body(self, zone: str, node_id: str) -> tuple[dict, bytes]:
        """The node's JSON body (not to be changed: it is kept for the next read) and its `body_key`."""
        self.count("nodes.get")
        self.world.check_call(self.project, zone, "GET", "nodes")
        return self.node_record_body(self.world.get_node(self.project, zone, node_id))

    def node_record_body(self, node) -> tuple[dict, bytes]:
        """A node record's body and key, uncounted and unchecked (the caller did both)."""
        m = node.maintenance
        fingerprint = (node.state, node.health, node.health_description, node.symptoms, node.endpoints, m,
                       m.status(self.loop.now()) if m is not None else None)
        return self._body(node, fingerprint, render_node)

    def _body(self, record, fingerprint: tuple, render: Callable) -> tuple[dict, bytes]:
        """A record's body, rendered again only when it changed: the same record object (a name used again is
        another record) with the same values of every field the renderer reads that can change after create
        (the rest, names, specs and create times, are fixed at create)."""
        kept = self._bodies.get(record.name)
        if kept is not None and kept[0] is record and kept[1] == fingerprint:
            if self.check_bodies:
                fresh = render(self.world, record)
                assert fresh == kept[2], f"{record.name}: kept {kept[2]} but the record renders {fresh}"
            return kept[2], kept[3]
        data = render(self.world, record)
        key = body_key(data)
        self._bodies[record.name] = (record, fingerprint, data, key)
        return data, key

    def list_nodes(self, zone: str) -> list[dict]:
        return [data for data, _ in self.node_bodies(zone)]

    def node_bodies(self, zone: str) -> list[tuple[dict, bytes]]:
        self.count("nodes.list")
        self.world.check_call(self.project, zone, "GET", "nodes")
        items, _ = self.world.list_nodes(self.project, zone)
        return [self.node_record_body(n) for n in items]

    def delete_node(self, zone: str, node_id: str) -> dict:
        self.count("nodes.delete")
        self.world.check_call(self.project, zone, "DELETE", "nodes")
        return render_operation(self.world, self.world.delete_node(self.project, zone, node_id), "v2")



def body_key(data: dict) -> bytes:
    """A JSON body's cache key: equal keys only for equal bodies (pickle writes every value and its type; it is
    four times as fast as json.dumps, and the same resource renders its keys in the same order)."""
    return pickle.dumps(data, pickle.HIGHEST_PROTOCOL)


def slice_lives(transitions: list[Transition], horizon: float) -> list:
    """Each node's life from the transition record: created (PROVISIONING began), READY, PREEMPTED, removed."""
    from tpuq.contracts.documents import TpuNodeState
    from tpuq.contracts.tputypes import parse_accelerator_type

    from .metrics import SliceLife

    lives: dict[str, dict] = {}
    for t in transitions:
        if t.kind != "node":
            continue
        life = lives.get(t.name)
        if life is None:
            life = lives[t.name] = {"t": t, "created_at": t.at, "active_at": None, "ended_at": None,
                                    "preempted_at": None}
        if t.state is None:
            life["ended_at"] = t.at
        elif t.state == TpuNodeState.READY and life["active_at"] is None:
            life["active_at"] = t.at
        elif t.state == TpuNodeState.PREEMPTED and life["preempted_at"] is None:
            life["preempted_at"] = t.at
    out = []
    for name, life in lives.items():
        t = life["t"]
        accel = parse_accelerator_type(t.accelerator_type)
        out.append(SliceLife(name=name, zone=t.zone, accelerator_type=t.accelerator_type, chips=t.chips,
                             hosts=accel.hosts, created_at=life["created_at"], active_at=life["active_at"],
                             ended_at=min(horizon, life["ended_at"] if life["ended_at"] is not None else horizon),
                             preempted_at=life["preempted_at"]))
    return out
