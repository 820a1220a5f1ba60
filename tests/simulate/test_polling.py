"""The polling policy (tpu-runner 0.1.12's controller as a model): its pure pass rule by rule, then driven runs
on the simulator's cloud (stockout, a scripted preemption, racing losers, a quota-0 zone, a zone the API refuses)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tpuq_dev.capacitymodel.scenario import parse_scenario
from tpuq.contracts.documents import QueuedResourceState as Qs
from tpuq.contracts.documents import TpuNodeState as Ns
from tpuq.contracts.fleet import FleetFile
from tpuq_dev.simulate.cloud import SimCloud
from tpuq_dev.simulate.events import EventLoop
from tpuq_dev.simulate.polling import (
    ControllerState,
    CreateQr,
    DeleteNode,
    DeleteQr,
    Dispatch,
    JobRec,
    JobStatus,
    NodeView,
    Observed,
    PollingPolicy,
    QrView,
    Requeue,
    Slot,
    SlotStatus,
    Succeeded,
    config_from_fleet,
    reconcile,
    should_stop,
)
from tpuq_dev.simulate.workers import RunEnd, SimWorkers
from tpuq_dev.simulate.workload import SimJob

PROJECT = "tpuq-sim"
B, C, A = "us-central2-b", "us-central2-c", "us-central2-a"


def fleet(zones=(B,), count=1, **extra) -> FleetFile:
    return FleetFile.model_validate({"name": "sim", "project": PROJECT, **extra,
                                     "tpus": [{"id": "v4", "type": "v4-8", "zones": list(zones), "count": count}]})


def state(zones=(B,), count=1, **extra) -> ControllerState:
    return ControllerState(config_from_fleet(fleet(zones, count, **extra), PROJECT), running=True)


def entry(st: ControllerState, zone: str):
    return next(e for e in st.config.entries if e.zone == zone)


def labels(st, zone):
    return {"managed-by": st.config.runner, "fleet-entry": entry(st, zone).id}


def node(st, zone, ordinal=1, state=Ns.READY, health="HEALTHY") -> NodeView:
    return NodeView(entry(st, zone).slots[ordinal - 1][1], zone, "v4-8", state, health, labels(st, zone))


def qr(st, zone, ordinal=1, state=Qs.ACTIVE) -> QrView:
    qr_id, node_id = entry(st, zone).slots[ordinal - 1]
    return QrView(qr_id, zone, "v4-8", state, node_id, labels(st, zone))


def job(job_id="j1", at=0.0, priority=1, types=("v4-8",), regions=None, **kw) -> JobRec:
    return JobRec(job_id, at, priority, frozenset(types), frozenset(regions) if regions else None, **kw)


def observed(*views, submitted=(), exited=()) -> Observed:
    return Observed({v.node_id: v for v in views if isinstance(v, NodeView)},
                    {v.qr_id: v for v in views if isinstance(v, QrView)}, tuple(submitted), frozenset(exited))


def kinds(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def with_slot(st, zone, ordinal=1, **kw) -> ControllerState:
    e = entry(st, zone)
    node_id = e.slots[ordinal - 1][1]
    return replace(st, slots={**st.slots, node_id: Slot(node_id, e.id, **kw)})


def with_job(st, j: JobRec) -> ControllerState:
    return replace(st, jobs={**st.jobs, j.id: j})


# -- R6, R7: racing and creates --------------------------------------------------------------------------------


def test_one_pending_job_races_a_queued_resource_in_every_compatible_zone():
    st = state(zones=(B, C, A))
    _, actions = reconcile(st, observed(submitted=[job()]), 0.0)
    creates = kinds(actions, CreateQr)
    assert sorted(c.zone for c in creates) == sorted([B, C, A])
    assert all(c.body["spot"] == {} and "queueingPolicy" not in c.body for c in creates)  # R7: spot, no validUntil


@pytest.mark.parametrize("regions, zones", [
    (None, [B, "europe-west4-a"]),
    (("europe-west4",), ["europe-west4-a"]),
    (("us-central2",), [B]),
])
def test_a_job_races_only_in_the_regions_it_accepts(regions, zones):
    st = state(zones=(B, "europe-west4-a"))
    _, actions = reconcile(st, observed(submitted=[job(regions=regions)]), 0.0)
    assert sorted(c.zone for c in kinds(actions, CreateQr)) == sorted(zones)


@pytest.mark.parametrize("pending, count, quota, held, creates", [
    (1, 2, None, 0, 1),   # demand 1: one ordinal
    (3, 2, None, 0, 2),   # capped by count
    (2, 2, 4, 0, 1),      # chip_limit (declared quota 4 chips): one v4-8 (4 chips)
    (2, 2, 8, 1, 1),      # 4 of 8 chips held by a live request: one more
    (2, 2, 8, 2, 0),      # both ordinals live: nothing missing
])
def test_creates_fill_the_missing_ordinals_up_to_demand_count_and_chip_limit(pending, count, quota, held, creates):
    extra = {"quota": {B: {"v4": {"spot": quota}}}} if quota is not None else {}
    st = state(count=count, **extra)
    views = [qr(st, B, k, Qs.WAITING_FOR_RESOURCES) for k in range(1, held + 1)]
    jobs = [job(f"j{i}", at=float(i)) for i in range(pending)]
    _, actions = reconcile(st, observed(*views, submitted=jobs), 0.0)
    assert len(kinds(actions, CreateQr)) == creates


# -- R9: failed requests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qr_state", [Qs.FAILED, Qs.SUSPENDED])
def test_a_terminal_request_is_deleted_and_its_ordinal_created_again_once_gone(qr_state):
    st = with_job(state(), job())
    st, actions = reconcile(st, observed(qr(st, B, 1, qr_state)), 30.0)
    assert kinds(actions, DeleteQr) == [DeleteQr(B, entry(st, B).slots[0][0])]
    assert kinds(actions, CreateQr) == []  # its name is still taken
    _, actions = reconcile(st, observed(), 60.0)
    assert [c.qr_id for c in kinds(actions, CreateQr)] == [entry(st, B).slots[0][0]]


def test_a_deleting_request_is_left_alone_and_blocks_its_name():
    st = with_job(state(), job())
    _, actions = reconcile(st, observed(qr(st, B, 1, Qs.DELETING)), 30.0)
    assert kinds(actions, DeleteQr) == [] and kinds(actions, CreateQr) == []


# -- R10, R12: losers and idle slices -------------------------------------------------------------------------------


def test_race_losers_waiting_are_deleted_at_once_and_ready_ones_after_the_idle_timeout():
    st = with_job(state(zones=(B, C, A)), job())
    views = [node(st, B), qr(st, B), node(st, C), qr(st, C), qr(st, A, 1, Qs.WAITING_FOR_RESOURCES)]
    st, actions = reconcile(st, observed(*views), 100.0)
    assert [d.node_id for d in kinds(actions, Dispatch)] == [entry(st, B).slots[0][1]]  # lowest node id wins
    assert kinds(actions, DeleteQr) == [DeleteQr(A, entry(st, A).slots[0][0])]  # the waiting loser
    assert kinds(actions, DeleteNode) == []  # the READY loser in C is kept, idle since 100
    views = views[:4]
    st, actions = reconcile(st, observed(*views), 100.0 + 599.0)
    assert kinds(actions, DeleteNode) == [] and kinds(actions, DeleteQr) == []
    _, actions = reconcile(st, observed(*views), 100.0 + 600.0)
    assert kinds(actions, DeleteNode) == [DeleteNode(C, entry(st, C).slots[0][1])]
    assert kinds(actions, DeleteQr) == [DeleteQr(C, entry(st, C).slots[0][0])]


@pytest.mark.parametrize("timeout, waited, deleted", [(600, 599, False), (600, 600, True), (0, 0, True)])
def test_an_idle_slice_is_deleted_after_the_fleets_idle_timeout(timeout, waited, deleted):
    st = with_slot(state(idle_timeout_seconds=timeout), B, status=SlotStatus.idle, idle_since=1000.0)
    _, actions = reconcile(st, observed(node(st, B), qr(st, B)), 1000.0 + waited)
    assert bool(kinds(actions, DeleteNode)) is deleted


def test_a_finished_attempt_leaves_its_slice_idle_from_the_pass_that_saw_it():
    st = state()
    node_id = entry(st, B).slots[0][1]
    st = with_job(st, job(status=JobStatus.running, attempts=1, node=node_id))
    st = with_slot(st, B, status=SlotStatus.busy, job="j1")
    st, actions = reconcile(st, observed(node(st, B), qr(st, B), exited=["j1"]), 500.0)
    assert kinds(actions, Succeeded) == [Succeeded("j1", 1)]
    assert st.slots[node_id].status is SlotStatus.idle and st.slots[node_id].idle_since == 500.0
    assert "j1" not in st.jobs


# -- R13: dispatch order ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("jobs, first", [
    ([job("a", at=0, priority=0), job("b", at=5, priority=2)], "b"),  # high before low
    ([job("a", at=5), job("b", at=0)], "b"),  # then FIFO
    ([job("a", at=0), job("b", at=0)], "a"),  # then id
    ([job("a", at=0, types=("v4-8", "v5litepod-8")), job("b", at=5)], "b"),  # fewest compatible entries first
])
def test_one_idle_slice_goes_to_the_first_job_in_tpu_runners_order(jobs, first):
    st = ControllerState(config_from_fleet(FleetFile.model_validate({
        "name": "sim", "project": PROJECT, "tpus": [{"id": "v4", "type": "v4-8", "zones": [B]},
                                                     {"id": "v5", "type": "v5litepod-8", "zones": ["us-west4-a"]}]}),
        PROJECT), running=True)
    st = with_slot(st, B, status=SlotStatus.idle, idle_since=0.0)
    _, actions = reconcile(st, observed(node(st, B), qr(st, B), submitted=jobs), 10.0)
    assert [d.job_id for d in kinds(actions, Dispatch)] == [first]


def test_an_earlier_job_moves_to_another_idle_slice_rather_than_block_a_later_one():
    st = ControllerState(config_from_fleet(FleetFile.model_validate({
        "name": "sim", "project": PROJECT, "tpus": [{"id": "a4", "type": "v4-8", "zones": [B]},
                                                     {"id": "b4", "type": "v4-16", "zones": [C]},
                                                     {"id": "v5", "type": "v5litepod-8", "zones": ["us-west4-a"]}]}),
        PROJECT), running=True)
    st = with_slot(with_slot(st, B, status=SlotStatus.idle, idle_since=0.0), C, status=SlotStatus.idle, idle_since=0.0)
    c_node = replace(node(st, C), type="v4-16")
    c_qr = replace(qr(st, C), type="v4-16")
    # both accept two entries, so FIFO puts "flex" first; it takes B's (lower) slot, then moves to C for "pinned"
    jobs = [job("flex", at=0, types=("v4-8", "v4-16")), job("pinned", at=1, types=("v4-8", "v5litepod-8"))]
    _, actions = reconcile(st, observed(node(st, B), qr(st, B), c_node, c_qr, submitted=jobs), 10.0)
    assert {d.job_id: d.zone for d in kinds(actions, Dispatch)} == {"flex": C, "pinned": B}


# -- R16, R17: preemptions ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("views, slot_status, node_deleted", [
    (lambda st: [node(st, B, state=Ns.PREEMPTED), qr(st, B, 1, Qs.SUSPENDING)], SlotStatus.preempted, False),
    (lambda st: [qr(st, B, 1, Qs.SUSPENDED)], SlotStatus.preempted, False),
    # a terminal node under a request still ACTIVE: requeued, and the node deleted (draining)
    (lambda st: [node(st, B, state=Ns.PREEMPTED), qr(st, B, 1, Qs.ACTIVE)], SlotStatus.draining, True),
    # node and request both gone: preempted, and its ordinal created again for the requeued job in the same pass
    (lambda st: [], SlotStatus.provisioning, False),
])
def test_a_running_attempt_on_lost_capacity_is_requeued_when_a_pass_sees_it(views, slot_status, node_deleted):
    st = state()
    node_id = entry(st, B).slots[0][1]
    st = with_job(st, job(status=JobStatus.running, attempts=1, node=node_id))
    st = with_slot(st, B, status=SlotStatus.busy, job="j1")
    st, actions = reconcile(st, observed(*views(st)), 700.0)
    assert kinds(actions, Requeue) == [Requeue("j1", 1, B, node_id)]
    assert st.jobs["j1"].status is JobStatus.pending and st.jobs["j1"].attempts == 1
    assert st.slots[node_id].status is slot_status
    assert bool(kinds(actions, DeleteNode)) is node_deleted


# -- R1: the controller stops when nothing is left --------------------------------------------------------------------


@pytest.mark.parametrize("has_job, views, stops", [(False, False, True), (True, False, False), (False, True, False)])
def test_the_controller_stops_only_without_jobs_and_capacity(has_job, views, stops):
    st = with_job(state(), job()) if has_job else state()
    obs = observed(qr(st, B, 1, Qs.WAITING_FOR_RESOURCES)) if views else observed()
    assert should_stop(st, obs) is stops


# -- driven runs ------------------------------------------------------------------------------------------------------


def run_policy(fleet_file, scenario, jobs, until):
    loop = EventLoop()
    cloud = SimCloud(parse_scenario(scenario), loop, project=PROJECT)
    workers = SimWorkers(loop, {j.job_id: j for j in jobs})
    policy = PollingPolicy(loop=loop, cloud=cloud, workers=workers, jobs=jobs, fleet=fleet_file,
                           rng=random.Random(0))
    policy.start()
    return loop, cloud, workers, policy


def test_a_stockout_and_a_preemption_every_job_finishes_and_the_preempted_one_ran_twice():
    scenario = {"zones": {B: {"quota": {"v4": {"spot": 64}}, "stockouts": [{"start": 0, "end": 900}]}},
                "delays": {"provisioning": 120}, "preemption": {"scripted": [{"at": 2000, "zone": B}]}}
    jobs = [SimJob(f"j{i}", i * 60.0, ("v4-8",), "normal", 1800.0, 300.0) for i in range(4)]
    loop, cloud, workers, policy = run_policy(fleet(count=2), scenario, jobs, 20000)
    loop.run(20000)
    assert workers.done == {j.job_id for j in jobs}
    attempts = {j.job_id: [r for r in workers.runs if r.job_id == j.job_id] for j in jobs}
    preempted = [jid for jid, runs in attempts.items() if any(r.end is RunEnd.preempted for r in runs)]
    assert preempted and all(len(attempts[jid]) == 2 for jid in preempted)
    for jid in preempted:
        first = attempts[jid][0]
        assert first.ended_at == 2000.0  # the work stopped at the preemption, not when the controller looked
        requeued_at = next(t for t, a in policy.log if isinstance(a, Requeue) and a.job_id == jid)
        assert 2000.0 < requeued_at <= 2000.0 + policy.period
    first_start = min(r.started_at for r in workers.runs)
    assert first_start >= 900.0  # nothing ran during the stockout
    assert not policy.state.running  # the controller stopped once idle capacity was deleted
    assert cloud.world.queued_resources == {}


def test_race_losers_that_reached_active_are_kept_for_the_idle_timeout_then_deleted():
    scenario = {"zones": {B: {"quota": {"v4": {"spot": 64}}}, C: {"quota": {"v4": {"spot": 64}}}},
                "delays": {"provisioning": 100}}
    jobs = [SimJob("j0", 0.0, ("v4-8",), "normal", 3600.0)]
    loop, cloud, workers, policy = run_policy(fleet(zones=(B, C)), scenario, jobs, 8000)
    seen: dict[str, tuple[float | None, float | None]] = {}  # qr name -> (first ACTIVE, gone)

    def probe():
        for name, q in cloud.world.queued_resources.items():
            first, _ = seen.get(name, (None, None))
            if q.state == Qs.ACTIVE and first is None:
                seen[name] = (loop.now(), None)
        for name, (first, gone) in seen.items():
            if gone is None and name not in cloud.world.queued_resources:
                seen[name] = (first, loop.now())

    loop.every(1.0, probe, first=0.0)
    loop.run(8000)
    assert workers.done == {"j0"}
    assert len(seen) == 2  # both zones won capacity
    winner = next(r.node for r in workers.runs).replace("/nodes/", "/queuedResources/qr-")
    loser, (active, gone) = next((n, v) for n, v in seen.items() if n != winner)
    kept = gone - active
    assert 600.0 <= kept <= 600.0 + 2 * policy.period + scenario["delays"].get("deleting", 5) + 1
    # R1, R3: one GET per declared name per inventory read, and a second read in each pass without a job
    assert cloud.calls["nodes.get"] == cloud.calls["queuedResources.get"] == 2 * policy.inventory_reads
    assert policy.inventory_reads > policy.passes


def test_a_quota_zero_zone_is_retried_every_second_pass_for_ever():
    scenario = {"zones": {B: {"quota": {"v4": {"spot": 0}}}}}
    jobs = [SimJob("stuck", 0.0, ("v4-8",), "normal", 600.0)]
    loop, cloud, workers, policy = run_policy(fleet(), scenario, jobs, 3600)
    loop.run(3600)
    assert policy.passes == 120 and workers.done == set()
    # create; FAILED (quota) a second later; deleted on the next pass; gone; created again: one per two passes
    assert cloud.creates_per_zone[B] == policy.passes // 2
    assert cloud.calls["queuedResources.delete"] == policy.passes // 2


def test_a_zone_the_api_refuses_aborts_every_pass_before_any_create():
    """R3: the inventory GET of a location the project cannot use is a 400, not a 404: the whole pass fails and is
    retried 30 s later, for ever, so the good zone gets nothing either."""
    scenario = {"zones": {B: {"quota": {"v4": {"spot": 64}}}}}  # asia-east1-c is not in it
    jobs = [SimJob("j0", 0.0, ("v4-8",), "normal", 600.0)]
    loop, cloud, workers, policy = run_policy(fleet(zones=(B, "asia-east1-c")), scenario, jobs, 3600)
    loop.run(3600)
    assert policy.passes == 0 and policy.aborted_passes == 120
    assert cloud.creates_per_zone == {} and workers.done == set()


def test_a_create_the_api_refuses_is_tried_again_on_every_pass_without_backoff():
    """R8: tpu-runner records a failed create and stops that entry's creates for the pass; nothing else. A
    refusal that can never succeed (PERMISSION_DENIED here) is tried again 30 s later, for ever."""
    from tpuq_dev.capacitymodel.model import ApiCallFault

    scenario = {"zones": {B: {"quota": {"v4": {"spot": 64}}}}}
    jobs = [SimJob(f"j{i}", 0.0, ("v4-8",), "normal", 600.0) for i in range(2)]
    loop, cloud, workers, policy = run_policy(fleet(count=2), scenario, jobs, 3600)
    cloud.world.faults.append(ApiCallFault("PERMISSION_DENIED", "Permission 'tpu.queuedResources.create' denied",
                                           method="POST", path_contains="queuedResources", remaining=10**6))
    loop.run(3600)
    assert policy.passes == 120 and workers.done == set()
    # two ordinals missing, but the first refusal ends the entry's creates: one attempt per pass
    assert cloud.creates_per_zone[B] == policy.passes
    assert {status for _, _, status in policy.create_errors} == {"PERMISSION_DENIED"}


def test_counting_a_quiet_pass_instead_of_running_it_changes_no_outcome(monkeypatch):
    """The driver only counts the GETs of a pass that would repeat the last one; with that shortcut off, the
    same run makes the same calls, at the same times, with the same attempts."""
    scenario = {"zones": {B: {"quota": {"v4": {"spot": 64}}, "stockouts": [{"start": 0, "end": 900}]},
                          C: {"quota": {"v4": {"spot": 0}}}},
                "delays": {"provisioning": 120}, "preemption": {"scripted": [{"at": 2000, "zone": B}]}}
    jobs = [SimJob(f"j{i}", i * 700.0, ("v4-8",), ("low", "normal", "high")[i % 3], 1800.0, 300.0)
            for i in range(5)]

    def outcome():
        loop, cloud, workers, policy = run_policy(fleet(zones=(B, C), count=2), scenario, jobs, 30000)
        loop.run(30000)
        runs = [(r.job_id, r.attempt, r.node, r.started_at, r.ended_at, r.end) for r in workers.runs]
        return dict(cloud.calls), dict(cloud.creates_per_zone), runs, policy.log, policy.passes, policy.quiet_passes

    shortcut = outcome()
    assert shortcut[-1] > 0
    monkeypatch.setattr(PollingPolicy, "_still_quiet", lambda self: False)
    assert outcome()[:-1] == shortcut[:-1]
    assert len(shortcut[2]) >= 6  # five jobs, one preempted


def test_a_loser_still_provisioning_cannot_be_deleted_and_cuts_every_pass_short_until_it_is_active():
    """R11: the API refuses to delete a PROVISIONING queued resource; tpu-runner's gcloud call fails and the pass
    ends there. C waits out a stockout until 300 s and provisions until 900 s while B's slice runs the job."""
    scenario = {"zones": {B: {"quota": {"v4": {"spot": 64}}},
                          C: {"quota": {"v4": {"spot": 64}}, "stockouts": [{"start": 0, "end": 300, "effect": "wait"}]}},
                "delays": {"provisioning": 600}}
    jobs = [SimJob("j0", 0.0, ("v4-8",), "normal", 3600.0)]
    loop, cloud, workers, policy = run_policy(fleet(zones=(B, C)), scenario, jobs, 4000)
    loop.run(4000)
    assert [r.node.split("/")[3] for r in workers.runs] == [B]
    assert policy.cut_short_passes == 9  # the passes at 630, 660, ..., 870 s
    assert policy.aborted_passes == 0
    deletes = [t for t, a in policy.log if isinstance(a, DeleteQr) and a.zone == C]
    assert deletes and deletes[0] >= 900.0 + 600.0  # then a READY loser, kept for the idle timeout


