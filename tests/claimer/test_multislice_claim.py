"""The claimer's multislice requests (issue 37, "Claiming"): one queued resource of N slices per zone, raced like
any other; the entry's `count`, the zone's quota and the budget counting its slices; one event per slice."""

from __future__ import annotations

from dataclasses import replace

from tpuq.capacity.brakes import hosts_of
from tpuq.claimer.model import ClaimState, NodeInfo, Observation, Observed, RequestReceived
from tpuq.claimer.tpuapi import build_queued_resource
from tpuq.contracts.documents import NodeHealth
from tpuq.contracts.messages import FailureClass, FleetEventKind, WorkerEndpoint

from .test_decide import CAPACITY_TEXT, NOW, ZONES, make_fleet, request, run


def gang(slices, rid="r1"):
    return request(rid, slices=list(slices))


def nodes_of(qr, hosts=4, health=None) -> tuple[NodeInfo, ...]:
    return tuple(NodeInfo(name, tuple(WorkerEndpoint(worker_id=w, ip=f"10.{i}.0.{w}") for w in range(hosts)), health)
                 for i, name in enumerate(qr.node_names))


def active(qr, **kw) -> Observation:
    nodes = nodes_of(qr, **kw)
    return Observation.found("ACTIVE", node=nodes[0], nodes=nodes)


def test_a_gang_request_races_one_queued_resource_of_n_slices_per_zone():
    state, eff = run(ClaimState(make_fleet()), RequestReceived(gang([2])))
    assert sorted(c.qr.zone for c in eff.creates) == ZONES
    assert {c.qr.slices for c in eff.creates} == {2}
    qr = eff.creates[0].qr
    assert [n.rsplit("/", 1)[1] for n in qr.node_names] == [f"{qr.qr_id}-0", f"{qr.qr_id}-1"]
    body = build_queued_resource(qr, make_fleet(), "ssh-ed25519 AAAA k")
    spec = body.tpu.node_spec[0]
    assert not spec.node_id and spec.multislice_params.node_count == 2
    assert spec.multislice_params.node_id_prefix == qr.qr_id
    assert dict(spec.node.labels)  # every node of the request carries tpuq's marks


def test_quota_counts_every_slice_of_the_gang():
    # 64 chips of spot v4 per zone: a v4-32 has 16, so 4 slices fit and 5 do not.
    _, eff = run(ClaimState(make_fleet()), RequestReceived(gang([4])))
    assert len(eff.creates) == 3
    _, eff = run(ClaimState(make_fleet(quota={z: {"v4": {"spot": 48}} for z in ZONES})), RequestReceived(gang([4])))
    assert eff.creates == []
    # Elastic: the largest size that fits.
    _, eff = run(ClaimState(make_fleet(quota={z: {"v4": {"spot": 48}} for z in ZONES})),
                 RequestReceived(gang([4, 2])))
    assert {c.qr.slices for c in eff.creates} == {2}


def test_the_entrys_count_caps_the_slices_held_not_requests():
    fleet = make_fleet(tpus=[{"id": "v4", "type": "v4-32", "zones": ZONES, "count": 3}])
    _, eff = run(ClaimState(fleet), RequestReceived(gang([4])))
    assert eff.creates == []
    state, eff = run(ClaimState(fleet), RequestReceived(gang([2])))
    assert len(eff.creates) == 3
    won = eff.creates[0].qr
    state, _ = run(state, Observed({won.qr_id: active(won)}))
    # A second gang of 2 would hold 4 > 3 slices: not raced; a single slice still fits.
    _, eff = run(state, RequestReceived(gang([2], rid="r2")))
    assert [c.qr.slices for c in eff.creates if c.qr.request_id == "r2"] == []
    _, eff = run(state, RequestReceived(request("r3")))  # (the losers' zones still hold their cancelled racers)
    assert [(c.qr.zone, c.qr.slices) for c in eff.creates if c.qr.request_id == "r3"] == [(won.zone, 1)]


