"""Table tests of the matcher on multislice jobs (issue 37): gangs in one zone, priority, elastic counts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tpuq.contracts.jobspec import JobSpec, Priority
from tpuq.scheduler import IdleTpu, PendingJob, plan
from tpuq.scheduler.decide import pending_job

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
B, F = "us-central2-b", "us-central2-f"


def job(job_id, types=("v4-32",), priority="normal", age=0, **kw) -> PendingJob:
    return PendingJob(job_id, Priority(priority), tuple(types), NOW - timedelta(seconds=age), **kw)


def tpu(name, zone=B, type_="v4-32") -> IdleTpu:
    return IdleTpu(name, type_, zone)


def nodes(result) -> dict[str, tuple[str, ...]]:
    return {m.job_id: m.nodes for m in result.matches}


def test_a_two_slice_job_takes_two_idle_slices_in_one_zone_not_one_in_each_of_two():
    result = plan([job("gang", slices=(2,))], [tpu("b-1", B), tpu("f-1", F), tpu("f-2", F)], None, NOW)
    assert nodes(result) == {"gang": ("f-1", "f-2")}
    (match,) = result.matches
    assert (match.tpu_name, match.zone, match.tpu_type) == ("f-1", F, "v4-32")


def test_a_two_slice_job_with_one_idle_slice_per_zone_waits():
    result = plan([job("gang", slices=(2,))], [tpu("b-1", B), tpu("f-1", F)], None, NOW)
    assert result.matches == ()
    assert result.unmatched_job_ids == ("gang",)


def test_higher_priority_single_jobs_keep_their_slices():
    singles = [job(f"s{i}", priority="high") for i in range(2)]
    result = plan([job("gang", slices=(2,), age=100), *singles], [tpu("b-1"), tpu("b-2"), tpu("b-3")], None, NOW)
    assert set(nodes(result)) == {"s0", "s1"}  # one slice left: not enough for the gang
    assert result.unmatched_job_ids == ("gang",)


def test_a_gang_before_single_jobs_in_the_order_takes_its_slices_first():
    singles = [job(f"s{i}", priority="low") for i in range(2)]
    result = plan([*singles, job("gang", slices=(2,))], [tpu("b-1"), tpu("b-2"), tpu("b-3")], None, NOW)
    assert nodes(result) == {"gang": ("b-1", "b-2"), "s0": ("b-3",)}
    assert result.unmatched_job_ids == ("s1",)


def test_an_earlier_flexible_single_job_moves_zones_to_make_room_for_the_gang():
    flexible = job("flex", priority="high")  # matched first, into either zone
    result = plan([flexible, job("gang", slices=(2,))], [tpu("b-1", B), tpu("b-2", B), tpu("f-1", F)], None, NOW)
    assert nodes(result) == {"flex": ("f-1",), "gang": ("b-1", "b-2")}


def test_an_earlier_single_job_bound_to_the_zone_is_not_dropped_for_the_gang():
    bound = job("bound", priority="high", zone=B)
    result = plan([bound, job("gang", slices=(2,))], [tpu("b-1", B), tpu("b-2", B), tpu("f-1", F)], None, NOW)
    assert set(nodes(result)) == {"bound"}
    assert result.unmatched_job_ids == ("gang",)


def test_elastic_four_or_two_takes_two_when_only_two_are_idle():
    result = plan([job("elastic", slices=(4, 2))], [tpu("b-1"), tpu("b-2"), tpu("f-1", F)], None, NOW)
    assert nodes(result) == {"elastic": ("b-1", "b-2")}


def test_elastic_takes_the_largest_count_any_zone_holds():
    idle = [tpu("b-1"), tpu("b-2"), *(tpu(f"f-{i}", F) for i in range(4))]
    result = plan([job("elastic", slices=(4, 2))], idle, None, NOW)
    assert nodes(result) == {"elastic": ("f-0", "f-1", "f-2", "f-3")}


def test_elastic_ending_in_one_runs_on_one_slice_when_no_zone_holds_two():
    result = plan([job("elastic", slices=(2, 1))], [tpu("b-1"), tpu("f-1", F)], None, NOW)
    (match,) = result.matches
    assert match.nodes == ("b-1",) and match.tpu_names == ()


def test_a_gang_takes_the_zone_with_fewest_free_so_a_larger_gang_still_fits():
    idle = [tpu("b-1"), tpu("b-2"), *(tpu(f"f-{i}", F) for i in range(4))]
    result = plan([job("two", slices=(2,), priority="high"), job("four", slices=(4,))], idle, None, NOW)
    assert nodes(result) == {"two": ("b-1", "b-2"), "four": ("f-0", "f-1", "f-2", "f-3")}


def test_a_gang_never_takes_a_tpu_another_job_names():
    named = job("named", tpu_name="b-2", priority="low")
    result = plan([job("gang", slices=(2,)), named], [tpu("b-1"), tpu("b-2"), tpu("b-3")], None, NOW)
    assert nodes(result) == {"gang": ("b-1", "b-3"), "named": ("b-2",)}


def test_a_gang_is_of_its_type_only():
    idle = [tpu("b-1"), IdleTpu("b-small", "v4-8", B)]
    assert plan([job("gang", slices=(2,))], idle, None, NOW).matches == ()


def test_a_later_single_job_never_moves_a_placed_gang():
    # Both zones fit the gang; it takes the first (B). A later job bound to B does not move it to F: a placed gang
    # is pinned (the greedy rule's known cost: the later job waits for the next pass or a new slice).
    gang = job("gang", slices=(2,), priority="high")
    later = job("later", zone=B)
    result = plan([gang, later], [tpu("b-1"), tpu("b-2"), tpu("f-1", F), tpu("f-2", F)], None, NOW)
    assert nodes(result) == {"gang": ("b-1", "b-2")}
    assert result.unmatched_job_ids == ("later",)


def test_a_failed_attempt_to_make_room_leaves_the_single_jobs_where_they_were():
    # flex can move from B to F, bound cannot: B cannot free two, and flex is put back (it still runs).
    flex, bound = job("flex", priority="high", age=5), job("bound", priority="high", zone=B)
    result = plan([flex, bound, job("gang", slices=(3,))],
                  [tpu("b-1"), tpu("b-2"), tpu("b-3"), tpu("f-1", F)], None, NOW)
    assert set(nodes(result)) == {"flex", "bound"}
    assert len({n for m in result.matches for n in m.nodes}) == 2


def test_mixed_queue_matches_as_many_jobs_as_a_single_only_plan_would_for_its_singles():
    singles = [job(f"s{i}", types=("v4-32", "v4-8"), age=i) for i in range(4)]
    idle = [tpu("b-1"), tpu("b-2"), IdleTpu("b-s1", "v4-8", B), IdleTpu("b-s2", "v4-8", B), tpu("f-1", F)]
    only_singles = plan(singles, idle, None, NOW)
    mixed = plan([*singles, job("gang", slices=(2,), priority="low")], idle, None, NOW)
    assert {m.job_id for m in mixed.matches} >= {m.job_id for m in only_singles.matches}


def test_the_stored_spec_gives_the_matcher_its_slice_counts():
    spec = JobSpec(id="ms", tpu="v4-32", command="train", slices=[4, 2])
    from tpuq.contracts.documents import JobDoc

    view = JobDoc.from_doc({"id": "ms", "state": "pending", "spec": spec.model_dump(mode="json", exclude_none=True),
                            "submit_time": NOW})
    assert pending_job(view).slices == (4, 2)
    old = JobDoc.from_doc({"id": "old", "state": "pending", "submit_time": NOW,
                           "spec": {"id": "old", "tpu": ["v4-8"], "command": "x"}})  # stored before `slices`
    assert pending_job(old).slices == (1,) and old.spec_slice_counts == (1,)


# ---- the pass (decide_pass) and capacity, until multislice jobs are claimed and run -----------------------------

def stored(job_id, slices, age=0):
    spec = {"id": job_id, "tpu": ["v4-32"], "command": "train", "slices": slices}
    return job_id, {"id": job_id, "state": "pending", "spec": spec, "attempt": 0,
                    "submit_time": NOW - timedelta(seconds=age)}


def idle(name, zone=B):
    return {"name": f"projects/p/locations/{zone}/nodes/{name}", "type": "v4-32", "zone": zone,
            "region": "us-central2", "entry_id": "v4", "state": "idle", "endpoints": []}


def test_a_pass_assigns_a_gang_in_one_assignment_and_asks_one_gang_request_for_the_rest():
    """A multislice job on idle slices: one assignment naming every slice (job, attempt, Assignment.slices, every TPU
    busy). The next gang, with too few idle slices left, asks for one queued resource of its sizes that fit."""
    from tpuq.contracts.fleet import FleetFile
    from tpuq.scheduler.decide import PassSnapshot, decide_pass, queue_of

    lab = FleetFile.model_validate({"name": "lab", "project": "p", "tpus": [
        {"id": "v4", "type": "v4-32", "zones": [B], "count": 8}]})
    jobs = [stored("gang", 2, age=9), stored("waits", [4, 3]), ("single", {**stored("single", None)[1],
                                                                            "id": "single"})]
    tpus = [{**idle(f"b-{i}"), "endpoints": [{"worker_id": w, "ip": f"10.0.{i}.{w}"} for w in range(4)]}
            for i in (1, 2, 3)]
    snapshot = PassSnapshot(queue=queue_of(jobs), idle_tpus=tpus, live_tpus={"v4": 3}, open_requests={"v4": 0})
    d = decide_pass(snapshot, lab, "tpuq-runner", NOW)
    assert sorted(a.job_id for a in d.assignments) == ["gang", "single"]
    gang = next(a for a in d.assignments if a.job_id == "gang")
    names = [s.node for s in gang.writes.message.slices]
    assert len(names) == 2 and names[0] == gang.tpu_name == gang.writes.message.node
    assert gang.writes.gang_tpus == (names[1],) and gang.writes.job["gang"] == names
    assert gang.writes.attempt["gang"] == names and gang.writes.message.slices_wanted == 2
    assert [len(s.endpoints) for s in gang.writes.message.slices] == [4, 4]
    # 8 slices, 3 live: room 5, so "waits" asks for one gang of 4 (or 3), charged as 4.
    assert [(a.job_id, a.message.count, a.message.slices) for a in d.asks] == [("waits", 1, [4, 3])]
    assert a_record(d.asks[0]) == {"gang_entry_id": "v4", "slices": 4}


def a_record(ask) -> dict:
    return {k: v for k, v in ask.record.items() if k in ("gang_entry_id", "slices")}


def test_slices_to_ask_charges_an_entry_its_room_in_slices():
    from tpuq.scheduler.capacity import slices_to_ask

    assert slices_to_ask(job("e", slices=(4, 2)), 3) == (2,)
    assert slices_to_ask(job("e", slices=(4, 2)), 4) == (4, 2)
    assert slices_to_ask(job("e", slices=(4, 2)), 1) == ()
    assert slices_to_ask(job("s"), 1) == (1,)
