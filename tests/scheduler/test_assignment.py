"""Fleet events create TPUs, and a pass pairs pending jobs with idle TPUs. Every message is delivered twice."""

from __future__ import annotations

from tpuq.contracts.messages import FleetEventKind, Tick

from tests.scheduler.conftest import active


def job(job_id: str, **kw) -> dict:
    return {"id": job_id, "tpu": "v4-8", "command": "python train.py", **kw}


def test_active_node_becomes_an_idle_tpu_once(sched):
    sched.deliver("fleet-events", active("n1"))
    tpu = sched.tpu("n1")
    assert tpu["state"] == "idle" and tpu["name"].endswith("/nodes/n1") and tpu["short"] == "n1"
    assert tpu["entry_id"] == "v4" and tpu["region"] == "us-central2" and tpu["type"] == "v4-8"
    assert tpu["endpoints"] == [{"worker_id": 0, "ip": "127.0.0.9", "port": 2222}]
    created = tpu["created_at"]
    sched.deliver("fleet-events", active("n1"), message_id="again")  # a second ACTIVE changes nothing
    assert sched.tpu("n1")["created_at"] == created
    assert sched.drain("assignments") == []


def test_job_then_tpu_assigns_and_publishes_once(sched):
    sched.deliver("jobs", job("j1"))
    assert sched.job("j1")["state"] == "pending"
    sched.deliver("fleet-events", active("n1"))
    j, t = sched.job("j1"), sched.tpu("n1")
    assert j["state"] == "assigned" and j["attempt"] == 1 and j["attempt_id"] == "j1-1"
    assert j["tpu"] == t["name"] and j["zone"] == "us-central2-b" and j["region"] == "us-central2"
    assert j["job_bucket"] == "gs://tpuq-runner"
    assert j["checkpoint_gcs_dir"] == "gs://tpuq-runner/tpuq/jobs/j1/checkpoints"
    assert t["state"] == "busy" and t["job_id"] == "j1" and t["attempt_id"] == "j1-1"
    assert sched.attempts("j1")["1"]["state"] == "assigned"
    [msg] = sched.drain("assignments")
    assert msg["action"] == "assign" and msg["attempt_id"] == "j1-1" and msg["node"] == t["name"]
    assert msg["attempt_gcs_dir"] == "gs://tpuq-runner/tpuq/jobs/j1/attempts/1"
    assert msg["checkpoint_gcs_dir"] == "gs://tpuq-runner/tpuq/jobs/j1/checkpoints"
    assert msg["endpoints"] == [{"worker_id": 0, "ip": "127.0.0.9", "port": 2222}]
    assert msg["job"]["command"] == "python train.py"
    # A tick runs another pass: nothing is pending, nothing is assigned twice.
    sched.deliver("ticks", Tick(seq=1))
    assert sched.drain("assignments") == []


def test_tpu_then_job_uses_the_job_bucket_of_the_region(sched):
    sched.deliver("fleet-events", active("n1"))
    sched.deliver("jobs", job("j1", buckets=["gs://data-us-central2", "gs://data-europe-west4"]))
    [msg] = sched.drain("assignments")
    assert msg["job_bucket"] == "gs://data-us-central2"
    assert msg["checkpoint_gcs_dir"] == "gs://data-us-central2/tpuq/jobs/j1/checkpoints"


def test_higher_priority_job_gets_the_only_tpu(sched):
    sched.deliver("jobs", job("low", priority="low"))
    sched.deliver("jobs", job("high", priority="high"))
    sched.deliver("fleet-events", active("n1"))
    assert sched.job("high")["state"] == "assigned"
    assert sched.job("low")["state"] == "pending"
    assert [m["job_id"] for m in sched.drain("assignments")] == ["high"]


def test_suspended_before_active_keeps_the_tpu_gone(sched):
    sched.deliver("fleet-events", active("n1", kind=FleetEventKind.suspended))
    sched.deliver("fleet-events", active("n1"))  # a late ACTIVE must not revive it
    assert sched.tpu("n1")["state"] == "gone"
    sched.deliver("jobs", job("j1"))
    assert sched.job("j1")["state"] == "pending"


def test_a_new_jobs_pass_never_takes_a_tpu_an_older_higher_priority_job_fits(sched):
    """On Cloud Run two pushes run at once: the ACTIVE event's handler has stored its TPU idle, and its pass has
    not run yet, when a new job's pass (planned for the new job only) sees that TPU. The older, higher-priority
    job must get it all the same."""
    from datetime import datetime, timezone

    from tpuq.contracts import store
    from tpuq.runtime.fleetstore import load_fleet
    from tpuq.scheduler.lifecycle import tpu_on_active

    sched.deliver("jobs", job("high", priority="high"))
    assert sched.job("high")["state"] == "pending"
    # The TPU as the ACTIVE event's handler stores it, before that handler's own pass.
    event = active("n1")
    now = datetime.now(timezone.utc)
    sched.db.collection(store.TPUS).document("n1").set(tpu_on_active(None, event, load_fleet(sched.db), now))
    sched.deliver("jobs", job("low", priority="low"))
    assert sched.job("high")["state"] == "assigned" and sched.job("high")["tpu"].endswith("/n1")
    assert sched.job("low")["state"] == "pending"
    assert [m["job_id"] for m in sched.drain("assignments")] == ["high"]


def test_a_new_job_that_fits_an_idle_tpu_gets_it_behind_a_long_queue_that_does_not(sched):
    """The whole-queue read is bounded per type; the new job that set off the pass is planned in it anyway."""
    from datetime import datetime, timezone

    from tpuq.runtime.fleetstore import save_fleet
    from tpuq.scheduler.passreads import PER_TYPE_EXTRA

    from tests.scheduler.conftest import PROJECT_ZONE, fleet_file

    other_zone = "us-central2-a"
    save_fleet(sched.db, fleet_file(tpus=[{"id": "v4", "type": "v4-8", "zones": [PROJECT_ZONE, other_zone],
                                           "count": 4}]), datetime.now(timezone.utc))
    for i in range(PER_TYPE_EXTRA + 1):  # older, higher priority, and held to the zone with no idle TPU
        sched.deliver("jobs", job(f"old-{i:03d}", priority="high", zone=other_zone), times=1)
    sched.deliver("fleet-events", active("n1"))  # idle in PROJECT_ZONE: none of them can use it
    assert sched.tpu("n1")["state"] == "idle"
    sched.deliver("jobs", job("new", priority="low"))
    assert sched.job("new")["state"] == "assigned" and sched.tpu("n1")["job_id"] == "new"
