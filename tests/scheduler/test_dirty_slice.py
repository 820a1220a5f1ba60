"""A slice found dirty (the worker preflight, or a known TPU runtime failure in the last lines) is an infrastructure
failure: the job goes back to pending from its infrastructure budget, and the slice is quarantined, naming why, and
never assigned again."""

from __future__ import annotations

from tpuq.contracts.messages import FleetEventKind
from tpuq.runtime.fleetstore import save_fleet

from tests.scheduler.conftest import active, fleet_file, utc
from tests.scheduler.test_attempts import ended, running_job

PREFLIGHT = "preflight failed: worker 2: /dev/vfio/0 is held by pid 4711 (python3 train.py)"


def test_a_dirty_slice_is_quarantined_naming_the_holder_and_the_job_retries_elsewhere(sched):
    running_job(sched, max_infra_retries=2)
    sched.deliver("attempt-events", ended("infra_failed", detail=PREFLIGHT))

    job, tpu = sched.job("j1"), sched.tpu("n1")
    assert job["state"] == "pending" and job["infra_failures"] == 1 and job.get("preemptions", 0) == 0
    assert sched.attempts("j1")["1"]["outcome"] == "infra_failed" and sched.attempts("j1")["1"]["detail"] == PREFLIGHT
    assert tpu["state"] == "idle" and tpu["quarantined"] is True
    assert tpu["quarantine_reason"] == f"attempt j1-1 ended infra_failed: {PREFLIGHT}"

    sched.deliver("jobs", {"id": "j2", "tpu": "v4-8", "command": "other"})
    sched.deliver("ticks", {"seq": 1})
    assert sched.job("j1")["state"] == "pending" and sched.job("j2")["state"] == "pending"  # n1 takes no job
    assert sched.drain("assignments") == []

    sched.deliver("fleet-events", active("n2"))
    [retry] = sched.drain("assignments")
    assert retry["node"].endswith("/nodes/n2") and retry["attempt"] == 2
    assert sched.tpu("n1")["quarantined"] and sched.tpu("n1")["job_id"] is None


def test_a_known_runtime_failure_quarantines_with_its_first_line(sched):
    running_job(sched)
    detail = ("worker 0's last lines show a TPU runtime failure (TPU device busy): open(/dev/vfio/0): Device or "
              "resource busy; worker 0 exited 1\nlast lines of worker 0:\n...")
    sched.deliver("attempt-events", ended("infra_failed", detail=detail))
    assert sched.job("j1")["state"] == "pending"
    assert sched.tpu("n1")["quarantine_reason"] == ("attempt j1-1 ended infra_failed: worker 0's last lines show a "
                                                    "TPU runtime failure (TPU device busy): open(/dev/vfio/0): Device "
                                                    "or resource busy; worker 0 exited 1")


def test_the_quarantined_slice_s_deletion_asks_for_a_fresh_one_at_once(sched):
    """With the fleet at its count, the retry can only ask for capacity once the quarantined slice is gone: its
    deletion (the GONE event) runs a pass then, instead of leaving the job to the backstop pass minutes later."""
    save_fleet(sched.db, fleet_file(tpus=[{"id": "v4", "type": "v4-8", "zones": ["us-central2-b"], "count": 1}]),
               utc(2026, 1, 1))
    running_job(sched)
    sched.drain("capacity")
    sched.deliver("attempt-events", ended("infra_failed", detail=PREFLIGHT))
    assert sched.job("j1")["state"] == "pending" and sched.tpu("n1")["quarantined"]
    assert [m for m in sched.drain("capacity") if m.get("action", "request") == "request"] == []  # no room yet

    sched.deliver("fleet-events", active("n1", kind=FleetEventKind.gone))
    assert sched.tpu("n1")["state"] == "gone"
    requests = [m for m in sched.drain("capacity") if m.get("action", "request") == "request"]
    assert [r["job_ids"] for r in requests] == [["j1"]]
    sched.deliver("fleet-events", active("n1", kind=FleetEventKind.gone))  # redelivered: nothing more
    assert [m for m in sched.drain("capacity") if m.get("action", "request") == "request"] == []


def test_the_deletion_asks_at_once_even_when_the_janitor_recorded_it_gone_first(sched):
    """The janitor writes `gone` when its delete returns; the claimer's GONE event may be handled after that. The
    event must still run the pass (it found nothing left to write, and ran none: the retry waited for the 5-minute
    backstop, 4.5 minutes in the suite's dirty-slice and node-health stack tests)."""
    save_fleet(sched.db, fleet_file(tpus=[{"id": "v4", "type": "v4-8", "zones": ["us-central2-b"], "count": 1}]),
               utc(2026, 1, 1))
    running_job(sched)
    sched.drain("capacity")
    sched.deliver("attempt-events", ended("infra_failed", detail=PREFLIGHT))
    sched.db.collection("tpus").document("n1").set({"state": "gone", "gone_reason": "deleted by the janitor"},
                                                   merge=True)  # as tpuq.janitor.handlers' mark_gone writes it
    assert [m for m in sched.drain("capacity") if m.get("action", "request") == "request"] == []

    sched.deliver("fleet-events", active("n1", kind=FleetEventKind.gone))
    requests = [m for m in sched.drain("capacity") if m.get("action", "request") == "request"]
    assert [r["job_ids"] for r in requests] == [["j1"]]


def test_an_idle_slice_deleted_frees_the_count_for_a_job_held_back_by_it_at_once(sched):
    """Not only a quarantined slice: an idle one the janitor deleted (its idle timeout) frees its place in the
    entry's count, and a job the count held back asks at once, not at the backstop pass (issue 34's same gap)."""
    save_fleet(sched.db, fleet_file(tpus=[{"id": "v4", "type": "v4-8", "zones": ["us-central2-b", "us-central2-c"],
                                           "count": 1}]), utc(2026, 1, 1))
    sched.deliver("fleet-events", active("n1"))  # idle in zone b
    sched.deliver("jobs", {"id": "in-c", "tpu": "v4-8", "zone": "us-central2-c", "command": "x"})
    assert "maximum" in (sched.job("in-c").get("blocked") or "")
    assert [m for m in sched.drain("capacity") if m.get("action", "request") == "request"] == []
    sched.db.collection("tpus").document("n1").set({"state": "gone", "gone_reason": "deleted by the janitor"},
                                                   merge=True)  # the janitor's record first, as it may land
    sched.deliver("fleet-events", active("n1", kind=FleetEventKind.gone))
    requests = [m for m in sched.drain("capacity") if m.get("action", "request") == "request"]
    assert [(r["job_ids"], r["zones"]) for r in requests] == [(["in-c"], ["us-central2-c"])]