def test_reconcile_is_pure_the_same_inputs_give_the_same_pass_and_stay_unchanged():
    st = with_slot(with_job(state(zones=(B, C)), job("old", at=0)), B, status=SlotStatus.idle, idle_since=0.0)
    obs = observed(node(st, B), qr(st, B), qr(st, C, 1, Qs.FAILED), submitted=[job("new", at=5)])
    before = (dict(st.jobs), dict(st.slots))
    first = reconcile(st, obs, 100.0)
    assert reconcile(st, obs, 100.0) == first
    assert (dict(st.jobs), dict(st.slots)) == before


@pytest.mark.parametrize("type_, chips", [("v4-32", 16), ("v5litepod-64", 64)])
def test_a_multi_host_slice_is_one_resource_and_one_attempt_on_all_its_chips(type_, chips):
    """R14: tpu-runner launches one attempt on every worker host of the slice (DistributedTPURunner.launch)."""
    zone = "us-central2-b" if type_.startswith("v4") else "us-west4-a"
    st = ControllerState(config_from_fleet(FleetFile.model_validate({
        "name": "sim", "project": PROJECT, "tpus": [{"id": "big", "type": type_, "zones": [zone]}]}), PROJECT),
        running=True)
    e = st.config.entries[0]
    st = replace(st, slots={e.slots[0][1]: Slot(e.slots[0][1], e.id, SlotStatus.idle, idle_since=0.0)})
    views = [replace(node(st, zone), type=e.type), replace(qr(st, zone), type=e.type)]
    _, actions = reconcile(st, observed(*views, submitted=[job(types=(e.type,))]), 10.0)
    assert kinds(actions, Dispatch) == [Dispatch("j1", 1, zone, e.slots[0][1], chips)]


@pytest.mark.parametrize("split, counts", [(False, [5, 5, 5]), (True, [2, 2, 1])])
def test_a_multi_zone_entry_is_one_tpu_runner_entry_per_zone_with_its_count_whole_or_shared(split, counts):
    config = config_from_fleet(fleet(zones=(B, C, "us-central2-a"), count=5), PROJECT, split_counts=split)
    assert [e.count for e in config.entries] == counts
    assert [len(e.slots) for e in config.entries] == counts


def test_a_shared_count_lists_no_zone_left_with_none():
    config = config_from_fleet(fleet(zones=(B, C, "us-central2-a"), count=1), PROJECT, split_counts=True)
    assert [(e.zone, e.count) for e in config.entries] == [(B, 1)]