def test_the_budget_counts_the_gangs_hosts():
    # 4 hosts a v4-32: a gang of 2 would add 8 VM-hours in its next hour against a budget of 7.
    assert hosts_of("v4-32") == 4
    fleet = make_fleet(budget={"vm_hours_per_day": 7})
    _, eff = run(ClaimState(fleet), RequestReceived(gang([2])))
    assert eff.creates == []
    _, eff = run(ClaimState(fleet), RequestReceived(request("r2")))
    assert eff.creates


def test_active_is_announced_once_per_slice_when_every_node_is_read():
    state, eff = run(ClaimState(make_fleet()), RequestReceived(gang([2])))
    qr = eff.creates[0].qr
    partial = active(qr)
    partial = replace(partial, nodes=partial.nodes[:1])
    _, eff = run(state, Observed({qr.qr_id: partial}, plan=False))
    assert eff.events == []  # one slice unread: nothing concluded
    state, eff = run(state, Observed({qr.qr_id: active(qr)}, plan=False))
    events = [e for e in eff.events if e.kind is FleetEventKind.active]
    assert [(e.node, e.slice_index, e.slice_count, len(e.endpoints)) for e in events] == [
        (qr.node_names[0], 0, 2, 4), (qr.node_names[1], 1, 2, 4)]
    assert len({e.queued_resource for e in events}) == 1
    # The race is won: the other zones' gangs are cancelled.
    _, eff = run(state, Observed({}))
    assert sorted(q.zone for q in eff.qrs.values() if q.delete_requested) == sorted(set(ZONES) - {qr.zone})


def test_one_slices_health_change_is_announced_for_that_slice_only():
    state, eff = run(ClaimState(make_fleet()), RequestReceived(gang([2])))
    qr = eff.creates[0].qr
    state, _ = run(state, Observed({qr.qr_id: active(qr)}, plan=False))
    sick = NodeHealth.from_api({"health": "UNHEALTHY_MAINTENANCE"})
    obs = active(qr)
    obs = replace(obs, nodes=(obs.nodes[0], replace(obs.nodes[1], health=sick)))
    _, eff = run(state, Observed({qr.qr_id: obs}, plan=False))
    assert [(e.kind, e.slice_index) for e in eff.events] == [(FleetEventKind.node_health, 1)]


def test_a_suspended_gang_is_announced_for_every_slice():
    state, eff = run(ClaimState(make_fleet()), RequestReceived(gang([2])))
    qr = eff.creates[0].qr
    state, _ = run(state, Observed({qr.qr_id: active(qr)}, plan=False))
    _, eff = run(state, Observed({qr.qr_id: Observation.found("SUSPENDED")}, plan=False))
    assert [(e.kind, e.node, e.slice_index) for e in eff.events] == [
        (FleetEventKind.suspended, qr.node_names[0], 0), (FleetEventKind.suspended, qr.node_names[1], 1)]


def test_an_elastic_gang_steps_down_a_size_after_a_stockout_in_that_zone():
    state, eff = run(ClaimState(make_fleet(tpus=[{"id": "v4", "type": "v4-32", "zones": ZONES[:1], "count": 10}])),
                     RequestReceived(gang([4, 2])))
    assert [c.qr.slices for c in eff.creates] == [4]
    qr = eff.creates[0].qr
    failed = Observation.found("FAILED", error_code=8, error_message=CAPACITY_TEXT.replace("Z", ZONES[0]))
    state, eff = run(state, Observed({qr.qr_id: failed}, plan=False))
    assert eff.events[0].failure_class is FailureClass.capacity
    # The FAILED one is deleted and the zone backs off; once gone and the back-off over, the gang asked is 2.
    state, _ = run(state, Observed({qr.qr_id: Observation("not_found")}, plan=False))
    later = NOW + state.fleet.claim.capacity_backoff_max_seconds * __import__("datetime").timedelta(seconds=1)
    _, eff = run(state, Observed({}), now=later)
    assert [c.qr.slices for c in eff.creates] == [2]


