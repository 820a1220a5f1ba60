"""Table tests of the matcher: ordering, compatibility, moving flexible jobs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.jobspec import JobSpec, Priority
from tpuq.scheduler import IdleTpu, Match, PendingJob, Plan, fleet_options, order_key, plan, scheduling_order

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


def job(job_id, types=("v4-8",), priority="normal", age=0, **kw) -> PendingJob:
    """A job submitted `age` seconds before NOW."""
    return PendingJob(job_id, Priority(priority), tuple(types), NOW - timedelta(seconds=age), **kw)


def tpu(name, type_="v4-8", zone="us-central2-b", **kw) -> IdleTpu:
    return IdleTpu(name, type_, zone, **kw)


def fleet(*entries) -> FleetFile:
    return FleetFile(name="f", project="p", tpus=list(entries))


def assignment(result: Plan) -> dict[str, str]:
    return {m.job_id: m.tpu_name for m in result.matches}


# ---- moving flexible jobs -------------------------------------------------


def test_flexible_job_moves_so_that_both_jobs_run():
    a = job("a", ["v4-8", "v5e-8"], age=10)  # earlier: considered first, takes the v4 at first
    b = job("b", ["v4-8"], age=5)
    result = plan([a, b], [tpu("t-v4"), tpu("t-v5e", "v5litepod-8", "us-west4-a")], None, NOW)
    assert assignment(result) == {"a": "t-v5e", "b": "t-v4"}
    assert result.unmatched_job_ids == ()


def test_flexible_jobs_shift_along_a_chain():
    # a: v4|v5e, b: v5e|v6e, c: v4 only. c fits only if a moves to v5e and b moves to v6e.
    jobs = [job("a", ["v4-8", "v5e-8"], age=30), job("b", ["v5e-8", "v6e-8"], age=20), job("c", ["v4-8"], age=10)]
    tpus = [tpu("t1"), tpu("t2", "v5litepod-8", "us-west4-a"), tpu("t3", "v6e-8", "us-east5-b")]
    assert assignment(plan(jobs, tpus, None, NOW)) == {"a": "t2", "b": "t3", "c": "t1"}


def test_generic_job_makes_room_for_a_job_that_names_the_tpu():
    generic = job("generic", age=10)  # first in order, would take t1 (first by name)
    named = job("named", age=5, tpu_name="t1")
    assert assignment(plan([generic, named], [tpu("t1"), tpu("t2")], None, NOW)) == {"generic": "t2", "named": "t1"}


def test_tpu_name_matches_full_node_name():
    full = "projects/p/locations/us-central2-b/nodes/t1"
    result = plan([job("a", tpu_name="t1")], [tpu(full)], None, NOW)
    assert assignment(result) == {"a": full}
    result = plan([job("a", tpu_name=full)], [tpu("t1")], None, NOW)
    assert assignment(result) == {"a": "t1"}


# ---- ordering ---------------------------------------------------------------


def test_earlier_job_is_never_dropped_for_a_later_one():
    result = plan([job("late", age=1), job("early", age=9)], [tpu("t1")], None, NOW)
    assert assignment(result) == {"early": "t1"}
    assert result.unmatched_job_ids == ("late",)


@pytest.mark.parametrize(
    ("winner", "loser"),
    [
        (job("hi", priority="high", age=0), job("norm", priority="normal", age=100)),
        (job("norm", priority="normal", age=0), job("lo", priority="low", age=100)),
        (job("hi", priority="high", age=0), job("lo", priority="low", age=100)),
    ],
    ids=["high>normal", "normal>low", "high>low"],
)
def test_higher_priority_wins_regardless_of_submit_time(winner, loser):
    result = plan([loser, winner], [tpu("t1")], None, NOW)
    assert assignment(result) == {winner.job_id: "t1"}
    assert result.unmatched_job_ids == (loser.job_id,)


def test_most_constrained_job_goes_first_within_a_priority():
    f = fleet(
        {"id": "v4", "type": "v4-8", "zones": ["us-central2-b"], "count": 2},
        {"id": "v6e", "type": "v6e-8", "zones": ["us-east5-b"], "count": 5},
    )
    flexible = job("flexible", ["v4-8", "v6e-8"], age=100)  # submitted first, 7 fleet options
    narrow = job("narrow", ["v4-8"], age=0)  # 2 fleet options
    assert fleet_options(flexible, f) == 7 and fleet_options(narrow, f) == 2
    result = plan([flexible, narrow], [tpu("t1")], f, NOW)
    assert assignment(result) == {"narrow": "t1"}
    assert [j.job_id for j in scheduling_order([flexible, narrow], f)] == ["narrow", "flexible"]


def test_ties_break_on_submit_time_then_job_id():
    jobs = [job("b", age=5), job("c", age=9), job("a", age=5)]
    assert [j.job_id for j in scheduling_order(jobs, None)] == ["c", "a", "b"]
    assert plan(jobs, [], None, NOW).unmatched_job_ids == ("c", "a", "b")


def test_order_key_is_priority_then_options_then_submit_then_id():
    j = job("x", priority="high", age=3)
    assert order_key(j, 4) == (-2, 4, NOW - timedelta(seconds=3), "x")


# ---- fleet options ----------------------------------------------------------


def test_fleet_options_count_slices_of_entries_the_job_can_use():
    f = fleet(
        {"id": "a", "type": "v4-8", "zones": ["us-central2-b"], "count": 3},
        {"id": "b", "type": "v4-8", "zones": ["europe-west4-a", "us-west4-a"], "count": 4, "chip_limit": 8},
        {"id": "c", "type": "v6e-8", "zones": ["us-east5-b"], "count": 6},
    )
    assert fleet_options(job("any", ["v4-8", "v6e-8"]), f) == 3 + 2 + 6  # chip_limit 8 / 4 chips = 2 slices
    assert fleet_options(job("zone", ["v4-8"], zone="us-west4-a"), f) == 2
    assert fleet_options(job("region", ["v4-8"], regions=frozenset({"europe-west4"})), f) == 2
    assert fleet_options(job("pinned", ["v4-8", "v6e-8"], pinned_region="us-east5"), f) == 6
    assert fleet_options(job("none", ["v5p-8"]), f) == 0
    assert fleet_options(job("named", tpu_name="x"), f) == 1
    assert fleet_options(job("nofleet"), None) == 0


# ---- compatibility ----------------------------------------------------------

CENTRAL = tpu("central", "v4-8", "us-central2-b")
WEST = tpu("west", "v5litepod-8", "us-west4-a")
EUROPE = tpu("europe", "v5litepod-8", "europe-west4-b")


@pytest.mark.parametrize(
    ("pending", "expected_tpu"),
    [
        (job("type", ["v6e-8"]), None),
        (job("alias", ["v5e-8"], regions=frozenset({"us-west4"})), "west"),
        (job("zone", ["v5e-8"], zone="europe-west4-b"), "europe"),
        (job("wrong-zone", ["v5e-8"], zone="europe-west4-a"), None),
        (job("bucket-region", ["v4-8", "v5e-8"], regions=frozenset({"europe-west4"})), "europe"),
        (job("no-bucket-region", ["v4-8"], regions=frozenset({"europe-west4"})), None),
        (job("pinned", ["v4-8", "v5e-8"], pinned_region="us-west4"), "west"),
        (job("pinned-outside-buckets", ["v5e-8"], pinned_region="us-west4", regions=frozenset({"europe-west4"})), None),
        (job("name", ["v5e-8"], tpu_name="europe"), "europe"),
        (job("name-wrong-type", ["v4-8"], tpu_name="europe"), None),
        (job("name-missing", ["v4-8"], tpu_name="gone"), None),
    ],
    ids=lambda v: v.job_id if isinstance(v, PendingJob) else str(v),
)
def test_compatibility(pending, expected_tpu):
    result = plan([pending], [CENTRAL, WEST, EUROPE], None, NOW)
    assert assignment(result) == ({pending.job_id: expected_tpu} if expected_tpu else {})
    assert result.unmatched_job_ids == (() if expected_tpu else (pending.job_id,))


def test_match_carries_region_zone_type_and_entry():
    result = plan([job("a", ["v5e-8"])], [tpu("w", "v5litepod-8", "us-west4-a", entry_id="e1")], None, NOW)
    assert result.matches == (Match("a", "w", "v5litepod-8", "us-west4-a", "us-west4", "e1"),)


# ---- back-off -------------------------------------------------------------


def test_job_backing_off_is_deferred_and_does_not_block_others():
    waiting = job("waiting", priority="high", not_before=NOW + timedelta(seconds=1))
    ready = job("ready", priority="low")
    result = plan([waiting, ready], [tpu("t1")], None, NOW)
    assert assignment(result) == {"ready": "t1"}
    assert result.deferred_job_ids == ("waiting",)
    assert result.unmatched_job_ids == ()


def test_job_whose_backoff_ends_now_is_schedulable():
    result = plan([job("a", not_before=NOW)], [tpu("t1")], None, NOW)
    assert assignment(result) == {"a": "t1"}


# ---- inputs -------------------------------------------------------------------


def test_pending_job_from_spec():
    spec = JobSpec(
        id="train-1",
        tpu=["v5e-8", "v4-8"],
        command="python train.py",
        priority="high",
        buckets=["gs://data-us-west4", "gs://data-europe-west4"],
        zone="us-west4-a",
    )
    pending = PendingJob.from_spec(spec, NOW, pinned_region="us-west4", not_before=NOW)
    assert pending == PendingJob(
        "train-1",
        Priority.high,
        ("v5litepod-8", "v4-8"),
        NOW,
        zone="us-west4-a",
        regions=frozenset({"us-west4", "europe-west4"}),
        pinned_region="us-west4",
        not_before=NOW,
    )
    match = plan([pending], [tpu("w", "v5litepod-8", "us-west4-a")], None, NOW).matches[0]
    assert spec.bucket_for_region(match.region) == "gs://data-us-west4"


def test_pending_job_from_spec_needs_an_id():
    spec = JobSpec(tpu="v4-8", command="true")
    with pytest.raises(ValueError):
        PendingJob.from_spec(spec, NOW)
    assert PendingJob.from_spec(spec, NOW, job_id="given").job_id == "given"


def test_duplicate_job_ids_or_tpu_names_are_refused():
    with pytest.raises(ValueError, match="job id"):
        plan([job("a"), job("a")], [], None, NOW)
    with pytest.raises(ValueError, match="TPU name"):
        plan([], [tpu("t"), tpu("projects/p/locations/z/nodes/t")], None, NOW)


def test_empty_inputs():
    assert plan([], [], None, NOW) == Plan()
    assert plan([], [tpu("t1")], None, NOW) == Plan()