def test_the_fake_api_gets_one_multislice_create_and_every_slice_is_announced_active(claimer):
    """Against the fake Cloud TPU API: the create's body (the call log), the nodes it made, one ACTIVE per slice."""
    from tpuq.contracts.messages import Tick
    from tpuq_dev.devstack.stack import wait_for

    from .conftest import fleet_data, scenario_data

    zone = ZONES[0]
    h = claimer(scenario_data([zone], provisioning=0.5))
    h.fleet(fleet_data([zone], count=4))
    h.push("/push/capacity", gang([2], rid="job-1").model_copy(update={"fleet": "race"}))
    creates = h.creates(zone)
    assert len(creates) == 1
    spec = creates[0]["body"]["tpu"]["nodeSpec"][0]
    assert spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": f"tq-job-1-{zone}"} and "nodeId" not in spec

    def announced():
        h.push("/push/ticks", Tick(seq=len(h.events) + 1))
        found = [e for e in h.pull_events() if e.kind is FleetEventKind.active]
        return found if len(found) == 2 else None

    events = wait_for(announced, what="both slices ACTIVE", timeout=60)
    prefix = f"projects/tpuq-test/locations/{zone}/nodes/tq-job-1-{zone}"
    assert [(e.node, e.slice_index, e.slice_count, len(e.endpoints)) for e in events] == [
        (f"{prefix}-0", 0, 2, 4), (f"{prefix}-1", 1, 2, 4)]
    assert {e.endpoints[0].ip for e in events} != {events[0].endpoints[0].ip}  # two slices, two sets of hosts
    # Every node of the request carries tpuq's marks, as the janitor's ownership check reads them.
    labels = [h.control.node_info(e.node)["node"].get("labels") or {} for e in events]
    assert labels[0] and labels[0] == labels[1] and labels[0] == spec["node"]["labels"]


def test_a_single_slot_types_gang_races_alone_one_racer_in_the_fleet():
    fleet = make_fleet(quota={z: {"v6e": {"spot": 64}} for z in ZONES},
                       tpus=[{"id": "v6e", "type": "v6e-8", "zones": ZONES, "count": 4}])
    assert fleet.entry("v6e").is_single_slot
    req = request("r1", slices=[2]).model_copy(update={"types": ["v6e-8"]})
    state, eff = run(ClaimState(fleet), RequestReceived(req))
    assert [(c.qr.zone, c.qr.slices) for c in eff.creates] == [(ZONES[0], 2)]  # one racer, in the first zone
    other = request("r2").model_copy(update={"types": ["v6e-8"]})
    _, eff = run(state, RequestReceived(other))
    assert eff.creates == []  # while the gang races, no other racer of the type


def test_an_elastic_gang_takes_the_size_the_budget_allows():
    # v4-32: 4 hosts. A budget of 10 VM-hours in the next hour holds a gang of 2 (8 hosts), not of 4 (16).
    fleet = make_fleet(budget={"vm_hours_per_day": 10}, tpus=[{"id": "v4", "type": "v4-32", "zones": ZONES[:1],
                                                                "count": 10}])
    _, eff = run(ClaimState(fleet), RequestReceived(gang([4, 2])))
    assert [c.qr.slices for c in eff.creates] == [2]


def test_an_elastic_gang_down_to_one_slice_is_an_ordinary_request():
    """nodeCount must be > 1 (MultisliceParams; the fake refuses 1): a size of 1 is sent as a plain nodeId."""
    fleet = make_fleet(quota={z: {"v4": {"spot": 16}} for z in ZONES})  # room for one v4-32 a zone
    _, eff = run(ClaimState(fleet), RequestReceived(gang([4, 2, 1])))
    assert {c.qr.slices for c in eff.creates} == {1}
    spec = build_queued_resource(eff.creates[0].qr, fleet, "ssh-ed25519 AAAA k").tpu.node_spec[0]
    assert spec.node_id == eff.creates[0].qr.qr_id and not spec.multislice_params.node_count
